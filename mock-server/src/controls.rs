//! The test controls served under `/__mock/` (no credential), for tests
//! written in other languages: the same faults, clock, journal, lock list
//! and reset that `MockServer` offers in process. Their bodies are limited
//! and timed like the lock API's. The router mounts [`routes`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::clock::json_time;
use crate::fault::{Fault, InvalidFault};
use crate::journal::RecordedRequest;
use crate::reject::{bad_request, Reject};
use crate::request::read_body;
use crate::shared::Shared;
use crate::state::LockSnapshot;

/// The `/__mock/` routes, each body read (and limited) before its handler
/// runs.
pub(crate) fn routes(shared: Arc<Shared>) -> Router<Arc<Shared>> {
    Router::new()
        .route("/__mock/faults", post(add_fault).delete(clear_faults))
        .route("/__mock/advance", post(advance))
        .route("/__mock/requests", get(list_requests))
        .route("/__mock/locks", get(list_locks))
        .route("/__mock/reset", post(reset))
        .route_layer(middleware::from_fn_with_state(shared, limit_control_body))
}

/// Reads a control request's body before its handler runs: over
/// [`MAX_BODY`](crate::request::MAX_BODY), or not sent in time, is a 400
/// as on the lock routes.
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
        Ok(fault) => match shared.faults.push(fault) {
            Ok(()) => StatusCode::CREATED.into_response(),
            Err(err @ InvalidFault::TooMany) => {
                Reject::new(StatusCode::CONFLICT, err.to_string()).into_response()
            }
            Err(err) => bad_request(err.to_string()).into_response(),
        },
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
        Ok(now) => Json(json!({ "now": json_time(now) })).into_response(),
        Err(err) => bad_request(err.to_string()).into_response(),
    }
}

async fn list_requests(State(shared): State<Arc<Shared>>) -> Json<Vec<RecordedRequest>> {
    Json(shared.journal.entries())
}

async fn list_locks(State(shared): State<Arc<Shared>>) -> Json<Vec<LockSnapshot>> {
    Json(shared.locks())
}

async fn reset(State(shared): State<Arc<Shared>>) -> Result<StatusCode, Infallible> {
    shared.reset();
    Ok(StatusCode::NO_CONTENT)
}
