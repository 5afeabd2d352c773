//! `volcano locks run KEY -- CMD [ARGS...]`: runs a command under a lock
//! that renews in the background, and releases it when the command exits.
//!
//! The child gets `VOLCANO_LOCK_KEY` and `VOLCANO_FENCING_TOKEN`, not the
//! service key (removed from its environment) nor the ownership token.
//!
//! Unless the CLI runs in the foreground of its terminal (cron, scripts,
//! supervisors, background jobs), the child leads a process group of its
//! own, and signals go to that whole group: on a loss, SIGTERM then SIGKILL
//! after `--kill-after` reach everything the command started; SIGTERM,
//! SIGINT, SIGHUP and SIGQUIT sent to the CLI are passed on. In the
//! foreground of a terminal (whatever standard input is redirected from)
//! the child stays in the terminal's foreground group, so that it can read
//! the terminal; the signals the terminal sends (Ctrl-C's SIGINT, Ctrl-\'s
//! SIGQUIT, SIGHUP on hangup) reach it directly and are not passed on
//! again; SIGTERM is, and signals go to the child alone.
//!
//! Under systemd, `KillMode=control-group` (the default) sends SIGTERM to
//! every process of the unit, the child too, and the CLI passes it on: the
//! child sees it twice. Use `KillMode=mixed` (SIGTERM to the CLI alone,
//! SIGKILL to all after `TimeoutStopSec`).
//!
//! The lock is released on every path once the child has exited, including
//! when it could not be started (exit 127 if not found, 126 otherwise, as a
//! shell does). If the CLI returns early the child is killed. Only a CLI
//! killed with SIGKILL leaves its child running; the lock then expires at
//! its ttl.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::process::{Child, Command};
use volcano::{Error, Locks};

use crate::{exit, Failure};

/// What `run` was asked to do. No `Debug`: it holds the ownership token.
pub(crate) struct RunArgs {
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) poll_interval: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) token: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) kill_after: Duration,
    pub(crate) command: Vec<String>,
}

/// How it ended: the exit code, the summary object, and what to say on
/// standard error (in text mode) if anything went wrong.
pub(crate) struct Ran {
    pub(crate) code: u8,
    pub(crate) summary: Value,
    pub(crate) warning: Option<String>,
}

pub(crate) async fn run(locks: &Locks, args: RunArgs) -> Result<Ran, Failure> {
    let RunArgs {
        key,
        ttl,
        wait,
        poll_interval,
        max_hold,
        token,
        request_id,
        kill_after,
        command,
    } = args;
    let (program, program_args) = command.split_first().ok_or_else(|| {
        crate::fail(
            exit::INVALID,
            "no command given: volcano locks run KEY -- CMD [ARGS...]",
        )
    })?;
    // Signal handlers first: a signal between acquiring and starting the
    // child must not kill the CLI and leave the lease to its ttl.
    let mut signals = Signals::install()?;

    let mut hold = locks.hold(&key, ttl);
    if let Some(token) = &token {
        hold = hold.token(token.clone());
    }
    if let Some(id) = request_id {
        hold = hold.request_id(id);
    }
    if let Some(wait) = wait {
        hold = hold.wait(wait);
    }
    if let Some(poll) = poll_interval {
        hold = hold.poll_interval(poll);
    }
    if let Some(max_hold) = max_hold {
        hold = hold.max_hold(max_hold);
    }
    // A signal while waiting for the lock ends the wait. A lease the
    // dropped or failed acquire may have obtained is released: by the
    // client for a generated token, here for the caller's.
    let held = tokio::select! {
        held = hold.send() => match held {
            Ok(held) => held,
            Err(err) => {
                if !matches!(err, Error::Conflict(_) | Error::InvalidArgument(_)) {
                    release_own(locks, &key, token.as_deref()).await;
                }
                return Err(err.into());
            }
        },
        stop = signals.next() => {
            release_own(locks, &key, token.as_deref()).await;
            return Err(crate::fail(
                stop.shell_code(),
                format!("{stop:?} received while waiting for the lock; the command was not started"),
            ))
        }
    };
    let started = Instant::now();
    let fence = held.lease().fencing_token();

    let mut command = Command::new(program);
    command
        .args(program_args)
        .env("VOLCANO_LOCK_KEY", &key)
        .env("VOLCANO_FENCING_TOKEN", fence.to_string())
        .env_remove(volcano::ENV_SERVICE_KEY)
        // Returning early (an error) must not leave it running unguarded.
        .kill_on_drop(true);
    let own_group = !in_terminal_foreground();
    #[cfg(unix)]
    if own_group {
        command.process_group(0);
    }
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            let code = if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let released = held.release().await;
            let mut warning = format!("cannot start {program:?}: {err}");
            if let Err(err) = released {
                warning.push_str(&format!("; releasing the lock failed: {err}"));
            }
            let summary = json!({
                "key": key,
                "fencing_token": fence,
                "exit_code": code,
                "signal": null,
                "started": false,
                "lost": false,
                "held_secs": secs(started.elapsed()),
            });
            return Ok(Ran {
                code,
                summary,
                warning: Some(warning),
            });
        }
    };

    // Wait for the child; on a loss, stop it (SIGTERM, then SIGKILL after
    // `kill_after`); pass on the signals the CLI receives.
    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        let kill_at = lost_at.map(|at| tokio::time::Instant::from_std(at + kill_after));
        tokio::select! {
            status = child.wait() => break status,
            _ = held.lost(), if lost_at.is_none() => {
                lost_at = Some(Instant::now());
                signal_child(&child, own_group, Stop::Terminate);
            }
            _ = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                killed = true;
                signal_child(&child, own_group, Stop::Kill);
                let _ = child.start_kill();
            }
            signal = signals.next() => {
                // In the terminal's foreground group the signals the
                // terminal sends reached the child already.
                if own_group || !signal.sent_by_terminal() {
                    signal_child(&child, own_group, signal);
                }
            }
        }
    };
    let status =
        status.map_err(|e| crate::fail(exit::OTHER, format!("lost track of the command: {e}")))?;
    let held_for = started.elapsed();
    // Any loss up to now happened while the command ran (nothing awaited
    // since it exited), even one seen only now.
    let loss = held.failure();
    let released = held.release().await;

    let (exit_code, signal) = describe(status);
    let mut warnings = Vec::new();
    let code = match &loss {
        Some(lost) => {
            warnings.push(match (lost_at, killed) {
                (None, _) => format!("{lost}, as the command ended"),
                (Some(_), false) => format!("{lost}; the command was sent SIGTERM"),
                (Some(_), true) => format!("{lost}; the command was sent SIGTERM, then SIGKILL"),
            });
            if lost.reason() == volcano::LostReason::MaxHold {
                exit::MAX_HOLD
            } else {
                exit::LOST
            }
        }
        None => shell_code(exit_code, signal),
    };
    match released {
        Ok(()) | Err(Error::LockLost(_)) => {}
        Err(err) => warnings.push(format!(
            "releasing the lock failed ({err}); it expires within its ttl"
        )),
    }
    let summary = json!({
        "key": key,
        "fencing_token": fence,
        "exit_code": exit_code,
        "signal": signal,
        "started": true,
        "lost": loss.is_some(),
        "lost_reason": loss.as_ref().map(|l| l.reason().to_string()),
        "held_secs": secs(held_for),
    });
    Ok(Ran {
        code,
        summary,
        warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
    })
}

/// Best effort, after a failed or abandoned acquire with the caller's
/// token: a lease it obtained is released rather than left for its ttl
/// (with a generated token the client does this itself).
async fn release_own(locks: &Locks, key: &str, token: Option<&str>) {
    if let Some(token) = token {
        let _ = locks.release(&crate::lease_of(key, token)).await;
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

/// The exit code, or the signal that ended the child.
fn describe(status: ExitStatus) -> (Option<i32>, Option<i32>) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        (status.code(), status.signal())
    }
    #[cfg(not(unix))]
    {
        (status.code(), None)
    }
}

/// As a shell reports it: the exit code, or 128 + the signal number.
fn shell_code(exit_code: Option<i32>, signal: Option<i32>) -> u8 {
    match (exit_code, signal) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// A signal to pass on to the child.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Hangup,
    Interrupt,
    Quit,
    Kill,
    Terminate,
}

impl Stop {
    /// Sent by a terminal to its whole foreground process group.
    fn sent_by_terminal(self) -> bool {
        matches!(self, Stop::Interrupt | Stop::Quit | Stop::Hangup)
    }

    /// A shell's exit code for a process this signal ended: 128 + N.
    fn shell_code(self) -> u8 {
        128 + match self {
            Stop::Hangup => 1,
            Stop::Interrupt => 2,
            Stop::Quit => 3,
            Stop::Kill => 9,
            Stop::Terminate => 15,
        }
    }
}

/// Sends `stop` to the child, or to its whole process group if it leads
/// one.
#[cfg(unix)]
fn signal_child(child: &Child, own_group: bool, stop: Stop) {
    use rustix::process::{kill_process, kill_process_group, Pid, Signal};
    let Some(pid) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
    else {
        return; // already reaped
    };
    let signal = match stop {
        Stop::Hangup => Signal::HUP,
        Stop::Interrupt => Signal::INT,
        Stop::Quit => Signal::QUIT,
        Stop::Kill => Signal::KILL,
        Stop::Terminate => Signal::TERM,
    };
    let _ = if own_group {
        kill_process_group(pid, signal)
    } else {
        kill_process(pid, signal)
    };
}

/// Whether this process is in the foreground process group of its
/// controlling terminal: then the child shares that group to use the
/// terminal. Standard input alone does not tell (`run ... < file` from an
/// interactive shell is still in the foreground; a child put in a group of
/// its own would be stopped by SIGTTIN when it reads `/dev/tty`).
#[cfg(unix)]
fn in_terminal_foreground() -> bool {
    // No controlling terminal (cron, a daemon): opening it fails.
    std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| rustix::termios::tcgetpgrp(&tty).ok())
        .is_some_and(|foreground| foreground == rustix::process::getpgrp())
}

#[cfg(not(unix))]
fn in_terminal_foreground() -> bool {
    true
}

#[cfg(not(unix))]
fn signal_child(child: &Child, _own_group: bool, _stop: Stop) {
    // No gentle stop elsewhere: the child is ended after --kill-after.
    let _ = child;
}

/// The signals the CLI passes on.
struct Signals {
    #[cfg(unix)]
    streams: [tokio::signal::unix::Signal; 4],
}

impl Signals {
    #[cfg(unix)]
    fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind| {
            signal(kind)
                .map_err(|e| crate::fail(exit::OTHER, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            streams: [
                install(SignalKind::interrupt())?,
                install(SignalKind::terminate())?,
                install(SignalKind::hangup())?,
                install(SignalKind::quit())?,
            ],
        })
    }

    #[cfg(not(unix))]
    fn install() -> Result<Self, Failure> {
        Ok(Signals {})
    }

    /// The next signal to pass on.
    async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        {
            let [interrupt, terminate, hangup, quit] = &mut self.streams;
            tokio::select! {
                _ = interrupt.recv() => Stop::Interrupt,
                _ = terminate.recv() => Stop::Terminate,
                _ = hangup.recv() => Stop::Hangup,
                _ = quit.recv() => Stop::Quit,
            }
        }
        #[cfg(not(unix))]
        std::future::pending().await
    }
}
