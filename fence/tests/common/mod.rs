//! What the PostgreSQL test binaries share.

use sqlx::PgPool;
use volcano_fence::{sqlx as fence, Table};

/// One transaction: check `fence` on `resource`, then commit (or roll back
/// when refused).
pub(crate) async fn checked(
    pool: &PgPool,
    table: &Table,
    resource: &str,
    fence: i64,
) -> Result<(), volcano_fence::Error> {
    let mut tx = pool.begin().await.unwrap();
    let result = fence::check_in(&mut tx, table, resource, fence).await;
    match result {
        Ok(()) => tx.commit().await.unwrap(),
        Err(_) => tx.rollback().await.unwrap(),
    }
    result
}
