//! The run's PostgreSQL: a database of its own on the throwaway cluster,
//! two writer roles with a schema each (first on their default
//! `search_path`, as PostgreSQL recommends), the counters and their
//! history in `public`. The workers migrate the fence table themselves,
//! under their own roles, as services do at start.

use std::collections::BTreeMap;
use std::str::FromStr;

use tokio_postgres::{Client, Config, NoTls};

/// The writer roles; workers take them in turn.
pub(crate) const ROLES: [&str; 2] = ["e2e_writer_a", "e2e_writer_b"];

/// A committed increment, as the worker recorded it.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) key: String,
    pub(crate) value: i64,
    pub(crate) fence: i64,
    pub(crate) worker: String,
    pub(crate) sent_at_ms: i64,
}

/// What PostgreSQL holds at the end.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Each key's counter.
    pub(crate) counters: BTreeMap<String, i64>,
    /// Every committed increment, in commit order (the history's ids are
    /// taken inside the transaction; with the fence, under the key's row
    /// lock).
    pub(crate) history: Vec<Write>,
}

async fn connect(config: &Config) -> Result<Client, String> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

fn fail(what: &str) -> impl Fn(tokio_postgres::Error) -> String + '_ {
    move |e| {
        let said = e.as_db_error().map(|db| db.message().to_owned());
        format!("{what}: {}", said.unwrap_or_else(|| e.to_string()))
    }
}

/// Makes database `name` afresh and returns the URL of each writer role.
pub(crate) async fn prepare(url: &str, name: &str, keys: &[&str]) -> Result<Vec<String>, String> {
    let base = Config::from_str(url).map_err(|e| e.to_string())?;
    let admin = connect(&base).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .map_err(fail("dropping the run's database"))?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(fail("creating the run's database"))?;
    for role in ROLES {
        // Roles are the cluster's, shared by the runs' databases.
        let exists = admin
            .query_opt(
                "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1",
                &[&role],
            )
            .await
            .map_err(fail("looking for the writer roles"))?
            .is_some();
        if !exists {
            admin
                .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
                .await
                .map_err(fail("making the writer roles"))?;
        }
        admin
            .batch_execute(&format!(
                "ALTER ROLE {role} SET idle_in_transaction_session_timeout = '30s'; \
                 ALTER ROLE {role} SET lock_timeout = '15s'"
            ))
            .await
            .map_err(fail("setting the writer roles' timeouts"))?;
    }
    let mut owner_config = base.clone();
    owner_config.dbname(name);
    let owner = connect(&owner_config).await?;
    let mut setup = String::from(
        "CREATE TABLE public.counters (key text PRIMARY KEY, n bigint NOT NULL);
         CREATE TABLE public.history (id bigserial PRIMARY KEY, key text NOT NULL,
           value bigint NOT NULL, fence bigint NOT NULL, worker text NOT NULL,
           sent_at_ms bigint NOT NULL);",
    );
    for key in keys {
        setup.push_str(&format!("INSERT INTO public.counters VALUES ('{key}', 0);"));
    }
    for role in ROLES {
        // As each service of a real deployment does: its role migrates the
        // fence table itself at start (so CREATE on public), and what one
        // role creates there the other may use.
        setup.push_str(&format!(
            "CREATE SCHEMA {role} AUTHORIZATION {role};
             GRANT SELECT, UPDATE ON public.counters TO {role};
             GRANT SELECT, INSERT ON public.history TO {role};
             GRANT USAGE ON SEQUENCE public.history_id_seq TO {role};
             GRANT CREATE ON SCHEMA public TO {role};
             ALTER DEFAULT PRIVILEGES FOR ROLE {role} IN SCHEMA public
               GRANT SELECT, INSERT, UPDATE ON TABLES TO {};",
            ROLES.join(", ")
        ));
    }
    owner
        .batch_execute(&setup)
        .await
        .map_err(fail("making the counters"))?;
    Ok(ROLES.iter().map(|role| role_url(url, role, name)).collect())
}

/// `url` with another user and database (the cluster trusts its socket).
fn role_url(url: &str, role: &str, database: &str) -> String {
    let (scheme_user, rest) = url.split_once('@').expect("a URL with a user");
    let scheme = scheme_user.split("//").next().unwrap_or("postgres:");
    let host = rest.rsplit_once('/').map_or(rest, |(host, _)| host);
    format!("{scheme}//{role}@{host}/{database}")
}

/// The counters and the history of database `name`.
pub(crate) async fn outcome(url: &str, name: &str) -> Result<Outcome, String> {
    let mut config = Config::from_str(url).map_err(|e| e.to_string())?;
    config.dbname(name);
    let db = connect(&config).await?;
    let counters = db
        .query("SELECT key, n FROM public.counters", &[])
        .await
        .map_err(fail("reading the counters"))?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let history = db
        .query(
            "SELECT key, value, fence, worker, sent_at_ms FROM public.history ORDER BY id",
            &[],
        )
        .await
        .map_err(fail("reading the history"))?
        .iter()
        .map(|row| Write {
            key: row.get(0),
            value: row.get(1),
            fence: row.get(2),
            worker: row.get(3),
            sent_at_ms: row.get(4),
        })
        .collect();
    Ok(Outcome { counters, history })
}

/// How many increments database `name` has lost so far (commits beyond
/// the counters' sum).
pub(crate) async fn lost_so_far(url: &str, name: &str) -> Result<i64, String> {
    let mut config = Config::from_str(url).map_err(|e| e.to_string())?;
    config.dbname(name);
    let db = connect(&config).await?;
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM public.history) \
                  - (SELECT coalesce(sum(n), 0) FROM public.counters)::bigint",
            &[],
        )
        .await
        .map_err(fail("counting lost updates"))?;
    Ok(row.get(0))
}
