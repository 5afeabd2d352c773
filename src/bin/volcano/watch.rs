//! `locks watch KEY...`: a line per change of each key (acquired, renewed,
//! taken over, released, expired; "ended" when the answers cannot tell a
//! release from an expiry) until interrupted or nobody reads the output.
//! Built on the library's `Locks::observe`, one stream per key, so the
//! changes are judged on the service's clock as the library judges them.
//! One `get` every `--interval` on average (default 2 s: 30 requests a
//! minute, 5 % of a 600/min project quota) whatever the number of keys
//! (each key every `interval × keys`), at most twice that while holders
//! with a TTL shorter than `interval × keys` keep renewing (a look around
//! each lease's expiry); a 429 waits out its `Retry-After`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use tokio::sync::mpsc;
use volcano::{ChangeKind, Error, LockChange, LockState, Locks};

use crate::args::Output;
use crate::child::Signals;
use crate::exit::{fail, Failure, INVALID};
use crate::output;

/// The shortest interval between two requests.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The lease a line names: the one the change is about (for a lease that
/// ended, the one seen before).
fn named(change: &LockChange) -> Option<&LockState> {
    let freed = matches!(
        change.kind(),
        ChangeKind::Released | ChangeKind::Expired | ChangeKind::Ended
    );
    let state = if freed {
        change.previous()?
    } else {
        change.state()
    };
    state.held().then_some(state)
}

/// What a line calls a change.
fn event(change: &LockChange) -> &'static str {
    match change.kind() {
        ChangeKind::Initial if change.state().held() => "held",
        ChangeKind::Initial => "free",
        kind => kind.as_str(),
    }
}

/// One line on standard output; `false` once nobody reads it (a closed
/// pipe: `watch ... | head -1`).
fn print(output: Output, change: &LockChange) -> bool {
    let stamp = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Millis, true);
    let (key, event, at) = (change.key(), event(change), Utc::now());
    let state = named(change);
    let fence = state.and_then(LockState::fencing_token);
    let expires_at = state.and_then(LockState::expires_at);
    let line = if output == Output::Json {
        json!({
            "at": stamp(at),
            "key": key,
            "event": event,
            "fencing_token": fence,
            "expires_at": expires_at.map(stamp),
        })
        .to_string()
    } else {
        match (change.kind(), fence, expires_at) {
            (ChangeKind::Released, Some(fence), _) => format!(
                "{} {key} released (fencing token {fence}; by its holder, or force-released)",
                stamp(at)
            ),
            (_, Some(fence), Some(expires_at)) => format!(
                "{} {key} {}: fencing token {fence}, expires {}",
                stamp(at),
                event.replace('_', " "),
                stamp(expires_at)
            ),
            _ => format!("{} {key} {event}", stamp(at)),
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
    let each = interval.saturating_mul(u32::try_from(keys.len()).unwrap_or(u32::MAX));
    let (sender, mut changes) = mpsc::channel(16);
    let mut tasks = tokio::task::JoinSet::new();
    for (index, key) in keys.iter().enumerate() {
        let mut observe = locks.observe(key.as_str()).poll_interval(each);
        let sender = sender.clone();
        tasks.spawn(async move {
            while let Some(item) = observe.next().await {
                let pause = observe.next_look_in();
                let ended = observe.is_ended();
                if sender.send((index, item, pause, ended)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(sender);
    // Every key is looked at once before anything is printed: a bad key
    // fails the command before the others print a line.
    // Changes of a key seen before every key was seen once wait their turn.
    let mut first: Vec<Option<LockChange>> = vec![None; keys.len()];
    let mut early: Vec<LockChange> = Vec::new();
    let mut started = false;
    loop {
        let (index, item, pause, ended) = tokio::select! {
            next = changes.recv() => match next {
                Some(next) => next,
                None => break,
            },
            _ = signals.next() => break,
            () = output::closed() => break,
        };
        let change = match item {
            Ok(change) => change,
            // A bad key, bad credentials: the stream ended, as the
            // library's observer decides (one rule for both: an answer it
            // could not read, say, is looked at again).
            Err(err) if ended => return Err(Failure::from(err)),
            Err(err) => {
                said_failed(&keys[index], &err, pause);
                continue;
            }
        };
        if started {
            if !print(output, &change) {
                break;
            }
            continue;
        }
        match first[index] {
            None => first[index] = Some(change),
            Some(_) => early.push(change),
        }
        if first.iter().all(Option::is_some) {
            started = true;
            for change in first.iter().flatten().chain(&early) {
                if !print(output, change) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// A failed look, on standard error.
fn said_failed(key: &str, err: &Error, pause: Duration) {
    crate::output::say(format_args!(
        "volcano: watch: get {key} failed ({err}); next try in {:.1} s",
        pause.as_secs_f32()
    ));
}
