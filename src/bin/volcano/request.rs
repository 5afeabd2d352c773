//! What the CLI sends besides each command's key and ttl: the optional
//! flags, applied to the SDK's request builders in one place, and the lease
//! that renew and release name.
//!
//! The SDK's builders (`Get`, `Acquire`, `Hold`, `Renew`, `Release`,
//! `ForceRelease`) have their setters under the same names but share no
//! trait; [`Request`] and [`Acquiring`] are that trait, for the setters
//! the CLI uses. A flag that was not given sets nothing: the SDK's default
//! stays, so the requests are those the SDK sends with no options.

use std::time::Duration;

use volcano::{Acquire, ForceRelease, Get, Hold, LockLease, Release, Renew};

/// How `acquire` and `run` acquire, from their flags. No `Debug`: it holds
/// the ownership token.
pub(crate) struct AcquireOptions {
    pub(crate) token: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) wait: Option<Duration>,
    pub(crate) poll_interval: Option<Duration>,
}

/// An SDK request builder: every one takes a request id.
pub(crate) trait Request: Sized {
    /// The builder's own `request_id`.
    fn set_request_id(self, request_id: String) -> Self;

    /// `set(self, value)` if the flag was given, else the builder as it is.
    fn given<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }

    /// `--request-id`, if given; else the SDK makes a fresh one.
    fn with_request_id(self, request_id: Option<String>) -> Self {
        self.given(request_id, Self::set_request_id)
    }
}

/// A builder that acquires: `Acquire` and `Hold`.
pub(crate) trait Acquiring: Request {
    /// The builder's own `token`.
    fn set_token(self, token: String) -> Self;
    /// The builder's own `wait`.
    fn set_wait(self, wait: Duration) -> Self;
    /// The builder's own `poll_interval`.
    fn set_poll_interval(self, interval: Duration) -> Self;

    /// Sets the options that were given, and only those.
    fn with_options(self, options: &AcquireOptions) -> Self {
        self.given(options.token.clone(), Self::set_token)
            .with_request_id(options.request_id.clone())
            .given(options.wait, Self::set_wait)
            .given(options.poll_interval, Self::set_poll_interval)
    }
}

macro_rules! request {
    ($($builder:ty),+) => {$(
        impl Request for $builder {
            fn set_request_id(self, request_id: String) -> Self {
                self.request_id(request_id)
            }
        }
    )+};
}

request!(Get, Acquire, Hold, Renew, Release, ForceRelease);

macro_rules! acquiring {
    ($($builder:ty),+) => {$(
        impl Acquiring for $builder {
            fn set_token(self, token: String) -> Self {
                self.token(token)
            }
            fn set_wait(self, wait: Duration) -> Self {
                self.wait(wait)
            }
            fn set_poll_interval(self, interval: Duration) -> Self {
                self.poll_interval(interval)
            }
        }
    )+};
}

acquiring!(Acquire, Hold);

/// A lease named by its key and ownership token, for renew and release
/// (the service needs nothing else; expiry and fence are placeholders).
pub(crate) fn lease_of(key: &str, token: impl Into<String>) -> LockLease {
    LockLease::new(key, token, chrono::Utc::now(), 0)
}
