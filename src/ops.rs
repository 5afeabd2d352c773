//! The five lock operations as types. Each knows its method, path, the
//! headers and body it adds, its one success status and how to decode the
//! answer; [`Transport::send`](crate::transport::Transport::send) builds the
//! request from one of these once and does the rest the same way for all.

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Request, StatusCode};
use serde_json::{Map, Value};

use crate::error::{Error, InvalidReason, Result};
use crate::lease::{Fields, LockLease, LockState};

/// Header carrying the request id (all five operations).
pub(crate) const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-volcano-request-id");
/// Header carrying the ownership token (acquire, renew, release).
pub(crate) const LOCK_TOKEN_HEADER: HeaderName = HeaderName::from_static("x-volcano-lock-token");

/// Which resource of a key an operation addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    /// `/locks/{key}`: the lock's state.
    Lock,
    /// `/locks/{key}/lease`: the lease held on it.
    Lease,
}

/// What a success carries, as a type: an operation's decoder receives
/// exactly that, read by the transport.
pub(crate) trait SuccessBody: Sized {
    /// The most bytes read from a success; 0 reads nothing.
    const LIMIT: usize;
    fn parse(bytes: &[u8]) -> Result<Self, InvalidReason>;
}

/// A success with nothing to read (`204 No Content`).
pub(crate) struct NoContent;

impl SuccessBody for NoContent {
    const LIMIT: usize = 0;

    fn parse(_: &[u8]) -> Result<Self, InvalidReason> {
        Ok(NoContent)
    }
}

/// A success whose body is a lease or a state (a JSON object).
impl SuccessBody for Fields {
    const LIMIT: usize = usize::MAX;

    fn parse(bytes: &[u8]) -> Result<Self, InvalidReason> {
        Fields::parse(bytes)
    }
}

/// The body as a JSON object, if it is one.
pub(crate) fn json_object(bytes: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// What a lock operation sends and expects.
pub(crate) trait Operation {
    /// The decoded success answer.
    type Output;
    /// Its name in spans and logs.
    const NAME: &'static str;
    const METHOD: Method;
    /// The one status that means success; any other is an error.
    const SUCCESS: StatusCode;
    const RESOURCE: Resource;
    /// What a success carries.
    type Body: SuccessBody;
    /// Whether a success's `Date` header is read (to time a lease, or a
    /// holder's for a waiter). Every operation says, so that a new one
    /// cannot miss it by default.
    const NEEDS_DATE: bool;
    /// Attempts of one call: acquire is idempotent for one token, so it is
    /// sent once more after a failure that left ownership undecided.
    const ATTEMPTS: u32 = 1;

    fn key(&self) -> &str;

    /// Adds the operation's own headers and body.
    fn prepare(&self, request: &mut Request) -> Result<()> {
        let _ = request;
        Ok(())
    }

    /// Decodes a success.
    fn decode(&self, body: Self::Body) -> Result<Self::Output, InvalidReason>;
}

/// The ownership token header, marked sensitive so it never shows in logs.
fn with_token(request: &mut Request, token: &str) -> Result<()> {
    let mut value = header_value(token, "token")?;
    value.set_sensitive(true);
    request.headers_mut().insert(LOCK_TOKEN_HEADER, value);
    Ok(())
}

/// The `{"ttl_seconds": n}` body of acquire and renew.
fn with_ttl(request: &mut Request, ttl_secs: u64) {
    *request.body_mut() = Some(format!("{{\"ttl_seconds\":{ttl_secs}}}").into());
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
    const RESOURCE: Resource = Resource::Lease;
    type Body = Fields;
    const NEEDS_DATE: bool = true;
    const ATTEMPTS: u32 = 2;

    fn key(&self) -> &str {
        self.key
    }

    fn prepare(&self, request: &mut Request) -> Result<()> {
        with_token(request, self.token)?;
        with_ttl(request, self.ttl_secs);
        Ok(())
    }

    fn decode(&self, body: Fields) -> Result<LockLease, InvalidReason> {
        LockLease::decode((self.key.into(), self.token.into()), body)
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
    const RESOURCE: Resource = Resource::Lease;
    type Body = Fields;
    const NEEDS_DATE: bool = true;

    fn key(&self) -> &str {
        self.lease.key()
    }

    fn prepare(&self, request: &mut Request) -> Result<()> {
        with_token(request, self.lease.token())?;
        with_ttl(request, self.ttl_secs);
        Ok(())
    }

    fn decode(&self, body: Fields) -> Result<LockLease, InvalidReason> {
        LockLease::decode(self.lease.owner(), body)
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
    const RESOURCE: Resource = Resource::Lock;
    type Body = Fields;
    // A waiter reads the holder's time left on the server's clock.
    const NEEDS_DATE: bool = true;

    fn key(&self) -> &str {
        self.key
    }

    fn decode(&self, body: Fields) -> Result<LockState, InvalidReason> {
        LockState::decode(body)
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
    const RESOURCE: Resource = Resource::Lease;
    type Body = NoContent;
    const NEEDS_DATE: bool = false;

    fn key(&self) -> &str {
        self.lease.key()
    }

    fn prepare(&self, request: &mut Request) -> Result<()> {
        with_token(request, self.lease.token())
    }

    fn decode(&self, _: NoContent) -> Result<(), InvalidReason> {
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
    const RESOURCE: Resource = Resource::Lock;
    type Body = NoContent;
    const NEEDS_DATE: bool = false;

    fn key(&self) -> &str {
        self.key
    }

    fn decode(&self, _: NoContent) -> Result<(), InvalidReason> {
        Ok(())
    }
}
