//! Waiters of one client on one key take turns: the first in line sends
//! the tries and looks, the others wait for their turn without sending
//! anything. Twenty tasks of a process waiting on one key cost the project
//! what one does, and when the key frees they try in the order they began
//! waiting. When this client frees the key itself (a release, a force
//! release), the first in line is told at once and tries without waiting
//! out its pause.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// The lines of one client, by key.
#[derive(Default)]
pub(crate) struct Turns {
    next: AtomicU64,
    lines: Mutex<HashMap<String, Line>>,
}

/// One key's line.
struct Line {
    /// Tickets in the order they were taken.
    waiting: BTreeSet<u64>,
    /// The first in line, for the others to watch.
    first: watch::Sender<Option<u64>>,
    /// Counts the times this client freed the key.
    freed: watch::Sender<u64>,
    /// Since when the tries of the first in line have failed without an
    /// answer (`None`: answered): the ones behind it send nothing, so this
    /// is what they know of the service (a leader's status).
    failing: watch::Sender<Option<tokio::time::Instant>>,
}

impl Turns {
    /// Joins the line for `key`.
    pub(crate) fn join(self: &Arc<Self>, key: &str) -> Ticket {
        let mut lines = self.lock();
        // Under the lock: tickets enter the line in the order of their ids.
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let line = lines.entry(key.to_owned()).or_insert_with(|| Line {
            waiting: BTreeSet::new(),
            first: watch::Sender::new(None),
            freed: watch::Sender::new(0),
            failing: watch::Sender::new(None),
        });
        line.waiting.insert(id);
        let now = line.waiting.first().copied();
        line.first
            .send_if_modified(|first| std::mem::replace(first, now) != now);
        Ticket {
            turns: self.clone(),
            key: key.to_owned(),
            id,
            first: line.first.subscribe(),
            freed: line.freed.subscribe(),
            failing: line.failing.subscribe(),
            line_failing: line.failing.clone(),
        }
    }

    /// This client freed `key`: the first in line may try at once.
    pub(crate) fn freed(&self, key: &str) {
        if let Some(line) = self.lock().get(key) {
            line.freed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Line>> {
        crate::lock_unpoisoned(&self.lines)
    }
}

/// A place in a key's line, given up when dropped.
pub(crate) struct Ticket {
    turns: Arc<Turns>,
    key: String,
    id: u64,
    first: watch::Receiver<Option<u64>>,
    freed: watch::Receiver<u64>,
    failing: watch::Receiver<Option<tokio::time::Instant>>,
    line_failing: watch::Sender<Option<tokio::time::Instant>>,
}

impl Ticket {
    /// The first in line tells the line since when its tries have failed
    /// without an answer (`None`: answered again).
    pub(crate) fn tell_failing(&self, since: Option<tokio::time::Instant>) {
        self.line_failing
            .send_if_modified(|now| std::mem::replace(now, since) != since);
    }

    /// What the first in line says of the service, to watch beside
    /// [`Ticket::first`].
    pub(crate) fn line_failing(&self) -> watch::Receiver<Option<tokio::time::Instant>> {
        self.failing.clone()
    }

    /// Whether this ticket is first in line.
    pub(crate) fn is_first(&self) -> bool {
        *self.first.borrow() == Some(self.id)
    }

    /// Resolves once this ticket is first in line.
    pub(crate) async fn first(&mut self) {
        let id = self.id;
        let _ = self.first.wait_for(|first| *first == Some(id)).await;
    }

    /// A try goes out now: it sees whatever this client freed before, so
    /// only a release from now on is news to it ([`Ticket::freed`]).
    pub(crate) fn trying(&mut self) {
        self.freed.borrow_and_update();
    }

    /// How many times this client has freed the key, without marking it
    /// seen.
    pub(crate) fn freed_count(&self) -> u64 {
        *self.freed.borrow()
    }

    /// An answer came to an attempt sent when this client had freed the
    /// key `count` times: a release before that attempt is no news to it.
    pub(crate) fn answered_after(&mut self, count: u64) {
        // Marked seen and read in one step: a release counted between a
        // read and the marking would be lost.
        if *self.freed.borrow_and_update() != count {
            self.freed.mark_changed();
        }
    }

    /// Resolves the next time this client frees the key (since the last
    /// [`Ticket::trying`], or what [`Ticket::answered_after`] left news).
    pub(crate) async fn freed(&mut self) {
        if self.freed.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut lines = self.turns.lock();
        let Some(line) = lines.get_mut(&self.key) else {
            return;
        };
        line.waiting.remove(&self.id);
        if line.waiting.is_empty() {
            lines.remove(&self.key);
            return;
        }
        let now = line.waiting.first().copied();
        line.first
            .send_if_modified(|first| std::mem::replace(first, now) != now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_in_line_goes_first_and_the_next_follows_when_it_leaves() {
        let turns = Arc::new(Turns::default());
        let a = turns.join("k");
        let mut b = turns.join("k");
        let c = turns.join("k");
        let other = turns.join("other");
        assert!(a.is_first() && !b.is_first() && !c.is_first() && other.is_first());
        drop(a);
        b.first().await;
        assert!(b.is_first() && !c.is_first());
        // Leaving from the middle keeps the order.
        let d = turns.join("k");
        drop(c);
        drop(b);
        assert!(d.is_first());
        drop(d);
        assert!(crate::lock_unpoisoned(&turns.lines).contains_key("other"));
        drop(other);
        assert!(
            crate::lock_unpoisoned(&turns.lines).is_empty(),
            "no line is kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_before_a_try_is_no_news_to_it() {
        let turns = Arc::new(Turns::default());
        let mut a = turns.join("k");
        turns.freed("k");
        a.trying();
        let second = std::time::Duration::from_secs(1);
        assert!(
            tokio::time::timeout(second, a.freed()).await.is_err(),
            "the try sent after the release already saw it"
        );
        turns.freed("k");
        tokio::time::timeout(second, a.freed())
            .await
            .expect("a release after the try wakes it");
    }

    /// A 409 to the transport's retry: a release after the try began and
    /// before the retry went is no news; one after the retry went is (the
    /// retry may have been decided before it).
    #[tokio::test(start_paused = true)]
    async fn an_answer_to_a_retry_sees_only_releases_before_the_retry() {
        let turns = Arc::new(Turns::default());
        let second = std::time::Duration::from_secs(1);
        let mut a = turns.join("k");
        a.trying();
        turns.freed("k");
        let at_retry = a.freed_count();
        a.answered_after(at_retry);
        assert!(
            tokio::time::timeout(second, a.freed()).await.is_err(),
            "released before the retry went"
        );
        a.trying();
        let at_retry = a.freed_count();
        turns.freed("k");
        a.answered_after(at_retry);
        tokio::time::timeout(second, a.freed())
            .await
            .expect("released after the retry went: news");
    }

    #[tokio::test]
    async fn freeing_the_key_wakes_its_line() {
        let turns = Arc::new(Turns::default());
        let mut a = turns.join("k");
        turns.freed("other");
        turns.freed("k");
        tokio::time::timeout(std::time::Duration::from_secs(5), a.freed())
            .await
            .expect("woken");
    }
}
