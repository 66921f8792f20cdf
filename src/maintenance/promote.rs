//! Promotion: due scheduled and retryable jobs move from `deferred_jobs` to the queue ring at a new
//! lane position, `promote_batch` per statement, until none is due; the last statement also says
//! when the next deferred job is due, which paces the next promotion (runner.rs).

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    loop {
        let (moved, next) = storage.promote_due_next(config.promote_batch).await?;
        report.promoted += moved;
        report.next_promotion_in = next;
        if moved < config.promote_batch {
            return Ok(());
        }
    }
}
