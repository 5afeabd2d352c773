//! Scoped locks: `with_lock`, [`LockGuard`], and the renewal task.
//!
//! The guard keeps its own deadline on the lease clock, measured from just
//! before each acquire or renew was sent: the server cannot have started the
//! lease earlier, so the local deadline never falls after the server's
//! expiry.
//!
//! How long a lease lasts is the lesser of the ttl asked for and what the
//! server says it granted. The server may grant less (the 90-day cap of the
//! original acquisition, which a recovering `.token(T)` cannot see). That
//! grant is measured on the server's clock alone, `expires_at` minus the
//! answer's `Date` less a second for `Date`'s rounding, and applied from
//! the local send time; the server's clock is never compared with this
//! machine's, so skew between them cannot lengthen the deadline.
//!
//! One concept a file: [`state`] (the deadline and the lost-ownership
//! signal), [`renewal`] (the background renewal task), [`handle`] (the
//! [`LockGuard`] a closure gets), [`held`] (`hold` and [`HeldLock`], which
//! own the renewal and the duty to release), [`with_lock`] (a closure run
//! while a `HeldLock` is held), [`set`] (several keys, all or nothing) and
//! [`leader`] (terms run while elected).

mod handle;
mod held;
mod leader;
mod renewal;
mod set;
mod state;
mod with_lock;

pub use handle::LockGuard;
pub use held::{HeldLock, Hold};
pub use leader::Leader;
pub use set::{HeldLocks, HoldAll, LockSet, WithLocks};
pub use with_lock::{TryWithLock, WithLock};
