//! `volcano locks diagnose KEY`: is anyone still renewing this lock?
//!
//! `locks get` says a key is held and until when; it cannot say whether its
//! holder is alive. A holder using this SDK or the CLI renews at most
//! [`volcano::LONGEST_RENEWAL_INTERVAL`] (66 s) apart, so watching the key
//! that long, and [`MARGIN`] more for the renewal's own trip, tells: its
//! expiry moves (`renewed`: a live holder), it is freed before its expiry
//! (`released`), it passes its expiry unrenewed (`expired`), or neither
//! happens (`unrenewed`: held, and nobody renews it). A key free at the
//! first look is `free`.
//!
//! Time is read on the service's clock (each answer's `Date`, whole
//! seconds, counted a second short) as well as this machine's, and the
//! watch ends when either has run [`WATCH`]: a test that moves the mock
//! server's clock sees the verdict at once. One look every `--interval`
//! (2 s: at most 36 looks, 6 % of a 600/min quota), and one just past the
//! expiry when it comes first; a look still unanswered at the watch's end
//! is given up. A 429 or a transient failure is waited out and looked
//! again, until the watch's end.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::time::Instant;
use volcano::{Error, LockState, Locks};

use crate::exit::{self, fail, Failure};

/// Beyond the longest interval between two renewals: the time a renewal
/// takes to arrive (and a retry of it), and the `Date` header's rounding.
pub(crate) const MARGIN: Duration = Duration::from_secs(4);

/// The longest watch: 70 s.
pub(crate) const WATCH: Duration = Duration::from_secs(70);

const _: () =
    assert!(WATCH.as_secs() == volcano::LONGEST_RENEWAL_INTERVAL.as_secs() + MARGIN.as_secs());

/// What the watch found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    Free,
    Renewed,
    Released,
    Expired,
    Unrenewed,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Free => "free",
            Verdict::Renewed => "renewed",
            Verdict::Released => "released",
            Verdict::Expired => "expired",
            Verdict::Unrenewed => "unrenewed",
        }
    }
}

/// The lease seen at the first look.
struct Seen {
    fence: Option<i64>,
    expires_at: Option<DateTime<Utc>>,
    /// The first answer's `Date`.
    read_at: Option<DateTime<Utc>>,
}

/// What the last look said against what the first saw: a verdict, or
/// `None` to look again.
fn judge(seen: &Seen, now: &LockState) -> Option<Verdict> {
    // Before the expiry by the service's clock (its `Date`, whole
    // seconds); without one, by the holder's expiry against this machine's.
    let past_expiry = match (seen.expires_at, now.read_at()) {
        (Some(expires_at), Some(date)) => date >= expires_at,
        (Some(expires_at), None) => Utc::now() >= expires_at,
        (None, _) => false,
    };
    let ended = if past_expiry {
        Verdict::Expired
    } else {
        Verdict::Released
    };
    if !now.held() || now.fencing_token() != seen.fence {
        // Free, or another lease (taken since): the one seen has ended.
        return Some(ended);
    }
    // Moved either way (a renewal sets it from now: a shorter ttl moves it
    // back): someone renewed it.
    if now.expires_at() != seen.expires_at {
        return Some(Verdict::Renewed);
    }
    // Held past its expiry (the service's grace): it ran out unrenewed.
    past_expiry.then_some(Verdict::Expired)
}

/// Watches `key` until a verdict, at most [`WATCH`].
pub(crate) async fn diagnose(
    locks: &Locks,
    key: &str,
    interval: Duration,
) -> Result<Value, Failure> {
    let longest = WATCH;
    let first = locks.get(key).await?;
    let began = Instant::now();
    let seen = Seen {
        fence: first.fencing_token(),
        expires_at: first.expires_at(),
        read_at: first.read_at(),
    };
    let mut looks = 1;
    if !first.held() {
        return Ok(report(
            key,
            Verdict::Free,
            &seen,
            &first,
            Duration::ZERO,
            looks,
        ));
    }
    let mut last = first;
    // The last look's failure: no verdict while it stands.
    let mut failing: Option<Failure> = None;
    // Its `Retry-After`, if any.
    let mut retry_after = None;
    loop {
        let watched = watched_until(&seen, &last, began);
        if watched >= longest {
            if let Some(failure) = failing {
                return Err(failure);
            }
            return Ok(report(
                key,
                Verdict::Unrenewed,
                &seen,
                &last,
                watched,
                looks,
            ));
        }
        // Next look: in `interval`, or just past the expiry (the `Date`'s
        // whole second and the grace), or at the watch's end.
        let to_expiry = last
            .remaining()
            .map_or(interval, |left| left + Duration::from_millis(1_500));
        let pause = match &failing {
            Some(_) => interval.max(retry_after.unwrap_or_default()),
            None => interval.min(to_expiry),
        };
        tokio::time::sleep(pause.min(longest - watched).max(Duration::from_millis(100))).await;
        looks += 1;
        // Never past the watch's end by more than a moment.
        let left = longest.saturating_sub(watched_until(&seen, &last, began));
        let look = tokio::time::timeout(left + Duration::from_secs(1), locks.get(key));
        let Ok(answer) = look.await else {
            // Unanswered at the watch's end: no verdict on a blind spot.
            failing = Some(fail(
                exit::UNAVAILABLE,
                format!(
                    "{key}: the last look was not answered before the watch's end ({} s); no \
                     verdict",
                    longest.as_secs()
                ),
            ));
            continue;
        };
        match answer {
            Ok(now) => {
                failing = None;
                if let Some(verdict) = judge(&seen, &now) {
                    let watched = watched_until(&seen, &now, began);
                    return Ok(report(key, verdict, &seen, &now, watched, looks));
                }
                last = now;
            }
            // Waited out and looked again: a watch at 3 a.m. outlives a
            // blip. Anything else (a refused key, refused credentials) ends it.
            Err(err) if err.may_have_been_applied() || matches!(err, Error::RateLimited(_)) => {
                retry_after = err.retry_after();
                failing = Some(err.into());
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// How long the key has been watched up to `now`'s answer: by the
/// service's clock or this machine's, whichever says more.
fn watched_until(seen: &Seen, now: &LockState, began: Instant) -> Duration {
    // Whole seconds each: a second short, never long.
    let by_service = match (seen.read_at, now.read_at()) {
        (Some(first), Some(date)) => (date - first)
            .to_std()
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1)),
        _ => Duration::ZERO,
    };
    by_service.max(began.elapsed())
}

fn rfc3339(time: Option<DateTime<Utc>>) -> Option<String> {
    time.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// The verdict as `output::print` shows it: the JSON object, with the
/// lease first seen, the lease now (when another holds it) and a line of
/// advice for text.
fn report(
    key: &str,
    verdict: Verdict,
    seen: &Seen,
    now: &LockState,
    watched: Duration,
    looks: u32,
) -> Value {
    let fence = seen.fence.map_or("?".to_owned(), |f| f.to_string());
    let until = rfc3339(seen.expires_at).unwrap_or_else(|| "?".into());
    let secs = watched.as_secs_f64();
    let taken = (now.held() && now.fencing_token() != seen.fence)
        .then(|| now.fencing_token())
        .flatten();
    let since = taken.map_or(String::new(), |t| {
        format!("; it has been taken since, by fencing token {t}")
    });
    let advice = match verdict {
        Verdict::Free => format!("{key}: free (nobody holds it)"),
        Verdict::Renewed => format!(
            "{key}: renewed: fencing token {fence}'s expiry moved from {until} to {} within \
             {secs:.1} s. A live holder is renewing it: do not force-release it; find it by \
             its fencing token in your logs",
            rfc3339(now.expires_at()).unwrap_or_default()
        ),
        Verdict::Released => format!(
            "{key}: released: fencing token {fence} was freed before its expiry, within \
             {secs:.1} s{since}"
        ),
        Verdict::Expired => format!(
            "{key}: expired: fencing token {fence} ran out at {until} without a renewal: its \
             holder stopped renewing (it died, or lost its way to the service){since}"
        ),
        Verdict::Unrenewed => format!(
            "{key}: unrenewed: fencing token {fence} is held until {until} and was not renewed \
             in {secs:.0} s, longer than any holder using this SDK or the CLI leaves between \
             renewals (a kept --min-hold, a holder of another client, or a stuck renewal). It \
             frees itself at {until}; to free it sooner: volcano locks force-release {key} \
             --if-fencing-token {fence}"
        ),
    };
    json!({
        "key": key,
        "verdict": verdict.name(),
        "fencing_token": seen.fence,
        "expires_at": rfc3339(seen.expires_at),
        "now_fencing_token": taken,
        "now_expires_at": if verdict == Verdict::Renewed || taken.is_some() {
            rfc3339(now.expires_at())
        } else {
            None
        },
        "watched_ms": u64::try_from(watched.as_millis()).unwrap_or(u64::MAX),
        "looks": looks,
        "advice": advice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds from now, on this machine's clock (a `LockState` built here
    /// has no `Date`).
    fn at(secs: i64) -> DateTime<Utc> {
        Utc::now() + chrono::TimeDelta::seconds(secs)
    }

    fn held(expires_at: DateTime<Utc>, fence: i64) -> LockState {
        LockState::new(true, Some(expires_at), Some(fence))
    }

    #[test]
    fn each_change_of_a_held_key_has_its_verdict() {
        let expiry = at(60);
        let seen = Seen {
            fence: Some(7),
            expires_at: Some(expiry),
            read_at: None,
        };
        assert_eq!(judge(&seen, &held(expiry, 7)), None, "nothing moved yet");
        let later = expiry + chrono::TimeDelta::seconds(30);
        assert_eq!(judge(&seen, &held(later, 7)), Some(Verdict::Renewed));
        // Renewed with a shorter ttl: moved back, renewed all the same.
        let sooner = expiry - chrono::TimeDelta::seconds(30);
        assert_eq!(judge(&seen, &held(sooner, 7)), Some(Verdict::Renewed));
        let free = LockState::new(false, None, None);
        assert_eq!(judge(&seen, &free), Some(Verdict::Released));
        assert_eq!(judge(&seen, &held(later, 8)), Some(Verdict::Released));
        // Past its expiry, unmoved or gone: it ran out.
        let gone = at(-1);
        let past = Seen {
            expires_at: Some(gone),
            ..seen
        };
        assert_eq!(judge(&past, &held(gone, 7)), Some(Verdict::Expired));
        assert_eq!(judge(&past, &free), Some(Verdict::Expired));
        assert_eq!(judge(&past, &held(at(30), 8)), Some(Verdict::Expired));
    }
}
