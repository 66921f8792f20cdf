//! Prune: every sealed slot whose proof passes is truncated, not only the oldest, so that one pinned
//! slot does not stall the ring (ARCHITECTURE §5). Each prune skips a busy slot after
//! `prune_lock_timeout` instead of queueing hot reads behind its ACCESS EXCLUSIVE lock, and a slot
//! that a long transaction holds a lock on is not tried at all (`held`).

use std::time::Duration;

use tracing::debug;

use super::{MaintenanceConfig, TickReport};
use crate::error::Result;
use crate::storage::{PruneResult, QueueSlotPrune, Storage};

/// A lock holder idle in its transaction this long, or with it open this long, is taken to stay
/// for longer than a prune's lock timeout. The hot path runs single statements of a few
/// milliseconds, so it never looks held; readers that end a transaction every second or two are
/// not held either, because a prune that tries every tick gets in between them (with 1 s for
/// both bounds, prunes behind two such readers fell from 71 to 26 in ten minutes).
const HELD_IDLE: Duration = Duration::from_secs(1);
const HELD_OPEN: Duration = Duration::from_secs(10);

pub(super) async fn run(
    storage: &Storage,
    config: &MaintenanceConfig,
    report: &mut TickReport,
) -> Result<()> {
    let claim_slots = storage.sealed_claim_slots().await?;
    let queue_slots = storage.sealed_queue_slots().await?;
    if claim_slots.is_empty() && queue_slots.is_empty() {
        return Ok(());
    }
    // One look at pg_locks per tick. A slot whose children a long transaction holds (pg_dump, a
    // report) would fail its lock attempt after the proofs had run; with the ring grown behind
    // such a reader, those proofs cost over 100 ms a slot, every slot, every tick.
    let held = storage.held_ring_slots(HELD_IDLE, HELD_OPEN).await?;
    let is_held = |ring: &str, slot: i32| held.iter().any(|(r, s)| r == ring && *s == slot);
    // Once a ring's lock attempt times out, the rest of that ring's slots wait for the next tick
    // (`after_busy`). Whoever held the first slot (a reader between transactions, say) most
    // likely holds the others too, and each further attempt would cost its proof (100 ms and more
    // in a grown ring) and queue every claim and completion behind its ACCESS EXCLUSIVE request
    // for up to prune_lock_timeout: the hot path's generic plans lock every child of the parent.
    let mut claim_busy = false;
    for slot in claim_slots {
        if is_held("claim", slot) {
            report.prune_skips.push(("claim", "held".into()));
            continue;
        }
        if claim_busy {
            report.prune_skips.push(("claim", "after_busy".into()));
            continue;
        }
        match storage
            .prune_claim_slot(slot, config.prune_lock_timeout)
            .await?
        {
            PruneResult::Pruned => report.pruned_claim_slots.push(slot),
            PruneResult::Skipped(reason) => {
                debug!(slot, reason, "claim slot kept");
                claim_busy |= reason == "busy";
                report.prune_skips.push(("claim", reason));
            }
        }
    }
    let mut queue_busy = false;
    for slot in queue_slots {
        if is_held("queue", slot) {
            report.prune_skips.push(("queue", "held".into()));
            continue;
        }
        if queue_busy {
            report.prune_skips.push(("queue", "after_busy".into()));
            continue;
        }
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
                queue_busy |= reason == "busy";
                report.prune_skips.push(("queue", reason));
            }
        }
    }
    Ok(())
}
