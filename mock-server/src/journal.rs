//! The journal: one [`RecordedRequest`] per lock request the server
//! answered (or failed on purpose), in arrival order, keeping only the
//! newest [`MAX_JOURNAL`] so a long-running server stays bounded. Requests
//! to an unknown path or method are not lock requests and are not recorded.

use std::collections::VecDeque;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::fault::{FaultKind, Operation};
use crate::sync::lock_unpoisoned;

/// Most journal entries kept; older ones are dropped.
pub const MAX_JOURNAL: usize = 100_000;
/// Longest key kept in an entry, in characters.
const MAX_KEY_CHARS: usize = 200;
/// Longest request id kept in an entry, in characters.
const MAX_REQUEST_ID_CHARS: usize = 64;

/// One request the server answered (or failed on purpose), in the order handled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RecordedRequest {
    /// The order the service handled requests in, from 1: for one key,
    /// the order in which they changed (or read) its lease, at times (`at`)
    /// that never go back.
    pub seq: u64,
    /// Server time when the request was handled (after any injected delay,
    /// before any delay_response; for a gateway fault, when the service
    /// applied it, not when the gateway answered).
    pub at: DateTime<Utc>,
    /// The operation.
    pub operation: Operation,
    /// The key as it appeared in the path (percent-decoded).
    pub key: String,
    /// The `X-Volcano-Request-Id` header, if it was valid UTF-8.
    pub request_id: Option<String>,
    /// The status sent, or that would have been sent when the response was
    /// dropped (or the service's, when a gateway answered in its place);
    /// `None` when the connection was reset before applying.
    pub status: Option<u16>,
    /// The injected fault that shaped this answer, if any. When several
    /// did, a status, drop_response, reset, garbled_response or gateway
    /// fault is shown first, then delay_response, then delay; matching
    /// delays (or delay_responses) are shown added up.
    pub fault: Option<FaultKind>,
    /// The fencing token granted or reported (acquire, renew, get).
    pub fencing_token: Option<i64>,
    /// The expiry granted or reported (acquire, renew, get).
    pub expires_at: Option<DateTime<Utc>>,
}

impl RecordedRequest {
    /// The entry for a request as it arrives: no outcome yet, and the key
    /// and request id cut short so an entry stays small whatever the client
    /// sent.
    pub(crate) fn arrived(
        at: DateTime<Utc>,
        operation: Operation,
        key: &str,
        request_id: Option<&str>,
    ) -> Self {
        RecordedRequest {
            seq: 0,
            at,
            operation,
            key: first_chars(key, MAX_KEY_CHARS),
            request_id: request_id.map(|v| first_chars(v, MAX_REQUEST_ID_CHARS)),
            status: None,
            fault: None,
            fencing_token: None,
            expires_at: None,
        }
    }
}

/// The first `max` characters of `text`, copied in one piece.
fn first_chars(text: &str, max: usize) -> String {
    // No more bytes than `max` means no more characters: the usual case.
    if text.len() <= max {
        return text.to_owned();
    }
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.to_owned(),
    }
}

/// The bounded journal: the last sequence number given out, and the
/// newest entries, oldest first.
#[derive(Default)]
pub(crate) struct Journal {
    entries: Mutex<(u64, VecDeque<RecordedRequest>)>,
    /// Ticks on every entry recorded, for [`Journal::wait_for`].
    recorded: tokio::sync::watch::Sender<()>,
}

impl Journal {
    /// Appends an entry, numbering it and dropping the oldest one when full.
    pub(crate) fn record(&self, mut entry: RecordedRequest) {
        let mut journal = lock_unpoisoned(&self.entries);
        journal.0 += 1;
        entry.seq = journal.0;
        if journal.1.len() == MAX_JOURNAL {
            journal.1.pop_front();
        }
        journal.1.push_back(entry);
        drop(journal);
        // Only a `wait_for` listens, and it subscribes before it looks at
        // the entries (under the same lock as this push): if no one is
        // subscribed now, no one can be waiting for this entry.
        if self.recorded.receiver_count() > 0 {
            self.recorded.send_replace(());
        }
    }

    /// The oldest entry kept that matches, waiting for one to be recorded
    /// if there is none yet.
    pub(crate) async fn wait_for(
        &self,
        matches: impl Fn(&RecordedRequest) -> bool,
    ) -> RecordedRequest {
        // Subscribed before looking: an entry recorded in between still wakes.
        let mut recorded = self.recorded.subscribe();
        loop {
            let found = lock_unpoisoned(&self.entries)
                .1
                .iter()
                .find(|r| matches(r))
                .cloned();
            if let Some(found) = found {
                return found;
            }
            // The sender lives as long as the journal, which `&self` keeps.
            let _ = recorded.changed().await;
        }
    }

    /// Every entry kept, oldest first.
    pub(crate) fn entries(&self) -> Vec<RecordedRequest> {
        let journal = lock_unpoisoned(&self.entries);
        journal.1.iter().cloned().collect()
    }

    /// Forgets every entry; numbering starts again from 1.
    pub(crate) fn clear(&self) {
        *lock_unpoisoned(&self.entries) = (0, VecDeque::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_and_ids_are_cut_at_a_character() {
        assert_eq!(first_chars("abc", 3), "abc");
        assert_eq!(first_chars("abcd", 3), "abc");
        assert_eq!(first_chars("ééé", 3), "ééé");
        assert_eq!(first_chars("éééé", 3), "ééé");
        assert_eq!(first_chars("", 3), "");
        let long = "ü".repeat(300);
        assert_eq!(
            first_chars(&long, MAX_KEY_CHARS).chars().count(),
            MAX_KEY_CHARS
        );
    }

    #[test]
    fn the_journal_keeps_only_the_newest_entries() {
        let log = Journal::default();
        for _ in 0..MAX_JOURNAL + 10 {
            log.record(RecordedRequest {
                seq: 0,
                at: Utc::now(),
                operation: Operation::Get,
                key: "k".into(),
                request_id: None,
                status: Some(200),
                fault: None,
                fencing_token: None,
                expires_at: None,
            });
        }
        let journal = log.entries();
        assert_eq!(journal.len(), MAX_JOURNAL);
        assert_eq!(journal[0].seq, 11);
        assert_eq!(journal.last().unwrap().seq, (MAX_JOURNAL + 10) as u64);
    }
}
