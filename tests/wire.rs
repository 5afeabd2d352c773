//! Exact requests on the wire (protocol sections 1–2, scenarios 22, 24–26).

mod common;

use std::time::Duration;

use common::*;
use volcano::{Client, Error, LockLease};
use wiremock::matchers::{body_string, header as header_is, method, path};
use wiremock::{Mock, ResponseTemplate};

fn lease() -> LockLease {
    LockLease::new("build:queue", TOKEN, chrono::Utc::now(), 9)
}

/// Mounts one exact expectation for each of the five operations, answered
/// with its success status, and runs them all.
#[tokio::test]
async fn all_five_operations_send_exact_method_path_headers_and_body() {
    let server = server().await;
    let bearer = format!("Bearer {SERVICE_KEY}");
    let common = |m: &'static str, p: &'static str| {
        Mock::given(method(m))
            .and(path(p))
            .and(header_is("authorization", bearer.as_str()))
            .and(header_is("x-volcano-request-id", REQUEST_ID))
            .and(header_is("accept", "application/json"))
            .and(header_is("content-type", "application/json"))
    };
    common("POST", "/locks/build%3Aqueue/lease")
        .and(header_is("x-volcano-lock-token", TOKEN))
        .and(body_string(r#"{"ttl_seconds":30}"#))
        .respond_with(lease_body(201, 9))
        .expect(1)
        .mount(&server)
        .await;
    common("PATCH", "/locks/build%3Aqueue/lease")
        .and(header_is("x-volcano-lock-token", TOKEN))
        .and(body_string(r#"{"ttl_seconds":60}"#))
        .respond_with(lease_body(200, 9))
        .expect(1)
        .mount(&server)
        .await;
    common("DELETE", "/locks/build%3Aqueue/lease")
        .and(header_is("x-volcano-lock-token", TOKEN))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;
    common("GET", "/locks/build%3Aqueue")
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({"held": false})))
        .expect(1)
        .mount(&server)
        .await;
    common("DELETE", "/locks/build%3Aqueue")
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;

    let locks = client(&server.uri()).locks();
    let acquired = locks
        .acquire("build:queue", Duration::from_secs(30))
        .token(TOKEN)
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    let renewed = locks
        .renew(&acquired, Duration::from_secs(60))
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    assert_eq!(renewed.token(), TOKEN);
    assert_eq!(renewed.key(), "build:queue");
    locks
        .release(&renewed)
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    let state = locks
        .get("build:queue")
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    assert!(!state.held());
    locks
        .force_release("build:queue")
        .request_id(REQUEST_ID)
        .await
        .unwrap();
    server.verify().await;

    // Nothing else on the wire: no anon key, no lock token where none belongs,
    // no body on bodyless calls.
    for request in received(&server).await {
        assert!(request.headers.get("apikey").is_none());
        let text = format!("{:?}", request.headers);
        assert!(!text.contains(ANON_KEY));
        let on_lease = request.url.path().ends_with("/lease");
        assert_eq!(
            request.headers.contains_key("x-volcano-lock-token"),
            on_lease
        );
        if request.method.as_str() == "GET" || request.method.as_str() == "DELETE" {
            assert!(request.body.is_empty());
        }
    }
}

/// Protocol scenario 25.
#[tokio::test]
async fn fresh_request_id_per_call() {
    let server = server().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({"held": false})))
        .mount(&server)
        .await;
    let locks = client(&server.uri()).locks();
    locks.get("k").await.unwrap();
    locks.get("k").await.unwrap();
    let ids: Vec<String> = received(&server)
        .await
        .iter()
        .map(|r| header(r, "x-volcano-request-id").unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    for id in &ids {
        assert_eq!(id.len(), 36);
        assert_eq!(uuid::Uuid::parse_str(id).unwrap().get_version_num(), 4);
        assert_eq!(id, &id.to_lowercase());
    }
}

#[tokio::test]
async fn generated_acquire_token_is_a_fresh_v4_uuid() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 1))
        .mount(&server)
        .await;
    let locks = client(&server.uri()).locks();
    let a = locks.acquire("k", Duration::from_secs(5)).await.unwrap();
    let b = locks.acquire("k", Duration::from_secs(5)).await.unwrap();
    assert_ne!(a.token(), b.token());
    assert_eq!(
        uuid::Uuid::parse_str(a.token()).unwrap().get_version_num(),
        4
    );
}

#[tokio::test]
async fn api_url_path_prefix_is_kept_and_one_trailing_slash_dropped() {
    let server = server().await;
    Mock::given(method("GET"))
        .and(path("/pfx/v1/locks/k"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({"held": false})))
        .expect(2)
        .mount(&server)
        .await;
    for url in [
        format!("{}/pfx/v1", server.uri()),
        format!("{}/pfx/v1/", server.uri()),
    ] {
        client(&url).locks().get("k").await.unwrap();
    }
}

/// Protocol scenario 22, moved to start-up: a lock client without a service
/// key is a configuration error, so `build()` refuses it (DESIGN section 3).
#[tokio::test]
async fn no_service_key_fails_at_build_and_nothing_is_sent() {
    let server = server().await;
    let err = Client::builder()
        .anon_key(ANON_KEY)
        .api_url(server.uri())
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(err.status(), None);
    assert!(err.to_string().contains("service_key"), "{err}");
    assert!(received(&server).await.is_empty());
}

#[tokio::test]
async fn renew_and_release_reject_a_lease_with_a_bad_token_or_key_locally() {
    let server = server().await;
    let locks = client(&server.uri()).locks();
    let bad_token = LockLease::new("k", "nope", chrono::Utc::now(), 1);
    let bad_key = LockLease::new("a/b", TOKEN, chrono::Utc::now(), 1);
    for lease in [bad_token, bad_key] {
        let err = locks
            .renew(&lease, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        let err = locks.release(&lease).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    let err = locks
        .renew(&lease(), Duration::from_secs(4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(received(&server).await.is_empty());
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = server().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(307).insert_header("location", "http://127.0.0.1:9/steal"),
        )
        .expect(1)
        .mount(&server)
        .await;
    let err = client(&server.uri()).locks().get("k").await.unwrap_err();
    assert!(matches!(err, Error::UnexpectedStatus(_)), "{err:?}");
    assert_eq!(err.status(), Some(307));
}

#[tokio::test]
async fn per_call_timeout_overrides_the_client_timeout() {
    let server = server().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"held": false}))
                .set_delay(Duration::from_secs(5)),
        )
        .mount(&server)
        .await;
    let err = client(&server.uri())
        .locks()
        .get("k")
        .timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    match &err {
        Error::Transport(t) => assert!(t.is_timeout(), "{err:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn insecure_http_is_refused_for_remote_hosts() {
    let err = Client::builder()
        .anon_key(ANON_KEY)
        .service_key(SERVICE_KEY)
        .api_url("http://locks.example.com")
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(!err.to_string().contains(SERVICE_KEY));
    Client::builder()
        .anon_key(ANON_KEY)
        .service_key(SERVICE_KEY)
        .api_url("http://locks.example.com")
        .allow_insecure_http(true)
        .build()
        .expect("explicit opt-in");
    // The anon key is optional (lock calls never send it).
    Client::builder()
        .service_key(SERVICE_KEY)
        .build()
        .expect("no anon key needed");
    let err = Client::builder()
        .service_key(SERVICE_KEY)
        .anon_key("")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("anon_key"), "{err}");
}

/// One options value sets what the builder's own setters set, `set_x(None)`
/// clears an option back to the SDK's default, and a later `options(..)`
/// replaces what was set before.
#[tokio::test]
async fn an_options_value_sends_what_the_setters_send() {
    use volcano::AcquireOptions;
    let server = server().await;
    Mock::given(method("POST"))
        .and(header_is("x-volcano-lock-token", TOKEN))
        .and(header_is("x-volcano-request-id", REQUEST_ID))
        .respond_with(lease_body(201, 9))
        .expect(1)
        .mount(&server)
        .await;
    let locks = client(&server.uri()).locks();
    let options = AcquireOptions::default()
        .token(TOKEN)
        .request_id(REQUEST_ID);
    assert_eq!(options.get_token(), Some(TOKEN));
    assert!(!format!("{options:?}").contains(TOKEN), "{options:?}");
    let lease = locks
        .acquire("build:queue", Duration::from_secs(30))
        .options(options.clone())
        .await
        .unwrap();
    assert_eq!(lease.token(), TOKEN);
    server.verify().await;
    server.reset().await;

    // Cleared: a fresh token and request id; and the earlier setters are
    // replaced by the value.
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 10))
        .expect(1)
        .mount(&server)
        .await;
    let cleared = options.set_token(None).set_request_id(None);
    locks
        .hold("build:queue", Duration::from_secs(30))
        .token(TOKEN)
        .options(cleared)
        .await
        .unwrap()
        .release()
        .await
        .ok();
    let sent = &server.received_requests().await.unwrap()[0];
    let header = |name: &str| sent.headers.get(name).unwrap().to_str().unwrap().to_owned();
    assert_ne!(header("x-volcano-lock-token"), TOKEN);
    assert_ne!(header("x-volcano-request-id"), REQUEST_ID);
}

/// A plain acquire has nothing that could end a `max_hold`: refused
/// before anything is sent.
#[tokio::test]
async fn an_acquire_given_a_max_hold_fails_and_sends_nothing() {
    let server = server().await;
    let locks = client(&server.uri()).locks();
    let options = volcano::AcquireOptions::default().max_hold(Duration::from_secs(60));
    let err = locks
        .acquire("build:queue", Duration::from_secs(30))
        .options(options)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("max_hold"), "{err}");
    assert!(server.received_requests().await.unwrap().is_empty());
}
