//! Exit codes, one per error class, and the failure that carries one to
//! `main`.

use volcano::Error;

pub(crate) const OK: u8 = 0;
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
/// Standard output was closed (SIGPIPE's shell code, 128 + 13).
pub(crate) const CLOSED_OUTPUT: u8 = 128 + 13;

/// Every exit code the CLI chooses, and what it means: `--help` prints
/// this table, and a test holds the CLI guide's table (docs/guide/cli.md) to it.
pub(crate) const TABLE: [(u8, &str); 12] = [
    (OK, "ok"),
    (OTHER, "any other error"),
    (INVALID, "invalid argument or configuration; nothing was sent"),
    (CONFLICT, "lock held by another owner, or ownership lost (`run`: the command was not started)"),
    (AUTH, "authentication refused"),
    (RATE_LIMITED, "rate limited: the project's quota is spent until the window ends"),
    (UNAVAILABLE, "outcome unknown: a server or transport error, or an answer that could not be used; the request may have been applied (run an acquire again with the same --token and --request-id to recover the lease)"),
    (ABORTED, "force-release not confirmed, or --if-fencing-token did not match; nothing was released"),
    (LOST, "`run`: the lock was lost while the command ran (also when only its final release found another owner)"),
    (MAX_HOLD, "`run`: --max-hold ended the command"),
    (NOT_SENT, "could not connect: nothing was sent, the lock is unchanged"),
    (CLOSED_OUTPUT, "standard output was closed before the answer was written (`watch` exits 0 when its reader goes)"),
];

/// `--help`'s closing text: the exit codes, from [`TABLE`].
pub(crate) fn after_help() -> String {
    let mut text = String::from("Exit codes:\n");
    for (code, meaning) in TABLE {
        text.push_str(&format!("  {code:>3}  {meaning}\n"));
    }
    text.push_str(
        "  `run` otherwise exits with its command's code (126 or 127 if it could not be\n  \
         started, 128+N if signal N ended it), and a held lock with --held-exit-code N\n  \
         if given.\n\n\
         Credentials come from VOLCANO_SERVICE_KEY, VOLCANO_ANON_KEY and VOLCANO_API_URL;\n\
         flags override them.",
    );
    text
}

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
