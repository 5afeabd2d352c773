//! What happened in one run: every event of the programs and the driver,
//! stamped with simulated time, in the order it happened. The trace file
//! is this log, one line per event.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A program got a lease or a guard on `key` with fence `fence`: from
    /// now until its [`Event::Ended`], it believes it holds the key.
    Believes {
        client: usize,
        key: String,
        fence: i64,
    },
    /// That belief ended (released, lost, dropped); `why` says how.
    Ended {
        client: usize,
        key: String,
        fence: i64,
        why: String,
    },
    /// A plain acquire returned a lease (not a guard: nothing renews it).
    Leased {
        client: usize,
        key: String,
        fence: i64,
    },
    /// A release call for `key` returned success.
    Released { client: usize, key: String },
    /// A write through the key's gate, with the writer's fence.
    Wrote {
        client: usize,
        key: String,
        fence: i64,
        accepted: bool,
        /// What the guard said was left of its lease then.
        remaining: Duration,
        /// Whether it said it was at risk then (`None`: it was lost).
        at_risk: Option<bool>,
    },
    /// A guard broke its own contract (a wrong `ttl()`, say).
    Contract { client: usize, what: String },
    /// An operation that waits for `key` if it is held, until `until`,
    /// trying at most `poll` apart once its ramp has grown.
    Waits {
        client: usize,
        key: String,
        until: Duration,
        how: Waiting,
        poll: Duration,
    },
    /// A program's operation ended (done, failed or dropped).
    StepEnded { client: usize },
    /// A force-release of `key` (breaks exclusion by design).
    Forced { client: usize, key: String },
    /// An operation's outcome worth a line (errors, skips); for an
    /// operation that failed, whether its error says "try again" (the key
    /// held, a 429, a 5xx, no answer).
    Note {
        client: usize,
        what: String,
        try_again: Option<bool>,
    },
    /// A program finished; `unreleased` is what `shutdown` reported,
    /// `live_then` the leases (key, fence) the server held at that moment,
    /// read from the server directly, and `renewing` its client's
    /// `active_renewals()` then.
    Done {
        client: usize,
        unreleased: Vec<String>,
        live_then: Vec<(String, i64)>,
        /// `active_renewals()` then.
        renewing: usize,
    },
    /// A release the program sent by hand (a plain lease, its own token)
    /// did not free `key`: the program knows, and the lease is its own
    /// business, not `shutdown`'s. `fence` when the program knows it (a
    /// plain lease); else every lease of the key granted to it so far.
    Kept {
        client: usize,
        key: String,
        fence: Option<i64>,
    },
    /// A hold was given its options all at once (`AcquireOptions`): its
    /// acquire goes under this request id, each attempt given up within
    /// `timeout` if one was set.
    Asked {
        client: usize,
        key: String,
        request_id: String,
        timeout: Option<Duration>,
    },
    /// A second task of `client` waits for `key` behind the operation
    /// under way (which is waiting for it too), until `until`: its tries
    /// go under `request_id`.
    Behind {
        client: usize,
        key: String,
        request_id: String,
        until: Duration,
    },
    /// The wait of `client`'s task behind another ([`Event::Behind`])
    /// ended: granted, failed or timed out.
    BehindEnded { client: usize },
    /// A program chose its own token for `key` (known here by a hash):
    /// it releases that token by hand, whatever became of its acquire.
    OwnToken {
        client: usize,
        key: String,
        token_hash: u64,
    },
    /// A leader's status changed (as a watcher of it saw, at once):
    /// `leading`, `following`, `unreachable` or `stopped`.
    LeaderSays {
        client: usize,
        key: String,
        status: &'static str,
    },
    /// A scope's closure returned with its lock held and `left` of its
    /// minimum hold to go (on its host's clock): the service must keep
    /// the key that long from now, whatever becomes of the process.
    MinimumAsked {
        client: usize,
        key: String,
        fence: i64,
        left: Duration,
        /// Capped by an equal `max_hold`: with less than the shortest
        /// lease left of the cap it is released (not judged as kept).
        capped: bool,
    },
    /// That scope ended: `kept` when it returned `Ok` with its lease
    /// handed to the service (its guard's loss is `Released`).
    MinimumEnded {
        client: usize,
        key: String,
        fence: i64,
        kept: bool,
    },
    /// What `HeldLock::release_reporting` said of a minimum asked for:
    /// kept by the service, or not.
    MinimumReported {
        client: usize,
        key: String,
        fence: i64,
        kept: bool,
    },
    /// A leader's `until` fired; its terms drain for up to `drain` (zero:
    /// none).
    UntilFired {
        client: usize,
        key: String,
        drain: Duration,
    },
    /// A leader's term saw that it was asked to step down
    /// (`stepping_down()` resolved) and finishes its work.
    Draining {
        client: usize,
        key: String,
        fence: i64,
    },
    /// A leader's term ended: it returned, or was dropped.
    TermDone {
        client: usize,
        key: String,
        fence: i64,
        returned: bool,
    },
    /// A program's wait for a permit of the semaphore `name`, until
    /// `until` (sim time).
    PermitWait {
        client: usize,
        name: String,
        until: Duration,
        /// Its poll interval and the semaphore's permits.
        poll: Duration,
        permits: u32,
    },
    /// That wait ended; `held` when it said every permit stayed taken.
    PermitWaitEnded { client: usize, held: bool },
    /// A try for a permit of the semaphore `name` of `permits` that does
    /// not wait, begun at `began` (sim time); `all_taken` when it said
    /// every permit was taken (`Ok(None)`).
    PermitTry {
        client: usize,
        name: String,
        permits: u32,
        began: Duration,
        all_taken: bool,
    },
    /// A kept minimum (the one [`Event::MinimumAsked`] of the same lease
    /// names) under a `max_hold` that ends at `cap_until` (sim time): the
    /// keep must not outlive it.
    KeepCapped {
        client: usize,
        key: String,
        fence: i64,
        cap_until: Duration,
    },
    /// A leader's `run` returned (its `until` fired before, if it did).
    RunReturned { client: usize, key: String },
    /// A fault the driver injected.
    Fault { what: String },
    /// The server clock jumped by `by` (excuses beliefs that span it).
    ServerJump { by: Duration },
    /// A client host crashed: its leases stay until they expire.
    Crashed { client: usize },
    /// A program observes `key` (`locks.observe`) until `until` (or its
    /// step ends first), looking at most `poll` apart.
    Observing {
        client: usize,
        key: String,
        until: Duration,
        poll: Duration,
    },
    /// The observer yielded a change: its kind, the fence after it, and
    /// the lease seen before it (fence, expiry), if any.
    Observed {
        client: usize,
        key: String,
        kind: &'static str,
        fence: Option<i64>,
        before: Option<(i64, chrono::DateTime<chrono::Utc>)>,
    },
}

/// How an operation waits for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// A waiting acquire (hold, with_lock, acquire): it fails once its
    /// deadline has passed, at once.
    Acquire,
    /// A set of keys (hold_all, with_locks): it fails once the deadline has
    /// passed, after releasing the keys it got.
    Set,
    /// A leader: it campaigns until then.
    Campaign,
}

/// An event and when it happened (simulated time since the start).
#[derive(Debug, Clone)]
pub(crate) struct Stamped {
    pub(crate) at: Duration,
    pub(crate) event: Event,
}

/// The shared log of a run.
#[derive(Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<Stamped>>>);

impl Log {
    pub(crate) fn push(&self, event: Event) {
        let at = turmoil::sim_elapsed().unwrap_or_default();
        self.push_at(at, event);
    }

    pub(crate) fn push_at(&self, at: Duration, event: Event) {
        self.lock().push(Stamped { at, event });
    }

    /// Whether program `client` has logged [`Event::Done`].
    pub(crate) fn finished(&self, client: usize) -> bool {
        self.lock()
            .iter()
            .any(|e| matches!(e.event, Event::Done { client: c, .. } if c == client))
    }

    pub(crate) fn events(&self) -> Vec<Stamped> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Stamped>> {
        crate::lock(&self.0)
    }
}

/// A token as the log knows it: a hash, not the secret.
pub(crate) fn token_hash(token: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same in every run.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    token.hash(&mut hasher);
    hasher.finish()
}

/// The trace: one line per event, `seconds.millis event`.
pub(crate) fn trace(events: &[Stamped]) -> String {
    let mut out = String::new();
    for e in events {
        let _ = writeln!(
            out,
            "{:>4}.{:03} {:?}",
            e.at.as_secs(),
            e.at.subsec_millis(),
            e.event
        );
    }
    out
}
