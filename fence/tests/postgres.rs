//! The fence against a real PostgreSQL server: `VOLCANO_TEST_PG_URL`, or a
//! throwaway cluster the tests start themselves (see
//! `volcano_fence::testing`). Each test works in its own schema.

#![cfg(all(feature = "sqlx", feature = "tokio-postgres", feature = "testing"))]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::checked;
use rand::{Rng, SeedableRng};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool, Row};
use volcano_fence::testing::Postgres;
use volcano_fence::{sqlx as fence, Table};

/// A pool on the test server, and a fresh schema `name` with the fence
/// table migrated into it (unless `migrated` is false).
async fn setup(name: &str, migrated: bool) -> Option<(PgPool, Table)> {
    let pg = Postgres::or_skip(name)?;
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(pg.url())
        .await
        .expect("connect to the test PostgreSQL");
    pool.execute(format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE").as_str())
        .await
        .unwrap();
    let table = Table::in_schema(name).unwrap();
    if migrated {
        fence::migrate_in(&pool, &table).await.unwrap();
    }
    Some((pool, table))
}

/// A tokio-postgres client on the test server, and the (not yet migrated)
/// fence table of a fresh schema `name`.
async fn tokio_setup(name: &str) -> Option<(tokio_postgres::Client, Table)> {
    let pg = Postgres::or_skip(name)?;
    let (client, connection) = tokio_postgres::connect(pg.url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
        .await
        .unwrap();
    Some((client, Table::in_schema(name).unwrap()))
}

async fn recorded(pool: &PgPool, table: &Table, resource: &str) -> Option<i64> {
    sqlx::query_scalar(&format!(
        "SELECT fence FROM {} WHERE resource = $1",
        table.name()
    ))
    .bind(resource)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn equal_passes_lower_is_stale_and_leaves_nothing() {
    let Some((pool, table)) = setup("fence_rule", true).await else {
        return;
    };
    checked(&pool, &table, "report", 5).await.unwrap();
    checked(&pool, &table, "report", 5).await.unwrap();
    let stale = checked(&pool, &table, "report", 4).await.unwrap_err();
    assert!(stale.is_stale() && !stale.is_retryable(), "{stale}");
    assert_eq!(stale.highest_seen(), Some(5));
    assert_eq!(recorded(&pool, &table, "report").await, Some(5));
    // A first check records its fence.
    checked(&pool, &table, "fresh", 9).await.unwrap();
    assert_eq!(recorded(&pool, &table, "fresh").await, Some(9));
    // The extremes of i64, compared exactly.
    checked(&pool, &table, "max", i64::MAX).await.unwrap();
    let err = checked(&pool, &table, "max", i64::MAX - 1)
        .await
        .unwrap_err();
    assert_eq!(err.highest_seen(), Some(i64::MAX));
    checked(&pool, &table, "min", i64::MIN).await.unwrap();
    checked(&pool, &table, "min", i64::MIN + 1).await.unwrap();
    // The write a refused check guarded never happens: the caller's whole
    // transaction rolls back.
    pool.execute("CREATE TABLE \"fence_rule\".reports (body text)")
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let refused = fence::check_in(&mut tx, &table, "report", 3).await;
    assert!(refused.unwrap_err().is_stale());
    drop(tx); // rolled back
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM \"fence_rule\".reports")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn migrate_twice_and_at_once_and_check_before_it() {
    let Some((pool, table)) = setup("fence_migrate", false).await else {
        return;
    };
    let err = checked(&pool, &table, "r", 1).await.unwrap_err();
    assert!(err.is_not_migrated(), "{err}");
    let text = err.to_string();
    assert!(text.contains("run volcano_fence::sqlx::migrate"), "{text}");
    assert!(text.contains("\"fence_migrate\".volcano_fences"), "{text}");
    let at_once: Vec<_> = (0..4)
        .map(|_| {
            let (pool, table) = (pool.clone(), table.clone());
            tokio::spawn(async move { fence::migrate_in(&pool, &table).await })
        })
        .collect();
    for migrate in at_once {
        migrate.await.unwrap().unwrap();
    }
    fence::migrate_in(&pool, &table).await.unwrap();
    checked(&pool, &table, "r", 1).await.unwrap();
    // The default table no longer follows the search_path: with this
    // schema first on it, the default is still public.volcano_fences.
    let mut conn = pool.acquire().await.unwrap();
    conn.execute("SET search_path TO fence_migrate")
        .await
        .unwrap();
    fence::migrate_on(&mut conn, &Table::new()).await.unwrap();
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.unwrap();
    fence::check(&mut tx, "fence_migrate-r", 0).await.unwrap();
    tx.commit().await.unwrap();
    let in_public: Option<i64> = sqlx::query_scalar(
        "SELECT fence FROM public.volcano_fences WHERE resource = 'fence_migrate-r'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(in_public, Some(0));
    assert_eq!(recorded(&pool, &table, "fence_migrate-r").await, None);
}

#[tokio::test]
async fn resource_names_are_data() {
    let Some((pool, table)) = setup("fence_names", true).await else {
        return;
    };
    let names = [
        "'); DROP TABLE fence_names.volcano_fences; --".to_owned(),
        "\" OR 1=1 --".to_owned(),
        "$1".to_owned(),
        "nightly report ✓ 夜間レポート 🌋".to_owned(),
        "a\\b\nc".to_owned(),
        "é".repeat(1024),
    ];
    for (i, name) in names.iter().enumerate() {
        checked(&pool, &table, name, i as i64).await.unwrap();
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(
            recorded(&pool, &table, name).await,
            Some(i as i64),
            "{name:?}"
        );
        assert!(checked(&pool, &table, name, -1)
            .await
            .unwrap_err()
            .is_stale());
    }
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", table.name()))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, names.len() as i64);
    for bad in ["", "nul\0inside"] {
        let err = checked(&pool, &table, bad, 1).await.unwrap_err();
        assert!(
            !err.is_stale() && err.to_string().contains("invalid fence resource"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn racing_writers_commit_in_fence_order() {
    let Some((pool, table)) = setup("fence_race", true).await else {
        return;
    };
    pool.execute(
        "CREATE TABLE fence_race.writes (id bigserial PRIMARY KEY, fence bigint NOT NULL)",
    )
    .await
    .unwrap();
    let seed: u64 = rand::random();
    eprintln!("racing_writers seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pool = Arc::new(pool);
    let mut writers = Vec::new();
    for _ in 0..24 {
        let (pool, table) = (pool.clone(), table.clone());
        let fences: Vec<i64> = (0..10).map(|_| rng.random_range(0..40)).collect();
        writers.push(tokio::spawn(async move {
            let mut refused = 0;
            for fence in fences {
                let mut tx = pool.begin().await.unwrap();
                match fence::check_in(&mut tx, &table, "ledger", fence).await {
                    Ok(()) => {
                        // Some time inside the lock, so that writers queue.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        sqlx::query("INSERT INTO fence_race.writes (fence) VALUES ($1)")
                            .bind(fence)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                    }
                    Err(err) => {
                        assert!(err.is_stale(), "{err}");
                        assert!(err.highest_seen().unwrap() > fence);
                        refused += 1;
                    }
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for writer in writers {
        refused += writer.await.unwrap();
    }
    let rows = sqlx::query("SELECT fence FROM fence_race.writes ORDER BY id")
        .fetch_all(&*pool)
        .await
        .unwrap();
    let committed: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        committed.windows(2).all(|w| w[0] <= w[1]),
        "committed out of fence order: {committed:?}"
    );
    assert!(refused > 0, "no write was refused: the race tested nothing");
    assert_eq!(committed.len() + refused, 240);
    assert_eq!(
        recorded(&pool, &table, "ledger").await,
        committed.last().copied()
    );
}

#[tokio::test]
async fn a_serialization_failure_is_retryable_not_stale() {
    let Some((pool, table)) = setup("fence_isolation", true).await else {
        return;
    };
    checked(&pool, &table, "r", 1).await.unwrap();
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let mut slow = pool.begin().await.unwrap();
        slow.execute(format!("SET TRANSACTION ISOLATION LEVEL {level}").as_str())
            .await
            .unwrap();
        // Its snapshot is taken here, before the other writer commits.
        sqlx::query("SELECT 1").execute(&mut *slow).await.unwrap();
        let top = recorded(&pool, &table, "r").await.unwrap();
        checked(&pool, &table, "r", top + 1).await.unwrap();
        let err = fence::check_in(&mut slow, &table, "r", top + 2)
            .await
            .unwrap_err();
        assert!(err.is_retryable() && !err.is_stale(), "{level}: {err}");
        assert!(err.to_string().contains("retry the transaction"), "{err}");
        slow.rollback().await.unwrap();
        // Retried, it passes.
        checked(&pool, &table, "r", top + 2).await.unwrap();
    }
}

#[tokio::test]
async fn the_same_through_tokio_postgres() {
    let Some((mut client, table)) = tokio_setup("fence_tp").await else {
        return;
    };
    let tx = client.transaction().await.unwrap();
    let err = volcano_fence::tokio_postgres::check_in(&tx, &table, "r", 1)
        .await
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("run volcano_fence::tokio_postgres::migrate"));
    drop(tx);
    let unprepared = volcano_fence::tokio_postgres::Fences::prepare(&client, &table).await;
    assert!(unprepared.unwrap_err().is_not_migrated());
    volcano_fence::tokio_postgres::migrate_in(&client, &table)
        .await
        .unwrap();
    volcano_fence::tokio_postgres::migrate_in(&client, &table)
        .await
        .unwrap();
    for (fence, passes) in [(3, true), (3, true), (2, false), (i64::MAX, true)] {
        let tx = client.transaction().await.unwrap();
        let result =
            volcano_fence::tokio_postgres::check_in(&tx, &table, "'; DROP TABLE x; --", fence)
                .await;
        assert_eq!(result.is_ok(), passes, "{fence}: {result:?}");
        if let Err(err) = result {
            assert!(err.is_stale());
            assert_eq!(err.highest_seen(), Some(3));
        }
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn prepared_fences_keep_the_same_rule() {
    let Some((mut client, table)) = tokio_setup("fence_prepared").await else {
        return;
    };
    volcano_fence::tokio_postgres::migrate_in(&client, &table)
        .await
        .unwrap();
    let fences = volcano_fence::tokio_postgres::Fences::prepare(&client, &table)
        .await
        .unwrap();
    for (resource, fence, passes, highest) in [
        ("a", 3, true, None),
        ("a", 3, true, None),
        ("a", 2, false, Some(3)),
        ("b", i64::MIN, true, None),
        ("a", i64::MAX, true, None),
        ("a", 4, false, Some(i64::MAX)),
    ] {
        let tx = client.transaction().await.unwrap();
        let result = fences.check(&tx, resource, fence).await;
        assert_eq!(result.is_ok(), passes, "{resource} {fence}: {result:?}");
        if let Err(err) = &result {
            assert!(err.is_stale());
            assert_eq!(err.highest_seen(), highest, "{resource} {fence}");
        }
        tx.commit().await.unwrap();
    }
    let tx = client.transaction().await.unwrap();
    assert!(fences.check(&tx, "", 1).await.is_err());
}

/// Through tokio-postgres too, free function and prepared: a caller that
/// ignores a stale error (also with the write pipelined beside the check)
/// and commits writes nothing.
#[tokio::test]
async fn a_stale_tokio_postgres_transaction_cannot_commit() {
    let Some((mut client, table)) = tokio_setup("fence_poison_tp").await else {
        return;
    };
    volcano_fence::tokio_postgres::migrate_in(&client, &table)
        .await
        .unwrap();
    client
        .batch_execute("CREATE TABLE fence_poison_tp.notes (body text)")
        .await
        .unwrap();
    let fences = volcano_fence::tokio_postgres::Fences::prepare(&client, &table)
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    volcano_fence::tokio_postgres::check_in(&tx, &table, "r", 7)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let insert = "INSERT INTO fence_poison_tp.notes VALUES ('stale')";
    for prepared in [false, true] {
        let tx = client.transaction().await.unwrap();
        let (checked, _) = tokio::join!(
            async {
                if prepared {
                    fences.check(&tx, "r", 6).await
                } else {
                    volcano_fence::tokio_postgres::check_in(&tx, &table, "r", 6).await
                }
            },
            tx.execute(insert, &[]),
        );
        let err = checked.unwrap_err();
        assert!(err.is_stale(), "prepared {prepared}: {err}");
        assert_eq!(err.highest_seen(), Some(7), "prepared {prepared}");
        let _ = tx.execute(insert, &[]).await;
        let _ = tx.commit().await;
    }
    let notes: i64 = client
        .query_one("SELECT count(*) FROM fence_poison_tp.notes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(notes, 0);
}

/// The fencing guide's `psql` recipe (docs/guide/fencing.md) for `volcano locks run` jobs
/// (`examples/nightly.sql`), run by psql itself: a current fence writes, a
/// stale one exits 3 and writes nothing.
#[tokio::test]
async fn the_psql_recipe_refuses_a_stale_token() {
    let Some((pool, _)) = setup("fence_psql", false).await else {
        return;
    };
    if std::process::Command::new("psql")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "psql is required with CI=true"
        );
        eprintln!("skipped the_psql_recipe_refuses_a_stale_token: no psql");
        return;
    }
    pool.execute(
        "CREATE SCHEMA fence_psql; SET search_path TO fence_psql; \
         CREATE TABLE fence_psql.reports (name text, body text); \
         INSERT INTO fence_psql.reports VALUES ('nightly', '')",
    )
    .await
    .unwrap();
    fence::migrate(&pool).await.unwrap();
    // The recipe's resource, in the shared default table: afresh for this run.
    pool.execute("DELETE FROM public.volcano_fences WHERE resource = 'nightly-report'")
        .await
        .unwrap();
    let url = Postgres::shared().unwrap().url().to_owned();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/nightly.sql");
    let run = |fence: i64| {
        std::process::Command::new("psql")
            .arg(&url)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-v"])
            .arg(format!("fence={fence}"))
            .args(["-f", script])
            .env("PGOPTIONS", "-c search_path=fence_psql")
            .output()
            .unwrap()
    };
    assert!(run(5).status.success());
    assert!(run(5).status.success());
    let stale = run(4);
    assert_eq!(stale.status.code(), Some(3));
    let said = String::from_utf8_lossy(&stale.stderr);
    assert!(said.contains("stale fencing token"), "{said}");
    assert!(run(6).status.success());
    let body: String = sqlx::query_scalar("SELECT body FROM fence_psql.reports")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(body, "done by 6");
}

#[tokio::test]
async fn a_stale_transaction_cannot_commit_and_a_bare_connection_is_refused() {
    let Some((pool, table)) = setup("fence_poison", true).await else {
        return;
    };
    pool.execute("CREATE TABLE fence_poison.notes (body text)")
        .await
        .unwrap();
    checked(&pool, &table, "r", 7).await.unwrap();
    // A caller that ignores the stale error and commits writes nothing.
    let mut tx = pool.begin().await.unwrap();
    let ignored = fence::check_in(&mut tx, &table, "r", 6).await;
    assert!(ignored.unwrap_err().is_stale());
    let _ = sqlx::query("INSERT INTO fence_poison.notes VALUES ('stale')")
        .execute(&mut *tx)
        .await;
    let _ = tx.commit().await;
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM fence_poison.notes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(notes, 0);
    // Outside a transaction nothing would hold the row lock.
    let mut bare = pool.acquire().await.unwrap();
    let err = fence::check_in(&mut bare, &table, "r", 8)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a transaction"), "{err}");
    assert_eq!(recorded(&pool, &table, "r").await, Some(7));
}

#[tokio::test]
async fn migrate_needs_no_create_privilege_once_the_table_exists() {
    let Some((pool, table)) = setup("fence_priv", true).await else {
        return;
    };
    pool.execute(
        "DROP ROLE IF EXISTS fence_app; CREATE ROLE fence_app LOGIN; \
         GRANT USAGE ON SCHEMA fence_priv TO fence_app; \
         GRANT SELECT, INSERT, UPDATE ON fence_priv.volcano_fences TO fence_app",
    )
    .await
    .unwrap();
    let url = Postgres::shared()
        .unwrap()
        .url()
        .replacen("postgres@", "fence_app@", 1);
    let app = PgPoolOptions::new().connect(&url).await.unwrap();
    fence::migrate_in(&app, &table).await.unwrap();
    checked(&app, &table, "r", 1).await.unwrap();
    // Where it has to create the table, the role's missing privilege is
    // the error, not "run migrate first".
    let other = Table::in_schema("fence_priv_other").unwrap();
    let err = fence::migrate_in(&app, &other).await.unwrap_err();
    assert!(
        !err.is_not_migrated() && err.to_string().contains("permission denied"),
        "{err}"
    );
    app.close().await;
}
