//! What a run must show, judged from PostgreSQL's committed history, the
//! mock server's journal and lock table, and what each process said.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::db::Outcome;

/// A lease the service granted: an acquire answered 201.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) key: String,
    pub(crate) fence: i64,
    pub(crate) at_ms: i64,
}

/// Everything a run produced.
pub(crate) struct Evidence {
    pub(crate) fenced: bool,
    pub(crate) db: Outcome,
    pub(crate) grants: Vec<Grant>,
    /// When each lease (key, fence) was last to expire, as the service
    /// granted or renewed it.
    pub(crate) expiries: BTreeMap<(String, i64), i64>,
    /// The service's leases still live right after every process ended.
    pub(crate) live_at_end: Vec<(String, i64)>,
    /// Each process's lines (worker events; the CLI's summary), by name.
    pub(crate) said: BTreeMap<String, Vec<Value>>,
    /// How each process ended: its exit code (`None`: a signal).
    pub(crate) exits: BTreeMap<String, Option<i32>>,
    /// Processes killed with SIGKILL, and when.
    pub(crate) killed: BTreeMap<String, i64>,
    /// The keys each process was started for.
    pub(crate) keys_of: BTreeMap<String, Vec<String>>,
    /// The mock's journal had dropped its oldest entries.
    pub(crate) truncated: bool,
    /// When a network or service fault (partition, held answers, resets,
    /// delays, storms), a pause or a 429 of the service's quota was on:
    /// [from, to) and what it was.
    pub(crate) faults_on: Vec<(i64, i64, &'static str)>,
}

/// What the checks found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) lost_updates: i64,
    /// Commits whose fence is below one already committed for the key
    /// (a violation through the fence; in the control, how often a stale
    /// holder wrote).
    pub(crate) stale_commits: usize,
    pub(crate) untruthful: usize,
    pub(crate) unexplained_refusals: usize,
    pub(crate) leaks: usize,
    pub(crate) refusals: usize,
    pub(crate) successes: usize,
    pub(crate) commits: usize,
    pub(crate) holders_per_key: BTreeMap<String, usize>,
    pub(crate) takeovers_judged: usize,
    /// Kills of a holder not judged because a fault (a pause, a storm, a
    /// 429 of the service's quota) overlapped its takeover window.
    pub(crate) takeovers_overlapped: usize,
    /// The first fault found in each window not judged, by kind.
    pub(crate) overlapped_by: BTreeMap<&'static str, usize>,
    /// Open holds of killed processes not judged for another reason: the
    /// lease had run out before the kill, its expiry was not in the
    /// journal, or no later grant of the key came before the run ended.
    pub(crate) not_a_case: BTreeMap<&'static str, usize>,
    pub(crate) slow_takeovers: usize,
    pub(crate) slowest_takeover_ms: i64,
    pub(crate) violations: Vec<String>,
}

impl Evidence {
    fn first_grant_above(&self, key: &str, fence: i64) -> Option<&Grant> {
        self.grants
            .iter()
            .filter(|g| g.key == key && g.fence > fence)
            .min_by_key(|g| g.at_ms)
    }

    /// The (process, key, fence) holds whose process reported success:
    /// `done` with `ok`, or `volcano locks run` exiting 0 without a loss.
    fn successes(&self) -> BTreeSet<(String, String, i64)> {
        let mut ok = BTreeSet::new();
        for (name, lines) in &self.said {
            for line in lines {
                if line["event"] == "done" && line["ok"] == true {
                    for held in line["keys"].as_array().into_iter().flatten() {
                        if let (Some(k), Some(f)) = (held["key"].as_str(), held["fence"].as_i64()) {
                            ok.insert((name.clone(), k.to_owned(), f));
                        }
                    }
                }
                let summary_ok = line.get("exit_code") == Some(&Value::from(0))
                    && line["lost"] == false
                    && self.exits.get(name) == Some(&Some(0));
                if summary_ok {
                    if let (Some(k), Some(f)) =
                        (line["key"].as_str(), line["fencing_token"].as_i64())
                    {
                        ok.insert((name.clone(), k.to_owned(), f));
                    }
                }
            }
        }
        ok
    }
}

pub(crate) fn judge(ev: &Evidence) -> Verdict {
    let mut v = Verdict::default();
    if ev.truncated {
        v.violations.push(
            "the mock's journal dropped its oldest entries: the checks would miss grants".into(),
        );
    }
    lost_updates(ev, &mut v);
    stale_commits(ev, &mut v);
    refusals(ev, &mut v);
    truthful(ev, &mut v);
    leaks(ev, &mut v);
    progress(ev, &mut v);
    v
}

/// Each committed increment adds one: a counter below the number of its
/// commits lost the difference (two read-modify-writes read the same
/// value).
fn lost_updates(ev: &Evidence, v: &mut Verdict) {
    v.commits = ev.db.history.len();
    for (key, n) in &ev.db.counters {
        let commits = ev.db.history.iter().filter(|w| &w.key == key).count() as i64;
        let lost = commits - n;
        v.lost_updates += lost.max(0);
        if lost != 0 && ev.fenced {
            v.violations.push(format!(
                "{key}: {commits} increments committed, the counter is {n}: {lost} lost"
            ));
        }
    }
}

/// With the fence, commits of a key are in non-decreasing fence order.
fn stale_commits(ev: &Evidence, v: &mut Verdict) {
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for w in &ev.db.history {
        let top = highest.entry(&w.key).or_insert(w.fence);
        if w.fence < *top {
            v.stale_commits += 1;
            if ev.fenced {
                v.violations.push(format!(
                    "{}: {} committed value {} with fence {} after fence {} had committed",
                    w.key, w.worker, w.value, w.fence, top
                ));
            }
        }
        *top = (*top).max(w.fence);
    }
}

/// Every refused write came from a holder whose lease had been taken: the
/// service had granted the key to a higher fence.
fn refusals(ev: &Evidence, v: &mut Verdict) {
    for (name, lines) in &ev.said {
        for line in lines.iter().filter(|l| l["event"] == "refused") {
            v.refusals += 1;
            let (Some(key), Some(fence), Some(at)) = (
                line["key"].as_str(),
                line["fence"].as_i64(),
                line["at_ms"].as_i64(),
            ) else {
                continue;
            };
            // The fence it was refused for was granted, to a later holder,
            // before the refusal (a few ms between the two clocks' reads).
            let highest = line["highest"].as_i64();
            let explained = ev.grants.iter().any(|g| {
                g.key == key
                    && g.fence > fence
                    && highest.is_none_or(|h| g.fence == h)
                    && g.at_ms <= at + 50
            });
            if !explained {
                v.unexplained_refusals += 1;
                v.violations.push(format!(
                    "{name}: its write on {key} with fence {fence} was refused at {at} for fence \
                     {highest:?}, which the service had not granted by then"
                ));
            }
        }
    }
}

/// A process that reported success held its lease for all of its writes:
/// none was sent after the service granted the key to a higher fence.
fn truthful(ev: &Evidence, v: &mut Verdict) {
    let ok = ev.successes();
    v.successes = ok.len();
    let mut flagged = BTreeSet::new();
    for w in &ev.db.history {
        // A `locks run` command writes under its CLI's name.
        if !ok.contains(&(w.worker.clone(), w.key.clone(), w.fence)) {
            continue;
        }
        if let Some(next) = ev.first_grant_above(&w.key, w.fence) {
            if next.at_ms < w.sent_at_ms && flagged.insert((w.worker.clone(), w.fence)) {
                v.untruthful += 1;
                v.violations.push(format!(
                    "{} reported success for {} with fence {}, but wrote at {} after fence {} \
                     was granted at {}",
                    w.worker, w.key, w.fence, w.sent_at_ms, next.fence, next.at_ms
                ));
            }
        }
    }
}

/// Right after every process ended, each live lease is one a killed
/// process held, or one its process's `shutdown` named.
fn leaks(ev: &Evidence, v: &mut Verdict) {
    for (key, fence) in &ev.live_at_end {
        let holder = ev.said.iter().find(|(_, lines)| {
            lines.iter().any(|l| {
                let held = l["event"] == "held" && l["key"] == key.as_str();
                let ran = l.get("exit_code").is_some() && l["key"] == key.as_str();
                (held || ran)
                    && (l["fence"].as_i64() == Some(*fence)
                        || l["fencing_token"].as_i64() == Some(*fence))
            })
        });
        // A process killed while it held the key (a `locks run` never says
        // its lease before it ends; a worker may die between the grant and
        // its `held`) leaves the lease to its ttl: not a leak.
        let killed_holder = ev.killed.keys().any(|name| {
            ev.keys_of
                .get(name)
                .is_some_and(|keys| keys.iter().any(|k| k == key))
        });
        let Some((name, lines)) = holder else {
            if killed_holder {
                continue;
            }
            v.leaks += 1;
            v.violations.push(format!(
                "{key} (fence {fence}) is held at the end by no process that said it held it"
            ));
            continue;
        };
        let named = lines.iter().any(|l| {
            l["event"] == "shutdown"
                && l["unreleased"]
                    .as_array()
                    .is_some_and(|keys| keys.iter().any(|k| k == key.as_str()))
        });
        if !named && !ev.killed.contains_key(name) {
            v.leaks += 1;
            v.violations.push(format!(
                "{key} (fence {fence}) is held at the end: {name} ended without releasing it \
                 or naming it"
            ));
        }
    }
}

/// Each key changed hands; a killed holder's key was taken soon after its
/// lease ran out (judged only when no fault was on meanwhile).
fn progress(ev: &Evidence, v: &mut Verdict) {
    for key in ev.db.counters.keys() {
        v.holders_per_key.insert(key.clone(), 0);
    }
    for g in &ev.grants {
        *v.holders_per_key.entry(g.key.clone()).or_default() += 1;
    }
    for (key, holders) in &v.holders_per_key {
        if *holders < 2 {
            v.violations
                .push(format!("{key} never changed hands ({holders} grants)"));
        }
    }
    if ev.db.history.is_empty() {
        v.violations.push("no increment committed at all".into());
    }
    // The bound, from the moment the killed holder's lease expired: the
    // service's second of grace, and three seconds for the waiter's look
    // and its request.
    let bound = 1_000 + 3_000;
    for name in ev.killed.keys() {
        let Some(lines) = ev.said.get(name) else {
            continue;
        };
        // The holds it had open when killed: held, and no done after.
        let open: Vec<(&str, i64)> = lines
            .iter()
            .filter(|l| l["event"] == "held")
            .filter_map(|l| Some((l["key"].as_str()?, l["fence"].as_i64()?)))
            .filter(|(k, f)| {
                !lines.iter().any(|d| {
                    d["event"] == "done"
                        && d["keys"]
                            .as_array()
                            .is_some_and(|ks| ks.iter().any(|x| x["key"] == *k && x["fence"] == *f))
                })
            })
            .collect();
        for (key, fence) in open {
            let Some(expired) = ev.expiries.get(&(key.to_owned(), fence)).copied() else {
                *v.not_a_case.entry("expiry not in the journal").or_default() += 1;
                continue;
            };
            // A lease that had run out before the kill was lost already:
            // no takeover after a kill to judge.
            if ev.killed.get(name).is_some_and(|killed| expired <= *killed) {
                *v.not_a_case
                    .entry("lease ran out before the kill")
                    .or_default() += 1;
                continue;
            }
            let window = (expired - 1_000, expired + bound);
            if let Some((_, _, kind)) = ev
                .faults_on
                .iter()
                .find(|(a, b, _)| *a < window.1 && *b > window.0)
            {
                v.takeovers_overlapped += 1;
                *v.overlapped_by.entry(kind).or_default() += 1;
                continue;
            }
            let Some(next) = ev.first_grant_above(key, fence) else {
                *v.not_a_case
                    .entry("no later grant before the end")
                    .or_default() += 1;
                continue;
            };
            v.takeovers_judged += 1;
            let took = next.at_ms - expired;
            v.slowest_takeover_ms = v.slowest_takeover_ms.max(took);
            if took > bound {
                v.slow_takeovers += 1;
                v.violations.push(format!(
                    "{key}: its holder {name} was killed; its lease (fence {fence}) expired at \
                     {expired}, and the next grant came {took} ms later (bound {bound} ms)"
                ));
            }
        }
    }
}
