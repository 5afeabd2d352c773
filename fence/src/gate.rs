//! The fence rule in memory, for resources inside one process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{check_resource, Error};

/// The fence rule in memory: a resource accepts a fence that is not lower
/// than the highest it has seen, and refuses a lower one. For resources
/// inside one process (a file, a cache, a test double); clones share their
/// state.
///
/// ```
/// let gate = volcano_fence::Gate::new();
/// gate.check("nightly-report", 7)?;
/// gate.check("nightly-report", 7)?; // the same holder, again
/// let stale = gate.check("nightly-report", 6).unwrap_err();
/// assert!(stale.is_stale());
/// assert_eq!(stale.highest_seen(), Some(7));
/// # Ok::<(), volcano_fence::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Gate {
    highest: Arc<Mutex<HashMap<String, i64>>>,
}

impl Gate {
    /// A gate that has seen no fence.
    pub fn new() -> Self {
        Gate::default()
    }

    /// Records `fence` for `resource` unless a higher one was seen; a lower
    /// one is a stale [`Error`] and records nothing.
    pub fn check(&self, resource: &str, fence: i64) -> Result<(), Error> {
        self.write(resource, fence, || ())
    }

    /// Checks `fence` as [`Gate::check`] does and, if it passes, runs
    /// `write` before any other check of any resource of this gate can
    /// pass: the check and the write are one step, so accepted writes
    /// happen in fence order. `write` must not use this gate.
    pub fn write<T>(
        &self,
        resource: &str,
        fence: i64,
        write: impl FnOnce() -> T,
    ) -> Result<T, Error> {
        check_resource(resource)?;
        let mut highest = self.lock();
        match highest.get_mut(resource) {
            Some(seen) if fence < *seen => return Err(Error::stale(resource, fence, *seen)),
            Some(seen) => *seen = fence,
            None => {
                highest.insert(resource.to_owned(), fence);
            }
        }
        Ok(write())
    }

    /// The highest fence seen for `resource`.
    pub fn highest_seen(&self, resource: &str) -> Option<i64> {
        self.lock().get(resource).copied()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        // A panic in a `write` closure leaves the map consistent: it is
        // only changed before the closure runs.
        self.highest.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("resources", &self.lock().len())
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
