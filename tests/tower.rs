//! `volcano::tower`: `LockLayer` and `PermitLayer` around services, against
//! the mock server and its journal.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{live_on as live, mock_client};
use tokio::sync::Notify;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt as _};
use volcano::tower::{LockLayer, PermitLayer};
use volcano::Error;
use volcano_mock_server::{MockServer, Operation};

const TTL: Duration = Duration::from_secs(10);

/// A job with an id: its lock's key.
struct Job {
    id: u32,
    /// How long it works.
    work: Duration,
}

fn key_of(job: &Job) -> String {
    format!("job-{}", job.id)
}

/// The error a layered call failed with, as the SDK's error.
fn lock_error(err: &BoxError) -> &Error {
    err.downcast_ref::<Error>()
        .unwrap_or_else(|| panic!("not a volcano::Error: {err}"))
}

/// Records each call's start and end, and how many run at once.
#[derive(Clone, Default)]
struct Tally {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    spans: Arc<Mutex<Vec<(tokio::time::Instant, tokio::time::Instant)>>>,
}

impl Tally {
    /// A service that works `job.work` and counts itself.
    fn service(
        &self,
    ) -> impl Service<Job, Response = u32, Error = BoxError, Future: Send> + Clone + Send + 'static
    {
        let tally = self.clone();
        tower::service_fn(move |job: Job| {
            let tally = tally.clone();
            async move {
                let began = tokio::time::Instant::now();
                let now = tally.running.fetch_add(1, Ordering::SeqCst) + 1;
                tally.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(job.work).await;
                tally.running.fetch_sub(1, Ordering::SeqCst);
                tally
                    .spans
                    .lock()
                    .unwrap()
                    .push((began, tokio::time::Instant::now()));
                Ok::<_, BoxError>(job.id)
            }
        })
    }

    fn overlapping(&self) -> bool {
        let mut spans = self.spans.lock().unwrap().clone();
        spans.sort();
        spans.windows(2).any(|w| w[1].0 < w[0].1)
    }
}

/// The acquires of `key` the server answered with `status`.
fn grants(server: &MockServer, key: &str, status: u16) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Acquire && r.key == key && r.status == Some(status))
        .count()
}

/// Two calls with one key at once: one runs, the other fails at once with
/// a lock-held error (one 409 in the journal); the first is released.
#[tokio::test]
async fn a_second_call_with_the_same_key_fails_at_once_without_wait() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let tally = Tally::default();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of))
        .service(tally.service());
    let first = tokio::spawn(svc.clone().oneshot(Job {
        id: 1,
        work: Duration::from_secs(3),
    }));
    tokio::time::timeout(Duration::from_secs(5), async {
        while tally.running.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let began = tokio::time::Instant::now();
    let second = svc
        .clone()
        .oneshot(Job {
            id: 1,
            work: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(lock_error(&second).is_lock_held(), "{second}");
    assert!(began.elapsed() < Duration::from_millis(500), "at once");
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(tally.most.load(Ordering::SeqCst), 1);
    assert_eq!(
        (grants(&server, "job-1", 201), grants(&server, "job-1", 409)),
        (1, 1)
    );
    assert!(!live(&server, "job-1"), "released when the call ended");
    // Another key runs beside it.
    let other = svc
        .oneshot(Job {
            id: 2,
            work: Duration::ZERO,
        })
        .await;
    assert_eq!(other.unwrap(), 2);
}

/// With `.wait`, calls with one key run in turn, never overlapping, each
/// under a lease of its own (checked in the journal: every grant of the
/// key after the previous lease was released).
#[tokio::test]
async fn with_wait_calls_with_one_key_run_in_turn() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let tally = Tally::default();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of).wait(Duration::from_secs(20)))
        .service(tally.service());
    let calls: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(svc.clone().oneshot(Job {
                id: 9,
                work: Duration::from_millis(200),
            }))
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), 9);
    }
    assert!(!tally.overlapping(), "{:?}", tally.spans.lock().unwrap());
    assert_eq!(tally.most.load(Ordering::SeqCst), 1);
    // On the server: grant, release, grant, release... never two live.
    let mut live_now = 0;
    for r in server.requests().iter().filter(|r| r.key == "job-9") {
        match (r.operation, r.status) {
            (Operation::Acquire, Some(201)) => live_now += 1,
            (Operation::Release, Some(204)) => live_now -= 1,
            _ => {}
        }
        assert!(live_now <= 1, "two leases of job-9 at once");
    }
    assert_eq!(grants(&server, "job-9", 201), 4);
}

/// A `PermitLayer` of 2 on two clients (two hosts): never more than two
/// calls at once across both, and every call runs (with `.wait`); without
/// a wait, a call that finds both permits taken fails with "held".
#[tokio::test]
async fn permits_limit_calls_across_two_clients() {
    let server = MockServer::start().await;
    let tally = Tally::default();
    let hosts: Vec<_> = (0..2).map(|_| mock_client(&server)).collect();
    let mut calls = Vec::new();
    for client in &hosts {
        let svc = ServiceBuilder::new()
            .layer(
                PermitLayer::new(client.locks().semaphore("partner-api", 2), TTL)
                    .wait(Duration::from_secs(30)),
            )
            .service(tally.service());
        for id in 0..5 {
            calls.push(tokio::spawn(svc.clone().oneshot(Job {
                id,
                work: Duration::from_millis(300),
            })));
        }
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(tally.spans.lock().unwrap().len(), 10);
    assert_eq!(tally.most.load(Ordering::SeqCst), 2, "at most two at once");
    assert!(
        server.locks().iter().all(|l| !l.live),
        "every permit released"
    );

    // Both permits taken by another host: a call without a wait fails.
    let holder = hosts[0].locks().semaphore("partner-api", 2);
    let a = holder.acquire(TTL).await.unwrap();
    let b = holder.acquire(TTL).await.unwrap();
    let svc = ServiceBuilder::new()
        .layer(PermitLayer::new(
            hosts[1].locks().semaphore("partner-api", 2),
            TTL,
        ))
        .service(tally.service());
    let err = svc
        .oneshot(Job {
            id: 0,
            work: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(lock_error(&err).is_lock_held(), "{err}");
    a.release().await.unwrap();
    b.release().await.unwrap();
}

/// The inner service's error passes through, boxed, as its own type; the
/// lock is released.
#[tokio::test]
async fn the_inner_error_passes_through() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of))
        .service_fn(|_job: Job| async { Err::<u32, _>(std::io::Error::other("disk full")) });
    let err = svc
        .oneshot(Job {
            id: 3,
            work: Duration::ZERO,
        })
        .await
        .unwrap_err();
    let io = err
        .downcast_ref::<std::io::Error>()
        .expect("the inner error");
    assert_eq!(io.to_string(), "disk full");
    assert!(!live(&server, "job-3"));
}

/// A key that is not a valid key is an error of the call (nothing sent),
/// never a panic.
#[tokio::test]
async fn a_bad_key_is_an_error_of_the_call() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, |_: &Job| {
            "not a key!".to_owned()
        }))
        .service_fn(|job: Job| async move { Ok::<_, BoxError>(job.id) });
    let err = svc
        .oneshot(Job {
            id: 1,
            work: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(lock_error(&err), Error::InvalidArgument(_)),
        "{err}"
    );
    assert!(server.requests().is_empty(), "nothing sent");
}

/// Sets a flag when dropped: the inner call's future was dropped.
struct DropFlag(Arc<Notify>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// A call dropped while it runs (a client gone, a timeout outside)
/// releases its lock at once.
#[tokio::test]
async fn a_dropped_call_releases_its_lock() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let entered = Arc::new(Notify::new());
    let inside = entered.clone();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(
            client.locks(),
            Duration::from_secs(60),
            key_of,
        ))
        .service_fn(move |_job: Job| {
            let inside = inside.clone();
            async move {
                inside.notify_one();
                std::future::pending::<()>().await;
                Ok::<u32, BoxError>(0)
            }
        });
    let call = svc.oneshot(Job {
        id: 5,
        work: Duration::ZERO,
    });
    tokio::select! {
        _ = call => panic!("the call never ends by itself"),
        () = entered.notified() => {}
    }
    assert!(
        server
            .wait_for(Operation::Release, 204, Duration::from_secs(5))
            .await
            .is_some(),
        "released in the background"
    );
    assert!(!live(&server, "job-5"));
}

/// With `.cancel_on_loss()`, a loss (the key force-released by an
/// operator) drops the call at once and it fails with `LockLost`; the
/// inner service sees its guard through `volcano::tower::guard()`.
#[tokio::test]
async fn a_loss_with_cancel_on_loss_drops_the_call() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let dropped = Arc::new(Notify::new());
    let flag = dropped.clone();
    let fences = Arc::new(Mutex::new(Vec::new()));
    let seen = fences.clone();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), Duration::from_secs(5), key_of).cancel_on_loss())
        .service_fn(move |_job: Job| {
            let flag = DropFlag(flag.clone());
            let seen = seen.clone();
            async move {
                let guard = volcano::tower::guard().expect("the call's guard");
                seen.lock().unwrap().push(guard.lease().fencing_token());
                let _flag = flag;
                std::future::pending::<()>().await;
                Ok::<u32, BoxError>(0)
            }
        });
    assert!(volcano::tower::guard().is_none(), "outside any call");
    let call = tokio::spawn(svc.oneshot(Job {
        id: 6,
        work: Duration::ZERO,
    }));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !live(&server, "job-6") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    mock_client(&server)
        .locks()
        .force_release("job-6")
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the loss ends the call")
        .unwrap()
        .unwrap_err();
    assert!(matches!(lock_error(&err), Error::LockLost(_)), "{err}");
    tokio::time::timeout(Duration::from_secs(1), dropped.notified())
        .await
        .expect("the inner future was dropped");
    assert_eq!(fences.lock().unwrap().len(), 1);
}

/// A service ready only when told: `poll_ready` is the inner service's.
#[derive(Clone)]
struct Gate(Arc<AtomicUsize>);

impl Service<Job> for Gate {
    type Response = u32;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.0.load(Ordering::SeqCst) {
            0 => Poll::Pending,
            1 => Poll::Ready(Ok(())),
            _ => Poll::Ready(Err("closed".into())),
        }
    }

    fn call(&mut self, job: Job) -> Self::Future {
        Box::pin(async move { Ok(job.id) })
    }
}

#[tokio::test]
async fn readiness_is_the_inner_services() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let state = Arc::new(AtomicUsize::new(0));
    let mut svc = tower::Layer::layer(
        &LockLayer::new(client.locks(), TTL, key_of),
        Gate(state.clone()),
    );
    let waker = futures_noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(svc.poll_ready(&mut cx).is_pending());
    state.store(1, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    state.store(2, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Err(_))));
    assert!(server.requests().is_empty(), "readiness sends nothing");
}

/// A waker that does nothing.
fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

/// Layers and services are Clone, Send and Sync; their Debug shows no
/// secret.
#[tokio::test]
async fn layers_are_clone_send_sync_and_debug_without_secrets() {
    fn clone_send_sync<T: Clone + Send + Sync + 'static>(_: &T) {}
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let lock = LockLayer::new(client.locks(), TTL, key_of);
    let permit = PermitLayer::new(client.locks().semaphore("p", 2), TTL);
    clone_send_sync(&lock);
    clone_send_sync(&permit);
    let svc = ServiceBuilder::new()
        .layer(lock.clone())
        .layer(permit.clone())
        .service(Tally::default().service());
    clone_send_sync(&svc);
    let shown = format!("{lock:?} {permit:?}");
    assert!(!shown.contains(server.service_key()), "{shown}");
    assert!(!shown.contains(server.anon_key()), "{shown}");
}

/// A service that must be made ready before each call, as tower's rule
/// says (`ConcurrencyLimit` panics otherwise): a clone is not ready.
struct Strict {
    ready: bool,
    calls: Arc<AtomicUsize>,
}

impl Clone for Strict {
    fn clone(&self) -> Self {
        Strict {
            ready: false,
            calls: self.calls.clone(),
        }
    }
}

impl Service<Job> for Strict {
    type Response = u32;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, job: Job) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(job.id) })
    }
}

/// The inner service is made ready before each call it gets, whichever
/// instance the layer calls (the one `poll_ready` made ready is given
/// back while the call waits for its lock).
#[tokio::test]
async fn the_inner_service_is_ready_before_each_call() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of))
        .service(Strict {
            ready: false,
            calls: calls.clone(),
        });
    for id in 0..3 {
        let job = Job {
            id,
            work: Duration::ZERO,
        };
        assert_eq!(svc.ready().await.unwrap().call(job).await.unwrap(), id);
    }
    let permits = ServiceBuilder::new()
        .layer(PermitLayer::new(client.locks().semaphore("strict", 2), TTL))
        .service(Strict {
            ready: false,
            calls: calls.clone(),
        });
    permits
        .oneshot(Job {
            id: 9,
            work: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// `.min_hold(d)`: a call that ends at once leaves the key held by the
/// service until the minimum's end, as `with_lock`'s does.
#[tokio::test]
async fn min_hold_keeps_the_key_after_the_call() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of).min_hold(Duration::from_secs(60)))
        .service(Tally::default().service());
    svc.oneshot(Job {
        id: 4,
        work: Duration::ZERO,
    })
    .await
    .unwrap();
    assert!(live(&server, "job-4"), "kept for its minimum");
    let lock = server
        .locks()
        .into_iter()
        .find(|l| l.key == "job-4")
        .unwrap();
    let kept = (lock.expires_at - server.now()).to_std().unwrap();
    assert!(kept > Duration::from_secs(55), "{kept:?}");
}

/// A `.wait` that runs out fails with "held"; the holder keeps its lock.
#[tokio::test]
async fn a_wait_that_runs_out_is_held() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let holder = mock_client(&server)
        .locks()
        .acquire("job-8", TTL)
        .await
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of).wait(Duration::from_millis(700)))
        .service(Tally::default().service());
    let began = tokio::time::Instant::now();
    let err = svc
        .oneshot(Job {
            id: 8,
            work: Duration::ZERO,
        })
        .await
        .unwrap_err();
    assert!(lock_error(&err).is_lock_held(), "{err}");
    assert!(began.elapsed() >= Duration::from_millis(700));
    assert!(live(&server, "job-8"));
    assert!(holder.fencing_token() > 0);
}

/// A panic in the inner service releases the lock, and `guard()` is the
/// call's own: `None` in a task the call spawned.
#[tokio::test]
async fn a_panic_releases_and_spawned_tasks_have_no_guard() {
    let server = MockServer::start().await;
    let client = mock_client(&server);
    let svc = ServiceBuilder::new()
        .layer(LockLayer::new(client.locks(), TTL, key_of))
        .service_fn(|job: Job| async move {
            let spawned = tokio::spawn(async { volcano::tower::guard().is_none() });
            assert!(spawned.await.unwrap(), "a spawned task sees no guard");
            assert!(volcano::tower::guard().is_some());
            if job.id == 13 {
                panic!("the job panicked");
            }
            Ok::<_, BoxError>(job.id)
        });
    assert_eq!(
        svc.clone()
            .oneshot(Job {
                id: 12,
                work: Duration::ZERO
            })
            .await
            .unwrap(),
        12
    );
    let call = tokio::spawn(svc.oneshot(Job {
        id: 13,
        work: Duration::ZERO,
    }));
    assert!(call.await.unwrap_err().is_panic());
    assert!(server
        .wait_for(Operation::Release, 204, Duration::from_secs(5))
        .await
        .is_some());
    tokio::time::timeout(Duration::from_secs(5), async {
        while live(&server, "job-13") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("released after the panic");
}
