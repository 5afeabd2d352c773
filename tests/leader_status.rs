//! A leader's status for a readiness probe (DESIGN section 15): read from a
//! watch channel, never from the service; leading only while a term runs.

mod common;

use std::time::Duration;

use common::mock_client;
use tokio::sync::watch;
use volcano::{Error, LeaderStatus};
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

async fn until(status: &mut watch::Receiver<LeaderStatus>, what: fn(&LeaderStatus) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(what))
        .await
        .expect("the status came")
        .expect("the leader still runs");
}

/// Following, then leading under the term's fencing token, following while
/// another leads, stopped once `run` returned.
#[tokio::test]
async fn the_status_follows_the_terms() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let (resign, resigned) = tokio::sync::oneshot::channel::<()>();
    let first = locks.leader("scheduler", TTL);
    let mut first_status = first.status();
    assert_eq!(*first_status.borrow(), LeaderStatus::Following);
    let first = tokio::spawn(
        first
            .until(async {
                let _ = resigned.await;
            })
            .run(|term| async move {
                term.lost().await;
                Ok::<(), Error>(())
            }),
    );
    until(&mut first_status, |s| {
        *s == LeaderStatus::Leading {
            fencing_token: 1,
            at_risk: false,
        }
    })
    .await;

    let second = locks
        .leader("scheduler", TTL)
        .poll_interval(Duration::from_millis(200));
    let mut second_status = second.status();
    let second = tokio::spawn(second.run(|term| async move {
        let fence = term.lease().fencing_token();
        assert!(fence > 1);
        Ok::<(), Error>(())
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        *second_status.borrow(),
        LeaderStatus::Following,
        "another leads"
    );

    let _ = resign.send(());
    first.await.unwrap().unwrap();
    assert_eq!(*first_status.borrow(), LeaderStatus::Stopped);
    until(&mut second_status, |s| matches!(s, LeaderStatus::Stopped)).await;
    second.await.unwrap().unwrap();
}

/// A campaign whose tries get 503s: unreachable since the first, then
/// leading once the service answers.
#[tokio::test]
async fn a_campaign_without_answers_is_unreachable() {
    let server = MockServer::start().await;
    server.inject(Fault::status(503).on(Operation::Acquire).times(6));
    let locks = mock_client(&server).locks();
    // A candidate tries at its poll interval from the start.
    let leader = locks
        .leader("scheduler", TTL)
        .poll_interval(Duration::from_millis(500));
    let mut status = leader.status();
    let before = std::time::Instant::now();
    let run = tokio::spawn(leader.run(|term| async move {
        term.lost().await;
        Ok::<(), Error>(())
    }));
    until(&mut status, |s| {
        matches!(s, LeaderStatus::Unreachable { .. })
    })
    .await;
    let LeaderStatus::Unreachable { since } = *status.borrow() else {
        unreachable!()
    };
    assert!(since >= before, "since the campaign's first failed try");
    until(&mut status, |s| matches!(s, LeaderStatus::Leading { .. })).await;
    run.abort();
}

/// A term whose renewals fail for a while: leading, at risk, then not.
#[tokio::test]
async fn a_term_at_risk_says_so_while_leading() {
    let server = MockServer::start().await;
    let locks = mock_client(&server).locks();
    let leader = locks.leader("scheduler", TTL);
    let mut status = leader.status();
    let run = tokio::spawn(leader.run(|term| async move {
        term.lost().await;
        Ok::<(), Error>(())
    }));
    until(&mut status, |s| matches!(s, LeaderStatus::Leading { .. })).await;
    server.inject(Fault::status(503).on(Operation::Renew).times(2));
    until(&mut status, |s| {
        matches!(s, LeaderStatus::Leading { at_risk: true, .. })
    })
    .await;
    until(&mut status, |s| {
        matches!(s, LeaderStatus::Leading { at_risk: false, .. })
    })
    .await;
    run.abort();
}

/// A term that keeps its thread past its lock (a blocking call; here a
/// moved lease clock plays the time it took) cannot be dropped, and its
/// status still says leading: the health check sees it from another
/// thread, and clears once the term has stepped down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_a_term_that_outlived_its_lock() {
    let server = MockServer::start().await;
    let clock = volcano::LeaseClock::adjustable();
    let client = volcano::Client::builder()
        .api_url(server.url())
        .allow_insecure_http(true)
        .service_key(server.service_key())
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let leader = client.locks().leader("scheduler", TTL);
    let health = leader.health();
    let mut status = leader.status();
    assert_eq!(health.overdue(), None, "no term yet");
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let (release_tx, release) = std::sync::mpsc::channel::<()>();
    let release = std::sync::Mutex::new(release);
    let run = tokio::spawn(leader.run(move |_term| {
        let started = started_tx.clone();
        // Blocks its thread (no `.await`) until the test lets it go.
        let _ = started.send(());
        let _ = release.lock().unwrap().recv();
        async { std::future::pending::<Result<(), Error>>().await }
    }));
    tokio::task::spawn_blocking(move || started.recv().unwrap())
        .await
        .unwrap();
    until(&mut status, |s| matches!(s, LeaderStatus::Leading { .. })).await;
    assert_eq!(health.overdue(), None, "leading, lock held");
    clock.advance(TTL + Duration::from_secs(3));
    let overdue = health.overdue().expect("a term past its lock");
    assert!(overdue >= Duration::from_secs(3), "{overdue:?}");
    assert!(
        matches!(*status.borrow(), LeaderStatus::Leading { .. }),
        "the stuck candidate cannot change its status"
    );
    assert!(format!("{health:?}").contains("overdue"));
    release_tx.send(()).unwrap();
    until(&mut status, |s| !matches!(s, LeaderStatus::Leading { .. })).await;
    assert_eq!(health.overdue(), None, "stepped down");
    run.abort();
}

/// A leader campaigning behind another waiter of its own client sends
/// nothing (the one ahead tries for both), so its status follows what the
/// one ahead learns: unreachable while those tries go unanswered, and
/// following again once one is answered. Before, it stayed `Following`
/// however long the service was down.
#[tokio::test]
async fn a_leader_behind_another_waiter_of_its_client_says_unreachable() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let locks = client.locks();
    let holder = mock_client(&server)
        .locks()
        .acquire("scheduler", TTL)
        .await
        .unwrap();
    // First in line: a plain wait of the same client on the same key.
    let ahead = locks.clone();
    let waiting = tokio::spawn(async move {
        ahead
            .acquire("scheduler", TTL)
            .wait(Duration::from_secs(30))
            .poll_interval(Duration::from_millis(200))
            .await
    });
    common::eventually(Duration::from_secs(5), || {
        server
            .requests()
            .iter()
            .any(|r| r.operation == Operation::Acquire && r.status == Some(409))
    })
    .await;
    let leader = locks.leader("scheduler", TTL);
    let mut status = leader.status();
    let run = tokio::spawn(leader.run(|term| async move {
        term.lost().await;
        Ok::<(), Error>(())
    }));
    until(&mut status, |s| matches!(s, LeaderStatus::Following)).await;
    server.inject(Fault::status(503).on(Operation::Acquire));
    until(&mut status, |s| {
        matches!(s, LeaderStatus::Unreachable { .. })
    })
    .await;
    server.clear_faults();
    until(&mut status, |s| matches!(s, LeaderStatus::Following)).await;
    run.abort();
    waiting.abort();
    drop(holder);
}
