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

use ::sqlx::postgres::PgDatabaseError;
use ::sqlx::{PgConnection, PgPool, Postgres, Transaction, TransactionManager};

use crate::error::Said;
use crate::resource::check_resource;
use crate::table::{raced, Missing, State, MIGRATE_TRIES};
use crate::{Error, Table};

static DEFAULT: LazyLock<Table> = LazyLock::new(Table::new);

/// Creates what the default [`Table`] needs (`public.volcano_fences` and
/// its function) if it is missing: idempotent, safe to run from several
/// processes at once, and no DDL at all once everything exists.
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    migrate_in(pool, &DEFAULT).await
}

/// [`migrate`] for a chosen [`Table`] (a schema of your choice). The
/// schema is created only when it is missing.
pub async fn migrate_in(pool: &PgPool, table: &Table) -> Result<(), Error> {
    let mut conn = pool.acquire().await.map_err(migrating)?;
    migrate_on(&mut conn, table).await
}

/// [`migrate_in`] on one connection, which must not be inside a
/// transaction (the migration is its own). When everything exists it runs
/// no DDL (a role without CREATE privileges can run it at every start).
pub async fn migrate_on(conn: &mut PgConnection, table: &Table) -> Result<(), Error> {
    let mut state = state_of(conn, table).await.map_err(migrating)?;
    let mut tries = 0;
    loop {
        table.refuse(&state, "sqlx")?;
        if state.missing.nothing() {
            return Ok(());
        }
        let Err(err) = migrate_once(conn, table, state.missing).await else {
            // What is there now (a function another role made while this
            // made the table, say) must pass `refuse` too.
            let made = state_of(conn, table).await.map_err(migrating)?;
            return table.refuse(&made, "sqlx");
        };
        if tries == MIGRATE_TRIES || !raced(sqlstate(&err).as_deref()) {
            return Err(migrating(err));
        }
        // Another migration may have made what this one could not: look
        // again, and go on only if less is missing now.
        tries += 1;
        let fresh = state_of(conn, table).await.map_err(migrating)?;
        if fresh.missing == state.missing {
            return Err(migrating(err));
        }
        state = fresh;
    }
}

async fn state_of(conn: &mut PgConnection, table: &Table) -> Result<State, ::sqlx::Error> {
    let [schema, name, function] = table.state_params();
    let (schema, missing_table, function, earlier, foreign_function): (
        bool,
        bool,
        bool,
        Option<String>,
        bool,
    ) = ::sqlx::query_as(Table::STATE_SQL)
        .bind(schema)
        .bind(name)
        .bind(function)
        .fetch_one(&mut *conn)
        .await?;
    Ok(State {
        missing: Missing {
            schema,
            table: missing_table,
            function,
        },
        earlier,
        foreign_function,
    })
}

async fn migrate_once(
    conn: &mut PgConnection,
    table: &Table,
    missing: Missing,
) -> Result<(), ::sqlx::Error> {
    let mut tx = ::sqlx::Connection::begin(conn).await?;
    for statement in table.migrate_statements(missing) {
        ::sqlx::query(&statement).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Inside the caller's transaction (`&mut *tx`): records `fence` for
/// `resource` unless a higher fence was seen, and holds the resource's row
/// lock until the transaction ends. One statement, one round trip, on
/// every path. A lower fence is [`Error::is_stale`]: nothing is recorded,
/// and the statement itself aborts the transaction on the server (its
/// `COMMIT` rolls back); roll it back. An invalid resource name is refused
/// before anything is sent, and aborts the transaction too.
///
/// Not inside a savepoint (a nested `begin()`): its rollback would undo
/// the check and free the lock while the transaction goes on, so the
/// check refuses it. (A `SAVEPOINT` sent as SQL is not seen here: do not.)
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
    match <::sqlx::Postgres as ::sqlx::Database>::TransactionManager::get_transaction_depth(conn) {
        0 => return Err(Error::not_in_transaction()),
        1 => {}
        _ => return Err(poison(conn, Error::in_savepoint()).await),
    }
    if let Err(invalid) = check_resource(resource) {
        return Err(poison(conn, invalid).await);
    }
    ::sqlx::query(table.check_statement())
        .bind(resource)
        .bind(fence)
        .execute(&mut *conn)
        .await
        .map(drop)
        .map_err(|err| checking(err, table, resource, fence))
}

/// Begins a transaction on `conn` whose first statement is the check:
/// the check and the `BEGIN` go in one round trip, which saves the
/// check's own round trip over a network. (On a local socket it costs
/// about what [`check`] does: the server plans the statement on every
/// call; [benchmarks, section 8](https://github.com/volcano-locks/volcano/blob/main/docs/benchmarks.md#8-the-fence-check-in-postgresql).) The same rule as [`check`]: the
/// transaction holds the resource's row lock until it ends. When the
/// check fails (stale, or any other error) no transaction is left open on
/// `conn`.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = pool.acquire().await?;
/// let mut tx = volcano_fence::sqlx::begin(&mut conn, "nightly-report", fence).await?;
/// sqlx::query("UPDATE reports SET body = 'done' WHERE name = 'nightly'")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// The statement carries the resource and the fence as literals (an
/// escaped string and a number), as one simple query: nothing is
/// prepared.
pub async fn begin<'c>(
    conn: &'c mut PgConnection,
    resource: &str,
    fence: i64,
) -> Result<Transaction<'c, Postgres>, Error> {
    begin_in(conn, &DEFAULT, resource, fence).await
}

/// [`begin`] against a chosen [`Table`].
pub async fn begin_in<'c>(
    conn: &'c mut PgConnection,
    table: &Table,
    resource: &str,
    fence: i64,
) -> Result<Transaction<'c, Postgres>, Error> {
    check_resource(resource)?;
    if ::sqlx::Connection::is_in_transaction(&*conn) {
        return Err(Error::already_in_transaction());
    }
    // The check runs in the message's implicit transaction, and the BEGIN
    // after it makes that the caller's: on failure nothing stays open.
    ::sqlx::Connection::begin_with(conn, table.check_then_begin(resource, fence))
        .await
        .map_err(|err| checking(err, table, resource, fence))
}

/// Aborts the transaction on the server, so that a caller who ignores
/// `err` cannot commit, and returns `err`.
async fn poison(conn: &mut PgConnection, err: Error) -> Error {
    // Expected to fail: that failure is what aborts the transaction.
    let _ = ::sqlx::query(Table::POISON_SQL)
        .persistent(false)
        .execute(&mut *conn)
        .await;
    err
}

fn checking(err: ::sqlx::Error, table: &Table, resource: &str, fence: i64) -> Error {
    let said = said(&err);
    Error::from_check(said, (resource, fence), table.name(), "sqlx", Box::new(err))
}

fn migrating(err: ::sqlx::Error) -> Error {
    Error::migrating(said(&err), Box::new(err))
}

fn sqlstate(err: &::sqlx::Error) -> Option<String> {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// The server's message, code and detail, or the driver's own text.
fn said(err: &::sqlx::Error) -> Said {
    match err.as_database_error() {
        Some(db) => Said {
            code: db.code().map(|c| c.into_owned()),
            message: db.message().to_owned(),
            detail: db
                .try_downcast_ref::<PgDatabaseError>()
                .and_then(|pg| pg.detail())
                .map(str::to_owned),
        },
        None => Said::chain(err),
    }
}
