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
//!
//! Getting the lock is in `run/acquire.rs`; how the run ends (release,
//! exit code, summary) in `run/end.rs`.

mod acquire;
mod end;

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::Child;
use volcano::{AcquireOptions, Error, HeldLock, LockLease, Locks};

use crate::child::{in_terminal_foreground, signal_child, spawn, Signals, Stop};
use crate::exit::{self, fail, Failure};
use acquire::acquire;
use end::{finish, not_started};

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
    /// `--min-hold`, from `started`.
    min_hold: Option<Duration>,
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
        min_hold: args.min_hold,
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
                // Counted once an episode, when it begins; the command goes
                // on. The SDK's WARN line says it (`log.rs`).
                let risk = held.at_risk().is_some();
                if risk && !risky {
                    at_risk += 1;
                }
                risky = risk;
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
