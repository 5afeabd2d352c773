//! A worker frozen past its lease writes with its old fencing token, and
//! PostgreSQL refuses the write.
//!
//! Two workers share the nightly report on the in-process mock server. The
//! first takes the lock and writes; then it freezes (a long GC pause, a
//! stopped VM: here, the server's clock and its own lease clock jump past
//! the lease). The second takes over and writes. The first wakes up and
//! writes what it was about to: `volcano_fence` refuses it inside the
//! transaction, and the row keeps the second worker's report.
//!
//! ```text
//! DATABASE_URL=postgres://user@localhost/db cargo run -p volcano-fence \
//!     --features tokio-postgres,testing --example frozen_worker
//! ```
//!
//! Without `DATABASE_URL` it starts a throwaway PostgreSQL cluster from the
//! system's binaries. It creates schema `volcano_example` (and drops it
//! first if it exists).

use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use volcano::mock::MockServer;
use volcano::LeaseClock;
use volcano_fence::Table;

const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            println!("DATABASE_URL is not set: starting a throwaway PostgreSQL cluster");
            volcano_fence::testing::Postgres::shared()?.url().to_owned()
        }
    };
    let (mut db, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "DROP SCHEMA IF EXISTS volcano_example CASCADE;
         CREATE SCHEMA volcano_example;
         CREATE TABLE volcano_example.report (id int PRIMARY KEY, body text, fence bigint)",
    )
    .await?;
    let table = Table::in_schema("volcano_example")?;
    volcano_fence::tokio_postgres::migrate_in(&db, &table).await?;

    let server = MockServer::start().await;
    let frozen_clock = LeaseClock::adjustable();
    let first = volcano::Client::builder()
        .api_url(server.url())
        .service_key(server.service_key())
        .lease_clock(frozen_clock.clone())
        .build()?;
    let second = volcano::Client::for_mock(&server);

    let held = first.locks().hold("nightly-report", TTL).await?;
    let old = held.lease().fencing_token();
    write(&mut db, &table, "report by the first worker", old).await?;
    println!("first worker holds the lock (fence {old}) and wrote");

    println!("first worker freezes for 15 s (its lease is 10 s)...");
    frozen_clock.advance(Duration::from_secs(15));
    server.advance(Duration::from_secs(15));

    let next = second.locks().hold("nightly-report", TTL).await?;
    let new = next.lease().fencing_token();
    write(&mut db, &table, "report by the second worker", new).await?;
    println!("second worker took over (fence {new}) and wrote");

    println!("first worker wakes up and writes with fence {old}...");
    match write(&mut db, &table, "late report by the first worker", old).await {
        Err(err) if err.is_stale() => println!("  refused by PostgreSQL: {err}"),
        Err(err) => return Err(err.into()),
        Ok(()) => return Err("the stale write was accepted".into()),
    }
    let row = db
        .query_one(
            "SELECT body, fence FROM volcano_example.report WHERE id = 1",
            &[],
        )
        .await?;
    println!(
        "the row: body = {:?}, fence = {}",
        row.get::<_, String>(0),
        row.get::<_, i64>(1)
    );
    next.release().await?;
    drop(held);
    second.shutdown(Duration::from_secs(5)).await;
    first.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// The protected write: the fence check and the row in one transaction;
/// a refused check rolls it back.
async fn write(
    db: &mut Client,
    table: &Table,
    body: &str,
    fence: i64,
) -> Result<(), volcano_fence::Error> {
    let tx = db.transaction().await.expect("begin");
    volcano_fence::tokio_postgres::check_in(&tx, table, "nightly-report", fence).await?;
    tx.execute(
        "INSERT INTO volcano_example.report VALUES (1, $1, $2)
         ON CONFLICT (id) DO UPDATE SET body = $1, fence = $2",
        &[&body, &fence],
    )
    .await
    .expect("write the report");
    tx.commit().await.expect("commit");
    Ok(())
}
