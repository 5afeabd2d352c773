//! The SDK's own HTTP client: proxies, TLS and the headers every request
//! carries. What is sent, and when, is the transport's business.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};

use crate::error::{Error, Result};

const JSON: HeaderValue = HeaderValue::from_static("application/json");

/// Sent on every request, body or not, as the reference SDKs do.
pub(crate) const DEFAULT_HEADERS: [(HeaderName, HeaderValue); 2] =
    [(ACCEPT, JSON), (CONTENT_TYPE, JSON)];

fn default_headers() -> HeaderMap {
    HeaderMap::from_iter(DEFAULT_HEADERS)
}

/// Where the service is, as the SDK's own client needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) https: bool,
    /// On this machine: `localhost`, `127.0.0.0/8`, `::1`.
    pub(crate) loopback: bool,
}

/// The SDK's own client. Proxies come from the standard variables
/// (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) and, on macOS and
/// Windows, the system settings, except for a service on loopback: a proxy
/// cannot reach this machine's loopback, and would see the service key of a
/// plain-http local server. Certificates are checked against the OS trust
/// store (`SSL_CERT_FILE` and `SSL_CERT_DIR` replace it on Linux), which is
/// not even loaded for a plain-http service on loopback (the mock server),
/// so tests run in an image without CA certificates.
pub(crate) fn own_client(timeout: Duration, route: Route) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder();
    if route.loopback {
        builder = builder.no_proxy();
    }
    // No TLS at all: no proxy, no https.
    #[cfg(any(feature = "tls-aws-lc-rs", feature = "tls-ring"))]
    let plain_local = route.loopback && !route.https;
    #[cfg(all(feature = "tls-aws-lc-rs", not(feature = "tls-ring")))]
    if plain_local {
        builder = builder.tls_certs_only([]);
    }
    // reqwest ignores its own TLS options (versions, roots, SNI) for a
    // configuration given whole: set them in `tls::ring_config`.
    #[cfg(feature = "tls-ring")]
    {
        builder = builder.tls_backend_preconfigured(tls::ring_config(plain_local)?);
    }
    let builder = builder
        .default_headers(default_headers())
        .user_agent(concat!("volcano-rust/", env!("CARGO_PKG_VERSION")))
        .timeout(timeout)
        // A redirect would carry the service key elsewhere; report it instead.
        .redirect(reqwest::redirect::Policy::none());
    builder
        .build()
        .map_err(|e| client_failed(&crate::error::chain(&e)))
}

/// Building a client fails mostly on TLS: say where trust comes from.
fn client_failed(reason: &str) -> Error {
    Error::invalid(format!(
        "could not build the HTTP client: {reason} (certificates come from the OS trust \
         store, or from SSL_CERT_FILE and SSL_CERT_DIR when set)"
    ))
}

/// TLS with ring, configured here rather than through a process-wide
/// default provider, which would change what other rustls users in the
/// process get.
#[cfg(feature = "tls-ring")]
mod tls {
    use std::sync::Arc;

    use rustls::crypto::ring;
    use rustls::ClientConfig;

    use crate::error::Result;

    /// `plain_local`: no TLS will be spoken, so no trust store is loaded.
    pub(super) fn ring_config(plain_local: bool) -> Result<ClientConfig> {
        let provider = Arc::new(ring::default_provider());
        let failed = |e: rustls::Error| super::client_failed(&e.to_string());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(failed)?;
        let builder = if plain_local {
            builder.with_root_certificates(rustls::RootCertStore::empty())
        } else {
            let verifier = rustls_platform_verifier::Verifier::new(provider).map_err(failed)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        };
        let mut config = builder.with_no_client_auth();
        // What reqwest offers with its own configuration.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}
