//! The optional quota: lock operations per fixed one-minute window on the
//! server clock, and the 429 `lock_rate_limited` (with `Retry-After`) that
//! refuses a request past it.

use std::sync::Mutex;

use axum::http::{header, HeaderValue, StatusCode};
use chrono::{DateTime, Utc};

use crate::reject::Reject;
use crate::sync::lock_unpoisoned;

/// The optional quota: lock operations per fixed one-minute window, on the
/// server clock.
pub(crate) struct Quota {
    limit: Option<u32>,
    window: Mutex<Window>,
}

/// The current window and what it has used.
#[derive(Default)]
struct Window {
    window: i64,
    used: u32,
}

impl Quota {
    /// Allows `limit` operations per window; `None` allows any number.
    pub(crate) fn new(limit: Option<u32>) -> Self {
        Quota {
            limit,
            window: Mutex::new(Window::default()),
        }
    }

    /// Counts one operation at the time `now` reads (read only when there
    /// is a limit); `Err(retry_after_secs)` once the window is full.
    pub(crate) fn take(&self, now: impl FnOnce() -> DateTime<Utc>) -> Result<(), i64> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let now = now();
        let window = now.timestamp().div_euclid(60);
        let mut quota = lock_unpoisoned(&self.window);
        if quota.window != window {
            *quota = Window { window, used: 0 };
        }
        if quota.used >= limit {
            return Err(60 - now.timestamp().rem_euclid(60));
        }
        quota.used += 1;
        Ok(())
    }

    /// Forgets the current window.
    pub(crate) fn clear(&self) {
        *lock_unpoisoned(&self.window) = Window::default();
    }
}

/// The refusal past the quota: 429 `lock_rate_limited`, retry after this
/// many seconds.
pub(crate) fn rate_limited(retry_after: i64) -> Reject {
    Reject::new(StatusCode::TOO_MANY_REQUESTS, "lock request limit exceeded")
        .code("lock_rate_limited")
        .header(header::RETRY_AFTER, HeaderValue::from(retry_after))
}
