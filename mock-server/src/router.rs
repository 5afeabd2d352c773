//! The router: the floor above the handlers. It names the lock endpoint
//! (the fallback) and the `/__mock/` controls, and stamps every response it
//! makes with a `Date` from the server clock. No handler imports it; the
//! server's start (lib.rs) does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::middleware;
use axum::response::Response;
use axum::Router;

use crate::clock::http_date;
use crate::shared::Shared;
use crate::{controls, lock_api};

/// The router: lock endpoints (fallback) and the `/__mock/` controls;
/// every response it makes carries a `Date` from the server clock.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    controls::routes(shared.clone())
        .fallback(lock_api::lock_endpoint)
        .layer(middleware::map_response_with_state(
            shared.clone(),
            date_header,
        ))
        .with_state(shared)
}

/// Sets `Date` to the server clock's time when the handler has not set it
/// (lock answers carry the time they were applied; see `lock_api`).
async fn date_header(State(shared): State<Arc<Shared>>, mut response: Response) -> Response {
    if !response.headers().contains_key(header::DATE) {
        let date = http_date(shared.clock.now());
        response.headers_mut().insert(header::DATE, date);
    }
    response
}
