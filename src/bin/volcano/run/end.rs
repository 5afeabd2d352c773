//! How a run ends: the lock released (or its minimum kept), the exit code
//! (the command's, a shell's, or a loss's), the warnings, and the summary.

use std::process::ExitStatus;
use std::time::Duration;

use serde_json::json;
use volcano::{Error, LockLost, MinHold};

use super::{Holding, Ran, Stopped};
use crate::child::{describe, shell_code, Signals};
use crate::exit;

/// The command could not be started: the lock is released, and the exit
/// code is a shell's (127 if the command was not found, 126 otherwise).
pub(super) async fn not_started(holding: Holding<'_>, program: &str, err: &std::io::Error) -> Ran {
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    // Nothing ran: no minimum to keep.
    let released = holding.held.release_now().await;
    let mut warning = format!("cannot start {program:?}: {err}");
    match released {
        Ok(()) => {}
        // No work was done under it; the lock is another token's now.
        Err(Error::LockLost(lost)) => warning.push_str(&format!("; {lost}")),
        Err(err) => warning.push_str(&format!("; releasing the lock failed: {err}")),
    }
    let summary = Summary {
        exit_code: Some(i32::from(code)),
        signal: None,
        started: false,
        loss: None,
        at_risk: 0,
        // Released at once: nothing ran, nothing kept.
        min_hold_kept: holding.min_hold.map(|_| false),
    }
    .json(holding.key, holding.fence, holding.started.elapsed());
    Ran {
        code,
        summary,
        warning: Some(warning),
    }
}

/// The summary of a run, printed with `--output json`: one shape, every
/// member always present (`null` when it has no value).
struct Summary<'a> {
    exit_code: Option<i32>,
    signal: Option<i32>,
    started: bool,
    loss: Option<&'a volcano::LockLost>,
    at_risk: u32,
    /// `--min-hold`: whether the key stays held until the minimum's end
    /// (`None` without one, or when that could not be read).
    min_hold_kept: Option<bool>,
}

impl Summary<'_> {
    fn json(self, key: &str, fence: i64, held_for: Duration) -> serde_json::Value {
        json!({
            "key": key,
            "fencing_token": fence,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "started": self.started,
            "lost": self.loss.is_some(),
            "lost_reason": self.loss.map(|l| l.reason().to_string()),
            "at_risk": self.at_risk,
            "held_secs": secs(held_for),
            "min_hold_kept": self.min_hold_kept,
        })
    }
}

/// The command has exited: the lock is released (or, with `--min-hold`
/// not passed yet, kept by the service until the minimum's end), and the
/// exit code is the command's, or 8 (9 for `--max-hold`) if the lock was
/// lost meanwhile.
pub(super) async fn finish(
    holding: Holding<'_>,
    status: ExitStatus,
    stopped: Stopped,
    signals: &mut Signals,
) -> Ran {
    let held_for = holding.started.elapsed();
    // Any loss up to now happened while the command ran (nothing awaited
    // since it exited), even one seen only now.
    let loss = holding.held.failure();
    // A job stopped by a signal keeps no minimum; a signal while the
    // minimum is being handed to the service ends that at once (the lease
    // is then released in the background, which the CLI's closing
    // shutdown waits for).
    let mut interrupted = stopped.signalled;
    let (released, min_hold) = if stopped.signalled {
        (holding.held.release_now().await, MinHold::NotKept)
    } else {
        tokio::select! {
            released = holding.held.release_reporting() => match released {
                Ok(min_hold) => (Ok(()), min_hold),
                Err(err) => (Err(err), MinHold::NotKept),
            },
            _ = signals.next() => {
                interrupted = true;
                (Ok(()), MinHold::NotKept)
            }
        }
    };
    // A release that found another token holding the lock proves a loss
    // the renewals had not seen yet (a force release before the first
    // renewal): the command ran, at least in part, without the lock.
    let loss = match (loss, &released) {
        (None, Err(Error::LockLost(taken))) => Some(taken.clone()),
        (loss, _) => loss,
    };

    // Stopped from outside before its end, the minimum is not kept
    // (released at once); one the command ran past, or `--max-hold`
    // ended (never shorter), was kept. Any other loss: `false`.
    let capped = loss
        .as_ref()
        .is_some_and(|l| l.reason() == volcano::LostReason::MaxHold);
    let min_hold_kept = match (holding.min_hold, min_hold) {
        (None, _) => None,
        (Some(_), MinHold::Kept | MinHold::Passed) => Some(true),
        (Some(min), _) if held_for >= min && (loss.is_none() || capped) => Some(true),
        (Some(_), _) => Some(false),
    };

    let (exit_code, signal) = describe(status);
    let mut warnings = Vec::new();
    if min_hold_kept == Some(false) && loss.is_none() && !interrupted {
        warnings.push(format!(
            "the minimum hold was not kept: {} may be free before the minimum's end",
            holding.key
        ));
    }
    let code = match &loss {
        Some(lost) => {
            warnings.push(lost_warning(lost, stopped));
            lost_code(lost)
        }
        None => shell_code(exit_code, signal),
    };
    match released {
        Ok(()) | Err(Error::LockLost(_)) => {}
        Err(err @ Error::Conflict(_)) => warnings.push(format!(
            "the lease had already ended when it was released ({err}); another token holds \
             the lock now"
        )),
        Err(err) => warnings.push(format!(
            "releasing the lock failed ({err}); it may stay held until its ttl"
        )),
    }
    let summary = Summary {
        exit_code,
        signal,
        started: true,
        loss: loss.as_ref(),
        at_risk: stopped.at_risk,
        min_hold_kept,
    }
    .json(holding.key, holding.fence, held_for);
    Ran {
        code,
        summary,
        warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
    }
}

/// The loss, and what was done to the command after it: nothing if it
/// ended first, else SIGTERM, then SIGKILL if it did not stop.
fn lost_warning(lost: &LockLost, stopped: Stopped) -> String {
    match (stopped.terminated, stopped.killed) {
        (false, _) if lost.reason() == volcano::LostReason::TakenOver => format!(
            "{lost}; it was force-released or taken over while the command ran, so the \
             command ran at least in part without the lock"
        ),
        (false, _) => format!("{lost}, as the command ended"),
        (true, false) => format!("{lost}; the command was sent SIGTERM"),
        (true, true) => format!("{lost}; the command was sent SIGTERM, then SIGKILL"),
    }
}

/// 9 when `--max-hold` ended the hold, 8 for any other loss.
fn lost_code(lost: &LockLost) -> u8 {
    if lost.reason() == volcano::LostReason::MaxHold {
        exit::MAX_HOLD
    } else {
        exit::LOST
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}
