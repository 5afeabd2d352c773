//! Metrics through the `metrics` facade (feature `metrics`): the
//! application installs a recorder (Prometheus, StatsD, ...), the SDK only
//! emits. Without the feature every function here is empty. Names and
//! labels are listed in docs/guide/observability.md.

use std::time::Duration;

use crate::error::{Error, LostReason};

/// Outcome label of a finished acquire.
fn outcome<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(err) if err.is_lock_held() => "held",
        Err(Error::Transport(_)) => "transport",
        Err(Error::RateLimited(_)) => "rate_limited",
        Err(Error::Server(_)) => "server",
        Err(Error::Authentication(_)) => "auth",
        Err(Error::InvalidArgument(_) | Error::Validation(_)) => "invalid",
        Err(_) => "other",
    }
}

/// An acquire ended after `took`; `waited` if it was a waiting acquire.
pub(crate) fn acquired<T>(took: Duration, waited: bool, result: &Result<T, Error>) {
    let outcome = outcome(result);
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("volcano_lock_acquires_total", "outcome" => outcome).increment(1);
        metrics::histogram!("volcano_lock_acquire_seconds", "outcome" => outcome)
            .record(took.as_secs_f64());
        if waited {
            metrics::histogram!("volcano_lock_wait_seconds", "outcome" => outcome)
                .record(took.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, took, waited);
}

/// A renewal attempt ended: `renewed`, `retried` (transient failure, tried
/// again) or `failed` (the lock is lost).
pub(crate) fn renewal(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("volcano_lock_renewals_total", "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// A loss's metrics label.
pub(crate) fn reason(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Released => "released",
        LostReason::RenewalFailed => "renewal_failed",
        LostReason::Expired => "expired",
        LostReason::NoSafeWindow => "no_safe_window",
        LostReason::Marked => "marked",
        LostReason::MaxHold => "max_hold",
        LostReason::TakenOver => "taken_over",
    }
}

/// A guard lost ownership (not counted: an ordinary release).
pub(crate) fn lost(reason: LostReason) {
    if reason == LostReason::Released {
        return;
    }
    let reason = self::reason(reason);
    #[cfg(feature = "metrics")]
    metrics::counter!("volcano_lock_losses_total", "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// An at-risk episode began: a held lock's renewals are failing.
pub(crate) fn at_risk() {
    #[cfg(feature = "metrics")]
    metrics::counter!("volcano_lock_at_risk_total").increment(1);
}

/// A minimum hold's keeping renewal could not be made: the key may be
/// free before the minimum's end.
pub(crate) fn min_hold_not_kept() {
    #[cfg(feature = "metrics")]
    metrics::counter!("volcano_min_hold_not_kept_total").increment(1);
}

/// A renewing lock (`hold`, `with_lock`, a leader's term) began.
pub(crate) fn hold_started() {
    #[cfg(feature = "metrics")]
    metrics::gauge!("volcano_lock_held").increment(1.0);
}

/// A renewing lock ended after `held` (released, dropped or lost).
pub(crate) fn hold_ended(held: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("volcano_lock_held").decrement(1.0);
        metrics::histogram!("volcano_lock_hold_seconds").record(held.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = held;
}

/// A candidate was elected (`key`: the label, when asked for).
pub(crate) fn leader_elected(key: Option<&str>, fencing_token: i64) {
    #[cfg(feature = "metrics")]
    {
        let labels: Vec<(&'static str, String)> =
            key.map(|key| ("key", key.to_owned())).into_iter().collect();
        metrics::counter!("volcano_leader_terms_total", &labels).increment(1);
        // Terms running: several leaders of one process (or of one key,
        // with its label) count up and down on one series.
        metrics::gauge!("volcano_leader_is_leader", &labels).increment(1.0);
        metrics::gauge!("volcano_leader_fencing_token", &labels).set(fencing_token as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (key, fencing_token);
}

/// A term ended, for `why`: `resigned`, `returned`, or the loss's reason.
pub(crate) fn leader_ended(key: Option<&str>, why: &'static str) {
    #[cfg(feature = "metrics")]
    {
        let mut labels: Vec<(&'static str, String)> =
            key.map(|key| ("key", key.to_owned())).into_iter().collect();
        metrics::gauge!("volcano_leader_is_leader", &labels).decrement(1.0);
        labels.push(("reason", why.to_owned()));
        metrics::counter!("volcano_leader_terms_ended_total", &labels).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (key, why);
}

/// This machine's name, for the log line that names a lock's holder (an
/// operator looks for the fencing token in the holder's logs): the kernel's
/// node name on Unix, `COMPUTERNAME` on Windows, `HOSTNAME` elsewhere; empty
/// when none can be read. Read once.
pub(crate) fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        #[cfg(unix)]
        let name = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        #[cfg(windows)]
        let name = std::env::var("COMPUTERNAME").unwrap_or_default();
        #[cfg(not(any(unix, windows)))]
        let name = std::env::var("HOSTNAME").unwrap_or_default();
        name
    })
}
