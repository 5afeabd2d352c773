//! The SDK's requests over the simulated network: one simulated TCP
//! connection per request, HTTP/1.1 through hyper, the request's timeout
//! on simulated time.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use volcano::sim::{Answer, Failure, Network};

/// The server's name on the simulated network, and its port.
pub(crate) const SERVER: &str = "server";
pub(crate) const PORT: u16 = 80;

/// What the clients sent, as the network saw it: who sent each request id
/// (so that the server's journal can be read per client), and every
/// release sent, whether or not it arrived.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sent {
    /// Who sent each request id, and when it was first sent.
    pub(crate) by_id: HashMap<String, (usize, Duration)>,
    /// (client, key, request id) of each release sent.
    pub(crate) releases: Vec<(usize, String, String)>,
}

pub(crate) type Senders = Arc<Mutex<Sent>>;

/// Carries a client's requests to [`SERVER`].
pub(crate) struct SimNetwork {
    pub(crate) client: usize,
    /// The client's per-request timeout, for requests that carry none.
    pub(crate) timeout: Duration,
    pub(crate) senders: Senders,
}

impl Network for SimNetwork {
    fn send(
        &self,
        request: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, Failure>> + Send + '_>> {
        let timeout = request.timeout().copied().unwrap_or(self.timeout);
        {
            let mut sent = crate::lock(&self.senders);
            let id = request
                .headers()
                .get("x-volcano-request-id")
                .and_then(|v| v.to_str().ok());
            let id = id.unwrap_or_default().to_owned();
            let now = turmoil::sim_elapsed().unwrap_or_default();
            sent.by_id.entry(id.clone()).or_insert((self.client, now));
            let path = request.url().path();
            if request.method() == reqwest::Method::DELETE && path.ends_with("/lease") {
                let key = path
                    .trim_start_matches("/locks/")
                    .trim_end_matches("/lease");
                sent.releases.push((self.client, key.to_owned(), id));
            }
        }
        Box::pin(async move {
            match tokio::time::timeout(timeout, exchange(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(Failure::Timeout),
            }
        })
    }
}

/// One request and its whole answer on a fresh connection.
async fn exchange(request: reqwest::Request) -> Result<Answer, Failure> {
    let stream = turmoil::net::TcpStream::connect((SERVER, PORT))
        .await
        .map_err(|_| Failure::Connect)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| Failure::Connect)?;
    // Driven beside the request, and stopped with it: also when this
    // future is dropped mid-request (a timeout, an abandoned call).
    let driver = AbortOnDrop(tokio::task::spawn(async move {
        let _ = connection.await;
    }));
    let result = async {
        let response = sender
            .send_request(to_hyper(&request))
            .await
            .map_err(|_| Failure::Io)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|_| Failure::Io)?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
    .await;
    drop(driver);
    result
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The same request as hyper takes it: method, path, headers, body.
fn to_hyper(request: &reqwest::Request) -> hyper::Request<Full<bytes::Bytes>> {
    let url = request.url();
    let mut builder = hyper::Request::builder()
        .method(request.method().clone())
        .uri(url.path())
        .header(hyper::header::HOST, SERVER);
    for (name, value) in request.headers() {
        builder = builder.header(name, value);
    }
    let body = request
        .body()
        .and_then(reqwest::Body::as_bytes)
        .map(bytes::Bytes::copy_from_slice)
        .unwrap_or_default();
    builder
        .body(Full::new(body))
        .expect("a request the SDK built is valid")
}
