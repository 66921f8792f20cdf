//! Prune: every sealed slot whose proof passes is truncated, not only the oldest, so that one pinned
//! slot does not stall the ring (ARCHITECTURE §5). Each prune skips a busy slot after
//! `prune_lock_timeout` instead of queueing hot reads behind its ACCESS EXCLUSIVE lock.

use tracing::debug;

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::{PruneResult, QueueSlotPrune, Storage};

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    for slot in storage.sealed_claim_slots().await? {
        match storage
            .prune_claim_slot(slot, config.prune_lock_timeout)
            .await?
        {
            PruneResult::Pruned => report.pruned_claim_slots.push(slot),
            PruneResult::Skipped(reason) => {
                debug!(slot, reason, "claim slot kept");
                report.prune_skips.push(("claim", reason));
            }
        }
    }
    for slot in storage.sealed_queue_slots().await? {
        match storage
            .prune_queue_slot_with(
                slot,
                &QueueSlotPrune {
                    lock_timeout: config.prune_lock_timeout,
                    keep_completed: config.keep_completed,
                    keep_failed: config.keep_failed,
                    park_idle: config.park_idle,
                },
            )
            .await?
        {
            PruneResult::Pruned => report.pruned_queue_slots.push(slot),
            PruneResult::Skipped(reason) => {
                debug!(slot, reason, "queue slot kept");
                report.prune_skips.push(("queue", reason));
            }
        }
    }
    Ok(())
}
