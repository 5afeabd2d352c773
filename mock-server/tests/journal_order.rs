//! The journal's order for a key is the order in which the store changed
//! it: under many clients racing for one key on a multi-threaded server, a
//! grant is never journaled while another lease of the key is live, and
//! times never go back. (A request that read the clock and was paused
//! before it took the key used to be journaled before the release that
//! freed it, or with an earlier time: a test reading the journal then saw
//! two holders of one key at once.)

use std::sync::Arc;

use reqwest::StatusCode;
use volcano_mock_server::{MockServer, Operation};

const KEY: &str = "raced";
const CLIENTS: usize = 8;
const ROUNDS: usize = 150;

async fn race(server: Arc<MockServer>, http: reqwest::Client) {
    let token = uuid::Uuid::new_v4().to_string();
    let url = format!("{}/locks/{KEY}/lease", server.url());
    for _ in 0..ROUNDS {
        let send = |method: reqwest::Method| {
            let request = http
                .request(method, &url)
                .bearer_auth(server.service_key())
                .header("x-volcano-request-id", uuid::Uuid::new_v4().to_string())
                .header("x-volcano-lock-token", &token);
            request
        };
        let acquired = send(reqwest::Method::POST)
            .header("content-type", "application/json")
            .body(r#"{"ttl_seconds":60}"#)
            .send()
            .await
            .expect("answer");
        if acquired.status() == StatusCode::CREATED {
            let released = send(reqwest::Method::DELETE).send().await.expect("answer");
            assert_eq!(released.status(), StatusCode::NO_CONTENT);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_keys_journal_is_in_the_order_its_lease_changed() {
    let server = Arc::new(MockServer::start().await);
    let http = reqwest::Client::new();
    let racers: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(race(server.clone(), http.clone())))
        .collect();
    for racer in racers {
        racer.await.expect("racer");
    }
    let journal = server.requests();
    let mut holder: Option<i64> = None;
    let mut last_at = None;
    let mut grants = 0;
    for r in journal.iter().filter(|r| r.key == KEY) {
        assert!(
            last_at.is_none_or(|at| r.at >= at),
            "time went back at seq {}: {r:?}",
            r.seq
        );
        last_at = Some(r.at);
        match (r.operation, r.status) {
            (Operation::Acquire, Some(201)) => {
                assert_eq!(
                    holder, None,
                    "seq {}: granted while fencing token {holder:?} held the key",
                    r.seq
                );
                holder = r.fencing_token;
                grants += 1;
            }
            (Operation::Release, Some(204)) => holder = None,
            _ => {}
        }
    }
    assert!(grants >= CLIENTS, "the key changed hands {grants} times");
}
