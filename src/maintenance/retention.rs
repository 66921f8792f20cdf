//! Retention of the backlog/hold tables, in bounded batches: dead-lettered jobs older than
//! `dlq_retention`, and unique keys older than `unique_key_retention` whose job is no longer pending
//! (a released key is re-taken by the next insert anyway; expiry only bounds the table), and finished
//! workflows older than `keep_completed`; and the
//! archive's time buckets (archive search's with them), past `keep_completed` and `keep_failed`; and the folding of the
//! terminal totals' old time buckets.

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::{ArchiveTable, Storage};

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    report.dlq_expired = storage
        .dlq_expire(config.dlq_retention, config.promote_batch)
        .await?;
    report.unique_keys_expired = storage
        .unique_keys_expire(config.unique_key_retention, config.promote_batch)
        .await?;
    // finished workflows, kept as long as completed history
    report.workflows_expired = storage
        .workflow_expire(config.keep_completed, config.promote_batch)
        .await?;
    // the archive: whole time buckets, each truncated once its newest row is past its keep
    report.archive_buckets_truncated = storage
        .archive_expire(
            ArchiveTable::Completions,
            config.keep_completed,
            config.prune_lock_timeout,
        )
        .await?
        + storage
            .archive_expire(
                ArchiveTable::Jobs,
                config.keep_failed,
                config.prune_lock_timeout,
            )
            .await?
        + storage
            .archive_expire(
                ArchiveTable::CompletionsSearch,
                config.keep_completed,
                config.prune_lock_timeout,
            )
            .await?
        + storage
            .archive_expire(
                ArchiveTable::JobsSearch,
                config.keep_failed,
                config.prune_lock_timeout,
            )
            .await?;
    // the durable terminal totals: fold old time buckets into the current one
    report.totals_buckets_folded = storage
        .fold_terminal_totals(config.prune_lock_timeout)
        .await?;
    Ok(())
}
