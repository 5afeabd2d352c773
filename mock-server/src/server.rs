//! The HTTP side: routing, auth, quota, request validation, faults, the
//! movable clock, the journal, and a connection loop that can really drop a
//! connection.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tower::ServiceExt;
use uuid::Uuid;

use crate::clock::{http_date, Clock};
use crate::fault::{Fault, FaultKind, Faults, Operation};
use crate::state::{Grant, LockSnapshot, Refusal, Store};

/// Largest request body read, on every route (lock calls and controls);
/// larger ones get a 400.
pub const MAX_BODY: usize = 64 * 1024;
/// Most journal entries kept; older ones are dropped.
pub const MAX_JOURNAL: usize = 100_000;
/// How long a client may take to send its request headers (default).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_TTL: i64 = 5;
const MAX_TTL: i64 = 7_776_000;

/// One request the server answered (or failed on purpose), in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordedRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// Server time when the request was handled (after any injected delay,
    /// before any delay_response).
    pub at: DateTime<Utc>,
    /// The operation.
    pub operation: Operation,
    /// The key as it appeared in the path (percent-decoded).
    pub key: String,
    /// The `X-Volcano-Request-Id` header, if it was valid UTF-8.
    pub request_id: Option<String>,
    /// The status sent, or that would have been sent when the response was
    /// dropped; `None` when the connection was reset before applying.
    pub status: Option<u16>,
    /// The injected fault that shaped this answer, if any. When several
    /// did, a status, drop_response or reset fault is shown first, then
    /// delay_response, then delay; matching delays (or delay_responses) are
    /// shown added up.
    pub fault: Option<FaultKind>,
    /// The fencing token granted or reported (acquire, renew, get).
    pub fencing_token: Option<i64>,
    /// The expiry granted or reported (acquire, renew, get).
    pub expires_at: Option<DateTime<Utc>>,
}

/// Fixed one-minute quota windows, on the server clock.
#[derive(Default)]
struct Quota {
    window: i64,
    used: u32,
}

/// Server configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) service_key: String,
    pub(crate) anon_key: String,
    pub(crate) rate_limit: Option<u32>,
    pub(crate) header_read_timeout: Duration,
}

/// Everything the handlers share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    pub(crate) clock: Clock,
    journal: Mutex<(u64, VecDeque<RecordedRequest>)>,
    quota: Mutex<Quota>,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Self {
        Shared {
            config,
            store: Store::new(),
            faults: Faults::default(),
            clock: Clock::new(),
            journal: Mutex::new((0, VecDeque::new())),
            quota: Mutex::new(Quota::default()),
        }
    }

    pub(crate) fn requests(&self) -> Vec<RecordedRequest> {
        let journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        journal.1.iter().cloned().collect()
    }

    pub(crate) fn locks(&self) -> Vec<LockSnapshot> {
        self.store.snapshot(self.clock.now())
    }

    /// Forgets leases, faults, the journal and the quota window. The clock
    /// and the fencing counter keep going.
    pub(crate) fn reset(&self) {
        self.store.clear();
        self.faults.clear();
        *self.journal.lock().unwrap_or_else(|p| p.into_inner()) = (0, VecDeque::new());
        *self.quota.lock().unwrap_or_else(|p| p.into_inner()) = Quota::default();
    }

    fn record(&self, mut entry: RecordedRequest) {
        let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        journal.0 += 1;
        entry.seq = journal.0;
        if journal.1.len() == MAX_JOURNAL {
            journal.1.pop_front();
        }
        journal.1.push_back(entry);
    }

    /// Counts one operation; `Err(retry_after_secs)` once the window is full.
    fn take_quota(&self, now: DateTime<Utc>) -> Result<(), i64> {
        let Some(limit) = self.config.rate_limit else {
            return Ok(());
        };
        let window = now.timestamp().div_euclid(60);
        let mut quota = self.quota.lock().unwrap_or_else(|p| p.into_inner());
        if quota.window != window {
            *quota = Quota { window, used: 0 };
        }
        if quota.used >= limit {
            return Err(60 - now.timestamp().rem_euclid(60));
        }
        quota.used += 1;
        Ok(())
    }
}

/// Closes the connection a request arrived on.
#[derive(Clone)]
struct Kill(Arc<Notify>);

/// The router: lock endpoints (fallback) and the `/__mock/` controls;
/// every response it makes carries a `Date` from the server clock.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/__mock/faults", post(add_fault).delete(clear_faults))
        .route("/__mock/advance", post(advance))
        .route("/__mock/requests", get(list_requests))
        .route("/__mock/locks", get(list_locks))
        .route("/__mock/reset", post(reset))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            limit_control_body,
        ))
        .fallback(lock_endpoint)
        .layer(middleware::map_response_with_state(
            shared.clone(),
            date_header,
        ))
        .with_state(shared)
}

/// Sets `Date` to the server clock's time when the handler has not set it
/// (lock answers carry the time they were applied; see `lock_endpoint`).
async fn date_header(State(shared): State<Arc<Shared>>, mut response: Response) -> Response {
    if !response.headers().contains_key(header::DATE) {
        let date = http_date(shared.clock.now());
        response.headers_mut().insert(header::DATE, date);
    }
    response
}

/// Accepts connections until `shutdown` flips, serving each with HTTP/1.1.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let mut stop = shutdown.clone();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let kill = Arc::new(Notify::new());
            let service = {
                let kill = kill.clone();
                hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(Kill(kill.clone()));
                    let app = app.clone();
                    async move { app.oneshot(req.map(Body::new)).await }
                })
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                // The router sets Date from the movable clock; hyper's would
                // be machine time. (Answers hyper makes itself, to requests
                // it cannot parse, go without a Date.)
                .auto_date_header(false)
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection future closes the socket at once.
            tokio::select! {
                _ = connection => {}
                _ = kill.notified() => {}
                _ = stop.changed() => {}
            }
        });
    }
}

/// Drops leases another token could take over, once a second.
pub(crate) async fn sweep(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => { shared.store.sweep(shared.clock.now()); }
            _ = shutdown.changed() => return,
        }
    }
}

// ---------------------------------------------------------------- lock API

struct Route {
    op: Operation,
    key: String,
}

/// A refused request: the JSON error envelope plus, where the contract has
/// one, a header.
struct Reject {
    status: StatusCode,
    message: Cow<'static, str>,
    code: Option<&'static str>,
    header: Option<(header::HeaderName, HeaderValue)>,
}

impl Reject {
    fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Reject {
            status,
            message: message.into(),
            code: None,
            header: None,
        }
    }

    fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.header = Some((name, value));
        self
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(code) = self.code {
            body["code"] = code.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some((name, value)) = self.header {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

fn bad_request(message: impl Into<Cow<'static, str>>) -> Reject {
    Reject::new(StatusCode::BAD_REQUEST, message)
}

fn rate_limited(retry_after: i64) -> Reject {
    Reject::new(StatusCode::TOO_MANY_REQUESTS, "lock request limit exceeded")
        .code("lock_rate_limited")
        .header(header::RETRY_AFTER, HeaderValue::from(retry_after))
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Maps method and path to an operation; the key is percent-decoded.
fn route(method: &Method, path: &str) -> Result<Route, Reject> {
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

fn valid_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= 128
                && first.is_ascii_alphanumeric()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        }
        None => false,
    }
}

/// A header that must be a hyphenated UUID.
fn uuid_header(headers: &HeaderMap, name: &str) -> Result<Uuid, String> {
    let value = headers
        .get(name)
        .ok_or_else(|| format!("missing {name} header"))?
        .to_str()
        .map_err(|_| format!("{name} must be a UUID"))?;
    let hyphenated = value.len() == 36
        && value.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    if !hyphenated {
        return Err(format!("{name} must be a UUID"));
    }
    Uuid::try_parse(value).map_err(|_| format!("{name} must be a UUID"))
}

/// The body of acquire and renew: exactly `{"ttl_seconds": int}` in range.
fn ttl_body(bytes: &[u8]) -> Result<TimeDelta, &'static str> {
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

fn check_auth(shared: &Shared, headers: &HeaderMap) -> Result<(), Reject> {
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    match credential {
        Some(key) if key == shared.config.service_key => Ok(()),
        Some(key) if key == shared.config.anon_key => Err(Reject::new(
            StatusCode::FORBIDDEN,
            "a service-role key is required for locks",
        )),
        _ => Err(Reject::new(
            StatusCode::UNAUTHORIZED,
            "missing or invalid credentials",
        )),
    }
}

/// What one lock request resolves to, before it is turned into a response.
enum Answer {
    Lease(StatusCode, Grant),
    State(Option<Grant>),
    NoContent,
    Refused(Refusal),
}

impl Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Lease(status, grant) => (
                status,
                Json(json!({
                    "expires_at": time(grant.expires_at),
                    "fencing_token": grant.fencing_token,
                })),
            )
                .into_response(),
            Answer::State(Some(grant)) => Json(json!({
                "held": true,
                "expires_at": time(grant.expires_at),
                "fencing_token": grant.fencing_token,
            }))
            .into_response(),
            Answer::State(None) => Json(json!({ "held": false })).into_response(),
            Answer::NoContent => StatusCode::NO_CONTENT.into_response(),
            Answer::Refused(Refusal::Held) => Reject::new(StatusCode::CONFLICT, "Lock is held")
                .code("lock_held")
                .into_response(),
            Answer::Refused(Refusal::OwnershipLost) => {
                Reject::new(StatusCode::CONFLICT, "Lock ownership lost")
                    .code("lock_ownership_lost")
                    .into_response()
            }
        }
    }

    fn grant(&self) -> Option<Grant> {
        match self {
            Answer::Lease(_, grant) | Answer::State(Some(grant)) => Some(*grant),
            _ => None,
        }
    }
}

fn fault_response(status: u16) -> Reject {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match status.as_u16() {
        503 => Reject::new(status, "Lock service unavailable").code("lock_service_unavailable"),
        429 => rate_limited(1),
        _ => Reject::new(status, "injected fault"),
    }
}

async fn lock_endpoint(
    State(shared): State<Arc<Shared>>,
    kill: Option<Extension<Kill>>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let route = match route(&parts.method, parts.uri.path()) {
        Ok(route) => route,
        Err(reject) => return reject.into_response(),
    };
    let request_id = parts
        .headers
        .get("x-volcano-request-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(64).collect());
    let mut entry = RecordedRequest {
        seq: 0,
        at: shared.clock.now(),
        operation: route.op,
        key: route.key.chars().take(200).collect(),
        request_id,
        status: None,
        fault: None,
        fencing_token: None,
        expires_at: None,
    };
    let prepared = match prepare(&shared, &route, &parts.headers, body).await {
        Ok(prepared) => prepared,
        Err(reject) => {
            let response = reject.into_response();
            entry.status = Some(response.status().as_u16());
            shared.record(entry);
            return response;
        }
    };
    let planned = shared.faults.plan(route.op, &route.key);
    if !planned.delay.is_zero() {
        entry.fault = Some(FaultKind::Delay {
            delay_ms: millis(planned.delay),
        });
        tokio::time::sleep(planned.delay).await;
    }
    let now = shared.clock.now();
    entry.at = now;
    if !planned.delay_response.is_zero() {
        entry.fault = Some(FaultKind::DelayResponse {
            ms: millis(planned.delay_response),
        });
    }
    // `None`: close the connection instead of answering.
    let outcome = match planned.action {
        Some(kind @ FaultKind::Status { status }) => {
            entry.fault = Some(kind);
            Some(fault_response(status).into_response())
        }
        Some(kind @ FaultKind::Reset) => {
            entry.fault = Some(kind);
            None
        }
        action => {
            let answer = apply(&shared, &route, prepared, now);
            if let Some(grant) = answer.grant() {
                entry.fencing_token = Some(grant.fencing_token);
                entry.expires_at = Some(grant.expires_at);
            }
            let response = answer.into_response();
            entry.status = Some(response.status().as_u16());
            match action {
                Some(kind @ FaultKind::DropResponse) => {
                    entry.fault = Some(kind);
                    None
                }
                _ => Some(response),
            }
        }
    };
    if let Some(response) = &outcome {
        entry.status = Some(response.status().as_u16());
    }
    // Recorded before any delay_response wait, so the entry exists even
    // when the client gives up while the answer is held.
    shared.record(entry);
    if !planned.delay_response.is_zero() {
        tokio::time::sleep(planned.delay_response).await;
    }
    match outcome {
        Some(mut response) => {
            // A client derives its lease as `expires_at - Date`, so Date is
            // `now`, the time the answer was made and the lease computed
            // from: never earlier (which would overstate the lease). After a
            // delay_response it is still that time: the hold plays a slow
            // network, and a real server stamps Date when it answers, not
            // when the answer arrives.
            response.headers_mut().insert(header::DATE, http_date(now));
            response
        }
        None => close(kill).await,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Closes the connection without answering.
async fn close(kill: Option<Extension<Kill>>) -> Response {
    match kill {
        Some(Extension(Kill(notify))) => {
            notify.notify_one();
            std::future::pending().await
        }
        None => Reject::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot drop this connection",
        )
        .into_response(),
    }
}

/// A request that passed auth, quota and validation.
struct Prepared {
    token: Option<Uuid>,
    ttl: Option<TimeDelta>,
}

async fn prepare(
    shared: &Shared,
    route: &Route,
    headers: &HeaderMap,
    body: Body,
) -> Result<Prepared, Reject> {
    check_auth(shared, headers)?;
    shared
        .take_quota(shared.clock.now())
        .map_err(rate_limited)?;
    if !valid_key(&route.key) {
        return Err(bad_request("invalid lock key"));
    }
    uuid_header(headers, "x-volcano-request-id").map_err(bad_request)?;
    let needs_token = matches!(
        route.op,
        Operation::Acquire | Operation::Renew | Operation::Release
    );
    let token = if needs_token {
        Some(uuid_header(headers, "x-volcano-lock-token").map_err(bad_request)?)
    } else {
        None
    };
    // Every operation reads its body, so none can be sent more than
    // MAX_BODY; only acquire and renew look at it.
    let bytes = read_body(headers, body, shared.config.header_read_timeout).await?;
    let ttl = if matches!(route.op, Operation::Acquire | Operation::Renew) {
        Some(ttl_body(&bytes).map_err(bad_request)?)
    } else {
        None
    };
    Ok(Prepared { token, ttl })
}

/// Reads a request body of at most [`MAX_BODY`] bytes within `timeout`.
async fn read_body(headers: &HeaderMap, body: Body, timeout: Duration) -> Result<Bytes, Reject> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(bad_request("request body is too large"));
    }
    // A client that promises a body and never sends it would otherwise
    // hold the connection forever.
    tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY))
        .await
        .map_err(|_| bad_request("request body was not received in time"))?
        .map_err(|_| bad_request("request body is too large or unreadable"))
}

fn apply(shared: &Shared, route: &Route, prepared: Prepared, now: DateTime<Utc>) -> Answer {
    let store = &shared.store;
    let key = route.key.as_str();
    let token = prepared.token.unwrap_or_default();
    let ttl = prepared.ttl.unwrap_or_default();
    let result = match route.op {
        Operation::Acquire => store
            .acquire(key, token, ttl, now)
            .map(|g| Answer::Lease(StatusCode::CREATED, g)),
        Operation::Renew => store
            .renew(key, token, ttl, now)
            .map(|g| Answer::Lease(StatusCode::OK, g)),
        Operation::Release => store.release(key, token, now).map(|()| Answer::NoContent),
        Operation::Get => Ok(Answer::State(store.get(key, now))),
        Operation::ForceRelease | Operation::Any => {
            store.force_release(key);
            Ok(Answer::NoContent)
        }
    };
    result.unwrap_or_else(Answer::Refused)
}

// ---------------------------------------------------------------- controls

/// Reads a control request's body before its handler runs: over
/// [`MAX_BODY`], or not sent in time, is a 400 as on the lock routes.
async fn limit_control_body(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: middleware::Next,
) -> Response {
    let (parts, body) = request.into_parts();
    match read_body(&parts.headers, body, shared.config.header_read_timeout).await {
        Ok(bytes) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Err(reject) => reject.into_response(),
    }
}

async fn add_fault(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match serde_json::from_slice::<Fault>(&body) {
        Ok(fault) => {
            shared.faults.push(fault);
            StatusCode::CREATED.into_response()
        }
        Err(err) => bad_request(format!("invalid fault: {err}")).into_response(),
    }
}

async fn clear_faults(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.faults.clear();
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct Advance {
    seconds: f64,
}

async fn advance(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    // Negative, NaN, infinite and too-large numbers all fail the conversion.
    let by = serde_json::from_slice::<Advance>(&body)
        .ok()
        .and_then(|Advance { seconds }| Duration::try_from_secs_f64(seconds).ok());
    let Some(by) = by else {
        return bad_request(r#"body must be {"seconds": non-negative number}"#).into_response();
    };
    match shared.clock.try_advance(by) {
        Ok(now) => Json(json!({ "now": time(now) })).into_response(),
        Err(err) => bad_request(err.to_string()).into_response(),
    }
}

async fn list_requests(State(shared): State<Arc<Shared>>) -> Json<Vec<RecordedRequest>> {
    Json(shared.requests())
}

async fn list_locks(State(shared): State<Arc<Shared>>) -> Json<Vec<LockSnapshot>> {
    Json(shared.locks())
}

async fn reset(State(shared): State<Arc<Shared>>) -> Result<StatusCode, Infallible> {
    shared.reset();
    Ok(StatusCode::NO_CONTENT)
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
            b"{",
            b"",
        ] {
            assert!(ttl_body(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_journal_keeps_only_the_newest_entries() {
        let shared = Shared::new(Config {
            service_key: "s".into(),
            anon_key: "a".into(),
            rate_limit: None,
            header_read_timeout: HEADER_READ_TIMEOUT,
        });
        for _ in 0..MAX_JOURNAL + 10 {
            shared.record(RecordedRequest {
                seq: 0,
                at: Utc::now(),
                operation: Operation::Get,
                key: "k".into(),
                request_id: None,
                status: Some(200),
                fault: None,
                fencing_token: None,
                expires_at: None,
            });
        }
        let journal = shared.requests();
        assert_eq!(journal.len(), MAX_JOURNAL);
        assert_eq!(journal[0].seq, 11);
        assert_eq!(journal.last().unwrap().seq, (MAX_JOURNAL + 10) as u64);
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
