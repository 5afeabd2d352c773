//! The fence's public types cross tasks and threads (checked when this
//! compiles): a writer shares one `Gate` or one prepared `Fences` among its
//! tasks, and an error travels to whoever reports it.

use std::fmt::Debug;

fn shared<T: Send + Sync + Debug + 'static>() {}
fn shared_clone<T: Send + Sync + Debug + Clone + 'static>() {}

#[test]
fn public_types_cross_threads() {
    shared_clone::<volcano_fence::Gate>();
    shared::<volcano_fence::Entered>();
    shared_clone::<volcano_fence::Table>();
    shared::<volcano_fence::Error>();
    #[cfg(feature = "tokio-postgres")]
    shared::<volcano_fence::tokio_postgres::Fences>();
    #[cfg(feature = "testing")]
    {
        shared::<volcano_fence::testing::Postgres>();
        shared_clone::<volcano_fence::testing::Unavailable>();
    }
}
