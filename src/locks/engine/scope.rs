//! Scopes: hold the lock, run the caller's closure with a
//! [`LockGuard`] while the lease renews in the background, release on
//! every exit (success, error, panic, cancellation). `with_lock`,
//! `try_with_lock` and `with_locks` differ only in what they hold and in
//! what a refused acquire means; the outcome is merged once
//! ([`outcome_of`]).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tracing::Instrument;

use super::Spec;
use crate::error::Error;
use crate::locks::{AcquireOptions, LockGuard, LockSet, Locks};

/// What a scope returns around the closure's value `T`: `with_lock` the
/// value itself, `try_with_lock` `Some(value)`, or `None` when the lock was
/// held elsewhere.
#[derive(Clone, Copy)]
pub(crate) struct Ends<T, U> {
    /// The acquire failed: the scope's result, or the error to return.
    /// What a failed acquisition returns; the flag says whether the SDK
    /// undoes an outcome that may have been applied (its token was
    /// generated) or the caller recovers it (the caller's token).
    pub(crate) not_acquired: fn(Error, bool) -> Result<U, Error>,
    /// The closure ran and returned `T`.
    pub(crate) ran: fn(T) -> U,
}

impl<T> Ends<T, T> {
    /// `with_lock`: every failure to acquire is an error.
    pub(crate) fn with_lock() -> Self {
        Ends {
            not_acquired: |err, _| Err(err),
            ran: std::convert::identity,
        }
    }
}

impl<T> Ends<T, Option<T>> {
    /// `try_with_lock`: a lock held elsewhere is `None`.
    pub(crate) fn try_with_lock() -> Self {
        Ends {
            // A 409 after a try that may have been applied is held
            // elsewhere too, unless the caller owns the token: then the
            // caller must know, to recover the lease with it.
            not_acquired: |err, undone| {
                if err.is_lock_held() && (undone || !err.may_have_applied()) {
                    Ok(None)
                } else {
                    Err(err)
                }
            },
            ran: Some,
        }
    }
}

/// How a scope over one key holds its lock besides the acquisition's
/// options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct How {
    /// Stop the closure once the lock is lost.
    pub(crate) cancel_on_loss: bool,
    /// Keep the lock at least this long after it was acquired.
    pub(crate) min_hold: Option<Duration>,
}

/// A closure's scope over one key, as one future in its span (acquire,
/// renewals, release and the closure all log in a `volcano.with_lock`
/// span under the caller's). Built here rather than in an `async fn`
/// taking the builder: a wrapper would keep a second copy of `f` alive
/// beside the scope's state for as long as the lock is held.
pub(crate) fn with_lock<'f, F, Fut, T, U, E>(
    spec: Spec,
    how: How,
    f: F,
    into_err: fn(Error) -> E,
    ends: Ends<T, U>,
) -> tracing::instrument::Instrumented<impl Future<Output = Result<U, E>> + Send + 'f>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    U: Send + 'f,
    E: Send + 'f,
{
    let span = tracing::info_span!(
        "volcano.with_lock",
        key = %spec.key,
        fencing_token = tracing::field::Empty
    );
    let undone = !matches!(spec.owner, super::Owner::Caller(_));
    let mut spec = spec;
    spec.min_hold = how.min_hold;
    let acquire: crate::BoxFuture<crate::error::Result<crate::locks::HeldLock>> =
        Box::pin(super::hold::hold(spec, Some(span.clone())));
    scoped(acquire, undone, how, f, into_err, ends).instrument(span)
}

/// A closure's scope over a lock `acquire` takes (a semaphore's permit),
/// as [`with_lock`] runs it, in `span`. Its token is the SDK's.
pub(crate) fn with_held<'f, F, Fut, T, U, E>(
    acquire: crate::BoxFuture<crate::error::Result<crate::locks::HeldLock>>,
    span: tracing::Span,
    how: How,
    f: F,
    into_err: fn(Error) -> E,
    ends: Ends<T, U>,
) -> tracing::instrument::Instrumented<impl Future<Output = Result<U, E>> + Send + 'f>
where
    F: FnOnce(LockGuard) -> Fut + Send + 'f,
    Fut: Future<Output = Result<T, E>> + Send + 'f,
    T: Send + 'f,
    U: Send + 'f,
    E: Send + 'f,
{
    scoped(acquire, true, how, f, into_err, ends).instrument(span)
}

async fn scoped<F, Fut, T, U, E>(
    acquire: crate::BoxFuture<crate::error::Result<crate::locks::HeldLock>>,
    undone: bool,
    how: How,
    f: F,
    into_err: fn(Error) -> E,
    ends: Ends<T, U>,
) -> Result<U, E>
where
    F: FnOnce(LockGuard) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    // Dropping this future from here on drops `held`, which stops the
    // renewal and hands the release to the client.
    let held = match acquire.await {
        Ok(held) => held,
        Err(err) => return (ends.not_acquired)(err, undone).map_err(into_err),
    };
    let guard = LockGuard::clone(&held);
    let cancel_on_loss = how.cancel_on_loss;
    let outcome = CatchUnwind(Box::pin(async move {
        let lost_guard = guard.clone();
        let work = f(guard);
        if cancel_on_loss {
            tokio::select! {
                biased;
                result = work => result,
                loss = lost_guard.state.wait_lost() => Err(into_err(Error::LockLost(loss))),
            }
        } else {
            work.await
        }
    }))
    .await;
    // The work is done (a panic is not held back): a minimum not passed
    // yet is kept by the service, else the lease is released.
    let (loss, released) = if outcome.is_ok() {
        Box::pin(held.finish()).await
    } else {
        Box::pin(held.finish_now()).await
    };
    outcome_of(outcome, loss, released, into_err).map(ends.ran)
}

/// `with_locks`: the keys held as `hold_all` holds them, the closure run
/// with the [`LockSet`], every key let go of on every exit.
pub(crate) async fn with_locks<F, Fut, T, E>(
    locks: Locks,
    keys: Vec<String>,
    ttl: Duration,
    options: AcquireOptions,
    f: F,
) -> Result<T, E>
where
    F: FnOnce(LockSet) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    let held = super::set::hold_all(locks, keys, ttl, options)
        .await
        .map_err(E::from)?;
    let outcome = CatchUnwind(Box::pin(f(held.set()))).await;
    let (loss, released) = held.finish().await;
    outcome_of(outcome, loss, released, E::from)
}

/// A scope's result, once its lease was let go: a panic in the closure
/// goes on; the closure's error wins; else the loss; else the release's
/// error; else the value.
fn outcome_of<T, E>(
    ran: Result<Result<T, E>, Box<dyn Any + Send>>,
    loss: Option<crate::LockLost>,
    released: crate::error::Result<()>,
    into_err: impl FnOnce(Error) -> E,
) -> Result<T, E> {
    match ran {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(Err(err)) => Err(err),
        Ok(Ok(value)) => match (loss, released) {
            (Some(lost), _) => Err(into_err(Error::LockLost(lost))),
            (None, Err(err)) => Err(into_err(err)),
            (None, Ok(())) => Ok(value),
        },
    }
}

/// Runs a future, turning a panic in it into a value so that the lease can
/// be released before the panic continues.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.get_mut().0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
