//! The archive: terminal history kept after its queue slot is pruned, in two rings of time buckets
//! (`sql/functions/archive.sql`). Prune appends to it; this module reclaims it.

use std::time::Duration;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    archive_expire: String,
    fold_terminal_totals: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            archive_expire: format!("SELECT {s}.archive_expire($1, make_interval(secs => $2), $3)"),
            fold_terminal_totals: format!("SELECT {s}.fold_terminal_totals($1)"),
        }
    }
}

/// One of the two archive tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArchiveTable {
    /// `archived_completion_batches`: one row per completion batch, kept `keep_completed`.
    Completions,
    /// `archived_jobs`: failed, cancelled and row-completed jobs, kept `keep_failed`.
    Jobs,
}

impl ArchiveTable {
    fn as_str(self) -> &'static str {
        match self {
            ArchiveTable::Completions => "completions",
            ArchiveTable::Jobs => "jobs",
        }
    }
}

impl Storage {
    /// Truncate every bucket of `table` (other than the current one) whose newest row is older
    /// than `keep`. A bucket whose lock is not granted within `lock_timeout` is left for the next
    /// call. Returns the number of buckets truncated.
    pub async fn archive_expire(
        &self,
        table: ArchiveTable,
        keep: Duration,
        lock_timeout: Duration,
    ) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.archive.archive_expire)
            .bind(table.as_str())
            .bind(keep.as_secs_f64())
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?)
    }

    /// Fold every terminal-totals bucket but the current one into the current one (one row per
    /// queue) and truncate it, so the durable totals stay a handful of rows per queue. A bucket
    /// whose lock is not granted within `lock_timeout` is left for the next call. Returns the
    /// number of buckets folded.
    pub async fn fold_terminal_totals(&self, lock_timeout: Duration) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.archive.fold_terminal_totals)
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?)
    }
}
