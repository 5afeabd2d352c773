//! The one rule for resource names, in memory and in PostgreSQL.

use crate::error::Error;

/// The longest resource name, in bytes: well inside a PostgreSQL btree
/// entry, and far above any lock key (128 characters).
pub const MAX_RESOURCE_BYTES: usize = 2048;

/// The one rule for resource names, in memory and in PostgreSQL: any
/// UTF-8 that is not empty, has no NUL (PostgreSQL text cannot hold one)
/// and fits [`MAX_RESOURCE_BYTES`].
pub(crate) fn check_resource(resource: &str) -> Result<(), Error> {
    if resource.is_empty() {
        return Err(Error::invalid_resource("it is empty"));
    }
    if resource.len() > MAX_RESOURCE_BYTES {
        return Err(Error::invalid_resource("it is longer than 2048 bytes"));
    }
    if resource.contains('\0') {
        return Err(Error::invalid_resource(
            "it contains a NUL character, which PostgreSQL text cannot hold",
        ));
    }
    Ok(())
}
