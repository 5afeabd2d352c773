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

use crate::error::check_resource;
use crate::table::{raced, MIGRATE_TRIES};
use crate::{Error, Table};

static DEFAULT: LazyLock<Table> = LazyLock::new(Table::new);

/// Creates table `volcano_fences` if it is missing (idempotent, and safe
/// to run from several processes at once).
pub async fn migrate(client: &Client) -> Result<(), Error> {
    migrate_in(client, &DEFAULT).await
}

/// [`migrate`] for a chosen [`Table`] (a schema of your choice).
pub async fn migrate_in(client: &Client, table: &Table) -> Result<(), Error> {
    let migrating = |e| Error::migrating(Box::new(e));
    let exists: Option<bool> = client
        .query_one(Table::EXISTS_SQL, &[&table.name()])
        .await
        .map_err(migrating)?
        .get(0);
    if exists == Some(true) {
        // No DDL: a role without CREATE privileges can run it at every start.
        return Ok(());
    }
    let statements = table.migrate_statements().join(";\n");
    let batch = format!("BEGIN;\n{statements};\nCOMMIT");
    let mut tries = 0;
    loop {
        let result = client.batch_execute(&batch).await;
        if result.is_err() {
            // A failed batch leaves its transaction open and aborted.
            let _ = client.batch_execute("ROLLBACK").await;
        }
        match result {
            Err(err) if tries < MIGRATE_TRIES && raced(err.code().map(|c| c.code())) => tries += 1,
            done => return done.map_err(migrating),
        }
    }
}

/// Inside the caller's transaction: records `fence` for `resource` unless
/// a higher fence was seen, and holds the resource's row lock until the
/// transaction ends. A lower fence is [`Error::is_stale`]: nothing is
/// recorded, and the transaction is aborted on the server (its `COMMIT`
/// rolls back); roll it back. One round trip when the fence passes
/// (parameters typed up front: no separate prepare). Not inside a
/// savepoint that may be rolled back: that would undo the check and free
/// the lock.
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
    check_resource(resource)?;
    let failed = |e| database(e, table);
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&resource, Type::TEXT), (&fence, Type::INT8)];
    for statement in [table.update_statement(), table.check_statement()] {
        if !tx
            .query_typed(statement, &params)
            .await
            .map_err(failed)?
            .is_empty()
        {
            return Ok(());
        }
    }
    let highest = tx
        .query_typed(table.highest_sql(), &[(&resource, Type::TEXT)])
        .await
        .map_err(failed)?;
    refused(tx, resource, fence, highest.first().map(|row| row.get(0))).await
}

/// After a refused check: aborts the transaction on the server (so that
/// its `COMMIT` rolls back) and says why.
async fn refused(
    tx: &Transaction<'_>,
    resource: &str,
    fence: i64,
    highest: Option<i64>,
) -> Result<(), Error> {
    // Expected to fail: it aborts the transaction.
    let _ = tx.batch_execute(Table::POISON_SQL).await;
    match highest {
        Some(highest) => Err(Error::stale(resource, fence, highest)),
        None => Err(Error::vanished(resource)),
    }
}

/// The check with its statements prepared once on a connection: the same
/// rule as [`check_in`], without the server parsing and planning the
/// statement on every call (about half the check's cost). Use it with
/// transactions of the client it was prepared on.
///
/// It can also be pipelined with the write, which then costs almost
/// nothing more than the write alone (docs/benchmarks.md section 8): a
/// stale check aborts the transaction, the write with it, even when the
/// caller ignores the error and commits.
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
    update: Statement,
    insert: Statement,
    highest: Statement,
}

impl Fences {
    /// Prepares the check's statements on `client`; the table must have
    /// been migrated (else [`Error::is_not_migrated`]).
    pub async fn prepare(client: &Client, table: &Table) -> Result<Fences, Error> {
        let failed = |e| database(e, table);
        let typed = [Type::TEXT, Type::INT8];
        Ok(Fences {
            update: client
                .prepare_typed(table.update_statement(), &typed)
                .await
                .map_err(failed)?,
            insert: client
                .prepare_typed(table.check_statement(), &typed)
                .await
                .map_err(failed)?,
            highest: client
                .prepare_typed(table.highest_sql(), &[Type::TEXT])
                .await
                .map_err(failed)?,
            table: table.clone(),
        })
    }

    /// [`check_in`] with the prepared statements.
    pub async fn check(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        fence: i64,
    ) -> Result<(), Error> {
        check_resource(resource)?;
        let failed = |e| database(e, &self.table);
        for statement in [&self.update, &self.insert] {
            if !tx
                .query(statement, &[&resource, &fence])
                .await
                .map_err(failed)?
                .is_empty()
            {
                return Ok(());
            }
        }
        let highest = tx
            .query(&self.highest, &[&resource])
            .await
            .map_err(failed)?;
        refused(tx, resource, fence, highest.first().map(|row| row.get(0))).await
    }
}

fn database(err: ::tokio_postgres::Error, table: &Table) -> Error {
    let code = err.code().map(|c| c.code().to_owned());
    Error::from_database(
        code.as_deref(),
        table.name(),
        "tokio_postgres",
        Box::new(err),
    )
}
