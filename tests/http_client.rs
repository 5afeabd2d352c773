//! `ClientBuilder::http_client`: the caller's own reqwest client, with what
//! the SDK still enforces on every request.

mod common;

use std::time::Duration;

use common::*;
use volcano::{Client, Error};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

fn with_http(url: &str, http: reqwest::Client, timeout: Duration) -> Client {
    Client::builder()
        .service_key(SERVICE_KEY)
        .api_url(url)
        .timeout(timeout)
        .http_client(http)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_callers_client_still_sends_the_sdks_headers() {
    let server = server().await;
    mount(&server, "POST", lease_body(201, 4)).await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let lease = with_http(&server.uri(), http, Duration::from_secs(5))
        .locks()
        .acquire("job", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(lease.fencing_token(), 4);
    let requests = received(&server).await;
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(
        header(request, "authorization"),
        Some(format!("Bearer {SERVICE_KEY}").as_str())
    );
    assert_eq!(header(request, "accept"), Some("application/json"));
    assert_eq!(header(request, "content-type"), Some("application/json"));
    assert!(header(request, "x-volcano-request-id").is_some());
}

#[tokio::test]
async fn the_sdks_timeout_applies_not_the_clients() {
    let server = server().await;
    mount(
        &server,
        "GET",
        lease_body(200, 1).set_delay(Duration::from_secs(5)),
    )
    .await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = with_http(&server.uri(), http, Duration::from_millis(300))
        .locks()
        .get("job")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Transport(t) if t.is_timeout()),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn a_redirect_to_another_host_never_carries_the_service_key() {
    let elsewhere = wiremock::MockServer::start().await;
    mount(&elsewhere, "POST", ResponseTemplate::new(401)).await;
    let server = server().await;
    Mock::given(method("POST"))
        .and(path("/locks/job/lease"))
        .respond_with(ResponseTemplate::new(307).insert_header(
            "location",
            format!("{}/locks/job/lease", elsewhere.uri()).as_str(),
        ))
        .mount(&server)
        .await;
    // A client that follows redirects (reqwest's default policy). The two
    // servers differ by port: another origin.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let err = with_http(&server.uri(), http, Duration::from_secs(5))
        .locks()
        .acquire("job", Duration::from_secs(30))
        .await
        .unwrap_err();
    let followed = elsewhere.received_requests().await.unwrap_or_default();
    assert!(
        !followed.is_empty(),
        "the client followed the redirect: {err:?}"
    );
    for request in followed {
        assert!(header(&request, "authorization").is_none(), "{request:?}");
        for (_, value) in request.headers.iter() {
            assert!(!value
                .as_bytes()
                .windows(SERVICE_KEY.len())
                .any(|w| w == SERVICE_KEY.as_bytes()));
        }
    }
}
