//! The no-op baseline for the throughput benchmark: the mock server's
//! stack (hyper HTTP/1.1 over tokio, a task per keep-alive connection, an
//! axum `Router`) answering the five lock routes with canned bodies, and
//! nothing else: no auth, validation, state, faults or journal. What the
//! mock server does beyond this is what the throughput ratio measures; that
//! includes its own routing, its per-connection kill handle and a `Date`
//! formatted from its movable clock (the baseline keeps hyper's cached one).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// Acquire's and renew's answer.
const LEASE: &str = r#"{"expires_at":"1970-01-01T00:00:00.000Z","fencing_token":1}"#;
/// Get's answer.
const NOT_HELD: &str = r#"{"held":false}"#;

/// A running baseline server; dropping it stops accepting.
pub(crate) struct Baseline {
    pub(crate) addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn json(status: StatusCode, body: &'static str) -> impl IntoResponse {
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}

fn router() -> Router {
    Router::new()
        .route(
            "/locks/{key}/lease",
            post(|| async { json(StatusCode::CREATED, LEASE) })
                .patch(|| async { json(StatusCode::OK, LEASE) })
                .delete(|| async { StatusCode::NO_CONTENT }),
        )
        .route(
            "/locks/{key}",
            get(|| async { json(StatusCode::OK, NOT_HELD) })
                .delete(|| async { StatusCode::NO_CONTENT }),
        )
}

/// Listens on 127.0.0.1 and a free port, serving each connection with
/// HTTP/1.1 as the mock server does.
pub(crate) async fn start() -> Baseline {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router();
    let accept = tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let app = app.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        app.clone().oneshot(req.map(Body::new))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Baseline { addr, accept }
}
