//! Leader election (`locks.leader(key, ttl)`) against the mock server.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use volcano::Error;
use volcano_mock_server::MockServer;

const KEY: &str = "scheduler";
const TTL: Duration = Duration::from_secs(5);

fn held_on_server(server: &MockServer) -> bool {
    live_on(server, KEY)
}

#[tokio::test]
async fn candidates_lead_one_at_a_time_with_rising_fencing_tokens() {
    let server = MockServer::start().await;
    let leading = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let client = mock_client(&server);
        let (leading, overlaps, fences) = (leading.clone(), overlaps.clone(), fences.clone());
        // The run future is Send + 'static: each candidate is a task.
        candidates.push(tokio::spawn(client.locks().leader(KEY, TTL).run(
            move |term| {
                let (leading, overlaps, fences) =
                    (leading.clone(), overlaps.clone(), fences.clone());
                async move {
                    if leading.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    fences.lock().unwrap().push(term.lease().fencing_token());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    leading.fetch_sub(1, Ordering::SeqCst);
                    Ok::<(), Error>(()) // one term each, then step down
                }
            },
        )));
    }
    for candidate in candidates {
        tokio::time::timeout(Duration::from_secs(20), candidate)
            .await
            .expect("every candidate gets its term")
            .unwrap()
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 3);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(!held_on_server(&server), "each term released on Ok");
}

#[tokio::test]
async fn a_lost_term_is_dropped_and_the_candidate_campaigns_again() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let terms = Arc::new(Mutex::new(Vec::new()));
    let first_dropped = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        client
            .locks()
            .leader(KEY, TTL)
            .until(async move {
                let _ = stop_rx.await;
            })
            .run({
                let (terms, first_dropped) = (terms.clone(), first_dropped.clone());
                move |term| {
                    let (terms, first_dropped) = (terms.clone(), first_dropped.clone());
                    async move {
                        let first = terms.lock().unwrap().is_empty();
                        terms.lock().unwrap().push(term.lease().fencing_token());
                        let _flag = first.then(|| DropFlag(first_dropped));
                        std::future::pending::<Result<(), Error>>().await
                    }
                }
            }),
    );
    let elected = || terms.lock().unwrap().len();
    assert!(eventually(Duration::from_secs(5), || elected() == 1).await);
    // An admin takes the lock away; the next renewal is refused.
    client.locks().force_release(KEY).await.unwrap();
    assert!(eventually(Duration::from_secs(15), || elected() == 2).await);
    assert!(
        first_dropped.load(Ordering::SeqCst),
        "the lost term was dropped"
    );
    let fences = terms.lock().unwrap().clone();
    assert!(fences[1] > fences[0], "{fences:?}");

    // Step down: the running term is dropped and the lock released.
    stop_tx.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert!(!held_on_server(&server));
}

#[tokio::test]
async fn until_steps_down_cleanly_and_an_error_ends_leadership() {
    let server = MockServer::start().await;
    let client = mock_client(&server);

    // until() before anyone leads: returns at once, nothing held.
    let result = client
        .locks()
        .leader(KEY, TTL)
        .until(async {})
        .run(|_term| async { Ok::<(), Error>(()) })
        .await;
    assert!(result.is_ok());
    assert!(!held_on_server(&server));

    // An Err from the term releases and comes back; no second term.
    #[derive(Debug)]
    enum JobError {
        Lock(Error),
        Failed,
    }
    impl From<Error> for JobError {
        fn from(err: Error) -> Self {
            JobError::Lock(err)
        }
    }
    let calls = Arc::new(AtomicI64::new(0));
    let err = client
        .locks()
        .leader(KEY, TTL)
        .run({
            let calls = calls.clone();
            move |_term| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(JobError::Failed) }
            }
        })
        .await
        .unwrap_err();
    if let JobError::Lock(lock) = &err {
        panic!("the term's error should come back, not a lock error: {lock}");
    }
    assert!(matches!(err, JobError::Failed), "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(!held_on_server(&server));
    assert_eq!(client.active_renewals(), 0);

    // An Err whose release the service keeps answering 503: the release
    // goes on in the background, and `run` returns once it has freed the
    // key (within one client timeout; the 0.75 s of a step-down is for
    // `until` only).
    use volcano_mock_server::{Fault, Operation};
    server.inject(Fault::status(503).on(Operation::Release).times(1));
    server.inject(
        Fault::delay(Duration::from_millis(1_500))
            .on(Operation::Release)
            .times(1),
    );
    let err = client
        .locks()
        .leader(KEY, TTL)
        .run(|_term| async { Err::<(), _>(JobError::Failed) })
        .await
        .unwrap_err();
    assert!(matches!(err, JobError::Failed), "{err:?}");
    assert!(
        !held_on_server(&server),
        "run returned before its term's release freed the key"
    );
}

/// One replica of a scheduler on a runtime of its own, so that it can be
/// killed the way a process dies: the runtime stops, nothing more runs, no
/// release is sent.
struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
}

/// An election seen by a replica: its fencing token and when.
type Elections = Arc<Mutex<Vec<(usize, i64, std::time::Instant)>>>;

fn replica(id: usize, url: String, key: String, elections: Elections) -> Replica {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.spawn(async move {
        let client = volcano::Client::builder()
            .service_key(volcano_mock_server::DEFAULT_SERVICE_KEY)
            .api_url(url)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let _ = client
            .locks()
            .leader(key, TTL)
            .run(move |term| {
                let elections = elections.clone();
                async move {
                    let fence = term.lease().fencing_token();
                    elections
                        .lock()
                        .unwrap()
                        .push((id, fence, std::time::Instant::now()));
                    std::future::pending::<Result<(), Error>>().await
                }
            })
            .await;
    });
    Replica {
        runtime: Some(runtime),
    }
}

impl Replica {
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Kills the leader `kills` times (default 2; `VOLCANO_FAILOVER_KILLS`
/// for a longer measurement) and checks that another replica takes over
/// within ttl + 1 s grace + 1 s of polling and a little scheduling slack,
/// with a higher fencing token each time. Prints the failover times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_within_the_ttl_and_the_grace() {
    let kills: usize = std::env::var("VOLCANO_FAILOVER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let server = MockServer::start().await;
    let elections: Elections = Arc::default();
    let key = format!("{KEY}-failover");
    let mut replicas: Vec<Replica> = Vec::new();
    let mut next_id = 0;
    let mut spawn = |replicas: &mut Vec<Replica>| {
        replicas.push(replica(
            next_id,
            server.url().to_owned(),
            key.clone(),
            elections.clone(),
        ));
        next_id += 1;
    };
    for _ in 0..3 {
        spawn(&mut replicas);
    }
    let count = || elections.lock().unwrap().len();
    assert!(eventually(Duration::from_secs(10), || count() == 1).await);

    let mut failovers = Vec::new();
    for kill in 0..kills {
        let (leader, fence, _) = *elections.lock().unwrap().last().unwrap();
        let killed_at = std::time::Instant::now();
        replicas[leader].kill();
        spawn(&mut replicas); // a supervisor starts a replacement
        let limit = TTL + Duration::from_secs(4);
        assert!(
            eventually(limit, || count() == kill + 2).await,
            "no new leader within {limit:?}"
        );
        let (_, new_fence, elected_at) = *elections.lock().unwrap().last().unwrap();
        assert!(new_fence > fence, "fencing tokens rise across terms");
        failovers.push(elected_at.duration_since(killed_at));
    }
    for replica in &mut replicas {
        replica.kill();
    }
    let mut sorted = failovers.clone();
    sorted.sort();
    println!(
        "failover over {} kills (ttl {:?}): median {:?}, max {:?}",
        sorted.len(),
        TTL,
        sorted[sorted.len() / 2],
        sorted.last().unwrap()
    );
}

/// Three candidates under renewal faults and server clock jumps for a
/// bounded time: no term may believe it leads while the server has granted
/// the key to another token, and fencing tokens rise from term to term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_faults_and_clock_jumps_at_most_one_term_believes_it_leads() {
    use volcano_mock_server::{Fault, Operation};
    let server = Arc::new(MockServer::start().await);
    let key = format!("{KEY}-stress");
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let fences = Arc::new(Mutex::new(Vec::<i64>::new()));
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let client = mock_client(&server);
        let mut stop = stop_tx.subscribe();
        let (server, key, violations, fences) = (
            server.clone(),
            key.clone(),
            violations.clone(),
            fences.clone(),
        );
        candidates.push(tokio::spawn(
            client
                .locks()
                .leader(key.clone(), TTL)
                .until(async move {
                    let _ = stop.recv().await;
                })
                .run(move |term| {
                    let (server, key, violations, fences) = (
                        server.clone(),
                        key.clone(),
                        violations.clone(),
                        fences.clone(),
                    );
                    async move {
                        let mine = term.lease().fencing_token();
                        fences.lock().unwrap().push(mine);
                        // Hand over now and then: marking the term lost makes
                        // the candidate release and campaign again.
                        let rotate_at = tokio::time::Instant::now()
                            + Duration::from_millis(600 + (mine as u64 % 5) * 200);
                        loop {
                            if tokio::time::Instant::now() >= rotate_at {
                                term.mark_lost("rotating leadership for the test");
                            }
                            // The server's view first, then the belief.
                            let granted = server
                                .locks()
                                .into_iter()
                                .find(|l| l.key == key && l.live)
                                .map(|l| l.fencing_token);
                            if !term.is_lost() && granted.is_some_and(|f| f != mine) {
                                violations.lock().unwrap().push(format!(
                                    "term {mine} believed it led while the server granted {granted:?}"
                                ));
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        #[allow(unreachable_code)]
                        Ok::<(), Error>(())
                    }
                }),
        ));
    }
    // Bounded trouble: renewals answered 503 or dropped after applying,
    // and small forward jumps of the server clock (well under the 1 s
    // takeover grace between two renewals: a larger jump means a broken
    // server clock, which no client can make safe).
    server.inject(Fault::status(503).on(Operation::Renew).every(3));
    server.inject(Fault::drop_response().on(Operation::Renew).every(5));
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        server.advance(Duration::from_millis(300));
    }
    let _ = stop_tx.send(());
    for candidate in candidates {
        let result = tokio::time::timeout(Duration::from_secs(20), candidate)
            .await
            .expect("every candidate steps down")
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let fences = fences.lock().unwrap().clone();
    assert!(!fences.is_empty());
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    println!("stress: {} terms, fences {fences:?}", fences.len());
}

/// A leader cancelled by its supervisor (the run future dropped mid-term)
/// stops renewing and hands its release to the client; `shutdown` waits
/// for it, so the next replica need not wait out the ttl.
#[tokio::test]
async fn a_leader_dropped_mid_term_releases_through_the_client() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let elected = Arc::new(AtomicBool::new(false));
    let run = tokio::spawn(client.locks().leader(KEY, TTL).run({
        let elected = elected.clone();
        move |_term| {
            let elected = elected.clone();
            async move {
                elected.store(true, Ordering::SeqCst);
                std::future::pending::<Result<(), Error>>().await
            }
        }
    }));
    assert!(eventually(Duration::from_secs(5), || elected.load(Ordering::SeqCst)).await);
    assert!(held_on_server(&server));
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert_eq!(
        client.shutdown(Duration::from_secs(10)).await,
        Vec::<String>::new()
    );
    assert!(!held_on_server(&server), "released, not left for the ttl");
    assert_eq!(client.active_renewals(), 0);
}

/// A candidate on a runtime of its own with one worker thread, so that a
/// stall freezes all of it (term, renewal, timers) as a paused process is
/// frozen, and a kill stops it as a crash does (no release). Its lease
/// clock is adjustable, so that it can jump as after a suspend.
struct Frozen {
    runtime: Option<tokio::runtime::Runtime>,
    clock: volcano::LeaseClock,
    stall: Stall,
}

/// A stall waiting to happen: taken by the candidate's term if it leads
/// (which then looks at the server and at its belief first thing after
/// thawing, before anything else of the candidate can run), else by a
/// task of its own. `pending` counts stalls asked for and not yet over.
#[derive(Clone, Default)]
struct Stall {
    next: Arc<Mutex<Option<Duration>>>,
    pending: Arc<AtomicUsize>,
}

/// Blocks the only worker, if a stall is waiting: nothing else of this
/// candidate runs meanwhile.
fn take_stall(stall: &Stall) -> bool {
    let by = stall.next.lock().unwrap().take();
    if let Some(by) = by {
        std::thread::sleep(by);
        stall.pending.fetch_sub(1, Ordering::SeqCst);
    }
    by.is_some()
}

impl Frozen {
    /// Stalled now, or about to be.
    fn stalled(&self) -> bool {
        self.runtime.is_some() && self.stall.pending.load(Ordering::SeqCst) > 0
    }

    fn stall(&self, by: Duration) {
        if let Some(runtime) = &self.runtime {
            if self.stall.next.lock().unwrap().replace(by).is_none() {
                self.stall.pending.fetch_add(1, Ordering::SeqCst);
            }
            let stall = self.stall.clone();
            runtime.spawn(async move {
                // A leading term takes it within 20 ms.
                tokio::time::sleep(Duration::from_millis(100)).await;
                take_stall(&stall);
            });
        }
    }

    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What a term saw: violations of "one leader at a time", and the fencing
/// token of each term that began believing it led.
#[derive(Clone, Default)]
struct Ledger {
    violations: Arc<Mutex<Vec<String>>>,
    /// (candidate, fencing token) of each term, in order.
    fences: Arc<Mutex<Vec<(usize, i64)>>>,
    /// Terms that thawed from a stall to find the key granted to another
    /// (the first stall is the first leader's, long enough for that).
    stale_thaws: Arc<AtomicUsize>,
}

fn frozen_candidate(
    id: usize,
    server: Arc<MockServer>,
    key: String,
    ledger: Ledger,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Frozen {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let clock = volcano::LeaseClock::adjustable();
    let client = volcano::Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .timeout(Duration::from_secs(5))
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let errors = ledger.violations.clone();
    let stall = Stall::default();
    let term_stall = stall.clone();
    runtime.spawn(async move {
        let mut stop = stop;
        let result = client
            .locks()
            .leader(key.clone(), TTL)
            .until(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            })
            .run(move |term| {
                let (server, key, ledger) = (server.clone(), key.clone(), ledger.clone());
                let stall = term_stall.clone();
                async move {
                    let mine = term.lease().fencing_token();
                    {
                        let mut fences = ledger.fences.lock().unwrap();
                        if !term.is_lost() {
                            fences.push((id, mine));
                        }
                    }
                    loop {
                        let thawed = take_stall(&stall);
                        // The server's view first, then the belief.
                        let granted = server
                            .locks()
                            .into_iter()
                            .find(|l| l.key == key && l.live)
                            .map(|l| l.fencing_token);
                        if thawed && granted.is_some_and(|f| f != mine) {
                            ledger.stale_thaws.fetch_add(1, Ordering::SeqCst);
                        }
                        if !term.is_lost() && granted.is_some_and(|f| f != mine) {
                            ledger.violations.lock().unwrap().push(format!(
                                "term {mine} believed it led while the server granted {granted:?}"
                            ));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), Error>(())
                }
            })
            .await;
        if let Err(err) = result {
            errors
                .lock()
                .unwrap()
                .push(format!("a candidate ended with {err:?}"));
        }
        let _ = client.shutdown(Duration::from_secs(5)).await;
    });
    Frozen {
        runtime: Some(runtime),
        clock,
        stall,
    }
}

/// Candidates stalled (frozen for up to longer than the ttl, as a paused
/// process or a long GC pause), suspended (lease clock jumped), killed and
/// replaced at random, under renewal faults, for a bounded time: no term
/// believes it leads while the server grants the key to another, and each
/// term's fencing token is higher than the last. The seed is printed;
/// `VOLCANO_LEADER_SEED` replays a schedule (timing still varies), and
/// `VOLCANO_LEADER_EVENTS` (default 14, about a second each) runs longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_stalled_suspended_and_killed_at_random_never_lead_together() {
    use volcano_mock_server::{Fault, Operation};
    let seed: u64 = std::env::var("VOLCANO_LEADER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("VOLCANO_LEADER_SEED={seed}");
    let mut state = seed | 1;
    // xorshift64: enough for a schedule, and replayable from the seed.
    let mut next = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };

    let server = Arc::new(MockServer::start().await);
    server.inject(Fault::status(503).on(Operation::Renew).every(4));
    server.inject(Fault::drop_response().on(Operation::Renew).every(7));
    let key = format!("{KEY}-frozen");
    let ledger = Ledger::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let start = |id| {
        let (server, key, ledger) = (server.clone(), key.clone(), ledger.clone());
        frozen_candidate(id, server, key, ledger, stop_rx.clone())
    };
    // candidates[i] has id ids[i]; a replacement gets a new id.
    let mut candidates: Vec<Frozen> = (0..3).map(start).collect();
    let mut ids: Vec<usize> = (0..3).collect();
    let (mut stalls, mut jumps, mut kills) = (0, 0, 0);
    let events: usize = std::env::var("VOLCANO_LEADER_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(14);
    // First, always: the current leader stalls long enough for a takeover,
    // until one has thawed into another's term (on a loaded machine the
    // leader may change hands before its stall lands: up to three tries).
    let latest_leader = || ledger.fences.lock().unwrap().last().map(|(id, _)| *id);
    assert!(eventually(Duration::from_secs(10), || latest_leader().is_some()).await);
    for _ in 0..3 {
        let Some(leader) = ids.iter().position(|id| Some(*id) == latest_leader()) else {
            break;
        };
        candidates[leader].stall(TTL + Duration::from_millis(4_000 + next(3_000)));
        stalls += 1;
        let thawed = || ledger.stale_thaws.load(Ordering::SeqCst) > 0;
        if eventually(Duration::from_secs(15), thawed).await {
            break;
        }
    }
    for _ in 0..events {
        tokio::time::sleep(Duration::from_millis(700 + next(800))).await;
        // Mostly the latest leader: trouble for a follower changes little.
        let leader = ledger.fences.lock().unwrap().last().map(|(id, _)| *id);
        let i = match ids.iter().position(|id| Some(*id) == leader) {
            Some(i) if next(4) > 0 => i,
            _ => next(candidates.len() as u64) as usize,
        };
        match next(5) {
            0 => {
                candidates[i].stall(TTL + Duration::from_millis(4_000 + next(3_000)));
                stalls += 1;
            }
            1 => {
                candidates[i].stall(Duration::from_millis(200 + next(1_800)));
                stalls += 1;
            }
            2 => {
                candidates[i]
                    .clock
                    .advance(Duration::from_millis(1_000 + next(7_000)));
                jumps += 1;
            }
            3 => {
                candidates[i].kill();
                ids[i] = 3 + kills;
                candidates[i] = start(ids[i]);
                kills += 1;
            }
            _ => {}
        }
    }
    // Stop once no candidate is stalled and the lease on the server is a
    // live candidate's term: that leader must then release it, while it is
    // still live (not leave it to expire, which the server would show as
    // free all the same).
    let led_by_the_living = || {
        let granted = server
            .locks()
            .into_iter()
            .find(|l| l.key == key && l.live)
            .map(|l| l.fencing_token);
        let ledger = ledger.fences.lock().unwrap();
        let leader = ledger.iter().rev().find(|(_, f)| Some(*f) == granted);
        candidates.iter().all(|c| !c.stalled()) && leader.is_some_and(|(id, _)| ids.contains(id))
    };
    let settled = eventually(Duration::from_secs(30), led_by_the_living).await;
    assert!(settled, "seed {seed}: no live, unstalled leader to stop");
    let stopped_at = server.now();
    stop_tx.send(true).unwrap();
    let released_live = || released_while_live(&server, &key, stopped_at);
    let stepped_down = eventually(Duration::from_secs(10), released_live).await;
    for candidate in &mut candidates {
        candidate.kill();
    }
    let violations = ledger.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    let fences: Vec<i64> = ledger
        .fences
        .lock()
        .unwrap()
        .iter()
        .map(|(_, f)| *f)
        .collect();
    assert!(
        fences.len() >= 2,
        "seed {seed}: leadership changed hands: {fences:?}"
    );
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "seed {seed}: {fences:?}"
    );
    let stale_thaws = ledger.stale_thaws.load(Ordering::SeqCst);
    assert!(
        stale_thaws > 0,
        "seed {seed}: no stalled leader woke up to find another leading; nothing was tested"
    );
    assert!(
        stepped_down,
        "seed {seed}: the last leader did not release its live lease on stopping: {:?}",
        server
            .requests()
            .iter()
            .filter(|r| r.at >= stopped_at)
            .collect::<Vec<_>>()
    );
    println!(
        "frozen: {} terms over {stalls} stalls ({stale_thaws} leaders thawed into another's term), \
         {jumps} clock jumps, {kills} kills; fences {fences:?}",
        fences.len()
    );
}

/// Whether the journal shows `key` released after `since` while its lease
/// was still live: a `204` release before the expiry of the latest grant
/// (acquire or renew) that preceded it. A release after the lease ran out
/// (or none) does not count.
fn released_while_live(
    server: &MockServer,
    key: &str,
    since: chrono::DateTime<chrono::Utc>,
) -> bool {
    use volcano_mock_server::Operation;
    let journal = server.requests();
    let mut live_until = None;
    for entry in journal.iter().filter(|r| r.key == key) {
        match entry.operation {
            Operation::Acquire | Operation::Renew if entry.expires_at.is_some() => {
                live_until = entry.expires_at;
            }
            Operation::Release if entry.at >= since && entry.status == Some(204) => {
                return live_until.is_some_and(|until| entry.at < until);
            }
            _ => {}
        }
    }
    false
}

/// Delays the next release by 300 ms: a `run` that hands its release off
/// instead of waiting for it returns while the lease is still held.
fn slow_next_release(server: &MockServer) {
    use volcano_mock_server::{Fault, Operation};
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on(Operation::Release)
            .times(1),
    );
}

/// A candidate whose terms never end by themselves, running in a task,
/// with the sender that makes it step down (`until`); `termed` is set when
/// a term begins.
fn stoppable_candidate(
    client: &volcano::Client,
    termed: Arc<AtomicBool>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), Error>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(
        client
            .locks()
            .leader(KEY, TTL)
            .until(async {
                let _ = stopped.await;
            })
            .run(move |_term| {
                termed.store(true, Ordering::SeqCst);
                async { std::future::pending::<Result<(), Error>>().await }
            }),
    );
    (stop, run)
}

/// The next acquire is applied at once and its answer held for 20 s.
fn apply_next_acquire_and_hold_its_answer(server: &MockServer) {
    use volcano_mock_server::{Fault, Operation};
    server.inject(
        Fault::delay_response(Duration::from_secs(20))
            .on(Operation::Acquire)
            .times(1),
    );
}

/// Whether an acquire was applied (granted) within 5 s.
async fn applied(server: &MockServer) -> bool {
    use volcano_mock_server::Operation;
    let granted = server.wait_for(Operation::Acquire, 201, Duration::from_secs(5));
    granted.await.is_some()
}

/// A candidate that steps down while its campaign's acquire was applied
/// but not answered: the SDK generated that token, so the acquire is
/// undone. `run` returns within a second of `until` (it waits 0.75 s for
/// the undo's release, slowed 0.3 s here); the undo then waits in the
/// background until no try can land (5 s of timeout, 2 s of margin), and
/// `shutdown` waits for it.
#[tokio::test]
async fn stepping_down_with_the_campaign_acquire_unanswered_releases_it_before_returning() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    apply_next_acquire_and_hold_its_answer(&server);
    slow_next_release(&server);
    let (stop, run) = stoppable_candidate(&client, Arc::default());
    assert!(applied(&server).await, "the campaign's acquire was applied");
    assert!(held_on_server(&server));
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert!(
        !held_on_server(&server),
        "run returned with the campaign's lease still held"
    );
    assert_eq!(
        client.shutdown(Duration::from_secs(10)).await,
        Vec::<String>::new()
    );
}

/// The same acquire, with the task running `run` aborted: the undo goes to
/// the client's background releases, which `shutdown` waits for.
#[tokio::test]
async fn an_aborted_campaign_with_its_acquire_unanswered_is_released_through_the_client() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    apply_next_acquire_and_hold_its_answer(&server);
    let run = tokio::spawn(
        client
            .locks()
            .leader(KEY, TTL)
            .run(|_term| async { std::future::pending::<Result<(), Error>>().await }),
    );
    assert!(applied(&server).await, "the campaign's acquire was applied");
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    // The undo ends once no try can land (5 s of timeout, 2 s of margin).
    assert_eq!(
        client.shutdown(Duration::from_secs(10)).await,
        Vec::<String>::new()
    );
    assert!(!held_on_server(&server), "released, not left for the ttl");
}

/// A campaign acquire answered 500 may have been applied: the campaign
/// waits through it (as through a 503: the same token makes another try
/// safe), and when it steps down it releases with the campaign's token
/// before `run` returns.
#[tokio::test]
async fn a_campaign_acquire_answered_500_is_released_before_run_returns() {
    use wiremock::matchers::method;
    use wiremock::{Mock, ResponseTemplate};
    let wire = server().await;
    Mock::given(method("POST"))
        .respond_with(error_body(500, "boom", None))
        .mount(&wire)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&wire)
        .await;
    let client = client(&wire.uri());
    client
        .locks()
        .leader(KEY, TTL)
        .poll_interval(Duration::from_millis(200))
        .until(tokio::time::sleep(Duration::from_millis(1_500)))
        .run(|_term| async { Ok::<(), Error>(()) })
        .await
        .expect("stepped down");
    let requests = received(&wire).await;
    let tries = requests
        .iter()
        .filter(|r| r.method.as_str() == "POST")
        .count();
    assert!(tries >= 2, "waited through the 500: {tries} tries");
    let token = |verb: &str| {
        requests
            .iter()
            .find(|r| r.method.as_str() == verb)
            .and_then(|r| header(r, "x-volcano-lock-token"))
            .map(str::to_owned)
    };
    assert!(token("DELETE").is_some(), "no release sent: {requests:?}");
    assert_eq!(
        token("DELETE"),
        token("POST"),
        "released the campaign's token"
    );
}

/// `until` fires during the renewal that runs before the first term (the
/// acquire took so long that no safe window was left): `run` returns only
/// after releasing the lease that renewal may have extended.
#[tokio::test]
async fn stepping_down_during_the_renewal_before_the_first_term_releases_before_returning() {
    use volcano_mock_server::{Fault, Operation};
    let server = MockServer::start().await;
    let client = mock_client(&server);
    // The grant is read as `expires_at - Date - 1 s` (Date has whole
    // seconds): 4 s and the server clock's fraction of a second when the
    // acquire is applied. Applied 2.5 s after it is sent, at a fraction
    // near zero, that leaves about 1.5 s: no safe window, so the lease is
    // renewed at once, before any term.
    let fraction = u64::from(server.now().timestamp_subsec_millis());
    tokio::time::sleep(Duration::from_millis((1_500 - fraction) % 1_000)).await;
    server.inject(
        Fault::delay(Duration::from_millis(2_500))
            .on(Operation::Acquire)
            .times(1),
    );
    server.inject(
        Fault::delay_response(Duration::from_secs(20))
            .on(Operation::Renew)
            .times(1),
    );
    slow_next_release(&server);
    let termed = Arc::new(AtomicBool::new(false));
    let (stop, run) = stoppable_candidate(&client, termed.clone());
    let renewing = server.wait_for(Operation::Renew, 200, Duration::from_secs(10));
    assert!(renewing.await.is_some(), "the pre-term renewal was applied");
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert!(!termed.load(Ordering::SeqCst), "no term began");
    assert!(
        !held_on_server(&server),
        "run returned with the lease still held"
    );
    assert_eq!(
        client.shutdown(Duration::from_secs(5)).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_term_whose_lock_was_taken_over_ends_run_with_the_loss() {
    // Force-released and taken by another worker before any renewal: only
    // the final release can tell, and `run` says so.
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let server_ref = &server;
    let err = client
        .locks()
        .leader(KEY, Duration::from_secs(60))
        .run(|_term| async move {
            let other = mock_client(server_ref).locks();
            other.force_release(KEY).await?;
            other.acquire(KEY, TTL).await?;
            Ok::<(), Error>(())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::LockLost(lost) if lost.reason() == volcano::LostReason::TakenOver),
        "{err:?}"
    );
    assert!(
        held_on_server(&server),
        "the other worker's lease is untouched"
    );
}

#[tokio::test]
async fn a_capped_term_then_stepping_down_while_making_way_returns_ok() {
    // The term reaches its max hold; `until` fires while the candidate
    // gives the others their chance: `run` steps down with Ok, the cap is
    // no error.
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let leader = client
        .locks()
        .leader(KEY, TTL)
        .max_hold(Duration::from_secs(2))
        .poll_interval(Duration::from_secs(10));
    let mut status = leader.status();
    let result = leader
        .until(async move {
            let _ = status
                .wait_for(|s| matches!(s, volcano::LeaderStatus::Leading { .. }))
                .await;
            let _ = status
                .wait_for(|s| !matches!(s, volcano::LeaderStatus::Leading { .. }))
                .await;
        })
        .run(|_term| std::future::pending::<Result<(), Error>>())
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert!(!held_on_server(&server));
}
