//! Rotation: each ring moves its write slot to a free slot once the current one is older than
//! `rotate_interval` and holds something. A slot pinned by live data stays sealed and does not stop
//! rotation; with no free slot the current slot keeps growing. The lease ring rotates on the same
//! clock, taking its oldest slot as it goes (sql/functions/callbacks.sql).

use std::time::Duration;

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::Storage;

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    // one read says whether any of the three could move; an idle ring costs that read alone
    report.rotation_due_in = storage.rotation_due(config.rotate_interval).await?;
    if report.rotation_due_in != Some(Duration::ZERO) {
        report.lease_ring = "not due".into();
        return Ok(());
    }
    report.rotated_queue = storage.rotate_queue_ring(config.rotate_interval).await?;
    report.rotated_claim = storage.rotate_claim_ring(config.rotate_interval).await?;
    // the lease ring: its oldest slot's live leases move forward, the rest is truncated
    report.lease_ring = storage
        .rotate_lease_ring(config.rotate_interval, config.prune_lock_timeout)
        .await?;
    Ok(())
}
