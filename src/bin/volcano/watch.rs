//! `locks watch KEY...`: a line per change of each key (acquired, renewed,
//! released, expired) until interrupted. One `get` every `--interval`
//! (default 2 s: 30 requests a minute, 5 % of a 600/min project quota),
//! the keys in turn; a 429 doubles the interval (up to a minute) after
//! waiting out its `Retry-After`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use volcano::{Error, LockState, Locks};

use crate::args::Output;
use crate::child::Signals;
use crate::exit::{fail, Failure, INVALID};

/// The shortest interval between two requests.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The longest, after 429s.
const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// What `watch` last saw of a key.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    fence: i64,
    expires_at: DateTime<Utc>,
}

/// What `watch` knew of a key before the latest answer.
#[derive(Clone, Copy)]
enum Last {
    /// Nothing yet.
    Unseen,
    /// Free, or held by the lease seen.
    Saw(Option<Seen>),
}

/// A change worth a line.
fn change(before: Last, now: Option<Seen>, at: DateTime<Utc>) -> Option<&'static str> {
    match (before, now) {
        (Last::Unseen, Some(_)) => Some("held"),
        (Last::Unseen, None) => Some("free"),
        (Last::Saw(None), Some(_)) => Some("acquired"),
        (Last::Saw(Some(old)), Some(new)) if old.fence != new.fence => Some("acquired"),
        (Last::Saw(Some(old)), Some(new)) if new.expires_at > old.expires_at => Some("renewed"),
        // Freed before its expiry: its holder released it, or someone
        // force-released it (the service does not say which).
        (Last::Saw(Some(old)), None) if at < old.expires_at => Some("released"),
        (Last::Saw(Some(_)), None) => Some("expired"),
        _ => None,
    }
}

fn seen(state: &LockState) -> Option<Seen> {
    match (state.held(), state.fencing_token(), state.expires_at()) {
        (true, Some(fence), Some(expires_at)) => Some(Seen { fence, expires_at }),
        _ => None,
    }
}

fn print(output: Output, key: &str, event: &str, state: Option<Seen>, at: DateTime<Utc>) {
    let stamp = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    if output == Output::Json {
        let value = json!({
            "at": stamp(at),
            "key": key,
            "event": event,
            "fencing_token": state.map(|s| s.fence),
            "expires_at": state.map(|s| stamp(s.expires_at)),
        });
        println!("{value}");
        return;
    }
    match (event, state) {
        ("released", _) => println!(
            "{} {key} released (by its holder, or force-released)",
            stamp(at)
        ),
        (_, Some(s)) => println!(
            "{} {key} {event}: fencing token {}, expires {}",
            stamp(at),
            s.fence,
            stamp(s.expires_at)
        ),
        (_, None) => println!("{} {key} {event}", stamp(at)),
    }
}

/// Watches `keys` until a signal; exit 0 then.
pub(crate) async fn watch(
    locks: &Locks,
    keys: Vec<String>,
    interval: Duration,
    output: Output,
) -> Result<serde_json::Value, Failure> {
    if interval < MIN_INTERVAL {
        return Err(fail(INVALID, "--interval must be at least 100ms"));
    }
    let mut signals = Signals::install()?;
    let mut last = vec![Last::Unseen; keys.len()];
    let mut pause = interval;
    for index in (0..keys.len()).cycle() {
        let key = &keys[index];
        let result = tokio::select! {
            result = locks.get(key) => result,
            _ = signals.next() => break,
        };
        pause = match result {
            Ok(state) => {
                let now = seen(&state);
                let at = Utc::now();
                if let Some(event) = change(last[index], now, at) {
                    print(output, key, event, now, at);
                }
                last[index] = Last::Saw(now);
                interval
            }
            // A bad key, bad credentials: trying again will not help.
            Err(err) if !err.is_transient() => return Err(Failure::from(err)),
            Err(err) => {
                let wait = err.retry_after().unwrap_or(Duration::ZERO);
                let slower = if matches!(err, Error::RateLimited(_)) {
                    (pause * 2).min(MAX_INTERVAL)
                } else {
                    pause
                };
                eprintln!(
                    "volcano: watch: get {key} failed ({err}); next try in {} s",
                    (wait + slower).as_secs_f32()
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = signals.next() => break,
                }
                slower
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = signals.next() => break,
        }
    }
    Ok(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes() {
        let t = |s| DateTime::from_timestamp(s, 0).unwrap();
        let lease = |fence, until| {
            Some(Seen {
                fence,
                expires_at: t(until),
            })
        };
        let saw = Last::Saw;
        assert_eq!(change(Last::Unseen, None, t(0)), Some("free"));
        assert_eq!(change(Last::Unseen, lease(1, 10), t(0)), Some("held"));
        assert_eq!(change(saw(None), lease(1, 10), t(0)), Some("acquired"));
        assert_eq!(change(saw(lease(1, 10)), lease(1, 10), t(1)), None);
        assert_eq!(
            change(saw(lease(1, 10)), lease(1, 15), t(1)),
            Some("renewed")
        );
        assert_eq!(
            change(saw(lease(1, 10)), lease(2, 15), t(1)),
            Some("acquired")
        );
        assert_eq!(change(saw(lease(1, 10)), None, t(5)), Some("released"));
        assert_eq!(change(saw(lease(1, 10)), None, t(11)), Some("expired"));
        assert_eq!(change(saw(None), None, t(11)), None);
    }
}
