//! [`MockServerBuilder`]: the address, the keys, the quota and the read
//! timeout of a [`MockServer`], and starting it: bind, then spawn the
//! connection loop and the sweep, both stopped when the server is dropped.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::conn::{self, HEADER_READ_TIMEOUT};
use crate::{request, MockServer, Shared};

/// Service key accepted unless another is configured.
pub const DEFAULT_SERVICE_KEY: &str = "volcano-mock-service-key";
/// Anon key recognised (and refused for locks with 403) unless another is
/// configured.
pub const DEFAULT_ANON_KEY: &str = "volcano-mock-anon-key";

const MAX_READ_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Server configuration, fixed when it starts.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) service_key: String,
    pub(crate) anon_key: String,
    pub(crate) rate_limit: Option<u32>,
    pub(crate) header_read_timeout: Duration,
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
        tokio::spawn(conn::serve(
            listener,
            request::router(shared.clone()),
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
