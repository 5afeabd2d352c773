//! The wire: one built request in, its answer out. Everything about *what*
//! is sent and what an answer means (retries, timeouts cut to a window,
//! status mapping, decoding) is the transport's; this seam only carries an
//! attempt, so that a simulated network can stand where reqwest stands in
//! production without touching any of that policy.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::error::TransportKind;

/// A boxed future borrowing the wire.
pub(crate) type WireFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A failure to carry an attempt: no usable answer came back.
#[derive(Debug)]
pub(crate) struct WireError {
    pub(crate) kind: TransportKind,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync>,
}

/// Carries requests. The request's own timeout (`request.timeout()`)
/// bounds the whole exchange, its body included.
pub(crate) trait Wire: Send + Sync + 'static {
    /// Sends `request`; the answer's status and headers, and its body to
    /// read.
    fn send(&self, request: reqwest::Request) -> WireFuture<'_, Result<Reply, WireError>>;
}

/// An answer whose body has not been read yet.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Box<dyn ReplyBody>,
}

/// The body of a [`Reply`], read chunk by chunk (so that a reader can stop
/// at its limit).
pub(crate) trait ReplyBody: Send {
    /// The length the answer announced, if any.
    fn content_length(&self) -> Option<u64>;
    /// The next chunk; `None` at the end.
    fn chunk(&mut self) -> WireFuture<'_, Result<Option<Bytes>, WireError>>;
}

/// The production wire.
impl Wire for reqwest::Client {
    fn send(&self, request: reqwest::Request) -> WireFuture<'_, Result<Reply, WireError>> {
        Box::pin(async move {
            let mut response = self.execute(request).await.map_err(wire_error)?;
            Ok(Reply {
                status: response.status(),
                headers: std::mem::take(response.headers_mut()),
                body: Box::new(response),
            })
        })
    }
}

impl ReplyBody for reqwest::Response {
    fn content_length(&self) -> Option<u64> {
        reqwest::Response::content_length(self)
    }

    fn chunk(&mut self) -> WireFuture<'_, Result<Option<Bytes>, WireError>> {
        Box::pin(async move { reqwest::Response::chunk(self).await.map_err(wire_error) })
    }
}

/// What reqwest says went wrong, without the URL (it names the key).
fn wire_error(err: reqwest::Error) -> WireError {
    // A connection that timed out is still one that was never made:
    // nothing was sent.
    let kind = if err.is_connect() {
        TransportKind::Connect
    } else if err.is_timeout() {
        TransportKind::Timeout
    } else {
        TransportKind::Io
    };
    WireError {
        kind,
        source: Box::new(err.without_url()),
    }
}
