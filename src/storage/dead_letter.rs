//! The dead-letter queue: list, retry, purge and retention of `dlq_entries`
//! (`sql/functions/dead_letter.sql`). Ordinary row vacuum, off the hot path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    dlq_list: String,
    dlq_retry: String,
    dlq_purge: String,
    dlq_expire: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            dlq_list: format!(
                "SELECT job_id, queue, kind, left(args::text, {cut}) AS args, attempt, run_lease,
                        left(error, {detail}) AS error, failed_at FROM {s}.dlq_entries
                 WHERE $1::text IS NULL OR queue = $1 ORDER BY failed_at, job_id LIMIT $2",
                cut = super::read::ARGS_PREVIEW_CHARS + 1,
                detail = super::read::LIST_DETAIL_CHARS
            ),
            dlq_retry: format!("SELECT {s}.dlq_retry($1)"),
            dlq_purge: format!(
                "WITH gone AS (DELETE FROM {s}.dlq_entries WHERE ($1::text IS NULL OR queue = $1)
                   AND ($2::int8 IS NULL OR job_id = $2) RETURNING 1) SELECT count(*)::int8 FROM gone"
            ),
            dlq_expire: format!("SELECT {s}.dlq_expire(make_interval(secs => $1), $2)"),
        }
    }
}

/// A dead-lettered job.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The job's id.
    pub job_id: i64,
    /// The queue it was in.
    pub queue: String,
    /// The job's kind.
    pub kind: String,
    /// The JSON text of the job's arguments, cut like a listing's (`ListedJob::args`): a
    /// dead-letter queue holds jobs that failed, some of them because their arguments could not
    /// be decoded.
    pub args: String,
    /// Attempts it used.
    pub attempt: i32,
    /// The run lease of its last attempt.
    pub run_lease: i64,
    /// The error that ended it, cut to `LIST_DETAIL_CHARS` characters; `None` if none was kept.
    pub error: Option<String>,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
}

impl Storage {
    /// Dead-lettered jobs, oldest failure first.
    pub async fn dlq_list(&self, queue: Option<&str>, limit: i64) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(&self.sql.dead_letter.dlq_list)
            .bind(queue)
            .bind(limit)
            .fetch_all(self.db())
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetter {
                    job_id: r.try_get("job_id")?,
                    queue: r.try_get("queue")?,
                    kind: r.try_get("kind")?,
                    args: super::read::preview(r.try_get("args")?),
                    attempt: r.try_get("attempt")?,
                    run_lease: r.try_get("run_lease")?,
                    error: r.try_get("error")?,
                    failed_at: r.try_get("failed_at")?,
                })
            })
            .collect()
    }
    /// Move a dead-lettered job back to run now with fresh attempts. False when it is not in the
    /// DLQ (already retried, purged, or never there).
    pub async fn dlq_retry(&self, job_id: i64) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.dead_letter.dlq_retry)
            .bind(job_id)
            .fetch_one(self.db())
            .await?)
    }
    /// Delete dead-lettered jobs: one (`job_id`), a queue's, or all. Returns how many.
    pub async fn dlq_purge(&self, queue: Option<&str>, job_id: Option<i64>) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.dead_letter.dlq_purge)
            .bind(queue)
            .bind(job_id)
            .fetch_one(self.db())
            .await?)
    }
    /// Retention: delete up to `limit` DLQ rows older than `keep`.
    pub async fn dlq_expire(&self, keep: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.dead_letter.dlq_expire)
            .bind(keep.as_secs_f64())
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }
}
