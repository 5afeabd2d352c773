//! While `acquire --wait` or `run --wait` waits on a terminal: one status
//! line on standard error, redrawn every few seconds, saying who holds the
//! key (its fencing token) and for how long. Nothing when standard error
//! is not a terminal. Its own reads cost about 6 requests a minute (fewer
//! after a 429); the line is kept short and cleared however the wait ends.

use std::future::Future;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use volcano::Locks;

/// How often the line is redrawn (and the key read).
const EVERY: Duration = Duration::from_secs(10);
/// No line at all for a wait shorter than this.
const FIRST_AFTER: Duration = Duration::from_secs(1);

/// Runs `wait`; meanwhile, if `waiting` and standard error is a terminal,
/// shows the status line, and clears it at the end.
pub(crate) async fn while_waiting<T>(
    locks: &Locks,
    key: &str,
    waiting: bool,
    wait: impl Future<Output = T>,
) -> T {
    if !waiting || !std::io::stderr().is_terminal() {
        return wait.await;
    }
    let started = Instant::now();
    let line = Line::default();
    let status = async {
        tokio::time::sleep(FIRST_AFTER).await;
        loop {
            let pause = match locks.get(key).await {
                Ok(state) => {
                    let waited = started.elapsed().as_secs();
                    // Time left on the service's clock (its `Date`), not
                    // this machine's.
                    let now = match (state.fencing_token(), state.remaining()) {
                        (Some(fence), Some(left)) if state.held() => {
                            format!("held, fencing token {fence}, ~{} s left", left.as_secs())
                        }
                        _ => "free; acquiring".to_owned(),
                    };
                    line.show(&format!("volcano: waiting {waited} s: {now}"));
                    EVERY
                }
                Err(err) => EVERY.max(err.retry_after().unwrap_or_default()),
            };
            tokio::time::sleep(pause).await;
        }
    };
    let result = tokio::select! {
        result = wait => result,
        () = status => unreachable!("the status loop never ends"),
    };
    if line.clear() {
        // Cleared on the terminal before the answer is printed there:
        // standard error is written by a thread of its own, standard
        // output is not. (Up to a second, off this thread: a stalled
        // reader holds nothing up for longer.)
        let drained = || crate::stderr::drain(Duration::from_secs(1));
        let _ = tokio::task::spawn_blocking(drained).await;
    }
    result
    // Dropped mid-wait (a signal), `line` clears what it showed.
}

/// The status line on standard error; cleared when dropped.
#[derive(Default)]
struct Line {
    shown: std::cell::Cell<bool>,
}

impl Line {
    fn show(&self, text: &str) {
        // Short enough for one row of a narrow terminal (no key in it: a
        // key can be 128 characters), so `\r` and a clear redraw it all.
        crate::output::say_raw(format_args!(
            "\r\x1b[2K{}",
            text.chars().take(78).collect::<String>()
        ));
        self.shown.set(true);
    }

    /// Clears what it showed; `true` if there was anything.
    fn clear(&self) -> bool {
        let shown = self.shown.replace(false);
        if shown {
            crate::output::say_raw("\r\x1b[2K");
        }
        shown
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        self.clear();
    }
}
