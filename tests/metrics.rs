//! The `metrics` feature: what the SDK records, read back from a debugging
//! recorder. Its own test binary: the recorder is process-wide.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::eventually;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use volcano::mock::{Fault, MockServer, Operation};
use volcano::{Client, Error};

/// Everything recorded so far. A debugging snapshot drains what it reads
/// (counters and gauges report the change since the last snapshot,
/// histograms the new samples), so this adds the snapshots up.
struct Recorded {
    snapshotter: Snapshotter,
    totals: HashMap<String, f64>,
    samples: HashMap<String, Vec<f64>>,
}

fn name(metric: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{metric}{{{}}}", labels.join(","))
}

impl Recorded {
    fn refresh(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let name = name(key.name(), &labels);
            match value {
                DebugValue::Counter(n) => *self.totals.entry(name).or_default() += n as f64,
                DebugValue::Gauge(g) => *self.totals.entry(name).or_default() += g.into_inner(),
                DebugValue::Histogram(values) => self
                    .samples
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    /// A counter's total or a gauge's value.
    fn total(&mut self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.refresh();
        self.totals
            .get(&name(metric, labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn samples(&mut self, metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.refresh();
        self.samples
            .get(&name(metric, labels))
            .cloned()
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn acquires_renewals_losses_and_held_locks_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let mut m = Recorded {
        snapshotter: recorder.snapshotter(),
        totals: HashMap::new(),
        samples: HashMap::new(),
    };
    recorder
        .install()
        .expect("the only recorder in this binary");

    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let locks = client.locks();

    // An acquire, and one that finds the lock held.
    let held = locks.hold("ingest", Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.total("volcano_lock_held", &[]), 1.0);
    let err = locks
        .acquire("ingest", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_lock_held());
    let acquires = "volcano_lock_acquires_total";
    assert_eq!(m.total(acquires, &[("outcome", "acquired")]), 1.0);
    assert_eq!(m.total(acquires, &[("outcome", "held")]), 1.0);
    let took = m.samples("volcano_lock_acquire_seconds", &[("outcome", "acquired")]);
    assert_eq!(took.len(), 1);
    assert!(took[0] > 0.0 && took[0] < 5.0, "{took:?}");

    // A waiting acquire that runs out.
    let _ = locks
        .acquire("ingest", Duration::from_secs(5))
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    let waited = m.samples("volcano_lock_wait_seconds", &[("outcome", "held")]);
    assert_eq!(waited.len(), 1);
    assert!(waited[0] >= 0.3, "{waited:?}");

    // Renewals: one answered 503 (retried), then renewed; then refused.
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    let renewals = "volcano_lock_renewals_total";
    let renewed = eventually(Duration::from_secs(10), || {
        m.total(renewals, &[("outcome", "renewed")]) > 0.0
    });
    assert!(renewed.await, "no renewal recorded");
    assert_eq!(m.total(renewals, &[("outcome", "retried")]), 1.0);
    server.inject(Fault::status(409).on(Operation::Renew));
    held.lost().await;
    assert_eq!(m.total(renewals, &[("outcome", "failed")]), 1.0);
    let losses = "volcano_lock_losses_total";
    assert_eq!(m.total(losses, &[("reason", "renewal_failed")]), 1.0);
    let _ = held.release().await;
    assert_eq!(m.total("volcano_lock_held", &[]), 0.0);
    let held_for = m.samples("volcano_lock_hold_seconds", &[]);
    assert_eq!(held_for.len(), 1);
    assert!(held_for[0] > 1.0, "held across renewals: {held_for:?}");

    // with_lock counts as a held lock too, and an ordinary end is no loss.
    server.clear_faults();
    let during = &mut m;
    locks
        .with_lock("report", Duration::from_secs(5), |_guard| async move {
            assert_eq!(during.total("volcano_lock_held", &[]), 1.0, "while held");
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert_eq!(m.total("volcano_lock_held", &[]), 0.0);
    assert_eq!(m.samples("volcano_lock_hold_seconds", &[]).len(), 2);
    assert_eq!(m.total(losses, &[("reason", "renewal_failed")]), 1.0);
    assert_eq!(m.total(acquires, &[("outcome", "acquired")]), 2.0);

    // An outage: every renewal answered 503 until no attempt fits the
    // window. The last attempt counts as failed, not retried, and the loss
    // as a renewal failure.
    server.inject(Fault::status(503).on(Operation::Renew));
    let failed_before = m.total(renewals, &[("outcome", "failed")]);
    let retried_before = m.total(renewals, &[("outcome", "retried")]);
    let held = locks.hold("outage", Duration::from_secs(5)).await.unwrap();
    assert!(held.wait_lost(Duration::from_secs(8)).await);
    let attempts = server
        .requests()
        .iter()
        .filter(|r| r.operation == Operation::Renew && r.key == "outage")
        .count() as f64;
    assert_eq!(
        m.total(renewals, &[("outcome", "failed")]),
        failed_before + 1.0
    );
    assert_eq!(
        m.total(renewals, &[("outcome", "retried")]),
        retried_before + attempts - 1.0,
        "every attempt but the last was retried"
    );
    assert_eq!(m.total(losses, &[("reason", "renewal_failed")]), 2.0);
    let _ = held.release().await;
    server.clear_faults();

    // A lock dropped after its deadline passed, before any task saw it:
    // counted as an expiry, not as an ordinary release.
    let clock = volcano::LeaseClock::adjustable();
    let timed = Client::builder()
        .service_key(server.service_key())
        .api_url(server.url())
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let held = timed
        .locks()
        .hold("late", Duration::from_secs(5))
        .await
        .unwrap();
    let expired_before = m.total(losses, &[("reason", "expired")]);
    clock.advance(Duration::from_secs(6));
    drop(held);
    assert_eq!(
        m.total(losses, &[("reason", "expired")]),
        expired_before + 1.0
    );

    // A leader's terms: won, then ended by `until`; its at-risk episode
    // counted. The key is a label only when asked for.
    server.inject(Fault::status(503).on(Operation::Renew).times(1));
    let (resign, resigned) = tokio::sync::oneshot::channel::<()>();
    let leader = locks
        .leader("scheduler", Duration::from_secs(5))
        .key_in_metrics();
    let mut status = leader.status();
    let run = tokio::spawn(
        leader
            .until(async {
                let _ = resigned.await;
            })
            .run(|term| async move {
                term.lost().await;
                Ok::<(), Error>(())
            }),
    );
    let leading = status.wait_for(|s| matches!(s, volcano::LeaderStatus::Leading { .. }));
    tokio::time::timeout(Duration::from_secs(5), leading)
        .await
        .expect("elected")
        .unwrap();
    let key = [("key", "scheduler")];
    assert_eq!(m.total("volcano_leader_terms_total", &key), 1.0);
    let risked = eventually(Duration::from_secs(6), || {
        m.total("volcano_lock_at_risk_total", &[]) >= 1.0
    });
    assert!(
        risked.await,
        "the 503 on a renewal began an at-risk episode"
    );
    let _ = resign.send(());
    run.await.unwrap().unwrap();
    let ended = [("key", "scheduler"), ("reason", "resigned")];
    assert_eq!(m.total("volcano_leader_terms_ended_total", &ended), 1.0);

    // Two leaders of one process, no key label: one series counts the
    // terms running, so one leader's end leaves the other's term counted.
    let is_leader = "volcano_leader_is_leader";
    let before = m.total(is_leader, &[]);
    let mut stops = Vec::new();
    let mut runs = Vec::new();
    for key in ["ingest", "compact"] {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let leader = locks.leader(key, Duration::from_secs(5));
        let mut status = leader.status();
        runs.push(tokio::spawn(
            leader
                .until(async {
                    let _ = stopped.await;
                })
                .run(|term| async move {
                    term.lost().await;
                    Ok::<(), Error>(())
                }),
        ));
        let leading = status.wait_for(|s| matches!(s, volcano::LeaderStatus::Leading { .. }));
        tokio::time::timeout(Duration::from_secs(5), leading)
            .await
            .expect("elected")
            .unwrap();
        stops.push(stop);
    }
    assert_eq!(m.total(is_leader, &[]), before + 2.0);
    let _ = stops.remove(0).send(());
    runs.remove(0).await.unwrap().unwrap();
    assert_eq!(
        m.total(is_leader, &[]),
        before + 1.0,
        "the other leader's term still runs"
    );
    let _ = stops.remove(0).send(());
    runs.remove(0).await.unwrap().unwrap();
    assert_eq!(m.total(is_leader, &[]), before);
}
