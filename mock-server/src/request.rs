//! Reading a lock request: which lock operation a method and path name
//! (the key percent-decoded), whether its credential is the service key,
//! and whether its key, headers and body are what the contract allows. A
//! refusal is a [`Reject`]. Which handler gets a request is the router's
//! business, not this file's.
//!
//! Why the mock validates on its own instead of sharing the SDK's
//! validator: the mock is what the SDK's tests run against. Were both to
//! call one validator, a mistake in it (a key pattern one character too
//! wide, a ttl bound off by one, a header name misspelt) would be made
//! identically on both sides, the mock would accept exactly what the SDK
//! wrongly sends, and every test would pass. Written separately from the
//! protocol, the mock can catch the SDK's own bugs. So this crate does not
//! depend on the SDK (only its tests do), and nothing here should be
//! replaced by a call into it.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use chrono::TimeDelta;
use serde_json::Value;
use uuid::Uuid;

use crate::fault::Operation;
use crate::reject::{bad_request, Reject};
use crate::shared::Config;
use crate::state::valid_key;

/// Largest request body read, on every route (lock calls and controls);
/// larger ones get a 400.
pub const MAX_BODY: usize = 64 * 1024;
/// The request id header, on every lock request.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-volcano-request-id");
/// The ownership token header (acquire, renew, release).
const LOCK_TOKEN: HeaderName = HeaderName::from_static("x-volcano-lock-token");
const MIN_TTL: i64 = 5;
const MAX_TTL: i64 = 7_776_000;

// ---------------------------------------------------------------- routing

/// A lock request's operation and (percent-decoded) key.
pub(crate) struct Route {
    pub(crate) op: Operation,
    pub(crate) key: String,
}

/// Maps method and path to an operation; the key is percent-decoded.
pub(crate) fn route(method: &Method, path: &str) -> Result<Route, Reject> {
    let not_found = || Reject::new(StatusCode::NOT_FOUND, "not found");
    let rest = path.strip_prefix("/locks/").ok_or_else(not_found)?;
    let (raw_key, on_lease) = match rest.strip_suffix("/lease") {
        Some(key) => (key, true),
        None => (rest, false),
    };
    if raw_key.contains('/') {
        return Err(not_found());
    }
    let op = match (on_lease, method.as_str()) {
        (true, "POST") => Operation::Acquire,
        (true, "PATCH") => Operation::Renew,
        (true, "DELETE") => Operation::Release,
        (false, "GET") => Operation::Get,
        (false, "DELETE") => Operation::ForceRelease,
        (true, _) => return Err(method_not_allowed("POST, PATCH, DELETE")),
        (false, _) => return Err(method_not_allowed("GET, DELETE")),
    };
    let key = percent_decode(raw_key).ok_or_else(|| bad_request("invalid lock key"))?;
    Ok(Route { op, key })
}

fn method_not_allowed(allow: &'static str) -> Reject {
    Reject::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        .header(header::ALLOW, HeaderValue::from_static(allow))
}

fn percent_decode(raw: &str) -> Option<String> {
    if !raw.contains('%') {
        return Some(raw.to_owned());
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

// ---------------------------------------------------------------- auth

/// The credential must be `Bearer <service key>`: the anon key gets 403,
/// anything else 401.
pub(crate) fn check_auth(config: &Config, headers: &HeaderMap) -> Result<(), Reject> {
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    match credential {
        Some(key) if key == config.service_key => Ok(()),
        Some(key) if key == config.anon_key => Err(Reject::new(
            StatusCode::FORBIDDEN,
            "a service-role key is required for locks",
        )),
        _ => Err(Reject::new(
            StatusCode::UNAUTHORIZED,
            "missing or invalid credentials",
        )),
    }
}

// ---------------------------------------------------------------- validation

/// A lock request whose key, headers and body are valid: the lock token
/// (acquire, renew, release) and the ttl (acquire, renew).
pub(crate) struct Prepared {
    pub(crate) token: Option<Uuid>,
    pub(crate) ttl: Option<TimeDelta>,
}

/// Checks the key, the UUID headers and the body, in that order; the body
/// is read within `timeout`.
pub(crate) async fn validate(
    route: &Route,
    headers: &HeaderMap,
    body: Body,
    timeout: Duration,
) -> Result<Prepared, Reject> {
    if !valid_key(&route.key) {
        return Err(bad_request("invalid lock key"));
    }
    uuid_header(headers, &REQUEST_ID).map_err(bad_request)?;
    let needs_token = matches!(
        route.op,
        Operation::Acquire | Operation::Renew | Operation::Release
    );
    let token = if needs_token {
        Some(uuid_header(headers, &LOCK_TOKEN).map_err(bad_request)?)
    } else {
        None
    };
    // Every operation reads its body, so none can be sent more than
    // MAX_BODY; only acquire and renew look at it.
    let bytes = read_body(headers, body, timeout).await?;
    let ttl = if matches!(route.op, Operation::Acquire | Operation::Renew) {
        Some(ttl_body(&bytes).map_err(bad_request)?)
    } else {
        None
    };
    Ok(Prepared { token, ttl })
}

/// A header that must be a hyphenated UUID, read in one pass.
fn uuid_header(headers: &HeaderMap, name: &HeaderName) -> Result<Uuid, String> {
    let value = headers
        .get(name)
        .ok_or_else(|| format!("missing {name} header"))?;
    hyphenated_uuid(value.as_bytes()).ok_or_else(|| format!("{name} must be a UUID"))
}

/// `8-4-4-4-12` hex digits (either case), and nothing else: of the forms
/// `uuid` reads, only the hyphenated one is 36 characters long.
fn hyphenated_uuid(text: &[u8]) -> Option<Uuid> {
    if text.len() != 36 {
        return None;
    }
    Uuid::try_parse_ascii(text).ok()
}

/// The body of acquire and renew: exactly `{"ttl_seconds": int}` in range.
fn ttl_body(bytes: &[u8]) -> Result<TimeDelta, &'static str> {
    /// The one form a valid body has, read without a JSON tree. Whatever
    /// it refuses is read again below, for the exact reason.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TtlOnly {
        ttl_seconds: i64,
    }
    // A derived struct also reads a JSON array (`[30]`): only an object may.
    let object = bytes.trim_ascii_start().first() == Some(&b'{');
    if let (true, Ok(TtlOnly { ttl_seconds })) = (object, serde_json::from_slice(bytes)) {
        if (MIN_TTL..=MAX_TTL).contains(&ttl_seconds) {
            return Ok(TimeDelta::seconds(ttl_seconds));
        }
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|_| "request body must be valid JSON")?;
    let Value::Object(map) = value else {
        return Err("request body must be a JSON object");
    };
    if map.len() != 1 {
        return Err("request body must have exactly one member, ttl_seconds");
    }
    let ttl = map
        .get("ttl_seconds")
        .ok_or("request body must have exactly one member, ttl_seconds")?
        .as_i64()
        .filter(|n| (MIN_TTL..=MAX_TTL).contains(n))
        .ok_or("ttl_seconds must be an integer from 5 to 7776000")?;
    Ok(TimeDelta::seconds(ttl))
}

/// Reads a request body of at most [`MAX_BODY`] bytes within `timeout`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    timeout: Duration,
) -> Result<Bytes, Reject> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(bad_request("request body is too large"));
    }
    let unreadable = |_| bad_request("request body is too large or unreadable");
    let mut read = std::pin::pin!(axum::body::to_bytes(body, MAX_BODY));
    // Usually the body came with the headers: no timer for that.
    if let Poll::Ready(read) = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
    {
        return read.map_err(unreadable);
    }
    // A client that promises a body and never sends it would otherwise
    // hold the connection forever.
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| bad_request("request body was not received in time"))?
        .map_err(unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_body_is_strict() {
        assert_eq!(
            ttl_body(br#"{"ttl_seconds":30}"#),
            Ok(TimeDelta::seconds(30))
        );
        for bad in [
            &br#"{"ttl_seconds":4}"#[..],
            br#"{"ttl_seconds":7776001}"#,
            br#"{"ttl_seconds":30.0}"#,
            br#"{"ttl_seconds":"30"}"#,
            br#"{"ttl_seconds":30,"x":1}"#,
            br#"{}"#,
            br#"[30]"#,
            br#" [30]"#,
            br#"{"ttl_seconds":30,"ttl_seconds":"x"}"#,
            br#"{"ttl_seconds":9223372036854775808}"#,
            br#"{"ttl_seconds":null}"#,
            b"{",
            b"",
        ] {
            assert!(ttl_body(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn uuids_are_read_as_uuid_reads_them() {
        for good in [
            "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10",
            "0B6F1A43-5B52-4F4E-9D51-1F6C3C7E2A10",
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
        ] {
            assert_eq!(
                hyphenated_uuid(good.as_bytes()),
                Some(Uuid::try_parse(good).unwrap()),
                "{good}"
            );
        }
        for bad in [
            "",
            "0b6f1a435b524f4e9d511f6c3c7e2a10",
            "{0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a10}",
            "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a1g",
            "0b6f1a43-5b52-4f4e-9d51+1f6c3c7e2a10",
            "0b6f1a43-5b52-4f4e-9d511-f6c3c7e2a10",
            "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a1",
            "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2a100",
            "0b6f1a43-5b52-4f4e-9d51-1f6c3c7e2aé",
        ] {
            assert_eq!(hyphenated_uuid(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn routes_and_decoding() {
        let r = route(&Method::POST, "/locks/build%3Aqueue/lease")
            .ok()
            .unwrap();
        assert_eq!((r.op, r.key.as_str()), (Operation::Acquire, "build:queue"));
        assert!(route(&Method::GET, "/locks/a/b/c").is_err());
        assert!(route(&Method::PUT, "/locks/a").is_err());
        assert!(route(&Method::GET, "/locks/%ff").is_err());
        assert!(route(&Method::GET, "/other").is_err());
    }
}
