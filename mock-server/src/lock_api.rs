//! The five lock endpoints over the lock store: auth, the quota and
//! validation in the contract's order, then the injected faults (delay,
//! status, reset, drop_response, delay_response, garbled_response,
//! gateway), then the store, then the answer. Each lock request is
//! journaled in exactly one place, [`lock_endpoint`], whatever became of
//! it (behind a gateway, when the service applied it).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use crate::clock::{http_date, json_time};
use crate::conn::{close, Kill};
use crate::fault::{millis, FaultKind, Operation};
use crate::journal::RecordedRequest;
use crate::quota::rate_limited;
use crate::reject::Reject;
use crate::request::{check_auth, route, validate, Prepared, Route, REQUEST_ID};
use crate::shared::Shared;
use crate::state::{Grant, Refusal};

// ---------------------------------------------------------------- the handler

/// What becomes of a lock request once its journal entry is written.
enum Outcome {
    /// Answer with this response.
    Respond(Response),
    /// Close the connection without answering. `would_have_sent` is the
    /// status of the answer dropped (drop_response), or `None` when the
    /// request was never applied (reset).
    Close { would_have_sent: Option<u16> },
}

impl Outcome {
    /// The status the journal shows.
    fn status(&self) -> Option<u16> {
        match self {
            Outcome::Respond(response) => Some(response.status().as_u16()),
            Outcome::Close { would_have_sent } => *would_have_sent,
        }
    }
}

/// Every lock call (and, as the router's fallback, every request to a path
/// no route names, which it refuses). `kill` closes the connection the
/// request came on.
pub(crate) async fn lock_endpoint(
    shared: Arc<Shared>,
    kill: Option<Kill>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    // Not a lock request: answered, not journaled.
    let route = match route(&parts.method, parts.uri.path()) {
        Ok(route) => route,
        Err(reject) => return reject.into_response(),
    };
    let request_id = parts.headers.get(&REQUEST_ID).and_then(|v| v.to_str().ok());
    let entry = RecordedRequest::arrived(shared.clock.now(), route.op, &route.key, request_id);
    let (outcome, hold) = handle(shared, route, &parts.headers, body, entry).await;
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    match outcome {
        Outcome::Respond(response) => response,
        Outcome::Close { .. } => close(kill).await,
    }
}

/// Checks the request, plans and plays the faults, applies it, and
/// journals it (the one place a lock request is journaled: before any
/// delay_response hold, so the entry exists even when the client gives up
/// while the answer is held). Returns what to do and how long to hold it
/// first (delay_response).
///
/// A request held by a `delay` fault is a request on a slow network: once
/// it has arrived it is applied, even if its client has given up meanwhile
/// (the wait runs in a task of its own, which a closed connection does not
/// cancel). Behind a `gateway` fault the client gets the gateway's 5xx
/// after its patience, and the request is applied on its own time, in a
/// task of its own, its clock read when it is applied.
async fn handle(
    shared: Arc<Shared>,
    route: Route,
    headers: &HeaderMap,
    body: Body,
    mut entry: RecordedRequest,
) -> (Outcome, Duration) {
    let prepared = match prepare(&shared, &route, headers, body).await {
        Ok(prepared) => prepared,
        // Refused before any fault was planned: no hold.
        Err(reject) => {
            let outcome = Outcome::Respond(reject.into_response());
            entry.status = outcome.status();
            shared.journal.record(entry);
            return (outcome, Duration::ZERO);
        }
    };
    let planned = shared.faults.plan(route.op, &route.key);
    let gateway_clock = Arc::clone(&shared);
    let apply = move |mut entry: RecordedRequest| {
        let (order, key) = (Arc::clone(&shared), route.key.clone());
        order.store.in_order(&key, move || {
            let now = shared.clock.now();
            entry.at = now;
            if !planned.delay_response.is_zero() {
                entry.fault = Some(FaultKind::DelayResponse {
                    ms: millis(planned.delay_response),
                });
            }
            let outcome = outcome(&shared, &route, prepared, now, planned.action, &mut entry);
            entry.status = outcome.status();
            shared.journal.record(entry);
            (outcome, planned.delay_response)
        })
    };
    if let Some(FaultKind::Gateway {
        status,
        patience_ms,
        apply_after_ms,
    }) = planned.action
    {
        // The gateway has passed the request on: the service applies it
        // in a task of its own, which neither the gateway's answer nor a
        // closed connection cancels. Both times count from the end of any
        // delay (the request reached the gateway then).
        let to_service = planned
            .delay
            .saturating_add(Duration::from_millis(apply_after_ms));
        tokio::spawn(async move {
            tokio::time::sleep(to_service).await;
            // The service's answer: journaled, never sent.
            drop(apply(entry));
        });
        let patience = planned
            .delay
            .saturating_add(Duration::from_millis(patience_ms));
        tokio::time::sleep(patience).await;
        let mut response = gateway_page(status);
        let now = gateway_clock.clock.now();
        response.headers_mut().insert(header::DATE, http_date(now));
        return (Outcome::Respond(response), planned.delay_response);
    }
    if planned.delay.is_zero() {
        return apply(entry);
    }
    entry.fault = Some(FaultKind::Delay {
        delay_ms: millis(planned.delay),
    });
    let delayed = tokio::spawn(async move {
        tokio::time::sleep(planned.delay).await;
        apply(entry)
    });
    match delayed.await {
        Ok(handled) => handled,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // The runtime is shutting down: nobody is left to answer.
        Err(_) => (
            Outcome::Close {
                would_have_sent: None,
            },
            Duration::ZERO,
        ),
    }
}

/// The outcome at `now`: the planned fault's, or the lock logic's answer
/// (which a dropped response applies but does not send).
fn outcome(
    shared: &Shared,
    route: &Route,
    prepared: Prepared,
    now: DateTime<Utc>,
    action: Option<FaultKind>,
    entry: &mut RecordedRequest,
) -> Outcome {
    // A client derives its lease as `expires_at - Date`, so Date is `now`,
    // the time the answer was made and the lease computed from: never
    // earlier (which would overstate the lease). After a delay_response it
    // is still that time: the hold plays a slow network, and a real server
    // stamps Date when it answers, not when the answer arrives.
    let respond = |mut response: Response| {
        response.headers_mut().insert(header::DATE, http_date(now));
        Outcome::Respond(response)
    };
    match action {
        Some(kind @ FaultKind::Status { status }) => {
            entry.fault = Some(kind);
            respond(fault_response(status).into_response())
        }
        Some(kind @ FaultKind::Reset) => {
            entry.fault = Some(kind);
            Outcome::Close {
                would_have_sent: None,
            }
        }
        action => {
            let answer = apply(shared, route, prepared, now);
            if let Some(grant) = answer.grant() {
                entry.fencing_token = Some(grant.fencing_token);
                entry.expires_at = Some(grant.expires_at);
            }
            let response = answer.into_response();
            match action {
                Some(kind @ FaultKind::DropResponse) => {
                    entry.fault = Some(kind);
                    Outcome::Close {
                        would_have_sent: Some(response.status().as_u16()),
                    }
                }
                Some(kind @ FaultKind::GarbledResponse)
                    if response.status() != StatusCode::NO_CONTENT =>
                {
                    entry.fault = Some(kind);
                    respond(garbled(response.status()))
                }
                // The service's own answer, which the gateway in front
                // of it does not pass on (see `handle`).
                Some(kind @ FaultKind::Gateway { .. }) => {
                    entry.fault = Some(kind);
                    respond(response)
                }
                _ => respond(response),
            }
        }
    }
}

/// Auth, then the quota, then validation: a request refused by one is not
/// counted or checked by the next.
async fn prepare(
    shared: &Shared,
    route: &Route,
    headers: &HeaderMap,
    body: Body,
) -> Result<Prepared, Reject> {
    check_auth(&shared.config, headers)?;
    shared
        .quota
        .take(|| shared.clock.now())
        .map_err(rate_limited)?;
    validate(route, headers, body, shared.config.header_read_timeout).await
}

/// An answer of `status` whose body is a proxy's HTML page (the
/// `garbled_response` fault).
fn garbled(status: StatusCode) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html")],
        "<html><body>upstream answered</body></html>",
    )
        .into_response()
}

/// A gateway's own answer of `status` (the `gateway` fault): its HTML
/// page, not the service's error envelope, as a load balancer that gave
/// up on the service sends it.
fn gateway_page(status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::GATEWAY_TIMEOUT);
    let page = format!(
        "<html><body><h1>{} {}</h1>the upstream service did not answer in time</body></html>",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Gateway error")
    );
    (status, [(header::CONTENT_TYPE, "text/html")], page).into_response()
}

/// The answer an injected status fault sends instead of applying.
fn fault_response(status: u16) -> Reject {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match status.as_u16() {
        503 => Reject::new(status, "Lock service unavailable").code("lock_service_unavailable"),
        429 => rate_limited(1),
        _ => Reject::new(status, "injected fault"),
    }
}

// ---------------------------------------------------------------- the store

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
            Answer::Lease(status, grant) => json(status, grant_body(None, &grant)),
            Answer::State(Some(grant)) => json(StatusCode::OK, grant_body(Some(true), &grant)),
            Answer::State(None) => json(StatusCode::OK, r#"{"held":false}"#.to_owned()),
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

/// A JSON answer. Lease and state bodies are written by hand (every lock
/// answer has one; building a `serde_json` tree for three members cost
/// more than the lock logic): only digits and the RFC 3339 time go in, so
/// nothing needs escaping.
fn json(status: StatusCode, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `{"expires_at":"…","fencing_token":n}`, then `"held":true` for a state:
/// the members in the order (sorted) the server has always sent them.
fn grant_body(held: Option<bool>, grant: &Grant) -> String {
    let mut body = String::with_capacity(96);
    body.push_str(r#"{"expires_at":""#);
    body.push_str(&json_time(grant.expires_at));
    body.push_str(r#"","fencing_token":"#);
    body.push_str(itoa::Buffer::new().format(grant.fencing_token));
    if held == Some(true) {
        body.push_str(r#","held":true"#);
    }
    body.push('}');
    body
}

/// Applies a prepared request to the store at `now`.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written bodies are the JSON serde_json would write.
    #[test]
    fn grant_bodies_are_json() {
        for fence in [0, 1, 9, 10, -1, i64::MAX, i64::MIN, 4_503_599_627_370_497] {
            let grant = Grant {
                fencing_token: fence,
                expires_at: DateTime::from_timestamp(1_800_000_000, 123_000_000).unwrap(),
            };
            let lease: serde_json::Value = serde_json::from_str(&grant_body(None, &grant)).unwrap();
            assert_eq!(
                lease,
                serde_json::json!({
                    "expires_at": "2027-01-15T08:00:00.123Z",
                    "fencing_token": fence,
                })
            );
            // Byte for byte what the server sent before (serde_json's
            // sorted members).
            assert_eq!(
                grant_body(Some(true), &grant),
                format!(
                    r#"{{"expires_at":"2027-01-15T08:00:00.123Z","fencing_token":{fence},"held":true}}"#
                )
            );
            assert_eq!(
                grant_body(None, &grant),
                format!(r#"{{"expires_at":"2027-01-15T08:00:00.123Z","fencing_token":{fence}}}"#)
            );
        }
    }
}
