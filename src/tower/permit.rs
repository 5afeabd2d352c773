//! [`PermitLayer`]: each call under one permit of a semaphore.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{BoxError, Layer, Service};

use super::{under, unreserved, Asks, Call};
use crate::Semaphore;

/// Runs each call of the inner service under one permit of a semaphore;
/// see the [module](crate::tower).
#[derive(Clone)]
pub struct PermitLayer {
    semaphore: Semaphore,
    asks: Asks,
}

impl PermitLayer {
    /// Each call under one permit of `semaphore`, with leases of `ttl`:
    /// at most its count of calls at once, across every process that uses
    /// the same semaphore. Without [`wait`](Self::wait), a call that finds
    /// every permit held fails at once (after one request per permit).
    pub fn new(semaphore: Semaphore, ttl: Duration) -> Self {
        PermitLayer {
            semaphore,
            asks: Asks::new(ttl),
        }
    }

    /// Waits up to `wait` for a free permit, then fails with "held".
    pub fn wait(mut self, wait: Duration) -> Self {
        self.asks.wait = Some(wait);
        self
    }

    /// Drops the call at its next await point once its permit is lost: it
    /// fails with `Error::LockLost`.
    pub fn cancel_on_loss(mut self) -> Self {
        self.asks.cancel_on_loss = true;
        self
    }
}

impl fmt::Debug for PermitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitLayer")
            .field("semaphore", &self.semaphore)
            .field("ttl", &self.asks.ttl)
            .field("wait", &self.asks.wait)
            .field("cancel_on_loss", &self.asks.cancel_on_loss)
            .finish()
    }
}

impl<S> Layer<S> for PermitLayer {
    type Service = PermitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PermitService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service a [`PermitLayer`] makes.
#[derive(Clone, Debug)]
pub struct PermitService<S> {
    inner: S,
    layer: PermitLayer,
}

impl<S, Req> Service<Req> for PermitService<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Call<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let inner = unreserved(&mut self.inner);
        let asks = self.layer.asks;
        let mut scope = self
            .layer
            .semaphore
            .with_permit(asks.ttl, move |guard| under(guard, inner, request))
            .options(asks.options());
        if asks.cancel_on_loss {
            scope = scope.cancel_on_loss();
        }
        Box::pin(scope.send())
    }
}
