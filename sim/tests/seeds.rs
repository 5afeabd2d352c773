//! The simulation in CI: a bounded number of seeds with no violation, a
//! seed that replays byte for byte, and each planted bug found within a
//! bounded number of seeds (so the checks can fail).

use volcano_sim::{run, Depth, Options, Sabotage};

/// Seeds run clean in CI; `cargo run --release -- --seeds N` (from sim/)
/// explores more.
const CLEAN_SEEDS: u64 = 150;
/// A planted bug must be found within this many seeds.
const FIND_WITHIN: u64 = 100;

#[test]
fn seeds_run_without_violations() {
    let options = Options::default();
    // `VOLCANO_SIM_SEEDS=N` runs another number (the mutation runs of
    // docs/correctness.md say how many they used).
    let seeds = std::env::var("VOLCANO_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CLEAN_SEEDS);
    for seed in 0..seeds {
        let outcome = run(seed, &options);
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:#?}\nreplay: cargo run --release -- --seed {seed} --trace sim-{seed}.log (from sim/)",
            outcome.violations
        );
        assert!(outcome.events > 0, "seed {seed} logged nothing");
    }
}

/// Sixteen client hosts on two keys and one project quota (600 lock
/// operations a minute): a fleet's waiters, renewals and observers share
/// it, and every check still holds. Fifty seeds (about 20 s): sweeps of
/// 700 found fifteen failing seeds before the fixes of 2026-12-06 (four
/// SDK defects, the rest checks too strict for a fleet), the first at
/// seed 11.
#[test]
fn a_fleet_of_sixteen_on_one_quota_runs_clean() {
    let options = Options {
        clients: 16,
        ..Options::default()
    };
    runs_clean(&options, 0..50, "--clients 16");
}

/// Kept minimums in depth: most holds keep a minimum and end the moment
/// a renewal goes out, held on its way and applied late; the fix-up that
/// puts the minimum right is then troubled (503s, a 429, a gateway's 504
/// applied later, a 403, the key taken by hand). 1,000 seeds found an SDK
/// bug (seed 152: a keep that renewed a lease a late try of the acquire
/// took again after a force release was reported kept) and three checks
/// too strict (197, 299, 481).
#[test]
fn kept_minimums_under_trouble_run_clean() {
    let options = Options {
        depth: Depth::KeptMinimums,
        ..Options::default()
    };
    runs_clean(&options, 0..100, "--kept-minimums");
}

/// Observers in depth: one program observes the keys the others hold,
/// renew, let lapse and take over; its looks judged for what they say,
/// for the looks at a lease's last moments it promises and for the one
/// look more per interval a renewing holder may cost, no more. 100 seeds
/// found a check too strict (86: a release handled in the millisecond of
/// a look) and catch five hand-made mutants of the observer's bookkeeping
/// the other runs miss (docs/correctness.md, "Fifth pass").
#[test]
fn observers_in_depth_run_clean() {
    let options = Options {
        depth: Depth::Observers,
        ..Options::default()
    };
    // And 168, which found a check too strict (a capped keep's release
    // held in the network is no keep past the cap).
    runs_clean(&options, (0..40).chain([168]), "--observers");
}

/// Semaphores in depth: every scope takes a permit, and one program tries
/// more one-off semaphores than its client remembers, which must keep
/// exactly the most recently used. 300 seeds found an SDK defect (64: a
/// wait of 0 s retried its try after its deadline), 1,000 another.
#[test]
fn permits_in_depth_run_clean() {
    let options = Options {
        depth: Depth::Permits,
        ..Options::default()
    };
    // And 648, which found a second (a try's undo answered before the
    // next round's retry woke the wait at once).
    runs_clean(&options, (0..60).chain([648]), "--permits");
}

#[test]
#[cfg_attr(
    not(tokio_unstable),
    ignore = "replays exactly only under --cfg tokio_unstable: run `cargo test` from sim/"
)]
fn a_seed_replays_byte_for_byte() {
    let options = Options::default();
    // Enough seeds that some race two wake-ups in one tick (tokio's
    // `select!` picks a ready branch at random unless `biased`).
    for seed in (0..20).chain([1837]) {
        let first = run(seed, &options);
        let second = run(seed, &options);
        assert!(first.faults > 0 && first.events > 0);
        assert_eq!(
            first.trace, second.trace,
            "seed {seed} replayed differently"
        );
    }
    assert_ne!(run(3, &options).trace, run(4, &options).trace);
}

/// Every seed of `seeds` runs without a violation; `flags` replay one.
fn runs_clean(options: &Options, seeds: impl IntoIterator<Item = u64>, flags: &str) {
    for seed in seeds {
        let outcome = run(seed, options);
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:#?}\nreplay: cargo run --release -- --seed {seed} {flags} --trace sim-{seed}.log (from sim/)",
            outcome.violations
        );
    }
}

fn first_found(sabotage: Sabotage) -> Option<(u64, String)> {
    first_found_within(sabotage, FIND_WITHIN)
}

/// [`first_found`] within `seeds` seeds.
fn first_found_within(sabotage: Sabotage, seeds: u64) -> Option<(u64, String)> {
    let options = Options {
        sabotage,
        ..Options::default()
    };
    (0..seeds).find_map(|seed| {
        let outcome = run(seed, &options);
        outcome.violations.first().map(|v| (seed, v.clone()))
    })
}

/// The first seed at which a violation containing `needle` is found with
/// `sabotage` planted, and that violation.
fn first_with(sabotage: Sabotage, needle: &str) -> Option<(u64, String)> {
    let options = Options {
        sabotage,
        ..Options::default()
    };
    (0..FIND_WITHIN).find_map(|seed| {
        let outcome = run(seed, &options);
        let found = outcome.violations.into_iter().find(|v| v.contains(needle));
        found.map(|v| (seed, v))
    })
}

#[test]
fn finds_a_release_sent_before_the_guards_are_told() {
    let found = first_found(Sabotage::ReleaseBeforeMark);
    let (seed, violation) = found.expect("found within the bound");
    // Believed after its release went out: another may hold the key, and
    // nothing renews it any more.
    assert!(
        violation.contains("exclusion")
            || violation.contains("never renewed")
            || violation.contains("stopped renewing"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_an_uncertain_acquire_that_is_not_undone() {
    // Its own violation, not the seed's first: a seed can hold others.
    let found = first_with(Sabotage::NoUndo, "not undone");
    let (seed, violation) = found.expect("found within the bound");
    assert!(
        violation.contains("whose outcome it never saw"),
        "seed {seed}: {violation}"
    );
}

/// An undo that stops at its first answered release: a try applied after
/// it (behind a gateway, held in the network) takes the key under a token
/// nobody can name.
#[test]
fn finds_an_undo_that_ends_at_its_first_release() {
    let found = first_with(Sabotage::UndoEndsAtFirstRelease, "undone too soon");
    let (seed, violation) = found.expect("found within the bound");
    assert!(
        violation.contains("whose outcome it never saw") && violation.contains("window until"),
        "seed {seed}: {violation}"
    );
}

/// A retry answered 409 taken to settle the first attempt too: the first
/// attempt, still on its way, takes the key later and is never undone.
#[test]
fn finds_a_retry_that_settles_what_its_first_attempt_did() {
    let found = first_with(
        Sabotage::RetrySettlesAll,
        "later attempt of it was answered 409",
    );
    let (seed, violation) = found.expect("found within the bound");
    assert!(violation.contains("not undone"), "seed {seed}: {violation}");
}

#[test]
fn finds_a_lease_timed_from_its_answer() {
    let (seed, violation) =
        first_found(Sabotage::DeadlineFromReceipt).expect("found within the bound");
    assert!(
        ["overclaim", "overstated", "exclusion"]
            .iter()
            .any(|found| violation.contains(found)),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_waiter_that_tries_after_its_deadline() {
    let (seed, violation) =
        first_found(Sabotage::TryAfterDeadline).expect("found within the bound");
    assert!(
        violation.contains("tried after its deadline"),
        "seed {seed}: {violation}"
    );
}

/// Rarer since minimum holds no longer release (half the `try_with_lock`
/// scopes keep instead, and some `hold`s and permits now too) and a
/// quarter of the `with_lock` steps take a permit: first found at seed 408
/// (was 180, and within 100 before that); since half the refused
/// releases aim at a held key, at seed 82. Within 600 here.
#[test]
fn finds_a_refused_release_that_is_dropped() {
    let (seed, violation) =
        first_found_within(Sabotage::DropRefusedRelease, 600).expect("found within the bound");
    assert!(
        violation.contains("unreported lease") || violation.contains("leaked lease"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_waiter_that_does_not_ramp() {
    let (seed, violation) = first_found(Sabotage::NoRamp).expect("found within the bound");
    assert!(
        violation.contains("late on the ramp") || violation.contains("slow pickup"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_lock_lost_without_an_early_warning() {
    let (seed, violation) = first_found(Sabotage::NoRiskWarning).expect("found within the bound");
    // Lost with no warning first, or (sooner) not at risk while its
    // latest renewal had failed.
    assert!(
        violation.contains("without an at_risk warning") || violation.contains("not at risk"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_minimum_hold_cut_short() {
    let (seed, violation) = first_found(Sabotage::NoMinHold).expect("found within the bound");
    assert!(violation.contains("min_hold"), "seed {seed}: {violation}");
}

#[test]
fn finds_a_minimum_hold_kept_by_the_process() {
    let (seed, violation) =
        first_found(Sabotage::MinHoldInProcess).expect("found within the bound");
    assert!(
        violation.contains("min_hold kept by the process"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_semaphore_that_takes_a_permit_past_its_count() {
    let (seed, violation) =
        first_found(Sabotage::SemaphoreExtraPermit).expect("found within the bound");
    assert!(
        violation.contains("past its count"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_term_dropped_before_its_drain() {
    let (seed, violation) = first_found(Sabotage::NoDrain).expect("found within the bound");
    assert!(
        violation.contains("leader drain"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_leader_status_that_outlives_its_term() {
    let (seed, violation) =
        first_found(Sabotage::StaleLeaderStatus).expect("found within the bound");
    assert!(
        violation.contains("still says leading"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_an_observer_that_calls_a_takeover_a_renewal() {
    let (seed, violation) =
        first_found(Sabotage::ObserveMissesTakeover).expect("found within the bound");
    assert!(
        (violation.contains("a renewal") && violation.contains("(a takeover)"))
            || violation.contains("called renewed went from"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_an_observer_that_stops_looking_after_a_failure() {
    let (seed, violation) = first_found(Sabotage::ObserveStalls).expect("found within the bound");
    assert!(
        violation.contains("stopped looking"),
        "seed {seed}: {violation}"
    );
}

/// Clocks that drift within the bound of docs/guide/ttl-and-clocks.md (a lease of `ttl` measured
/// on a clock `ρ` slow overruns by `ttl × ρ`, kept under the service's
/// 1 s grace: ρ < 1/12 for the programs' longest TTL, 12 s) run clean,
/// slow or fast; no guard believes past the moment another can take its
/// key.
#[test]
fn clocks_drifting_within_the_stated_bound_run_clean() {
    for rate in [0.95, 1.05] {
        let options = Options {
            clock_rate: Some(rate),
            ..Options::default()
        };
        for seed in 0..50 {
            let outcome = run(seed, &options);
            assert!(
                outcome.violations.is_empty(),
                "rate {rate}, seed {seed}: {:#?}",
                outcome.violations
            );
        }
    }
}

/// Beyond the bound (a clock 20 % slow overruns a 12 s lease by 3 s), the
/// checks find a guard that believes or claims past its lease.
#[test]
fn clocks_drifting_beyond_the_stated_bound_are_found() {
    let options = Options {
        clock_rate: Some(0.8),
        ..Options::default()
    };
    // Other checks may fire first (a slow clock also stretches the
    // windows the SDK keeps): the first of these that fires.
    let found = (0..FIND_WITHIN).find_map(|seed| {
        run(seed, &options).violations.into_iter().find(|v| {
            ["overclaim", "overstated", "exclusion"]
                .iter()
                .any(|what| v.contains(what))
        })
    });
    let violation = found.expect("found within the bound");
    assert!(
        ["overclaim", "overstated", "exclusion"]
            .iter()
            .any(|what| violation.contains(what)),
        "{violation}"
    );
}

#[test]
fn finds_a_leader_health_that_misses_a_stalled_term() {
    let (seed, violation) =
        first_found(Sabotage::LeaderHealthSilent).expect("found within the bound");
    assert!(
        violation.contains("health says nothing"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_leader_health_that_outlives_its_term() {
    let (seed, violation) =
        first_found(Sabotage::LeaderHealthStuck).expect("found within the bound");
    assert!(violation.contains("has ended"), "seed {seed}: {violation}");
}

#[test]
fn finds_a_lock_that_is_never_renewed() {
    let (seed, violation) = first_found(Sabotage::NoRenewal).expect("found within the bound");
    assert!(
        violation.contains("never renewed"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_an_acquire_retried_after_a_409() {
    let (seed, violation) = first_found(Sabotage::RetryOn409).expect("found within the bound");
    assert!(
        violation.contains("acquire retried after a 409"),
        "seed {seed}: {violation}"
    );
}

#[test]
fn finds_a_waiter_that_never_tries_after_its_first_look() {
    let found = first_with(Sabotage::WaiterStopsTrying, "stopped trying");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_waiter_in_a_tight_loop() {
    let found = first_with(Sabotage::WaiterSpins, "tight loop");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_waiter_that_gives_up_at_its_first_error() {
    let found = first_with(Sabotage::WaiterGivesUpOnError, "gave up early");
    let (seed, violation) = found.expect("found within the bound");
    // Its error says "try again": the lock is not the reason.
    assert!(!violation.contains("409"), "seed {seed}: {violation}");
}

#[test]
fn finds_a_guard_renewing_in_a_tight_loop() {
    let found = first_with(Sabotage::RenewsInATightLoop, "renewed too soon");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_guard_renewing_too_late() {
    let found = first_with(Sabotage::RenewsTooLate, "renewed too late");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_guard_that_retries_a_refused_renewal() {
    let found = first_with(Sabotage::RenewalRetriesConflict, "believed after a refusal");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_guard_that_renews_once_then_stops() {
    let found = first_with(Sabotage::RenewsOnce, "stopped renewing");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_warning_that_never_clears() {
    let found = first_with(Sabotage::RiskNeverClears, "at_risk:");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_late_renewal_that_stretches_a_kept_minimum() {
    let found = first_with(Sabotage::LateRenewalForgotten, "before the job ended");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_semaphore_try_that_gives_up_with_permits_free() {
    let found = first_with(Sabotage::SemaphoreTryGivesUpEarly, "never saw permits");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_kept_minimum_released_by_its_fix_up() {
    let found = first_with(Sabotage::KeptSweepReleases, "min_hold");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

/// In kept minimums in depth, half of them under a cap: found at seed 5
/// (in the default mix, where few minimums have a cap, at seed 98).
#[test]
fn finds_a_keep_past_max_hold() {
    let options = Options {
        sabotage: Sabotage::KeepPastMaxHold,
        depth: Depth::KeptMinimums,
        ..Options::default()
    };
    let found = (0..FIND_WITHIN).find(|seed| {
        run(*seed, &options)
            .violations
            .iter()
            .any(|v| v.contains("min_hold past max_hold"))
    });
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_kept_minimum_reported_as_not_kept() {
    let found = first_with(Sabotage::KeptReportedNotKept, "min_hold reported not kept");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_follower_slow_to_step_down() {
    let found = first_with(Sabotage::FollowerWaitsForUndo, "leader step-down");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}

#[test]
fn finds_a_semaphore_wait_that_never_rotates() {
    let found = first_with(Sabotage::SemaphoreTriesRecentFirst, "still had no permit");
    assert!(found.is_some(), "not found within {FIND_WITHIN} seeds");
}
