//! Deferred jobs: promotion of due `deferred_jobs` to the queue ring, and making a queue's
//! scheduled jobs due now (`sql/functions/deferred.sql`). Ordinary row vacuum, off the hot path.

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    promote_due: String,
    run_deferred_now: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            promote_due: format!("SELECT {s}.promote_due($1)"),
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
    /// Make the queue's scheduled and retryable jobs due now; the next promotion moves them to
    /// ready. Returns how many were made due.
    pub async fn run_deferred_now(&self, queue: &str) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.deferred.run_deferred_now)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }
}
