//! Observing a key (`locks.observe`): every change is logged for the
//! checks to judge against the server's journal, and what the stream and
//! each change say about themselves is checked as it comes.

use std::time::Duration;

use volcano::{ChangeKind, Error, LockChange, LockState};

use super::ctx::Ctx;
use super::op::{campaign, poll_for};
use crate::log::Event;

/// Every kind's name.
const KINDS: [&str; 7] = [
    "initial",
    "acquired",
    "renewed",
    "taken_over",
    "released",
    "expired",
    "ended",
];

impl Ctx {
    /// Observes `key` for a few times the step's work, logging each
    /// change; the checks judge each against the server's journal, and
    /// the observer's looks against its poll interval.
    ///
    /// A third of the time a second observer of the client watches a key
    /// of its own (`{key}-twin`, which nobody holds) beside it, and the
    /// twin's first looks are answered 429 (a window of 1 s): the client's
    /// quota is spent, and the first observer must keep quiet too.
    pub(super) async fn observe(&self, key: &str, work: Duration, coin: u64) {
        let (mut span, mut poll) = (campaign(work), poll_for(coin));
        // Observers in depth watch long enough to see leases through, and
        // the slow ones look every 20 s: the leases they see (5 s to 12 s)
        // have their last moments within each interval.
        if self.depth == crate::Depth::Observers {
            span = Duration::from_secs(30) + span * 5 / 3;
            if poll == Duration::from_secs(10) {
                poll = Duration::from_secs(20);
            }
        }
        if coin % 8 == 5 {
            self.observe_edges(key).await;
        }
        if (coin >> 20) % 3 != 0 {
            return self.observe_for(key, span, poll).await;
        }
        let twin = format!("{key}-twin");
        if let Some(mock) = crate::lock(&self.server).as_ref() {
            mock.inject(
                volcano_mock_server::Fault::status(429)
                    .on(volcano_mock_server::Operation::Get)
                    .key(twin.as_str())
                    .times(2),
            );
        }
        self.log.push(Event::Fault {
            what: format!(
                "quota-spent-beside 429 on Get x2 of {twin}, beside an observer of {key}"
            ),
        });
        tokio::join!(
            self.observe_for(key, span, poll),
            self.observe_for(&twin, span, poll_for(coin >> 7))
        );
    }

    /// Observes `key` for `span`, looking every `poll`.
    async fn observe_for(&self, key: &str, span: Duration, poll: Duration) {
        let until = turmoil::sim_elapsed().unwrap_or_default() + span;
        self.log.push(Event::Observing {
            client: self.id,
            key: key.to_owned(),
            until,
            poll,
        });
        let mut changes = self.locks.observe(key).poll_interval(poll);
        if changes.key() != key {
            self.broken(format!("observe({key:?}).key() is {:?}", changes.key()));
        }
        let mut last: Option<LockState> = None;
        // Whether the last failed look was refused for good (`None`: no
        // look failed yet).
        let mut ended_by: Option<bool> = None;
        let deadline = tokio::time::sleep(span);
        tokio::pin!(deadline);
        loop {
            let item = tokio::select! {
                biased;
                item = changes.next() => item,
                () = &mut deadline => break,
            };
            match item {
                Some(Ok(change)) => {
                    self.says_right(&change, last.as_ref(), key);
                    // Its next look is due within the poll interval.
                    let next = changes.next_look_in();
                    if next.is_zero() || next > poll {
                        self.broken(format!(
                            "observe {key}: after a change, next_look_in() is {next:?} (poll {poll:?})"
                        ));
                    }
                    self.log.push(Event::Observed {
                        client: self.id,
                        key: key.to_owned(),
                        kind: change.kind().as_str(),
                        fence: change.state().fencing_token(),
                        before: change
                            .previous()
                            .and_then(|s| s.fencing_token().zip(s.expires_at())),
                    });
                    last = Some(change.state().clone());
                    ended_by = None;
                    if changes.is_ended() {
                        self.broken(format!("observe {key}: is_ended() after a change"));
                    }
                }
                Some(Err(err)) => {
                    let refused = matches!(
                        err,
                        Error::Validation(_)
                            | Error::Authentication(_)
                            | Error::NotFound(_)
                            | Error::InvalidArgument(_)
                    );
                    ended_by = Some(refused);
                    // Ended exactly by a refusal.
                    if changes.is_ended() != refused {
                        self.broken(format!(
                            "observe {key}: after {err}, is_ended() is {}",
                            changes.is_ended()
                        ));
                    }
                    self.note(format!("observe {key}: {err}"));
                }
                // The stream ends only after a failure another look
                // would not mend.
                None => {
                    if ended_by != Some(true) {
                        self.broken(format!(
                            "observe {key}: the stream ended after {ended_by:?} (a refusal: Some(true))"
                        ));
                    }
                    break;
                }
            }
        }
    }

    /// A poll interval under 100 ms is refused at the first `next()`,
    /// which sends nothing, and the stream ends there; one of exactly
    /// 100 ms is not refused.
    async fn observe_edges(&self, key: &str) {
        let least = Duration::from_millis(100);
        let mut short = self
            .locks
            .observe(key)
            .poll_interval(least - Duration::from_millis(1));
        match short.next().await {
            Some(Err(Error::InvalidArgument(_))) if short.is_ended() => {}
            other => self.broken(format!(
                "observe {key} with a 99 ms poll interval: the first item is {:?}",
                other.map(|item| item.map(|change| change.kind()))
            )),
        }
        if short.next().await.is_some() {
            self.broken(format!(
                "observe {key}: the stream went on after a refused poll interval"
            ));
        }
        // (On a key of its own: its look is not one of the observer's.)
        let mut least = self
            .locks
            .observe(format!("{key}-edges"))
            .poll_interval(least);
        if let Some(Err(Error::InvalidArgument(err))) = least.next().await {
            self.broken(format!(
                "observe {key} with a 100 ms poll interval was refused: {err}"
            ));
        }
    }

    /// What a change says of itself: its key; its kind by name; a
    /// previous state exactly when it is not the first, the one the last
    /// change showed (answers in between changed nothing); and the time
    /// its holder had left, by the service's clock.
    fn says_right(&self, change: &LockChange, last: Option<&LockState>, key: &str) {
        let kind = change.kind();
        if change.key() != key {
            self.broken(format!(
                "a change of {key} says its key is {:?}",
                change.key()
            ));
        }
        if !KINDS.contains(&kind.as_str()) || kind.to_string() != kind.as_str() {
            self.broken(format!(
                "a change's kind is named {:?} ({kind})",
                kind.as_str()
            ));
        }
        let first = kind == ChangeKind::Initial;
        if first != change.previous().is_none() {
            self.broken(format!(
                "a {kind} change of {key} has previous() {:?}",
                change.previous().map(LockState::fencing_token)
            ));
        }
        let shown = |s: &LockState| (s.held(), s.fencing_token(), s.expires_at());
        // Each kind is the change it names.
        if let Some(previous) = change.previous() {
            let (was, now) = (shown(previous), shown(change.state()));
            let fits = match kind {
                ChangeKind::Acquired => !was.0 && now.0,
                ChangeKind::Renewed => was.0 && now.0 && was.1 == now.1 && was.2 != now.2,
                ChangeKind::TakenOver => was.0 && now.0 && was.1 != now.1,
                ChangeKind::Released | ChangeKind::Expired | ChangeKind::Ended => was.0 && !now.0,
                _ => true,
            };
            if !fits {
                self.broken(format!(
                    "a change of {key} called {kind} went from {:?} to {:?}",
                    (was.0, was.1),
                    (now.0, now.1)
                ));
            }
        }
        if let (Some(previous), Some(last)) = (change.previous(), last) {
            if shown(previous) != shown(last) {
                self.broken(format!(
                    "a {kind} change of {key}: previous() shows {:?}, the last change {:?}",
                    shown(previous),
                    shown(last)
                ));
            }
        }
        let left = change
            .state()
            .expires_at()
            .filter(|_| change.state().held())
            .map(|at| (at - change.observed_at()).to_std().unwrap_or_default());
        let off = match (change.remaining(), left) {
            (Some(said), Some(left)) => said.abs_diff(left) > Duration::from_secs(1),
            (said, left) => said.is_some() != left.is_some(),
        };
        if off {
            self.broken(format!(
                "a {kind} change of {key} says {:?} left; its expiry is {left:?} after its answer",
                change.remaining()
            ));
        }
    }
}
