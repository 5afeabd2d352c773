//! What the fence check costs: a one-row UPDATE transaction with and
//! without `check` before the UPDATE, side by side on one PostgreSQL
//! server (the throwaway cluster of `volcano_fence::testing`, or
//! `VOLCANO_TEST_PG_URL`), through tokio-postgres and through sqlx.
//! The modes take turns transaction by transaction (in a rotating order),
//! each transaction timed on its own, so that a machine whose speed drifts
//! slows every mode alike; prints the median per transaction and the ratio
//! to the plain transaction.
//!
//! `cargo bench -p volcano-fence --all-features --bench check`

use std::time::{Duration, Instant};

use sqlx::{Connection, Executor};
use tokio_postgres::NoTls;
use volcano_fence::testing::Postgres;

/// Transactions timed per mode, after `WARM_UP` untimed turns.
const SAMPLES: usize = 8_000;
const WARM_UP: usize = 500;

fn median_us(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e6
}

/// Prints each mode's median against the first's (the plain transaction).
fn report(driver: &str, names: &[&str], times: Vec<Vec<Duration>>) {
    let medians: Vec<f64> = times.into_iter().map(median_us).collect();
    for (name, t) in names.iter().zip(&medians) {
        println!("  {driver}, {name}: {t:.1} µs: {:.3}×", t / medians[0]);
    }
}

/// The order of turn `turn`: every mode once, starting one further on.
fn turns(turn: usize, modes: usize) -> impl Iterator<Item = usize> {
    (0..modes).map(move |k| (turn + k) % modes)
}

async fn tokio_postgres_rounds(url: &str) {
    let (mut db, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let mut settings = Vec::new();
    for name in ["server_version", "fsync", "synchronous_commit"] {
        let row = db.query_one(&format!("SHOW {name}"), &[]).await.unwrap();
        settings.push(format!("{name} {}", row.get::<_, String>(0)));
    }
    println!("  server: {}", settings.join(", "));
    db.batch_execute(
        "DROP SCHEMA IF EXISTS bench_tp CASCADE; CREATE SCHEMA bench_tp;
         CREATE TABLE bench_tp.item (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO bench_tp.item VALUES (1, 0)",
    )
    .await
    .unwrap();
    let table = volcano_fence::Table::in_schema("bench_tp").unwrap();
    volcano_fence::tokio_postgres::migrate_in(&db, &table)
        .await
        .unwrap();
    let update = db
        .prepare("UPDATE bench_tp.item SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    // The per-row recipe: the fence on the protected row itself.
    db.batch_execute("ALTER TABLE bench_tp.item ADD COLUMN fence bigint NOT NULL DEFAULT 0")
        .await
        .unwrap();
    let per_row = db
        .prepare("UPDATE bench_tp.item SET n = n + 1, fence = $1 WHERE id = 1 AND fence <= $1")
        .await
        .unwrap();
    let fences = volcano_fence::tokio_postgres::Fences::prepare(&db, &table)
        .await
        .unwrap();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); 6];
    let mut fence = 0_i64;
    for turn in 0..WARM_UP + SAMPLES {
        for mode in turns(turn, times.len()) {
            let start = Instant::now();
            let tx = db.transaction().await.unwrap();
            fence += 1;
            match mode {
                0 => {
                    tx.execute(&update, &[]).await.unwrap();
                }
                1 => {
                    volcano_fence::tokio_postgres::check_in(&tx, &table, "item-1", fence)
                        .await
                        .unwrap();
                    tx.execute(&update, &[]).await.unwrap();
                }
                2 => {
                    // Pipelined: both sent at once; the server runs the
                    // check first. A stale check aborts the whole
                    // transaction, the UPDATE with it.
                    let (checked, updated) = tokio::join!(
                        volcano_fence::tokio_postgres::check_in(&tx, &table, "item-1", fence),
                        tx.execute(&update, &[])
                    );
                    checked.unwrap();
                    updated.unwrap();
                }
                3 => {
                    fences.check(&tx, "item-1", fence).await.unwrap();
                    tx.execute(&update, &[]).await.unwrap();
                }
                4 => {
                    let (checked, updated) =
                        tokio::join!(fences.check(&tx, "item-1", fence), tx.execute(&update, &[]));
                    checked.unwrap();
                    updated.unwrap();
                }
                _ => {
                    let updated = tx.execute(&per_row, &[&fence]).await.unwrap();
                    assert_eq!(updated, 1);
                }
            }
            tx.commit().await.unwrap();
            if turn >= WARM_UP {
                times[mode].push(start.elapsed());
            }
        }
    }
    report(
        "tokio-postgres",
        &[
            "plain UPDATE transaction",
            "check_in, then the UPDATE",
            "check_in pipelined with the UPDATE",
            "Fences::check (prepared), then the UPDATE",
            "Fences::check pipelined with the UPDATE",
            "per-row recipe (no check)",
        ],
        times,
    );
}

async fn sqlx_rounds(url: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    conn.execute(
        "DROP SCHEMA IF EXISTS bench_sqlx CASCADE; CREATE SCHEMA bench_sqlx;
         CREATE TABLE bench_sqlx.item (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO bench_sqlx.item VALUES (1, 0)",
    )
    .await
    .unwrap();
    let table = volcano_fence::Table::in_schema("bench_sqlx").unwrap();
    volcano_fence::sqlx::migrate_on(&mut conn, &table)
        .await
        .unwrap();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); 3];
    let mut fence = 0_i64;
    let update = "UPDATE bench_sqlx.item SET n = n + 1 WHERE id = 1";
    for turn in 0..WARM_UP + SAMPLES {
        for mode in turns(turn, times.len()) {
            fence += 1;
            let start = Instant::now();
            let mut tx = match mode {
                0 => conn.begin().await.unwrap(),
                1 => {
                    let mut tx = conn.begin().await.unwrap();
                    volcano_fence::sqlx::check_in(&mut tx, &table, "item-1", fence)
                        .await
                        .unwrap();
                    tx
                }
                // The check sent with the BEGIN, in one round trip.
                _ => volcano_fence::sqlx::begin_in(&mut conn, &table, "item-1", fence)
                    .await
                    .unwrap(),
            };
            sqlx::query(update).execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
            if turn >= WARM_UP {
                times[mode].push(start.elapsed());
            }
        }
    }
    report(
        "sqlx",
        &[
            "plain UPDATE transaction",
            "check_in, then the UPDATE",
            "begin_in (the check sent with the BEGIN), then the UPDATE",
        ],
        times,
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pg = Postgres::shared().expect("a PostgreSQL server for the benchmark");
    println!(
        "fence check cost: {SAMPLES} transactions per mode, the modes taking turns; median per transaction"
    );
    tokio_postgres_rounds(pg.url()).await;
    sqlx_rounds(pg.url()).await;
}
