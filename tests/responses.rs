//! Strict decoding of success bodies (protocol 3.5, scenarios 9–21).

mod common;

use std::time::Duration;

use common::*;
use volcano::{Error, InvalidReason, LockLease};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

async fn get_with(body: &str) -> Result<volcano::LockState, Error> {
    let server = server().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(body.as_bytes().to_vec(), "application/json"),
        )
        .expect(1)
        .mount(&server)
        .await;
    client(&server.uri()).locks().get("k").await
}

fn reason(err: &Error) -> InvalidReason {
    match err {
        Error::InvalidResponse(e) => e.reason(),
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
}

/// Protocol scenario 9.
#[tokio::test]
async fn non_object_bodies() {
    for body in ["[]", "null", "\"held\"", "42", "", "not json", "{\"held\":"] {
        let err = get_with(body).await.unwrap_err();
        assert_eq!(reason(&err), InvalidReason::NotAnObject, "{body:?}");
        assert_eq!(err.status(), Some(200));
        assert!(err.request_id().is_some());
    }
}

/// Protocol scenarios 10, 21.
#[tokio::test]
async fn held_must_be_a_boolean() {
    for body in [
        r#"{"held":"yes"}"#,
        r#"{"held":1}"#,
        r#"{"held":null}"#,
        "{}",
    ] {
        let err = get_with(body).await.unwrap_err();
        assert_eq!(reason(&err), InvalidReason::HeldFlag, "{body}");
    }
}

/// Protocol scenarios 11, 12.
#[tokio::test]
async fn free_lock_states() {
    let state = get_with(r#"{"held":false}"#).await.unwrap();
    assert_eq!(
        (state.held(), state.expires_at(), state.fencing_token()),
        (false, None, None)
    );
    let state = get_with(r#"{"held":false,"fencing_token":7}"#)
        .await
        .unwrap();
    assert_eq!(state.fencing_token(), Some(7));
    assert!(!state.held());
}

/// Protocol scenarios 13, 14, 16, 17.
#[tokio::test]
async fn held_state_needs_valid_expiry_and_fencing_token() {
    let cases = [
        (r#"{"held":true,"fencing_token":1}"#, InvalidReason::Expiry),
        (
            r#"{"held":true,"expires_at":"2026-07-20T14:00:10Z"}"#,
            InvalidReason::FencingToken,
        ),
        (
            r#"{"held":true,"expires_at":[],"fencing_token":1}"#,
            InvalidReason::Expiry,
        ),
        (
            r#"{"held":true,"expires_at":"not-a-time","fencing_token":1}"#,
            InvalidReason::Expiry,
        ),
        (
            r#"{"held":true,"expires_at":"2026-07-20T14:00:10Z","fencing_token":"seven"}"#,
            InvalidReason::FencingToken,
        ),
        (
            r#"{"held":false,"fencing_token":1.5}"#,
            InvalidReason::FencingToken,
        ),
        (
            r#"{"held":false,"expires_at":"yesterday"}"#,
            InvalidReason::Expiry,
        ),
    ];
    for (body, expected) in cases {
        let err = get_with(body).await.unwrap_err();
        assert_eq!(reason(&err), expected, "{body}");
    }
}

#[tokio::test]
async fn held_state_decodes_fractional_seconds_and_large_fencing_tokens() {
    let state = get_with(
        r#"{"held":true,"expires_at":"2026-07-20T14:00:10.654321Z","fencing_token":9007199254740993}"#,
    )
    .await
    .unwrap();
    assert!(state.held());
    assert_eq!(state.fencing_token(), Some(9_007_199_254_740_993)); // 2^53 + 1, exact
    assert_eq!(
        state.expires_at().unwrap().to_rfc3339(),
        "2026-07-20T14:00:10.654321+00:00"
    );
}

#[tokio::test]
async fn i64_max_fencing_token_round_trips_and_beyond_is_rejected() {
    let server = server().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_body_raw(
            format!(
                r#"{{"expires_at":"{EXPIRES_AT}","fencing_token":{}}}"#,
                i64::MAX
            ),
            "application/json",
        ))
        .mount(&server)
        .await;
    let lease = client(&server.uri())
        .locks()
        .acquire("k", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(lease.fencing_token(), i64::MAX);

    let server = common::server().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(201).set_body_raw(
            format!(r#"{{"expires_at":"{EXPIRES_AT}","fencing_token":9223372036854775808}}"#),
            "application/json",
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let client = client(&server.uri());
    let err = client
        .locks()
        .acquire("k", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), InvalidReason::FencingToken);
    // The lease it cannot use is undone in the background.
    assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
}

/// Protocol scenario 20.
#[tokio::test]
async fn renew_without_expiry_is_invalid_and_not_retried() {
    let server = server().await;
    Mock::given(method("PATCH"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(serde_json::json!({"fencing_token": 3})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let lease = LockLease::new("k", TOKEN, chrono::Utc::now(), 3);
    let err = client(&server.uri())
        .locks()
        .renew(&lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), InvalidReason::Expiry);
    assert_eq!(err.status(), Some(200));
}

#[tokio::test]
async fn renewal_keeps_the_servers_fencing_token() {
    let server = server().await;
    Mock::given(method("PATCH"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"expires_at": EXPIRES_AT, "fencing_token": 8})),
        )
        .mount(&server)
        .await;
    let lease = LockLease::new("k", TOKEN, chrono::Utc::now(), 7);
    let renewed = client(&server.uri())
        .locks()
        .renew(&lease, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(renewed.fencing_token(), 8);
    assert_eq!(
        renewed.expires_at().to_rfc3339(),
        "2026-07-20T14:00:10+00:00"
    );
}

#[tokio::test]
async fn oversized_success_body_is_rejected_not_buffered() {
    let big = format!(r#"{{"held":false,"pad":"{}"}}"#, "x".repeat(200 * 1024));
    let err = get_with(&big).await.unwrap_err();
    assert_eq!(reason(&err), InvalidReason::TooLarge);
}

#[tokio::test]
async fn unknown_members_are_ignored_for_forward_compatibility() {
    let state = get_with(r#"{"held":false,"region":"eu"}"#).await.unwrap();
    assert!(!state.held());
}

#[tokio::test]
async fn release_and_force_release_ignore_a_204_body_and_reject_200() {
    let server = server().await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({})))
        .expect(2)
        .mount(&server)
        .await;
    let locks = client(&server.uri()).locks();
    let lease = LockLease::new("k", TOKEN, chrono::Utc::now(), 3);
    for err in [
        locks.release(&lease).await.unwrap_err(),
        locks.force_release("k").await.unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnexpectedStatus(_)), "{err:?}");
        assert_eq!(err.status(), Some(200));
    }
}
