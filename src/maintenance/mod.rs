//! Maintenance: one process per schema, elected by a session advisory lock (`runner`), runs the
//! services below, each at its own pace (`runner::Pacing`) and in a file of its own:
//! - `rotate`: moves each ring's write slot on once it is old enough and in use;
//! - `rescue`: closes and re-queues stale and past-deadline claims (the gating step for prune);
//! - `prune`: truncates sealed slots whose two-phase proof passes, any slot, not only the oldest;
//! - `retention`: bounded deletes of expired dead-letter entries and unique keys;
//! - `promote`: moves due scheduled and retryable jobs to the queue ring.
//!
//! Nothing maintenance does is unsafe to run twice or concurrently: every step proves what it
//! needs under its own locks, so a second leader (after a lost connection) costs work, not safety.

mod promote;
mod prune;
mod rescue;
mod retention;
mod rotate;
mod runner;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::storage::Storage;

pub use crate::schema::leader_lock_key;
pub(crate) use runner::run;

/// How this process runs maintenance (rotation, rescue, prune, retention, promotion) while it
/// leads its schema.
#[derive(Clone, Debug)]
pub struct MaintenanceConfig {
    /// Run maintenance in this process when elected (default true).
    pub enabled: bool,
    /// Time between maintenance ticks.
    pub tick: Duration,
    /// Minimum age of a ring's current slot before it rotates (default 5 s). A rotation appends
    /// two ledger rows and a prune one, inside the slots they describe, so no interval leaves dead
    /// tuples; a short one reclaims sooner but spreads each slot's rows thinner, a long one keeps
    /// more rows in each slot and reclaims them later.
    pub rotate_interval: Duration,
    /// How long prune waits for its ACCESS EXCLUSIVE locks before skipping a slot this tick.
    pub prune_lock_timeout: Duration,
    /// Most deferred jobs promoted per statement.
    pub promote_batch: i32,
    /// Completed jobs stay findable (`job_state`, `job_history`, `ringwork job`) at least this
    /// long: prune archives each completion batch as one row (default 24 h; zero archives none,
    /// and a completed job is then forgotten with its queue slot, seconds after it finishes).
    pub keep_completed: Duration,
    /// Failed and cancelled jobs stay findable at least this long (default 7 days; zero: they go
    /// with their queue slot). Both archives are reclaimed a whole time bucket (a thirtieth of
    /// the keep) at a time, so a row stays up to about one bucket longer.
    pub keep_failed: Duration,
    /// A lane whose queue is paused, or from which nothing has been claimed for this long, is
    /// cold: when only its unclaimed jobs keep a sealed queue slot from being pruned, they are
    /// parked (moved out of the ring) and the slot is reclaimed; the lane's next claim or its
    /// queue's resume brings them back in order (default 30 s; `None` never parks, and one idle
    /// queue then stops reclamation for every queue once the ring is full).
    pub park_idle: Option<Duration>,
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
    /// The horizon canary's log line: the maintenance leader logs a warning, about every 30 s,
    /// for each session, replication slot or prepared transaction that has held back the
    /// database's MVCC horizon at least this long (default 5 min; `None`: never). ringwork's own
    /// tables do not bloat meanwhile, the rest of the database does.
    pub horizon_warn_after: Option<Duration>,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            tick: Duration::from_millis(500),
            rotate_interval: Duration::from_secs(5),
            prune_lock_timeout: Duration::from_millis(25),
            promote_batch: 1000,
            keep_completed: Duration::from_secs(24 * 3600),
            keep_failed: Duration::from_secs(7 * 24 * 3600),
            park_idle: Some(Duration::from_secs(30)),
            stale_after: Duration::from_secs(60),
            rescue_batch: 200,
            dlq_retention: Duration::from_secs(30 * 24 * 3600),
            unique_key_retention: Duration::from_secs(72 * 3600),
            horizon_warn_after: Some(Duration::from_secs(300)),
        }
    }
}

impl MaintenanceConfig {
    /// The shortest `stale_after` accepted: below it a claim's own heartbeat cannot keep up.
    pub const MIN_STALE_AFTER: Duration = Duration::from_millis(100);

    pub(crate) fn validate(&self) -> Result<()> {
        if self.tick.is_zero() {
            return Err(Error::Config("maintenance tick must be > 0".into()));
        }
        if self.prune_lock_timeout.is_zero() || self.prune_lock_timeout > Duration::from_secs(5) {
            return Err(Error::Config(
                "prune_lock_timeout must be in (0, 5s]: a long wait queues hot reads behind the prune".into(),
            ));
        }
        if self.stale_after < Self::MIN_STALE_AFTER {
            return Err(Error::Config("stale_after must be at least 100 ms".into()));
        }
        if self.tick >= self.stale_after {
            return Err(Error::Config(
                "maintenance tick must be shorter than stale_after (rescue and leader takeover \
                 are measured in stale_after)"
                    .into(),
            ));
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
        const YEAR: Duration = Duration::from_secs(366 * 24 * 3600);
        if self.keep_completed > YEAR || self.keep_failed > YEAR {
            return Err(Error::Config(
                "keep_completed and keep_failed must be at most a year".into(),
            ));
        }
        if self
            .park_idle
            .is_some_and(|idle| idle < Duration::from_secs(1))
        {
            return Err(Error::Config(
                "park_idle must be at least 1 s: a shorter one parks lanes that are being worked"
                    .into(),
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
    /// The queue ring's write slot moved on this tick.
    pub rotated_queue: bool,
    /// The claim ring's write slot moved on this tick.
    pub rotated_claim: bool,
    /// Queue-ring slots truncated (reclaimed) this tick.
    pub pruned_queue_slots: Vec<i32>,
    /// Claim-ring slots truncated (reclaimed) this tick.
    pub pruned_claim_slots: Vec<i32>,
    /// Due scheduled and retryable jobs moved to the queue ring.
    pub promoted: i32,
    /// Stale and past-deadline attempts closed, at most `rescue_batch` (retried, failed or
    /// dead-lettered).
    pub rescued: i32,
    /// Waits for a callback that timed out and were ended (retried, or failed).
    pub callbacks_timed_out: i32,
    /// `rotated`, `young`, `empty` or `busy` (the lease ring); `not due` when no ring could rotate
    /// and no rotation was tried.
    pub lease_ring: String,
    /// Dead-letter entries deleted past `dlq_retention` (at most `promote_batch`).
    pub dlq_expired: i32,
    /// Unique keys forgotten past `unique_key_retention` (at most `promote_batch`).
    pub unique_keys_expired: i32,
    /// Finished workflows deleted past `keep_completed` (at most `promote_batch`).
    pub workflows_expired: i32,
    /// Archive time buckets truncated past `keep_completed` or `keep_failed`.
    pub archive_buckets_truncated: i32,
    /// Old time buckets of the durable terminal totals folded into the current one.
    pub totals_buckets_folded: i32,
    /// Sealed slots left for a later tick: (ring, reason), the reason as `PruneResult::Skipped`.
    pub prune_skips: Vec<(&'static str, String)>,
    /// When this tick promoted: how long until the earliest deferred job left is due (`None`: none
    /// waits). The leader sleeps that long before promoting again, unless told of a sooner one.
    pub next_promotion_in: Option<Duration>,
    /// When this tick looked at rotation: how long until a ring could rotate, as it was before any
    /// rotation this tick (zero: the tick tried them; `None`: no ring's current slot was written).
    pub rotation_due_in: Option<Duration>,
}

impl TickReport {
    /// Count what this tick did in the telemetry's instruments.
    pub(crate) fn record(&self, telemetry: &crate::telemetry::Telemetry) {
        for (ring, rotated) in [("queue", self.rotated_queue), ("claim", self.rotated_claim)] {
            if rotated {
                telemetry.rotated(ring);
            }
        }
        telemetry.pruned("queue", self.pruned_queue_slots.len() as u64);
        telemetry.pruned("claim", self.pruned_claim_slots.len() as u64);
        for (ring, reason) in &self.prune_skips {
            telemetry.prune_skipped(ring, reason);
        }
        telemetry.rescued(self.rescued.max(0) as u64);
        telemetry.promoted(self.promoted.max(0) as u64);
        telemetry.archive_truncated(self.archive_buckets_truncated.max(0) as u64);
    }
}

/// The services a pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Services {
    pub(crate) promote: bool,
    pub(crate) rotate: bool,
    pub(crate) rescue: bool,
    /// Prune also runs in any pass whose rotation sealed a slot.
    pub(crate) prune: bool,
    pub(crate) retention: bool,
}

impl Services {
    pub(crate) const ALL: Self = Self {
        promote: true,
        rotate: true,
        rescue: true,
        prune: true,
        retention: true,
    };
}

/// What the process's LISTEN (runtime/notifier.rs) tells its maintenance loop between ticks.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// A deferred job may be due sooner than the last promotion saw (`wake_promotion()`).
    pub(crate) deferred: AtomicBool,
    /// The engine's clock moved (`advance_clock`): every service's pace was measured on it.
    pub(crate) clock: AtomicBool,
}

impl Signals {
    /// Notifications may have been sent while nobody listened: act as if both arrived.
    pub(crate) fn missed(&self) {
        self.deferred.store(true, Ordering::Relaxed);
        self.clock.store(true, Ordering::Relaxed);
    }
}

/// One maintenance pass: every service once, in the order that lets each help the next. Operators
/// and tests drive it by hand through [`crate::Admin::run_maintenance`] (`ringwork maintain`).
pub(crate) async fn tick(storage: &Storage, config: &MaintenanceConfig) -> Result<TickReport> {
    pass(storage, config, Services::ALL).await
}

/// A pass of the given services, in the order that lets each help the next. The leader's loop
/// chooses them at each tick (runner.rs).
pub(crate) async fn pass(
    storage: &Storage,
    config: &MaintenanceConfig,
    services: Services,
) -> Result<TickReport> {
    let mut report = TickReport::default();
    if services.rotate {
        rotate::run(storage, config, &mut report).await?;
    }
    // Rescue before prune: an open claim blocks its slot until rescue closes it.
    if services.rescue {
        rescue::run(storage, config, &mut report).await?;
    }
    if services.prune || report.rotated_queue || report.rotated_claim {
        prune::run(storage, config, &mut report).await?;
    }
    if services.retention {
        retention::run(storage, config, &mut report).await?;
    }
    if services.promote {
        promote::run(storage, config, &mut report).await?;
    }
    Ok(report)
}
