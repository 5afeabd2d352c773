//! `locks.hold_all(keys, ttl)` and `with_locks`: several keys, acquired in
//! one order, held whole or not at all, against the mock server.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::mock_client;
use volcano::Error;
use volcano_mock_server::{Fault, MockServer, Operation};

const TTL: Duration = Duration::from_secs(5);

fn live_keys(server: &MockServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .locks()
        .into_iter()
        .filter(|l| l.live)
        .map(|l| l.key)
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_set_is_deduplicated_sorted_held_and_released_whole() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // Long enough that no renewal enters the request count below.
    let ttl = Duration::from_secs(60);
    let set = client
        .locks()
        .hold_all(["c", "a", "b", "a"], ttl)
        .await
        .unwrap();
    assert_eq!(set.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    let acquired: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.operation == Operation::Acquire)
        .map(|r| r.key)
        .collect();
    assert_eq!(acquired, ["a", "b", "c"], "one canonical order");
    assert_eq!(live_keys(&server), ["a", "b", "c"]);
    for key in ["a", "b", "c"] {
        let live = server.locks().into_iter().find(|l| l.key == key).unwrap();
        assert_eq!(set.fencing_token(key), Some(live.fencing_token));
    }
    assert_eq!(set.fencing_token("d"), None);
    assert!(!set.is_lost());
    set.release().await.unwrap();
    assert!(live_keys(&server).is_empty());

    let err = client.locks().hold_all(Vec::<String>::new(), ttl).await;
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
    let err = client.locks().hold_all(["ok", "not ok"], ttl).await;
    assert!(matches!(err, Err(Error::InvalidArgument(_))), "{err:?}");
    assert_eq!(server.requests().len(), 6, "nothing sent for bad input");
}

#[tokio::test]
async fn a_key_held_elsewhere_leaves_none_of_the_set_held() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let other = client.locks().acquire("b", TTL).await.unwrap();
    let err = client
        .locks()
        .hold_all(["a", "b", "c"], TTL)
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_lock_held(), "{err:?}");
    assert_eq!(live_keys(&server), ["b"], "a was let go of, c never taken");
    client.locks().release(&other).await.unwrap();
}

/// The last key's acquire is applied and its answer dropped, twice (the
/// acquire and its retry): the outcome is unknown, so it is undone, and
/// the keys before it are released. Nothing of the set stays held.
#[tokio::test]
async fn an_unknown_outcome_on_one_key_releases_the_whole_set() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    server.inject(
        Fault::drop_response()
            .on(Operation::Acquire)
            .key("c")
            .times(2),
    );
    let err = client
        .locks()
        .hold_all(["a", "b", "c"], TTL)
        .await
        .unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    // The undo of c ends once no try can land: 5 s of request timeout and
    // 2 s of margin after the retry's failure.
    assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
    assert!(live_keys(&server).is_empty(), "{:?}", server.locks());
}

/// Dropped while waiting for its last key: the keys taken are released in
/// the background, which `shutdown` waits for.
#[tokio::test]
async fn a_set_dropped_while_waiting_releases_what_it_took() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let other = client.locks().acquire("c", TTL).await.unwrap();
    let waiting = client
        .locks()
        .hold_all(["a", "b", "c"], TTL)
        .wait(Duration::from_secs(30))
        .send();
    assert!(tokio::time::timeout(Duration::from_millis(500), waiting)
        .await
        .is_err());
    assert!(client.shutdown(Duration::from_secs(5)).await.is_empty());
    assert_eq!(live_keys(&server), ["c"]);
    client.locks().release(&other).await.unwrap();
}

/// Two callers whose sets overlap ({a, b, c} and {c, b, d}), each taking
/// its set over and over under contention, with a dropped answer now and
/// then: no deadlock (both finish), never two holders of a shared key at
/// once, and nothing left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_under_contention_never_deadlock_or_overlap() {
    let server = Arc::new(MockServer::start().await);
    server.inject(Fault::drop_response().on(Operation::Acquire).every(9));
    let inside: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let rounds = Arc::new(AtomicUsize::new(0));
    let caller = |keys: [&'static str; 3]| {
        let client = mock_client(&server);
        let (inside, rounds) = (inside.clone(), rounds.clone());
        tokio::spawn(async move {
            for _ in 0..8 {
                let inside = inside.clone();
                let ran = client
                    .locks()
                    .with_locks(keys, TTL, move |set| async move {
                        for key in set.keys() {
                            let mut inside = inside.lock().unwrap();
                            let n = inside.entry(key.to_owned()).or_default();
                            *n += 1;
                            assert_eq!(*n, 1, "two holders of {key}");
                        }
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        for key in set.keys() {
                            *inside.lock().unwrap().get_mut(key).unwrap() -= 1;
                        }
                        Ok::<_, Error>(())
                    })
                    .wait(Duration::from_secs(20))
                    .poll_interval(Duration::from_millis(200))
                    .await;
                match ran {
                    Ok(()) => {
                        rounds.fetch_add(1, Ordering::SeqCst);
                    }
                    // A dropped answer that stays unknown fails the round.
                    Err(err) if err.is_transport() => {}
                    Err(err) => panic!("{err:?}"),
                }
            }
            assert!(client.shutdown(Duration::from_secs(10)).await.is_empty());
        })
    };
    let first = caller(["a", "b", "c"]);
    let second = caller(["c", "b", "d"]);
    let both = tokio::time::timeout(Duration::from_secs(60), async {
        first.await.unwrap();
        second.await.unwrap();
    });
    assert!(both.await.is_ok(), "the callers deadlocked");
    assert!(rounds.load(Ordering::SeqCst) >= 8, "too few rounds ran");
    assert!(live_keys(&server).is_empty(), "{:?}", server.locks());
}
