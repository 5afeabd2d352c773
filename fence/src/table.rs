//! The fence table and the SQL both PostgreSQL helpers send.

use crate::error::Error;

/// Where the fences live in PostgreSQL: table `volcano_fences` (resource
/// `text` primary key, fence `bigint`, updated_at `timestamptz`), in the
/// first schema of the `search_path` (the default) or in a chosen one.
///
/// ```
/// let table = volcano_fence::Table::in_schema("billing")?;
/// assert_eq!(table.name(), "\"billing\".volcano_fences");
/// # Ok::<(), volcano_fence::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    schema: Option<String>,
    name: String,
    /// The statements a check may send, made once.
    update: String,
    check: String,
    highest: String,
}

#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
/// How many times `migrate` tries again after racing another migration.
pub(crate) const MIGRATE_TRIES: u32 = 3;

#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
/// Whether a migration failed only because another one created the same
/// object first: PostgreSQL's `IF NOT EXISTS` can miss an object another
/// transaction committed moments ago (its catalog cache is not refreshed
/// by the advisory lock), and a second try sees it.
pub(crate) fn raced(sqlstate: Option<&str>) -> bool {
    // unique_violation (on the catalog), duplicate_schema, duplicate_table
    matches!(sqlstate, Some("23505" | "42P06" | "42P07"))
}

/// The longest PostgreSQL identifier, in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// Any constant will do: `migrate` takes this advisory lock so that two
/// processes migrating at once do not race on `CREATE TABLE`.
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
const MIGRATE_LOCK: i64 = 0x766f_6c63_616e_6f66; // "volcanof"

impl Default for Table {
    fn default() -> Self {
        Table::named(None, "volcano_fences".to_owned())
    }
}

impl Table {
    /// `volcano_fences` in the `search_path`'s first schema.
    pub fn new() -> Self {
        Table::default()
    }

    /// `volcano_fences` in `schema` (created by `migrate` if missing). The
    /// name is quoted, so it is taken exactly as written, case included.
    pub fn in_schema(schema: &str) -> Result<Self, Error> {
        if schema.is_empty() {
            return Err(Error::invalid_schema("it is empty"));
        }
        if schema.len() > MAX_IDENTIFIER_BYTES {
            return Err(Error::invalid_schema(
                "it is longer than PostgreSQL's 63-byte identifiers",
            ));
        }
        if schema.contains('\0') {
            return Err(Error::invalid_schema("it contains a NUL character"));
        }
        if schema.starts_with("pg_") {
            return Err(Error::invalid_schema(
                "names starting with pg_ are reserved for PostgreSQL's own schemas",
            ));
        }
        let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
        let name = format!("{quoted}.volcano_fences");
        Ok(Table::named(Some(quoted), name))
    }

    fn named(schema: Option<String>, name: String) -> Self {
        Table {
            update: format!(
                "UPDATE {name} SET fence = $2, updated_at = now() \
                 WHERE resource = $1 AND fence <= $2 RETURNING fence"
            ),
            check: Table::check_sql(&name),
            highest: format!("SELECT fence FROM {name} WHERE resource = $1"),
            schema,
            name,
        }
    }

    /// The table's name as the SQL spells it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the table exists already (`$1` is [`Table::name`]): then
    /// `migrate` runs no DDL, so a role without CREATE privileges can run
    /// it at every start.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) const EXISTS_SQL: &'static str = "SELECT to_regclass($1) IS NOT NULL";

    /// Makes a refused check abort the caller's transaction on the server,
    /// so that a caller who ignores the error cannot commit the write.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) const POISON_SQL: &'static str = "DO $$ BEGIN RAISE EXCEPTION \
        'volcano_fence: a stale fencing token was refused; this transaction cannot commit' \
        USING ERRCODE = 'P0001'; END $$";

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    /// The migration's statements, to run in one transaction: the
    /// advisory lock first (so that two processes migrating at once do not
    /// race on `CREATE TABLE`), then the schema (if one was chosen) and the
    /// table, each only if missing.
    pub(crate) fn migrate_statements(&self) -> Vec<String> {
        let mut statements = vec![format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK})")];
        if let Some(schema) = &self.schema {
            statements.push(format!("CREATE SCHEMA IF NOT EXISTS {schema}"));
        }
        statements.push(format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
                 resource text PRIMARY KEY,\n\
                 fence bigint NOT NULL,\n\
                 updated_at timestamptz NOT NULL DEFAULT now()\n\
             )",
            self.name
        ));
        statements
    }

    /// Records `$2` for resource `$1` unless a higher fence is there, and
    /// returns it; no row when refused. Either way the resource's row is
    /// locked until the transaction ends (PostgreSQL locks the conflicting
    /// row of `ON CONFLICT DO UPDATE` whether or not its `WHERE` holds),
    /// which serializes the resource's writers.
    fn check_sql(name: &str) -> String {
        format!(
            "INSERT INTO {name} AS f (resource, fence, updated_at) VALUES ($1, $2, now()) \
             ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = now() \
             WHERE f.fence <= EXCLUDED.fence \
             RETURNING fence"
        )
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    /// The fence recorded for resource `$1` (after a refused check, which
    /// holds its row lock: the value cannot move under it).
    pub(crate) fn highest_sql(&self) -> &str {
        &self.highest
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    /// See [`Table::check_sql`].
    pub(crate) fn check_statement(&self) -> &str {
        &self.check
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    /// The common case, tried first: the resource's row exists and its
    /// fence is not higher. An `UPDATE` by primary key is the cheapest
    /// statement that records the fence and takes the row lock; it waits
    /// for a concurrent writer of the row and then looks again at the row
    /// that writer left. When it finds no row to update (a new resource,
    /// or a higher fence), [`Table::check_statement`] decides.
    pub(crate) fn update_statement(&self) -> &str {
        &self.update
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    fn the_migration_quotes_the_schema() {
        let odd = Table::in_schema("a\"b; DROP TABLE x").unwrap();
        assert!(odd
            .migrate_statements()
            .contains(&"CREATE SCHEMA IF NOT EXISTS \"a\"\"b; DROP TABLE x\"".to_owned()));
    }

    #[test]
    fn schema_names_are_quoted_and_checked() {
        assert_eq!(Table::new().name(), "volcano_fences");
        let odd = Table::in_schema("a\"b; DROP TABLE x").unwrap();
        assert_eq!(odd.name(), "\"a\"\"b; DROP TABLE x\".volcano_fences");
        assert!(Table::in_schema("").is_err());
        assert!(Table::in_schema(&"s".repeat(64)).is_err());
        assert!(Table::in_schema("a\0").is_err());
        assert!(Table::in_schema("pg_fences").is_err());
    }
}
