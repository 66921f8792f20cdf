//! Retention of the backlog/hold tables, in bounded batches: dead-lettered jobs older than
//! `dlq_retention`, and unique keys older than `unique_key_retention` whose job is no longer pending
//! (a released key is re-taken by the next insert anyway; expiry only bounds the table).

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

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
    Ok(())
}
