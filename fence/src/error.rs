//! One error type for the in-memory gate and both PostgreSQL helpers.

use std::fmt;

/// What a driver reports, kept as the error's source.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a fenced write was refused or could not be checked.
///
/// [`Error::is_stale`] is the answer the fence exists for: a higher fence
/// was already seen, so the caller's lease has changed hands and its write
/// must not happen. [`Error::is_retryable`] is a database's serialization
/// failure or deadlock: retry the whole transaction, the fence may well be
/// current. A PostgreSQL error of either kind aborts the caller's
/// transaction: roll it back.
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
    NotMigrated {
        table: String,
        backend: &'static str,
        source: Source,
    },
    Retryable(Source),
    Database(Source),
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

    /// A driver's error, sorted by its SQLSTATE.
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
            // serialization_failure, deadlock_detected
            Some("40001" | "40P01") => Kind::Retryable(source),
            _ => Kind::Database(source),
        };
        Error { kind }
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

    /// True for a serialization failure or a deadlock (under REPEATABLE
    /// READ or SERIALIZABLE, or between writers of several resources):
    /// roll back and run the whole transaction again.
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
            Kind::NotMigrated { table, backend, .. } => write!(
                f,
                "the fence table {table} does not exist: run \
                 volcano_fence::{backend}::migrate first (it is idempotent)"
            ),
            Kind::Retryable(source) => write!(
                f,
                "the fence check hit a serialization failure or deadlock; roll back and retry \
                 the transaction: {source}"
            ),
            Kind::Database(source) => write!(f, "the fence check failed in the database: {source}"),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The Display text, which says what happened and what to do.
        write!(f, "volcano_fence::Error({self})")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::NotMigrated { source, .. } | Kind::Retryable(source) | Kind::Database(source) => {
                Some(source.as_ref())
            }
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
