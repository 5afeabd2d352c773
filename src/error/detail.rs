//! What each failure carries: [`ApiError`] (an error answer),
//! [`TransportError`] (no usable answer) and [`InvalidResponse`] (a success
//! whose body breaks the contract).

use std::fmt;
use std::time::Duration;

/// What the service said about a failed request.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiError {
    pub(crate) status: Option<u16>,
    pub(crate) code: Option<String>,
    pub(crate) message: String,
    pub(crate) request_id: Option<String>,
    pub(crate) retry_after: Option<Duration>,
    /// The answer came to a retry after an attempt that may have been
    /// applied (a 409 to acquire's retry after a 503 or no answer): that
    /// attempt's outcome is still unknown.
    pub(crate) after_uncertain: bool,
    /// ... and that attempt may still be applied later (no answer, a
    /// gateway's 5xx), not only may have been.
    pub(crate) first_may_land_late: bool,
    /// The body was the service's own error envelope: an `error` string and
    /// a `code` the protocol defines ([`crate::codes`]). Only that says the
    /// service handled the request; a gateway's JSON (`{"code":504,
    /// "message":..}`) or page does not.
    pub(crate) from_service: bool,
}

impl ApiError {
    pub(crate) fn after_uncertain_attempt(mut self, may_land_late: bool) -> Self {
        self.after_uncertain = true;
        self.first_may_land_late = may_land_late;
        self
    }

    /// The HTTP status; `None` for an error raised locally (no service key).
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The machine-readable `code` of the error body, if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The human-readable message: the body's `error` member, or a truncated
    /// copy of a body that was not the JSON error envelope.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The request id that was sent with the failed request.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// `Retry-After` of a 429, in whole seconds.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(status) = self.status {
            write!(f, "HTTP {status}")?;
            if let Some(code) = &self.code {
                write!(f, " {code}")?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&self.message)?;
        if self.after_uncertain {
            f.write_str(" (answered the retry; the first attempt may still have been applied)")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiError")
            .field("status", &self.status)
            .field("code", &self.code)
            .field("message", &self.message)
            .field("request_id", &self.request_id)
            .field("retry_after", &self.retry_after)
            .field("after_uncertain", &self.after_uncertain)
            .field("first_may_land_late", &self.first_may_land_late)
            .field("from_service", &self.from_service)
            .finish()
    }
}

/// The request failed without a usable answer: it may or may not have been
/// applied by the service (except a failed connection: nothing was sent).
#[derive(Debug, thiserror::Error)]
pub struct TransportError {
    pub(crate) kind: TransportKind,
    pub(crate) request_id: String,
    /// The service's origin (`scheme://host:port`), for a failed
    /// connection's message.
    pub(crate) server: Option<String>,
    #[source]
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for TransportError {
    /// A failed connection names the server and says nothing was sent; the
    /// other kinds say that the request may have been applied. The reason
    /// (refused, unknown host, certificate...) is in `source()` only, so
    /// an error chain prints it once. No secrets: the origin carries no
    /// key, path or credential.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind != TransportKind::Connect {
            return write!(f, "{}", self.kind);
        }
        f.write_str("could not connect to the lock service")?;
        if let Some(server) = &self.server {
            write!(f, " at {server}")?;
        }
        f.write_str(" (nothing was sent)")
    }
}

impl TransportError {
    /// True when the per-request timeout ran out. The request may have
    /// been applied.
    pub fn is_timeout(&self) -> bool {
        self.kind == TransportKind::Timeout
    }

    /// True when no connection could be made (refused, unreachable, DNS,
    /// TLS handshake): the request was never sent, so nothing was applied.
    pub fn is_connect(&self) -> bool {
        self.kind == TransportKind::Connect
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransportKind {
    Connect,
    Timeout,
    Io,
    /// The runtime's clock is paused and jumped ahead of real time
    /// (`start_paused`): the attempt was timed by it. Not tried again.
    PausedClock,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Connect => "could not connect to the lock service",
            TransportKind::Timeout => "the lock request timed out; it may have been applied",
            TransportKind::Io => "the connection failed mid-request; it may have been applied",
            TransportKind::PausedClock => {
                "the lock request was timed by a paused runtime clock; it may have been applied"
            }
        })
    }
}

/// A success status with a body that breaks the published contract.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid lock response: {reason}")]
pub struct InvalidResponse {
    pub(crate) reason: InvalidReason,
    pub(crate) status: u16,
    pub(crate) request_id: String,
}

impl InvalidResponse {
    /// Which rule of the contract the body broke.
    pub fn reason(&self) -> InvalidReason {
        self.reason
    }
}

/// The rule a response body broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidReason {
    /// The body is not a JSON object.
    NotAnObject,
    /// `held` is missing or not a boolean.
    HeldFlag,
    /// `expires_at` is missing where required, or not an RFC 3339 timestamp.
    Expiry,
    /// `fencing_token` is missing where required, or not a 64-bit integer.
    FencingToken,
    /// The body is larger than the SDK reads.
    TooLarge,
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidReason::NotAnObject => "body is not a JSON object",
            InvalidReason::HeldFlag => "invalid lock held flag",
            InvalidReason::Expiry => "invalid lock expiry",
            InvalidReason::FencingToken => "invalid lock fencing token",
            InvalidReason::TooLarge => "body too large",
        })
    }
}
