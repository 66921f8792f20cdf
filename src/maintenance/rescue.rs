//! Rescue: deadline rescue, then stale rescue, over every claim slot's cursors, closing at most
//! `rescue_batch` attempts per pass. A closed attempt goes back to retry (or to failed / the
//! dead-letter queue when its attempts are used up).

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    report.rescued = storage
        .rescue(config.stale_after, config.rescue_batch)
        .await?;
    Ok(())
}
