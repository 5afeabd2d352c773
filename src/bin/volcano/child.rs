//! The child process of `locks run`, as the OS sees it: how it is started,
//! the signals the CLI passes on and how they reach the child (or its whole
//! process group), whether the CLI is in its terminal's foreground, and the
//! child's exit status as a shell reports it.
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

use std::process::ExitStatus;

use tokio::process::{Child, Command};

use crate::exit::Failure;

/// Starts the command with the lock's key and fencing token in its
/// environment and without the service key; in a process group of its own
/// if `own_group`.
pub(crate) fn spawn(
    program: &str,
    program_args: &[String],
    key: &str,
    fence: i64,
    own_group: bool,
) -> std::io::Result<Child> {
    let mut command = Command::new(program);
    command
        .args(program_args)
        .env("VOLCANO_LOCK_KEY", key)
        .env("VOLCANO_FENCING_TOKEN", fence.to_string())
        .env_remove(volcano::ENV_SERVICE_KEY)
        // Returning early (an error) must not leave it running unguarded.
        .kill_on_drop(true);
    #[cfg(unix)]
    if own_group {
        command.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = own_group;
    command.spawn()
}

/// The exit code, or the signal that ended the child.
pub(crate) fn describe(status: ExitStatus) -> (Option<i32>, Option<i32>) {
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
pub(crate) fn shell_code(exit_code: Option<i32>, signal: Option<i32>) -> u8 {
    match (exit_code, signal) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// A signal to pass on to the child.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stop {
    Hangup,
    Interrupt,
    Quit,
    Kill,
    Terminate,
}

impl Stop {
    /// Sent by a terminal to its whole foreground process group.
    pub(crate) fn sent_by_terminal(self) -> bool {
        matches!(self, Stop::Interrupt | Stop::Quit | Stop::Hangup)
    }

    /// A shell's exit code for a process this signal ended: 128 + N.
    pub(crate) fn shell_code(self) -> u8 {
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
pub(crate) fn signal_child(child: &Child, own_group: bool, stop: Stop) {
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
pub(crate) fn in_terminal_foreground() -> bool {
    // No controlling terminal (cron, a daemon): opening it fails.
    std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| rustix::termios::tcgetpgrp(&tty).ok())
        .is_some_and(|foreground| foreground == rustix::process::getpgrp())
}

#[cfg(not(unix))]
pub(crate) fn in_terminal_foreground() -> bool {
    true
}

#[cfg(not(unix))]
pub(crate) fn signal_child(child: &Child, _own_group: bool, _stop: Stop) {
    // No gentle stop elsewhere: the child is ended after --kill-after.
    let _ = child;
}

/// The signals the CLI passes on.
pub(crate) struct Signals {
    #[cfg(unix)]
    streams: [tokio::signal::unix::Signal; 4],
}

impl Signals {
    #[cfg(unix)]
    pub(crate) fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind| {
            signal(kind).map_err(|e| {
                crate::exit::fail(crate::exit::OTHER, format!("cannot handle signals: {e}"))
            })
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
    pub(crate) fn install() -> Result<Self, Failure> {
        Ok(Signals {})
    }

    /// The next signal to pass on.
    pub(crate) async fn next(&mut self) -> Stop {
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
