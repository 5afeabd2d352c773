//! The lease state machine: every rule of the lock service, pure and
//! synchronous. Time is passed in; the HTTP layer owns the clock, which
//! never passes the year 9000, so the additions here (at most now + 90 days
//! + 1 s) cannot overflow.

use crate::sync::lock_unpoisoned;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use uuid::Uuid;

/// After `expires_at`, the lock stays unavailable to others for this long.
pub(crate) const TAKEOVER_GRACE: TimeDelta = TimeDelta::seconds(1);
/// A renewal must arrive more than this long before `expires_at`.
pub(crate) const RENEW_MARGIN: TimeDelta = TimeDelta::seconds(1);
/// The absolute lifetime of one acquisition.
pub(crate) const MAX_ACQUISITION: TimeDelta = TimeDelta::seconds(7_776_000);

const SHARDS: usize = 32;

/// One live (or lapsed, not yet swept) lease.
#[derive(Debug, Clone)]
struct Lease {
    token: Uuid,
    fencing_token: i64,
    expires_at: DateTime<Utc>,
    /// acquisition start + 90 days; renewals never pass it.
    cap: DateTime<Utc>,
}

impl Lease {
    fn live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }

    /// Another token may take the lock over.
    fn reclaimable(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at + TAKEOVER_GRACE
    }
}

/// A granted or renewed lease, as the API returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// When the lease expires (server clock).
    pub(crate) expires_at: DateTime<Utc>,
    /// The lease's fencing token.
    pub(crate) fencing_token: i64,
}

/// Why a lock operation was refused (HTTP 409).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another live lease owns the key.
    Held,
    /// The caller's lease is gone (expired, too late, or another token's).
    OwnershipLost,
}

/// What the service reports about a key, as the `/__mock/locks` view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockSnapshot {
    /// The lock key.
    pub key: String,
    /// `true` until `expires_at` + 1 s grace.
    pub held: bool,
    /// `true` while `now < expires_at`.
    pub live: bool,
    /// The lease's expiry.
    pub expires_at: DateTime<Utc>,
    /// The lease's fencing token.
    pub fencing_token: i64,
}

/// All leases of the one project, sharded so that requests for different
/// keys rarely contend. No lock is held across an await.
pub(crate) struct Store {
    shards: Vec<Mutex<HashMap<String, Lease>>>,
    hasher: RandomState,
    /// One counter for all keys: strictly increasing per key across every
    /// change of hands, never reset (not by release, force release, expiry,
    /// sweeping or a reset of the mock).
    fencing: AtomicI64,
    /// One per shard: held while a request of a key in it reads the clock,
    /// is applied and is journaled ([`Store::in_order`]).
    order: Vec<Mutex<()>>,
}

impl Store {
    /// Runs `apply` (read the clock, change the store, journal the
    /// request) for `key` in one critical section with every other request
    /// of its shard: the journal's order and times for a key are then the
    /// order and times in which the store changed it (a request that read
    /// the clock and was paused before taking the key could otherwise be
    /// journaled before the release that freed it, or with an earlier time).
    pub(crate) fn in_order<R>(&self, key: &str, apply: impl FnOnce() -> R) -> R {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        let _in_order = self.order[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        apply()
    }

    pub(crate) fn new() -> Self {
        Store {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            fencing: AtomicI64::new(0),
            order: (0..SHARDS).map(|_| Mutex::new(())).collect(),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        let index = (self.hasher.hash_one(key) as usize) % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_fencing_token(&self) -> i64 {
        self.fencing.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn acquire(
        &self,
        key: &str,
        token: Uuid,
        ttl: TimeDelta,
        now: DateTime<Utc>,
    ) -> Result<Grant, Refusal> {
        let mut shard = self.shard(key);
        if let Some(lease) = shard.get_mut(key) {
            if !lease.reclaimable(now) {
                if lease.token != token {
                    return Err(Refusal::Held);
                }
                if !lease.live(now) {
                    return Err(Refusal::OwnershipLost);
                }
                // Same token, still live: idempotent; the expiry is reset
                // (possibly shortened), ownership and fence stay.
                lease.expires_at = (now + ttl).min(lease.cap);
                return Ok(grant(lease));
            }
        }
        let lease = Lease {
            token,
            fencing_token: self.next_fencing_token(),
            expires_at: now + ttl.min(MAX_ACQUISITION),
            cap: now + MAX_ACQUISITION,
        };
        let granted = grant(&lease);
        shard.insert(key.to_owned(), lease);
        Ok(granted)
    }

    pub(crate) fn renew(
        &self,
        key: &str,
        token: Uuid,
        ttl: TimeDelta,
        now: DateTime<Utc>,
    ) -> Result<Grant, Refusal> {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(lease) if lease.token == token && now + RENEW_MARGIN < lease.expires_at => {
                lease.expires_at = (now + ttl).min(lease.cap);
                Ok(grant(lease))
            }
            _ => Err(Refusal::OwnershipLost),
        }
    }

    pub(crate) fn release(
        &self,
        key: &str,
        token: Uuid,
        now: DateTime<Utc>,
    ) -> Result<(), Refusal> {
        let mut shard = self.shard(key);
        match shard.get(key) {
            None => Ok(()),
            Some(lease) if lease.token == token || lease.reclaimable(now) => {
                shard.remove(key);
                Ok(())
            }
            Some(_) => Err(Refusal::OwnershipLost),
        }
    }

    /// `(held, expires_at, fencing_token)`; `held` until the grace ends.
    pub(crate) fn get(&self, key: &str, now: DateTime<Utc>) -> Option<Grant> {
        let mut shard = self.shard(key);
        match shard.get(key) {
            Some(lease) if !lease.reclaimable(now) => Some(grant(lease)),
            Some(_) => {
                shard.remove(key);
                None
            }
            None => None,
        }
    }

    pub(crate) fn force_release(&self, key: &str) {
        self.shard(key).remove(key);
    }

    /// Drops every lease that another token could take over; returns how
    /// many were dropped.
    pub(crate) fn sweep(&self, now: DateTime<Utc>) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = lock_unpoisoned(shard);
                let before = shard.len();
                shard.retain(|_, lease| !lease.reclaimable(now));
                // Give memory back after a burst of keys.
                if shard.capacity() > 64 && shard.len() * 4 < shard.capacity() {
                    shard.shrink_to_fit();
                }
                before - shard.len()
            })
            .sum()
    }

    pub(crate) fn snapshot(&self, now: DateTime<Utc>) -> Vec<LockSnapshot> {
        let mut all: Vec<LockSnapshot> = self
            .shards
            .iter()
            .flat_map(|shard| {
                let shard = lock_unpoisoned(shard);
                shard
                    .iter()
                    .map(|(key, lease)| LockSnapshot {
                        key: key.clone(),
                        held: !lease.reclaimable(now),
                        live: lease.live(now),
                        expires_at: lease.expires_at,
                        fencing_token: lease.fencing_token,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock_unpoisoned(s).len()).sum()
    }

    /// Forgets every lease; the fencing counter keeps counting.
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            lock_unpoisoned(shard).clear();
        }
    }
}

fn grant(lease: &Lease) -> Grant {
    Grant {
        expires_at: lease.expires_at,
        fencing_token: lease.fencing_token,
    }
}

/// A lock key as the protocol allows it: `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`.
pub(crate) fn valid_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    match bytes.split_first() {
        Some((first, rest)) => {
            bytes.len() <= 128
                && first.is_ascii_alphanumeric()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-07-20T14:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn secs(n: i64) -> TimeDelta {
        TimeDelta::seconds(n)
    }

    #[test]
    fn acquire_rules() {
        let store = Store::new();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let first = store.acquire("k", a, secs(30), t0()).unwrap();
        assert_eq!(first.fencing_token, 1);
        assert_eq!(store.acquire("k", b, secs(30), t0()), Err(Refusal::Held));
        // Same token: same fence, expiry reset (here shortened).
        let again = store.acquire("k", a, secs(10), t0() + secs(5)).unwrap();
        assert_eq!(again.fencing_token, 1);
        assert_eq!(again.expires_at, t0() + secs(15));
        // Lapsed but inside the grace: owner gets ownership_lost, others held.
        let lapsed = t0() + secs(15) + TimeDelta::milliseconds(500);
        assert_eq!(
            store.acquire("k", a, secs(30), lapsed),
            Err(Refusal::OwnershipLost)
        );
        assert_eq!(store.acquire("k", b, secs(30), lapsed), Err(Refusal::Held));
        // After the grace anyone takes over, with a higher fence.
        let taken = store.acquire("k", b, secs(30), t0() + secs(16)).unwrap();
        assert_eq!(taken.fencing_token, 2);
    }

    #[test]
    fn renew_needs_owner_and_more_than_one_second_left() {
        let store = Store::new();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        store.acquire("k", a, secs(10), t0()).unwrap();
        assert_eq!(
            store.renew("k", b, secs(10), t0()),
            Err(Refusal::OwnershipLost)
        );
        assert_eq!(
            store.renew("x", a, secs(10), t0()),
            Err(Refusal::OwnershipLost)
        );
        let renewed = store.renew("k", a, secs(60), t0() + secs(5)).unwrap();
        assert_eq!(renewed.expires_at, t0() + secs(65));
        assert_eq!(renewed.fencing_token, 1);
        // Exactly 1 s before expiry is too late.
        assert_eq!(
            store.renew("k", a, secs(10), t0() + secs(64)),
            Err(Refusal::OwnershipLost)
        );
        assert!(store.renew("k", a, secs(10), t0() + secs(63)).is_ok());
    }

    #[test]
    fn ninety_day_cap_survives_renewals_and_reacquires() {
        let store = Store::new();
        let a = Uuid::new_v4();
        let day = secs(86_400);
        store.acquire("k", a, day, t0()).unwrap();
        let mut now = t0();
        for _ in 0..89 {
            now += day - secs(10);
            store.renew("k", a, day, now).unwrap();
        }
        now += day - secs(10);
        let near_cap = store.renew("k", a, day, now).unwrap();
        assert_eq!(near_cap.expires_at, t0() + MAX_ACQUISITION);
        let again = store.acquire("k", a, day, now).unwrap();
        assert_eq!(again.expires_at, t0() + MAX_ACQUISITION);
    }

    #[test]
    fn release_and_force_release() {
        let store = Store::new();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(store.release("k", a, t0()), Ok(()), "absent is fine");
        store.acquire("k", a, secs(30), t0()).unwrap();
        assert_eq!(store.release("k", b, t0()), Err(Refusal::OwnershipLost));
        assert_eq!(store.release("k", a, t0()), Ok(()));
        assert!(store.get("k", t0()).is_none());
        store.acquire("k", b, secs(30), t0()).unwrap();
        store.force_release("k");
        let next = store.acquire("k", a, secs(30), t0()).unwrap();
        assert_eq!(next.fencing_token, 3, "fences never reset");
    }

    #[test]
    fn get_reports_held_through_the_grace_and_sweep_frees_memory() {
        let store = Store::new();
        store.acquire("k", Uuid::new_v4(), secs(5), t0()).unwrap();
        assert!(store.get("k", t0() + secs(5)).is_some(), "held in grace");
        assert_eq!(store.sweep(t0() + secs(5)), 0);
        assert_eq!(store.sweep(t0() + secs(6)), 1);
        assert_eq!(store.len(), 0);
    }
}
