//! The checks after every seed, over the programs' log and the server's
//! journal and locks. Each violation is one line of text.
//!
//! [`all`] builds one [`Run`] (`check/run.rs`: the log, the server, and
//! what the checks derive from them) and gives it to every check in turn.
//! That locks never lie: safety (`check/safety.rs`), linearizability
//! (`check/linear.rs`), what a release reports (`check/truth.rs`), what
//! observers said (`check/observe.rs`). That they work: leases left
//! behind and what `shutdown` reports (`check/leaks.rs`), a freed key
//! going to a waiter (`check/recovery.rs`), deadlines kept
//! (`check/deadlines.rs`), renewals on their schedule
//! (`check/renewal.rs`), the early warning following them
//! (`check/risk.rs`), capped leaders making way (`check/leader.rs`),
//! options given at once reaching the wire (`check/asked.rs`), the
//! protocol's single retry and waiters that keep trying
//! (`check/cadence.rs`), a waiter's ramp and its look at a holder's
//! expiry (`check/aim.rs`), an observer's looks on its schedule
//! (`check/thrift.rs`), renewals retried and given up only when the
//! window closes, with the right reason (`check/giveup.rs`), waiters of
//! one client taking turns (`check/turns.rs`), a kept minimum's fix-up
//! spending little (`check/fixup.rs`), a wait for a permit on
//! its ramp and woken by its own client's release (`check/permit_pace.rs`). It also
//! measures the belief margin of every loss (`check/margin.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use self::run::Run;
use crate::log::{Event, Stamped};

mod aim;
mod asked;
mod cadence;
mod deadlines;
mod fixup;
mod giveup;
mod leader;
mod leaks;
mod linear;
mod margin;
mod minimum;
mod observe;
mod permit_pace;
mod recovery;
mod renewal;
mod reported;
mod risk;
mod run;
mod safety;
mod semaphore;
mod thrift;
mod truth;
mod turns;

pub(crate) use self::leaks::Late;
pub(crate) use self::run::Server;

/// What the checks found: the violations, the belief margin of every
/// loss (`check/margin.rs`), in milliseconds, and what the leak checks
/// excused by the bound or saw after a 409 (`check/leaks.rs`).
pub(crate) struct Found {
    pub(crate) violations: Vec<String>,
    pub(crate) margins_ms: Vec<i64>,
    pub(crate) late: Late,
}

/// Every check, and what they found.
pub(crate) fn all(
    events: &[Stamped],
    server: &Server,
    end: Duration,
    clock_rate: Option<f64>,
) -> Found {
    let mut run = Run::new(events, server, end);
    run.drift_slack = drift_slack(clock_rate);
    run.clock_rate = clock_rate.unwrap_or(1.0);
    let mut violations = Vec::new();
    let out = &mut violations;
    liveness(&run, out);
    safety::exclusion(&run, out);
    safety::granted(&run, out);
    safety::writes(&run, out);
    safety::fences(&run, out);
    safety::within_lease(&run, out);
    let late = leaks::undone(&run, out);
    leaks::no_needless_undo(&run, out);
    leaks::at_end(&run, out);
    leaks::reported_at_shutdown(&run, out);
    minimum::kept_by_the_service(&run, out);
    fixup::fix_up_spends_little(&run, out);
    fixup::fix_up_releases_only_what_may_land(&run, out);
    leader::drains(&run, out);
    semaphore::within_count(&run, out);
    semaphore::waits_end_by_their_deadline(&run, out);
    semaphore::all_taken_only_when_seen(&run, out);
    semaphore::waits_find_a_free_permit(&run, out);
    permit_pace::permit_waits_paced(&run, out);
    permit_pace::own_release_wakes_the_wait(&run, out);
    permit_pace::permit_waits_hold_back(&run, out);
    minimum::kept_within_the_cap(&run, out);
    reported::reported_as_kept(&run, out);
    leader::steps_down_in_time(&run, out);
    recovery::after_crash(&run, out);
    recovery::after_release(&run, out);
    truth::releases(&run, out);
    truth::successes(&run, out);
    truth::takeovers(&run, out);
    truth::force_releases_sent(&run, out);
    safety::remaining(&run, out);
    deadlines::waits(&run, out);
    safety::no_write_after_loss(&run, out);
    contracts(&run, out);
    truth::backoff(&run, out);
    truth::release_retries(&run, out);
    linear::check(&run, out);
    observe::told_right(&run, out);
    observe::kept_looking(&run, out);
    observe::sees_expiry(&run, out);
    thrift::thrifty(&run, out);
    thrift::quiet_while_spent(&run, out);
    thrift::looks_at_last_moments(&run, out);
    thrift::one_more_per_interval(&run, out);
    renewal::renewed(&run, out);
    cadence::acquire_retries(&run, out);
    cadence::acquire_retried(&run, out);
    cadence::waiters(&run, out);
    aim::paced(&run, out);
    aim::looks_at_the_takeover(&run, out);
    renewal::schedule(&run, out);
    renewal::lost_on_refusal(&run, out);
    giveup::gives_up_last(&run, out);
    giveup::no_safe_window(&run, out);
    giveup::retries_renewal(&run, out);
    risk::follows_renewals(&run, out);
    turns::wait_their_turn(&run, out);
    turns::take_their_turn(&run, out);
    leader::makes_way(&run, out);
    leader::says_unreachable(&run, out);
    asked::options_reach_the_wire(&run, out);
    Found {
        violations,
        margins_ms: margin::of_losses(&run),
        late,
    }
}

/// How far past the server's expiry a guard on a clock running at `rate`
/// may believe, or say its lease lasts. A lease of `L` measured on a clock
/// running slow (`rate < 1`) lasts `L / rate` of true time, `L × (1/rate −
/// 1)` too long. What docs/guide/ttl-and-clocks.md promises: while `ttl × (1/rate − 1)` is
/// under the service's 1 s grace, no guard believes past the moment
/// another holder can take the key. So with a drifting clock a belief may
/// outlast the expiry by less than the grace, never more: beyond the
/// stated bound these checks fail.
fn drift_slack(rate: Option<f64>) -> Duration {
    match rate {
        Some(rate) if rate < 1.0 => Duration::from_secs(1),
        _ => Duration::ZERO,
    }
}

/// Liveness, coarsely: three programs of mostly holds and scopes on two
/// keys always get some lock (a guard or a lease), whatever the faults.
/// (One or two programs may, by the seed, do little but try and
/// force-release under faults: the check needs three.)
fn liveness(run: &Run<'_>, out: &mut Vec<String>) {
    let leased = run
        .events
        .iter()
        .any(|e| matches!(e.event, Event::Leased { .. }));
    let programs: BTreeSet<usize> = run
        .events
        .iter()
        .filter_map(|e| match e.event {
            Event::Done { client, .. } | Event::StepEnded { client } => Some(client),
            _ => None,
        })
        .collect();
    if programs.len() >= 3 && run.beliefs.is_empty() && !leased {
        out.push("liveness: no program held any key in the whole run".to_owned());
    }
}

/// Every break of a guard's own contract the programs logged.
fn contracts(run: &Run<'_>, out: &mut Vec<String>) {
    for e in run.events {
        if let Event::Contract { client, what } = &e.event {
            out.push(format!(
                "guard contract: client {client} at {:?}: {what}",
                e.at
            ));
        }
    }
}
