//! Rescue: deadline rescue, then stale rescue, over every claim slot's cursors, closing at most
//! `rescue_batch` attempts per pass. A closed attempt goes back to retry (or to failed / the
//! dead-letter queue when its attempts are used up). Then timeout rescue of the attempts that wait
//! for a callback (the lease ring), which end the same way.

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    let (rescued, callbacks_waiting) = storage
        .rescue_and_callbacks_waiting(config.stale_after, config.rescue_batch)
        .await?;
    report.rescued = rescued;
    // waits for a callback past their timeout, on the lease side; a process that uses no
    // callbacks skips the statement
    if callbacks_waiting {
        report.callbacks_timed_out = storage.rescue_callbacks(config.rescue_batch).await?;
    }
    Ok(())
}
