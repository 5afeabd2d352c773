//! What a client remembers of its semaphores: when it last saw each
//! permit held, the line its waiters take turns in, and the permits it
//! freed itself; idle ones past the most recently used are forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// Idle semaphores (no try or wait running) whose memory a client keeps,
/// the most recently used; older ones are forgotten. What is forgotten is
/// which permits were seen held: a try then starts from its spread.
const KEPT_IDLE: usize = 64;

/// What a client remembers of one semaphore, and the line its waiters
/// take turns in (the lock on it: `tokio`'s mutex serves in order).
#[derive(Debug)]
pub(super) struct Memory {
    /// When this client last saw each permit held (a 409, or its own
    /// acquire); `None`: never.
    pub(super) seen_held: Vec<Option<Instant>>,
}

impl Memory {
    pub(super) fn new(permits: u32) -> Self {
        Memory {
            seen_held: vec![None; permits as usize],
        }
    }
}

/// One semaphore of a client: what it remembers behind its waiters' line,
/// and the permits it freed itself since its first waiter last tried.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) line: tokio::sync::Mutex<Memory>,
    /// Permits this client released (or force-released) since they were
    /// last taken into account, each with the count of such releases once
    /// it was counted (`woken`, which wakes the first waiter from its
    /// pause).
    freed: Mutex<Vec<(u32, u64)>>,
    pub(super) woken: tokio::sync::watch::Sender<u64>,
    /// When a try or wait last began or ended on it.
    used: Mutex<Instant>,
}

impl Entry {
    pub(super) fn touch(&self) {
        *crate::lock_unpoisoned(&self.used) = Instant::now();
    }

    /// The permits this client freed since the last call, forgotten as
    /// held (the first waiter tries them first).
    pub(super) fn take_freed(&self, memory: &mut Memory) -> Vec<u32> {
        let freed = std::mem::take(&mut *crate::lock_unpoisoned(&self.freed));
        for &(i, _) in &freed {
            if let Some(seen) = memory.seen_held.get_mut(i as usize) {
                *seen = None;
            }
        }
        freed.into_iter().map(|(i, _)| i).collect()
    }

    /// Whether a permit freed since the round began is news to the round
    /// that tried `tried` (each permit with the count of releases when its
    /// last attempt went): freed after that attempt, or not tried. One
    /// freed before it was tried after it, and found held then (a try's
    /// undo answered before its next round's retry: `volcano-sim
    /// --permits`, seed 648), is forgotten as freed: the next round does
    /// not try it first again.
    pub(super) fn news_to(&self, tried: &[(u32, u64)]) -> bool {
        let mut freed = crate::lock_unpoisoned(&self.freed);
        freed.retain(|&(i, count)| !tried.iter().any(|&(permit, at)| permit == i && at >= count));
        !freed.is_empty()
    }
}

/// The permits a round tried, each with the count of its client's
/// releases on the semaphore (`count`, when it has a line) as its last
/// attempt went.
#[derive(Default)]
pub(super) struct Tried {
    pub(super) count: Option<tokio::sync::watch::Receiver<u64>>,
    pub(super) permits: Vec<(u32, u64)>,
}

type Line = Arc<Entry>;

/// The semaphores of one client: name and count → what it remembers.
#[derive(Default)]
pub(crate) struct Semaphores {
    by_name: Mutex<HashMap<(String, u32), Line>>,
}

impl Semaphores {
    pub(super) fn memory(&self, name: &str, permits: u32) -> Line {
        let mut by_name = crate::lock_unpoisoned(&self.by_name);
        let entry = by_name
            .entry((name.to_owned(), permits))
            .or_insert_with(|| {
                Arc::new(Entry {
                    line: tokio::sync::Mutex::new(Memory::new(permits)),
                    freed: Mutex::new(Vec::new()),
                    woken: tokio::sync::watch::Sender::new(0),
                    used: Mutex::new(Instant::now()),
                })
            })
            .clone();
        entry.touch();
        forget_idle(&mut by_name);
        entry
    }

    /// This client freed `key`: if it is a permit of a semaphore it
    /// remembers, its first waiter tries that permit at once.
    pub(crate) fn freed(&self, key: &str) {
        let Some((name, i)) = key.rsplit_once(':') else {
            return;
        };
        let Ok(i) = i.parse::<u32>() else {
            return;
        };
        let by_name = crate::lock_unpoisoned(&self.by_name);
        for ((_, permits), entry) in by_name.iter().filter(|((n, p), _)| n == name && i < *p) {
            debug_assert!(i < *permits);
            let mut freed = crate::lock_unpoisoned(&entry.freed);
            let mut count = 0;
            entry.woken.send_modify(|n| {
                *n = n.wrapping_add(1);
                count = *n;
            });
            freed.push((i, count));
        }
    }

    /// How many semaphores this client remembers (for tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        crate::lock_unpoisoned(&self.by_name).len()
    }

    /// The semaphores this client remembers, in no particular order (for
    /// the simulation's checks).
    #[cfg(feature = "sim")]
    pub(crate) fn remembered_names(&self) -> Vec<(String, u32)> {
        crate::lock_unpoisoned(&self.by_name)
            .keys()
            .cloned()
            .collect()
    }
}

/// Forgets the idle semaphores past the [`KEPT_IDLE`] most recently used:
/// a long-lived client that used many one-off semaphores keeps a bounded
/// memory. An entry in use (a try or a wait holds it) is never forgotten.
fn forget_idle(by_name: &mut HashMap<(String, u32), Line>) {
    if by_name.len() <= KEPT_IDLE {
        return;
    }
    let mut idle: Vec<((String, u32), Instant)> = by_name
        .iter()
        .filter(|(_, entry)| Arc::strong_count(entry) == 1)
        .map(|(name, entry)| (name.clone(), *crate::lock_unpoisoned(&entry.used)))
        .collect();
    if idle.len() <= KEPT_IDLE {
        return;
    }
    idle.sort_by_key(|(_, used)| std::cmp::Reverse(*used));
    for (name, _) in idle.into_iter().skip(KEPT_IDLE) {
        by_name.remove(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_semaphores_are_forgotten_past_a_bound_and_busy_ones_never() {
        let semaphores = Semaphores::default();
        let busy = semaphores.memory("busy", 100);
        for n in 0..10_000 {
            drop(semaphores.memory(&format!("one-off-{n}"), 100));
        }
        // The idle ones kept, the busy one, and the last one asked for
        // (in use while the others were forgotten).
        assert!(
            semaphores.remembered() <= KEPT_IDLE + 2,
            "{} semaphores remembered",
            semaphores.remembered()
        );
        // The one in use is the same entry still.
        assert!(Arc::ptr_eq(&busy, &semaphores.memory("busy", 100)));
        // The most recently used idle ones are kept.
        let recent = semaphores.memory("one-off-9999", 100);
        assert_eq!(Arc::strong_count(&recent), 2, "still remembered");
    }

    #[tokio::test(start_paused = true)]
    async fn a_semaphore_used_again_is_kept_as_recently_used() {
        let semaphores = Semaphores::default();
        drop(semaphores.memory("old", 2));
        for n in 0..KEPT_IDLE - 1 {
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
            drop(semaphores.memory(&format!("one-off-{n}"), 2));
        }
        // Used again: now the most recently used, though made first.
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        semaphores.memory("old", 2).touch();
        for n in 0..2 {
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
            drop(semaphores.memory(&format!("late-{n}"), 2));
        }
        let names: Vec<String> = crate::lock_unpoisoned(&semaphores.by_name)
            .keys()
            .map(|(name, _)| name.clone())
            .collect();
        assert!(
            names.contains(&"old".to_owned()),
            "forgotten though used again"
        );
        assert!(
            !names.contains(&"one-off-0".to_owned()),
            "the least recently used kept"
        );
        assert!(semaphores.remembered() <= KEPT_IDLE + 1);
    }

    #[tokio::test]
    async fn a_permit_freed_here_is_news_to_its_semaphore_only() {
        let semaphores = Semaphores::default();
        let pool = semaphores.memory("pool", 4);
        let other = semaphores.memory("pool-b", 4);
        let mut woken = pool.woken.subscribe();
        semaphores.freed("pool:2");
        semaphores.freed("pool:9"); // past its count
        semaphores.freed("pool:4"); // its count: no permit of it
        semaphores.freed("pool-b"); // not a permit's key
        semaphores.freed("nightly-report");
        assert!(woken.has_changed().unwrap());
        let count = *woken.borrow_and_update();
        // Tried before it was freed, or not tried: news.
        assert!(pool.news_to(&[(2, count - 1)]));
        assert!(pool.news_to(&[(1, count)]));
        // Tried after: no news, and no longer tried first.
        assert!(!pool.news_to(&[(1, 0), (2, count)]));
        assert!(pool.take_freed(&mut Memory::new(4)).is_empty());
        semaphores.freed("pool:2");
        let mut memory = Memory::new(4);
        memory.seen_held[2] = Some(Instant::now());
        assert_eq!(pool.take_freed(&mut memory), [2]);
        assert_eq!(memory.seen_held[2], None, "tried first again");
        assert!(other.take_freed(&mut Memory::new(4)).is_empty());
    }
}
