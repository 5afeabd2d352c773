//! The five lock operations as types. Each knows its method, path, the
//! headers and body it adds, its one success status and how to decode the
//! answer; [`Transport::send`](crate::transport::Transport::send) builds the
//! request from one of these once and does the rest the same way for all.

use reqwest::header::HeaderValue;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Map, Value};

use crate::error::{Error, InvalidReason, Result};
use crate::locks::lease::{LockLease, LockState};
use crate::transport::LOCK_TOKEN_HEADER;

/// What a lock operation sends and expects.
pub(crate) trait Operation {
    /// The decoded success answer.
    type Output;
    /// Its name in spans and logs.
    const NAME: &'static str;
    const METHOD: Method;
    /// The one status that means success; any other is an error.
    const SUCCESS: StatusCode;
    /// `/locks/{key}/lease` rather than `/locks/{key}`.
    const ON_LEASE: bool;
    /// Whether a success carries a JSON object to decode.
    const HAS_BODY: bool;
    /// Whether a success's `Date` header is read (to time a lease, or a
    /// holder's for a waiter). Every operation says, so that a new one
    /// cannot miss it by default.
    const NEEDS_DATE: bool;
    /// Attempts of one call: acquire is idempotent for one token, so it is
    /// sent once more after a failure that left ownership undecided.
    const ATTEMPTS: u32 = 1;

    fn key(&self) -> &str;

    /// Adds the operation's own headers and body.
    fn prepare(&self, request: RequestBuilder) -> Result<RequestBuilder> {
        Ok(request)
    }

    /// Decodes a success; `body` is `Some` exactly when `HAS_BODY`.
    fn decode(&self, body: Option<Map<String, Value>>) -> Result<Self::Output, InvalidReason>;
}

/// The ownership token header, marked sensitive so it never shows in logs.
fn with_token(request: RequestBuilder, token: &str) -> Result<RequestBuilder> {
    let mut value = header_value(token, "token")?;
    value.set_sensitive(true);
    Ok(request.header(LOCK_TOKEN_HEADER, value))
}

/// The `{"ttl_seconds": n}` body of acquire and renew.
fn with_ttl(request: RequestBuilder, ttl_secs: u64) -> RequestBuilder {
    request.body(format!("{{\"ttl_seconds\":{ttl_secs}}}"))
}

pub(crate) fn header_value(value: &str, name: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(value)
        .map_err(|_| Error::invalid(format!("{name} must be a UUID string")))
}

/// `POST /locks/{key}/lease`.
pub(crate) struct Acquire<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl_secs: u64,
}

impl Operation for Acquire<'_> {
    type Output = LockLease;
    const NAME: &'static str = "acquire";
    const METHOD: Method = Method::POST;
    const SUCCESS: StatusCode = StatusCode::CREATED;
    const ON_LEASE: bool = true;
    const HAS_BODY: bool = true;
    const NEEDS_DATE: bool = true;
    const ATTEMPTS: u32 = 2;

    fn key(&self) -> &str {
        self.key
    }

    fn prepare(&self, request: RequestBuilder) -> Result<RequestBuilder> {
        with_token(request, self.token).map(|r| with_ttl(r, self.ttl_secs))
    }

    fn decode(&self, body: Option<Map<String, Value>>) -> Result<LockLease, InvalidReason> {
        LockLease::decode(
            self.key.to_owned(),
            self.token.to_owned(),
            &body.unwrap_or_default(),
        )
    }
}

/// `PATCH /locks/{key}/lease`.
pub(crate) struct Renew<'a> {
    pub(crate) lease: &'a LockLease,
    pub(crate) ttl_secs: u64,
}

impl Operation for Renew<'_> {
    type Output = LockLease;
    const NAME: &'static str = "renew";
    const METHOD: Method = Method::PATCH;
    const SUCCESS: StatusCode = StatusCode::OK;
    const ON_LEASE: bool = true;
    const HAS_BODY: bool = true;
    const NEEDS_DATE: bool = true;

    fn key(&self) -> &str {
        self.lease.key()
    }

    fn prepare(&self, request: RequestBuilder) -> Result<RequestBuilder> {
        with_token(request, self.lease.token()).map(|r| with_ttl(r, self.ttl_secs))
    }

    fn decode(&self, body: Option<Map<String, Value>>) -> Result<LockLease, InvalidReason> {
        LockLease::decode(
            self.lease.key().to_owned(),
            self.lease.token().to_owned(),
            &body.unwrap_or_default(),
        )
    }
}

/// `GET /locks/{key}`.
pub(crate) struct Get<'a> {
    pub(crate) key: &'a str,
}

impl Operation for Get<'_> {
    type Output = LockState;
    const NAME: &'static str = "get";
    const METHOD: Method = Method::GET;
    const SUCCESS: StatusCode = StatusCode::OK;
    const ON_LEASE: bool = false;
    const HAS_BODY: bool = true;
    // A waiter reads the holder's time left on the server's clock.
    const NEEDS_DATE: bool = true;

    fn key(&self) -> &str {
        self.key
    }

    fn decode(&self, body: Option<Map<String, Value>>) -> Result<LockState, InvalidReason> {
        LockState::decode(&body.unwrap_or_default())
    }
}

/// `DELETE /locks/{key}/lease`.
pub(crate) struct Release<'a> {
    pub(crate) lease: &'a LockLease,
}

impl Operation for Release<'_> {
    type Output = ();
    const NAME: &'static str = "release";
    const METHOD: Method = Method::DELETE;
    const SUCCESS: StatusCode = StatusCode::NO_CONTENT;
    const ON_LEASE: bool = true;
    const HAS_BODY: bool = false;
    const NEEDS_DATE: bool = false;

    fn key(&self) -> &str {
        self.lease.key()
    }

    fn prepare(&self, request: RequestBuilder) -> Result<RequestBuilder> {
        with_token(request, self.lease.token())
    }

    fn decode(&self, _: Option<Map<String, Value>>) -> Result<(), InvalidReason> {
        Ok(())
    }
}

/// `DELETE /locks/{key}`.
pub(crate) struct ForceRelease<'a> {
    pub(crate) key: &'a str,
}

impl Operation for ForceRelease<'_> {
    type Output = ();
    const NAME: &'static str = "force_release";
    const METHOD: Method = Method::DELETE;
    const SUCCESS: StatusCode = StatusCode::NO_CONTENT;
    const ON_LEASE: bool = false;
    const HAS_BODY: bool = false;
    const NEEDS_DATE: bool = false;

    fn key(&self) -> &str {
        self.key
    }

    fn decode(&self, _: Option<Map<String, Value>>) -> Result<(), InvalidReason> {
        Ok(())
    }
}
