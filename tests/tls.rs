//! The SDK's own HTTP client: certificates checked against the OS trust
//! store (here replaced through `SSL_CERT_FILE`, as on any Linux machine),
//! and the standard proxy variables honoured.
//!
//! One test, because it sets process-wide environment variables, on a
//! current-thread runtime, so nothing reads them while they change. The
//! certificates are fixtures from `tests/fixtures/tls/make.sh`: a private CA
//! that signed a server certificate for `localhost`, `127.0.0.1` and
//! `volcano.test`, and another CA that signed nothing here.
//!
//! The plain-text mock server sits behind a TLS terminator and, for the
//! proxy cases, a forward proxy that records each request line and sends
//! `CONNECT` tunnels to the terminator, whatever host they name.
//!
//! Linux (and other Unix but Apple's): elsewhere the platform verifier asks
//! the OS, which does not read `SSL_CERT_FILE`.
#![cfg(all(unix, not(target_vendor = "apple"), not(target_os = "android")))]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use volcano::{Client, Error};
use volcano_mock_server::{MockServer, Operation};

/// The proxy variables, and `REQUEST_METHOD`, whose presence (a CGI
/// script) makes the proxy variables ignored.
const PROXY_VARS: [&str; 9] = [
    "REQUEST_METHOD",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// Trust only the certificates in `file`, with no proxy unless set after.
fn trust_only(file: &str) {
    for var in PROXY_VARS {
        std::env::remove_var(var);
    }
    std::env::remove_var("SSL_CERT_DIR");
    std::env::set_var("SSL_CERT_FILE", file);
}

fn client(server: &MockServer, url: &str) -> volcano::Result<Client> {
    Client::builder()
        .service_key(server.service_key())
        .api_url(url)
        .timeout(Duration::from_secs(5))
        .build()
}

type Seen<T> = Arc<Mutex<Vec<T>>>;

/// Accepts TLS with the fixture server certificate and pipes the plain
/// bytes to `backend`. Returns its address and the ALPN protocols each
/// client offered.
async fn tls_terminator(backend: SocketAddr) -> (SocketAddr, Seen<Vec<String>>) {
    let certs = CertificateDer::pem_file_iter(fixture("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let config = Arc::new(config);
    let offered = Seen::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = offered.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (config, seen) = (config.clone(), seen.clone());
            tokio::spawn(async move {
                let acceptor = rustls::server::Acceptor::default();
                let Ok(start) = tokio_rustls::LazyConfigAcceptor::new(acceptor, tcp).await else {
                    return;
                };
                let alpn = start.client_hello().alpn().map(|protocols| {
                    protocols
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .collect()
                });
                seen.lock().unwrap().push(alpn.unwrap_or_default());
                // A client that rejects the certificate ends the handshake.
                let Ok(mut tls) = start.into_stream(config).await else {
                    return;
                };
                let mut plain = TcpStream::connect(backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, offered)
}

/// A forward proxy: `CONNECT` tunnels go to `tunnel_to`, absolute-form
/// requests to `plain_to`. Returns its address and the request lines seen.
async fn proxy(tunnel_to: SocketAddr, plain_to: SocketAddr) -> (SocketAddr, Seen<String>) {
    let seen = Seen::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let lines = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8];
                    if inbound.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let line = text.lines().next().unwrap_or_default().to_owned();
                lines.lock().unwrap().push(line.clone());
                let mut outbound = if line.starts_with("CONNECT ") {
                    let upstream = TcpStream::connect(tunnel_to).await.unwrap();
                    inbound
                        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                        .await
                        .unwrap();
                    upstream
                } else {
                    let mut upstream = TcpStream::connect(plain_to).await.unwrap();
                    upstream.write_all(&head).await.unwrap();
                    upstream
                };
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    (addr, seen)
}

/// Acquires and releases `key` through `client`; the mock server saw both.
async fn round_trip(server: &MockServer, client: &Client, key: &str) {
    let lease = client
        .locks()
        .acquire(key, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("acquire {key}: {e:?}"));
    client.locks().release(&lease).await.unwrap();
    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.key == key)
        .map(|r| (r.operation, r.status))
        .collect();
    assert_eq!(
        seen,
        [
            (Operation::Acquire, Some(201)),
            (Operation::Release, Some(204))
        ],
        "{key}"
    );
}

fn chain(err: &dyn std::error::Error) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

#[tokio::test]
async fn os_trust_store_and_standard_proxy_variables() {
    let server = MockServer::start().await;
    let (tls, offered) = tls_terminator(server.addr()).await;
    let ca = fixture("ca.pem");
    let ca = ca.to_str().unwrap();

    // 1. A private CA in the trust store: TLS to localhost and to the IP.
    trust_only(ca);
    let by_name = format!("https://localhost:{}", tls.port());
    round_trip(&server, &client(&server, &by_name).unwrap(), "by-name").await;
    let by_ip = format!("https://127.0.0.1:{}", tls.port());
    round_trip(&server, &client(&server, &by_ip).unwrap(), "by-ip").await;
    // HTTP/2 is offered (this server picks HTTP/1.1).
    let offered = offered.lock().unwrap().clone();
    assert!(!offered.is_empty());
    for protocols in &offered {
        assert_eq!(protocols, &["h2", "http/1.1"]);
    }

    // 2. A trust store without that CA: a connect error (nothing was
    // applied) that names the certificate, and nothing reached the server.
    trust_only(fixture("other-ca.pem").to_str().unwrap());
    let err = client(&server, &by_name)
        .unwrap()
        .locks()
        .acquire("untrusted", Duration::from_secs(30))
        .await
        .unwrap_err();
    let Error::Transport(transport) = &err else {
        panic!("expected a transport error, got {err:?}");
    };
    assert!(transport.is_connect(), "{err:?}");
    let text = chain(&err);
    assert!(text.contains("certificate"), "{text}");
    assert!(server.requests().iter().all(|r| r.key != "untrusted"));

    // 3. An empty trust store: build() says so, and where trust comes from.
    // A plain-http service on loopback (the mock server) needs no trust
    // store, so tests run in an image without CA certificates.
    trust_only("/dev/null");
    let err = client(&server, &by_name).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("No CA certificates"), "{text}");
    assert!(text.contains("SSL_CERT_FILE"), "{text}");
    round_trip(&server, &client(&server, server.url()).unwrap(), "no-trust").await;

    let (proxy_addr, proxied) = proxy(tls, server.addr()).await;
    let proxy_url = format!("http://{proxy_addr}");

    // 4. HTTPS_PROXY: a CONNECT tunnel to the service's host name, which
    // this machine never resolves; TLS still checks the certificate.
    trust_only(ca);
    std::env::set_var("HTTPS_PROXY", &proxy_url);
    let via_tunnel = client(&server, "https://volcano.test").unwrap();
    round_trip(&server, &via_tunnel, "tunnelled").await;
    let lines = proxied.lock().unwrap().clone();
    assert!(
        !lines.is_empty()
            && lines
                .iter()
                .all(|l| l == "CONNECT volcano.test:443 HTTP/1.1"),
        "{lines:?}"
    );

    // 5. HTTP_PROXY for plain http (allowed off loopback only on request):
    // absolute-form requests through the proxy.
    proxied.lock().unwrap().clear();
    trust_only(ca);
    std::env::set_var("HTTP_PROXY", &proxy_url);
    let plain = Client::builder()
        .service_key(server.service_key())
        .api_url("http://volcano.test")
        .allow_insecure_http(true)
        .build()
        .unwrap();
    round_trip(&server, &plain, "plain").await;
    // The proxy reads each connection's first request line; the release
    // may reuse the acquire's connection.
    let lines = proxied.lock().unwrap().clone();
    assert!(!lines.is_empty(), "the proxy saw nothing");
    assert!(
        lines[0].starts_with("POST http://volcano.test/")
            && lines[1..]
                .iter()
                .all(|l| l.starts_with("DELETE http://volcano.test/")),
        "{lines:?}"
    );

    // 6. A service on loopback goes direct whatever the variables say: no
    // proxy can reach it, and a plain-http one would see the service key.
    proxied.lock().unwrap().clear();
    trust_only(ca);
    std::env::set_var("HTTP_PROXY", &proxy_url);
    std::env::set_var("ALL_PROXY", &proxy_url);
    round_trip(&server, &client(&server, server.url()).unwrap(), "loopback").await;
    assert!(proxied.lock().unwrap().is_empty());

    // 7. NO_PROXY: the listed host goes direct, here to an address of
    // TEST-NET-1 that nothing answers, so the request fails (refused,
    // unreachable or timed out) without reaching the proxy.
    trust_only(ca);
    std::env::set_var("HTTPS_PROXY", &proxy_url);
    std::env::set_var("NO_PROXY", "192.0.2.1");
    let direct = Client::builder()
        .service_key(server.service_key())
        .api_url("https://192.0.2.1")
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = direct.locks().get("direct").await.unwrap_err();
    assert!(matches!(err, Error::Transport(_)), "{err:?}");
    assert!(proxied.lock().unwrap().is_empty());
}
