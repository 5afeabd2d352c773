//! `volcano locks run KEY -- CMD [ARGS...]`: runs a command under a lock
//! that renews in the background, and releases it when the command exits.
//!
//! The child gets `VOLCANO_LOCK_KEY` and `VOLCANO_FENCING_TOKEN`, not the
//! service key (removed from its environment) nor the ownership token.
//!
//! How the child is started, signalled and stopped: `child.rs`.
//!
//! The lock is released on every path once the child has exited, including
//! when it could not be started (exit 127 if not found, 126 otherwise, as a
//! shell does). If the CLI returns early the child is killed. Only a CLI
//! killed with SIGKILL leaves its child running; the lock then expires at
//! its ttl.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::Child;
use volcano::{AcquireOptions, Error, HeldLock, LockLease, LockLost, Locks};

use crate::child::{
    describe, in_terminal_foreground, shell_code, signal_child, spawn, Signals, Stop,
};
use crate::exit::{self, fail, Failure};

/// What `run` was asked to do. No `Debug`: it holds the ownership token.
pub(crate) struct RunArgs {
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    /// Its token, request id, wait, poll interval and longest hold.
    pub(crate) options: AcquireOptions,
    pub(crate) held: WhenHeld,
    /// Keep the lock at least this long after it was acquired.
    pub(crate) min_hold: Option<Duration>,
    /// Run under a permit of the semaphore `key` of this many permits.
    pub(crate) permits: Option<u32>,
    pub(crate) kill_after: Duration,
    pub(crate) command: Vec<String>,
}

/// What to do when the lock is held elsewhere: by default exit 3 with the
/// service's answer on standard error; with an exit code, a skip of one
/// line (none when quiet).
pub(crate) struct WhenHeld {
    pub(crate) exit_code: Option<u8>,
    pub(crate) quiet: bool,
}

impl WhenHeld {
    /// The failure for a lock found held: `err` as it is, or a skip.
    fn failure(&self, key: &str, err: Error) -> Failure {
        if !err.is_lock_held() {
            return Failure::from(err);
        }
        let mut failure = match self.exit_code {
            Some(code) => {
                let mut skip = fail(
                    code,
                    format!("{key} is held elsewhere; skipped (the command was not started)"),
                );
                skip.skipped = true;
                skip
            }
            None => Failure::from(err),
        };
        failure.silent = self.quiet;
        failure
    }
}

/// How it ended: the exit code, the summary object, and what to say on
/// standard error (in text mode) if anything went wrong.
pub(crate) struct Ran {
    pub(crate) code: u8,
    pub(crate) summary: Value,
    pub(crate) warning: Option<String>,
}

/// The lock while the command runs, and what the summary says of it.
struct Holding<'a> {
    held: HeldLock,
    key: &'a str,
    fence: i64,
    started: Instant,
}

/// What was done to stop the command after a loss, and what the lock
/// went through meanwhile.
#[derive(Clone, Copy)]
struct Stopped {
    /// It was sent SIGTERM.
    terminated: bool,
    /// It was sent SIGKILL too, `--kill-after` later.
    killed: bool,
    /// Episodes of failing renewals while it ran (each said once).
    at_risk: u32,
    /// The CLI was sent a signal while it ran (passed on to it): a job
    /// stopped from outside keeps no minimum.
    signalled: bool,
}

pub(crate) async fn run(locks: &Locks, args: RunArgs) -> Result<Ran, Failure> {
    let (program, program_args) = args.command.split_first().ok_or_else(|| {
        fail(
            exit::INVALID,
            "no command given: volcano locks run KEY -- CMD [ARGS...]",
        )
    })?;
    // Signal handlers first: a signal between acquiring and starting the
    // child must not kill the CLI and leave the lease to its ttl.
    let mut signals = Signals::install()?;
    let held = acquire(locks, &args, &mut signals).await?;
    let started = Instant::now();
    let fence = held.lease().fencing_token();
    // The lock's key: a semaphore's permit's, with --permits.
    let key = held.lease().key().to_owned();
    let holding = Holding {
        held,
        key: &key,
        fence,
        started,
    };
    let own_group = !in_terminal_foreground();
    let spawned = spawn(program, program_args, holding.key, holding.fence, own_group);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => return Ok(not_started(holding, program, &err).await),
    };
    let (status, stopped) = supervise(
        &mut child,
        &holding.held,
        &mut signals,
        own_group,
        args.kill_after,
    )
    .await;
    let status =
        status.map_err(|e| fail(exit::OTHER, format!("lost track of the command: {e}")))?;
    Ok(finish(holding, status, stopped, &mut signals).await)
}

/// Acquires the lock. A signal while waiting for it ends the wait. A lease
/// the dropped or failed acquire may have obtained is released: by the
/// client for a generated token, here for the caller's.
async fn acquire(
    locks: &Locks,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<HeldLock, Failure> {
    let token = args.options.get_token();
    // `--min-hold` is checked by the SDK, as for `min_hold`, before
    // anything is sent; the release then keeps it.
    let waiting = args.options.get_wait().is_some();
    let hold: std::pin::Pin<Box<dyn std::future::Future<Output = Result<HeldLock, Error>> + '_>> =
        match args.permits {
            Some(permits) => {
                let mut permit = locks
                    .semaphore(&args.key, permits)
                    .acquire(args.ttl)
                    .options(args.options.clone());
                if let Some(min) = args.min_hold {
                    permit = permit.min_hold(min);
                }
                Box::pin(permit.send())
            }
            None => {
                let mut hold = locks
                    .hold(&args.key, args.ttl)
                    .options(args.options.clone());
                if let Some(min) = args.min_hold {
                    hold = hold.min_hold(min);
                }
                Box::pin(crate::status::while_waiting(
                    locks,
                    &args.key,
                    waiting,
                    hold.send(),
                ))
            }
        };
    tokio::select! {
        held = hold => match held {
            Ok(held) => Ok(held),
            Err(err) => {
                let uncertain = err.may_have_been_applied();
                if uncertain || !matches!(err, Error::Conflict(_) | Error::InvalidArgument(_)) {
                    release_own(locks, &args.key, token, uncertain).await;
                }
                Err(args.held.failure(&args.key, err))
            }
        },
        stop = signals.next() => {
            // A try may have been in flight.
            release_own(locks, &args.key, token, true).await;
            Err(fail(
                stop.shell_code(),
                format!("{stop:?} received while waiting for the lock; the command was not started"),
            ))
        }
    }
}

/// The command could not be started: the lock is released, and the exit
/// code is a shell's (127 if the command was not found, 126 otherwise).
async fn not_started(holding: Holding<'_>, program: &str, err: &std::io::Error) -> Ran {
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
        })
    }
}

/// Waits for the child; on a loss, stops it (SIGTERM, then SIGKILL after
/// `kill_after`); passes on the signals the CLI receives.
async fn supervise(
    child: &mut Child,
    held: &HeldLock,
    signals: &mut Signals,
    own_group: bool,
    kill_after: Duration,
) -> (std::io::Result<ExitStatus>, Stopped) {
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    let mut at_risk = 0;
    let mut risky = false;
    let mut signalled = false;
    let status = loop {
        let kill_at = lost_at.map(|at| tokio::time::Instant::from_std(at + kill_after));
        tokio::select! {
            status = child.wait() => break status,
            _ = held.lost(), if lost_at.is_none() => {
                lost_at = Some(Instant::now());
                signal_child(child, own_group, Stop::Terminate);
            }
            () = held.at_risk_changed(), if lost_at.is_none() => {
                // Said once an episode, when it begins; the command goes on.
                let risk = held.at_risk();
                if let (false, Some(risk)) = (risky, &risk) {
                    at_risk += 1;
                    eprintln!("volcano: warning: {risk}; the command goes on");
                }
                risky = risk.is_some();
            }
            _ = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                killed = true;
                signal_child(child, own_group, Stop::Kill);
                let _ = child.start_kill();
            }
            signal = signals.next() => {
                signalled = true;
                // In the terminal's foreground group the signals the
                // terminal sends reached the child already.
                if own_group || !signal.sent_by_terminal() {
                    signal_child(child, own_group, signal);
                }
            }
        }
    };
    let stopped = Stopped {
        terminated: lost_at.is_some(),
        killed,
        at_risk,
        signalled,
    };
    (status, stopped)
}

/// The command has exited: the lock is released (or, with `--min-hold`
/// not passed yet, kept by the service until the minimum's end), and the
/// exit code is the command's, or 8 (9 for `--max-hold`) if the lock was
/// lost meanwhile.
async fn finish(
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
    let released = if stopped.signalled {
        holding.held.release_now().await
    } else {
        tokio::select! {
            released = holding.held.release() => released,
            _ = signals.next() => Ok(()),
        }
    };
    // A release that found another token holding the lock proves a loss
    // the renewals had not seen yet (a force release before the first
    // renewal): the command ran, at least in part, without the lock.
    let loss = match (loss, &released) {
        (None, Err(Error::LockLost(taken))) => Some(taken.clone()),
        (loss, _) => loss,
    };

    let (exit_code, signal) = describe(status);
    let mut warnings = Vec::new();
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

/// Best effort, after a failed or abandoned acquire with the caller's
/// token: a lease it obtained is released rather than left for its ttl
/// (with a generated token the client does this itself).
async fn release_own(locks: &Locks, key: &str, token: Option<&str>, late: bool) {
    let Some(token) = token else { return };
    match release_ignoring_conflict(locks, &lease_of(key, token)).await {
        // A try of the acquire may still land (held on its way, or behind
        // a gateway that answered 5xx). The token is the caller's: they
        // recover or release it once no try can land.
        Ok(()) if late => eprintln!(
            "volcano: warning: a try of the acquire may still be applied in the next {} s \
             and hold {key} under your --token; acquire again with it, or release it, \
             after then",
            (locks.client().timeout() + volcano::LATE_TRY_MARGIN).as_secs()
        ),
        Ok(()) => {}
        // The token is the caller's: they can still release it.
        Err(err) => eprintln!(
            "volcano: warning: {key} may still be held under your --token until its ttl \
             (the release after the failed acquire failed: {err})"
        ),
    }
}

/// Releases `lease`; a `409` (another token holds the key) leaves nothing
/// of this token's to release.
async fn release_ignoring_conflict(locks: &Locks, lease: &LockLease) -> Result<(), Error> {
    match locks.release(lease).await {
        Err(Error::Conflict(_)) => Ok(()),
        other => other,
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A lease named by its key and ownership token, for renew and release
/// (the service needs nothing else; expiry and fence are placeholders).
pub(crate) fn lease_of(key: &str, token: impl Into<String>) -> LockLease {
    LockLease::new(key, token, chrono::Utc::now(), 0)
}
