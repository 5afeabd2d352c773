//! The fence in the PostgreSQL set-ups a real deployment has: writers
//! under different roles with their own schemas, a temporary table of the
//! same name, least-privilege roles, a check pipelined with the write, and
//! the server's own words in the errors. Against `VOLCANO_TEST_PG_URL` or a
//! throwaway cluster (`volcano_fence::testing`).

#![cfg(all(feature = "sqlx", feature = "tokio-postgres", feature = "testing"))]

mod common;

use std::str::FromStr;
use std::time::Duration;

use common::checked;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};
use volcano_fence::testing::Postgres;
use volcano_fence::{sqlx as fence, Table};

/// A pool on the test server as `role` (the server's own user when
/// `None`), on `database` (the URL's when `None`).
async fn pool(pg: &Postgres, role: Option<&str>, database: Option<&str>) -> PgPool {
    let mut options = PgConnectOptions::from_str(pg.url()).expect("the test URL");
    if let Some(role) = role {
        options = options.username(role);
    }
    if let Some(database) = database {
        options = options.database(database);
    }
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("connect to the test PostgreSQL")
}

/// A tokio-postgres client as `role` (the server's own user when `None`).
async fn client(pg: &Postgres, role: Option<&str>) -> tokio_postgres::Client {
    let mut config = tokio_postgres::Config::from_str(pg.url()).expect("the test URL");
    if let Some(role) = role {
        config.user(role);
    }
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A fresh login role (roles are the cluster's, not a database's).
async fn fresh_role(admin: &PgPool, role: &str) {
    admin
        .execute(format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN").as_str())
        .await
        .unwrap();
}

/// PostgreSQL's recommended set-up: each writer role has a schema of its
/// own name, first in its default `search_path` ("$user", public). Before,
/// each role migrated and checked a `volcano_fences` of its own, and a
/// stale fence committed; a temporary table of the same name shadowed the
/// real one too. Now every writer checks `public.volcano_fences`.
#[tokio::test]
async fn writers_under_different_roles_check_one_fence_table() {
    let Some(pg) = Postgres::or_skip("writers_under_different_roles_check_one_fence_table") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    // A database of its own: its public schema starts without a fence table.
    admin
        .execute("DROP DATABASE IF EXISTS fence_roles WITH (FORCE)")
        .await
        .unwrap();
    admin.execute("CREATE DATABASE fence_roles").await.unwrap();
    let (a, b) = ("fence_role_a", "fence_role_b");
    for role in [a, b] {
        fresh_role(&admin, role).await;
    }
    let owner = pool(pg, None, Some("fence_roles")).await;
    owner
        .execute(
            format!(
                "CREATE SCHEMA {a} AUTHORIZATION {a}; CREATE SCHEMA {b} AUTHORIZATION {b};
                 GRANT CREATE ON SCHEMA public TO {a}, {b};
                 ALTER DEFAULT PRIVILEGES FOR ROLE {a}, {b} IN SCHEMA public
                   GRANT SELECT, INSERT, UPDATE ON TABLES TO {a}, {b}"
            )
            .as_str(),
        )
        .await
        .unwrap();
    let (as_a, as_b) = (
        pool(pg, Some(a), Some("fence_roles")).await,
        pool(pg, Some(b), Some("fence_roles")).await,
    );
    fence::migrate(&as_a).await.unwrap();
    fence::migrate(&as_b).await.unwrap();
    let table = Table::new();
    checked(&as_a, &table, "ledger", 6).await.unwrap();
    let stale = checked(&as_b, &table, "ledger", 5).await.unwrap_err();
    assert!(stale.is_stale(), "{stale}");
    assert_eq!(stale.highest_seen(), Some(6));
    // A temporary table of the same name, first in the session's path,
    // does not stand in for the real one.
    let mut shadowed = as_b.acquire().await.unwrap();
    shadowed
        .execute(
            "CREATE TEMP TABLE volcano_fences (resource text PRIMARY KEY, fence bigint NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
    let mut tx = sqlx::Acquire::begin(&mut *shadowed).await.unwrap();
    let stale = fence::check(&mut tx, "ledger", 5).await.unwrap_err();
    assert!(stale.is_stale(), "{stale}");
    drop(tx);
    let mut tx = sqlx::Acquire::begin(&mut *shadowed).await.unwrap();
    fence::check(&mut tx, "ledger", 7).await.unwrap();
    tx.commit().await.unwrap();
    let recorded: i64 =
        sqlx::query_scalar("SELECT fence FROM public.volcano_fences WHERE resource = 'ledger'")
            .fetch_one(&owner)
            .await
            .unwrap();
    assert_eq!(recorded, 7);
    for pool in [as_a, as_b, owner] {
        pool.close().await;
    }
}

/// An earlier version put the default table in the `search_path`'s first
/// schema; migrating the new default beside it would start every fence
/// afresh, so `migrate` refuses and says how to keep it.
#[tokio::test]
async fn migrate_will_not_start_afresh_beside_an_earlier_default_table() {
    let Some(pg) = Postgres::or_skip("migrate_will_not_start_afresh") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute("DROP DATABASE IF EXISTS fence_earlier WITH (FORCE)")
        .await
        .unwrap();
    admin
        .execute("CREATE DATABASE fence_earlier")
        .await
        .unwrap();
    let db = pool(pg, None, Some("fence_earlier")).await;
    let mut conn = db.acquire().await.unwrap();
    conn.execute(
        "CREATE SCHEMA app; SET search_path TO app, public;
         CREATE TABLE volcano_fences (resource text PRIMARY KEY, fence bigint NOT NULL, \
           updated_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO volcano_fences VALUES ('ledger', 9, now())",
    )
    .await
    .unwrap();
    let err = fence::migrate_on(&mut conn, &Table::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("Table::in_schema(\"app\")"), "{text}");
    // Kept as it says, its fences hold.
    let app = Table::in_schema("app").unwrap();
    fence::migrate_on(&mut conn, &app).await.unwrap();
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    let stale = fence::check_in(&mut tx, &app, "ledger", 8)
        .await
        .unwrap_err();
    assert_eq!(stale.highest_seen(), Some(9), "{stale}");
    drop(tx);
    // Once kept by name (migrated, with its function beside it), it is no
    // longer taken for an earlier default, and the default can be made.
    fence::migrate_on(&mut conn, &Table::new()).await.unwrap();
    drop(conn);
    db.close().await;
}

/// A function of the right name made by another role (on PostgreSQL 14
/// and earlier any role may create in `public`) could let stale checks
/// pass: `migrate` refuses it, whoever made the table.
#[tokio::test]
async fn migrate_refuses_a_function_another_role_made() {
    let Some(pg) = Postgres::or_skip("migrate_refuses_a_function_another_role_made") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute("DROP SCHEMA IF EXISTS fence_foreign CASCADE")
        .await
        .unwrap();
    fresh_role(&admin, "fence_foreign_maker").await;
    admin
        .execute(
            "CREATE SCHEMA fence_foreign; \
             GRANT USAGE, CREATE ON SCHEMA fence_foreign TO fence_foreign_maker",
        )
        .await
        .unwrap();
    let maker = pool(pg, Some("fence_foreign_maker"), None).await;
    maker
        .execute(
            "CREATE FUNCTION fence_foreign.volcano_fence_refuse(text, bigint, bigint) \
             RETURNS bigint LANGUAGE sql AS 'SELECT $3'",
        )
        .await
        .unwrap();
    let table = Table::in_schema("fence_foreign").unwrap();
    let err = fence::migrate_in(&admin, &table).await.unwrap_err();
    assert!(err.to_string().contains("DROP FUNCTION"), "{err}");
    admin
        .execute("DROP FUNCTION fence_foreign.volcano_fence_refuse(text, bigint, bigint)")
        .await
        .unwrap();
    fence::migrate_in(&admin, &table).await.unwrap();
    checked(&admin, &table, "r", 2).await.unwrap();
    assert!(checked(&admin, &table, "r", 1)
        .await
        .unwrap_err()
        .is_stale());
    maker.close().await;
}

/// A least-privilege writer: CREATE on an existing schema, no privilege on
/// the database. `migrate_in` creates the table and the function, not the
/// schema, and the check works.
#[tokio::test]
async fn migrate_in_an_existing_schema_needs_no_database_privilege() {
    let Some(pg) = Postgres::or_skip("migrate_in_an_existing_schema") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute("DROP SCHEMA IF EXISTS fence_lp CASCADE")
        .await
        .unwrap();
    fresh_role(&admin, "fence_lp_writer").await;
    admin
        .execute(
            "CREATE SCHEMA fence_lp; GRANT USAGE, CREATE ON SCHEMA fence_lp TO fence_lp_writer",
        )
        .await
        .unwrap();
    let writer = pool(pg, Some("fence_lp_writer"), None).await;
    let table = Table::in_schema("fence_lp").unwrap();
    fence::migrate_in(&writer, &table).await.unwrap();
    fence::migrate_in(&writer, &table).await.unwrap();
    checked(&writer, &table, "r", 1).await.unwrap();
    assert!(checked(&writer, &table, "r", 0)
        .await
        .unwrap_err()
        .is_stale());
    writer.close().await;
}

/// The server's reason is in the error's text for both drivers (through
/// tokio-postgres it used to read "db error"), with its SQLSTATE and what
/// the role needs.
#[tokio::test]
async fn a_permission_error_names_the_permission() {
    let Some(pg) = Postgres::or_skip("a_permission_error_names_the_permission") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute("DROP SCHEMA IF EXISTS fence_denied CASCADE")
        .await
        .unwrap();
    let table = Table::in_schema("fence_denied").unwrap();
    fence::migrate_in(&admin, &table).await.unwrap();
    fresh_role(&admin, "fence_denied_writer").await;
    admin
        .execute("GRANT USAGE ON SCHEMA fence_denied TO fence_denied_writer")
        .await
        .unwrap();
    let mut denied = client(pg, Some("fence_denied_writer")).await;
    let tx = denied.transaction().await.unwrap();
    let err = volcano_fence::tokio_postgres::check_in(&tx, &table, "r", 1)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("permission denied for table volcano_fences")
            && text.contains("SQLSTATE 42501")
            && text.contains("SELECT, INSERT and UPDATE"),
        "{text}"
    );
    assert_eq!(err.sqlstate(), Some("42501"));
    drop(tx);
    let as_writer = pool(pg, Some("fence_denied_writer"), None).await;
    let err = checked(&as_writer, &table, "r", 1).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("permission denied for table volcano_fences"),
        "{err}"
    );
    // And `migrate` where the role may not create: the same words.
    let other = Table::in_schema("fence_denied_other").unwrap();
    let err = volcano_fence::tokio_postgres::migrate_in(&denied, &other)
        .await
        .unwrap_err();
    assert!(
        !err.is_not_migrated() && err.to_string().contains("permission denied"),
        "{err}"
    );
    as_writer.close().await;
}

/// `Fences::check` pipelined with a read-modify-write, on a resource's
/// first write: the second holder's write waits for the first holder's
/// transaction, so the two increments are 1 then 2 (before, the check
/// locked nothing on a first write and both read 0).
#[tokio::test]
async fn a_pipelined_check_serializes_a_resources_first_write() {
    let Some(pg) = Postgres::or_skip("a_pipelined_check_serializes") else {
        return;
    };
    let mut admin = client(pg, None).await;
    admin
        .batch_execute(
            "DROP SCHEMA IF EXISTS fence_pipe CASCADE; CREATE SCHEMA fence_pipe;
             CREATE TABLE fence_pipe.counts (v bigint NOT NULL)",
        )
        .await
        .unwrap();
    let table = Table::in_schema("fence_pipe").unwrap();
    volcano_fence::tokio_postgres::migrate_in(&admin, &table)
        .await
        .unwrap();
    let increment =
        "INSERT INTO fence_pipe.counts SELECT coalesce(max(v), 0) + 1 FROM fence_pipe.counts";
    let mut first = client(pg, None).await;
    let fences_1 = volcano_fence::tokio_postgres::Fences::prepare(&first, &table)
        .await
        .unwrap();
    let tx_1 = first.transaction().await.unwrap();
    let (checked, written) = tokio::join!(
        fences_1.check(&tx_1, "counter", 1),
        tx_1.execute(increment, &[])
    );
    checked.unwrap();
    written.unwrap();
    // The second holder pipelines the same, while the first has not committed.
    let mut db = client(pg, None).await;
    let pid: i32 = db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let second = tokio::spawn({
        let table = table.clone();
        async move {
            let fences = volcano_fence::tokio_postgres::Fences::prepare(&db, &table)
                .await
                .unwrap();
            let tx = db.transaction().await.unwrap();
            let (checked, written) =
                tokio::join!(fences.check(&tx, "counter", 2), tx.execute(increment, &[]));
            checked.unwrap();
            written.unwrap();
            tx.commit().await.unwrap();
        }
    });
    // Wait until the second holder is blocked on a lock, behind the first.
    wait_for_a_lock_wait(&admin, pid).await;
    tx_1.commit().await.unwrap();
    second.await.unwrap();
    let counts: Vec<i64> = admin
        .query("SELECT v FROM fence_pipe.counts ORDER BY v", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(counts, [1, 2]);

    // A stale check pipelined with the write and the COMMIT: nothing
    // commits, whatever the caller does with the error.
    let tx = admin.transaction().await.unwrap();
    let (checked, _, _) = tokio::join!(
        volcano_fence::tokio_postgres::check_in(&tx, &table, "counter", 1),
        tx.execute(increment, &[]),
        tx.batch_execute("COMMIT"),
    );
    let stale = checked.unwrap_err();
    assert!(stale.is_stale(), "{stale}");
    assert_eq!(stale.highest_seen(), Some(2));
    drop(tx);
    // An invalid resource name aborts the transaction too.
    let tx = admin.transaction().await.unwrap();
    let invalid = volcano_fence::tokio_postgres::check_in(&tx, &table, "", 3).await;
    assert!(invalid
        .unwrap_err()
        .to_string()
        .contains("invalid fence resource"));
    let _ = tx.execute(increment, &[]).await;
    let _ = tx.commit().await;
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM fence_pipe.counts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2);
}

/// Polls `pg_stat_activity` until backend `pid` waits on a lock (bounded:
/// a minute).
async fn wait_for_a_lock_wait(admin: &tokio_postgres::Client, pid: i32) {
    for _ in 0..6000 {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the second holder (backend {pid}) never waited on a lock");
}

/// Through sqlx the same, sequentially; plus a savepoint (refused: its
/// rollback would undo the check), an invalid name (aborts), a lock
/// timeout (retryable) and a table of an earlier version without the
/// function ("run migrate").
#[tokio::test]
async fn sqlx_refuses_savepoints_and_classifies_timeouts() {
    let Some(pg) = Postgres::or_skip("sqlx_refuses_savepoints") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute(
            "DROP SCHEMA IF EXISTS fence_sp CASCADE; CREATE SCHEMA fence_sp;
             CREATE TABLE fence_sp.notes (body text)",
        )
        .await
        .unwrap();
    let table = Table::in_schema("fence_sp").unwrap();
    fence::migrate_in(&admin, &table).await.unwrap();
    checked(&admin, &table, "r", 1).await.unwrap();

    let mut tx = admin.begin().await.unwrap();
    let mut nested = sqlx::Acquire::begin(&mut *tx).await.unwrap();
    let err = fence::check_in(&mut nested, &table, "r", 2)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("savepoint"), "{err}");
    drop(nested);
    drop(tx);

    let mut tx = admin.begin().await.unwrap();
    assert!(fence::check_in(&mut tx, &table, "nul\0", 2).await.is_err());
    let _ = sqlx::query("INSERT INTO fence_sp.notes VALUES ('after an invalid name')")
        .execute(&mut *tx)
        .await;
    let _ = tx.commit().await;
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM fence_sp.notes")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(notes, 0);

    // One holder in the row; another with a short lock_timeout.
    let mut holder = admin.begin().await.unwrap();
    fence::check_in(&mut holder, &table, "r", 3).await.unwrap();
    for timeout in ["lock_timeout", "statement_timeout"] {
        let mut waiter = admin.begin().await.unwrap();
        waiter
            .execute(format!("SET LOCAL {timeout} = '50ms'").as_str())
            .await
            .unwrap();
        let err = fence::check_in(&mut waiter, &table, "r", 4)
            .await
            .unwrap_err();
        assert!(err.is_retryable() && !err.is_stale(), "{timeout}: {err}");
    }
    holder.commit().await.unwrap();

    // A table migrated by an earlier version has no function yet.
    admin
        .execute("DROP FUNCTION fence_sp.volcano_fence_refuse(text, bigint, bigint)")
        .await
        .unwrap();
    let err = checked(&admin, &table, "r", 1).await.unwrap_err();
    assert!(err.is_not_migrated(), "{err}");
    fence::migrate_in(&admin, &table).await.unwrap();
    assert!(checked(&admin, &table, "r", 1)
        .await
        .unwrap_err()
        .is_stale());
    checked(&admin, &table, "r", 5).await.unwrap();
}

/// `.ci/postgres-versions` runs these tests on other major versions; this
/// makes sure the cluster really is the one it asked for.
#[tokio::test]
async fn the_server_is_the_major_version_asked_for() {
    let Ok(major) = std::env::var("VOLCANO_TEST_PG_EXPECT_MAJOR") else {
        return;
    };
    let Some(pg) = Postgres::or_skip("the_server_is_the_major_version_asked_for") else {
        return;
    };
    let version: String = sqlx::query_scalar("SHOW server_version_num")
        .fetch_one(&pool(pg, None, None).await)
        .await
        .unwrap();
    let found = version.parse::<u32>().unwrap() / 10_000;
    assert_eq!(found.to_string(), major, "server_version_num {version}");
}

/// `sqlx::begin`: the check sent with the `BEGIN`, in one round trip. A
/// failed check leaves no transaction open; the names are data, whatever
/// `standard_conforming_strings` says; the row lock is held.
#[tokio::test]
async fn sqlx_begin_checks_with_the_begin() {
    let Some(pg) = Postgres::or_skip("sqlx_begin_checks_with_the_begin") else {
        return;
    };
    let admin = pool(pg, None, None).await;
    admin
        .execute("DROP SCHEMA IF EXISTS fence_begin CASCADE")
        .await
        .unwrap();
    let table = Table::in_schema("fence_begin").unwrap();
    fence::migrate_in(&admin, &table).await.unwrap();
    let recorded = |resource: &'static str| {
        let admin = admin.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT fence FROM fence_begin.volcano_fences WHERE resource = $1",
            )
            .bind(resource)
            .fetch_optional(&admin)
            .await
            .unwrap()
        }
    };
    let mut conn = admin.acquire().await.unwrap();
    let tx = fence::begin_in(&mut conn, &table, "r", 5).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(recorded("r").await, Some(5));
    let stale = fence::begin_in(&mut conn, &table, "r", 4)
        .await
        .unwrap_err();
    assert!(stale.is_stale(), "{stale}");
    assert_eq!(stale.highest_seen(), Some(5));
    // Nothing was left open: a plain transaction begins and commits.
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    fence::check_in(&mut tx, &table, "r", 6).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(recorded("r").await, Some(6));

    for (i, name) in [
        "'); DROP TABLE fence_begin.volcano_fences; --",
        "back\\slash'quote",
        "$1 $2 E'x'",
        "dollar$$quote",
    ]
    .into_iter()
    .enumerate()
    {
        for conforming in ["on", "off"] {
            conn.execute(format!("SET standard_conforming_strings = {conforming}").as_str())
                .await
                .unwrap();
            let fence = i as i64 * 2 + i64::from(conforming == "off");
            let tx = fence::begin_in(&mut conn, &table, name, fence)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            assert_eq!(recorded(name).await, Some(fence), "{name:?} {conforming}");
        }
    }
    conn.execute("SET standard_conforming_strings = on")
        .await
        .unwrap();

    // The row lock is held until the transaction ends.
    let holder = fence::begin_in(&mut conn, &table, "r", 7).await.unwrap();
    let mut other = admin.acquire().await.unwrap();
    other.execute("SET lock_timeout = '50ms'").await.unwrap();
    let waited = fence::begin_in(&mut other, &table, "r", 8)
        .await
        .unwrap_err();
    assert!(waited.is_retryable(), "{waited}");
    holder.commit().await.unwrap();
    fence::begin_in(&mut other, &table, "r", 8)
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    // Inside a transaction it is refused, as a savepoint would be.
    let mut tx = sqlx::Acquire::begin(&mut *other).await.unwrap();
    assert!(fence::begin_in(&mut tx, &table, "r", 9).await.is_err());
}
