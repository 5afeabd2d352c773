//! Property tests of response handling: whatever the service answers
//! (any status, headers, body: random bytes, wrong JSON types, huge numbers,
//! deep nesting, 10 MB), every operation returns without panicking or
//! hanging, with a typed error that keeps the status.

mod common;

use std::time::Duration;

use common::{client_with_timeout, TOKEN};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use volcano::{Error, LockLease};

use wiremock::{Mock, MockServer, ResponseTemplate};

/// Statuses the service might send, biased to the interesting ones.
fn statuses() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => prop::sample::select(vec![200u16, 201, 204]),
        2 => prop::sample::select(vec![400u16, 401, 403, 404, 409, 422, 429, 500, 502, 503, 504]),
        1 => 200u16..600,
    ]
}

fn json_values() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        Just(json!("2026-07-20T14:00:10Z")),
        Just(json!("2026-07-20T14:00:10.123456789+05:30")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("held".to_owned()),
                    Just("expires_at".to_owned()),
                    Just("fencing_token".to_owned()),
                    Just("error".to_owned()),
                    Just("code".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Response bodies, from well-formed to hostile.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => json_values().prop_map(|v| v.to_string().into_bytes()),
        2 => prop::collection::vec(any::<u8>(), 0..512),
        1 => Just(br#"{"expires_at":"2026-07-20T14:00:10Z","fencing_token":7}"#.to_vec()),
        1 => Just(br#"{"held":true,"expires_at":"2026-07-20T14:00:10Z","fencing_token":7}"#.to_vec()),
        1 => Just(br#"{"held":false}"#.to_vec()),
        1 => Just(br#"{"expires_at":"2026-07-20T14:00:10Z","fencing_token":1e400}"#.to_vec()),
        1 => Just(br#"{"expires_at":"2026-07-20T14:00:10Z","fencing_token":123456789012345678901234567890}"#.to_vec()),
        1 => Just(br#"{"error":"x","code":{"nested":[1,2]}}"#.to_vec()),
        1 => (0usize..5_000).prop_map(|depth| format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()),
        1 => (0usize..5_000).prop_map(|depth| format!("{}1{}", r#"{"held":"#.repeat(depth), "}".repeat(depth)).into_bytes()),
    ]
}

fn retry_after() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        (0u64..100_000).prop_map(|n| Some(n.to_string())),
        "[ -~]{0,30}".prop_map(Some),
        Just(Some("18446744073709551616".to_owned())),
    ]
}

/// Checks one operation's result against what the server sent.
fn check(
    op: &str,
    success: u16,
    status: u16,
    result: Result<(), Error>,
) -> Result<(), TestCaseError> {
    match result {
        Ok(()) => prop_assert_eq!(status, success, "{} succeeded on {}", op, status),
        Err(err) => {
            prop_assert!(
                !matches!(
                    err,
                    Error::InvalidArgument(_) | Error::Transport(_) | Error::LockLost(_)
                ),
                "{op} on {status}: {err:?}"
            );
            prop_assert_eq!(
                err.status(),
                Some(status),
                "{} on {}: {:?}",
                op,
                status,
                err
            );
            prop_assert!(err.request_id().is_some(), "{op}: {err:?}");
            if status == success {
                prop_assert!(
                    matches!(err, Error::InvalidResponse(_)),
                    "{op} on {status}: {err:?}"
                );
            }
            let shown = err.to_string();
            prop_assert!(
                shown.len() < 2_000,
                "{op}: display too long: {} bytes",
                shown.len()
            );
        }
    }
    Ok(())
}

fn run_cases(cases: u32, bodies: impl Strategy<Value = Vec<u8>>) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MockServer::start());
    let locks = client_with_timeout(&server.uri(), Duration::from_secs(2)).locks();
    let lease = LockLease::new("k", TOKEN, chrono::Utc::now(), 1);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(statuses(), bodies, retry_after()),
            |(status, body, retry_after)| {
                runtime.block_on(async {
                    server.reset().await;
                    let mut template =
                        ResponseTemplate::new(status).set_body_raw(body, "application/json");
                    if let Some(value) = retry_after {
                        template = template.insert_header("retry-after", value.as_str());
                    }
                    Mock::given(wiremock::matchers::any())
                        .respond_with(template)
                        .mount(&server)
                        .await;
                    let ttl = Duration::from_secs(30);
                    let limit = Duration::from_secs(10);
                    let run = async {
                        check(
                            "acquire",
                            201,
                            status,
                            locks.acquire("k", ttl).await.map(drop),
                        )?;
                        check(
                            "renew",
                            200,
                            status,
                            locks.renew(&lease, ttl).await.map(drop),
                        )?;
                        check("get", 200, status, locks.get("k").await.map(drop))?;
                        check("release", 204, status, locks.release(&lease).await)?;
                        check("force_release", 204, status, locks.force_release("k").await)
                    };
                    tokio::time::timeout(limit, run)
                        .await
                        .map_err(|_| TestCaseError::fail("an operation hung"))?
                })
            },
        )
        .unwrap();
}

#[test]
fn arbitrary_answers_give_typed_errors() {
    let cases = std::env::var("VOLCANO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    run_cases(cases, bodies());
}

#[test]
fn ten_megabyte_bodies_are_not_buffered() {
    run_cases(8, Just(vec![b'x'; 10 << 20]));
}
