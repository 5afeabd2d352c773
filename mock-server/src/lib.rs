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
//! [`Fault::delay_response`] applies at once and then holds the answer.
//! Every answer's `Date` header is read from the movable clock, as a real
//! server's is from its own.
//!
//! The same controls are served over HTTP under `/__mock/` (no credential):
//! `POST /__mock/faults` (a [`Fault`] as JSON, e.g.
//! `{"kind":"status","status":503,"operation":"acquire","times":1}` or
//! `{"kind":"delay_response","ms":1500,"operation":"renew","times":1}`),
//! `DELETE /__mock/faults`, `POST /__mock/advance` (`{"seconds": 31}`; 400
//! for a negative or invalid number, or one past the clock's limit),
//! `GET /__mock/requests`, `GET /__mock/locks`, `POST /__mock/reset`.
#![deny(missing_docs)]

mod clock;
mod fault;
mod server;
mod state;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use clock::ClockRangeError;
pub use fault::{Fault, FaultKind, Operation};
pub use server::{RecordedRequest, HEADER_READ_TIMEOUT, MAX_BODY, MAX_JOURNAL};
pub use state::LockSnapshot;

use server::{Config, Shared};

/// Service key accepted unless another is configured.
pub const DEFAULT_SERVICE_KEY: &str = "volcano-mock-service-key";
/// Anon key recognised (and refused for locks with 403) unless another is
/// configured.
pub const DEFAULT_ANON_KEY: &str = "volcano-mock-anon-key";

const MAX_READ_TIMEOUT: Duration = Duration::from_secs(86_400);

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
    /// let server = volcano_mock_server::MockServer::builder()
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
    /// let server = volcano_mock_server::MockServer::start().await;
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
    pub fn inject(&self, fault: Fault) {
        self.shared.faults.push(fault);
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// The journal of lock requests, oldest first (at most
    /// [`MAX_JOURNAL`] entries).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests()
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

/// Configures a [`MockServer`]; see [`MockServer::builder`].
#[derive(Debug, Clone)]
pub struct MockServerBuilder {
    addr: SocketAddr,
    service_key: String,
    anon_key: String,
    rate_limit: Option<u32>,
    header_read_timeout: Duration,
}

impl Default for MockServerBuilder {
    fn default() -> Self {
        MockServerBuilder {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            service_key: DEFAULT_SERVICE_KEY.to_owned(),
            anon_key: DEFAULT_ANON_KEY.to_owned(),
            rate_limit: None,
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

impl MockServerBuilder {
    /// Listen on this port of 127.0.0.1 (default: a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.addr.set_port(port);
        self
    }

    /// Listen on this address.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// The service key to accept.
    pub fn service_key(mut self, key: impl Into<String>) -> Self {
        self.service_key = key.into();
        self
    }

    /// The anon key to recognise (and refuse with 403).
    pub fn anon_key(mut self, key: impl Into<String>) -> Self {
        self.anon_key = key.into();
        self
    }

    /// Lock operations allowed per fixed one-minute window (the service
    /// allows 600); beyond it, 429 `lock_rate_limited` with `Retry-After`.
    pub fn rate_limit(mut self, per_minute: u32) -> Self {
        self.rate_limit = Some(per_minute);
        self
    }

    /// How long a client may take to send its request headers, and then its
    /// body (default 10 s each): slow or lying clients cannot pin
    /// connections forever. Anything over a day counts as a day.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        // hyper adds the timeout to an Instant, which panics on overflow.
        self.header_read_timeout = timeout.min(MAX_READ_TIMEOUT);
        self
    }

    /// Starts the server on the current tokio runtime.
    ///
    /// # Panics
    /// If the address cannot be bound; use [`MockServerBuilder::try_start`]
    /// to handle that.
    pub async fn start(self) -> MockServer {
        let addr = self.addr;
        match self.try_start().await {
            Ok(server) => server,
            Err(err) => panic!("volcano mock server could not listen on {addr}: {err}"),
        }
    }

    /// Starts the server, or says why it could not.
    pub async fn try_start(self) -> io::Result<MockServer> {
        if self.service_key.is_empty() || self.service_key == self.anon_key {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the service key must be non-empty and differ from the anon key",
            ));
        }
        let listener = TcpListener::bind(self.addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(Config {
            service_key: self.service_key,
            anon_key: self.anon_key,
            rate_limit: self.rate_limit,
            header_read_timeout: self.header_read_timeout,
        }));
        let (shutdown, stop) = watch::channel(false);
        tokio::spawn(server::serve(
            listener,
            server::router(shared.clone()),
            shared.config.header_read_timeout,
            stop.clone(),
        ));
        tokio::spawn(server::sweep(shared.clone(), stop));
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
