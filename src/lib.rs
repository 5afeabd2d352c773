//! # volcano — Rust SDK for Volcano project locks
//!
//! Volcano's lock service hands out **leases** so that one worker at a time
//! runs a job ("nightly report", "schema migration"). A lease is a key, an
//! ownership token, an expiry and a **fencing token** that rises every time
//! the lock changes hands. This crate is a wire-compatible client for the
//! service, modeled on the Volcano Ruby SDK.
//!
//! ## Which API for which job
//!
//! | the job | the API | guide |
//! |---|---|---|
//! | a cron or periodic job on several hosts, once per period | [`Locks::try_with_lock`] + `min_hold` (or `volcano locks run --min-hold`) | [jobs](crate::guide::jobs#schedulers-and-cron) |
//! | run a job under a lock and always release it | [`Locks::with_lock`] | [jobs](crate::guide::jobs#scoped-locks-with_lock) |
//! | a value or struct that keeps a lock | [`Locks::hold`] ([`HeldLock`]) | [jobs](crate::guide::jobs#holding-a-lock-for-a-long-time-hold) |
//! | a singleton service: one replica leads | [`Locks::leader`] | [leader](crate::guide::leader) |
//! | several keys at once | [`Locks::with_locks`], [`Locks::hold_all`] | [jobs](crate::guide::jobs#several-keys-at-once-hold_all-with_locks) |
//! | at most N at once | [`Locks::semaphore`] | [semaphore](crate::guide::semaphore) |
//! | watch a key for dashboards and alerts | [`Locks::observe`] | [observe](crate::guide::observe) |
//! | any command or script, in any language | `volcano locks run` (feature `cli`) | [CLI](crate::guide::cli) |
//! | each job of an apalis worker, or each call of an axum route, under a lock or a permit | `volcano::tower` (feature `tower`) | [tower layers](crate::guide::tower) |
//! | tests of your own code | `volcano::mock` (feature `mock`) | the `mock` module's page |
//! | the store side of fencing | the `volcano-fence` crate | [fencing](crate::guide::fencing) |
//!
//! The single requests ([`Locks::acquire`], `renew`, `get`, `release`,
//! `force_release`) give full control. Each call returns a builder:
//! `.await` it, or call `.send()` for a future to spawn.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), volcano::Error> {
//! // VOLCANO_SERVICE_KEY (required), VOLCANO_API_URL (default
//! // https://api.volcano.dev), VOLCANO_ANON_KEY (optional)
//! let client = volcano::Client::from_env()?;
//! let ran = client
//!     .locks()
//!     .try_with_lock("nightly-report", Duration::from_secs(60), |guard| async move {
//!         let fence = guard.lease().fencing_token();
//!         // ... run the job, passing `fence` to the store; check
//!         // `guard.is_lost()` before each side effect ...
//!         Ok::<_, volcano::Error>(fence)
//!     })
//!     .min_hold(Duration::from_secs(60)) // hosts firing a little later skip too
//!     .await?;
//! if ran.is_none() {
//!     println!("another worker holds the lock; skipped this run");
//! }
//! // Releases still owed (a cancelled job's, say) before the process exits.
//! let unfinished = client.shutdown(Duration::from_secs(5)).await;
//! # let _ = unfinished; Ok(()) }
//! ```
//!
//! ## Features
//!
//! `volcano = { version = "0.1", features = [..] }`:
//!
//! - `tls-aws-lc-rs` (default) or `tls-ring`: rustls's crypto provider
//!   (take `tls-ring` with `default-features = false`, or both are
//!   compiled in). Certificates are checked against the OS trust store and
//!   the standard proxy variables are honoured: [TLS and HTTP](crate::guide::tls_http).
//! - `mock`: `volcano::mock`, the in-process mock server (its page is the
//!   testing guide), and `Client::for_mock`. Under `[dev-dependencies]`.
//! - `metrics`: counters, histograms and gauges through the `metrics`
//!   facade: [names and labels](crate::guide::observability#metrics).
//! - `cli`: the `volcano` admin command (`cargo install volcano --features
//!   cli`): [its guide and exit codes](crate::guide::cli).
//! - `tower`: `volcano::tower`, locks and permits as tower 0.5 layers
//!   ([`LockLayer`](crate::tower::LockLayer),
//!   [`PermitLayer`](crate::tower::PermitLayer)): [guide](crate::guide::tower).
//!
//! ## Guides
//!
//! [Jobs](crate::guide::jobs), [leader election](crate::guide::leader),
//! [semaphores](crate::guide::semaphore), [observing a key](crate::guide::observe),
//! [TTLs and clocks](crate::guide::ttl_and_clocks), [fencing](crate::guide::fencing),
//! [uncertain outcomes, `shutdown`, retries and errors](crate::guide::outcomes),
//! [waiting and the quota](crate::guide::waiting), [the CLI](crate::guide::cli), [tower layers](crate::guide::tower),
//! [logs and metrics](crate::guide::observability), [TLS and HTTP](crate::guide::tls_http),
//! and testing (the `mock` module).
//!
//! What a lease cannot promise: a process can pause (GC, swap, suspend)
//! past its expiry and keep running. The service then hands the lock to
//! someone else. Only the protected resource can stop the stale holder, by
//! rejecting writes whose fencing token is lower than the highest it has
//! seen.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Whether the simulation planted this bug (`sabotaged!(NoUndo)`); always
/// false without feature `sim`.
macro_rules! sabotaged {
    ($which:ident) => {{
        #[cfg(feature = "sim")]
        let planted = $crate::sim::sabotaged($crate::sim::Sabotage::$which);
        #[cfg(not(feature = "sim"))]
        let planted = false;
        planted
    }};
}

mod background;
mod builder;
mod client;
mod clock;
mod error;
mod error_body;
pub mod guide;
mod http_client;
mod http_date;
mod lease;
mod locks;
mod ops;
mod random;
mod realtime;
mod retry;
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod sim;
mod telemetry;
mod transport;
mod validate;
mod wire;

pub use builder::ClientBuilder;
pub use client::{
    Client, DEFAULT_API_URL, DEFAULT_TIMEOUT, ENV_ANON_KEY, ENV_API_URL, ENV_SERVICE_KEY,
};
pub use clock::LeaseClock;
pub use error::{
    codes, ApiError, Error, InvalidReason, InvalidResponse, LockLost, LostReason, Result,
    TransportError,
};
pub use lease::{LockLease, LockState};
pub use locks::{
    Acquire, AcquireOptions, AcquirePermit, AtRisk, ChangeKind, ForceRelease, Get, HeldLock,
    HeldLocks, Hold, HoldAll, Leader, LeaderHealth, LeaderStatus, LockChange, LockGuard, LockSet,
    Locks, MinHold, Observe, Release, Renew, Semaphore, TryWithLock, TryWithPermit, WithLock,
    WithLocks, WithPermit, MAX_PERMITS,
};
pub use retry::{LATE_TRY_MARGIN, LONGEST_RENEWAL_INTERVAL};
pub use validate::{MAX_TTL, MIN_TTL};

/// The boxed future behind each builder's `.await`.
pub(crate) type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// Locks a mutex whose holder may have panicked: every mutex in the SDK
/// guards plain data that a panic cannot leave half-written.
pub(crate) fn lock_unpoisoned<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// The handles and the error cross tasks and threads: checked at compile time.
const _: () = {
    const fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<Error>();
    send_sync_static::<Client>();
    send_sync_static::<Locks>();
    send_sync_static::<LockGuard>();
    send_sync_static::<HeldLock>();
    send_sync_static::<HeldLocks>();
    send_sync_static::<LockSet>();
    send_sync_static::<LockLease>();
};

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

// The in-process mock of the lock service (the `volcano-mock-server`
// crate, re-exported), with the testing guide as its page.
#[cfg(feature = "mock")]
#[cfg_attr(docsrs, doc(cfg(feature = "mock")))]
pub mod mock {
    #![doc = include_str!(concat!(env!("OUT_DIR"), "/testing.md"))]
    #[doc(inline)]
    pub use volcano_mock_server::*;
}

/// Hooks for the micro-benchmarks (`cargo bench -p volcano --features bench --bench
/// micro`): the SDK's own decoders and request building, run on the real
/// operation types. Only the `bench` feature compiles them; not part of the
/// API and not covered by semver.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod __bench {
    use std::time::Duration;

    use crate::error::InvalidReason;
    use crate::lease::Fields;
    use crate::ops::{self, Operation};
    use crate::{Client, Error, LockLease, LockState};

    /// Decodes an acquire body as the SDK does.
    pub fn decode_lease(body: &[u8]) -> Result<LockLease, InvalidReason> {
        let fields = Fields::parse(body)?;
        let op = ops::Acquire {
            key: "key",
            token: "token",
            ttl_secs: 30,
        };
        op.decode(fields)
    }

    /// Decodes a get body as the SDK does.
    pub fn decode_state(body: &[u8]) -> Result<LockState, InvalidReason> {
        ops::Get { key: "key" }.decode(Fields::parse(body)?)
    }

    /// Validates and builds an acquire request as the SDK does, without
    /// sending it.
    pub fn build_acquire(
        client: &Client,
        key: &str,
        ttl: Duration,
        token: &str,
        request_id: &str,
    ) -> Result<reqwest::Request, Error> {
        let ttl_secs = crate::validate::ttl(ttl)?;
        crate::validate::key(key)?;
        crate::validate::uuid("token", token)?;
        crate::validate::uuid("request_id", request_id)?;
        let op = ops::Acquire {
            key,
            token,
            ttl_secs,
        };
        client.transport().build(&op, request_id, None)
    }
}
