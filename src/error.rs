//! The one error type of the SDK, with predicates instead of string
//! matching; what each failure carries is in `error/detail.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod detail;

pub(crate) use detail::TransportKind;
pub use detail::{ApiError, InvalidReason, InvalidResponse, TransportError};

/// The `code` values of the service's error bodies ([`Error::code`]).
pub mod codes {
    /// A 409: another live lease owns the key.
    pub const LOCK_HELD: &str = "lock_held";
    /// A 409: the caller's lease is gone.
    pub const OWNERSHIP_LOST: &str = "lock_ownership_lost";
    /// A 429: the project's lock quota is used up.
    pub const RATE_LIMITED: &str = "lock_rate_limited";
    /// A 503: the service could not decide ownership.
    pub const SERVICE_UNAVAILABLE: &str = "lock_service_unavailable";

    /// Every code the protocol defines (section 3.2).
    pub(crate) const ALL: [&str; 4] =
        [LOCK_HELD, OWNERSHIP_LOST, RATE_LIMITED, SERVICE_UNAVAILABLE];
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a lock call.
///
/// The variants tell apart four situations a caller handles differently:
/// - nothing was sent ([`Error::InvalidArgument`]);
/// - the service answered with an error status (the variants carrying an
///   [`ApiError`]);
/// - no answer came ([`Error::Transport`]); whether any request may have been applied
///   is [`Error::may_have_been_applied`] (a 5xx may; a refused connection not);
/// - the service answered with a success status but a body that breaks the
///   contract ([`Error::InvalidResponse`]).
///
/// ```
/// # async fn demo(locks: volcano::Locks) {
/// use std::time::Duration;
/// match locks.acquire("nightly-report", Duration::from_secs(30)).await {
///     Ok(lease) => println!("fencing token {}", lease.fencing_token()),
///     Err(err) if err.is_lock_held() => println!("someone else runs the report"),
///     Err(err) => eprintln!("could not acquire: {err} (status {:?})", err.status()),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key, ttl, token, request id or configuration value was rejected
    /// locally; nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// HTTP 400 or 422: the service rejected the request as malformed.
    #[error("request rejected as invalid ({0})")]
    Validation(ApiError),
    /// HTTP 401 or 403: the service key was refused (or is the anon key).
    #[error("not authorised ({0})")]
    Authentication(ApiError),
    /// HTTP 404.
    #[error("not found ({0})")]
    NotFound(ApiError),
    /// HTTP 409: the lock is held by someone else (`is_lock_held()`), or this
    /// caller's lease is gone (`is_ownership_lost()`).
    #[error("lock conflict ({0})")]
    Conflict(ApiError),
    /// HTTP 429: the project's lock quota is used up; see `retry_after()`.
    #[error("rate limited ({0})")]
    RateLimited(ApiError),
    /// HTTP 5xx. A 503 means the service could not decide ownership: do not
    /// assume you hold the lock.
    #[error("server error ({0})")]
    Server(ApiError),
    /// Any other status, including a success status other than the one the
    /// operation expects, and redirects (which the SDK does not follow).
    #[error("unexpected response ({0})")]
    UnexpectedStatus(ApiError),
    /// The request may or may not have reached the service: connection
    /// failure, reset, or timeout.
    #[error(transparent)]
    Transport(TransportError),
    /// A success status whose body breaks the published contract.
    #[error(transparent)]
    InvalidResponse(InvalidResponse),
    /// A scoped lock (`with_lock`) lost ownership.
    #[error(transparent)]
    LockLost(LockLost),
}

impl Error {
    /// The HTTP status the service answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::InvalidResponse(e) => Some(e.status),
            Error::LockLost(e) => e.cause().and_then(Error::status),
            _ => self.api_error().and_then(|e| e.status),
        }
    }

    /// The service's machine-readable error code (`lock_held`,
    /// `lock_ownership_lost`, `lock_rate_limited`, `lock_service_unavailable`),
    /// when the error body carried one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::LockLost(e) => e.cause().and_then(Error::code),
            _ => self.api_error().and_then(|e| e.code.as_deref()),
        }
    }

    /// How long the service asked the caller to wait (HTTP 429 `Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        self.api_error().and_then(|e| e.retry_after)
    }

    /// The `X-Volcano-Request-Id` of the request that failed, for correlating
    /// with the service's logs. `None` when nothing was sent.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Transport(e) => Some(&e.request_id),
            Error::InvalidResponse(e) => Some(&e.request_id),
            Error::LockLost(e) => e.cause().and_then(Error::request_id),
            _ => self.api_error().and_then(|e| e.request_id.as_deref()),
        }
    }

    /// True for `409 lock_held`: another live lease owns the key.
    pub fn is_lock_held(&self) -> bool {
        matches!(self, Error::Conflict(e) if e.code.as_deref() == Some(codes::LOCK_HELD))
    }

    /// True when this caller no longer owns the lease: `409
    /// lock_ownership_lost`, or a [`Error::LockLost`] from a scoped lock.
    /// Stop protected work.
    pub fn is_ownership_lost(&self) -> bool {
        match self {
            Error::Conflict(e) => e.code.as_deref() == Some(codes::OWNERSHIP_LOST),
            Error::LockLost(_) => true,
            _ => false,
        }
    }

    /// True when no answer arrived (refused, reset, timed out); whether it may
    /// have been applied is [`may_have_been_applied`](Self::may_have_been_applied).
    pub fn is_transport(&self) -> bool {
        matches!(self, Error::Transport(_))
    }

    /// True when trying again later may succeed: no answer (a transport
    /// failure or timeout, unless a paused runtime clock timed it), `429` (after [`Error::retry_after`]), or
    /// `500`/`502`/`503`/`504`. False for everything that will fail the
    /// same way again (a conflict, bad credentials, a bad argument) and for
    /// [`Error::LockLost`]. Acquire with your own token (or release) when
    /// retrying something that may have been applied: both are idempotent.
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks) -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let lease = loop {
    ///     match locks.get("nightly-report").await {
    ///         Err(err) if err.is_transient() => {
    ///             tokio::time::sleep(err.retry_after().unwrap_or(Duration::from_secs(1))).await
    ///         }
    ///         other => break other?,
    ///     }
    /// };
    /// # let _ = lease; Ok(()) }
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport(e) => e.kind != TransportKind::PausedClock,
            Error::RateLimited(_) => true,
            Error::Server(api) => matches!(api.status(), Some(500 | 502 | 503 | 504)),
            _ => false,
        }
    }

    /// True when the request may have been applied although no usable
    /// answer says so: no answer (a refused connection excepted), a 5xx
    /// from the service or a proxy, an unexpected status, or a success
    /// status whose body could not be used; also a `409` that answered
    /// acquire's retry after a first attempt that may have been applied
    /// (the first attempt may land after it: `is_lock_held()` and this
    /// are both true). After such an acquire the lease may exist, or come
    /// to exist until the request's timeout has passed: acquire again with
    /// the same token to recover it (or release it). With a token the SDK
    /// generated, the SDK undoes it itself ([`Client::shutdown`](crate::Client::shutdown)
    /// names the key until no try can land).
    ///
    /// ```no_run
    /// # async fn demo(locks: volcano::Locks, token: String) {
    /// use std::time::Duration;
    /// match locks.acquire("k", Duration::from_secs(30)).token(token.clone()).await {
    ///     Err(err) if err.may_have_been_applied() => { /* acquire again with `token` */ }
    ///     _ => {}
    /// }
    /// # }
    /// ```
    pub fn may_have_been_applied(&self) -> bool {
        self.may_have_applied()
    }

    pub(crate) fn may_have_applied(&self) -> bool {
        match self {
            Error::Transport(e) => e.kind != TransportKind::Connect,
            Error::Server(_) | Error::UnexpectedStatus(_) | Error::InvalidResponse(_) => true,
            // A 409 to acquire's retry: the first attempt may still land.
            Error::Conflict(e) => e.after_uncertain,
            _ => false,
        }
    }

    /// The API error details, for the variants that carry them.
    pub fn api_error(&self) -> Option<&ApiError> {
        match self {
            Error::Validation(e)
            | Error::Authentication(e)
            | Error::NotFound(e)
            | Error::Conflict(e)
            | Error::RateLimited(e)
            | Error::Server(e)
            | Error::UnexpectedStatus(e) => Some(e),
            _ => None,
        }
    }

    /// True when the request may still be applied *later* (not only may
    /// have been): no answer came (a refused connection excepted), or an
    /// answer that is not the service's own (a 5xx whose body is not the
    /// service's envelope, an `error` string and a code of [`codes`]: a
    /// gateway that gave up sends HTML or JSON of its own; a success whose
    /// body could not be read), or a `409` to a retry after such an
    /// attempt. The service's own error answer says it handled the
    /// request: nothing of it can land after.
    pub(crate) fn may_land_late(&self) -> bool {
        match self {
            Error::Transport(e) => e.kind != TransportKind::Connect,
            Error::InvalidResponse(_) => true,
            Error::Server(e) | Error::UnexpectedStatus(e) => !e.from_service,
            Error::Conflict(e) => e.first_may_land_late,
            _ => false,
        }
    }

    /// A `409` marked as answering a retry after an attempt that may have
    /// been applied ([`Error::may_have_been_applied`]), and may still land
    /// later (`may_land_late`); other errors as they are.
    pub(crate) fn after_uncertain_attempt(self, may_land_late: bool) -> Self {
        match self {
            Error::Conflict(api) => Error::Conflict(api.after_uncertain_attempt(may_land_late)),
            other => other,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Maps an error status to its variant.
    pub(crate) fn from_status(api: ApiError) -> Self {
        match api.status {
            Some(400 | 422) => Error::Validation(api),
            Some(401 | 403) => Error::Authentication(api),
            Some(404) => Error::NotFound(api),
            Some(409) => Error::Conflict(api),
            Some(429) => Error::RateLimited(api),
            Some(500..=599) => Error::Server(api),
            _ => Error::UnexpectedStatus(api),
        }
    }
}

/// Why a scoped lock stopped being owned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal was rejected (`409`, `401`, ...), or the service kept
    /// answering with failures (`503`, `429`, ...) until no retry could
    /// arrive in time; [`LockLost::cause`] is the last answer.
    RenewalFailed,
    /// The local lease deadline passed with no answer to the renewal (a
    /// timeout or connection failure, then in [`LockLost::cause`]), or
    /// before one could be sent (a suspend, a stalled process).
    Expired,
    /// A renewal succeeded but left no safe window (2 s or less) to renew again.
    NoSafeWindow,
    /// The protected code called `mark_lost`.
    Marked,
    /// The lock reached its `max_hold` time: renewal stopped and the lease
    /// was released, whatever the protected code was doing.
    MaxHold,
    /// The scoped lock ended and its lease was released (seen by guard
    /// clones that outlive `with_lock`).
    Released,
    /// The final release was answered `409`: another token held the lock
    /// while this lease should still have been live (it was force-released,
    /// or a clock jumped), so the work done since is not covered by the
    /// lock. Reported by the release, `with_lock` and the set and leader
    /// scopes; [`LockLost::cause`] is the `409`.
    TakenOver,
}

/// Ownership of a scoped lock was lost. Stop protected work: another holder
/// may already have the lock.
#[derive(Debug, Clone)]
pub struct LockLost {
    pub(crate) key: String,
    pub(crate) reason: LostReason,
    pub(crate) detail: Option<String>,
    pub(crate) cause: Option<Arc<Error>>,
}

impl LockLost {
    pub(crate) fn new(key: impl Into<String>, reason: LostReason) -> Self {
        LockLost {
            key: key.into(),
            reason,
            detail: None,
            cause: None,
        }
    }

    pub(crate) fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub(crate) fn with_cause(self, cause: Error) -> Self {
        self.with_shared_cause(Arc::new(cause))
    }

    pub(crate) fn with_shared_cause(mut self, cause: Arc<Error>) -> Self {
        self.cause = Some(cause);
        self
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why ownership was lost.
    pub fn reason(&self) -> LostReason {
        self.reason
    }

    /// The error that ended ownership, when a request failed.
    pub fn cause(&self) -> Option<&Error> {
        self.cause.as_deref()
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::RenewalFailed => "renewal failed",
            LostReason::Expired => "lease expired (its local deadline passed)",
            LostReason::NoSafeWindow => "renewal returned no safe lease window",
            LostReason::Marked => "marked lost",
            LostReason::MaxHold => "held for its max hold time; released",
            LostReason::Released => "the scoped lock ended and was released",
            LostReason::TakenOver => "another token held the lock when it was released",
        })
    }
}

/// Reads once: the reason, the detail given to `mark_lost`, and the request
/// error behind it (`lock "k" lost: renewal failed: lock conflict (HTTP 409
/// lock_ownership_lost: …)`). The cause is part of the message, so
/// [`std::error::Error::source`] does not repeat it; [`LockLost::cause`]
/// gives it typed.
impl fmt::Display for LockLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock {:?} lost: {}", self.key, self.reason)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LockLost {}

/// `err` followed by its sources, as one line.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
