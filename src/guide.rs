//! The guides: how to use the SDK for each kind of job, what it promises
//! and what it cannot, for this version of the crate. Each module is one
//! page of `docs/guide/` in the repository, and every code block of it is
//! compiled as a doctest (in the `snippet_*` function of `docs/snippets/`
//! that holds it: see `build.rs`).
#![doc = include_str!(concat!(env!("OUT_DIR"), "/guide/README.md"))]

/// Jobs: `try_with_lock`, `min_hold`, schedulers and cron, `with_lock`,
/// `hold`, `at_risk`, `max_hold`, several keys.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/jobs.md"))]
pub mod jobs {}

/// Leader election.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/leader.md"))]
pub mod leader {}

/// Semaphores.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/semaphore.md"))]
pub mod semaphore {}

/// Observing a key.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/observe.md"))]
pub mod observe {}

/// TTLs and clocks, and the renewal rule.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/ttl-and-clocks.md"))]
pub mod ttl_and_clocks {}

/// Fencing.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/fencing.md"))]
pub mod fencing {}

/// Outcomes: uncertain outcomes, `shutdown`, retries, errors.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/outcomes.md"))]
pub mod outcomes {}

/// Waiting, and a fleet's arithmetic.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/waiting.md"))]
pub mod waiting {}

/// The CLI.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/cli.md"))]
pub mod cli {}

/// Tower layers.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/tower.md"))]
pub mod tower {}

/// Logs and metrics.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/observability.md"))]
pub mod observability {}

/// TLS and HTTP.
#[doc = include_str!(concat!(env!("OUT_DIR"), "/guide/tls-http.md"))]
pub mod tls_http {}

/// The README's code blocks, as doctests.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("OUT_DIR"), "/README.md"))]
pub struct ReadmeDoctests;
