//! The one mutex idiom every structure of the server uses: lock, and carry
//! on through a poisoned lock. The lowest floor: it imports nothing of the
//! crate.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, carrying on with its data if a holder panicked: every
/// structure guarded here stays consistent between statements, so a panic
/// elsewhere must not take the whole server down with it.
pub(crate) fn lock_unpoisoned<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
