//! The archive: terminal history kept after its queue slot is pruned, in two rings of time buckets
//! (`sql/functions/archive.sql`). A sealed queue slot is archived ahead of its prune, under ACCESS
//! SHARE locks only; prune appends whatever arrived since. This module also reclaims it.

use std::time::Duration;

use super::{QueueSlotPrune, Storage};
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    archive_queue_slot_ahead: String,
    archive_expire: String,
    fold_terminal_totals: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            archive_queue_slot_ahead: format!(
                "SELECT {s}.archive_queue_slot_ahead($1, $2, make_interval(secs => $3), \
                 make_interval(secs => $4))"
            ),
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
    /// Copy a sealed queue slot's terminal history to the archive ahead of its prune (migration
    /// 0016), holding only ACCESS SHARE on the slot's children, so that claims, completions and
    /// readers go on meanwhile and the prune's ACCESS EXCLUSIVE locks are held for a count and a
    /// TRUNCATE rather than for the copy. [`Storage::prune_queue_slot_with`] calls it first.
    /// Returns `copied`, `up_to_date`, `not_sealed`, the slot's prune blocker (`pending_ready`,
    /// `open_claims`: such a slot is left to prune), or `busy`.
    pub async fn archive_queue_slot_ahead(
        &self,
        slot: i32,
        options: &QueueSlotPrune,
    ) -> Result<String> {
        Ok(
            sqlx::query_scalar(&self.sql.archive.archive_queue_slot_ahead)
                .bind(slot)
                .bind(format!("{}ms", options.lock_timeout.as_millis().max(1)))
                .bind(options.keep_completed.as_secs_f64())
                .bind(options.keep_failed.as_secs_f64())
                .fetch_one(self.db())
                .await?,
        )
    }

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
