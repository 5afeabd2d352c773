//! Building a [`Client`]: [`ClientBuilder`], configuration from the
//! environment, and the rules for the API URL.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use reqwest::header::HeaderValue;

use crate::client::{
    Client, DEFAULT_API_URL, DEFAULT_TIMEOUT, ENV_ANON_KEY, ENV_API_URL, ENV_SERVICE_KEY,
};
use crate::clock::LeaseClock;
use crate::error::{Error, Result};
use crate::http_client::Route;
use crate::transport::Transport;

impl Client {
    /// Starts configuring a client.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// let client = volcano::Client::builder()
    ///     .anon_key("anon-key")
    ///     .service_key("service-key")
    ///     .api_url("https://api.volcano.dev")
    ///     .timeout(Duration::from_secs(10))
    ///     .build()?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Builds a client from `VOLCANO_SERVICE_KEY` (required),
    /// `VOLCANO_ANON_KEY` (optional) and `VOLCANO_API_URL` (default
    /// `https://api.volcano.dev`). Empty variables count as unset.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), volcano::Error> {
    /// let client = volcano::Client::from_env()?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn from_env() -> Result<Client> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// A client for an in-process [`mock`](crate::mock) server, with its
    /// URL and keys and the default settings (feature `mock`). For other
    /// settings (a [`LeaseClock`], a timeout), start from
    /// [`Client::builder`] with `server.url()` and `server.service_key()`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), volcano::Error> {
    /// use std::time::Duration;
    /// use volcano::mock::{Fault, MockServer, Operation};
    /// let server = MockServer::start().await;
    /// let client = volcano::Client::for_mock(&server);
    /// server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    /// let lease = client.locks().acquire("job", Duration::from_secs(30)).await?; // retried once
    /// # let _ = lease; Ok(()) }
    /// ```
    #[cfg(feature = "mock")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mock")))]
    pub fn for_mock(server: &crate::mock::MockServer) -> Client {
        Client::builder()
            .api_url(server.url())
            .service_key(server.service_key())
            .anon_key(server.anon_key())
            .build()
            .expect("a mock server's URL and keys are valid")
    }

    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Client> {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let mut builder = Client::builder();
        match get(ENV_SERVICE_KEY) {
            Some(key) => builder = builder.service_key(key),
            None => {
                return Err(Error::invalid(format!(
                    "{ENV_SERVICE_KEY} is not set: lock calls need the service-role key"
                )))
            }
        }
        if let Some(anon) = get(ENV_ANON_KEY) {
            builder = builder.anon_key(anon);
        }
        if let Some(url) = get(ENV_API_URL) {
            builder = builder.api_url(url);
        }
        builder.build()
    }
}

/// Configures a [`Client`]; see [`Client::builder`].
#[derive(Clone, Default)]
pub struct ClientBuilder {
    anon_key: Option<String>,
    service_key: Option<String>,
    api_url: Option<String>,
    timeout: Option<Duration>,
    allow_insecure_http: bool,
    lease_clock: Option<LeaseClock>,
    http_client: Option<reqwest::Client>,
}

impl ClientBuilder {
    /// Sends requests with your own `reqwest::Client`: extra TLS roots,
    /// client certificates, a proxy set in code, your connection pool. (The
    /// SDK's own client already trusts the OS trust store and takes proxies
    /// from `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY` and, on
    /// macOS and Windows, the system settings, except for a service on
    /// loopback, which it always reaches directly. Your client does what
    /// you configured: `reqwest::Client::new()` sends even
    /// `http://127.0.0.1` through `HTTP_PROXY`; add `.no_proxy()` for a
    /// local service.)
    ///
    /// With the `tls-ring` feature alone, reqwest is built without a crypto
    /// provider of its own: install one before building your client
    /// (`rustls::crypto::ring::default_provider().install_default()`).
    ///
    /// What the SDK still does on every request, whatever the client: the
    /// `Authorization` header with the service key, the request id, `Accept`
    /// and `Content-Type`, and the per-request timeout ([`Self::timeout`];
    /// the client's own timeout is not used). Redirects: the SDK's own
    /// client follows none; yours follows its policy, and reqwest drops
    /// `Authorization` on a redirect to another host, so the service key
    /// never goes there. A redirect answered by the lock service itself is
    /// not part of the protocol: prefer `redirect::Policy::none()`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let http = reqwest::Client::builder()
    ///     .redirect(reqwest::redirect::Policy::none())
    ///     .build()?;
    /// let client = volcano::Client::builder()
    ///     .service_key("service-key")
    ///     .http_client(http)
    ///     .build()?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http_client = Some(client);
        self
    }

    /// The project's anon key (optional: lock calls never send it).
    pub fn anon_key(mut self, key: impl Into<String>) -> Self {
        self.anon_key = Some(key.into());
        self
    }

    /// The service-role key every lock call needs (required: `build()`
    /// fails without it).
    pub fn service_key(mut self, key: impl Into<String>) -> Self {
        self.service_key = Some(key.into());
        self
    }

    /// The API URL; default `https://api.volcano.dev`. A path prefix is kept
    /// and one trailing `/` is dropped.
    pub fn api_url(mut self, url: impl Into<String>) -> Self {
        self.api_url = Some(url.into());
        self
    }

    /// Per-request timeout (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Allows an `http://` API URL on a non-loopback host. Off by default:
    /// the service key must not cross a network in clear text. With it, an
    /// `HTTP_PROXY` or `ALL_PROXY` proxy sees the service key too.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// The clock scoped locks measure their deadline with (default:
    /// [`LeaseClock::boottime`]). Tests can pass [`LeaseClock::adjustable`].
    pub fn lease_clock(mut self, clock: LeaseClock) -> Self {
        self.lease_clock = Some(clock);
        self
    }

    /// Checks the configuration and builds the client.
    pub fn build(self) -> Result<Client> {
        self.build_over(None)
    }

    /// Builds the client; its requests go over `wire` when given (a
    /// simulated network), else the HTTP client.
    pub(crate) fn build_over(self, wire: Option<Box<dyn crate::wire::Wire>>) -> Result<Client> {
        if self.anon_key.as_deref() == Some("") {
            return Err(Error::invalid("anon_key must not be empty"));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            return Err(Error::invalid("timeout must be greater than zero"));
        }
        let api_url = check_api_url(
            self.api_url.as_deref().unwrap_or(DEFAULT_API_URL),
            self.allow_insecure_http,
        )?;
        let key = match self.service_key {
            None => {
                return Err(Error::invalid(
                    "service_key is required: lock calls need the service-role key",
                ))
            }
            Some(key) if key.is_empty() => {
                return Err(Error::invalid("service_key must not be empty"))
            }
            Some(key) => key,
        };
        #[cfg(not(any(feature = "tls-aws-lc-rs", feature = "tls-ring")))]
        if self.http_client.is_none() && api_url.route.https {
            return Err(Error::invalid(
                "api_url uses https:// but volcano was built without TLS: enable its \
                 `tls-aws-lc-rs` (default) or `tls-ring` feature, or pass your own client \
                 with http_client",
            ));
        }
        let mut auth = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
            Error::invalid("service_key contains characters not allowed in a header")
        })?;
        auth.set_sensitive(true);
        let mut transport =
            Transport::new(api_url.text, auth, timeout, self.http_client, api_url.route)?;
        if let Some(wire) = wire {
            transport = transport.over(wire);
        }
        Ok(Client::new(
            transport,
            self.anon_key,
            self.lease_clock.unwrap_or_default(),
        ))
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |v: &Option<String>| v.as_ref().map(|_| "[redacted]");
        f.debug_struct("ClientBuilder")
            .field("anon_key", &redact(&self.anon_key))
            .field("service_key", &redact(&self.service_key))
            .field("api_url", &self.api_url)
            .field("timeout", &self.timeout)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .field("lease_clock", &self.lease_clock)
            .finish()
    }
}

/// A checked API URL.
struct ApiUrl {
    /// Without one trailing `/`.
    text: String,
    route: Route,
}

/// Validates the API URL.
fn check_api_url(raw: &str, allow_insecure_http: bool) -> Result<ApiUrl> {
    let url = reqwest::Url::parse(raw)
        .map_err(|e| Error::invalid(format!("api_url {raw:?} is not a valid URL: {e}")))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid(
            "api_url must not contain credentials; use service_key",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::invalid(format!(
            "api_url {raw:?} must not have a query or fragment"
        )));
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_insecure_http || is_loopback(&url) => {}
        "http" => {
            return Err(Error::invalid(format!(
                "api_url {raw:?} uses http:// on a non-loopback host, which would send the \
                 service key in clear text; use https:// or allow_insecure_http(true)"
            )))
        }
        other => {
            return Err(Error::invalid(format!(
                "api_url scheme {other:?} is not supported; use https://"
            )))
        }
    }
    let text = raw.trim();
    Ok(ApiUrl {
        text: text.strip_suffix('/').unwrap_or(text).to_owned(),
        route: Route {
            https: url.scheme() == "https",
            loopback: is_loopback(&url),
        },
    })
}

fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(domain)) => {
            let domain = domain.strip_suffix('.').unwrap_or(domain);
            domain.eq_ignore_ascii_case("localhost")
        }
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_url_rules() {
        let ok = |u: &str| check_api_url(u, false).unwrap().text;
        assert_eq!(ok("https://h:8443/pfx/"), "https://h:8443/pfx");
        assert_eq!(ok("https://h:8443/pfx"), "https://h:8443/pfx");
        assert_eq!(ok("https://api.volcano.dev/"), "https://api.volcano.dev");
        assert_eq!(ok("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
        assert_eq!(ok("http://127.9.9.9:8000"), "http://127.9.9.9:8000");
        assert_eq!(ok("http://[::1]:8000/"), "http://[::1]:8000");
        assert_eq!(ok("http://LOCALHOST:8000"), "http://LOCALHOST:8000");
        assert_eq!(ok("http://localhost.:8000"), "http://localhost.:8000");
        assert_eq!(ok("http://[::ffff:127.0.0.1]"), "http://[::ffff:127.0.0.1]");
        assert_eq!(ok("http://127.1"), "http://127.1");
        for local in ["https://localhost.", "https://[::1]", "https://127.3.2.1"] {
            assert!(
                check_api_url(local, false).unwrap().route.loopback,
                "{local}"
            );
        }
        for remote in ["https://localhost.example", "https://[::ffff:10.0.0.1]"] {
            assert!(
                !check_api_url(remote, false).unwrap().route.loopback,
                "{remote}"
            );
        }
        for bad in [
            "http://example.com",
            "http://10.0.0.1:8000",
            "ftp://example.com",
            "not a url",
            "https://user:pw@example.com",
            "https://example.com/?q=1",
        ] {
            assert!(
                matches!(check_api_url(bad, false), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        assert!(check_api_url("http://example.com", true).is_ok());
    }

    /// Run by `.ci/run` with `--no-default-features`.
    #[cfg(not(any(feature = "tls-aws-lc-rs", feature = "tls-ring")))]
    #[test]
    fn without_tls_https_needs_a_client_of_ones_own() {
        let builder = || Client::builder().service_key("k");
        let err = builder().api_url("HTTPS://h").build().unwrap_err();
        assert!(err.to_string().contains("built without TLS"), "{err}");
        assert!(builder().api_url("http://127.0.0.1:1").build().is_ok());
        let http = reqwest::Client::new();
        assert!(builder()
            .api_url("https://h")
            .http_client(http)
            .build()
            .is_ok());
    }

    #[test]
    fn from_lookup_requires_the_service_key_and_reads_all_three() {
        let err = Client::from_lookup(|_| None).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains(ENV_SERVICE_KEY), "{err}");
        let client = Client::from_lookup(|name| match name {
            ENV_ANON_KEY => Some("anon".into()),
            ENV_SERVICE_KEY => Some("svc".into()),
            ENV_API_URL => Some("http://127.0.0.1:9/".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(client.api_url(), "http://127.0.0.1:9");
        // The anon key is optional; empty variables count as unset.
        let client = Client::from_lookup(|name| match name {
            ENV_SERVICE_KEY => Some("svc".into()),
            _ => Some(String::new()),
        })
        .unwrap();
        assert_eq!(client.api_url(), DEFAULT_API_URL);
    }
}
