//! An axum endpoint that runs an expensive export at most 2 at a time
//! across every replica: `volcano::tower::PermitLayer` in front of the
//! route, and a request that finds both permits taken answered `429 Too
//! Many Requests` with `Retry-After`, at once (no `.wait`: the client
//! retries, the server holds nothing while it waits).
//!
//! ```sh
//! cargo run --example axum_permits
//! ```
//!
//! On an in-process mock lock server unless `VOLCANO_API_URL` or
//! `VOLCANO_SERVICE_KEY` is set (semaphore `volcano-example-export` then).
//! It serves on a local port, sends 5 requests at once and exits non-zero
//! unless 2 were served and 3 answered 429 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower::{BoxError, ServiceBuilder};
use volcano::mock::MockServer;
use volcano::tower::PermitLayer;
use volcano::Client;

/// How long a client should wait before trying again: about one export.
const RETRY_AFTER_SECS: u64 = 2;

/// The 429s answered so far: the story's exports run until the three
/// other requests were told to retry (at most 10 s), so that the five
/// overlap however slow the machine.
static TOLD_TO_RETRY: AtomicUsize = AtomicUsize::new(0);

/// The expensive work.
async fn export() -> &'static str {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while TOLD_TO_RETRY.load(Ordering::SeqCst) < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    "export done\n"
}

/// The layer's errors as HTTP answers: every permit taken is 429 with
/// `Retry-After`; a lock service that cannot be reached is 503; anything
/// else (the handler itself cannot fail here) 500.
async fn answer(err: BoxError) -> Response {
    match err.downcast_ref::<volcano::Error>() {
        Some(lock) if lock.is_lock_held() => {
            TOLD_TO_RETRY.fetch_add(1, Ordering::SeqCst);
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())],
                "every export slot is busy; try again\n",
            )
                .into_response()
        }
        Some(lock) if lock.is_transient() => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())],
            "the lock service is unavailable; try again\n",
        )
            .into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (mock, name) = if configured() {
        (None, "volcano-example-export")
    } else {
        (Some(MockServer::start().await), "export")
    };
    let client = match &mock {
        Some(server) => Client::for_mock(server),
        None => Client::from_env()?,
    };
    // `route_layer`: only this route takes a permit (not a 404, not
    // another route's requests).
    let app = Router::new().route("/export", get(export)).route_layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(answer))
            .layer(PermitLayer::new(
                client.locks().semaphore(name, 2),
                Duration::from_secs(30),
            )),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/export", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let http = reqwest::Client::new();
    let answers = futures_join((0..5).map(|_| http.get(&url).send())).await;
    let (mut served, mut busy) = (0, 0);
    for answer in answers {
        let answer = answer?;
        let retry_after = answer.headers().get(header::RETRY_AFTER).cloned();
        match answer.status() {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS if retry_after.is_some() => busy += 1,
            other => return Err(format!("unexpected answer {other}").into()),
        }
    }
    client.shutdown(Duration::from_secs(10)).await;
    println!(
        "5 requests at once, 2 export slots: {served} served, {busy} answered 429 with Retry-After"
    );
    if (served, busy) != (2, 3) {
        return Err("the story did not happen: want 2 served and 3 told to retry".into());
    }
    Ok(())
}

/// Awaits every future at once (each on a task of its own).
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(task.await.expect("a request task"));
    }
    outputs
}

/// Whether the environment names a lock service (else the mock is used).
fn configured() -> bool {
    [volcano::ENV_API_URL, volcano::ENV_SERVICE_KEY]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}
