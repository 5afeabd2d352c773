//! The router: the floor above the handlers. It names the lock endpoint
//! and the `/__mock/` controls, and stamps every response with a `Date`
//! from the server clock. Lock requests go straight to the lock endpoint
//! ([`Service`]); the axum router, with its middleware, serves the rest. No
//! handler imports this file; the server's start (lib.rs) does.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware;
use axum::response::Response;
use axum::Router;
use tower::ServiceExt;

use crate::clock::http_date;
use crate::conn::{App, Kill};
use crate::shared::Shared;
use crate::{controls, lock_api};

/// The whole server, as each connection calls it.
#[derive(Clone)]
pub(crate) struct Service {
    shared: Arc<Shared>,
    router: Router,
}

impl Service {
    pub(crate) fn new(shared: Arc<Shared>) -> Service {
        Service {
            router: router(shared.clone()),
            shared,
        }
    }
}

impl App for Service {
    async fn call(self, request: Request, kill: Kill) -> Response {
        // Lock requests, the server's hot path, skip the router: one test
        // of the path instead of a route lookup, middleware and boxed
        // futures. Everything else, paths under /locks/ that name no lock
        // resource included, answers exactly as before.
        if request.uri().path().starts_with("/locks/") {
            let mut response =
                lock_api::lock_endpoint(self.shared.clone(), Some(kill), request).await;
            stamp_date(&self.shared, &mut response);
            return response;
        }
        match self.router.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// The router: the `/__mock/` controls, and the lock endpoint as the
/// fallback (which refuses what is not a lock request); every response it
/// makes carries a `Date` from the server clock.
fn router(shared: Arc<Shared>) -> Router {
    controls::routes(shared.clone())
        .fallback(|State(shared): State<Arc<Shared>>, request: Request| {
            lock_api::lock_endpoint(shared, None, request)
        })
        .layer(middleware::map_response_with_state(
            shared.clone(),
            date_header,
        ))
        .with_state(shared)
}

/// Sets `Date` to the server clock's time when the handler has not set it
/// (lock answers carry the time they were applied; see `lock_api`).
async fn date_header(State(shared): State<Arc<Shared>>, mut response: Response) -> Response {
    stamp_date(&shared, &mut response);
    response
}

fn stamp_date(shared: &Shared, response: &mut Response) {
    if !response.headers().contains_key(header::DATE) {
        let date = http_date(shared.clock.now());
        response.headers_mut().insert(header::DATE, date);
    }
}
