//! `locks watch KEY...`: a line per change of each key (acquired, renewed,
//! released, expired; "ended" when it was freed within a second of its
//! expiry, which this machine's clock cannot tell apart) until
//! interrupted or nobody reads the output. One `get` every `--interval`
//! (default 2 s: 30 requests a minute, 5 % of a 600/min project quota),
//! the keys in turn; a 429 doubles the interval (up to a minute) after
//! waiting out its `Retry-After`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use volcano::{LockState, Locks};

use crate::args::Output;
use crate::child::Signals;
use crate::exit::{fail, Failure, INVALID};
use crate::output;

/// The shortest interval between two requests.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The longest, after 429s.
const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// How far this machine's clock may be from the service's before a
/// release and an expiry are told apart.
const SKEW: chrono::TimeDelta = chrono::TimeDelta::seconds(1);
/// The longest wait a `Retry-After` can ask for here.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3_600);

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
        // A renewal moves the expiry, later or (a shorter TTL) sooner.
        (Last::Saw(Some(old)), Some(new)) if new.expires_at != old.expires_at => Some("renewed"),
        // Freed before its expiry: its holder released it, or someone
        // force-released it (the service does not say which).
        // Freed within a second of its expiry (on this machine's clock,
        // which may differ from the service's): either.
        (Last::Saw(Some(old)), None) if at + SKEW < old.expires_at => Some("released"),
        (Last::Saw(Some(old)), None) if at < old.expires_at + SKEW => Some("ended"),
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

/// One line on standard output; `false` once nobody reads it (a closed
/// pipe: `watch ... | head -1`).
fn print(output: Output, key: &str, event: &str, state: Option<Seen>, at: DateTime<Utc>) -> bool {
    let stamp = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    let line = if output == Output::Json {
        json!({
            "at": stamp(at),
            "key": key,
            "event": event,
            "fencing_token": state.map(|s| s.fence),
            "expires_at": state.map(|s| stamp(s.expires_at)),
        })
        .to_string()
    } else {
        match (event, state) {
            ("released", Some(s)) => format!(
                "{} {key} released (fencing token {}; by its holder, or force-released)",
                stamp(at),
                s.fence
            ),
            (_, Some(s)) => format!(
                "{} {key} {event}: fencing token {}, expires {}",
                stamp(at),
                s.fence,
                stamp(s.expires_at)
            ),
            (_, None) => format!("{} {key} {event}", stamp(at)),
        }
    };
    crate::output::line(line)
}

/// Watches `keys` until a signal, or until nobody reads the output (seen
/// while waiting too, so that no request is sent for nobody); exit 0 then.
pub(crate) async fn watch(
    locks: &Locks,
    keys: Vec<String>,
    interval: Duration,
    output: Output,
) -> Result<(), Failure> {
    if interval < MIN_INTERVAL {
        return Err(fail(INVALID, "--interval must be at least 100ms"));
    }
    let mut signals = Signals::install()?;
    let mut last = vec![Last::Unseen; keys.len()];
    let mut pause = interval;
    // Every key is looked at once before anything is printed: a bad key
    // fails the command before the others print a line.
    let mut first: Vec<Option<LockState>> = vec![None; keys.len()];
    for index in (0..keys.len()).cycle() {
        let key = &keys[index];
        let result = tokio::select! {
            result = locks.get(key) => result,
            _ = signals.next() => break,
            () = output::closed() => break,
        };
        pause = match result {
            // Until every key was seen once (all flip to `Saw` together).
            Ok(state) if matches!(last[index], Last::Unseen) => {
                first[index] = Some(state);
                if first.iter().all(Option::is_some) {
                    let at = Utc::now();
                    for (index, state) in first.iter().enumerate() {
                        let now = state.as_ref().and_then(seen);
                        let event = change(Last::Unseen, now, at).unwrap_or("free");
                        if !print(output, &keys[index], event, now, at) {
                            return Ok(());
                        }
                        last[index] = Last::Saw(now);
                    }
                }
                interval
            }
            Ok(state) => {
                let now = seen(&state);
                let at = Utc::now();
                let before = last[index];
                if let Some(event) = change(before, now, at) {
                    // A lease that ended is named by the one seen before.
                    let named = match before {
                        Last::Saw(old) if now.is_none() => old,
                        _ => now,
                    };
                    if !print(output, key, event, named, at) {
                        break;
                    }
                }
                last[index] = Last::Saw(now);
                interval
            }
            // A bad key, bad credentials: trying again will not help.
            Err(err) if !err.is_transient() => return Err(Failure::from(err)),
            // Any other failure slows the watch down (up to a minute, or the
            // interval if longer), after waiting out a `Retry-After`.
            Err(err) => {
                let wait = err
                    .retry_after()
                    .unwrap_or(Duration::ZERO)
                    .min(MAX_RETRY_AFTER);
                let slower = pause.saturating_mul(2).min(MAX_INTERVAL.max(interval));
                eprintln!(
                    "volcano: watch: get {key} failed ({err}); next try in {:.1} s",
                    wait.saturating_add(slower).as_secs_f32()
                );
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = signals.next() => break,
                    () = output::closed() => break,
                }
                slower
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = signals.next() => break,
            () = output::closed() => break,
        }
    }
    Ok(())
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
        assert_eq!(
            change(saw(lease(1, 10)), lease(1, 8), t(1)),
            Some("renewed")
        );
        assert_eq!(change(saw(lease(1, 10)), None, t(5)), Some("released"));
        assert_eq!(change(saw(lease(1, 10)), None, t(10)), Some("ended"));
        assert_eq!(change(saw(lease(1, 10)), None, t(12)), Some("expired"));
        assert_eq!(change(saw(None), None, t(11)), None);
    }
}
