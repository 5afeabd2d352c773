//! The fence rule in memory, for resources inside one process.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use tokio::sync::{Mutex as Turn, OwnedMutexGuard};

use crate::error::Error;
use crate::resource::check_resource;

/// The fence rule in memory: a resource accepts a fence that is not lower
/// than the highest it has seen, and refuses a lower one. For resources
/// inside one process (a file, a cache, a test double); clones share their
/// state.
///
/// The check and the write must be one step, or a holder whose check
/// passed can still write after a newer holder did. [`Gate::write`] runs a
/// synchronous write inside the check; [`Gate::enter`] holds the resource
/// across an asynchronous one. [`Gate::check`] alone guards nothing that
/// comes after it.
///
/// ```
/// let gate = volcano_fence::Gate::new();
/// let mut report = String::new();
/// gate.write("nightly-report", 7, || report.push_str("by 7"))?;
/// gate.write("nightly-report", 7, || report.push_str(", again"))?; // the same holder
/// let stale = gate.write("nightly-report", 6, || report.clear()).unwrap_err();
/// assert!(stale.is_stale());
/// assert_eq!(stale.highest_seen(), Some(7));
/// assert_eq!(report, "by 7, again");
/// # Ok::<(), volcano_fence::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Gate {
    inner: Arc<Mutex<Resources>>,
}

#[derive(Default)]
struct Resources {
    highest: HashMap<String, i64>,
    /// Held while a resource's fence is checked and its write runs.
    turns: HashMap<String, Arc<Turn<()>>>,
}

/// A resource of a [`Gate`] held by a fence that passed ([`Gate::enter`]):
/// until it is dropped, every other check of that resource waits, so the
/// write made while holding it lands before any later holder's.
#[must_use = "the resource is held only while this lives: write, then drop it"]
pub struct Entered {
    _turn: OwnedMutexGuard<()>,
}

impl fmt::Debug for Entered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Entered")
    }
}

impl Gate {
    /// A gate that has seen no fence.
    pub fn new() -> Self {
        Gate::default()
    }

    /// Checks `fence` as [`Gate::check`] does and, if it passes, runs
    /// `write` before any other check of `resource` can pass: accepted
    /// writes of a resource happen in fence order. A stale fence is an
    /// [`Error`] and `write` does not run. `write` must not use this gate
    /// for the same resource. This waits (blocking the thread) while an
    /// [`Entered`] of the resource is held: in async code use
    /// [`Gate::enter`].
    pub fn write<T>(
        &self,
        resource: &str,
        fence: i64,
        write: impl FnOnce() -> T,
    ) -> Result<T, Error> {
        check_resource(resource)?;
        let turn = self.turn(resource);
        let _held = match turn.clone().try_lock_owned() {
            Ok(held) => held,
            Err(_) => block_on(turn.lock_owned()),
        };
        self.record(resource, fence)?;
        Ok(write())
    }

    /// The async form of [`Gate::write`]: waits for the resource, checks
    /// `fence` and, when it passes, holds the resource until the returned
    /// [`Entered`] is dropped. Write while holding it; do not use the gate
    /// for the same resource until it is dropped (that would wait for
    /// ever).
    ///
    /// ```
    /// # async fn demo(gate: volcano_fence::Gate, fence: i64) -> Result<(), volcano_fence::Error> {
    /// let entered = gate.enter("nightly-report", fence).await?;
    /// // ... the write, awaited here ...
    /// drop(entered);
    /// # Ok(()) }
    /// ```
    pub async fn enter(&self, resource: &str, fence: i64) -> Result<Entered, Error> {
        check_resource(resource)?;
        let turn = self.turn(resource).lock_owned().await;
        self.record(resource, fence)?;
        Ok(Entered { _turn: turn })
    }

    /// Records `fence` for `resource` unless a higher one was seen; a lower
    /// one is a stale [`Error`] and records nothing. It guards no write
    /// made after it returns: another holder's check may pass in between,
    /// and the two writes land out of fence order. Use [`Gate::write`] or
    /// [`Gate::enter`] for that. Like [`Gate::write`], it waits (blocking
    /// the thread) while an [`Entered`] of the resource is held: never
    /// call it for a resource this task holds.
    pub fn check(&self, resource: &str, fence: i64) -> Result<(), Error> {
        self.write(resource, fence, || ())
    }

    /// The highest fence seen for `resource`.
    pub fn highest_seen(&self, resource: &str) -> Option<i64> {
        self.lock().highest.get(resource).copied()
    }

    fn turn(&self, resource: &str) -> Arc<Turn<()>> {
        let mut resources = self.lock();
        if let Some(turn) = resources.turns.get(resource) {
            return turn.clone();
        }
        let turn = Arc::new(Turn::new(()));
        resources.turns.insert(resource.to_owned(), turn.clone());
        turn
    }

    fn record(&self, resource: &str, fence: i64) -> Result<(), Error> {
        let mut resources = self.lock();
        match resources.highest.get_mut(resource) {
            Some(seen) if fence < *seen => return Err(Error::stale(resource, fence, Some(*seen))),
            Some(seen) => *seen = fence,
            None => {
                resources.highest.insert(resource.to_owned(), fence);
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Resources> {
        // Nothing panics while it is held; a panic in a `write` closure
        // happens outside it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `future` to completion on this thread (for the synchronous
/// [`Gate::write`] waiting for an async holder of its resource).
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("resources", &self.lock().highest.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_passes_lower_is_stale_and_records_nothing() {
        let gate = Gate::new();
        gate.check("r", 5).unwrap();
        gate.check("r", 5).unwrap();
        let err = gate.check("r", 4).unwrap_err();
        assert!(err.is_stale() && !err.is_retryable());
        assert_eq!(err.highest_seen(), Some(5));
        assert_eq!(gate.highest_seen("r"), Some(5));
        gate.check("r", i64::MAX).unwrap();
        assert_eq!(
            gate.check("r", i64::MAX - 1).unwrap_err().highest_seen(),
            Some(i64::MAX)
        );
        // Resources are independent.
        gate.check("other", i64::MIN).unwrap();
    }

    #[test]
    fn a_refused_write_does_not_run() {
        let gate = Gate::new();
        let mut wrote = Vec::new();
        gate.write("r", 2, || wrote.push(2)).unwrap();
        assert!(gate.write("r", 1, || wrote.push(1)).is_err());
        assert_eq!(wrote, [2]);
    }

    #[tokio::test]
    async fn an_entered_resource_holds_later_checks_until_it_is_dropped() {
        let gate = Gate::new();
        let entered = gate.enter("r", 5).await.unwrap();
        // Another resource is independent.
        gate.check("other", 1).unwrap();
        let later = tokio::spawn({
            let gate = gate.clone();
            async move { gate.enter("r", 6).await.map(drop) }
        });
        // The same fence for both, so that either may go first.
        let sync_later = std::thread::spawn({
            let gate = gate.clone();
            move || gate.write("r", 6, || 6)
        });
        // On this current-thread runtime the spawned task runs here, and
        // waits: the resource is held.
        tokio::task::yield_now().await;
        assert!(!later.is_finished());
        assert_eq!(gate.highest_seen("r"), Some(5));
        drop(entered);
        later.await.unwrap().unwrap();
        assert_eq!(sync_later.join().unwrap().unwrap(), 6);
        let stale = gate.enter("r", 5).await.unwrap_err();
        assert_eq!(stale.highest_seen(), Some(6));
        // A refused enter holds nothing.
        gate.check("r", 6).unwrap();
    }

    #[test]
    fn bad_names_get_a_clear_error() {
        let gate = Gate::new();
        for (name, says) in [("", "empty"), ("a\0b", "NUL")] {
            let err = gate.check(name, 1).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
            assert!(!err.is_stale());
        }
        let long = "é".repeat(1025);
        assert!(gate
            .check(&long, 1)
            .unwrap_err()
            .to_string()
            .contains("2048"));
        gate.check(&"é".repeat(1024), 1).unwrap();
    }
}
