//! Counting semaphores over locks: permit `i` of `name` is the lock
//! `name:i`, `i` in `0..permits`, each with its own lease and fencing
//! token, so the service never lets more than `permits` of them be held.
//!
//! A try takes a permit with one acquire when one is free in the common
//! case: it starts from a spread of its own (its client's, so that clients
//! start on different permits), the permits this client saw held longest
//! ago first (never seen held first). A try that does not wait goes on
//! through the permits until one is free, so that "every permit taken" is
//! said only when each was seen held (one request when the first is free,
//! at most N when all are held). A wait's first round tries at most two
//! permits and each later round one, so that it rotates through the
//! permits at the pace of one waiter on one key; a permit this client
//! frees itself is tried first, at once. Each permit's acquire is a whole
//! hold ([`hold::hold`]): an uncertain acquire is undone like any other,
//! and a future dropped anywhere releases what it took.
//!
//! Waiting follows the one policy: rounds on the ramp (30 % of the time
//! waited, 0.3 s at least, the poll interval at most), the pause a 429 to
//! any of the client's requests names (its shared quota clock), and turns:
//! waiters of one client on one semaphore are served in the order they
//! began, and only the first in line sends; one behind it tries a round of
//! its own just before its deadline. It does not look at holders'
//! expiries: a look per permit per lease would cost a request each; the
//! rotation finds a permit freed by a release or an expiry within as many
//! rounds as there are permits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{hold, Spec};
pub(crate) use memory::Semaphores;
use memory::{Entry, Memory, Tried};

mod memory;
use crate::error::{Error, Result};
use crate::locks::{AcquireOptions, HeldLock, Locks};
use crate::retry::wait::{DEFAULT_POLL, LAST_TRY_LEAD, RAMP_FLOOR, RAMP_RATIO};
use crate::validate;

/// The most permits a semaphore may have. What limits it: `locks status
/// NAME --permits N` reads every permit (100 requests are a sixth of the
/// project's minute), and a permit's key (`name:99`) must stay a valid
/// key; a try's cost does not grow with it.
pub const MAX_PERMITS: u32 = 100;

/// Permits a waiter's first round tries at most; its later rounds try
/// one. A try that does not wait has one round, over every permit until
/// one is free: it says "every permit taken" only when each was seen held.
const FIRST_ROUND: usize = 2;

/// One acquisition of a permit.
pub(crate) struct PermitSpec {
    pub(crate) locks: Locks,
    pub(crate) name: String,
    pub(crate) permits: u32,
    pub(crate) ttl: Duration,
    pub(crate) options: AcquireOptions,
    pub(crate) min_hold: Option<Duration>,
}

/// The key of permit `i` of `name`.
pub(crate) fn permit_key(name: &str, i: u32) -> String {
    format!("{name}:{i}")
}

/// A semaphore's name and count that fit: `name:i` a valid key for every
/// permit, and 1 to [`MAX_PERMITS`] permits.
pub(crate) fn check(name: &str, permits: u32) -> Result<()> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::invalid(format!(
            "a semaphore has 1 to {MAX_PERMITS} permits (got {permits})"
        )));
    }
    validate::key(&permit_key(name, permits - 1)).map_err(|_| {
        Error::invalid(format!(
            "semaphore name {name:?}: its permits' keys ({name}:0 to {name}:{}) must be valid \
             keys: letters, digits, '.', '_', ':' and '-', starting with a letter or digit, at \
             most 128 characters in all",
            permits - 1
        ))
    })
}

/// Takes a permit: a renewing [`HeldLock`] on its key.
pub(crate) async fn acquire(spec: PermitSpec) -> Result<HeldLock> {
    check(&spec.name, spec.permits)?;
    validate::ttl(spec.ttl)?;
    if spec.options.token.is_some() || spec.options.request_id.is_some() {
        return Err(Error::invalid(
            "a permit's token and request id are the SDK's: each permit try is an acquisition \
             of its own",
        ));
    }
    // Every option a permit's hold checks, checked before the line: a
    // bad one must not wait behind another waiter to be refused.
    validate::hold_bounds(spec.min_hold, spec.options.max_hold)?;
    if spec.options.timeout.is_some_and(|t| t.is_zero()) {
        return Err(Error::invalid("timeout must be greater than zero"));
    }
    let poll = spec.options.poll_interval.unwrap_or(DEFAULT_POLL);
    super::wait::check_poll_interval(poll)?;
    let client = spec.locks.client();
    let entry = client.semaphores().memory(&spec.name, spec.permits);
    let start = client.spread() % u64::from(spec.permits);
    let began = Instant::now();
    let deadline = spec.options.wait.map(|wait| deadline_of(began, wait));
    // A try that does not wait has one round, over every permit until one
    // is free; a wait's first round tries two, its later rounds one.
    let first_round = match deadline {
        None if sabotaged!(SemaphoreTryGivesUpEarly) => FIRST_ROUND,
        None => spec.permits as usize,
        Some(_) => FIRST_ROUND,
    };
    let taken = taking(&spec, &entry, start, first_round, began, deadline).await;
    entry.touch();
    taken
}

/// The rounds of a try or a wait, in the line of `entry`'s waiters.
async fn taking(
    spec: &PermitSpec,
    entry: &Entry,
    start: u64,
    first_round: usize,
    began: Instant,
    deadline: Option<Instant>,
) -> Result<HeldLock> {
    let client = spec.locks.client();
    // At most a day: `Duration::MAX` ("do not poll") must not overflow
    // the instants a pause is made of.
    let poll = spec
        .options
        .poll_interval
        .unwrap_or(DEFAULT_POLL)
        .min(crate::retry::wait::MAX_POLL);
    // Behind others of this client, until first in line; a try that does
    // not wait, or a wait just before its deadline, makes a round of its
    // own instead of queueing.
    let line = async {
        match deadline {
            None => entry.line.try_lock().ok(),
            Some(by) => {
                let room = by.saturating_duration_since(Instant::now());
                tokio::time::timeout(room.saturating_sub(LAST_TRY_LEAD), entry.line.lock())
                    .await
                    .ok()
            }
        }
    };
    let Some(mut remembered) = line.await else {
        let mut own = Memory::new(spec.permits);
        let mut tried = Tried::default();
        return match round(
            spec,
            &mut own,
            &[],
            &mut tried,
            start,
            first_round,
            deadline,
        )
        .await
        {
            Ok(held) => Ok(held),
            Err((err, _)) => Err(err),
        };
    };
    let mut woken = entry.woken.subscribe();
    let mut per_round = first_round;
    loop {
        woken.borrow_and_update();
        let freed = entry.take_freed(&mut remembered);
        let mut tried = Tried {
            count: Some(woken.clone()),
            ..Tried::default()
        };
        let took = round(
            spec,
            &mut remembered,
            &freed,
            &mut tried,
            start,
            per_round,
            deadline,
        );
        let last = match took.await {
            Ok(held) => return Ok(held),
            Err((err, false)) => return Err(err),
            Err((err, true)) => err,
        };
        // A permit this client freed during the round ends the pause,
        // unless the round tried it after (marked seen and read in this
        // order: one freed in between is still news).
        woken.borrow_and_update();
        if entry.news_to(&tried.permits) {
            woken.mark_changed();
        }
        per_round = 1;
        let Some(by) = deadline else {
            return Err(last);
        };
        let now = Instant::now();
        let last_call = last_call(by);
        if now >= last_call {
            return Err(last);
        }
        let waited = now.saturating_duration_since(began);
        let (pause, mut paused_by_service) =
            pause(waited, poll, last.retry_after(), crate::random::unit());
        let mut next = now + pause;
        // (A window that has passed asks for nothing: the pause is the
        // ramp's, and a permit freed here still ends it.)
        let spread = || poll.mul_f64(crate::random::unit());
        if let Some(quiet) = past_quiet(client.quota().quiet_until(), now, last_call, spread) {
            next = next.max(quiet);
            paused_by_service = true;
        }
        loop {
            // A permit this client frees (a release, a force release) ends
            // the pause at once, unless the service asked for quiet.
            let freed_here = async {
                if paused_by_service || woken.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(next.min(last_call)) => {}
                () = freed_here => {}
            }
            // A 429 to another request of this client meanwhile (told as
            // this round ended: 16-client seed 547; or before a permit
            // freed here ended the pause): not before its window.
            let now = Instant::now();
            match past_quiet(client.quota().quiet_until(), now, last_call, spread) {
                Some(quiet) => {
                    next = quiet;
                    paused_by_service = true;
                }
                None => break,
            }
        }
    }
}

/// The longest a wait waits: a year stands for "as long as it takes".
const A_YEAR: Duration = Duration::from_secs(86_400 * 365);

/// A wait's deadline: `wait` from `began`, at most [`A_YEAR`] (a wait of
/// `Duration::MAX` must not overflow an instant).
fn deadline_of(began: Instant, wait: Duration) -> Instant {
    began + wait.min(A_YEAR)
}

/// When a wait's last round may start: with room for a try (half the lead a
/// waiter's last try has) before the deadline `by`.
fn last_call(by: Instant) -> Instant {
    by.checked_sub(LAST_TRY_LEAD / 2).unwrap_or(by)
}

/// The pause after a round that found every permit it tried held (or got
/// no answer), `waited` into the wait: the ramp (30 % of the time waited,
/// 0.3 s to the poll interval), jittered down by up to a tenth (`u` in
/// `[0, 1)`: never up, the pause is the longest a release goes unseen);
/// not shorter than a `Retry-After` (at most a minute). True when the
/// service asked for the pause: then a permit freed here does not end it.
fn pause(
    waited: Duration,
    poll: Duration,
    retry_after: Option<Duration>,
    u: f64,
) -> (Duration, bool) {
    let step = waited
        .mul_f64(RAMP_RATIO)
        .clamp(RAMP_FLOOR, poll.max(RAMP_FLOOR));
    let ramp = step.mul_f64(1.0 - 0.1 * u);
    match retry_after {
        Some(after) => (
            ramp.max(after.min(crate::retry::wait::MAX_RETRY_AFTER)),
            true,
        ),
        None => (ramp, false),
    }
}

/// The end of a 429's window this client was told of (`quiet`), plus a
/// spread (up to a poll interval, so that a client's waiters do not all go
/// at that moment): `None` once it has passed, or once the last call has
/// come (the last round goes then anyway).
fn past_quiet(
    quiet: Option<Instant>,
    now: Instant,
    last_call: Instant,
    spread: impl FnOnce() -> Duration,
) -> Option<Instant> {
    let quiet = quiet.filter(|&quiet| quiet > now && now < last_call)?;
    Some(quiet + spread())
}

/// Whether a wait with `left` before its deadline has room for another
/// permit's try: the try and its single retry, each of the shortest
/// attempt.
fn room_for_a_try(left: Duration) -> bool {
    left >= crate::retry::MIN_ATTEMPT * 2
}

/// One round: `per_round` permits, those this client freed itself first,
/// then those it saw held longest ago (never seen held before any), from
/// its spread on. `Err((err,
/// true))`: each was held, or the service did not answer (429, 5xx, no
/// answer): worth waiting through; `Err((err, false))`: not (a refusal, a
/// bad argument).
async fn round(
    spec: &PermitSpec,
    memory: &mut Memory,
    freed: &[u32],
    tried: &mut Tried,
    start: u64,
    per_round: usize,
    deadline: Option<Instant>,
) -> std::result::Result<HeldLock, (Error, bool)> {
    // From the spread on (`start`, below the count).
    let mut order: Vec<u32> = (0..spec.permits).collect();
    order.rotate_left(start as usize);
    // Stable: permits this client just freed first, then among permits
    // seen held equally long ago, the spread's order.
    order.sort_by_key(|&i| (!freed.contains(&i), memory.seen_held[i as usize]));
    if sabotaged!(SemaphoreTriesRecentFirst) {
        order.sort_by_key(|&i| std::cmp::Reverse(memory.seen_held[i as usize]));
    }
    let mut candidates: Vec<u32> = order.into_iter().take(per_round).collect();
    if sabotaged!(SemaphoreExtraPermit) {
        // The planted bug: a permit past the count, as if one were free.
        candidates.insert(0, spec.permits);
    }
    let mut last = None;
    for i in candidates {
        let mut options = spec.options.clone();
        options.wait = None;
        if let Some(by) = deadline {
            // A wait's tries answer by its deadline: a try and its single
            // retry fit in what is left (no try starts after it).
            let left = by.saturating_duration_since(Instant::now());
            if !room_for_a_try(left) && last.is_some() {
                break;
            }
            let timeout = options
                .timeout
                .unwrap_or(spec.locks.client().timeout())
                .min(left / 2)
                .max(crate::retry::MIN_ATTEMPT);
            options.timeout = Some(timeout);
        }
        let mut permit = Spec::new(&spec.locks, permit_key(&spec.name, i), spec.ttl, options);
        permit.min_hold = spec.min_hold;
        // Nor does its retry (volcano-sim --permits, seed 64: a wait of
        // 0 s retried 100 ms after its deadline).
        permit.send_by = deadline;
        let at = tried.count.clone().map(|count| {
            let at = Arc::new(AtomicU64::new(*count.borrow()));
            let noted = at.clone();
            permit.on_retry = Some(Arc::new(move || {
                noted.store(*count.borrow(), Ordering::Relaxed);
            }));
            at
        });
        let result = hold::hold(permit, None).await;
        if let Some(at) = at {
            tried.permits.push((i, at.load(Ordering::Relaxed)));
        }
        if let Some(seen) = memory.seen_held.get_mut(i as usize) {
            // Held: by another, or by this client now (its next waiter
            // starts elsewhere).
            if result.is_ok() || result.as_ref().is_err_and(Error::is_lock_held) {
                *seen = Some(Instant::now());
            }
        }
        match result {
            Ok(held) => return Ok(held),
            Err(err) if err.is_lock_held() => last = Some(err),
            Err(err) => {
                let again = crate::retry::waits_through(&err);
                return Err((err, again));
            }
        }
    }
    // A round tries at least one permit (a semaphore has one at least).
    Err((
        last.unwrap_or_else(|| Error::invalid("a semaphore round tried no permit")),
        true,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_round_tries_another_permit_only_with_room_for_a_try_and_its_retry() {
        assert!(room_for_a_try(ms(200)));
        assert!(!room_for_a_try(ms(199)));
        assert!(!room_for_a_try(ms(100)));
    }

    #[test]
    fn a_wait_ends_when_asked_and_a_year_at_most() {
        let began = Instant::now();
        assert_eq!(deadline_of(began, ms(600_000)), began + ms(600_000));
        let year = ms(86_400_000 * 365);
        assert_eq!(deadline_of(began, year), began + year);
        assert_eq!(deadline_of(began, Duration::MAX), began + year);
    }

    #[test]
    fn the_last_round_goes_a_quarter_second_before_the_deadline() {
        let by = Instant::now() + ms(10_000);
        assert_eq!(last_call(by), by - ms(250));
    }

    #[test]
    fn a_pause_is_the_ramp_jittered_down_and_no_shorter_than_retry_after() {
        let poll = ms(5_000);
        // 0.3 s at least; 30 % of the time waited; the poll interval at most.
        assert_eq!(pause(ms(0), poll, None, 0.0), (ms(300), false));
        assert_eq!(pause(ms(10_000), poll, None, 0.0), (ms(3_000), false));
        assert_eq!(pause(ms(100_000), poll, None, 0.0), (poll, false));
        // A poll interval under the floor: the floor.
        assert_eq!(pause(ms(10_000), ms(100), None, 0.0), (ms(300), false));
        // Jittered down by up to a tenth, never up.
        assert_eq!(pause(ms(10_000), poll, None, 0.5), (ms(2_850), false));
        assert_eq!(pause(ms(10_000), poll, None, 1.0), (ms(2_700), false));
        // A `Retry-After` longer than the ramp, capped at a minute; a
        // shorter one leaves the ramp; either is the service's pause.
        assert_eq!(
            pause(ms(10_000), poll, Some(ms(4_000)), 0.0),
            (ms(4_000), true)
        );
        assert_eq!(
            pause(ms(10_000), poll, Some(ms(600_000)), 0.0),
            (ms(60_000), true)
        );
        assert_eq!(
            pause(ms(10_000), poll, Some(ms(1_000)), 0.0),
            (ms(3_000), true)
        );
    }

    #[test]
    fn a_quota_window_holds_a_round_back_until_it_has_passed_or_the_last_call() {
        let now = Instant::now();
        let last_call = now + ms(10_000);
        let spread = || ms(700);
        let never = || -> Duration { panic!("no spread is drawn without a window") };
        assert_eq!(past_quiet(None, now, last_call, never), None);
        assert_eq!(past_quiet(Some(now - ms(1)), now, last_call, never), None);
        assert_eq!(past_quiet(Some(now), now, last_call, never), None);
        assert_eq!(
            past_quiet(Some(now + ms(2_000)), now, last_call, spread),
            Some(now + ms(2_700))
        );
        // From the last call on, the last round goes, window or not.
        assert_eq!(
            past_quiet(Some(last_call + ms(2_000)), last_call, last_call, never),
            None
        );
        let late = last_call + ms(1);
        assert_eq!(
            past_quiet(Some(late + ms(2_000)), late, last_call, never),
            None
        );
        assert_eq!(
            past_quiet(
                Some(last_call + ms(2_000)),
                last_call - ms(1),
                last_call,
                spread
            ),
            Some(last_call + ms(2_700))
        );
    }
}
