//! Prune of both rings: the sealed slots, the two-phase prune that truncates a slot once its proof
//! holds, and what an operator reads about slots and the backends in prune's way
//! (`sql/functions/prune.sql`).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    sealed_queue_slots: String,
    sealed_claim_slots: String,
    prune_queue_slot: String,
    prune_claim_slot: String,
    ring_slots: String,
    prune_blockers: String,
    held_ring_slots: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            sealed_queue_slots: format!(
                "SELECT slot FROM {s}.queue_ring_slots WHERE state = 'sealed' ORDER BY generation"
            ),
            sealed_claim_slots: format!(
                "SELECT slot FROM {s}.claim_ring_slots WHERE state = 'sealed' ORDER BY generation"
            ),
            prune_queue_slot: format!(
                "SELECT {s}.prune_queue_slot($1, $2, make_interval(secs => $3), make_interval(secs => $4), \
                 make_interval(secs => $5))"
            ),
            prune_claim_slot: format!("SELECT {s}.prune_claim_slot($1, $2)"),
            ring_slots: format!(
                "SELECT ring, slot, generation, state, state_since, blocker FROM {s}.ring_slots()"
            ),
            prune_blockers: format!(
                "SELECT ring, slot, pid, application, backend_state, \
                 extract(epoch FROM xact_age)::float8 AS xact_age_secs, lock_modes, query \
                 FROM {s}.prune_blockers()"
            ),
            held_ring_slots: format!(
                "SELECT ring, slot FROM {s}.held_ring_slots(make_interval(secs => $1), \
                 make_interval(secs => $2))"
            ),
        }
    }
}

/// How a queue-slot prune treats what the slot still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSlotPrune {
    /// How long to wait for the slot's ACCESS EXCLUSIVE locks before giving up (`busy`).
    pub lock_timeout: Duration,
    /// Completion batches younger than this are archived (zero: none).
    pub keep_completed: Duration,
    /// Failed, cancelled and row-completed jobs younger than this are archived (zero: none).
    pub keep_failed: Duration,
    /// A slot held back only by unclaimed rows of lanes that are paused, or were not claimed from
    /// for this long, is reclaimed: those rows are parked (`sql/functions/parking.sql`) and come
    /// back, in order, with the lane's next claim or its queue's resume. `None` never parks.
    pub park_idle: Option<Duration>,
}

/// One slot of a ring, as `ringwork ring` shows it.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct RingSlot {
    /// `queue` or `claim`.
    pub ring: String,
    /// The slot's number in its ring.
    pub slot: i32,
    /// The ring generation the slot was last opened in (one higher at each rotation).
    pub generation: i64,
    /// `current`, `sealed` or `free`.
    pub state: String,
    /// When the slot's latest ledger event was appended; `None` for a slot with no event (free
    /// and never used: only seen in a snapshot older than a prune, or a database restored from one).
    pub state_since: Option<DateTime<Utc>>,
    /// For a sealed slot, why its prune proof fails now (`pending_ready`, `open_claims`); `None`
    /// when it is provable (a lock holder may still make the prune `busy`: [`PruneBlocker`]).
    pub blocker: Option<String>,
}

/// A backend holding a lock on a sealed slot's child or an archive bucket: what a prune (or an
/// archive expiry) gives up on as `busy`.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct PruneBlocker {
    /// `queue`, `claim`, `lease` (a lease ring child: what makes its rotation `busy`) or `archive`.
    pub ring: String,
    /// The slot, or the archive bucket, whose child it holds a lock on.
    pub slot: i32,
    /// The backend's pid.
    pub pid: i32,
    /// The backend's `application_name`.
    pub application: Option<String>,
    /// `pg_stat_activity.state` (`active`, `idle in transaction`, ...).
    pub backend_state: Option<String>,
    /// How long its transaction has been open, in seconds.
    pub xact_age_secs: Option<f64>,
    /// The lock modes it holds on those children, comma-separated.
    pub lock_modes: String,
    /// The start of its current or last statement.
    pub query: Option<String>,
}

/// Result of one prune attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PruneResult {
    /// The slot was truncated and freed.
    Pruned,
    /// Not pruned; the reason (`open_claims`, `pending_ready`, `busy`, `not_sealed`, and from the
    /// maintenance tick `held`: a long lock holder, so neither proof nor lock was tried).
    Skipped(String),
}

impl Storage {
    /// Every slot of both rings, with the reason a sealed one cannot be pruned yet.
    pub async fn ring_slots(&self) -> Result<Vec<RingSlot>> {
        Ok(sqlx::query_as(&self.sql.prune.ring_slots)
            .fetch_all(self.db())
            .await?)
    }

    /// The backends whose locks keep prune from sealed slots or retention from archive buckets,
    /// longest-open transaction first.
    pub async fn prune_blockers(&self) -> Result<Vec<PruneBlocker>> {
        Ok(sqlx::query_as(&self.sql.prune.prune_blockers)
            .fetch_all(self.db())
            .await?)
    }

    /// The queue and claim slots (`("queue", 3)`) that another backend holds a lock on while idle
    /// in its transaction for at least `idle`, or with a transaction open at least `open`: a
    /// prune of these would only wait out its lock timeout (`sql/functions/prune.sql`,
    /// `held_ring_slots`).
    pub async fn held_ring_slots(
        &self,
        idle: Duration,
        open: Duration,
    ) -> Result<Vec<(String, i32)>> {
        Ok(sqlx::query_as(&self.sql.prune.held_ring_slots)
            .bind(idle.as_secs_f64())
            .bind(open.as_secs_f64())
            .fetch_all(self.db())
            .await?)
    }

    /// The queue ring's sealed slots, oldest generation first.
    pub async fn sealed_queue_slots(&self) -> Result<Vec<i32>> {
        Ok(sqlx::query_scalar(&self.sql.prune.sealed_queue_slots)
            .fetch_all(self.db())
            .await?)
    }

    /// The claim ring's sealed slots, oldest generation first.
    pub async fn sealed_claim_slots(&self) -> Result<Vec<i32>> {
        Ok(sqlx::query_scalar(&self.sql.prune.sealed_claim_slots)
            .fetch_all(self.db())
            .await?)
    }

    /// Try to reclaim one sealed queue-ring slot (ARCHITECTURE §5), archiving its failed and
    /// cancelled jobs younger than `keep_failed`; completions are not archived and nothing is
    /// parked (a slot with unclaimed rows is kept: `pending_ready`). The maintenance tick uses
    /// [`Storage::prune_queue_slot_with`].
    pub async fn prune_queue_slot(
        &self,
        slot: i32,
        lock_timeout: Duration,
        keep_failed: Duration,
    ) -> Result<PruneResult> {
        let options = QueueSlotPrune {
            lock_timeout,
            keep_completed: Duration::ZERO,
            keep_failed,
            park_idle: None,
        };
        self.prune_queue_slot_with(slot, &options).await
    }

    /// Try to reclaim one sealed queue-ring slot (ARCHITECTURE §5, storage.md section 11): archive
    /// its terminal history, park the unclaimed rows of cold lanes, truncate it. Two transactions:
    /// the archive copy first, under ACCESS SHARE ([`Storage::archive_queue_slot_ahead`]), then the
    /// prune under ACCESS EXCLUSIVE, which copies only what arrived in between.
    pub async fn prune_queue_slot_with(
        &self,
        slot: i32,
        options: &QueueSlotPrune,
    ) -> Result<PruneResult> {
        let ahead = self.archive_queue_slot_ahead(slot, options).await?;
        tracing::debug!(slot, ahead, "queue slot archived ahead of its prune");
        if ahead == "not_sealed" || ahead == "open_claims" {
            // the prune's own proof would fail the same way (a pending_ready slot may be parked)
            return Ok(PruneResult::Skipped(ahead));
        }
        let result: String = sqlx::query_scalar(&self.sql.prune.prune_queue_slot)
            .bind(slot)
            .bind(format!("{}ms", options.lock_timeout.as_millis().max(1)))
            .bind(options.keep_completed.as_secs_f64())
            .bind(options.keep_failed.as_secs_f64())
            .bind(options.park_idle.map(|d| d.as_secs_f64()))
            .fetch_one(self.db())
            .await?;
        Ok(prune_result(result))
    }

    /// Try to reclaim one sealed claim-ring slot (ADR-023 prune order).
    pub async fn prune_claim_slot(&self, slot: i32, lock_timeout: Duration) -> Result<PruneResult> {
        let result: String = sqlx::query_scalar(&self.sql.prune.prune_claim_slot)
            .bind(slot)
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?;
        Ok(prune_result(result))
    }
}

fn prune_result(text: String) -> PruneResult {
    if text == "pruned" {
        PruneResult::Pruned
    } else {
        PruneResult::Skipped(text)
    }
}
