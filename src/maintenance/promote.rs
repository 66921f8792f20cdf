//! Promotion: due scheduled and retryable jobs move from `deferred_jobs` to the queue ring at a new
//! lane position, `promote_batch` per statement, until none is due.

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    loop {
        let moved = storage.promote_due(config.promote_batch).await?;
        report.promoted += moved;
        if moved < config.promote_batch {
            return Ok(());
        }
    }
}
