//! Every rule of the lock service, checked over raw HTTP (plain reqwest).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use volcano_mock_server::{Fault, FaultKind, InvalidFault, MockServer, Operation};

const A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
const RID: &str = "11111111-2222-4333-8444-555555555555";

struct Raw {
    http: reqwest::Client,
    url: String,
    key: String,
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn code(&self) -> Option<&str> {
        self.body.get("code").and_then(Value::as_str)
    }
    fn fence(&self) -> i64 {
        self.body["fencing_token"].as_i64().expect("fencing token")
    }
    fn expires(&self) -> chrono::DateTime<chrono::Utc> {
        self.body["expires_at"].as_str().unwrap().parse().unwrap()
    }
}

impl Raw {
    fn new(server: &MockServer) -> Raw {
        Raw {
            http: reqwest::Client::new(),
            url: server.url().to_owned(),
            key: server.service_key().to_owned(),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Answer {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .header("x-volcano-request-id", RID);
        if let Some(token) = token {
            request = request.header("x-volcano-lock-token", token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.expect("mock server answers");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            // Not JSON (a gateway's page): the text itself.
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn acquire(&self, key: &str, token: &str, ttl: u64) -> Answer {
        let body = json!({ "ttl_seconds": ttl }).to_string();
        self.send(
            Method::POST,
            &format!("/locks/{key}/lease"),
            Some(token),
            Some(&body),
        )
        .await
    }
    async fn renew(&self, key: &str, token: &str, ttl: u64) -> Answer {
        let body = json!({ "ttl_seconds": ttl }).to_string();
        self.send(
            Method::PATCH,
            &format!("/locks/{key}/lease"),
            Some(token),
            Some(&body),
        )
        .await
    }
    async fn release(&self, key: &str, token: &str) -> Answer {
        self.send(
            Method::DELETE,
            &format!("/locks/{key}/lease"),
            Some(token),
            None,
        )
        .await
    }
    async fn get(&self, key: &str) -> Answer {
        self.send(Method::GET, &format!("/locks/{key}"), None, None)
            .await
    }
    async fn force_release(&self, key: &str) -> Answer {
        self.send(Method::DELETE, &format!("/locks/{key}"), None, None)
            .await
    }
}

/// A gateway's own page of `status`, not the service's error envelope: a
/// client cannot read it as the service's answer.
fn assert_gateway_page(answer: &Answer, status: u16) {
    assert_eq!(answer.status.as_u16(), status, "{:?}", answer.body);
    let page = answer.body.as_str().unwrap_or_default();
    assert!(
        page.contains("upstream"),
        "a gateway's page: {:?}",
        answer.body
    );
    assert_eq!(
        answer.headers["content-type"], "text/html",
        "{:?}",
        answer.headers
    );
}

fn assert_error(answer: &Answer, status: u16, code: Option<&str>) {
    assert_eq!(answer.status.as_u16(), status, "{:?}", answer.body);
    assert!(
        answer.body["error"].is_string(),
        "error envelope: {:?}",
        answer.body
    );
    assert_eq!(answer.code(), code, "{:?}", answer.body);
}

#[tokio::test]
async fn auth_needs_the_service_key() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let url = format!("{}/locks/k", server.url());
    let none = http
        .get(&url)
        .header("x-volcano-request-id", RID)
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let wrong = http
        .get(&url)
        .bearer_auth("nope")
        .header("x-volcano-request-id", RID)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let anon = http
        .get(&url)
        .bearer_auth(server.anon_key())
        .header("x-volcano-request-id", RID)
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 403);
    let body: Value = anon.json().await.unwrap();
    assert!(body["error"].is_string() && body.get("code").is_none());
    assert_eq!(raw.get("k").await.status, 200);
}

#[tokio::test]
async fn malformed_requests_get_400_and_change_nothing() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let lease = "/locks/k/lease";
    let cases: Vec<(Method, String, Option<&str>, Option<String>)> = vec![
        (
            Method::POST,
            "/locks/-k/lease".into(),
            Some(A),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            format!("/locks/{}/lease", "k".repeat(129)),
            Some(A),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            "/locks/a%2Fb/lease".into(),
            Some(A),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            "/locks/%ZZ/lease".into(),
            Some(A),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            None,
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some("not-a-uuid"),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some("aaaaaaaaaaaa4aaa8aaaaaaaaaaaaaaaaaaa"),
            Some(r#"{"ttl_seconds":30}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":4}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":7776001}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":30.5}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":"30"}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":30,"extra":true}"#.into()),
        ),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(r#"{"ttl_seconds":30"#.into()),
        ),
        (Method::POST, lease.into(), Some(A), None),
        (
            Method::POST,
            lease.into(),
            Some(A),
            Some(format!(
                r#"{{"ttl_seconds":30,"pad":"{}"}}"#,
                "x".repeat(70_000)
            )),
        ),
        (Method::PATCH, lease.into(), Some(A), Some("[]".into())),
        (Method::DELETE, lease.into(), Some("zzz"), None),
        (Method::GET, "/locks/k%20k".into(), None, None),
    ];
    for (method, path, token, body) in cases {
        let answer = raw
            .send(method.clone(), &path, token, body.as_deref())
            .await;
        assert_error(&answer, 400, None);
        let _ = (method, path);
    }
    let missing_rid = reqwest::Client::new()
        .get(format!("{}/locks/k", server.url()))
        .bearer_auth(server.service_key())
        .send()
        .await
        .unwrap();
    assert_eq!(missing_rid.status(), 400);
    assert!(server.locks().is_empty(), "nothing was applied");
}

#[tokio::test]
async fn bodies_over_64_kib_are_refused_on_every_route() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    assert_eq!(raw.acquire("job", A, 30).await.status, 201);
    let big = "x".repeat(70 * 1024);
    let small = "x".repeat(1024);
    for (method, path, token) in [
        (Method::DELETE, "/locks/job/lease", Some(A)),
        (Method::GET, "/locks/job", None),
        (Method::DELETE, "/locks/job", None),
    ] {
        let answer = raw.send(method.clone(), path, token, Some(&big)).await;
        assert_error(&answer, 400, None);
        assert_eq!(server.locks().len(), 1, "{method} {path} changed nothing");
        // A small body is still ignored.
        let allowed = raw.send(method.clone(), path, token, Some(&small)).await;
        assert!(
            allowed.status.is_success(),
            "{method} {path}: {:?}",
            allowed.body
        );
        if server.locks().is_empty() {
            assert_eq!(raw.acquire("job", A, 30).await.status, 201);
        }
    }

    // Each would be accepted if it were small.
    let pad = "x".repeat(70 * 1024);
    let http = reqwest::Client::new();
    let control = |path: &str| format!("{}/__mock/{path}", server.url());
    let journal = server.requests().len();
    let clock = server.now();
    for (method, path, body) in [
        (
            Method::POST,
            "faults",
            format!(r#"{{"kind":"status","status":503,"pad":"{pad}"}}"#),
        ),
        (
            Method::POST,
            "advance",
            format!(r#"{{"seconds":3600,"pad":"{pad}"}}"#),
        ),
        (Method::POST, "reset", pad.clone()),
        (Method::GET, "locks", pad.clone()),
    ] {
        let response = http
            .request(method.clone(), control(path))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{method} /__mock/{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{body}");
    }
    assert_eq!(server.requests().len(), journal, "the reset was refused");
    assert_eq!(server.locks().len(), 1);
    assert!(
        server.now() - clock < chrono::TimeDelta::minutes(30),
        "no advance"
    );
    assert_eq!(raw.get("job").await.status, 200, "no fault was added");
}

#[tokio::test]
async fn unknown_paths_and_methods() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    assert_error(&raw.send(Method::GET, "/nope", None, None).await, 404, None);
    assert_error(
        &raw.send(Method::GET, "/locks/a/b/c", None, None).await,
        404,
        None,
    );
    let put = raw.send(Method::PUT, "/locks/k", None, None).await;
    assert_error(&put, 405, None);
    assert_eq!(put.headers["allow"], "GET, DELETE");
    assert_error(
        &raw.send(Method::GET, "/locks/k/lease", None, None).await,
        405,
        None,
    );
}

#[tokio::test]
async fn acquire_is_exclusive_and_idempotent_per_token() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let first = raw.acquire("job", A, 30).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.fence(), 1);
    assert_eq!(
        first.body.as_object().unwrap().len(),
        2,
        "only expires_at and fencing_token"
    );
    assert_error(&raw.acquire("job", B, 30).await, 409, Some("lock_held"));

    server.advance(Duration::from_secs(10));
    let again = raw.acquire("job", A, 5).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.fence(), 1, "same token keeps its fencing token");
    assert!(
        again.expires() < first.expires(),
        "re-acquire resets expiry to now + ttl (shorter here)"
    );

    // Other keys are independent.
    assert_eq!(raw.acquire("other", B, 30).await.status, 201);
}

#[tokio::test]
async fn own_lapsed_lease_is_ownership_lost_until_the_grace_ends() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    raw.acquire("job", A, 5).await;
    server.advance(Duration::from_millis(5_300));
    assert_error(
        &raw.acquire("job", A, 5).await,
        409,
        Some("lock_ownership_lost"),
    );
    assert_error(&raw.acquire("job", B, 5).await, 409, Some("lock_held"));
    assert_eq!(
        raw.get("job").await.body["held"],
        true,
        "held through the grace"
    );
    server.advance(Duration::from_millis(800));
    assert_eq!(raw.get("job").await.body, json!({"held": false}));
    let taken = raw.acquire("job", B, 5).await;
    assert_eq!((taken.status.as_u16(), taken.fence()), (201, 2));
}

#[tokio::test]
async fn renew_only_by_the_owner_and_more_than_one_second_before_expiry() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let acquired = raw.acquire("job", A, 10).await;
    assert_error(
        &raw.renew("job", B, 10).await,
        409,
        Some("lock_ownership_lost"),
    );
    assert_error(
        &raw.renew("free", A, 10).await,
        409,
        Some("lock_ownership_lost"),
    );

    server.advance(Duration::from_secs(5));
    let renewed = raw.renew("job", A, 60).await;
    assert_eq!(renewed.status, 200);
    assert_eq!(renewed.fence(), acquired.fence());
    let gained = renewed.expires() - acquired.expires();
    assert!(
        gained >= chrono::TimeDelta::seconds(54) && gained <= chrono::TimeDelta::seconds(56),
        "{gained}"
    );

    // Shorter ttl shortens the lease.
    let shorter = raw.renew("job", A, 5).await;
    assert!(shorter.expires() < renewed.expires());
    // 0.9 s before expiry is too late.
    server.advance(Duration::from_millis(4_100));
    assert_error(
        &raw.renew("job", A, 5).await,
        409,
        Some("lock_ownership_lost"),
    );
}

#[tokio::test]
async fn release_rules() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    assert_eq!(
        raw.release("job", A).await.status,
        204,
        "absent lock releases fine"
    );
    raw.acquire("job", A, 30).await;
    assert_error(
        &raw.release("job", B).await,
        409,
        Some("lock_ownership_lost"),
    );
    let released = raw.release("job", A).await;
    assert_eq!(released.status, 204);
    assert_eq!(released.body, Value::Null, "204 has no body");
    assert_eq!(raw.get("job").await.body, json!({"held": false}));
    assert_eq!(raw.release("job", A).await.status, 204, "idempotent");
}

#[tokio::test]
async fn force_release_always_204() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    assert_eq!(raw.force_release("job").await.status, 204);
    raw.acquire("job", A, 30).await;
    assert_eq!(raw.force_release("job").await.status, 204);
    assert_eq!(raw.get("job").await.body, json!({"held": false}));
}

#[tokio::test]
async fn fencing_tokens_rise_across_release_expiry_and_force_release() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let tokens = [
        A,
        B,
        "cccccccc-cccc-4ccc-8ccc-cccccccccccc",
        "dddddddd-dddd-4ddd-8ddd-dddddddddddd",
    ];
    let mut fences = vec![raw.acquire("job", tokens[0], 30).await.fence()];
    raw.release("job", tokens[0]).await;
    fences.push(raw.acquire("job", tokens[1], 5).await.fence());
    server.advance(Duration::from_secs(7)); // expiry + grace: takeover
    fences.push(raw.acquire("job", tokens[2], 30).await.fence());
    raw.force_release("job").await;
    fences.push(raw.acquire("job", tokens[3], 30).await.fence());
    assert_eq!(fences, [1, 2, 3, 4]);
    let state = raw.get("job").await;
    assert_eq!(state.body["fencing_token"], 4);
    // Reset forgets leases but never reuses a fencing token.
    server.reset();
    assert_eq!(raw.acquire("job", A, 30).await.fence(), 5);
}

#[tokio::test]
async fn ninety_day_cap_is_absolute() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let start = raw.acquire("job", A, 7_776_000).await.expires();
    server.advance(Duration::from_secs(89 * 86_400));
    let renewed = raw.renew("job", A, 7_776_000).await;
    assert_eq!(renewed.status, 200);
    assert_eq!(
        renewed.expires(),
        start,
        "renewal cannot pass acquisition + 90 days"
    );
    let reacquired = raw.acquire("job", A, 7_776_000).await;
    assert_eq!(reacquired.expires(), start);
    server.advance(Duration::from_secs(86_400));
    assert_error(
        &raw.renew("job", A, 30).await,
        409,
        Some("lock_ownership_lost"),
    );
}

#[tokio::test]
async fn quota_gives_429_with_retry_after() {
    let server = MockServer::builder().rate_limit(3).start().await;
    let raw = Raw::new(&server);
    for _ in 0..3 {
        assert_eq!(raw.get("job").await.status, 200);
    }
    let limited = raw.get("job").await;
    assert_error(&limited, 429, Some("lock_rate_limited"));
    let retry_after: u64 = limited.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    server.advance(Duration::from_secs(retry_after));
    assert_eq!(raw.get("job").await.status, 200, "a new window");
}

#[tokio::test]
async fn concurrent_acquires_have_exactly_one_winner_per_round() {
    let server = MockServer::start().await;
    let raw = std::sync::Arc::new(Raw::new(&server));
    for round in 0..5 {
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let raw = raw.clone();
                tokio::spawn(async move {
                    let token = uuid::Uuid::new_v4().to_string();
                    let answer = raw.acquire("contended", &token, 30).await;
                    (answer.status.as_u16(), token)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            let (status, token) = task.await.unwrap();
            match status {
                201 => winners.push(token),
                409 => {}
                other => panic!("unexpected status {other}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        assert_eq!(raw.release("contended", &winners[0]).await.status, 204);
    }
}

#[tokio::test]
async fn faults_status_is_not_applied_drop_is_applied_reset_is_not() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);

    server.inject(Fault::status(503).on(Operation::Acquire).times(1));
    assert_error(
        &raw.acquire("job", A, 30).await,
        503,
        Some("lock_service_unavailable"),
    );
    assert!(
        server.locks().is_empty(),
        "a 503 fault does not apply the request"
    );

    server.inject(Fault::drop_response().on(Operation::Acquire).times(1));
    let body = json!({ "ttl_seconds": 30 }).to_string();
    let dropped = reqwest::Client::new()
        .post(format!("{}/locks/job/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", A)
        .body(body.clone())
        .send()
        .await;
    assert!(dropped.is_err(), "connection closed without an answer");
    assert_eq!(server.locks().len(), 1, "the dropped acquire was applied");

    server.inject(Fault::reset().on(Operation::Release).times(1));
    let reset = reqwest::Client::new()
        .delete(format!("{}/locks/job/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", A)
        .send()
        .await;
    assert!(reset.is_err());
    assert_eq!(server.locks().len(), 1, "a reset happens before applying");

    let faults: Vec<_> = server.requests().iter().map(|r| r.fault).collect();
    assert_eq!(
        faults,
        [
            Some(FaultKind::Status { status: 503 }),
            Some(FaultKind::DropResponse),
            Some(FaultKind::Reset)
        ]
    );
    assert_eq!(
        raw.release("job", A).await.status,
        204,
        "faults were used up"
    );
}

#[tokio::test]
async fn a_garbled_response_is_applied_and_cannot_be_read() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    server.inject(Fault::garbled_response().on(Operation::Acquire).times(1));
    let garbled = reqwest::Client::new()
        .post(format!("{}/locks/job/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", A)
        .body(json!({ "ttl_seconds": 30 }).to_string())
        .send()
        .await
        .expect("answered");
    assert_eq!(garbled.status(), StatusCode::CREATED, "the status is kept");
    let text = garbled.text().await.unwrap();
    assert!(
        serde_json::from_str::<Value>(&text).is_err(),
        "not JSON: {text}"
    );
    assert_eq!(server.locks().len(), 1, "the garbled acquire was applied");
    // A 204 has no body to garble: it is sent as it is (the fault is
    // used up all the same, and the journal shows none).
    server.inject(Fault::garbled_response().on(Operation::Release).times(1));
    assert_eq!(raw.release("job", A).await.status, 204);
    assert!(server.locks().is_empty());
    let faults: Vec<_> = server.requests().iter().map(|r| r.fault).collect();
    assert_eq!(faults, [Some(FaultKind::GarbledResponse), None]);
}

/// A gateway answers 504 after its patience; the acquire behind it goes
/// on and takes the key later, under the token its client was told
/// nothing about.
#[tokio::test]
async fn a_gateway_answers_5xx_and_its_request_takes_the_key_later() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let (patience, applied_after) = (Duration::from_millis(400), Duration::from_millis(1500));
    server.inject(
        Fault::gateway(504, patience, applied_after)
            .on(Operation::Acquire)
            .times(1),
    );
    let started = tokio::time::Instant::now();
    let answered = raw.acquire("job", A, 30).await;
    let waited = started.elapsed();
    assert_gateway_page(&answered, 504);
    assert!(
        waited >= patience && waited < applied_after,
        "answered after {waited:?}"
    );
    // Not applied yet: the key is free, and the journal has no acquire.
    assert_eq!(raw.get("job").await.body["held"], false);
    assert!(server
        .requests()
        .iter()
        .all(|r| r.operation != Operation::Acquire));
    let applied = server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(5))
        .await
        .expect("the acquire behind the gateway was applied");
    assert!(
        started.elapsed() >= applied_after,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        applied.fault,
        Some(FaultKind::Gateway {
            status: 504,
            patience_ms: 400,
            apply_after_ms: 1500
        })
    );
    assert_eq!(applied.fencing_token, Some(1));
    assert_eq!(applied.request_id.as_deref(), Some(RID));
    // Held by A's token: B is refused, A re-acquires its own lease.
    let state = raw.get("job").await;
    assert_eq!(
        (state.body["held"].clone(), state.fence()),
        (json!(true), 1)
    );
    assert_error(&raw.acquire("job", B, 30).await, 409, Some("lock_held"));
    let again = raw.acquire("job", A, 30).await;
    assert_eq!((again.status.as_u16(), again.fence()), (201, 1));
}

/// Sends an acquire of "job" with token A and waits until its lease shows
/// (fence 1), each look a full request (not a sleep): it must show while
/// the acquire's answer is still held, within `within`. Returns the
/// acquire, still waiting for its answer.
async fn applied_before_answered(
    raw: &std::sync::Arc<Raw>,
    within: Duration,
) -> tokio::task::JoinHandle<Answer> {
    let started = tokio::time::Instant::now();
    let acquire = tokio::spawn({
        let raw = raw.clone();
        async move { raw.acquire("job", A, 30).await }
    });
    loop {
        let state = raw.get("job").await;
        if state.body["held"] == true {
            assert_eq!(state.fence(), 1);
            return acquire;
        }
        assert!(
            !acquire.is_finished() && started.elapsed() < within,
            "the lease was not there before the answer was sent"
        );
    }
}

/// Applied before the gateway gives up (the lease is there while the
/// answer is due), and applied when its client has gone.
#[tokio::test]
async fn a_gateways_request_is_applied_whether_or_not_its_client_waits() {
    let server = MockServer::start().await;
    let raw = std::sync::Arc::new(Raw::new(&server));
    let patience = Duration::from_millis(1500);
    server.inject(
        Fault::gateway(503, patience, Duration::from_millis(100))
            .on(Operation::Acquire)
            .times(1),
    );
    let started = tokio::time::Instant::now();
    let acquire = applied_before_answered(&raw, patience).await;
    let answered = acquire.await.unwrap();
    assert!(started.elapsed() >= patience, "{:?}", started.elapsed());
    assert_gateway_page(&answered, 503);

    // A client that gives up before the gateway answers: its acquire is
    // applied all the same.
    server.inject(
        Fault::gateway(502, Duration::from_secs(30), Duration::from_millis(300))
            .on(Operation::Acquire)
            .times(1),
    );
    let gave_up = reqwest::Client::new()
        .post(format!("{}/locks/other/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", B)
        .body(r#"{"ttl_seconds":30}"#)
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(gave_up.unwrap_err().is_timeout());
    let applied = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let state = raw.get("other").await;
            if state.body["held"] == true {
                break state;
            }
        }
    })
    .await
    .expect("applied though its client had gone");
    assert_error(&raw.acquire("other", A, 30).await, 409, Some("lock_held"));
    let again = raw.acquire("other", B, 30).await;
    assert_eq!(
        (again.status.as_u16(), again.fence()),
        (201, applied.fence())
    );
    let journal = server.requests();
    let other = journal
        .iter()
        .find(|r| r.operation == Operation::Acquire && r.key == "other")
        .expect("journaled");
    assert_eq!(other.status, Some(201), "the service's status");
}

#[tokio::test]
async fn a_gateway_fault_over_http_json_and_its_status_checked() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let faults = format!("{}/__mock/faults", server.url());
    let added = http
        .post(&faults)
        .body(r#"{"kind":"gateway","status":504,"patience_ms":400,"apply_after_ms":1500,"operation":"acquire","times":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let started = tokio::time::Instant::now();
    assert_gateway_page(&raw.acquire("job", A, 30).await, 504);
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(raw.get("job").await.body["held"], false);
    let applied = server
        .wait_for(Operation::Acquire, 201, Duration::from_secs(5))
        .await
        .expect("applied");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(
        applied.fault,
        Some(FaultKind::Gateway {
            status: 504,
            patience_ms: 400,
            apply_after_ms: 1500
        })
    );
    // The journal over HTTP shows the fault as JSON went in.
    let journal: Value = http
        .get(format!("{}/__mock/requests", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entry = journal
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["operation"] == "acquire")
        .unwrap();
    assert_eq!(
        entry["fault"],
        json!({"kind": "gateway", "status": 504, "patience_ms": 400, "apply_after_ms": 1500})
    );
    assert_eq!(entry["status"], 201);

    // A gateway answers with a server error, nothing else.
    for status in [200, 409, 429] {
        let body =
            format!(r#"{{"kind":"gateway","status":{status},"patience_ms":1,"apply_after_ms":1}}"#);
        let refused = http.post(&faults).body(body).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{status}");
        let said = refused.text().await.unwrap();
        assert!(
            said.contains(&format!("gateway status {status} is not a server error"))
                && said.contains("500..=599"),
            "{said}"
        );
        let from_rust = server.try_inject(Fault::gateway(status, Duration::ZERO, Duration::ZERO));
        assert_eq!(from_rust, Err(InvalidFault::GatewayStatus(status)));
    }
    assert_eq!(
        raw.release("job", A).await.status,
        204,
        "no refused fault was added"
    );
}

#[tokio::test]
async fn delay_fault_holds_the_request() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on(Operation::Get)
            .times(1),
    );
    let started = std::time::Instant::now();
    assert_eq!(raw.get("job").await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn delay_response_applies_before_answering() {
    let server = MockServer::start().await;
    let raw = std::sync::Arc::new(Raw::new(&server));
    let hold = Duration::from_secs(2);
    server.inject(Fault::delay_response(hold).on(Operation::Acquire).times(1));
    let started = tokio::time::Instant::now();
    let acquire = applied_before_answered(&raw, hold).await;
    assert!(
        !acquire.is_finished(),
        "the answer is held after the lease exists"
    );
    let answer = acquire.await.unwrap();
    assert!(started.elapsed() >= hold, "{:?}", started.elapsed());
    assert_eq!((answer.status.as_u16(), answer.fence()), (201, 1));
    let acquires: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.operation == Operation::Acquire)
        .collect();
    assert_eq!(acquires.len(), 1);
    assert_eq!(
        acquires[0].fault,
        Some(FaultKind::DelayResponse { ms: 2_000 })
    );
    assert_eq!(acquires[0].status, Some(201));
}

#[tokio::test]
async fn delay_response_is_journaled_even_when_the_client_gives_up() {
    let server = MockServer::start().await;
    server.inject(Fault::delay_response(Duration::from_secs(30)).on(Operation::Acquire));
    let gave_up = reqwest::Client::new()
        .post(format!("{}/locks/job/lease", server.url()))
        .bearer_auth(server.service_key())
        .header("x-volcano-request-id", RID)
        .header("x-volcano-lock-token", A)
        .body(r#"{"ttl_seconds":30}"#)
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(gave_up.unwrap_err().is_timeout());
    let journal = server.requests();
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!(journal[0].status, Some(201));
    assert_eq!(journal[0].fencing_token, Some(1));
    assert_eq!(
        journal[0].fault,
        Some(FaultKind::DelayResponse { ms: 30_000 })
    );
    assert_eq!(server.locks().len(), 1, "applied though never answered");
}

#[tokio::test]
async fn delay_response_over_http_json_and_with_a_status_fault() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let faults = format!("{}/__mock/faults", server.url());
    let added = http
        .post(&faults)
        .body(r#"{"kind":"delay_response","ms":400,"operation":"acquire","times":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let started = tokio::time::Instant::now();
    assert_eq!(raw.acquire("job", A, 30).await.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(400));
    // Used up: the next acquire is not held.
    let started = tokio::time::Instant::now();
    assert_eq!(raw.acquire("job", A, 30).await.status, 201);
    assert!(started.elapsed() < Duration::from_millis(400));

    // Two add up, and a status fault's answer is what waits.
    for body in [
        r#"{"kind":"delay_response","ms":200,"operation":"renew","times":1}"#,
        r#"{"kind":"delay_response","ms":300,"operation":"renew","times":1}"#,
        r#"{"kind":"status","status":503,"operation":"renew","times":1}"#,
    ] {
        let added = http.post(&faults).body(body).send().await.unwrap();
        assert_eq!(added.status(), 201, "{body}");
    }
    let started = tokio::time::Instant::now();
    let renewed = raw.renew("job", A, 60).await;
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_error(&renewed, 503, Some("lock_service_unavailable"));
    let journal = server.requests();
    let last = journal.last().unwrap();
    assert_eq!(
        (last.operation, last.status, last.fault),
        (
            Operation::Renew,
            Some(503),
            Some(FaultKind::Status { status: 503 })
        )
    );
    assert_eq!(journal[0].fault, Some(FaultKind::DelayResponse { ms: 400 }));
}

#[tokio::test]
async fn huge_or_invalid_advances_get_400_and_the_server_keeps_working() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let advance = |body: &str| {
        http.post(format!("{}/__mock/advance", server.url()))
            .body(body.to_owned())
            .send()
    };
    let before = server.now();
    let u64_max = format!(r#"{{"seconds": {}}}"#, u64::MAX);
    for body in [
        u64_max.as_str(),
        r#"{"seconds": 1e300}"#,
        r#"{"seconds": 1e400}"#,
        r#"{"seconds": 1e15}"#, // a valid Duration, but past the year 9000
        r#"{"seconds": -1}"#,
        r#"{"seconds": NaN}"#,
        r#"{"seconds": "NaN"}"#,
    ] {
        let response = advance(body).await.expect("answered, not dropped");
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(error["error"].is_string(), "{body}: {error}");
    }
    let after = server.now();
    assert!(
        after >= before && after - before < chrono::TimeDelta::minutes(1),
        "{before} -> {after}"
    );
    let acquired = raw.acquire("job", A, 30).await;
    assert_eq!(acquired.status, 201);
    assert_eq!(raw.get("job").await.body["held"], true);
    assert_eq!(raw.release("job", A).await.status, 204);

    // Near the limit the lease arithmetic still works; one more step is
    // refused and the clock stays where it was.
    let near = advance(r#"{"seconds": 2e11}"#).await.unwrap();
    assert_eq!(near.status(), 200);
    let near: Value = near.json().await.unwrap();
    let near: chrono::DateTime<chrono::Utc> = near["now"].as_str().unwrap().parse().unwrap();
    assert!(near > before + chrono::TimeDelta::days(2_000_000));
    let refused = advance(r#"{"seconds": 2e11}"#).await.unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert!(
        refused["error"].as_str().unwrap().contains("9000-01-01"),
        "{refused}"
    );
    let now = server.now();
    assert!(now >= near && now - near < chrono::TimeDelta::minutes(1));
    let long = raw.acquire("far", B, 7_776_000).await;
    assert_eq!(long.status, 201);
    assert!(long.expires() >= near + chrono::TimeDelta::days(90));
    assert_eq!(raw.renew("far", B, 7_776_000).await.status, 200);
    assert_eq!(raw.get("far").await.body["held"], true);
}

#[tokio::test]
async fn try_advance_refuses_past_the_limit_and_advance_panics_in_the_caller() {
    let server = MockServer::start().await;
    let before = server.now();
    let err = server.try_advance(Duration::MAX).unwrap_err();
    assert!(err.to_string().contains("9000-01-01T00:00:00"), "{err}");
    assert_eq!(err.limit().to_rfc3339(), "9000-01-01T00:00:00+00:00");
    let unchanged = server.now();
    assert!(unchanged >= before && unchanged - before < chrono::TimeDelta::minutes(1));

    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        server.advance(Duration::from_secs(u64::MAX))
    }))
    .expect_err("advance panics past the limit");
    let message = panic.downcast_ref::<String>().expect("a formatted message");
    assert!(message.contains("9000-01-01T00:00:00"), "{message}");
    assert!(server.now() - before < chrono::TimeDelta::minutes(1));

    // The server never saw a panic: it keeps serving, and the clock moves.
    let raw = Raw::new(&server);
    assert_eq!(raw.acquire("job", A, 300).await.status, 201);
    let moved = server.try_advance(Duration::from_secs(60)).unwrap();
    assert!(moved >= before + chrono::TimeDelta::seconds(60));
    assert_eq!(raw.get("job").await.body["held"], true);
}

/// The one `Date` header of a response, which must be an IMF-fixdate.
fn date_of(headers: &reqwest::header::HeaderMap) -> chrono::DateTime<chrono::Utc> {
    let dates: Vec<_> = headers.get_all("date").iter().collect();
    assert_eq!(dates.len(), 1, "exactly one Date: {dates:?}");
    let text = dates[0].to_str().unwrap();
    assert!(text.len() == 29 && text.ends_with(" GMT"), "{text}");
    chrono::DateTime::parse_from_rfc2822(text)
        .unwrap()
        .with_timezone(&chrono::Utc)
}

#[tokio::test]
async fn every_response_is_dated_by_the_server_clock() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let control = |path: &str| format!("{}/__mock/{path}", server.url());
    let day = chrono::TimeDelta::days(1);
    server.advance(Duration::from_secs(86_400));
    let machine_before = chrono::Utc::now();

    let acquired = raw.acquire("job", A, 30).await;
    assert_eq!(acquired.status, 201);
    let lease = acquired.expires() - date_of(&acquired.headers);
    assert!(
        lease >= chrono::TimeDelta::seconds(30) && lease < chrono::TimeDelta::seconds(31),
        "expires_at - Date = {lease}"
    );

    let mut headers = vec![acquired.headers];
    for answer in [
        raw.acquire("job", B, 30).await,
        raw.renew("job", A, 30).await,
        raw.get("job").await,
        raw.release("job", A).await,
        raw.force_release("job").await,
        raw.get("-bad-key").await,
        raw.send(Method::GET, "/nope", None, None).await,
        raw.send(Method::PUT, "/locks/k", None, None).await,
    ] {
        headers.push(answer.headers);
    }
    let requests = [
        http.get(format!("{}/locks/k", server.url())),
        http.get(control("locks")),
        http.get(control("requests")),
        http.post(control("faults")).body("{}"),
        http.get(control("advance")),
        http.post(control("advance")).body(r#"{"seconds": -1}"#),
        http.post(control("reset")),
    ];
    for request in requests {
        headers.push(request.send().await.unwrap().headers().clone());
    }
    let machine_after = chrono::Utc::now();
    for headers in &headers {
        let date = date_of(headers);
        assert!(
            date >= machine_before + day - chrono::TimeDelta::seconds(1)
                && date <= machine_after + day + chrono::TimeDelta::seconds(2),
            "Date {date} is not a day ahead of {machine_before}"
        );
    }
}

#[tokio::test]
async fn a_held_answer_is_dated_when_it_was_applied() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    server.inject(
        Fault::delay_response(Duration::from_millis(1_500))
            .on(Operation::Acquire)
            .times(1),
    );
    let acquired = raw.acquire("job", A, 30).await;
    assert_eq!(acquired.status, 201);
    let date = date_of(&acquired.headers);
    let received = server.now();
    assert!(
        received - date >= chrono::TimeDelta::milliseconds(500),
        "Date {date} is not the time of applying (answer received at {received})"
    );
    let lease = acquired.expires() - date;
    assert!(
        lease >= chrono::TimeDelta::seconds(30) && lease < chrono::TimeDelta::seconds(31),
        "expires_at - Date = {lease}"
    );
}

#[tokio::test]
async fn journal_records_operation_key_request_id_and_status() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    raw.acquire("build:queue", A, 30).await;
    raw.get("build%3Aqueue").await;
    let journal = server.requests();
    assert_eq!(journal.len(), 2);
    assert_eq!(journal[0].operation, Operation::Acquire);
    assert_eq!(journal[0].key, "build:queue");
    assert_eq!(journal[0].request_id.as_deref(), Some(RID));
    assert_eq!(journal[0].status, Some(201));
    assert_eq!(journal[0].fencing_token, Some(1));
    assert_eq!(
        (journal[1].operation, journal[1].key.as_str()),
        (Operation::Get, "build:queue")
    );
    assert!(journal[0].seq < journal[1].seq);
}

#[tokio::test]
async fn expired_leases_are_swept() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    for i in 0..200 {
        raw.acquire(&format!("k{i}"), A, 5).await;
    }
    assert_eq!(server.lease_count(), 200);
    server.advance(Duration::from_secs(7));
    // The sweeper runs once a second; wait for it with a bound.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.lease_count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.lease_count(), 0);
}

#[tokio::test]
async fn control_api_over_http() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let control = |path: &str| format!("{}/__mock/{path}", server.url());

    let added = http
        .post(control("faults"))
        .body(r#"{"kind":"status","status":503,"operation":"get","times":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    assert_eq!(raw.get("job").await.status, 503);
    assert_eq!(raw.get("job").await.status, 200);

    let bad = http
        .post(control("faults"))
        .body(r#"{"kind":"explode"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    raw.acquire("job", A, 5).await;
    let locks: Value = http
        .get(control("locks"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(locks[0]["key"], "job");
    assert_eq!(locks[0]["held"], true);

    let advanced = http
        .post(control("advance"))
        .body(r#"{"seconds": 10}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(advanced.status(), 200);
    assert_eq!(raw.get("job").await.body, json!({"held": false}));

    let requests: Value = http
        .get(control("requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(requests.as_array().unwrap().len(), 4);
    assert_eq!(requests[0]["status"], 503);

    assert_eq!(
        http.post(control("reset")).send().await.unwrap().status(),
        204
    );
    assert!(server.requests().is_empty());
    assert_eq!(
        http.delete(control("faults"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
}

/// A misspelt member (`"time"` for `"times"`) would otherwise make a fault
/// that fails every request for ever: it is refused, by name, and nothing
/// is added.
#[tokio::test]
async fn a_fault_with_a_member_it_does_not_know_is_refused_by_name() {
    let server = MockServer::start().await;
    let raw = Raw::new(&server);
    let http = reqwest::Client::new();
    let faults = format!("{}/__mock/faults", server.url());
    for (body, unknown) in [
        (
            r#"{"kind":"status","status":503,"operation":"acquire","time":1}"#,
            "time",
        ),
        (r#"{"kind":"status","status":503,"ms":5}"#, "ms"),
        (r#"{"kind":"drop_response","status":503}"#, "status"),
        (r#"{"kind":"delay_response","delay_ms":5}"#, "delay_ms"),
        (
            r#"{"kind":"gateway","status":504,"patience_ms":5,"ms":5}"#,
            "ms",
        ),
    ] {
        let refused = http.post(&faults).body(body).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{body}");
        let said = refused.text().await.unwrap();
        assert!(
            said.contains(&format!("\\\"{unknown}\\\"")),
            "{body}: {said}"
        );
    }
    assert_eq!(
        raw.acquire("job", A, 30).await.status,
        201,
        "no fault was added"
    );
    // Every member it knows still reads, `ms` and `delay_ms` alike.
    let known = r#"{"kind":"delay","ms":1,"operation":"get","key":"job","times":1,"every":1}"#;
    let added = http.post(&faults).body(known).send().await.unwrap();
    assert_eq!(added.status(), 201);
    // The same from Rust: a fault read with serde refuses the member too,
    // so `try_inject` never sees it.
    let parsed = serde_json::from_str::<volcano_mock_server::Fault>(
        r#"{"kind":"status","status":503,"time":1}"#,
    );
    assert!(parsed.unwrap_err().to_string().contains("\"time\""));
}
