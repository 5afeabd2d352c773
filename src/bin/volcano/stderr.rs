//! Standard error, written by a thread of its own: the CLI's runtime has
//! one thread, which renews the lock, passes signals on and releases. A
//! write to a pipe whose reader is alive but not reading (a log shipper
//! that hung, with the command's own output filling the pipe) blocks; it
//! must block this thread, never that one. Lines wait in a queue of
//! [`QUEUED`]; when it is full (the reader stalled), further lines are
//! dropped, and the command goes on. A write that fails (a closed pipe, a
//! full disk) is lost the same way: never a panic.
//!
//! With `--output json` the CLI's own warnings are JSON objects too
//! ([`warn`]), so that standard error stays JSON lines.

use std::fmt::Display;
use std::io::Write as _;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;

use crate::args::Output;

/// Lines held for a stalled reader before more are dropped.
const QUEUED: usize = 256;

/// What the writer thread is given.
enum Item {
    Text(String),
    /// Written up to here: tell the sender.
    Drained(SyncSender<()>),
}

/// The queue to the writer thread, and the output format of warnings.
struct Stderr {
    queue: SyncSender<Item>,
    format: Output,
}

static STDERR: OnceLock<Stderr> = OnceLock::new();

/// Starts the writer (once). `format` chooses how [`warn`] writes.
pub(crate) fn install(format: Output) {
    STDERR.get_or_init(|| start(format));
}

fn stderr() -> &'static Stderr {
    STDERR.get_or_init(|| start(Output::Text))
}

fn start(format: Output) -> Stderr {
    let (queue, items) = sync_channel(QUEUED);
    let spawned = std::thread::Builder::new()
        .name("volcano-stderr".into())
        .spawn(move || write_all(&items));
    // Without its thread every line is dropped (the queue fills): the
    // command is what matters.
    drop(spawned);
    Stderr { queue, format }
}

fn write_all(items: &Receiver<Item>) {
    for item in items {
        match item {
            Item::Text(text) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
            }
            Item::Drained(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// One line on standard error; `false` when it was dropped (the reader
/// stalled). The only way the CLI writes there (with [`say_raw`]).
pub(crate) fn say(text: impl Display) -> bool {
    say_raw(format_args!("{text}\n"))
}

/// Text on standard error as it is (no newline added): the status line's
/// redraws, the confirmation's prompt.
pub(crate) fn say_raw(text: impl Display) -> bool {
    match stderr().queue.try_send(Item::Text(text.to_string())) {
        Ok(()) => true,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
    }
}

/// A warning of the CLI's own: `volcano: warning: ...`, or with `--output
/// json` `{"level":"warn","message":...}` as the SDK's log lines.
pub(crate) fn warn(message: impl Display) -> bool {
    match stderr().format {
        Output::Text => say(format_args!("volcano: warning: {message}")),
        Output::Json => say(json!({ "level": "warn", "message": message.to_string() })),
    }
}

/// Waits up to `within` for what was queued to be written: before the
/// process exits, and before reading the answer to a prompt. A stalled
/// reader gets no more than that.
pub(crate) fn drain(within: Duration) {
    let (done, drained) = sync_channel(1);
    if stderr().queue.try_send(Item::Drained(done)).is_ok() {
        let _ = drained.recv_timeout(within);
    }
}
