//! Acquire and its single retry (protocol scenarios 1–8, 18, 19).

mod common;

use std::time::Duration;

use common::*;
use volcano::{Error, InvalidReason};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

const TTL: Duration = Duration::from_secs(30);

/// Asserts the requests are byte-identical in everything that matters for
/// idempotency and returns the token they carried.
fn assert_identical(requests: &[wiremock::Request]) -> String {
    let first = &requests[0];
    for other in &requests[1..] {
        assert_eq!(other.method, first.method);
        assert_eq!(other.url, first.url);
        assert_eq!(other.body, first.body);
        for name in [
            "authorization",
            "x-volcano-lock-token",
            "x-volcano-request-id",
        ] {
            assert_eq!(header(other, name), header(first, name), "{name} differs");
        }
    }
    assert_eq!(
        header(first, "authorization"),
        Some(&*format!("Bearer {SERVICE_KEY}"))
    );
    assert_eq!(first.body, br#"{"ttl_seconds":30}"#);
    header(first, "x-volcano-lock-token").unwrap().to_owned()
}

async fn retry_then_succeed(first: ResponseTemplate, caller_ids: bool) {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .and(path("/locks/daily-report/lease"))
        .respond_with(first)
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/locks/daily-report/lease"))
        .respond_with(lease_body(201, 7))
        .with_priority(2)
        .mount(&server)
        .await;
    let client = client_with_timeout(&server.uri(), Duration::from_millis(300));
    let mut acquire = client.locks().acquire("daily-report", TTL);
    if caller_ids {
        acquire = acquire.token(TOKEN).request_id(REQUEST_ID);
    }
    let lease = acquire.await.expect("second attempt succeeds");

    let requests = received(&server).await;
    assert_eq!(requests.len(), 2);
    let token = assert_identical(&requests);
    assert_eq!(lease.token(), token);
    assert_eq!(lease.fencing_token(), 7);
    if caller_ids {
        assert_eq!(token, TOKEN, "caller token sent exactly as spelled");
        assert_eq!(
            header(&requests[1], "x-volcano-request-id"),
            Some(REQUEST_ID)
        );
    }
}

/// Protocol scenario 1.
#[tokio::test]
async fn timeout_then_success_retries_with_identical_request() {
    let slow = lease_body(201, 7).set_delay(Duration::from_secs(3));
    retry_then_succeed(slow.clone(), false).await;
    retry_then_succeed(slow, true).await;
}

/// Protocol scenarios 2, 3.
#[tokio::test]
async fn a_503_then_success_retries_with_identical_request() {
    let unavailable = error_body(
        503,
        "Lock service unavailable",
        Some("lock_service_unavailable"),
    );
    retry_then_succeed(unavailable.clone(), false).await;
    retry_then_succeed(unavailable, true).await;
}

/// A wiremock server that also answers releases with `204`, as the service
/// answers the release of a lease that was never granted: an acquire being
/// undone then ends known to be free.
async fn releasing_server() -> wiremock::MockServer {
    let server = server().await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    server
}

/// Waits for the client's background releases, then checks that the undo
/// sent `releases` releases with the acquire's token: none when nothing
/// may have been applied, one when the service itself answered every try
/// (a lease it granted is freed at once), two when a try may still land
/// (no answer, a 5xx that is not the service's own, an unreadable answer:
/// one at once, one once it can no longer land, 5 s of timeout and 2 s
/// of margin later).
async fn assert_undone_with(client: &volcano::Client, server: &wiremock::MockServer, sent: usize) {
    assert!(client.shutdown(Duration::from_secs(15)).await.is_empty());
    let requests = received(server).await;
    let releases: Vec<_> = requests
        .iter()
        .filter(|r| r.method.as_str() == "DELETE")
        .collect();
    assert_eq!(releases.len(), sent, "{requests:?}");
    for release in releases {
        assert_eq!(
            header(release, "x-volcano-lock-token"),
            header(&requests[0], "x-volcano-lock-token")
        );
    }
}

/// Protocol scenario 4.
#[tokio::test]
async fn other_statuses_are_not_retried() {
    for status in [400u16, 401, 403, 404, 409, 429, 500, 502, 504] {
        let server = releasing_server().await;
        Mock::given(method("POST"))
            .respond_with(error_body(status, "no", None))
            .expect(1)
            .mount(&server)
            .await;
        let client = client(&server.uri());
        let err = client
            .locks()
            .acquire("daily-report", TTL)
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(status), "{err}");
        // A 5xx without the service's error code (a gateway's, say) may
        // have been applied and may still land: undone twice.
        assert_undone_with(&client, &server, if status >= 500 { 2 } else { 0 }).await;
        server.verify().await;
    }
}

/// Protocol scenario 5.
#[tokio::test]
async fn a_503_twice_gives_up_after_two_attempts() {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .respond_with(error_body(
            503,
            "Lock service unavailable",
            Some("lock_service_unavailable"),
        ))
        .expect(2)
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let err = client
        .locks()
        .acquire("daily-report", TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Server(_)), "{err:?}");
    assert_eq!(err.status(), Some(503));
    assert_eq!(err.code(), Some("lock_service_unavailable"));
    // The service's own 503s: nothing of them can land later.
    assert_undone_with(&client, &server, 1).await;
}

/// Protocol scenario 6.
#[tokio::test]
async fn two_dropped_connections_give_transport_error_after_two_identical_requests() {
    let dropper = Dropper::start().await;
    let err = client(&dropper.url)
        .locks()
        .acquire("daily-report", TTL)
        .token(TOKEN)
        .request_id(REQUEST_ID)
        .await
        .unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    assert_eq!(err.status(), None);
    assert_eq!(err.request_id(), Some(REQUEST_ID));
    assert_eq!(dropper.count(), 2);
    let requests = dropper.requests.lock().unwrap().clone();
    assert_eq!(requests[0], requests[1], "retry must be byte-identical");
    assert!(requests[0].contains(TOKEN));
}

/// Protocol scenario 7.
#[tokio::test]
async fn bad_token_or_request_id_sends_nothing() {
    let server = releasing_server().await;
    let locks = client(&server.uri()).locks();
    for bad in ["", "not-a-uuid", "123e4567e89b12d3a456426614174000"] {
        let err = locks.acquire("k", TTL).token(bad).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("token")),
            "{err}"
        );
        let err = locks.acquire("k", TTL).request_id(bad).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("request_id")),
            "{err}"
        );
    }
    assert!(received(&server).await.is_empty());
}

#[tokio::test]
async fn bad_ttl_or_key_sends_nothing() {
    let server = releasing_server().await;
    let locks = client(&server.uri()).locks();
    for ttl in [
        Duration::from_secs(4),
        Duration::from_millis(30_500),
        Duration::from_secs(7_776_001),
    ] {
        let err = locks.acquire("k", ttl).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("ttl")),
            "{err}"
        );
    }
    for key in ["", "-k", "a/b", "a b", "k\n", &"k".repeat(129)] {
        let err = locks.acquire(key, TTL).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("key")),
            "{err}"
        );
    }
    assert!(received(&server).await.is_empty());
}

#[tokio::test]
async fn ttl_bounds_are_accepted() {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 1))
        .expect(2)
        .mount(&server)
        .await;
    let locks = client(&server.uri()).locks();
    locks.acquire("k", Duration::from_secs(5)).await.unwrap();
    locks
        .acquire("k", Duration::from_secs(7_776_000))
        .await
        .unwrap();
    let bodies: Vec<_> = received(&server)
        .await
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(
        bodies,
        [
            br#"{"ttl_seconds":5}"#.to_vec(),
            br#"{"ttl_seconds":7776000}"#.to_vec()
        ]
    );
}

/// Protocol scenario 18.
#[tokio::test]
async fn null_body_is_retried_then_reported() {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_body_string("null"))
        .expect(2)
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let err = client.locks().acquire("k", TTL).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidResponse(e) if e.reason() == InvalidReason::NotAnObject),
        "{err:?}"
    );
    assert_eq!(err.status(), Some(201));
    assert_undone_with(&client, &server, 2).await;
}

/// Protocol scenario 19.
#[tokio::test]
async fn missing_fields_are_not_retried() {
    for (body, reason) in [
        (
            serde_json::json!({"expires_at": EXPIRES_AT}),
            InvalidReason::FencingToken,
        ),
        (
            serde_json::json!({"fencing_token": 3}),
            InvalidReason::Expiry,
        ),
    ] {
        let server = releasing_server().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(201).set_body_json(body))
            .expect(1)
            .mount(&server)
            .await;
        let client = client(&server.uri());
        let err = client.locks().acquire("k", TTL).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidResponse(e) if e.reason() == reason),
            "{err:?}"
        );
        assert_undone_with(&client, &server, 2).await;
        server.verify().await;
    }
}

#[tokio::test]
async fn a_200_instead_of_201_is_an_unexpected_status() {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(200, 1))
        .expect(1)
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let err = client.locks().acquire("k", TTL).await.unwrap_err();
    assert!(matches!(err, Error::UnexpectedStatus(_)), "{err:?}");
    assert_eq!(err.status(), Some(200));
    assert_undone_with(&client, &server, 2).await;
}

#[tokio::test]
async fn uppercase_caller_token_is_kept_in_the_lease() {
    let server = releasing_server().await;
    Mock::given(method("POST"))
        .respond_with(lease_body(201, 1))
        .mount(&server)
        .await;
    let lease = client(&server.uri())
        .locks()
        .acquire("k", TTL)
        .token(TOKEN)
        .await
        .unwrap();
    assert_eq!(lease.token(), TOKEN);
    assert_eq!(lease.key(), "k");
    assert_eq!(
        header(&received(&server).await[0], "x-volcano-lock-token"),
        Some(TOKEN)
    );
}

/// An acquire applied and answered with a page the client cannot read (a
/// proxy's, from the mock server's `garbled_response`) is sent once more
/// with the same token, which recovers the lease it was granted.
#[tokio::test]
async fn an_unreadable_grant_is_retried_and_recovered() {
    let server = volcano_mock_server::MockServer::start().await;
    server.inject(
        volcano_mock_server::Fault::garbled_response()
            .on(volcano_mock_server::Operation::Acquire)
            .times(1),
    );
    let client = common::mock_client(&server);
    let lease = client.locks().acquire("k", TTL).await.expect("recovered");
    let journal = server.requests();
    assert_eq!(journal.len(), 2, "{journal:?}");
    assert_eq!(journal[0].fencing_token, Some(lease.fencing_token()));
    assert_eq!(journal[0].request_id, journal[1].request_id);
}

/// A waiter's try whose first attempt and the transport's retry are both
/// answered 503 by a gateway, while its own client freed the key during
/// the first: the retry went after that release, so the release is no
/// news; the wait pauses as after any 503 (a third attempt at once would
/// be a second retry; found by the simulation's kept minimums, seed 166).
#[tokio::test]
async fn a_release_before_the_retry_does_not_hurry_the_try_after_its_503() {
    let posts = InTurn::new(|n| match n {
        1 => lease_body(201, 1),
        2 => gateway_page().set_delay(Duration::from_millis(300)),
        3 => gateway_page(),
        _ => error_body(409, "Lock is held", Some("lock_held")),
    });
    let arrived = posts.arrived.clone();
    let wire = server().await;
    Mock::given(method("POST"))
        .respond_with(posts)
        .mount(&wire)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&wire)
        .await;
    let locks = client(&wire.uri()).locks();
    let held = locks.acquire("job", Duration::from_secs(30)).await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .acquire("job", Duration::from_secs(30))
                .wait(Duration::from_millis(1_500))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    locks.release(&held).await.unwrap();
    assert!(waiter.await.unwrap().unwrap_err().is_lock_held());
    let seen = arrived.lock().unwrap().clone();
    assert!(seen.len() >= 4, "{} acquires", seen.len());
    let pause = seen[3] - seen[2];
    assert!(
        pause >= Duration::from_millis(90),
        "tried again {pause:?} after the retry's 503"
    );
}
