//! Status-to-error mapping, error details, and secrets kept out of output.

mod common;

use std::time::Duration;

use common::*;
use volcano::{Error, LockLease};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

async fn get_error(response: ResponseTemplate) -> Error {
    let server = server().await;
    Mock::given(method("GET"))
        .respond_with(response)
        .mount(&server)
        .await;
    client(&server.uri())
        .locks()
        .get("k")
        .request_id(REQUEST_ID)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn each_status_maps_to_its_variant() {
    type IsVariant = fn(&Error) -> bool;
    let cases: [(u16, IsVariant); 12] = [
        (400, |e| matches!(e, Error::Validation(_))),
        (422, |e| matches!(e, Error::Validation(_))),
        (401, |e| matches!(e, Error::Authentication(_))),
        (403, |e| matches!(e, Error::Authentication(_))),
        (404, |e| matches!(e, Error::NotFound(_))),
        (409, |e| matches!(e, Error::Conflict(_))),
        (429, |e| matches!(e, Error::RateLimited(_))),
        (500, |e| matches!(e, Error::Server(_))),
        (503, |e| matches!(e, Error::Server(_))),
        (599, |e| matches!(e, Error::Server(_))),
        (418, |e| matches!(e, Error::UnexpectedStatus(_))),
        (302, |e| matches!(e, Error::UnexpectedStatus(_))),
    ];
    for (status, is_variant) in cases {
        let err = get_error(error_body(status, "nope", Some("some_code"))).await;
        assert!(is_variant(&err), "{status} -> {err:?}");
        assert_eq!(err.status(), Some(status));
        assert_eq!(err.code(), Some("some_code"));
        assert_eq!(err.request_id(), Some(REQUEST_ID));
        assert_eq!(err.api_error().unwrap().message(), "nope");
    }
}

#[tokio::test]
async fn conflict_predicates_tell_the_codes_apart() {
    let held = get_error(error_body(409, "Lock is held", Some("lock_held"))).await;
    assert!(held.is_lock_held() && !held.is_ownership_lost());
    let lost = get_error(error_body(
        409,
        "Lock ownership lost",
        Some("lock_ownership_lost"),
    ))
    .await;
    assert!(lost.is_ownership_lost() && !lost.is_lock_held());
    let other = get_error(error_body(400, "bad", Some("lock_held"))).await;
    assert!(!other.is_lock_held(), "only a 409 is a held lock");
}

#[tokio::test]
async fn retry_after_is_parsed_from_429() {
    let err = get_error(
        error_body(
            429,
            "lock request limit exceeded",
            Some("lock_rate_limited"),
        )
        .insert_header("Retry-After", "17"),
    )
    .await;
    assert!(matches!(err, Error::RateLimited(_)));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(17)));
    assert_eq!(err.code(), Some("lock_rate_limited"));

    let err = get_error(
        error_body(429, "x", None).insert_header("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"),
    )
    .await;
    // Beyond the reference SDKs (which give nil): the HTTP-date form is
    // read too, against the answer's own Date. A past date is zero.
    assert_eq!(err.retry_after(), Some(Duration::ZERO));
    let err = get_error(
        error_body(429, "x", None).insert_header("retry-after", "Fri, 01 Jan 2100 00:00:00 GMT"),
    )
    .await;
    assert!(err.retry_after().unwrap() > Duration::from_secs(365 * 24 * 3600));
    let err = get_error(error_body(429, "x", None)).await;
    assert_eq!(err.retry_after(), None);
}

#[tokio::test]
async fn non_json_error_body_keeps_status_and_a_short_excerpt() {
    let err =
        get_error(ResponseTemplate::new(502).set_body_string("<html>Bad gateway</html>")).await;
    assert!(matches!(err, Error::Server(_)));
    assert_eq!(err.status(), Some(502));
    assert_eq!(
        err.api_error().unwrap().message(),
        "not a JSON error object: an HTML page beginning \"Bad gateway\""
    );
    assert_eq!(err.code(), None);

    // A wrong URL's whole error page is named by its title, on one line.
    let page = format!(
        "<!DOCTYPE html>\n<html>\n<head>\n  <TITLE>404 Not Found</TITLE>\n</head>\n<body>{}</body></html>",
        "<p>The requested URL was not found on this server.</p>\n".repeat(200)
    );
    let err = get_error(ResponseTemplate::new(404).set_body_string(page)).await;
    assert_eq!(
        err.to_string(),
        "not found (HTTP 404: not a JSON error object: an HTML page, \"404 Not Found\")"
    );

    let err = get_error(ResponseTemplate::new(500).set_body_string("y".repeat(100_000))).await;
    let message = err.api_error().unwrap().message();
    assert!(message.chars().count() < 160, "kept {message}");
    assert!(message.ends_with("…\""), "{message}");

    let err = get_error(ResponseTemplate::new(503)).await;
    assert_eq!(err.status(), Some(503));
    assert!(!err.api_error().unwrap().message().is_empty());
}

#[tokio::test]
async fn display_is_one_short_sentence_and_source_is_not_repeated() {
    let err = get_error(error_body(409, "Lock is held", Some("lock_held"))).await;
    assert_eq!(
        err.to_string(),
        "lock conflict (HTTP 409 lock_held: Lock is held)"
    );
    assert!(std::error::Error::source(&err).is_none());

    let dropper = Dropper::start().await;
    let err = client(&dropper.url).locks().get("k").await.unwrap_err();
    let shown = err.to_string();
    let source = std::error::Error::source(&err).expect("transport errors keep their cause");
    assert!(!shown.contains(&source.to_string()), "{shown} / {source}");
}

#[tokio::test]
async fn secrets_never_appear_in_debug_or_display() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(error_body(409, "Lock is held", Some("lock_held")))
        .mount(&server)
        .await;
    Mock::given(method("PATCH"))
        .respond_with(lease_body(200, 1).set_delay(Duration::from_secs(5)))
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let locks = client.locks();
    let acquire = locks.acquire("k", Duration::from_secs(30)).token(TOKEN);
    let lease = LockLease::new("k", TOKEN, chrono::Utc::now(), 1);
    let mut shown = vec![
        format!("{client:?}"),
        format!("{locks:?}"),
        format!("{acquire:?}"),
        format!("{:?}", volcano::AcquireOptions::default().token(TOKEN)),
        format!(
            "{:?}",
            locks.hold("k", Duration::from_secs(30)).token(TOKEN)
        ),
        format!("{lease:?}"),
        format!("{:?}", locks.renew(&lease, Duration::from_secs(30))),
        format!("{:?}", locks.release(&lease)),
        format!(
            "{:?}",
            volcano::Client::builder()
                .anon_key(ANON_KEY)
                .service_key(SERVICE_KEY)
        ),
    ];
    let conflict = acquire.await.unwrap_err();
    let timeout = locks
        .renew(&lease, Duration::from_secs(30))
        .timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    let dropper = Dropper::start().await;
    let dropped = common::client(&dropper.url)
        .locks()
        .release(&lease)
        .await
        .unwrap_err();
    for err in [conflict, timeout, dropped] {
        shown.push(format!("{err:?}"));
        shown.push(err.to_string());
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            shown.push(format!("{cause:?} {cause}"));
            source = cause.source();
        }
    }
    for text in &shown {
        for secret in [SERVICE_KEY, ANON_KEY, TOKEN] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
    }
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error_a_dropped_answer_is_not() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = common::client(&format!("http://{addr}"))
        .locks()
        .get("k")
        .await
        .unwrap_err();
    let volcano::Error::Transport(refused) = &err else {
        panic!("{err:?}")
    };
    assert!(refused.is_connect(), "nothing was sent: {err}");
    assert!(!refused.is_timeout());

    let dropper = common::Dropper::start().await;
    let err = common::client(&dropper.url)
        .locks()
        .get("k")
        .await
        .unwrap_err();
    let volcano::Error::Transport(dropped) = &err else {
        panic!("{err:?}")
    };
    assert!(!dropped.is_connect(), "sent, then no answer: {err}");
}

#[tokio::test]
async fn a_refused_connection_names_the_server_and_the_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = volcano::Client::builder()
        .api_url(format!("http://127.0.0.1:{port}/prefix"))
        .service_key("secret-service-key")
        .build()
        .unwrap();
    let err = client.locks().get("k").await.unwrap_err();
    let text = err.to_string();
    assert_eq!(
        text,
        format!(
            "could not connect to the lock service at http://127.0.0.1:{port} (nothing was sent)"
        )
    );
    // The cause is in `source()` only: a chain (anyhow's `{:#}`, eyre,
    // tracing) prints it once.
    let chain: Vec<String> =
        std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect();
    let chain = chain.join(": ");
    assert_eq!(
        chain.to_lowercase().matches("refused").count(),
        1,
        "{chain}"
    );
    assert!(
        !text.contains("secret") && !text.contains("/prefix") && !text.contains("/locks"),
        "{text}"
    );
    assert!(matches!(&err, volcano::Error::Transport(t) if t.is_connect()));
}
