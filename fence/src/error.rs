//! One error type for the in-memory gate and both PostgreSQL helpers.

use std::fmt;

/// What a driver reports, kept as the error's source.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a fenced write was refused or could not be checked.
///
/// [`Error::is_stale`] is the answer the fence exists for: a higher fence
/// was already seen, so the caller's lease has changed hands and its write
/// must not happen. In PostgreSQL a stale check also aborts the caller's
/// transaction on the server, so even a caller that ignores the error
/// cannot commit the write: `COMMIT` rolls back. [`Error::is_retryable`]
/// is a serialization failure, a deadlock or a lock timeout: roll back and
/// run the whole transaction again (under REPEATABLE READ a fence that a
/// concurrent writer has just overtaken shows up this way first, and as
/// stale on the retry). Every PostgreSQL error leaves the transaction
/// aborted: roll it back.
pub struct Error {
    kind: Kind,
}

#[cfg_attr(
    not(any(feature = "sqlx", feature = "tokio-postgres")),
    allow(dead_code)
)]
enum Kind {
    Stale {
        resource: String,
        fence: i64,
        highest: i64,
    },
    InvalidResource(&'static str),
    InvalidSchema(&'static str),
    /// `check` on a connection outside a transaction: nothing would hold
    /// the row lock until the write. (tokio-postgres's `&Transaction`
    /// rules it out by type.)
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    NotInTransaction,
    NotMigrated {
        table: String,
        backend: &'static str,
        source: Source,
    },
    Retryable(Source),
    Database(Source),
    /// A driver's error during `migrate`.
    Migrating(Source),
}

impl Error {
    pub(crate) fn stale(resource: &str, fence: i64, highest: i64) -> Self {
        Error {
            kind: Kind::Stale {
                resource: resource.to_owned(),
                fence,
                highest,
            },
        }
    }

    pub(crate) fn invalid_resource(why: &'static str) -> Self {
        Error {
            kind: Kind::InvalidResource(why),
        }
    }

    pub(crate) fn invalid_schema(why: &'static str) -> Self {
        Error {
            kind: Kind::InvalidSchema(why),
        }
    }

    #[cfg(feature = "sqlx")]
    pub(crate) fn not_in_transaction() -> Self {
        Error {
            kind: Kind::NotInTransaction,
        }
    }

    /// A driver's error during a check, sorted by its SQLSTATE.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn from_database(
        code: Option<&str>,
        table: &str,
        backend: &'static str,
        source: Source,
    ) -> Self {
        let kind = match code {
            // undefined_table, invalid_schema_name
            Some("42P01" | "3F000") => Kind::NotMigrated {
                table: table.to_owned(),
                backend,
                source,
            },
            // serialization_failure, deadlock_detected, lock_not_available
            Some("40001" | "40P01" | "55P03") => Kind::Retryable(source),
            _ => Kind::Database(source),
        };
        Error { kind }
    }

    /// A driver's error during `migrate`: never "run migrate first".
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn migrating(source: Source) -> Self {
        Error {
            kind: Kind::Migrating(source),
        }
    }

    /// A refused check whose row was gone when read back (it cannot be,
    /// with the row lock held, unless a savepoint was rolled back).
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn vanished(resource: &str) -> Self {
        let what = format!(
            "the fence row of {resource:?} was refused and then not found: was the check \
             inside a savepoint that was rolled back?"
        );
        Error {
            kind: Kind::Database(what.into()),
        }
    }

    /// True exactly when a higher fence was already seen for the resource:
    /// the write must not happen (another holder has the lock now).
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, Kind::Stale { .. })
    }

    /// The highest fence seen for the resource, when the check was stale.
    pub fn highest_seen(&self) -> Option<i64> {
        match self.kind {
            Kind::Stale { highest, .. } => Some(highest),
            _ => None,
        }
    }

    /// True for a serialization failure, a deadlock or a lock timeout
    /// during the check (under REPEATABLE READ or SERIALIZABLE, or between
    /// writers of several resources): roll back and run the whole
    /// transaction again. A serialization failure at `COMMIT` comes from
    /// your driver, not from here: treat it the same way.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, Kind::Retryable(_))
    }

    /// True when the fence table (or its schema) does not exist: run
    /// `migrate` first.
    pub fn is_not_migrated(&self) -> bool {
        matches!(self.kind, Kind::NotMigrated { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Stale {
                resource,
                fence,
                highest,
            } => write!(
                f,
                "stale fence for {resource:?}: {fence} is lower than {highest}, already seen \
                 (the lock has changed hands since this lease was granted)"
            ),
            Kind::InvalidResource(why) => write!(f, "invalid fence resource name: {why}"),
            Kind::InvalidSchema(why) => write!(f, "invalid fence schema name: {why}"),
            Kind::NotInTransaction => f.write_str(
                "the fence check needs a transaction (pool.begin()): outside one, nothing holds \
                 the resource's row lock until the write",
            ),
            Kind::NotMigrated { table, backend, .. } => write!(
                f,
                "the fence table {table} does not exist: run \
                 volcano_fence::{backend}::migrate (migrate_in for a chosen schema) first; it is \
                 idempotent"
            ),
            Kind::Retryable(source) => write!(
                f,
                "the fence check hit a serialization failure, deadlock or lock timeout; roll \
                 back and retry the transaction: {source}"
            ),
            Kind::Database(source) => write!(f, "the fence check failed in the database: {source}"),
            Kind::Migrating(source) => {
                write!(
                    f,
                    "migrating the fence table failed in the database: {source}"
                )
            }
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Stale { .. } => "Stale",
            Kind::InvalidResource(_) => "InvalidResource",
            Kind::InvalidSchema(_) => "InvalidSchema",
            Kind::NotInTransaction => "NotInTransaction",
            Kind::NotMigrated { .. } => "NotMigrated",
            Kind::Retryable(_) => "Retryable",
            Kind::Database(_) => "Database",
            Kind::Migrating(_) => "Migrating",
        };
        // The Display text says what happened and what to do; the source
        // (a driver's error) is in it where there is one.
        write!(f, "volcano_fence::Error::{kind}({self})")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::NotMigrated { source, .. }
            | Kind::Retryable(source)
            | Kind::Database(source)
            | Kind::Migrating(source) => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// The longest resource name, in bytes: well inside a PostgreSQL btree
/// entry, and far above any lock key (128 characters).
pub const MAX_RESOURCE_BYTES: usize = 2048;

/// The one rule for resource names, in memory and in PostgreSQL: any
/// UTF-8 that is not empty, has no NUL (PostgreSQL text cannot hold one)
/// and fits [`MAX_RESOURCE_BYTES`].
pub(crate) fn check_resource(resource: &str) -> Result<(), Error> {
    if resource.is_empty() {
        return Err(Error::invalid_resource("it is empty"));
    }
    if resource.len() > MAX_RESOURCE_BYTES {
        return Err(Error::invalid_resource("it is longer than 2048 bytes"));
    }
    if resource.contains('\0') {
        return Err(Error::invalid_resource(
            "it contains a NUL character, which PostgreSQL text cannot hold",
        ));
    }
    Ok(())
}
