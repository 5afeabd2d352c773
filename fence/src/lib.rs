//! The store side of fencing for [Volcano](https://volcano.dev) project
//! locks (or any lease that hands out a rising fencing token).
//!
//! A lease cannot stop a process that paused past its expiry: it wakes up
//! believing it still holds the lock and writes. Only the store it writes
//! to can refuse that write, by remembering the highest fencing token seen
//! for the resource and refusing any lower one, atomically with the write.
//! This crate is that check, in three places:
//!
//! - [`sqlx`] (feature `sqlx`) and [`tokio_postgres`] (feature
//!   `tokio-postgres`): inside the caller's PostgreSQL transaction.
//!   `check` records the fence in table `volcano_fences` and holds the
//!   resource's row lock until the transaction ends, so writers of one
//!   resource are serialized and committed writes appear in non-decreasing
//!   fence order.
//! - [`Gate`]: the same rule in memory, for resources inside one process.
//!
//! It does not depend on the lock SDK: the store side is often another
//! service. Pass it the fencing token the lease carries.
//!
//! ```no_run
//! # #[cfg(feature = "sqlx")]
//! # async fn demo(pool: sqlx::PgPool, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
//! volcano_fence::sqlx::migrate(&pool).await?; // idempotent
//! let mut tx = pool.begin().await?;
//! volcano_fence::sqlx::check(&mut *tx, "nightly-report", fence).await?;
//! sqlx::query("UPDATE reports SET body = $1 WHERE name = 'nightly'")
//!     .bind("...")
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! Equal fences pass (one holder writes many times); a lower one is
//! [`Error::is_stale`], and the transaction must be rolled back.
//!
//! # The per-row alternative
//!
//! When the protected data is one row of your own table, the fence can
//! live on that row instead: add `fence bigint NOT NULL DEFAULT 0` and
//! write with
//!
//! ```sql
//! UPDATE reports SET body = $1, fence = $2 WHERE name = 'nightly' AND fence <= $2
//! ```
//!
//! One statement, no extra table, and zero rows updated means stale (or
//! no such row: tell them apart with a `SELECT fence` if you need to). The
//! trade-off: every writer of that data must use the guarded `UPDATE`
//! (one plain `UPDATE` elsewhere defeats it), it guards one row and not a
//! job that writes many rows or tables, and inserting the row the first
//! time needs its own `INSERT ... ON CONFLICT` with the same condition.
//! [`sqlx::check`] guards a whole transaction, whatever it writes.

mod error;
mod gate;
mod table;

#[cfg(feature = "sqlx")]
pub mod sqlx;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tokio-postgres")]
pub mod tokio_postgres;

pub use error::{Error, MAX_RESOURCE_BYTES};
pub use gate::Gate;
pub use table::Table;
