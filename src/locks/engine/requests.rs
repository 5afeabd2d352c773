//! The single requests: renew, get, release and force release. Each
//! validates its arguments, builds its operation and sends it once; the
//! acquire's own path is in [`acquire`](super::acquire).

use std::time::Duration;

use super::wait::Window;
use super::Measured;
use crate::error::{Error, Result};
use crate::lease::{LockLease, LockState};
use crate::locks::{Locks, RequestOptions};
use crate::ops::{self, Operation};
use crate::transport::{Answer, Timing};
use crate::validate;

/// A timeout that is not zero, and the caller's request id (checked) or a
/// fresh one: nothing is sent otherwise.
pub(crate) fn checked(options: &RequestOptions) -> Result<String> {
    check_timeout(options)?;
    request_id(options)
}

pub(crate) fn check_timeout(options: &RequestOptions) -> Result<()> {
    match options.timeout {
        Some(t) if t.is_zero() => Err(Error::invalid("timeout must be greater than zero")),
        _ => Ok(()),
    }
}

pub(crate) fn request_id(options: &RequestOptions) -> Result<String> {
    match &options.request_id {
        Some(id) => validate::uuid("request_id", id).map(|()| id.clone()),
        None => Ok(validate::new_uuid()),
    }
}

/// Sends one operation; `window` bounds the tries of a waiting acquire.
pub(crate) async fn send<O: Operation>(
    locks: &Locks,
    op: &O,
    request_id: &str,
    timeout: Option<Duration>,
    window: Window,
) -> Result<Answer<O::Output>> {
    send_noting_retry(locks, op, request_id, timeout, window, None).await
}

/// [`send`], calling `on_retry` as acquire's retry goes out.
pub(crate) async fn send_noting_retry<O: Operation>(
    locks: &Locks,
    op: &O,
    request_id: &str,
    timeout: Option<Duration>,
    window: Window,
    on_retry: Option<&(dyn Fn() + Sync)>,
) -> Result<Answer<O::Output>> {
    let timing = Timing {
        timeout,
        send_by: window.send_by,
        answer_by: window.answer_by,
        on_retry,
    };
    let client = locks.client();
    // A 429 to any attempt of the client's requests tells its waiters and
    // observers to hold back until its window has passed (the transport
    // marks the client's quota spent).
    client
        .transport()
        .send(op, request_id, timing, client.quota())
        .await
}

/// Renews `lease` for `ttl`, with what a guard needs to time it.
pub(crate) async fn renew(
    locks: &Locks,
    lease: &LockLease,
    ttl: Duration,
    options: &RequestOptions,
) -> Result<Measured> {
    let ttl = validate::ttl(ttl)?;
    validate::key(lease.key())?;
    validate::uuid("token", lease.token())?;
    let request_id = checked(options)?;
    let clock = locks.client().lease_clock();
    let sent_at = clock.now();
    let op = ops::Renew {
        lease,
        ttl_secs: ttl,
    };
    let answer = send(locks, &op, &request_id, options.timeout, Window::default()).await?;
    Ok(Measured::new(answer.value, sent_at, answer.date, clock))
}

/// The state of `key`, and the answer's `Date` (the server's clock), from
/// which a waiter reads how long the holder has left without comparing
/// clocks.
pub(crate) async fn get(
    locks: &Locks,
    key: &str,
    options: &RequestOptions,
) -> Result<(LockState, Option<chrono::DateTime<chrono::Utc>>)> {
    validate::key(key)?;
    let request_id = checked(options)?;
    let op = ops::Get { key };
    let answer = send(locks, &op, &request_id, options.timeout, Window::default()).await?;
    Ok((answer.value.read_at_date(answer.date), answer.date))
}

/// Releases `lease`, once.
pub(crate) async fn release(
    locks: &Locks,
    lease: &LockLease,
    options: &RequestOptions,
) -> Result<()> {
    validate::key(lease.key())?;
    validate::uuid("token", lease.token())?;
    let request_id = checked(options)?;
    let op = ops::Release { lease };
    // Let go of (whatever this release's answer, even if its future is
    // dropped: a failed release is tried again or reported by its
    // caller); but a try of the acquire that granted it may still land:
    // release again once none can (`Client::shutdown` names the key until
    // then). Handed over before this release is sent, so that a release
    // slower than the window cannot outlive it.
    let background = locks.client().background();
    if let Some((land_by, ttl)) = background.take_late_window(lease.key(), lease.token()) {
        super::release::sweep(locks, lease.clone(), land_by, ttl);
    }
    send(locks, &op, &request_id, options.timeout, Window::default()).await?;
    locks.client().turns().freed(lease.key());
    locks.client().semaphores().freed(lease.key());
    tracing::debug!(
        key = lease.key(),
        fencing_token = lease.fencing_token(),
        request_id,
        "lock released"
    );
    Ok(())
}

/// Frees `key` whoever holds it.
pub(crate) async fn force_release(
    locks: &Locks,
    key: &str,
    options: &RequestOptions,
) -> Result<()> {
    validate::key(key)?;
    let request_id = checked(options)?;
    let op = ops::ForceRelease { key };
    send(locks, &op, &request_id, options.timeout, Window::default()).await?;
    locks.client().turns().freed(key);
    locks.client().semaphores().freed(key);
    tracing::info!(key = %key, request_id, "lock force-released");
    Ok(())
}
