//! The reason the fence exists, end to end: a holder frozen past its lease
//! (or displaced by a force-release) wakes up and writes with its old
//! fencing token after the next holder wrote; PostgreSQL refuses it. The
//! locks come from the mock server through the real SDK.

#![cfg(all(feature = "sqlx", feature = "tokio-postgres", feature = "testing"))]

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};
use volcano::mock::MockServer;
use volcano::{Client, LeaseClock};
use volcano_fence::testing::Postgres;
use volcano_fence::{sqlx as fence, Table};

const TTL: Duration = Duration::from_secs(5);

async fn database(schema: &str) -> Option<(PgPool, Table)> {
    let pg = Postgres::or_skip(schema)?;
    let pool = PgPoolOptions::new().connect(pg.url()).await.unwrap();
    pool.execute(format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; CREATE TABLE {schema}.report (id int PRIMARY KEY, body text, fence bigint)").as_str())
        .await
        .unwrap();
    let table = Table::in_schema(schema).unwrap();
    fence::migrate_in(&pool, &table).await.unwrap();
    Some((pool, table))
}

/// The protected write: the fence check, then the row, in one transaction.
async fn write(
    pool: &PgPool,
    table: &Table,
    schema: &str,
    body: &str,
    fence: i64,
) -> Result<(), volcano_fence::Error> {
    let mut tx = pool.begin().await.unwrap();
    fence::check_in(&mut tx, table, "report", fence).await?;
    sqlx::query(&format!(
        "INSERT INTO {schema}.report VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET body = $1, fence = $2"
    ))
    .bind(body)
    .bind(fence)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Ok(())
}

async fn row(pool: &PgPool, schema: &str) -> (String, i64) {
    sqlx::query_as(&format!(
        "SELECT body, fence FROM {schema}.report WHERE id = 1"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// How the first holder loses the lock while it is frozen.
enum Freeze {
    /// The server's clock passes the lease's expiry (and the grace).
    ServerClock,
    /// An operator force-releases the key.
    ForceRelease,
    /// The holder's own lease clock jumps too (a suspended laptop, a
    /// stopped VM): its guard knows it lost the lock, too late.
    LeaseClockAndServerClock,
}

async fn frozen_holder_is_refused(schema: &str, freeze: Freeze) {
    let Some((pool, table)) = database(schema).await else {
        return;
    };
    let server = MockServer::start().await;
    let clock = LeaseClock::adjustable();
    let first = Client::builder()
        .api_url(server.url())
        .service_key(server.service_key())
        .lease_clock(clock.clone())
        .build()
        .unwrap();
    let second = Client::for_mock(&server);

    let held = first.locks().hold("nightly-report", TTL).await.unwrap();
    let old = held.lease().fencing_token();
    write(&pool, &table, schema, "first, before the freeze", old)
        .await
        .unwrap();

    // Frozen: no renewal, no write, while the lock changes hands.
    match freeze {
        Freeze::ServerClock => server.advance(TTL + Duration::from_secs(2)),
        Freeze::ForceRelease => second
            .locks()
            .force_release("nightly-report")
            .await
            .unwrap(),
        Freeze::LeaseClockAndServerClock => {
            clock.advance(TTL + Duration::from_secs(2));
            server.advance(TTL + Duration::from_secs(2));
        }
    }
    if matches!(freeze, Freeze::LeaseClockAndServerClock) {
        // Its own lease clock passed the deadline: the guard knows.
        assert!(held.is_lost());
    }
    let next = second.locks().hold("nightly-report", TTL).await.unwrap();
    let new = next.lease().fencing_token();
    assert!(new > old);
    write(&pool, &table, schema, "second", new).await.unwrap();

    // The first wakes up and writes with the fence it has.
    let refused = write(&pool, &table, schema, "first, after the freeze", old)
        .await
        .unwrap_err();
    assert!(refused.is_stale(), "{refused}");
    assert_eq!(refused.highest_seen(), Some(new));
    assert_eq!(row(&pool, schema).await, ("second".to_owned(), new));
    next.release().await.unwrap();
    drop(held);
    first.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn after_the_server_clock_passed_its_expiry() {
    frozen_holder_is_refused("frozen_clock", Freeze::ServerClock).await;
}

#[tokio::test]
async fn after_a_force_release() {
    frozen_holder_is_refused("frozen_forced", Freeze::ForceRelease).await;
}

#[tokio::test]
async fn after_a_suspend_of_the_holder() {
    frozen_holder_is_refused("frozen_suspend", Freeze::LeaseClockAndServerClock).await;
}

#[tokio::test]
async fn through_tokio_postgres() {
    let Some(pg) = Postgres::or_skip("through_tokio_postgres") else {
        return;
    };
    let (mut db, connection) = tokio_postgres::connect(pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute("DROP SCHEMA IF EXISTS frozen_tp CASCADE; CREATE SCHEMA frozen_tp; CREATE TABLE frozen_tp.report (id int PRIMARY KEY, fence bigint)")
        .await
        .unwrap();
    let table = Table::in_schema("frozen_tp").unwrap();
    volcano_fence::tokio_postgres::migrate_in(&db, &table)
        .await
        .unwrap();
    let server = MockServer::start().await;
    let client = Client::for_mock(&server);
    let old = client.locks().acquire("k", TTL).await.unwrap();
    server.advance(TTL + Duration::from_secs(2));
    let new = client.locks().acquire("k", TTL).await.unwrap();
    for (lease, accepted) in [(&new, true), (&old, false)] {
        let tx = db.transaction().await.unwrap();
        let fence = lease.fencing_token();
        let checked = volcano_fence::tokio_postgres::check_in(&tx, &table, "k", fence).await;
        assert_eq!(checked.is_ok(), accepted, "{checked:?}");
        if checked.is_ok() {
            tx.execute("INSERT INTO frozen_tp.report VALUES (1, $1)", &[&fence])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
    let row = db
        .query_one("SELECT fence FROM frozen_tp.report", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), new.fencing_token());
}
