//! [`MockServerBuilder`]: the address, the keys, the quota and the read
//! timeout of a `MockServer`, checked and turned into the [`Config`] it
//! starts with. Starting it (bind, then spawn the connection loop and the
//! sweep) is in lib.rs, the floor above the router, so this file stays
//! below it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::conn::HEADER_READ_TIMEOUT;
use crate::shared::Config;

/// Service key accepted unless another is configured.
pub const DEFAULT_SERVICE_KEY: &str = "volcano-mock-service-key";
/// Anon key recognised (and refused for locks with 403) unless another is
/// configured.
pub const DEFAULT_ANON_KEY: &str = "volcano-mock-anon-key";

const MAX_READ_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Configures a [`MockServer`](crate::MockServer); see
/// [`MockServer::builder`](crate::MockServer::builder).
#[derive(Clone)]
pub struct MockServerBuilder {
    addr: SocketAddr,
    service_key: String,
    anon_key: String,
    rate_limit: Option<u32>,
    header_read_timeout: Duration,
}

// The keys are a test's, yet printed as the SDK prints a real one: never.
impl std::fmt::Debug for MockServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockServerBuilder")
            .field("addr", &self.addr)
            .field("service_key", &"[redacted]")
            .field("anon_key", &"[redacted]")
            .field("rate_limit", &self.rate_limit)
            .field("header_read_timeout", &self.header_read_timeout)
            .finish()
    }
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

    /// The address to listen on, as configured.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address to listen on and the configuration to start with, or
    /// why the keys cannot serve: the service key must be non-empty and
    /// differ from the anon key.
    pub(crate) fn into_config(self) -> io::Result<(SocketAddr, Config)> {
        if self.service_key.is_empty() || self.service_key == self.anon_key {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the service key must be non-empty and differ from the anon key",
            ));
        }
        let config = Config {
            service_key: self.service_key,
            anon_key: self.anon_key,
            rate_limit: self.rate_limit,
            header_read_timeout: self.header_read_timeout,
        };
        Ok((self.addr, config))
    }
}
