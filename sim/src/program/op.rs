//! Which operation a step performs, and what its coin decides. A step
//! draws one number below [`DRAWS`] and [`Op::pick`] maps it through the
//! weight table [`OPS`]; the step's coin (one `u64` from the seed) then
//! shapes the operation: how long it waits, how often it polls, whether it
//! caps or drops its hold. The table's order and every coin's arithmetic
//! are part of each seed's replay: changing either changes the traces.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::log::Waiting;
use crate::Depth;

/// One operation of a program, each through the real SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// `hold`, with `max_hold` and a request timeout at times, then work,
    /// and a release or a drop.
    HoldShaped,
    /// `with_lock`: work inside the scope.
    WithLock,
    /// `try_with_lock`: work inside the scope, if the key is free.
    TryWithLock,
    /// A waiting `acquire`, a `renew` and a `release`, by hand.
    AcquireRenewRelease,
    /// `leader`: campaign and work through each term, for a while.
    Leader,
    /// `hold_all` over every key, then work, and a release or a drop.
    HoldAll,
    /// `with_locks` over every key: work inside the scope.
    WithLocks,
    /// `hold` under the program's own token, recovered the documented way
    /// after a failure or a drop.
    OwnToken,
    /// `force_release` (breaks exclusion by design).
    ForceRelease,
    /// `observe` a key for a while, logging each change it yields.
    Observe,
}

/// Each operation's share of the draws: an entry takes the next `weight`
/// values of the draw, in this order (draws 0 to 2 hold, 3 to 5 run
/// `with_lock`, and so on). `ForceRelease` has two slots, draws 11 and 15:
/// the order is what keeps every seed's replay, so it is not merged.
pub(super) const OPS: [(Op, u32); 11] = [
    (Op::HoldShaped, 3),
    (Op::WithLock, 3),
    (Op::TryWithLock, 2),
    (Op::AcquireRenewRelease, 2),
    (Op::Leader, 1),
    (Op::ForceRelease, 1),
    (Op::HoldAll, 1),
    (Op::WithLocks, 1),
    (Op::OwnToken, 1),
    (Op::ForceRelease, 1),
    (Op::Observe, 2),
];

/// The range of a step's draw: the weights' sum (18).
pub(super) const DRAWS: u32 = {
    let mut sum = 0;
    let mut i = 0;
    while i < OPS.len() {
        sum += OPS[i].1;
        i += 1;
    }
    sum
};

/// How long a leader campaigns, in multiples of the step's work.
const CAMPAIGN: u32 = 3;

impl Op {
    /// The operation that `draw` (in `0..DRAWS`) picks from [`OPS`].
    pub(super) fn pick(draw: u32) -> Op {
        let mut below = 0;
        for &(op, weight) in &OPS {
            below += weight;
            if draw < below {
                return op;
            }
        }
        // Never drawn: the catch-all of the integer codes this table
        // replaces was a force-release.
        Op::ForceRelease
    }

    /// A `with_lock` that takes a permit of a semaphore instead (a quarter
    /// of them, every one in [`Depth::Permits`]): it waits for a permit,
    /// not for its key.
    pub(super) fn takes_a_permit(self, coin: u64, depth: Depth) -> bool {
        matches!(self, Op::WithLock) && (depth == Depth::Permits || one_in(coin >> 37, 4))
    }

    /// The operation a run in `depth` does in place of this one.
    /// - Kept minimums: a hold in place of each scope and acquire by hand
    ///   (leaders, sets, own tokens, force releases and observers stay,
    ///   around them).
    /// - Observers: as the mix (the first program only observes: see
    ///   `Program::run`).
    /// - Permits: a permit in place of each scope, hold and acquire by
    ///   hand (leaders, sets, own tokens, force releases and observers
    ///   stay).
    pub(super) fn in_depth(self, depth: Depth) -> Op {
        match (depth, self) {
            (Depth::KeptMinimums, Op::WithLock | Op::TryWithLock | Op::AcquireRenewRelease) => {
                Op::HoldShaped
            }
            (Depth::Permits, Op::HoldShaped | Op::TryWithLock | Op::AcquireRenewRelease) => {
                Op::WithLock
            }
            (_, op) => op,
        }
    }

    /// How long the operation waits for a held key, if it does: the coin
    /// picks the wait of an acquire, a leader campaigns for a while, and
    /// a try or a force-release does not wait.
    pub(super) fn waits(self, coin: u64, work: Duration) -> Option<Duration> {
        match self {
            Op::HoldShaped
            | Op::WithLock
            | Op::AcquireRenewRelease
            | Op::HoldAll
            | Op::WithLocks
            | Op::OwnToken => Some(wait_for(coin)),
            Op::Leader => Some(campaign(work)),
            Op::TryWithLock | Op::ForceRelease | Op::Observe => None,
        }
    }

    /// How the operation waits for a key, when it does.
    pub(super) fn waiting(self) -> Waiting {
        match self {
            Op::Leader => Waiting::Campaign,
            Op::HoldAll | Op::WithLocks => Waiting::Set,
            Op::HoldShaped
            | Op::WithLock
            | Op::TryWithLock
            | Op::AcquireRenewRelease
            | Op::OwnToken
            | Op::ForceRelease
            | Op::Observe => Waiting::Acquire,
        }
    }
}

/// How long a leader campaigns (and so waits for its key): a few times
/// the step's work.
pub(super) fn campaign(work: Duration) -> Duration {
    work * CAMPAIGN
}

/// Whether the coin comes up one time in `n`.
pub(super) fn one_in(coin: u64, n: u64) -> bool {
    coin % n == 0
}

/// How long an operation that waits for a held key waits: up to 20 s,
/// or (one time in four, as a standby does) 30 s to a minute, long
/// enough to see a crashed holder's lease expire.
pub(super) fn wait_for(coin: u64) -> Duration {
    if (coin >> 58) % 4 == 0 {
        Duration::from_millis(30_000 + (coin >> 30) % 30_000)
    } else {
        Duration::from_millis(coin % 20_000)
    }
}

/// A cap on a hold (`max_hold`): from 1 s to 10 s, one time in seven
/// exactly the least allowed, 1 s.
pub(super) fn max_hold_for(coin: u64) -> Duration {
    let more = if coin % 7 == 3 { 0 } else { coin % 9_000 };
    Duration::from_millis(1_000 + more)
}

/// A minimum hold, half the time: from 1 s to 9 s (bits of the coin no
/// other decision reads).
pub(super) fn min_hold_for(coin: u64) -> Option<Duration> {
    let bits = coin >> 40;
    (bits % 2 == 0).then(|| Duration::from_millis(1_000 + (bits >> 1) % 8_000))
}

/// A per-request timeout: from 0.5 s to 4.5 s.
pub(super) fn timeout_for(coin: u64) -> Duration {
    Duration::from_millis(500 + coin % 4_000)
}

/// How often a waiter looks for an early release: mostly the default, at
/// times much more often (so that a waiter can take a key in the moment
/// between a release that was applied and its client learning so).
pub(super) fn poll_for(coin: u64) -> Duration {
    const OFTEN: [u64; 4] = [200, 500, 1_000, 2_000];
    match (coin / 11) % 3 {
        0 => Duration::from_millis(OFTEN[(coin / 33 % 4) as usize]),
        _ => Duration::from_secs(10),
    }
}

/// A UUID spelled from `seed` (a caller's own token).
pub(super) fn uuid_from(seed: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let (a, b, c, d): (u32, u16, u16, u64) =
        (rng.random(), rng.random(), rng.random(), rng.random());
    format!(
        "{a:08x}-{b:04x}-4{:03x}-8{:03x}-{:012x}",
        c & 0x0fff,
        d & 0x0fff,
        (d >> 16) & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer codes the table replaced, draw by draw, then the
    /// operations added since.
    #[test]
    fn the_table_keeps_the_old_codes() {
        let old = [
            (0..=2, Op::HoldShaped),
            (3..=5, Op::WithLock),
            (6..=7, Op::TryWithLock),
            (8..=9, Op::AcquireRenewRelease),
            (10..=10, Op::Leader),
            (11..=11, Op::ForceRelease),
            (12..=12, Op::HoldAll),
            (13..=13, Op::WithLocks),
            (14..=14, Op::OwnToken),
            (15..=15, Op::ForceRelease),
            (16..=17, Op::Observe),
        ];
        assert_eq!(DRAWS, 18);
        for (draws, op) in old {
            for draw in draws {
                assert_eq!(Op::pick(draw), op, "draw {draw}");
            }
        }
    }

    /// How each operation waits, as the integer codes said.
    #[test]
    fn waits_keep_the_old_codes() {
        // Top bits that pick the usual wait (not a standby's long one).
        let (coin, work) = (12_345 | 1 << 58, Duration::from_millis(700));
        let waits: Vec<_> = (0..DRAWS)
            .map(|draw| Op::pick(draw).waits(coin, work))
            .collect();
        let acquire = Some(Duration::from_millis(coin % 20_000));
        let expected = [
            acquire,
            acquire,
            acquire,
            acquire,
            acquire,
            acquire,
            None,
            None,
            acquire,
            acquire,
            Some(work * 3),
            None,
            acquire,
            acquire,
            acquire,
            None,
            None,
            None,
        ];
        assert_eq!(waits, expected);
        let how: Vec<_> = (0..DRAWS).map(|draw| Op::pick(draw).waiting()).collect();
        for (draw, how) in how.into_iter().enumerate() {
            let expected = match draw {
                10 => Waiting::Campaign,
                12 | 13 => Waiting::Set,
                _ => Waiting::Acquire,
            };
            assert_eq!(how, expected, "draw {draw}");
        }
    }

    #[test]
    fn one_wait_in_four_is_long() {
        let long = (0..4u64)
            .map(|top| wait_for(12_345 | top << 58))
            .filter(|wait| *wait >= Duration::from_secs(30))
            .count();
        assert_eq!(long, 1);
        assert!(wait_for(0) <= Duration::from_secs(60));
    }
}
