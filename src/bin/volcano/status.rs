//! While `acquire --wait` or `run --wait` waits on a terminal: one status
//! line on standard error, redrawn every few seconds, saying who holds the
//! key (its fencing token) and for how long. Nothing when standard error
//! is not a terminal. Its own reads cost about 12 requests a minute.

use std::future::Future;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use volcano::Locks;

/// How often the line is redrawn (and the key read).
const EVERY: Duration = Duration::from_secs(5);
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
    let mut shown = false;
    let status = async {
        tokio::time::sleep(FIRST_AFTER).await;
        loop {
            if let Ok(state) = locks.get(key).await {
                let waited = started.elapsed().as_secs();
                let line = match (state.fencing_token(), state.expires_at()) {
                    (Some(fence), Some(expires)) if state.held() => {
                        let left = (expires - chrono::Utc::now()).num_seconds().max(0);
                        format!("held (fencing token {fence}), expires in {left} s")
                    }
                    _ => "free; acquiring".to_owned(),
                };
                eprint!("\r\x1b[2Kvolcano: waiting for {key}: {line} (waited {waited} s)");
                shown = true;
            }
            tokio::time::sleep(EVERY).await;
        }
    };
    let result = tokio::select! {
        result = wait => result,
        () = status => unreachable!("the status loop never ends"),
    };
    if shown {
        eprint!("\r\x1b[2K");
    }
    result
}
