//! Exit codes, one per error class, and the failure that carries one to
//! `main`.

use volcano::Error;

pub(crate) const OTHER: u8 = 1;
pub(crate) const INVALID: u8 = 2;
pub(crate) const CONFLICT: u8 = 3;
pub(crate) const AUTH: u8 = 4;
pub(crate) const RATE_LIMITED: u8 = 5;
pub(crate) const UNAVAILABLE: u8 = 6;
pub(crate) const ABORTED: u8 = 7;
pub(crate) const LOST: u8 = 8;
pub(crate) const MAX_HOLD: u8 = 9;
/// No connection could be made: nothing was sent, the lock is unchanged.
pub(crate) const NOT_SENT: u8 = 10;

/// A failure with its exit code.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    pub(crate) error: Option<Box<Error>>,
    /// Print nothing (a quiet skip).
    pub(crate) silent: bool,
    /// A skip (`--held-exit-code`), not an error: JSON says so.
    pub(crate) skipped: bool,
}

/// The exit code of an SDK error: one table for every command. Any
/// outcome the service may have applied (no answer, a 5xx, an unexpected
/// status, a success whose body could not be used) is 6, so that a script
/// acquiring with `--token` knows to run the same command again to recover
/// a lease that may exist.
pub(crate) fn code_of(error: &Error) -> u8 {
    match error {
        Error::InvalidArgument(_) => INVALID,
        // A loss before `run`'s command started: no work was done.
        Error::Conflict(_) | Error::LockLost(_) => CONFLICT,
        Error::Authentication(_) => AUTH,
        Error::RateLimited(_) => RATE_LIMITED,
        Error::Transport(t) if t.is_connect() => NOT_SENT,
        error if error.may_have_been_applied() => UNAVAILABLE,
        _ => OTHER,
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = code_of(&error);
        // A failed connection's reason is its root cause; the layers in
        // between repeat the URL.
        let mut message = match &error {
            Error::Transport(t) if t.is_connect() => match root(&error) {
                Some(root) => format!("{error}: {root}"),
                None => error.to_string(),
            },
            _ => chain(&error),
        };
        if matches!(error, Error::InvalidArgument(_)) && message.contains("allow_insecure_http") {
            message.push_str(" (here: --allow-insecure-http or VOLCANO_ALLOW_INSECURE_HTTP=1)");
        }
        Failure {
            code,
            message,
            error: Some(Box::new(error)),
            silent: false,
            skipped: false,
        }
    }
}

/// The last of `error`'s sources, if it has any.
fn root(error: &dyn std::error::Error) -> Option<String> {
    std::iter::successors(error.source(), |e| e.source())
        .last()
        .map(ToString::to_string)
}

/// A failure that is not an SDK error.
pub(crate) fn fail(code: u8, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
        error: None,
        silent: false,
        skipped: false,
    }
}

/// The error and each of its sources, joined with `: `. A transport
/// error's reason (refused, a certificate the trust store does not know,
/// ...) is in its sources.
fn chain(error: &dyn std::error::Error) -> String {
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
