//! The fence table and the SQL both PostgreSQL helpers send.

use crate::error::Error;

/// Where the fences live in PostgreSQL: table `volcano_fences` (resource
/// `text` primary key, fence `bigint`, updated_at `timestamptz`) and the
/// function `volcano_fence_refuse` that a stale check raises through, in
/// schema `public` (the default) or in a chosen one.
///
/// The name is always qualified by its schema, so every writer of the
/// database checks the same rows whatever its role's `search_path`, and a
/// temporary table of the same name cannot stand in for it.
///
/// ```
/// assert_eq!(volcano_fence::Table::new().name(), "public.volcano_fences");
/// let table = volcano_fence::Table::in_schema("billing")?;
/// assert_eq!(table.name(), "\"billing\".volcano_fences");
/// # Ok::<(), volcano_fence::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The schema as SQL spells it (quoted unless it is `public`).
    schema: String,
    name: String,
    /// The check, made once.
    check: String,
}

/// The SQLSTATE of a stale check's error, raised by the function
/// `volcano_fence_refuse` that `migrate` creates; its `DETAIL` reads
/// `highest fence seen: N`. For code that runs the check's SQL through
/// another driver (or `psql`, where it is the error's code).
pub const STALE_SQLSTATE: &str = "VF001";

#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
/// How many times `migrate` tries again after racing another migration.
pub(crate) const MIGRATE_TRIES: u32 = 3;

#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
/// Whether a migration failed only because another one created the same
/// object first: PostgreSQL's `IF NOT EXISTS` can miss an object another
/// transaction committed moments ago (its catalog cache is not refreshed
/// by the advisory lock), and a second try sees it.
pub(crate) fn raced(sqlstate: Option<&str>) -> bool {
    // unique_violation (on the catalog), duplicate_schema, duplicate_table,
    // duplicate_function; and insufficient_privilege, which PostgreSQL
    // checks before `IF NOT EXISTS` looks: a role that may not create what
    // another has just created fails this way. Each is tried again only
    // when a fresh look finds less missing than before.
    matches!(
        sqlstate,
        Some("23505" | "42P06" | "42P07" | "42723" | "42501")
    )
}

/// The longest PostgreSQL identifier, in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// Any constant will do: `migrate` takes this advisory lock so that two
/// processes migrating at once do not race on `CREATE TABLE`.
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
const MIGRATE_LOCK: i64 = 0x766f_6c63_616e_6f66; // "volcanof"

impl Default for Table {
    fn default() -> Self {
        Table::named("public".to_owned())
    }
}

/// What `migrate` found missing, and so creates.
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Missing {
    pub schema: bool,
    pub table: bool,
    pub function: bool,
}

/// What `migrate` found: [`Table::STATE_SQL`]'s row.
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct State {
    pub missing: Missing,
    pub earlier: Option<String>,
    pub foreign_function: bool,
}

#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
impl Missing {
    pub(crate) fn nothing(self) -> bool {
        !(self.schema || self.table || self.function)
    }
}

impl Table {
    /// `public.volcano_fences`: the one table every writer of the database
    /// checks. Every role can use schema `public` (PostgreSQL grants its
    /// USAGE to all), so writers need only `SELECT, INSERT, UPDATE` on the
    /// table.
    pub fn new() -> Self {
        Table::default()
    }

    /// `volcano_fences` in `schema` (created by `migrate` if missing). The
    /// name is quoted, so it is taken exactly as written, case included.
    /// Every writer of a resource must use the same schema.
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
        if schema == "public" {
            return Ok(Table::default());
        }
        Ok(Table::named(format!("\"{}\"", schema.replace('"', "\"\""))))
    }

    fn named(schema: String) -> Self {
        let name = format!("{schema}.volcano_fences");
        Table {
            check: check_sql(&name, &schema, "$1", "$2"),
            schema,
            name,
        }
    }

    /// The table's name as the SQL spells it, schema included.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The one statement of a check (`$1` the resource, `$2` the fence):
    /// records the fence, locks the resource's row until the transaction
    /// ends (inserting it on a first write, so that a first write is
    /// serialized like any other), and raises [`STALE_SQLSTATE`] when a
    /// higher fence is there, which aborts the transaction: nothing sent
    /// after it, a write or a `COMMIT`, can commit. For drivers this crate
    /// does not cover.
    pub fn check_statement(&self) -> &str {
        &self.check
    }

    /// The check with its values written in (`$1`, `$2` as literals),
    /// then `BEGIN`: sent as one simple query, the check runs in the
    /// message's implicit transaction, which the `BEGIN` turns into the
    /// caller's. When the check fails, the implicit transaction is rolled
    /// back and no transaction is left open.
    #[cfg(feature = "sqlx")]
    pub(crate) fn check_then_begin(&self, resource: &str, fence: i64) -> String {
        // An escape string literal means the same whatever
        // standard_conforming_strings says; NUL was refused before.
        let literal = resource.replace('\\', "\\\\").replace('\'', "''");
        let check = check_sql(
            &self.name,
            &self.schema,
            &format!("E'{literal}'"),
            &format!("'{fence}'::bigint"),
        );
        format!("{check}; BEGIN")
    }

    /// The stale function's signature, for `to_regprocedure`.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    fn function(&self) -> String {
        format!("{}.volcano_fence_refuse(text,bigint,bigint)", self.schema)
    }

    /// What `migrate` finds (`$1`, `$2`, `$3`: [`Table::state_params`]):
    /// whether the schema, the table and the function are missing; the
    /// schema of an earlier version's default table, if the role's
    /// `search_path` finds one (the first `volcano_fences` on the path,
    /// temporary tables aside, when it is not in `public` and has no
    /// function beside it: this version always creates one); and whether
    /// the function has an owner other than the table's (then another role
    /// made it, and it could let stale checks pass). Needs USAGE on the
    /// schema, nothing more.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) const STATE_SQL: &'static str = "SELECT pg_catalog.to_regnamespace($1) IS NULL, \
        pg_catalog.to_regclass($2) IS NULL, pg_catalog.to_regprocedure($3) IS NULL, \
        (SELECT first.name FROM \
           (SELECT s.name::text AS name \
              FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) WITH ORDINALITY AS s(name, i) \
              JOIN pg_catalog.pg_namespace n ON n.nspname = s.name \
              JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid \
               AND c.relname = 'volcano_fences' AND c.relkind IN ('r', 'p') \
             ORDER BY s.i LIMIT 1) AS first \
          WHERE first.name <> 'public' AND pg_catalog.to_regprocedure(\
            pg_catalog.quote_ident(first.name) || '.volcano_fence_refuse(text,bigint,bigint)') IS NULL), \
        COALESCE((SELECT p.proowner <> c.relowner \
           FROM pg_catalog.pg_proc p, pg_catalog.pg_class c \
          WHERE p.oid = pg_catalog.to_regprocedure($3) AND c.oid = pg_catalog.to_regclass($2)), false)";

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn state_params(&self) -> [String; 3] {
        [self.schema.clone(), self.name.clone(), self.function()]
    }

    /// What `migrate` refuses to go on with: for the default table, an
    /// earlier version's default that the role's `search_path` finds
    /// elsewhere (writers would check a table beside it); for any table, a
    /// function made by a role other than the table's owner.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) fn refuse(&self, state: &State, backend: &'static str) -> Result<(), Error> {
        if let Some(schema) = state.earlier.as_ref().filter(|_| self.is_default()) {
            return Err(Error::earlier_table(schema.clone(), backend));
        }
        if state.foreign_function {
            return Err(Error::foreign_function(self.function()));
        }
        Ok(())
    }

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    fn is_default(&self) -> bool {
        self.schema == "public"
    }

    /// Aborts the caller's transaction on the server, so that a caller who
    /// ignores the error of a check refused before it was sent (an invalid
    /// resource name) cannot commit the write.
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    pub(crate) const POISON_SQL: &'static str = "DO $$ BEGIN RAISE EXCEPTION \
        'volcano_fence: the fence check was refused; this transaction cannot commit' \
        USING ERRCODE = 'VF002'; END $$";

    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    /// The migration's statements, to run in one transaction: the
    /// advisory lock first (so that two processes migrating at once do not
    /// race), then what is missing. Nothing is sent for what exists, so a
    /// role with only CREATE on an existing schema can migrate, and a role
    /// with no CREATE privilege at all once everything exists.
    pub(crate) fn migrate_statements(&self, missing: Missing) -> Vec<String> {
        let mut statements = vec![format!(
            "SELECT pg_catalog.pg_advisory_xact_lock({MIGRATE_LOCK})"
        )];
        if missing.schema {
            statements.push(format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema));
        }
        if missing.table {
            statements.push(format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                     resource text PRIMARY KEY,\n\
                     fence bigint NOT NULL,\n\
                     updated_at timestamptz NOT NULL DEFAULT now()\n\
                 )",
                self.name
            ));
        }
        if missing.function {
            statements.push(refuse_function_sql(&self.schema));
        }
        statements
    }
}

/// The check: one statement on every path. A new resource's row is
/// inserted (and so locked: a second writer's insert waits for this
/// transaction); an existing one is locked and updated, and when its fence
/// is higher the `ELSE` branch raises. `ON CONFLICT DO UPDATE` evaluates
/// the `SET` on the row as it is once locked (the latest committed
/// version, in READ COMMITTED), so the comparison cannot be overtaken.
fn check_sql(name: &str, schema: &str, resource: &str, fence: &str) -> String {
    format!(
        "INSERT INTO {name} AS f (resource, fence, updated_at) \
         VALUES ({resource}, {fence}, pg_catalog.now()) \
         ON CONFLICT (resource) DO UPDATE SET \
         fence = CASE WHEN f.fence OPERATOR(pg_catalog.<=) EXCLUDED.fence THEN EXCLUDED.fence \
         ELSE {schema}.volcano_fence_refuse(f.resource, EXCLUDED.fence, f.fence) END, \
         updated_at = pg_catalog.now()"
    )
}

/// The function a stale check raises through: its own SQLSTATE, a message
/// that says what happened, and the highest fence in its detail.
#[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
fn refuse_function_sql(schema: &str) -> String {
    format!(
        "CREATE FUNCTION {schema}.volcano_fence_refuse(\
             resource text, fence bigint, highest bigint) RETURNS bigint\n\
         LANGUAGE plpgsql SET search_path = pg_catalog AS $volcano$\n\
         BEGIN\n\
           RAISE EXCEPTION USING ERRCODE = '{STALE_SQLSTATE}',\n\
             MESSAGE = format('volcano_fence: stale fencing token for %L: %s is lower than %s, \
                               already seen; this transaction cannot commit', \
                              resource, fence, highest),\n\
             DETAIL = format('highest fence seen: %s', highest),\n\
             HINT = 'The lock has changed hands since this lease was granted: roll back.';\n\
         END\n\
         $volcano$"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(any(feature = "sqlx", feature = "tokio-postgres"))]
    fn the_migration_quotes_the_schema_and_sends_only_what_is_missing() {
        let odd = Table::in_schema("a\"b; DROP TABLE x").unwrap();
        let all = Missing {
            schema: true,
            table: true,
            function: true,
        };
        assert!(odd
            .migrate_statements(all)
            .contains(&"CREATE SCHEMA IF NOT EXISTS \"a\"\"b; DROP TABLE x\"".to_owned()));
        let only_table = odd.migrate_statements(Missing {
            schema: false,
            table: true,
            function: false,
        });
        assert_eq!(only_table.len(), 2);
        assert!(only_table[1].starts_with("CREATE TABLE"));
        assert!(odd.migrate_statements(Missing {
            schema: false,
            table: false,
            function: true,
        })[1]
            .contains("\"a\"\"b; DROP TABLE x\".volcano_fence_refuse"));
    }

    #[test]
    fn schema_names_are_quoted_and_checked() {
        assert_eq!(Table::new().name(), "public.volcano_fences");
        assert_eq!(Table::in_schema("public").unwrap(), Table::new());
        let odd = Table::in_schema("a\"b; DROP TABLE x").unwrap();
        assert_eq!(odd.name(), "\"a\"\"b; DROP TABLE x\".volcano_fences");
        assert!(odd
            .check_statement()
            .contains("\"a\"\"b; DROP TABLE x\".volcano_fence_refuse("));
        assert!(Table::in_schema("").is_err());
        assert!(Table::in_schema(&"s".repeat(64)).is_err());
        assert!(Table::in_schema("a\0").is_err());
        assert!(Table::in_schema("pg_fences").is_err());
    }
}
