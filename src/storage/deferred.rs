//! Deferred jobs: promotion of due `deferred_jobs` to the queue ring, and making a queue's
//! scheduled jobs due now (`sql/functions/deferred.sql`). Ordinary row vacuum, off the hot path.

use std::time::Duration;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    promote_due: String,
    promote_due_next: String,
    run_deferred_now: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            promote_due: format!("SELECT {s}.promote_due($1)"),
            promote_due_next: format!(
                "SELECT promoted, extract(epoch FROM next_due_in)::float8 \
                 FROM {s}.promote_due_next($1)"
            ),
            run_deferred_now: format!("SELECT {s}.run_deferred_now($1)"),
        }
    }
}

impl Storage {
    /// Move up to `limit` due `deferred_jobs` to ready. Returns how many moved.
    pub async fn promote_due(&self, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.deferred.promote_due)
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }

    /// [`Storage::promote_due`], and how long until the earliest deferred job left is due (zero:
    /// some are due already; `None`: none waits).
    pub async fn promote_due_next(&self, limit: i32) -> Result<(i32, Option<Duration>)> {
        let (moved, next): (i32, Option<f64>) = sqlx::query_as(&self.sql.deferred.promote_due_next)
            .bind(limit)
            .fetch_one(self.db())
            .await?;
        Ok((moved, next.map(seconds)))
    }
    /// Make the queue's scheduled and retryable jobs due now; the next promotion moves them to
    /// ready. Returns how many were made due.
    pub async fn run_deferred_now(&self, queue: &str) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.deferred.run_deferred_now)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }
}

/// A server interval in seconds as a wait: at least zero, and a job held until the year 9999
/// (`deferred.sql`) waits about 250 billion seconds, well within `Duration`.
pub(super) fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.0, 1e12))
}
