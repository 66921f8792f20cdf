//! The maintenance leader: one process per schema, elected by a session advisory lock, rotates the
//! queue and claim rings, prunes sealed slots whose proofs pass, and promotes due deferred jobs.
//!
//! Leadership is held on a dedicated connection. If that connection dies the lock dies with it and
//! another process takes over on its next tick; nothing maintenance does is unsafe to run twice.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::storage::{PruneResult, Storage};

#[derive(Clone, Debug)]
pub struct MaintenanceConfig {
    /// Run maintenance in this process when elected (default true).
    pub enabled: bool,
    /// Time between maintenance ticks.
    pub tick: Duration,
    /// Minimum age of a ring's current slot before it rotates (default 5 s). Each rotation and
    /// each prune rewrites a slot control row (`queue_ring_slots`, `claim_ring_slots`), so a short
    /// interval leaves more dead control tuples for autovacuum; a long one keeps more history in
    /// each slot and reclaims it later.
    pub rotate_interval: Duration,
    /// How long prune waits for its ACCESS EXCLUSIVE locks before skipping a slot this tick.
    pub prune_lock_timeout: Duration,
    /// Most deferred jobs promoted per statement.
    pub promote_batch: i32,
    /// Failed and cancelled jobs stay visible at least this long, across slot prunes.
    pub keep_failed: Duration,
    /// A claim older than this, with no heartbeat this recent, is presumed abandoned (its worker
    /// crashed) and is rescued: closed as `rescued` and re-queued. Workers heartbeat running jobs
    /// every quarter of this, so only a dead or stuck worker's claims go stale.
    pub stale_after: Duration,
    /// Most attempts one rescue pass closes (it holds one lock per attempt until it commits).
    pub rescue_batch: i32,
    /// Dead-lettered jobs are deleted after this long (in batches of `promote_batch`).
    pub dlq_retention: Duration,
    /// Unique keys older than this whose job is no longer pending are forgotten (in batches of
    /// `promote_batch`); a pending job keeps its key however old.
    pub unique_key_retention: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            tick: Duration::from_millis(500),
            rotate_interval: Duration::from_secs(5),
            prune_lock_timeout: Duration::from_millis(25),
            promote_batch: 1000,
            keep_failed: Duration::from_secs(72 * 3600),
            stale_after: Duration::from_secs(60),
            rescue_batch: 200,
            dlq_retention: Duration::from_secs(30 * 24 * 3600),
            unique_key_retention: Duration::from_secs(72 * 3600),
        }
    }
}

impl MaintenanceConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.tick.is_zero() {
            return Err(Error::Config("maintenance tick must be > 0".into()));
        }
        if self.prune_lock_timeout.is_zero() || self.prune_lock_timeout > Duration::from_secs(5) {
            return Err(Error::Config(
                "prune_lock_timeout must be in (0, 5s]: a long wait queues hot reads behind the prune".into(),
            ));
        }
        if self.stale_after < Duration::from_millis(100) {
            return Err(Error::Config("stale_after must be at least 100 ms".into()));
        }
        if self.dlq_retention < Duration::from_secs(60) {
            return Err(Error::Config(
                "dlq_retention must be at least one minute".into(),
            ));
        }
        if self.unique_key_retention < Duration::from_secs(60) {
            return Err(Error::Config(
                "unique_key_retention must be at least one minute".into(),
            ));
        }
        if !(1..=100_000).contains(&self.rescue_batch) {
            return Err(Error::Config("rescue_batch must be 1..=100000".into()));
        }
        if !(1..=100_000).contains(&self.promote_batch) {
            return Err(Error::Config("promote_batch must be 1..=100000".into()));
        }
        Ok(())
    }
}

/// What one tick did (for tests and logs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    pub rotated_queue: bool,
    pub rotated_claim: bool,
    pub pruned_queue_slots: Vec<i32>,
    pub pruned_claim_slots: Vec<i32>,
    pub promoted: i32,
    pub rescued: i32,
    pub dlq_expired: i32,
    pub unique_keys_expired: i32,
}

/// One maintenance pass. Public so tests and operators (`ringwork` CLI) can drive it directly.
pub async fn tick(storage: &Storage, config: &MaintenanceConfig) -> Result<TickReport> {
    let mut report = TickReport {
        rotated_queue: storage.rotate_queue_ring(config.rotate_interval).await?,
        rotated_claim: storage.rotate_claim_ring(config.rotate_interval).await?,
        ..TickReport::default()
    };
    // Rescue first: it is the gating step for prune (an open claim blocks its slot).
    report.rescued = storage
        .rescue(config.stale_after, config.rescue_batch)
        .await?;
    // Prune any sealed slot whose proof passes, not only the oldest: a pinned slot must not stall
    // the ring (ARCHITECTURE §5).
    for slot in storage.sealed_claim_slots().await? {
        match storage
            .prune_claim_slot(slot, config.prune_lock_timeout)
            .await?
        {
            PruneResult::Pruned => report.pruned_claim_slots.push(slot),
            PruneResult::Skipped(reason) => debug!(slot, reason, "claim slot kept"),
        }
    }
    for slot in storage.sealed_queue_slots().await? {
        match storage
            .prune_queue_slot(slot, config.prune_lock_timeout, config.keep_failed)
            .await?
        {
            PruneResult::Pruned => report.pruned_queue_slots.push(slot),
            PruneResult::Skipped(reason) => debug!(slot, reason, "queue slot kept"),
        }
    }
    report.dlq_expired = storage
        .dlq_expire(config.dlq_retention, config.promote_batch)
        .await?;
    // A released unique key is re-taken by the next insert anyway; expiry only bounds the table.
    report.unique_keys_expired = storage
        .unique_keys_expire(config.unique_key_retention, config.promote_batch)
        .await?;
    loop {
        let moved = storage.promote_due(config.promote_batch).await?;
        report.promoted += moved;
        if moved < config.promote_batch {
            break;
        }
    }
    Ok(report)
}

fn leader_key(storage: &Storage) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("ringwork-leader:{}", storage.schema()).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

pub(crate) async fn run(
    storage: Storage,
    config: MaintenanceConfig,
    mut stop: watch::Receiver<bool>,
) {
    let key = leader_key(&storage);
    let mut leader: Option<PoolConnection<Postgres>> = None;
    loop {
        if leader.is_none() {
            leader = try_lead(&storage, key).await;
        } else if let Some(conn) = leader.as_mut() {
            // still ours? (a dead connection means the lock is gone)
            if sqlx::query("SELECT 1").execute(&mut **conn).await.is_err() {
                warn!("maintenance leader connection lost; re-electing");
                leader = None;
            }
        }
        if leader.is_some() {
            if let Err(e) = tick(&storage, &config).await {
                warn!(error = %e, "maintenance tick failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.tick) => {}
            _ = stop.changed() => break,
        }
    }
    if let Some(mut conn) = leader {
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await;
    }
}

async fn try_lead(storage: &Storage, key: i64) -> Option<PoolConnection<Postgres>> {
    let mut conn = storage.pool().acquire().await.ok()?;
    let won: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .ok()?;
    if won {
        debug!("elected maintenance leader");
        // keep this connection out of the pool for as long as we lead
        Some(conn)
    } else {
        None
    }
}
