//! # volcano-mock-server — a faithful, stateful Volcano lock service
//!
//! Not a canned-response stub: it keeps real leases and implements every
//! rule of the service (auth, validation, idempotent re-acquire, `lock_held`
//! versus `lock_ownership_lost`, renew only more than 1 s before expiry, the
//! 1 s takeover grace, fencing tokens that never go back, the 90-day cap,
//! an optional quota). Faults and a movable clock let you test what your
//! code does when the network or the service misbehaves.
//!
//! ```no_run
//! use std::time::Duration;
//! use volcano_mock_server::{Fault, MockServer, Operation};
//!
//! # async fn demo() {
//! let server = MockServer::start().await; // 127.0.0.1, random port
//! println!("{} with key {}", server.url(), server.service_key());
//! server.inject(Fault::status(503).on(Operation::Acquire).times(1));
//! // Apply the renewal at once, answer it 2 s later:
//! server.inject(Fault::delay_response(Duration::from_secs(2)).on(Operation::Renew).times(1));
//! server.advance(Duration::from_secs(31)); // expire leases without sleeping
//! for request in server.requests() {
//!     println!("{:?} {} -> {:?}", request.operation, request.key, request.status);
//! }
//! # }
//! ```
//!
//! Faults: [`Fault::status`] answers without applying, [`Fault::drop_response`]
//! applies and closes the connection unanswered, [`Fault::reset`] closes it
//! before applying, [`Fault::delay`] waits before applying, and
//! [`Fault::delay_response`] applies at once and then holds the answer,
//! [`Fault::garbled_response`] applies and answers with a body that is not
//! JSON, and [`Fault::gateway`] answers a 5xx after its patience while the
//! request goes on and is applied on its own time.
//! Every answer's `Date` header is read from the movable clock, as a real
//! server's is from its own.
//!
//! The same controls are served over HTTP under `/__mock/` (no credential):
//! `POST /__mock/faults` (a [`Fault`] as JSON, e.g.
//! `{"kind":"status","status":503,"operation":"acquire","times":1}` or
//! `{"kind":"delay_response","ms":1500,"operation":"renew","times":1}` or
//! `{"kind":"gateway","status":504,"patience_ms":400,"apply_after_ms":1500,"operation":"acquire","times":1}`;
//! 201; 400 for a status outside 200..=599 (a gateway's outside
//! 500..=599) or a key no lock request can have; 409 once [`MAX_FAULTS`]
//! are pending),
//! `DELETE /__mock/faults`, `POST /__mock/advance` (`{"seconds": 31}`; 400
//! for a negative or invalid number, or one past the clock's limit),
//! `GET /__mock/requests`, `GET /__mock/locks`, `POST /__mock/reset`.

// Inside, the files are floors, each importing only from those before it:
// `sync`, `clock`, `reject` → `state` → `fault` → `fault_store`,
// `journal`, `quota` → `shared` → `conn`, `request` → `builder`,
// `controls`, `lock_api` → `router` → this file.

mod builder;
mod clock;
mod conn;
mod controls;
mod fault;
mod fault_store;
mod journal;
mod lock_api;
mod quota;
mod reject;
mod request;
mod router;
mod shared;
mod state;
mod sync;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use builder::{MockServerBuilder, DEFAULT_ANON_KEY, DEFAULT_SERVICE_KEY};
pub use clock::ClockRangeError;
pub use conn::HEADER_READ_TIMEOUT;
pub use fault::{Fault, FaultKind, InvalidFault, Operation, MAX_FAULTS};
pub use journal::{RecordedRequest, MAX_JOURNAL};
pub use request::MAX_BODY;
pub use state::LockSnapshot;

use shared::Shared;

/// A running mock lock service for one project. Dropping it stops it and
/// closes every connection.
pub struct MockServer {
    addr: SocketAddr,
    url: String,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

impl MockServer {
    /// Starts a server on 127.0.0.1 and a free port, with the default keys
    /// and no quota. Ready when it returns.
    ///
    /// # Panics
    /// If no port can be bound on 127.0.0.1.
    pub async fn start() -> MockServer {
        MockServer::builder().start().await
    }

    /// Configures a server.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// # use volcano_mock_server::MockServer;
    /// let server = MockServer::builder()
    ///     .port(8000)
    ///     .service_key("my-service-key")
    ///     .rate_limit(600)
    ///     .start()
    ///     .await;
    /// # let _ = server; }
    /// ```
    pub fn builder() -> MockServerBuilder {
        MockServerBuilder::default()
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The service key the server accepts.
    pub fn service_key(&self) -> &str {
        &self.shared.config.service_key
    }

    /// The anon key the server knows (lock calls with it get 403).
    pub fn anon_key(&self) -> &str {
        &self.shared.config.anon_key
    }

    /// Moves the server clock forward: leases expire without sleeping.
    ///
    /// # Panics
    /// If the clock would pass the latest time it can show,
    /// 9000-01-01T00:00:00Z (the clock is left unchanged); use
    /// [`MockServer::try_advance`] to handle that.
    #[track_caller]
    pub fn advance(&self, by: Duration) {
        if let Err(err) = self.try_advance(by) {
            panic!("{err}");
        }
    }

    /// Moves the server clock forward and returns the time it moved to, or
    /// refuses, changing nothing, when that would pass the latest time it
    /// can show (9000-01-01T00:00:00Z). Advances are counted to the
    /// millisecond; concurrent ones add up, and the clock never goes back.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// use std::time::Duration;
    /// # use volcano_mock_server::MockServer;
    /// let server = MockServer::start().await;
    /// let now = server.try_advance(Duration::from_secs(31)).unwrap();
    /// assert!(server.try_advance(Duration::MAX).is_err());
    /// # let _ = now; }
    /// ```
    pub fn try_advance(
        &self,
        by: Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>, ClockRangeError> {
        self.shared.clock.try_advance(by)
    }

    /// The server's current time.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.shared.clock.now()
    }

    /// Adds a fault; faults apply in the order they were injected.
    ///
    /// # Panics
    ///
    /// When the fault is refused (see [`MockServer::try_inject`]): a status
    /// outside 200..=599 (a gateway's outside 500..=599), a key no lock
    /// request can have, `times(0)`, or
    /// [`MAX_FAULTS`] faults already pending. A test that injects such a
    /// fault would otherwise test nothing.
    pub fn inject(&self, fault: Fault) {
        if let Err(err) = self.try_inject(fault) {
            panic!("MockServer::inject: {err}");
        }
    }

    /// Adds a fault, or says why it cannot take effect; nothing is added
    /// then.
    ///
    /// ```
    /// # async fn demo() {
    /// # use volcano_mock_server::{Fault, InvalidFault, MockServer};
    /// let server = MockServer::start().await;
    /// let refused = server.try_inject(Fault::status(101));
    /// assert_eq!(refused, Err(InvalidFault::Status(101)));
    /// # }
    /// ```
    pub fn try_inject(&self, fault: Fault) -> Result<(), InvalidFault> {
        self.shared.faults.push(fault)
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// The journal of lock requests, oldest first (at most
    /// [`MAX_JOURNAL`] entries).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.journal.entries()
    }

    /// Waits up to `timeout` for a lock request of `operation` answered
    /// with `status` (as sent, or as it would have been sent when the
    /// answer was dropped on purpose), and returns its journal entry: the
    /// oldest such entry already in the journal, else the next one
    /// recorded. `None` if none came in time. To wait for a later one,
    /// [`MockServer::reset`] first, or look at `seq`.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// use std::time::Duration;
    /// # use volcano_mock_server::{Fault, MockServer, Operation};
    /// let server = MockServer::start().await;
    /// server.inject(Fault::status(409).on(Operation::Renew));
    /// // ... start the code under test, which holds a lock ...
    /// let rejected = server
    ///     .wait_for(Operation::Renew, 409, Duration::from_secs(10))
    ///     .await
    ///     .expect("a renewal was rejected");
    /// # let _ = rejected; }
    /// ```
    pub async fn wait_for(
        &self,
        operation: Operation,
        status: u16,
        timeout: Duration,
    ) -> Option<RecordedRequest> {
        let matching = |r: &RecordedRequest| r.operation == operation && r.status == Some(status);
        tokio::time::timeout(timeout, self.shared.journal.wait_for(matching))
            .await
            .ok()
    }

    /// Every lease the server still keeps (live, or lapsed within the
    /// grace), sorted by key.
    pub fn locks(&self) -> Vec<LockSnapshot> {
        self.shared.locks()
    }

    /// How many leases the server keeps in memory (live, or lapsed within
    /// the grace); expired ones are swept every second.
    pub fn lease_count(&self) -> usize {
        self.shared.store.len()
    }

    /// Forgets leases, faults, the journal and the quota window. The clock
    /// and fencing tokens keep rising.
    pub fn reset(&self) {
        self.shared.reset();
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl std::fmt::Debug for MockServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

// Starting lives here, on the top floor, rather than in builder.rs: it
// needs the router and the connection loop, which sit above the builder's
// configuration, and it makes a `MockServer`.
impl MockServerBuilder {
    /// Starts the server on the current tokio runtime.
    ///
    /// # Panics
    /// If the address cannot be bound; use [`MockServerBuilder::try_start`]
    /// to handle that.
    pub async fn start(self) -> MockServer {
        let addr = self.addr();
        match self.try_start().await {
            Ok(server) => server,
            Err(err) => panic!("volcano mock server could not listen on {addr}: {err}"),
        }
    }

    /// Starts the server, or says why it could not.
    pub async fn try_start(self) -> io::Result<MockServer> {
        let (addr, config) = self.into_config()?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let (shutdown, stop) = watch::channel(false);
        tokio::spawn(conn::serve(
            listener,
            router::Service::new(shared.clone()),
            shared.config.header_read_timeout,
            stop.clone(),
        ));
        tokio::spawn(conn::sweep(shared.clone(), stop));
        let url = match addr {
            SocketAddr::V6(v6) => format!("http://[{}]:{}", v6.ip(), v6.port()),
            SocketAddr::V4(v4) => format!("http://{v4}"),
        };
        Ok(MockServer {
            addr,
            url,
            shared,
            shutdown,
        })
    }
}

/// Hooks for the deterministic simulation (`volcano-sim`, feature `sim`):
/// a server without a listener of its own, on the runtime's (simulated)
/// clock. Not an API and not covered by semver.
#[cfg(feature = "sim")]
impl MockServerBuilder {
    /// Starts the server without binding: the caller accepts connections
    /// (on a simulated network) and hands each to
    /// [`MockServer::serve_connection`]. `addr` is the address clients are
    /// given; the clock reads `epoch` now and runs on the runtime's clock.
    /// Outside that runtime the clock cannot be read (tokio's clock there
    /// is the machine's): [`MockServer::locks`]' `live` and `held` are then
    /// wrong, so judge a snapshot taken from outside by its `expires_at`.
    #[doc(hidden)]
    pub fn start_detached(
        self,
        addr: SocketAddr,
        epoch: chrono::DateTime<chrono::Utc>,
    ) -> io::Result<MockServer> {
        let (_, config) = self.into_config()?;
        let shared = Arc::new(Shared::with_clock(config, clock::Clock::starting_at(epoch)));
        let (shutdown, stop) = watch::channel(false);
        tokio::spawn(conn::sweep(shared.clone(), stop));
        Ok(MockServer {
            addr,
            url: format!("http://{addr}"),
            shared,
            shutdown,
        })
    }
}

#[cfg(feature = "sim")]
impl MockServer {
    /// Serves one connection of a [`MockServerBuilder::start_detached`]
    /// server, until the client closes it, a fault drops it, or the server
    /// is dropped.
    #[doc(hidden)]
    pub fn serve_connection<S>(
        &self,
        stream: S,
    ) -> impl std::future::Future<Output = ()> + Send + 'static
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        conn::serve_connection(
            stream,
            router::Service::new(self.shared.clone()),
            self.shared.config.header_read_timeout,
            self.shutdown.subscribe(),
        )
    }
}
