//! Observing a key (`locks.observe`), both sides of its trade-off: how
//! late each kind of change is seen, and how many requests that costs, on
//! the mock server in real time.
//!
//! ```sh
//! cargo bench -p volcano --bench observing -- release  # a release, poll 2 s and 10 s (~2 min)
//! cargo bench -p volcano --bench observing -- expiry   # a holder that stops renewing (~1 min)
//! cargo bench -p volcano --bench observing -- steady   # requests a minute while a holder renews (~1 min)
//! cargo bench -p volcano --bench observing             # all three
//! ```

use std::time::{Duration, Instant};

use volcano::{ChangeKind, Client, Observe};
use volcano_mock_server::{MockServer, Operation};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let which = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "all".to_owned());
    let all = which == "all";
    if all || which == "release" {
        for poll in [2, 10] {
            release(Duration::from_secs(poll), 8).await;
        }
    }
    if all || which == "expiry" {
        expiry(6).await;
    }
    if all || which == "steady" {
        steady().await;
    }
}

fn client(server: &MockServer) -> Client {
    Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .build()
        .expect("a mock client")
}

fn looks(server: &MockServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Get)
        .count()
}

/// The next change that is not a failed look.
async fn change(changes: &mut Observe) -> volcano::LockChange {
    loop {
        match changes.next().await.expect("the stream goes on") {
            Ok(change) => return change,
            Err(err) => eprintln!("a failed look: {err}"),
        }
    }
}

fn summary(label: &str, mut late: Vec<Duration>, requests: usize, kinds: &[ChangeKind]) {
    late.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "{label}: seen after median {} ms, max {} ms (min {} ms) over {} trials; {requests} looks in all; kinds {kinds:?}",
        ms(late[late.len() / 2]),
        ms(late[late.len() - 1]),
        ms(late[0]),
        late.len(),
    );
}

/// A holder (ttl 60 s) releases at a random moment of the observer's
/// poll interval: how long until the observer says so.
async fn release(poll: Duration, trials: usize) {
    let mut late = Vec::new();
    let mut kinds = Vec::new();
    let mut requests = 0;
    for i in 0..trials {
        let server = MockServer::start().await;
        let locks = client(&server).locks();
        let lease = locks.acquire("job", Duration::from_secs(60)).await.unwrap();
        let mut changes = locks.observe("job").poll_interval(poll);
        change(&mut changes).await;
        // Spread over the interval, in the same order every run.
        tokio::time::sleep(poll.mul_f64((i as f64 + 0.5) / trials as f64)).await;
        locks.release(&lease).await.unwrap();
        let released = Instant::now();
        let seen = change(&mut changes).await;
        late.push(released.elapsed());
        kinds.push(seen.kind());
        requests += looks(&server);
    }
    summary(&format!("release, poll {poll:?}"), late, requests, &kinds);
}

/// A holder that stops renewing (a plain acquire, ttl 5 s): how long after
/// its expiry the observer (default poll, 10 s) says it expired.
async fn expiry(trials: usize) {
    let mut late = Vec::new();
    let mut kinds = Vec::new();
    let mut requests = 0;
    for _ in 0..trials {
        let server = MockServer::start().await;
        let locks = client(&server).locks();
        let asked = Instant::now();
        locks.acquire("job", Duration::from_secs(5)).await.unwrap();
        let mut changes = locks.observe("job");
        change(&mut changes).await;
        let seen = change(&mut changes).await;
        // The lease ended 5 s after it was asked for, at the latest.
        late.push(asked.elapsed().saturating_sub(Duration::from_secs(5)));
        kinds.push(seen.kind());
        requests += looks(&server);
    }
    summary(
        "expiry, default poll (10 s), ttl 5 s",
        late,
        requests,
        &kinds,
    );
}

/// A minute of observing a key whose holder renews, at the default poll
/// interval (10 s): what it costs of a 600/min quota, with a TTL longer
/// than the interval (30 s) and shorter (5 s, renewed every ~1.7 s).
async fn steady() {
    for ttl in [30, 5] {
        let server = MockServer::start().await;
        let client = client(&server);
        let _held = client
            .locks()
            .hold("job", Duration::from_secs(ttl))
            .await
            .unwrap();
        let mut changes = client.locks().observe("job");
        let mut seen = 0;
        let minute = async {
            loop {
                change(&mut changes).await;
                seen += 1;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), minute).await;
        println!(
            "steady, holder ttl {ttl} s: {} looks in a minute at the default poll (10 s), {seen} changes yielded",
            looks(&server)
        );
    }
}
