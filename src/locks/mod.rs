//! The lock API, in three layers that depend one way:
//!
//! - **the public API**: [`Locks`], with every constructor in `api.rs` and
//!   its two children (`api/held.rs`, `api/shared.rs`), the
//!   options of a call in one value ([`AcquireOptions`], `options`), and
//!   the builders (`builders/`), which only collect options and hand them
//!   to the engine when awaited;
//! - **the engine** (`engine/`, private): how a lease lives, from the
//!   acquire (its retry, its undo, waiting) through renewal to the release
//!   policy, for single locks, scopes, sets and leaders. It calls the wire
//!   layer directly and never constructs a public builder;
//! - **the handles** (`handles/`): what a caller holds, [`LockGuard`],
//!   [`HeldLock`], [`HeldLocks`] and [`LockSet`], which read the engine's
//!   state and call its ends.
//!
//! "What happens to the lease when a `HeldLock` is dropped?" is answered
//! in `engine/hold.rs` (and the release policy it names, in
//! `engine/release.rs`); "is a 502 on renew retried, and how long is the
//! back-off?" in `retry.rs`.

#[macro_use]
mod options;

mod api;
mod builders {
    pub(crate) mod hold;
    pub(crate) mod leader;
    pub(crate) mod requests;
    pub(crate) mod scope;
    pub(crate) mod semaphore;
}
pub(crate) mod engine;
mod handles {
    pub(crate) mod guard;
    pub(crate) mod held;
    pub(crate) mod observe;
    pub(crate) mod set;
}

pub use builders::hold::{Hold, HoldAll};
pub use builders::leader::{Leader, LeaderHealth, LeaderStatus};
pub use builders::requests::{Acquire, ForceRelease, Get, Release, Renew};
pub use builders::scope::{TryWithLock, WithLock, WithLocks};
pub use builders::semaphore::{AcquirePermit, Semaphore, TryWithPermit, WithPermit};

pub use engine::semaphore::MAX_PERMITS;
pub use handles::guard::{AtRisk, LockGuard};
pub use handles::held::{HeldLock, MinHold};
pub use handles::observe::{ChangeKind, LockChange, Observe};
pub use handles::set::{HeldLocks, LockSet};
pub use options::AcquireOptions;
pub(crate) use options::RequestOptions;

use crate::client::Client;

/// The lock API of a [`Client`]: cheap to clone, `Send + Sync + 'static`.
///
/// ```no_run
/// # async fn demo() -> Result<(), volcano::Error> {
/// use std::time::Duration;
/// let locks = volcano::Client::from_env()?.locks();
/// let lease = locks.acquire("nightly-report", Duration::from_secs(30)).await?;
/// let lease = locks.renew(&lease, Duration::from_secs(30)).await?;
/// locks.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Locks {
    client: Client,
}

impl Client {
    /// The lock API of this client.
    ///
    /// ```no_run
    /// # async fn demo(client: volcano::Client) -> Result<(), volcano::Error> {
    /// let state = client.locks().get("nightly-report").await?;
    /// println!("held: {}", state.held());
    /// # Ok(()) }
    /// ```
    pub fn locks(&self) -> Locks {
        Locks::new(self.clone())
    }
}

impl Locks {
    pub(crate) fn new(client: Client) -> Self {
        Locks { client }
    }

    /// The client this handle uses.
    pub fn client(&self) -> &Client {
        &self.client
    }
}
