//! What the fence check costs: a one-row UPDATE transaction with and
//! without `check` before the UPDATE, side by side on one PostgreSQL
//! server (the throwaway cluster of `volcano_fence::testing`, or
//! `VOLCANO_TEST_PG_URL`), through tokio-postgres and through sqlx.
//! Interleaved rounds; each round times `TX` transactions run one after
//! another on one connection. Prints the median time per transaction and
//! the ratio.
//!
//! `cargo bench -p volcano-fence --all-features --bench check`

use std::time::{Duration, Instant};

use sqlx::{Connection, Executor};
use tokio_postgres::NoTls;
use volcano_fence::testing::Postgres;

const ROUNDS: usize = 7;
const TX: u32 = 2_000;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn per_tx(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(TX)
}

fn report(driver: &str, plain: Vec<Duration>, fenced: Vec<Duration>) {
    let (p, f) = (per_tx(median(plain)), per_tx(median(fenced)));
    println!(
        "{driver}: UPDATE transaction {p:.1} µs, with check {f:.1} µs: {:.3}×",
        f / p
    );
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
    let mut times: [Vec<Duration>; 6] = Default::default();
    let mut fence = 0_i64;
    for round in 0..=ROUNDS {
        for (mode, spent) in times.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..TX {
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
                        // check first. A stale check rolls the whole
                        // transaction back, the UPDATE with it.
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
                        let (checked, updated) = tokio::join!(
                            fences.check(&tx, "item-1", fence),
                            tx.execute(&update, &[])
                        );
                        checked.unwrap();
                        updated.unwrap();
                    }
                    _ => {
                        let updated = tx.execute(&per_row, &[&fence]).await.unwrap();
                        assert_eq!(updated, 1);
                    }
                }
                tx.commit().await.unwrap();
            }
            // Round 0 warms up.
            if round > 0 {
                spent.push(start.elapsed());
            }
        }
    }
    let [plain, fenced, pipelined, prepared, prepared_pipelined, per_row] = times;
    let base = per_tx(median(plain.clone()));
    for (name, spent) in [
        ("check, pipelined with the UPDATE", pipelined),
        ("Fences (prepared) check", prepared),
        ("Fences check, pipelined", prepared_pipelined),
        ("per-row recipe (no check)", per_row),
    ] {
        let t = per_tx(median(spent));
        println!("  tokio-postgres, {name}: {t:.1} µs: {:.3}×", t / base);
    }
    report("tokio-postgres", plain, fenced);
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
    let (mut plain, mut fenced) = (Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        for with_check in [false, true] {
            let start = Instant::now();
            for i in 0..TX {
                let mut tx = conn.begin().await.unwrap();
                if with_check {
                    let fence = i64::from(i);
                    volcano_fence::sqlx::check_in(&mut tx, &table, "item-1", fence)
                        .await
                        .unwrap();
                }
                sqlx::query("UPDATE bench_sqlx.item SET n = n + 1 WHERE id = 1")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            if round > 0 {
                if with_check { &mut fenced } else { &mut plain }.push(start.elapsed());
            }
        }
        conn.execute("TRUNCATE bench_sqlx.volcano_fences")
            .await
            .unwrap();
    }
    report("sqlx", plain, fenced);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pg = Postgres::shared().expect("a PostgreSQL server for the benchmark");
    println!(
        "fence check cost: {ROUNDS} interleaved rounds of {TX} sequential transactions each, median per transaction"
    );
    tokio_postgres_rounds(pg.url()).await;
    sqlx_rounds(pg.url()).await;
}
