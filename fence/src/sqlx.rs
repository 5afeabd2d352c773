//! The fence in PostgreSQL through sqlx (feature `sqlx`).
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, fence: i64) -> Result<(), volcano_fence::Error> {
//! volcano_fence::sqlx::migrate(&pool).await?;
//! let mut tx = pool.begin().await.expect("begin");
//! volcano_fence::sqlx::check(&mut *tx, "nightly-report", fence).await?;
//! // ... the transaction's writes ...
//! tx.commit().await.expect("commit");
//! # Ok(()) }
//! ```

use std::sync::LazyLock;

use ::sqlx::{PgConnection, PgPool};

use crate::error::check_resource;
use crate::table::{raced, MIGRATE_TRIES};
use crate::{Error, Table};

static DEFAULT: LazyLock<Table> = LazyLock::new(Table::new);

/// Creates table `volcano_fences` if it is missing (idempotent, and safe
/// to run from several processes at once).
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    migrate_in(pool, &DEFAULT).await
}

/// [`migrate`] for a chosen [`Table`] (a schema of your choice).
pub async fn migrate_in(pool: &PgPool, table: &Table) -> Result<(), Error> {
    let mut conn = pool.acquire().await.map_err(migrating)?;
    migrate_on(&mut conn, table).await
}

/// [`migrate_in`] on one connection, which must not be inside a
/// transaction (the migration is its own). When the table exists it runs
/// no DDL (a role without CREATE privileges can run it at every start).
pub async fn migrate_on(conn: &mut PgConnection, table: &Table) -> Result<(), Error> {
    let exists: Option<bool> = ::sqlx::query_scalar(Table::EXISTS_SQL)
        .bind(table.name())
        .fetch_one(&mut *conn)
        .await
        .map_err(migrating)?;
    if exists == Some(true) {
        return Ok(());
    }
    let mut tries = 0;
    loop {
        match migrate_once(conn, table).await {
            Err(err) if tries < MIGRATE_TRIES && raced(sqlstate(&err).as_deref()) => tries += 1,
            done => return done.map_err(migrating),
        }
    }
}

async fn migrate_once(conn: &mut PgConnection, table: &Table) -> Result<(), ::sqlx::Error> {
    let mut tx = ::sqlx::Connection::begin(conn).await?;
    for statement in table.migrate_statements() {
        ::sqlx::query(&statement).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Inside the caller's transaction (`&mut *tx`): records `fence` for
/// `resource` unless a higher fence was seen, and holds the resource's row
/// lock until the transaction ends. A lower fence is [`Error::is_stale`]:
/// nothing is recorded, and the transaction is aborted on the server (its
/// `COMMIT` rolls back); roll it back. One round trip when the fence passes
/// (the statement is prepared once per connection). Not inside a savepoint
/// that may be rolled back: that would undo the check and free the lock.
pub async fn check(conn: &mut PgConnection, resource: &str, fence: i64) -> Result<(), Error> {
    check_in(conn, &DEFAULT, resource, fence).await
}

/// [`check`] against a chosen [`Table`].
pub async fn check_in(
    conn: &mut PgConnection,
    table: &Table,
    resource: &str,
    fence: i64,
) -> Result<(), Error> {
    check_resource(resource)?;
    if !::sqlx::Connection::is_in_transaction(&*conn) {
        return Err(Error::not_in_transaction());
    }
    let failed = |e| database(e, table);
    for statement in [table.update_statement(), table.check_statement()] {
        let recorded: Option<i64> = ::sqlx::query_scalar(statement)
            .bind(resource)
            .bind(fence)
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed)?;
        if recorded.is_some() {
            return Ok(());
        }
    }
    let highest: Option<i64> = ::sqlx::query_scalar(table.highest_sql())
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await
        .map_err(failed)?;
    // Expected to fail: it aborts the transaction.
    let _ = ::sqlx::query(Table::POISON_SQL)
        .persistent(false)
        .execute(&mut *conn)
        .await;
    match highest {
        Some(highest) => Err(Error::stale(resource, fence, highest)),
        None => Err(Error::vanished(resource)),
    }
}

fn migrating(err: ::sqlx::Error) -> Error {
    Error::migrating(Box::new(err))
}

fn sqlstate(err: &::sqlx::Error) -> Option<String> {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

fn database(err: ::sqlx::Error, table: &Table) -> Error {
    let code = sqlstate(&err);
    Error::from_database(code.as_deref(), table.name(), "sqlx", Box::new(err))
}
