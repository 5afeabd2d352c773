//! Several keys at once, all or nothing. The keys are deduplicated and
//! acquired one by one in one canonical order (sorted), so two callers
//! whose sets overlap never wait for each other in a cycle; any failure
//! lets go of every key already taken (an uncertain acquire is undone as
//! any other), so a set is held whole or not at all.

use std::time::Duration;

use tokio::time::Instant;

use super::Spec;
use crate::error::{Error, Result};
use crate::locks::{AcquireOptions, HeldLock, HeldLocks, Locks};
use crate::validate;

/// Holds every key of `keys` with `options`; `options.wait` is one
/// deadline for the whole set.
pub(crate) async fn hold_all(
    locks: Locks,
    mut keys: Vec<String>,
    ttl: Duration,
    options: AcquireOptions,
) -> Result<HeldLocks> {
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(Error::invalid("hold_all needs at least one key"));
    }
    // Nothing is sent when any argument is invalid.
    validate::ttl(ttl)?;
    for key in &keys {
        validate::key(key)?;
    }
    let deadline = options
        .wait
        .map(|timeout| Instant::now().checked_add(timeout));
    // Dropped with this future, each one hands its release to the client.
    let mut held: Vec<HeldLock> = Vec::with_capacity(keys.len());
    for key in keys {
        let mut one = Spec::new(&locks, key, ttl, options.clone());
        one.options.wait = deadline.map(|deadline| {
            deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            })
        });
        match super::hold::hold(one, None).await {
            Ok(lock) => held.push(lock),
            Err(err) => {
                release_all(held).await;
                return Err(err);
            }
        }
    }
    // A key taken early may have been lost while a later one was waited
    // for: the set is not whole, so it is not handed over.
    if let Some(lost) = held.iter().find_map(|lock| lock.failure()) {
        release_all(held).await;
        return Err(Error::LockLost(lost));
    }
    Ok(HeldLocks::new(held))
}

/// Releases the keys of a set that could not be completed. Their errors
/// are not lost: a release that did not free its lease goes on in the
/// background or is recorded for `Client::shutdown` (`release::let_go`).
async fn release_all(held: Vec<HeldLock>) {
    for lock in held.into_iter().rev() {
        let _ = lock.release().await;
    }
}
