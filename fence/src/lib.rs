//! The store side of fencing for [Volcano](https://volcano.dev) project
//! locks (or any lease that hands out a rising fencing token).
//!
//! A lease cannot stop a process that paused past its expiry: it wakes up
//! believing it still holds the lock and writes. Only the store it writes
//! to can refuse that write, by remembering the highest fencing token seen
//! for the resource and refusing any lower one, atomically with the write.
//! This crate is that check, in three places:
//!
//! - [`sqlx`] (feature `sqlx`, for sqlx 0.8.4 or later) and
//!   [`tokio_postgres`] (feature `tokio-postgres`, for tokio-postgres
//!   0.7.12 or later): inside the caller's PostgreSQL transaction.
//! - [`Gate`]: the same rule in memory, for resources inside one process.
//! - [`Table::check_statement`]: the SQL, for any other driver or `psql`.
//!
//! ```toml
//! [dependencies]
//! volcano-fence = { version = "0.1", features = ["sqlx"] }            # or "tokio-postgres"
//! [dev-dependencies]
//! volcano-fence = { version = "0.1", features = ["sqlx", "testing"] } # a throwaway PostgreSQL
//! ```
//!
//! It does not depend on the lock SDK: the store side is often another
//! service. Pass it the fencing token the lease carries, and use the lock's
//! key as the resource.
//!
//! ```no_run
//! # #[cfg(feature = "sqlx")]
//! # async fn demo(pool: sqlx::PgPool, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
//! volcano_fence::sqlx::migrate(&pool).await?; // idempotent; no DDL once done
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
//! # What the check does
//!
//! One statement, one round trip: it records the fence for the resource
//! in `public.volcano_fences` and locks the resource's row until the
//! transaction ends (inserting the row on a resource's first write), so
//! writers of one resource are serialized and committed writes appear in
//! non-decreasing fence order. Equal fences pass (one holder writes many
//! times). A lower fence fails that statement with SQLSTATE `VF001`
//! ([`STALE_SQLSTATE`]): [`Error::is_stale`], with
//! [`Error::highest_seen`]. The failure aborts the transaction on the
//! server, so nothing sent after the check, a write or a `COMMIT`, even
//! pipelined, can commit. An invalid resource name is refused before
//! anything is sent and aborts the transaction too. Roll back on any
//! error; [`Error::is_retryable`] (a serialization failure, deadlock, lock
//! or statement timeout) means run the whole transaction again.
//!
//! The table is qualified by its schema: every writer of the database
//! checks the same row, whatever its role's `search_path`, and a temporary
//! table of the same name cannot stand in for it. Every writer of a
//! resource must use the same [`Table`] (the default, or the same
//! [`Table::in_schema`]).
//!
//! # Privileges
//!
//! - `migrate`, the first time: CREATE on the table's schema (for
//!   `public` on PostgreSQL 15 and later: the database owner, or a role
//!   granted `CREATE ON SCHEMA public`), and CREATE on the database only
//!   if the schema is missing (it is created only then). It creates the
//!   table and a plpgsql function, `volcano_fence_refuse`.
//! - `migrate` once everything exists: USAGE on the schema. It only
//!   looks, so every writer can run it at every start (and should: it is
//!   where an earlier version's table, or a function another role made,
//!   is refused).
//! - `check`: USAGE on the schema (every role has it on `public`),
//!   `SELECT, INSERT, UPDATE` on the table and EXECUTE on the function
//!   (granted to every role unless you revoked it).
//!
//! A least-privilege set-up, run once by the database owner:
//!
//! ```sql
//! -- volcano_fence::sqlx::migrate (or tokio_postgres::migrate) as the owner, then:
//! GRANT SELECT, INSERT, UPDATE ON public.volcano_fences TO app_writer;
//! -- only if EXECUTE was revoked from PUBLIC:
//! GRANT EXECUTE ON FUNCTION public.volcano_fence_refuse(text, bigint, bigint) TO app_writer;
//! ```
//!
//! # Operating it
//!
//! - **Never delete, truncate or re-create fence rows.** A missing row
//!   lets any fence pass, the oldest holder's included. Rows are small
//!   (one per resource); keep them.
//! - **Set `lock_timeout` and `idle_in_transaction_session_timeout`** for
//!   writers. A holder frozen inside its transaction keeps the resource's
//!   row locked, and the next holder's check waits for it: the first
//!   bounds that wait (the check then fails [`Error::is_retryable`]), the
//!   second makes the server end a transaction left idle (a frozen or
//!   killed process), which frees the row. A lease's ttl is a good bound
//!   for both.
//! - **Repairing a mistaken huge fence** (a bug wrote `i64::MAX`, and now
//!   every real holder is stale): stop the resource's writers, read the
//!   lock's current fencing token (`volcano locks get KEY`), and as a role
//!   with UPDATE run `UPDATE public.volcano_fences SET fence = TOKEN WHERE
//!   resource = 'KEY'`. Never set it below a token a live holder may
//!   still write with.
//! - **Savepoints**: a check inside a savepoint would be undone by rolling
//!   the savepoint back, freeing the lock while the transaction goes on.
//!   [`sqlx::check`] refuses a nested `begin()`; with tokio-postgres, call
//!   the check on the outermost transaction.
//! - **Upgrading from a pre-release build** (a git dependency from before
//!   0.1.0, the first release): the default table was
//!   `volcano_fences` in the `search_path`'s first schema and is now
//!   `public.volcano_fences`. `migrate` adds the function to a table that
//!   lacks it, and refuses to start a new default table when the role's
//!   `search_path` finds an earlier one elsewhere (use
//!   [`Table::in_schema`] to keep it).
//! - **The function is trusted only from the table's owner.** A
//!   `volcano_fence_refuse` owned by another role (on PostgreSQL 14 and
//!   earlier every role may create in `public`) could let stale checks
//!   pass; `migrate` refuses it. There, also revoke CREATE on `public`
//!   from PUBLIC, as PostgreSQL 15 does.
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

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod gate;
mod resource;
mod table;

#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
#[cfg(feature = "tokio-postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio-postgres")))]
pub mod tokio_postgres;

pub use error::Error;
pub use gate::{Entered, Gate};
pub use resource::MAX_RESOURCE_BYTES;
pub use table::{Table, STALE_SQLSTATE};
