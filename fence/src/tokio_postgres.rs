//! The fence in PostgreSQL through tokio-postgres (feature
//! `tokio-postgres`).
//!
//! ```no_run
//! # async fn demo(mut client: tokio_postgres::Client, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
//! volcano_fence::tokio_postgres::migrate(&client).await?;
//! let tx = client.transaction().await?;
//! volcano_fence::tokio_postgres::check(&tx, "nightly-report", fence).await?;
//! tx.execute("UPDATE reports SET body = 'done' WHERE name = 'nightly'", &[]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use std::sync::LazyLock;

use ::tokio_postgres::types::{ToSql, Type};
use ::tokio_postgres::{Client, Statement, Transaction};

use crate::error::Said;
use crate::resource::check_resource;
use crate::table::{raced, Missing, State, MIGRATE_TRIES};
use crate::{Error, Table};

static DEFAULT: LazyLock<Table> = LazyLock::new(Table::new);

/// Creates what the default [`Table`] needs (`public.volcano_fences` and
/// its function) if it is missing: idempotent, safe to run from several
/// processes at once, and no DDL at all once everything exists.
pub async fn migrate(client: &Client) -> Result<(), Error> {
    migrate_in(client, &DEFAULT).await
}

/// [`migrate`] for a chosen [`Table`] (a schema of your choice). The
/// schema is created only when it is missing.
pub async fn migrate_in(client: &Client, table: &Table) -> Result<(), Error> {
    let mut state = state_of(client, table).await.map_err(migrating)?;
    let mut tries = 0;
    loop {
        table.refuse(&state, "tokio_postgres")?;
        if state.missing.nothing() {
            // No DDL: a role without CREATE privileges can run it at every start.
            return Ok(());
        }
        let statements = table.migrate_statements(state.missing).join(";\n");
        let Err(err) = client
            .batch_execute(&format!("BEGIN;\n{statements};\nCOMMIT"))
            .await
        else {
            // What is there now (a function another role made while this
            // made the table, say) must pass `refuse` too.
            let made = state_of(client, table).await.map_err(migrating)?;
            return table.refuse(&made, "tokio_postgres");
        };
        // A failed batch leaves its transaction open and aborted.
        let _ = client.batch_execute("ROLLBACK").await;
        if tries == MIGRATE_TRIES || !raced(err.code().map(|c| c.code())) {
            return Err(migrating(err));
        }
        // Another migration may have made what this one could not: look
        // again, and go on only if less is missing now.
        tries += 1;
        let fresh = state_of(client, table).await.map_err(migrating)?;
        if fresh.missing == state.missing {
            return Err(migrating(err));
        }
        state = fresh;
    }
}

async fn state_of(client: &Client, table: &Table) -> Result<State, ::tokio_postgres::Error> {
    let [schema, name, function] = table.state_params();
    let row = client
        .query_one(Table::STATE_SQL, &[&schema, &name, &function])
        .await?;
    Ok(State {
        missing: Missing {
            schema: row.get(0),
            table: row.get(1),
            function: row.get(2),
        },
        earlier: row.get(3),
        foreign_function: row.get(4),
    })
}

/// Inside the caller's transaction: records `fence` for `resource` unless
/// a higher fence was seen, and holds the resource's row lock until the
/// transaction ends. One statement, one round trip, on every path
/// (parameters typed up front: no separate prepare). A lower fence is
/// [`Error::is_stale`]: nothing is recorded, and the statement itself
/// aborts the transaction on the server (its `COMMIT` rolls back); roll it
/// back. An invalid resource name is refused before anything is sent, and
/// aborts the transaction too. Not inside a savepoint
/// (`Transaction::savepoint`) that may be rolled back: that would undo the
/// check and free the lock.
pub async fn check(tx: &Transaction<'_>, resource: &str, fence: i64) -> Result<(), Error> {
    check_in(tx, &DEFAULT, resource, fence).await
}

/// [`check`] against a chosen [`Table`].
pub async fn check_in(
    tx: &Transaction<'_>,
    table: &Table,
    resource: &str,
    fence: i64,
) -> Result<(), Error> {
    valid(tx, resource).await?;
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&resource, Type::TEXT), (&fence, Type::INT8)];
    tx.query_typed(table.check_statement(), &params)
        .await
        .map(drop)
        .map_err(|err| checking(err, table, resource, fence))
}

/// Refuses an invalid resource name before anything is sent, and aborts
/// the transaction on the server, so that a caller who ignores the error
/// cannot commit.
async fn valid(tx: &Transaction<'_>, resource: &str) -> Result<(), Error> {
    if let Err(invalid) = check_resource(resource) {
        // Expected to fail: that failure is what aborts the transaction.
        let _ = tx.batch_execute(Table::POISON_SQL).await;
        return Err(invalid);
    }
    Ok(())
}

/// The check with its statement prepared once on a connection: the same
/// rule as [`check_in`], without the server parsing and planning the
/// statement on every call (about half the check's cost). Use it with
/// transactions of the client it was prepared on.
///
/// It can also be pipelined with the write, which then costs little more
/// than the write alone ([benchmarks, section 8](https://github.com/volcano-locks/volcano/blob/main/docs/benchmarks.md#8-the-fence-check-in-postgresql)): the server runs
/// the check first, and when it is refused the transaction is aborted by
/// that statement, before the write, even when the caller ignores the
/// error and commits. A resource's first write is serialized like any
/// other (its row is inserted, and so locked, by the check).
///
/// ```no_run
/// # async fn demo(mut client: tokio_postgres::Client, fences: volcano_fence::tokio_postgres::Fences, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// let (checked, written) = tokio::join!(
///     fences.check(&tx, "nightly-report", fence),
///     tx.execute("UPDATE reports SET body = 'done' WHERE name = 'nightly'", &[]),
/// );
/// checked?; // stale: the transaction is already aborted; drop or roll back
/// written?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// ```no_run
/// # async fn demo(mut client: tokio_postgres::Client, fence: i64) -> Result<(), Box<dyn std::error::Error>> {
/// use volcano_fence::{tokio_postgres::Fences, Table};
/// let fences = Fences::prepare(&client, &Table::new()).await?;
/// let tx = client.transaction().await?;
/// fences.check(&tx, "nightly-report", fence).await?;
/// // ... the transaction's writes ...
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Fences {
    table: Table,
    check: Statement,
}

impl Fences {
    /// Prepares the check's statement on `client`; the table must have
    /// been migrated (else [`Error::is_not_migrated`]).
    pub async fn prepare(client: &Client, table: &Table) -> Result<Fences, Error> {
        let check = client
            .prepare_typed(table.check_statement(), &[Type::TEXT, Type::INT8])
            .await
            .map_err(|err| checking(err, table, "", 0))?;
        Ok(Fences {
            table: table.clone(),
            check,
        })
    }

    /// [`check_in`] with the prepared statement.
    pub async fn check(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        fence: i64,
    ) -> Result<(), Error> {
        valid(tx, resource).await?;
        tx.execute(&self.check, &[&resource, &fence])
            .await
            .map(drop)
            .map_err(|err| checking(err, &self.table, resource, fence))
    }
}

fn checking(err: ::tokio_postgres::Error, table: &Table, resource: &str, fence: i64) -> Error {
    let said = said(&err);
    Error::from_check(
        said,
        (resource, fence),
        table.name(),
        "tokio_postgres",
        Box::new(err),
    )
}

fn migrating(err: ::tokio_postgres::Error) -> Error {
    Error::migrating(said(&err), Box::new(err))
}

/// The server's message, code and detail (tokio-postgres's own text is
/// "db error"), or the driver's own text.
fn said(err: &::tokio_postgres::Error) -> Said {
    match err.as_db_error() {
        Some(db) => Said {
            code: Some(db.code().code().to_owned()),
            message: db.message().to_owned(),
            detail: db.detail().map(str::to_owned),
        },
        None => Said::chain(err),
    }
}
