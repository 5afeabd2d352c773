//! One error type for the in-memory gate and both PostgreSQL helpers.

use std::fmt;

/// What a driver reports, kept as the error's source.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the database (or the driver, when the database was not reached)
/// said, as shown in the error's text: drivers keep the server's message
/// one `source()` down, where a plain `{err}` never shows it.
#[derive(Debug, Clone)]
pub(crate) struct Said {
    /// The SQLSTATE, when the server answered.
    pub code: Option<String>,
    pub message: String,
    #[cfg_attr(
        not(any(feature = "sqlx", feature = "tokio-postgres")),
        allow(dead_code)
    )]
    pub detail: Option<String>,
}

impl fmt::Display for Said {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(code) = &self.code {
            write!(f, " (SQLSTATE {code})")?;
        }
        Ok(())
    }
}

impl Said {
    /// An error that did not come from the server: its text and its
    /// sources', each once.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> Said {
        let mut message = err.to_string();
        let mut next = err.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            next = cause.source();
        }
        Said {
            code: None,
            message,
            detail: None,
        }
    }
}

/// Why a fenced write was refused or could not be checked.
///
/// [`Error::is_stale`] is the answer the fence exists for: a higher fence
/// was already seen, so the caller's lease has changed hands and its write
/// must not happen. In PostgreSQL a refused check also aborts the caller's
/// transaction on the server, so even a caller that ignores the error
/// cannot commit the write: `COMMIT` rolls back. [`Error::is_retryable`]
/// is a serialization failure, a deadlock, a lock timeout or a statement
/// timeout: roll back and run the whole transaction again (under
/// REPEATABLE READ a fence that a concurrent writer has just overtaken
/// shows up this way first, and as stale on the retry). Every PostgreSQL
/// error leaves the transaction aborted: roll it back. The text of an
/// error from the database includes the server's message and SQLSTATE.
pub struct Error {
    /// Boxed: `Result<(), Error>` stays one pointer wide.
    kind: Box<Kind>,
}

#[cfg_attr(
    not(any(feature = "sqlx", feature = "tokio-postgres")),
    allow(dead_code)
)]
enum Kind {
    Stale {
        resource: String,
        fence: i64,
        /// From the server's detail; `None` only if it could not be read.
        highest: Option<i64>,
    },
    InvalidResource(&'static str),
    InvalidSchema(&'static str),
    /// `check` on a connection outside a transaction: nothing would hold
    /// the row lock until the write. (tokio-postgres's `&Transaction`
    /// rules it out by type.)
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    NotInTransaction,
    /// `check` inside a sqlx savepoint, whose rollback would undo the
    /// fence and free the row lock while the transaction goes on.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    InSavepoint,
    /// `sqlx::begin` on a connection already in a transaction.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    AlreadyInTransaction,
    /// `migrate` found the stale function owned by a role other than the
    /// table's owner.
    ForeignFunction(String),
    NotMigrated {
        table: String,
        backend: &'static str,
        said: Said,
        source: Source,
    },
    /// `migrate` of the default table found an earlier version's default
    /// (through the `search_path`) and would have started afresh beside it.
    EarlierTable {
        schema: String,
        backend: &'static str,
    },
    Retryable(Said, Source),
    Database {
        said: Said,
        table: String,
        source: Source,
    },
    /// A driver's error during `migrate`.
    Migrating(Said, Source),
}

impl Error {
    fn new(kind: Kind) -> Self {
        Error {
            kind: Box::new(kind),
        }
    }

    pub(crate) fn stale(resource: &str, fence: i64, highest: Option<i64>) -> Self {
        Error::new(Kind::Stale {
            resource: resource.to_owned(),
            fence,
            highest,
        })
    }

    pub(crate) fn invalid_resource(why: &'static str) -> Self {
        Error::new(Kind::InvalidResource(why))
    }

    pub(crate) fn invalid_schema(why: &'static str) -> Self {
        Error::new(Kind::InvalidSchema(why))
    }

    #[cfg(feature = "sqlx")]
    pub(crate) fn not_in_transaction() -> Self {
        Error::new(Kind::NotInTransaction)
    }

    #[cfg(feature = "sqlx")]
    pub(crate) fn in_savepoint() -> Self {
        Error::new(Kind::InSavepoint)
    }

    #[cfg(feature = "sqlx")]
    pub(crate) fn already_in_transaction() -> Self {
        Error::new(Kind::AlreadyInTransaction)
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn foreign_function(function: String) -> Self {
        Error::new(Kind::ForeignFunction(function))
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn earlier_table(schema: String, backend: &'static str) -> Self {
        Error::new(Kind::EarlierTable { schema, backend })
    }

    /// A driver's error during a check of `fence` on `resource`, sorted by
    /// its SQLSTATE.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn from_check(
        said: Said,
        (resource, fence): (&str, i64),
        table: &str,
        backend: &'static str,
        source: Source,
    ) -> Self {
        let kind = match said.code.as_deref() {
            Some(crate::STALE_SQLSTATE) => Kind::Stale {
                resource: resource.to_owned(),
                fence,
                highest: said
                    .detail
                    .as_deref()
                    .and_then(|d| d.rsplit(' ').next())
                    .and_then(|n| n.parse().ok()),
            },
            // undefined_table, invalid_schema_name, undefined_function
            Some("42P01" | "3F000" | "42883") => Kind::NotMigrated {
                table: table.to_owned(),
                backend,
                said,
                source,
            },
            Some(code) if is_retryable(code) => Kind::Retryable(said, source),
            _ => Kind::Database {
                said,
                table: table.to_owned(),
                source,
            },
        };
        Error::new(kind)
    }

    /// A driver's error during `migrate`: never "run migrate first".
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn migrating(said: Said, source: Source) -> Self {
        Error::new(Kind::Migrating(said, source))
    }

    /// True exactly when a higher fence was already seen for the resource:
    /// the write must not happen (another holder has the lock now).
    pub fn is_stale(&self) -> bool {
        matches!(*self.kind, Kind::Stale { .. })
    }

    /// The highest fence seen for the resource, when the check was stale.
    pub fn highest_seen(&self) -> Option<i64> {
        match *self.kind {
            Kind::Stale { highest, .. } => highest,
            _ => None,
        }
    }

    /// True for a serialization failure, a deadlock, a lock timeout or a
    /// statement timeout during the check (under REPEATABLE READ or
    /// SERIALIZABLE, between writers of several resources, or with
    /// `lock_timeout` / `statement_timeout` set): roll back and run the
    /// whole transaction again. A serialization failure at `COMMIT` comes
    /// from your driver, not from here: treat it the same way.
    pub fn is_retryable(&self) -> bool {
        matches!(*self.kind, Kind::Retryable(..))
    }

    /// True when the fence table, its schema or its function does not
    /// exist: run `migrate` first.
    pub fn is_not_migrated(&self) -> bool {
        matches!(*self.kind, Kind::NotMigrated { .. })
    }

    /// The SQLSTATE the server answered with, when it did
    /// ([`crate::STALE_SQLSTATE`] for a stale check).
    pub fn sqlstate(&self) -> Option<&str> {
        match &*self.kind {
            Kind::Stale { .. } => Some(crate::STALE_SQLSTATE),
            Kind::NotMigrated { said, .. }
            | Kind::Retryable(said, _)
            | Kind::Database { said, .. }
            | Kind::Migrating(said, _) => said.code.as_deref(),
            _ => None,
        }
    }
}

/// serialization_failure, deadlock_detected, lock_not_available
/// (`lock_timeout`), query_canceled (`statement_timeout`).
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
fn is_retryable(code: &str) -> bool {
    matches!(code, "40001" | "40P01" | "55P03" | "57014")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.kind {
            Kind::Stale {
                resource,
                fence,
                highest,
            } => {
                write!(f, "stale fence for {resource:?}: {fence} is lower than ")?;
                match highest {
                    Some(highest) => write!(f, "{highest}, already seen")?,
                    None => f.write_str("the highest already seen")?,
                }
                f.write_str(" (the lock has changed hands since this lease was granted)")
            }
            Kind::InvalidResource(why) => write!(f, "invalid fence resource name: {why}"),
            Kind::InvalidSchema(why) => write!(f, "invalid fence schema name: {why}"),
            Kind::NotInTransaction => f.write_str(
                "the fence check needs a transaction (pool.begin()): outside one, nothing holds \
                 the resource's row lock until the write",
            ),
            Kind::InSavepoint => f.write_str(
                "the fence check cannot run inside a savepoint (a nested transaction): rolling \
                 it back would undo the check and free the resource's row lock while the \
                 transaction goes on; check in the outermost transaction",
            ),
            Kind::AlreadyInTransaction => f.write_str(
                "volcano_fence's begin starts the transaction: call it on a connection outside \
                 one, or call check inside yours",
            ),
            Kind::ForeignFunction(function) => write!(
                f,
                "migrate refused: the function {function} exists but its owner is not the fence \
                 table's; a role that could create it could make stale checks pass. Drop it \
                 (DROP FUNCTION {function}) and run migrate again as the table's owner"
            ),
            Kind::NotMigrated {
                table,
                backend,
                said,
                ..
            } => write!(
                f,
                "the fence table {table} (or its function volcano_fence_refuse) does not \
                 exist: run volcano_fence::{backend}::migrate (migrate_in for a chosen schema) \
                 first; it is idempotent ({said})"
            ),
            Kind::EarlierTable { schema, backend } => write!(
                f,
                "volcano_fence::{backend}::migrate refused: this role's search_path finds a \
                 volcano_fences table in schema {schema:?}, where earlier versions put the \
                 default table; the default is now public.volcano_fences, and writers checking \
                 it would not see that table's fences. Keep it with \
                 Table::in_schema({schema:?}) and migrate_in, or move its rows into \
                 public.volcano_fences and drop it, then migrate again"
            ),
            Kind::Retryable(said, _) => write!(
                f,
                "the fence check hit a serialization failure, deadlock, lock timeout or \
                 statement timeout; roll back and retry the transaction: {said}"
            ),
            Kind::Database { said, table, .. } => {
                write!(f, "the fence check failed in the database: {said}")?;
                if said.code.as_deref() == Some("42501") {
                    write!(
                        f,
                        "; writers need USAGE on the table's schema, SELECT, INSERT and UPDATE \
                         on {table}, and EXECUTE on its function volcano_fence_refuse"
                    )?;
                }
                Ok(())
            }
            Kind::Migrating(said, _) => {
                write!(
                    f,
                    "migrating the fence table failed in the database: {said}"
                )
            }
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &*self.kind {
            Kind::Stale { .. } => "Stale",
            Kind::InvalidResource(_) => "InvalidResource",
            Kind::InvalidSchema(_) => "InvalidSchema",
            Kind::NotInTransaction => "NotInTransaction",
            Kind::InSavepoint => "InSavepoint",
            Kind::AlreadyInTransaction => "AlreadyInTransaction",
            Kind::ForeignFunction(_) => "ForeignFunction",
            Kind::NotMigrated { .. } => "NotMigrated",
            Kind::EarlierTable { .. } => "EarlierTable",
            Kind::Retryable(..) => "Retryable",
            Kind::Database { .. } => "Database",
            Kind::Migrating(..) => "Migrating",
        };
        // The Display text says what happened and what to do; the
        // server's message is in it where there is one.
        write!(f, "volcano_fence::Error::{kind}({self})")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &*self.kind {
            Kind::NotMigrated { source, .. }
            | Kind::Retryable(_, source)
            | Kind::Database { source, .. }
            | Kind::Migrating(_, source) => Some(source.as_ref()),
            _ => None,
        }
    }
}
