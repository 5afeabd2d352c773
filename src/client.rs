//! `Client`: the handle every lock call goes through, shared by its clones
//! (transport, lease clock, background releases). Building one is in
//! `builder.rs`; its lock API in `locks/`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::clock::LeaseClock;
use crate::transport::Transport;

/// The production API URL.
pub const DEFAULT_API_URL: &str = "https://api.volcano.dev";
/// Default per-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment variable holding the anon key.
pub const ENV_ANON_KEY: &str = "VOLCANO_ANON_KEY";
/// Environment variable holding the service-role key.
pub const ENV_SERVICE_KEY: &str = "VOLCANO_SERVICE_KEY";
/// Environment variable holding the API URL.
pub const ENV_API_URL: &str = "VOLCANO_API_URL";

/// A Volcano API client. Build once, clone freely: clones share one
/// connection pool and configuration.
///
/// ```no_run
/// # fn main() -> Result<(), volcano::Error> {
/// let client = volcano::Client::builder()
///     .anon_key("anon-key")
///     .service_key("service-key")
///     .build()?;
/// let locks = client.locks();
/// # let _ = locks; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    lease_clock: LeaseClock,
    /// Renewal tasks alive right now (one per running scoped lock).
    renewals: Arc<AtomicUsize>,
    /// Releases running in the background, for `shutdown`.
    background: Arc<Background>,
    /// Waiters on each key, taking turns.
    turns: Arc<crate::locks::engine::turns::Turns>,
    /// Until when the project's quota is spent, for this client's
    /// observers (a 429 one of them got).
    quota: crate::locks::engine::observe::Quota,
    /// What this client remembers of its semaphores' permits, and their
    /// waiters' turns.
    semaphores: crate::locks::engine::semaphore::Semaphores,
    /// This client's own starting point among a semaphore's permits, so
    /// that clients start on different ones.
    spread: u64,
    /// Kept for the other Volcano APIs; lock calls never send it.
    anon_key: Option<String>,
}

impl Client {
    /// The API URL requests go to (without a trailing `/`).
    pub fn api_url(&self) -> &str {
        self.inner.transport.base_url()
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.transport.timeout()
    }

    /// True when the API URL is plain `http://` to a host off loopback
    /// (allowed only with
    /// [`allow_insecure_http`](crate::ClientBuilder::allow_insecure_http)):
    /// the service key then crosses the network in clear text. `localhost`
    /// (also `localhost.`), `127.0.0.0/8`, `::1` and `::ffff:127.0.0.1`
    /// are loopback; this is the same decision `build()` made.
    ///
    /// ```no_run
    /// # fn demo(client: volcano::Client) {
    /// if client.sends_key_in_clear() {
    ///     eprintln!("warning: the service key goes to {} unencrypted", client.api_url());
    /// }
    /// # }
    /// ```
    pub fn sends_key_in_clear(&self) -> bool {
        self.inner.transport.in_clear()
    }

    /// How many scoped-lock renewal tasks of this client are alive right
    /// now: one per running `with_lock`, zero once they have all ended.
    ///
    /// ```no_run
    /// # fn demo(client: volcano::Client) {
    /// println!("{} locks renewing", client.active_renewals());
    /// # }
    /// ```
    pub fn active_renewals(&self) -> usize {
        self.inner.renewals.load(Ordering::SeqCst)
    }

    /// Waits, up to `timeout`, for every release this client has handed to
    /// the background: leases of dropped guards and cancelled `with_lock`
    /// scopes, and acquires whose outcome was unknown and are being undone.
    /// Returns the keys that may still be held by a lease this client let
    /// go of (empty when every such lease is known to be free): releases
    /// that had not finished by then, and releases that ended without
    /// freeing a lease that may still be live (refused, say with `403`
    /// after a rotated key, or dropped with a runtime that was shutting
    /// down). It only waits: the client stays usable, and a timeout of
    /// `Duration::MAX` waits as long as it takes.
    ///
    /// An acquire being undone runs until no try of it can land any more:
    /// its request timeout plus [`LATE_TRY_MARGIN`](crate::LATE_TRY_MARGIN)
    /// after the try's outcome became unknown (a try may be applied after
    /// its client gave up on it). Until then its key is named; to end
    /// empty after such a fault, give `shutdown` that long. A try applied
    /// later still is beyond what a client can bound, and no report can
    /// name it.
    ///
    /// Call it before a process exits (on SIGTERM, at the end of `main`):
    /// a release still running when the runtime stops is lost, and the next
    /// worker then waits out the lease's ttl.
    ///
    /// ```no_run
    /// # async fn demo(client: volcano::Client) {
    /// use std::time::Duration;
    /// let unfinished = client.shutdown(Duration::from_secs(5)).await;
    /// if !unfinished.is_empty() {
    ///     eprintln!("releases still running for {unfinished:?}");
    /// }
    /// # }
    /// ```
    pub async fn shutdown(&self, timeout: Duration) -> Vec<String> {
        self.background().wait_idle(timeout).await
    }

    /// A client over `transport`.
    pub(crate) fn new(
        transport: Transport,
        anon_key: Option<String>,
        lease_clock: LeaseClock,
    ) -> Client {
        Client {
            inner: Arc::new(Inner {
                transport,
                anon_key,
                lease_clock,
                renewals: Arc::new(AtomicUsize::new(0)),
                background: Arc::default(),
                turns: Arc::default(),
                quota: Default::default(),
                semaphores: Default::default(),
                spread: (crate::random::unit() * u32::MAX as f64) as u64,
            }),
        }
    }

    /// The releases it runs in the background.
    pub(crate) fn background(&self) -> &Arc<Background> {
        &self.inner.background
    }

    /// The lines of waiters, by key.
    pub(crate) fn turns(&self) -> &Arc<crate::locks::engine::turns::Turns> {
        &self.inner.turns
    }

    pub(crate) fn quota(&self) -> &crate::locks::engine::observe::Quota {
        &self.inner.quota
    }

    pub(crate) fn semaphores(&self) -> &crate::locks::engine::semaphore::Semaphores {
        &self.inner.semaphores
    }

    /// This client's starting point among a semaphore's permits.
    pub(crate) fn spread(&self) -> u64 {
        self.inner.spread
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    pub(crate) fn lease_clock(&self) -> &LeaseClock {
        &self.inner.lease_clock
    }

    pub(crate) fn renewal_counter(&self) -> &Arc<AtomicUsize> {
        &self.inner.renewals
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let transport = &self.inner.transport;
        f.debug_struct("Client")
            .field("api_url", &transport.base_url())
            .field("timeout", &transport.timeout())
            .field(
                "anon_key",
                &self.inner.anon_key.as_ref().map(|_| "[redacted]"),
            )
            .field("service_key", &"[redacted]")
            .finish()
    }
}
