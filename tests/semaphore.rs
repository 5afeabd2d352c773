//! Counting semaphores (`locks.semaphore(name, permits)`, DESIGN section
//! 16) against the mock server: never more than N of a semaphore's keys
//! held at once on the server (read from its journal, not from the
//! clients' beliefs), under faults; one request per acquire when a permit
//! is free; waiters of one client served in order; an uncertain permit
//! acquire undone; bad input refused before anything is sent.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::mock_client;
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation, RecordedRequest};

const TTL: Duration = Duration::from_secs(5);

/// When each lease of the semaphore `name` lived on the server, from the
/// journal: from its grant to its release, or to the last expiry granted
/// when it was never released. Keys outside `name:0..permits` too.
fn leases(
    journal: &[RecordedRequest],
    name: &str,
) -> Vec<(String, i64, DateTime<Utc>, DateTime<Utc>)> {
    let prefix = format!("{name}:");
    let mut lives: BTreeMap<(String, i64), (DateTime<Utc>, DateTime<Utc>)> = BTreeMap::new();
    let mut holder: BTreeMap<String, i64> = BTreeMap::new();
    for r in journal.iter().filter(|r| r.key.starts_with(&prefix)) {
        match (r.operation, r.status, r.fencing_token, r.expires_at) {
            (Operation::Acquire, Some(201), Some(fence), Some(expires))
            | (Operation::Renew, Some(200), Some(fence), Some(expires)) => {
                let life = lives
                    .entry((r.key.clone(), fence))
                    .or_insert((r.at, expires));
                life.1 = expires;
                holder.insert(r.key.clone(), fence);
            }
            (Operation::Release, Some(204), _, _) => {
                if let Some(fence) = holder.remove(&r.key) {
                    if let Some(life) = lives.get_mut(&(r.key.clone(), fence)) {
                        life.1 = life.1.min(r.at);
                    }
                }
            }
            _ => {}
        }
    }
    lives
        .into_iter()
        .map(|((key, fence), (from, to))| (key, fence, from, to))
        .collect()
}

/// The most leases of `name` live at one instant, and whether every key
/// was one of its permits.
fn most_at_once(journal: &[RecordedRequest], name: &str, permits: u32) -> (usize, bool) {
    let lives = leases(journal, name);
    let in_range = lives.iter().all(|(key, ..)| {
        key.rsplit_once(':')
            .and_then(|(_, i)| i.parse::<u32>().ok())
            .is_some_and(|i| i < permits)
    });
    let most = lives
        .iter()
        .map(|(_, _, from, _)| {
            lives
                .iter()
                .filter(|(_, _, a, b)| a <= from && from < b)
                .count()
        })
        .max()
        .unwrap_or(0);
    (most, in_range)
}

/// Four workers (a client each) × three tasks each on a semaphore of two,
/// under 503s, dropped answers and delays: the server never holds more
/// than two of its keys at once, every task runs, and each holder writes
/// under its permit's fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_never_exceed_the_permits_on_the_server_under_faults() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Acquire).times(3));
    server.inject(Fault::drop_response().on(Operation::Acquire).times(2));
    server.inject(
        Fault::delay_response(Duration::from_millis(300))
            .on(Operation::Release)
            .times(3),
    );
    let ran = Arc::new(Mutex::new(0usize));
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let client = mock_client(&server);
        for _ in 0..3 {
            let semaphore = client.locks().semaphore("partner-api", 2);
            let ran = ran.clone();
            tasks.push(tokio::spawn(async move {
                semaphore
                    .with_permit(TTL, |permit| async move {
                        assert!(permit.key().starts_with("partner-api:"));
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        *ran.lock().unwrap() += 1;
                        Ok::<_, Error>(())
                    })
                    .wait(Duration::from_secs(60))
                    .await
            }));
        }
        clients.push(client);
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    for client in &clients {
        assert!(client.shutdown(Duration::from_secs(20)).await.is_empty());
    }
    assert_eq!(*ran.lock().unwrap(), 12);
    let (most, in_range) = most_at_once(&server.requests(), "partner-api", 2);
    assert!(in_range, "a key outside the permits was taken");
    assert!(most <= 2, "{most} permits held at once");
    assert!(most == 2, "both permits were used at once at some point");
    assert!(!server.locks().iter().any(|l| l.live), "all released");
}

/// A free permit costs one request; with every permit held, a try costs
/// at most two (never a sweep of all of them) and is `None` for
/// `try_with_permit`.
#[tokio::test]
async fn a_free_permit_costs_one_request_and_a_full_semaphore_is_none() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let semaphore = locks.semaphore("licences", 8);
    let permit = semaphore.acquire(TTL).await.unwrap();
    let acquires = |server: &MockServer| {
        server
            .requests()
            .iter()
            .filter(|r| r.operation == Operation::Acquire)
            .count()
    };
    assert_eq!(acquires(&server), 1);
    let mut held = vec![permit];
    for _ in 1..8 {
        held.push(semaphore.acquire(TTL).await.unwrap());
    }
    let keys: std::collections::BTreeSet<String> =
        held.iter().map(|p| p.key().to_owned()).collect();
    assert_eq!(keys.len(), 8, "eight different permits");
    let before = acquires(&server);
    let other = mock_client(&server).locks().semaphore("licences", 8);
    let ran = other
        .try_with_permit(TTL, |_permit| async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    assert_eq!(ran, None, "every permit is held");
    assert_eq!(
        acquires(&server) - before,
        8,
        "\"every permit taken\" only once each of the eight was seen held"
    );
    for permit in held {
        permit.release().await.unwrap();
    }
}

/// A try that does not wait says "every permit taken" only when every
/// permit was seen held: with 8 of 16 or 9 of 10 held elsewhere it gets
/// one, at one request per held permit it meets at most.
#[tokio::test]
async fn a_try_gets_a_permit_whenever_one_is_free() {
    for (permits, taken) in [(16u32, 8u32), (10, 9), (4, 3)] {
        let server = MockServer::start().await;
        let holder = mock_client(&server);
        let mut held = Vec::new();
        for i in 0..taken {
            let key = format!("pf:{i}");
            held.push(holder.locks().hold(key, TTL).await.unwrap());
        }
        for attempt in 0..8 {
            // A fresh client each time: its own spread, nothing remembered.
            let semaphore = mock_client(&server).locks().semaphore("pf", permits);
            let before = server.requests().len();
            let ran = semaphore
                .try_with_permit(TTL, |permit| async move {
                    Ok::<_, Error>(permit.key().to_owned())
                })
                .await
                .unwrap();
            let key = ran.unwrap_or_else(|| {
                panic!("{taken} of {permits} held: try {attempt} said every permit was taken")
            });
            assert!(key.starts_with("pf:"), "{key}");
            let tries = server.requests()[before..]
                .iter()
                .filter(|r| r.operation == Operation::Acquire)
                .count();
            assert!(
                tries <= taken as usize + 1,
                "{tries} acquires for a try with {taken} of {permits} held"
            );
        }
        drop(held);
    }
}

/// A permit its own client releases wakes that client's waiter on the
/// semaphore at once: its next try is that permit, not a round later.
#[tokio::test]
async fn a_permit_freed_by_its_client_goes_to_its_own_waiter_at_once() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let semaphore = client.locks().semaphore("own", 4);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(semaphore.acquire(TTL).await.unwrap());
    }
    let waiter = {
        let semaphore = semaphore.clone();
        tokio::spawn(async move {
            let permit = semaphore
                .acquire(TTL)
                .wait(Duration::from_secs(60))
                .poll_interval(Duration::from_secs(10))
                .await
                .unwrap();
            (permit.key().to_owned(), std::time::Instant::now())
        })
    };
    // Until the waiter has tried every permit and paused a while.
    let refused = |server: &MockServer| {
        server
            .requests()
            .iter()
            .filter(|r| r.operation == Operation::Acquire && r.status == Some(409))
            .map(|r| (r.seq, r.key.clone()))
            .collect::<Vec<_>>()
    };
    assert!(
        common::eventually(Duration::from_secs(20), || refused(&server).len() >= 6).await,
        "the waiter never tried"
    );
    // The permit it tried last: without the news it would come round to
    // it last again.
    let (_, last_tried) = refused(&server).pop().unwrap();
    let at = held.iter().position(|p| p.key() == last_tried).unwrap();
    let released_at = std::time::Instant::now();
    let seq = server.requests().last().unwrap().seq;
    held.remove(at).release().await.unwrap();
    let (key, got_at) = waiter.await.unwrap();
    assert_eq!(key, last_tried);
    let next = server
        .requests()
        .into_iter()
        .find(|r| r.seq > seq && r.operation == Operation::Acquire)
        .unwrap();
    assert_eq!(
        (next.key.as_str(), next.status),
        (last_tried.as_str(), Some(201)),
        "the waiter's next try after the release is the freed permit"
    );
    println!(
        "own waiter got the freed permit {:?} after the release",
        got_at.duration_since(released_at)
    );
}

/// Waiters of one client on a full semaphore get permits in the order
/// they began waiting.
#[tokio::test]
async fn waiters_of_one_client_are_served_in_order() {
    let server = MockServer::start().await;
    let holder = mock_client(&server).locks().semaphore("pool", 1);
    let first = holder.acquire(TTL).await.unwrap();
    let client = mock_client(&server);
    let order = Arc::new(Mutex::new(Vec::new()));
    let (queued_tx, mut queued) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut waiters = Vec::new();
    for n in 0..3 {
        let semaphore = client.locks().semaphore("pool", 1);
        let order = order.clone();
        let queued_tx = queued_tx.clone();
        waiters.push(tokio::spawn(async move {
            let waiting = semaphore
                .with_permit(TTL, |_permit| async move {
                    order.lock().unwrap().push(n);
                    Ok::<_, Error>(())
                })
                .wait(Duration::from_secs(30))
                .send();
            let _ = queued_tx.send(());
            waiting.await
        }));
        // Each begins waiting after the one before.
        queued.recv().await;
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
}

/// A permit's acquire whose answer never comes (the future dropped while
/// the granted answer is held back) is undone like any acquire: nothing is
/// left held once `shutdown` returns.
#[tokio::test]
async fn an_uncertain_permit_acquire_is_undone() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(
        Fault::delay_response(Duration::from_secs(2))
            .on(Operation::Acquire)
            .times(1),
    );
    let semaphore = client.locks().semaphore("pool", 3);
    let dropped =
        tokio::time::timeout(Duration::from_millis(300), semaphore.acquire(TTL).send()).await;
    assert!(dropped.is_err(), "dropped before its answer");
    assert!(
        server.locks().iter().any(|l| l.live),
        "the grant was applied"
    );
    assert_eq!(
        client.shutdown(Duration::from_secs(20)).await,
        Vec::<String>::new()
    );
    assert!(!server.locks().iter().any(|l| l.live), "undone");
}

/// Bad input: refused before anything is sent.
#[tokio::test]
async fn bad_names_counts_and_tokens_are_refused_before_sending() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let long = "n".repeat(126);
    let cases = [
        (locks.semaphore("pool", 0).acquire(TTL), "permits"),
        (
            locks
                .semaphore("pool", volcano::MAX_PERMITS + 1)
                .acquire(TTL),
            "permits",
        ),
        (
            locks.semaphore("bad#name", 2).acquire(TTL),
            "semaphore name",
        ),
        (
            locks.semaphore(long.as_str(), 20).acquire(TTL),
            "semaphore name",
        ),
        (
            locks.semaphore("pool", 2).acquire(TTL).options(
                volcano::AcquireOptions::default().token(uuid::Uuid::new_v4().to_string()),
            ),
            "token",
        ),
    ];
    for (acquire, says) in cases {
        let err = acquire.await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
    assert!(server.requests().is_empty());
}

/// Figures for docs/benchmarks.md (`cargo test -p volcano --test semaphore
/// -- --ignored --nocapture`): requests per acquire with 0 %, 50 %, 90 %
/// and 100 % of ten permits taken; pickup after a release with four
/// permits and sixteen waiters (a client each); the waiters' share of a
/// 600/min quota meanwhile. Real time, about two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, real time"]
async fn semaphore_figures() {
    // Requests per acquire, ten permits, `taken` of them held elsewhere.
    for taken in [0u32, 5, 9, 10] {
        let server = MockServer::start().await;
        let holder = mock_client(&server);
        let mut held = Vec::new();
        for i in 0..taken {
            held.push(holder.locks().hold(format!("pool:{i}"), TTL).await.unwrap());
        }
        let before = server.requests().len();
        let trials = 20;
        let mut got = 0;
        for _ in 0..trials {
            // A fresh client each time: its own spread, nothing remembered.
            let client = mock_client(&server);
            if let Ok(permit) = client.locks().semaphore("pool", 10).acquire(TTL).await {
                got += 1;
                let releases = server.requests().len();
                permit.release().await.unwrap();
                let _ = releases;
            }
        }
        let journal = server.requests();
        let acquires = journal[before..]
            .iter()
            .filter(|r| r.operation == Operation::Acquire)
            .count();
        println!(
            "{taken} of 10 taken: {:.2} acquire requests per try ({got} of {trials} got a permit)",
            acquires as f64 / f64::from(trials)
        );
    }

    // Pickup and quota share: four permits held, sixteen waiters.
    let server = MockServer::builder().rate_limit(600).start().await;
    let holder = mock_client(&server);
    let semaphore = holder.locks().semaphore("partner", 4);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(semaphore.acquire(TTL).await.unwrap());
    }
    let got: Arc<Mutex<Vec<(String, std::time::Instant)>>> = Arc::default();
    let mut waiters = Vec::new();
    for _ in 0..16 {
        let client = mock_client(&server);
        let got = got.clone();
        waiters.push(tokio::spawn(async move {
            let permit = client
                .locks()
                .semaphore("partner", 4)
                .acquire(TTL)
                .wait(Duration::from_secs(120))
                .await;
            if let Ok(permit) = permit {
                got.lock()
                    .unwrap()
                    .push((permit.key().to_owned(), std::time::Instant::now()));
                // Keep it to the end.
                std::future::pending::<()>().await;
            }
        }));
    }
    let start = server.requests().len();
    let began = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let waited = server.requests()[start..]
        .iter()
        .filter(|r| r.operation != Operation::Renew)
        .count();
    println!(
        "16 waiters on 4 held permits: {waited} requests in their first minute ({:.1} % of a \
         600/min quota, {:.1} per waiter)",
        waited as f64 * 100.0 / 600.0,
        waited as f64 / 16.0
    );
    let mut pickups = Vec::new();
    for permit in held {
        let released_at = std::time::Instant::now();
        let key = permit.key().to_owned();
        permit.release().await.unwrap();
        let deadline = released_at + Duration::from_secs(60);
        loop {
            if let Some((_, at)) = got.lock().unwrap().iter().find(|(k, _)| *k == key) {
                pickups.push(at.duration_since(released_at));
                break;
            }
            if std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!(
        "pickup after a release (waiting {:?} by then): {pickups:?}",
        began.elapsed().as_secs()
    );
    for waiter in waiters {
        waiter.abort();
    }
}

/// The only permit of `semaphore` held, and a waiter for it in line (its
/// first try refused).
async fn waiter_in_line(
    server: &MockServer,
    semaphore: &volcano::Semaphore,
) -> (
    volcano::HeldLock,
    tokio::task::JoinHandle<Result<volcano::HeldLock, Error>>,
) {
    let held = semaphore.acquire(TTL).await.unwrap();
    let waiter = tokio::spawn({
        let semaphore = semaphore.clone();
        async move { semaphore.acquire(TTL).wait(Duration::from_secs(30)).await }
    });
    assert!(
        common::eventually(Duration::from_secs(5), || {
            server.requests().iter().any(|r| r.status == Some(409))
        })
        .await
    );
    (held, waiter)
}

/// A try that does not wait never queues behind a waiter of its own
/// client: with every permit held and a waiter in line, it answers at
/// once (`None`), and a holder trying again inside its own permit's scope
/// cannot deadlock with that waiter.
#[tokio::test]
async fn a_try_does_not_queue_behind_a_waiter_of_its_client() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let semaphore = client.locks().semaphore("pool", 1);
    let (held, waiter) = waiter_in_line(&server, &semaphore).await;
    let tried = tokio::time::timeout(
        Duration::from_secs(3),
        semaphore
            .try_with_permit(TTL, |_permit| async { Ok::<_, Error>(()) })
            .send(),
    )
    .await
    .expect("answers at once, not after the waiter");
    assert_eq!(tried.unwrap(), None);
    held.release().await.unwrap();
    let permit = waiter.await.unwrap().unwrap();
    permit.release().await.unwrap();
}

/// A wait ends by its deadline even when the service does not answer: its
/// tries are timed to answer by then.
#[tokio::test]
async fn a_wait_ends_by_its_deadline_when_the_service_does_not_answer() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(Fault::delay(Duration::from_secs(30)).on(Operation::Acquire));
    let began = std::time::Instant::now();
    let got = client
        .locks()
        .semaphore("pool", 3)
        .acquire(TTL)
        .wait(Duration::from_secs(2))
        .await;
    assert!(got.is_err(), "{got:?}");
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "returned {:?} after a 2 s deadline",
        began.elapsed()
    );
    server.clear_faults();
    client.shutdown(Duration::from_secs(40)).await;
}

/// A wait for a permit sends no try after its deadline, its retry either:
/// a wait of 0 s whose one try is answered 503 (after the deadline, as any
/// answer is) does not retry it (volcano-sim --permits, seed 64: it did,
/// 100 ms after the deadline).
#[tokio::test]
async fn a_wait_does_not_retry_a_try_past_its_deadline() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(Fault::status(503).on(Operation::Acquire));
    let got = client
        .locks()
        .semaphore("pool", 1)
        .acquire(TTL)
        .wait(Duration::ZERO)
        .await;
    assert!(got.is_err(), "{got:?}");
    let tries = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Acquire)
        .count();
    assert_eq!(tries, 1, "tries sent by a wait of 0 s");
    server.clear_faults();
    client.shutdown(Duration::from_secs(5)).await;
}

/// Options a permit's hold would refuse are refused before the line: a
/// `max_hold` under a second does not wait behind another waiter of the
/// client to be refused, and one of exactly a second is taken.
#[tokio::test]
async fn a_bad_max_hold_is_refused_without_waiting_in_line() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let semaphore = client.locks().semaphore("pool", 1);
    let (held, waiter) = waiter_in_line(&server, &semaphore).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(3),
        semaphore
            .acquire(TTL)
            .max_hold(Duration::from_millis(500))
            .wait(Duration::from_secs(30)),
    )
    .await
    .expect("refused at once, not behind the waiter");
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    let exact = semaphore
        .acquire(TTL)
        .max_hold(Duration::from_secs(1))
        .await
        .expect("a max_hold of one second is allowed");
    exact.release().await.unwrap();
}

/// A wait's try undone (a gateway's 503 to it and to its retry), whose
/// undo's release is answered while the next round's try is in flight,
/// before that try's retry: the retry tried the permit after the release,
/// so the release is no news, and the round after that try's `409` waits
/// out the ramp (volcano-sim --permits, seed 648: it went at once).
#[tokio::test]
async fn a_release_of_its_own_undo_before_a_retry_does_not_hurry_the_wait() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let posts = common::InTurn::new(|n| match n {
        1 | 2 => common::gateway_page(),
        // The next round's try: in flight while the undo's release is
        // answered.
        3 => common::gateway_page().set_delay(Duration::from_millis(1_000)),
        _ => common::error_body(409, "Lock is held", Some("lock_held")),
    });
    let arrived = posts.arrived.clone();
    // The undo's first release freed the permit (answered late); any
    // later one finds it another's.
    let deletes = common::InTurn::new(|n| match n {
        1 => ResponseTemplate::new(204).set_delay(Duration::from_millis(800)),
        _ => common::error_body(409, "Lock is held", Some("lock_held")),
    });
    let wire = common::server().await;
    Mock::given(method("POST"))
        .respond_with(posts)
        .mount(&wire)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(deletes)
        .mount(&wire)
        .await;
    let client = common::client(&wire.uri());
    let got = client
        .locks()
        .semaphore("pool", 1)
        .acquire(TTL)
        .wait(Duration::from_millis(3_000))
        .await;
    assert!(got.is_err(), "{got:?}");
    let seen = arrived.lock().unwrap().clone();
    assert!(seen.len() >= 5, "{} acquires", seen.len());
    // After the 409 to the second round's retry, 1.5 s into the wait: the
    // ramp's step is 0.45 s, jittered down by a tenth at most.
    let pause = seen[4] - seen[3];
    assert!(
        pause >= Duration::from_millis(350),
        "tried again {pause:?} after the retry's 409"
    );
}
