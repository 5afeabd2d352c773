//! What the CLI prints: a command's value, as text or as one JSON object on
//! standard output; `run`'s warning and summary; a failure on standard
//! error.
//!
//! Standard output and standard error may be a pipe whose reader has gone
//! (`... | head -1`, a log shipper that died), a full disk or a closed
//! descriptor: that is an ordinary event, never a panic, and it changes
//! nothing else the command does (renewals go on, the release is sent,
//! the exit code is one the docs list). Every write goes through `line`
//! (standard output) or `say`, `say_raw` and `warn` (standard error, from
//! a thread of its own: `stderr.rs`), which report a failed write to the
//! caller instead of panicking as `println!` and `eprintln!` do;
//! `closed()` notices a closed output without writing to it.

use std::fmt::Display;
use std::io::Write as _;
use std::time::Duration;

use serde_json::{json, Value};
use volcano::{Error, LockLease, LockState};

use crate::args::Output;
use crate::exit::Failure;
use crate::run::Ran;
pub(crate) use crate::stderr::{say, say_raw, warn};

/// `get`'s value.
/// With the time remaining until the expiry when the service answered, on
/// the service's clock (`time_remaining_ms`: `expires_at` minus the
/// answer's `Date`, 0 once past it), when held.
pub(crate) fn state_json(key: &str, state: &LockState) -> Value {
    let remaining = state
        .remaining()
        .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    json!({
        "key": key,
        "held": state.held(),
        "expires_at": state.expires_at().map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        "fencing_token": state.fencing_token(),
        "time_remaining_ms": remaining,
    })
}

/// A lease, as `acquire` and `renew` show it; the ownership token only
/// when asked.
pub(crate) fn lease_json(lease: &LockLease, show_token: bool) -> Value {
    let mut value = json!({
        "key": lease.key(),
        "held": true,
        "expires_at": lease.expires_at().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "fencing_token": lease.fencing_token(),
    });
    if show_token {
        value["token"] = lease.token().into();
    }
    value
}

/// One line on standard output; `false` when it could not be written
/// (nobody reads it any more).
pub(crate) fn line(text: impl Display) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").and_then(|()| out.flush()).is_ok()
}

/// Resolves once nobody can read standard output (the reading end of its
/// pipe closed, its terminal hung up); never for a file. Looks every
/// 100 ms without writing anything.
pub(crate) async fn closed() {
    loop {
        if gone() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(unix)]
fn gone() -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use std::os::fd::AsFd as _;
    let stdout = std::io::stdout();
    let fd = stdout.as_fd();
    // Asked for writability (some systems report nothing for an empty
    // request); only an error or a hang-up counts.
    let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(ready) if ready > 0 => fds[0]
            .revents()
            .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL),
        _ => false,
    }
}

#[cfg(not(unix))]
fn gone() -> bool {
    false
}

/// A command's value: the JSON object, or a line of text per kind;
/// `false` if standard output was closed.
pub(crate) fn print(output: Output, value: &Value) -> bool {
    if output == Output::Json {
        return line(value);
    }
    // `diagnose`: its verdict, with what to do.
    if let Some(advice) = value["advice"].as_str() {
        return line(advice);
    }
    if let Some(states) = value["permit_states"].as_array() {
        let mut written = line(format_args!(
            "{}: {} of {} permits held",
            value["semaphore"].as_str().unwrap_or_default(),
            value["permits_held"],
            value["permits"]
        ));
        for state in states {
            written &= print(output, state);
        }
        return written;
    }
    let key = value["key"].as_str().unwrap_or_default();
    if value["released"] == false {
        line(format_args!(
            "{key} was not held by anyone: this token's lease had already ended (expired or \
             force-released); nothing to release"
        ))
    } else if value.get("released").is_some() {
        line(format_args!("released {key}"))
    } else if value.get("force_released").is_some() {
        match value["was_held"].as_bool() {
            Some(true) => line(format_args!(
                "force-released {key} (held when checked, fencing token {})",
                value["fencing_token"]
            )),
            Some(false) => line(format_args!(
                "{key} was free when checked; force-released anyway"
            )),
            None => line(format_args!("force-released {key}")),
        }
    } else if value["held"] == true {
        let left = value["time_remaining_ms"]
            .as_i64()
            .map(|ms| format!(", {:.1} s left", ms as f64 / 1000.0))
            .unwrap_or_default();
        let mut written = line(format_args!(
            "{key}: held until {} (fencing token {}{left})",
            value["expires_at"].as_str().unwrap_or("?"),
            value["fencing_token"]
        ));
        if let Some(token) = value.get("token").and_then(Value::as_str) {
            written &= line(format_args!("token: {token}"));
        }
        if let Some(note) = value.get("note").and_then(Value::as_str) {
            say(format_args!("note: {note}"));
        }
        written
    } else {
        line(format_args!("{key}: free"))
    }
}

/// How `run` ended: its warning on standard error, and with `--output
/// json` its summary on the last line of standard output (if anyone still
/// reads it: the exit code is the command's either way).
pub(crate) fn ended(output: Output, ran: &Ran) {
    if let Some(warning) = &ran.warning {
        warn(warning);
    }
    if output == Output::Json {
        let _ = line(&ran.summary);
    }
}

/// A failure on standard error, with the status, code, request id and
/// retry delay when the SDK's error has them.
pub(crate) fn report(output: Output, failure: &Failure) {
    if failure.silent {
        return;
    }
    if failure.skipped && output == Output::Json {
        let value =
            json!({ "skipped": true, "message": failure.message, "exit_code": failure.code });
        say(value);
        return;
    }
    let error = failure.error.as_deref();
    let status = error.and_then(Error::status);
    let code = error.and_then(Error::code);
    let request_id = error.and_then(Error::request_id);
    let retry_after = error.and_then(Error::retry_after).map(|d| d.as_secs());
    if output == Output::Json {
        let value = json!({
            "error": failure.message,
            "exit_code": failure.code,
            "status": status,
            "code": code,
            "request_id": request_id,
            "retry_after_secs": retry_after,
        });
        say(value);
        return;
    }
    // Status and code once: API errors already say them in the message.
    let mut details = Vec::new();
    if let Some(status) = status.filter(|s| !failure.message.contains(&format!("HTTP {s}"))) {
        details.push(format!("status {status}"));
    }
    if let Some(code) = code.filter(|c| !failure.message.contains(c)) {
        details.push(format!("code {code}"));
    }
    if let Some(id) = request_id {
        details.push(format!("request id {id}"));
    }
    if let Some(secs) = retry_after {
        details.push(format!("retry after {secs}s"));
    }
    if details.is_empty() {
        say(format_args!("volcano: {}", failure.message));
    } else {
        say(format_args!(
            "volcano: {} [{}]",
            failure.message,
            details.join(", ")
        ));
    }
}
