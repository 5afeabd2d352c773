//! Connections: the accept loop, one HTTP/1.1 connection per task with a
//! header read timeout, and the [`Kill`] handle through which a handler
//! closes the very connection its request arrived on (how the
//! drop_response and reset faults really drop a connection). What answers
//! a request is an [`App`], which the router's floor provides. Also the
//! once-a-second sweep of expired leases. Everything here stops when the
//! shutdown signal flips.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::reject::Reject;
use crate::shared::Shared;

/// How long a client may take to send its request headers (default).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Closes the connection a request arrived on.
#[derive(Clone)]
pub(crate) struct Kill(Arc<Notify>);

/// What answers each request of a connection, given the handle that
/// closes that connection.
pub(crate) trait App: Clone + Send + Sync + 'static {
    fn call(self, request: Request, kill: Kill) -> impl Future<Output = Response> + Send;
}

/// Accepts connections until `shutdown` flips, serving each with HTTP/1.1.
pub(crate) async fn serve(
    listener: TcpListener,
    app: impl App,
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
        tokio::spawn(serve_connection(
            stream,
            app.clone(),
            header_read_timeout,
            shutdown.clone(),
        ));
    }
}

/// Serves one HTTP/1.1 connection until the client closes it, a handler
/// kills it ([`Kill`]), or `stop` flips.
pub(crate) async fn serve_connection<S>(
    stream: S,
    app: impl App,
    header_read_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let kill = Arc::new(Notify::new());
    let service = {
        let kill = kill.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let answer = app.clone().call(req.map(Body::new), Kill(kill.clone()));
            async move { Ok::<_, std::convert::Infallible>(answer.await) }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // The router sets Date from the movable clock; hyper's would be
        // machine time. (Answers hyper makes itself, to requests it cannot
        // parse, go without a Date.)
        .auto_date_header(false)
        .header_read_timeout(header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    // Dropping the connection future closes the socket at once.
    // `biased`: the same order every time (a simulation replays), the
    // rare signals first.
    tokio::select! {
        biased;
        _ = kill.notified() => {}
        _ = stop.changed() => {}
        _ = connection => {}
    }
}

/// Closes the connection without answering. Without a [`Kill`] (a request
/// that did not come over a connection [`serve_connection`] serves) there
/// is nothing to close: a 500 says so.
pub(crate) async fn close(kill: Option<Kill>) -> Response {
    match kill {
        Some(Kill(notify)) => {
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
