//! Metrics through OpenTelemetry.
//!
//! The library depends on the OpenTelemetry API only: instruments are made from the `Meter` the
//! application gives `ClientBuilder::meter` (default: the global meter provider's `ringwork` meter,
//! a no-op until the application installs an SDK provider). Exporting is the application's choice:
//! OTLP, or the Prometheus registry of the `http` feature (`ringwork serve` wires both).
//!
//! Two kinds of instrument:
//! - **events**, counted by the process where they happen: enqueued, claimed, finished (by
//!   outcome), handler duration and pickup latency histograms, and what the maintenance leader did
//!   (rotations, prunes, prune skips by reason, rescued, promoted);
//! - **state**, gauges read from the database by `Telemetry::record_state` (on a Prometheus
//!   scrape, or on a timer for OTLP): exact depth per queue and state, paused queues, both rings'
//!   slots, prune blockers, horizon holders and the live and dead tuples of ringwork's own tables,
//!   and workflows by kind and state. Each is one cheap statement; none scans job rows except the
//!   terminal counts still in the ring, and the workflow count reads the steps of the workflows
//!   kept (bounded by `keep_completed`).
//!
//! Attribute names are short on purpose (`queue`, `kind`, `outcome`, `state`, `ring`): they become
//! Prometheus labels that operators type.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};
use opentelemetry::KeyValue;

use crate::error::Result;
use crate::storage::Storage;

/// Seconds buckets for handler duration and pickup latency: 1 ms to 5 min.
/// How long a queue's oldest available job and its last claim must both be old, with nothing
/// running, for `ringwork.queue.unworked` to report it (as `ringwork status --unworked-after`
/// defaults to).
pub const UNWORKED_AFTER: Duration = Duration::from_secs(60);

const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// ringwork's instruments, cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    i: Arc<Instruments>,
}

struct Instruments {
    enqueued: Counter<u64>,
    claimed: Counter<u64>,
    finished: Counter<u64>,
    stale: Counter<u64>,
    duration: Histogram<f64>,
    pickup: Histogram<f64>,
    rescued: Counter<u64>,
    promoted: Counter<u64>,
    rotations: Counter<u64>,
    prunes: Counter<u64>,
    prune_skips: Counter<u64>,
    archive_truncations: Counter<u64>,
    queue_jobs: Gauge<i64>,
    workflows: Gauge<i64>,
    queue_paused: Gauge<i64>,
    queue_oldest_wait: Gauge<f64>,
    queue_unworked: Gauge<i64>,
    ring_slots: Gauge<i64>,
    ring_current_slot: Gauge<i64>,
    ring_sealed_waiting: Gauge<i64>,
    prune_blockers: Gauge<i64>,
    prune_blocker_age: Gauge<f64>,
    horizon_holders: Gauge<i64>,
    horizon_oldest: Gauge<f64>,
    horizon_xmin_age: Gauge<i64>,
    table_live: Gauge<i64>,
    table_dead: Gauge<i64>,
    table_bytes: Gauge<i64>,
    state_read_ok: Gauge<i64>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Default for Telemetry {
    /// The global meter provider's `ringwork` meter.
    fn default() -> Self {
        Self::new(&opentelemetry::global::meter("ringwork"))
    }
}

impl Telemetry {
    /// ringwork's instruments on `meter`.
    pub fn new(meter: &Meter) -> Self {
        let counter = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_description(description)
                .build()
        };
        let gauge = |name: &'static str, description: &'static str| {
            meter.i64_gauge(name).with_description(description).build()
        };
        let seconds = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(description)
                .with_unit("s")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build()
        };
        Self {
            i: Arc::new(Instruments {
                enqueued: counter(
                    "ringwork.jobs.enqueued",
                    "Jobs inserted by this process (counted when the insert statement succeeds; \
                     a caller's transaction may still roll back)",
                ),
                claimed: counter("ringwork.jobs.claimed", "Jobs claimed by this process"),
                finished: counter(
                    "ringwork.jobs.finished",
                    "Attempts finished by this process's handlers, by outcome: completed, \
                     retried, snoozed, failed (failed includes dead-lettered)",
                ),
                stale: counter(
                    "ringwork.completions.stale",
                    "Completions refused by the (job_id, run_lease) guard: the attempt had been \
                     rescued or cancelled under its handler",
                ),
                duration: seconds(
                    "ringwork.job.duration",
                    "Handler run time per attempt, by queue, kind and outcome",
                ),
                pickup: seconds(
                    "ringwork.job.pickup_latency",
                    "From insert to handler start, first attempts only (a scheduled job's delay \
                     counts)",
                ),
                rescued: counter(
                    "ringwork.jobs.rescued",
                    "Attempts closed by rescue (stale heartbeat or past deadline) and re-queued",
                ),
                promoted: counter(
                    "ringwork.jobs.promoted",
                    "Scheduled and retryable jobs moved to the queue ring when due",
                ),
                rotations: counter("ringwork.ring.rotations", "Ring rotations, by ring"),
                prunes: counter("ringwork.ring.prunes", "Slots truncated, by ring"),
                prune_skips: counter(
                    "ringwork.ring.prune_skips",
                    "Sealed slots left for a later tick, by ring and reason (busy: a lock was \
                     not granted within prune_lock_timeout; after_busy: another slot of the ring \
                     was busy this tick; held: a long transaction holds one, so none was tried; \
                     pending_ready, open_claims: the proof failed)",
                ),
                archive_truncations: counter(
                    "ringwork.archive.truncations",
                    "Archive time buckets truncated by retention",
                ),
                queue_jobs: gauge(
                    "ringwork.queue.jobs",
                    "Exact jobs per queue and state; completed, failed and cancelled are durable \
                     totals since the schema gained them (migration 0006)",
                ),
                workflows: gauge(
                    "ringwork.workflows",
                    "Workflows kept (until keep_completed after their last step), by kind \
                     (workflow, batch, sequence) and state (running, completed, failed, cancelled)",
                ),
                queue_paused: gauge("ringwork.queue.paused", "1 when the queue is paused"),
                queue_oldest_wait: gauge_f64(
                    meter,
                    "ringwork.queue.oldest_wait",
                    "How long the queue's oldest available job has waited since it became \
                     runnable (0: none available)",
                ),
                queue_unworked: gauge(
                    "ringwork.queue.unworked",
                    "1 when the queue holds available jobs that nobody works: not paused, none \
                     running, its oldest available job and its last claim both at least \
                     UNWORKED_AFTER (60 s) old",
                ),
                ring_slots: gauge("ringwork.ring.slots", "Slots per ring and state"),
                ring_current_slot: gauge("ringwork.ring.current_slot", "The ring's write slot"),
                ring_sealed_waiting: gauge(
                    "ringwork.ring.sealed_waiting",
                    "Sealed slots whose prune proof fails, by ring and reason",
                ),
                prune_blockers: gauge(
                    "ringwork.prune.blockers",
                    "Backends holding a lock on a sealed slot or an archive bucket",
                ),
                prune_blocker_age: gauge_f64(
                    meter,
                    "ringwork.prune.blocker_age",
                    "Longest transaction among the prune blockers",
                ),
                horizon_holders: gauge(
                    "ringwork.horizon.holders",
                    "Sessions, replication slots and prepared transactions holding back the MVCC \
                     horizon, by kind",
                ),
                horizon_oldest: gauge_f64(
                    meter,
                    "ringwork.horizon.oldest_age",
                    "Age of the oldest horizon holder's transaction, by kind (0: none)",
                ),
                horizon_xmin_age: gauge(
                    "ringwork.horizon.xmin_age",
                    "Largest xmin age (in transactions) among the horizon holders, by kind: the \
                     measure for replication slots, which have no start time",
                ),
                table_live: gauge(
                    "ringwork.table.live_tuples",
                    "Live tuples of ringwork's tables (estimates), by table",
                ),
                table_dead: gauge(
                    "ringwork.table.dead_tuples",
                    "Dead tuples of ringwork's tables (estimates), by table",
                ),
                table_bytes: gauge(
                    "ringwork.table.bytes",
                    "Size of ringwork's tables, by table",
                ),
                state_read_ok: gauge(
                    "ringwork.state.read_ok",
                    "1 when the last read of the state gauges from the database succeeded; 0: \
                     the other state gauges show older values",
                ),
            }),
        }
    }

    pub(crate) fn enqueued<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let mut counts: Vec<(&str, u64)> = Vec::new();
        for queue in queues {
            match counts.iter_mut().find(|(q, _)| *q == queue) {
                Some((_, n)) => *n += 1,
                None => counts.push((queue, 1)),
            }
        }
        for (queue, n) in counts {
            self.i
                .enqueued
                .add(n, &[KeyValue::new("queue", queue.to_string())]);
        }
    }

    pub(crate) fn claimed(&self, queue: &str, n: usize) {
        self.i
            .claimed
            .add(n as u64, &[KeyValue::new("queue", queue.to_string())]);
    }

    pub(crate) fn pickup(&self, queue: &str, latency: Duration) {
        self.i.pickup.record(
            latency.as_secs_f64(),
            &[KeyValue::new("queue", queue.to_string())],
        );
    }

    pub(crate) fn finished(&self, queue: &str, kind: &str, outcome: &'static str, ran: Duration) {
        let attributes = [
            KeyValue::new("queue", queue.to_string()),
            KeyValue::new("kind", kind.to_string()),
            KeyValue::new("outcome", outcome),
        ];
        self.i.finished.add(1, &attributes);
        self.i.duration.record(ran.as_secs_f64(), &attributes);
    }

    pub(crate) fn stale(&self, n: u64) {
        if n > 0 {
            self.i.stale.add(n, &[]);
        }
    }

    /// A ring's write slot moved (`ring`: `queue` or `claim`).
    pub(crate) fn rotated(&self, ring: &'static str) {
        self.i.rotations.add(1, &[KeyValue::new("ring", ring)]);
    }

    /// `slots` sealed slots of `ring` were truncated.
    pub(crate) fn pruned(&self, ring: &'static str, slots: u64) {
        if slots > 0 {
            self.i.prunes.add(slots, &[KeyValue::new("ring", ring)]);
        }
    }

    /// Prune passed over a sealed slot of `ring`, for `reason`.
    pub(crate) fn prune_skipped(&self, ring: &'static str, reason: &str) {
        self.i.prune_skips.add(
            1,
            &[
                KeyValue::new("ring", ring),
                KeyValue::new("reason", reason.to_string()),
            ],
        );
    }

    /// Attempts closed by rescue.
    pub(crate) fn rescued(&self, n: u64) {
        if n > 0 {
            self.i.rescued.add(n, &[]);
        }
    }

    /// Due jobs moved to the queue ring.
    pub(crate) fn promoted(&self, n: u64) {
        if n > 0 {
            self.i.promoted.add(n, &[]);
        }
    }

    /// Archive time buckets truncated by retention.
    pub(crate) fn archive_truncated(&self, buckets: u64) {
        if buckets > 0 {
            self.i.archive_truncations.add(buckets, &[]);
        }
    }

    /// Read the state gauges from the database: five reads (queue counts, with the oldest wait of
    /// each queue that has available jobs; ring slots; prune blockers; horizon holders at least
    /// `horizon_min_age` old; table statistics), run side by side and each on its own, so one
    /// failing or slow read leaves the others fresh within a scrape's budget.
    /// `ringwork.state.read_ok` says whether all succeeded; the first error is returned.
    pub async fn record_state(
        &self,
        admin: &crate::Admin,
        horizon_min_age: Duration,
    ) -> Result<()> {
        self.record_state_of(admin.storage(), horizon_min_age).await
    }

    /// [`Telemetry::record_state`] through the engine's storage handle.
    pub(crate) async fn record_state_of(
        &self,
        storage: &Storage,
        horizon_min_age: Duration,
    ) -> Result<()> {
        let (counts, rings, blockers, horizon, tables, workflows) = futures::join!(
            self.record_counts(storage),
            self.record_rings(storage),
            self.record_prune_blockers(storage),
            self.record_horizon(storage, horizon_min_age),
            self.record_tables(storage),
            self.record_workflows(storage),
        );
        let results = [counts, rings, blockers, horizon, tables, workflows];
        let first_error = results.into_iter().find_map(std::result::Result::err);
        self.i
            .state_read_ok
            .record(i64::from(first_error.is_none()), &[]);
        first_error.map_or(Ok(()), Err)
    }

    /// Mark the state gauges stale (a read that did not finish in time).
    pub fn state_read_failed(&self) {
        self.i.state_read_ok.record(0, &[]);
    }

    async fn record_workflows(&self, storage: &Storage) -> Result<()> {
        let counts = storage.workflows_by_state().await?;
        for kind in ["workflow", "batch", "sequence"] {
            for state in ["running", "completed", "failed", "cancelled"] {
                let n = counts
                    .iter()
                    .find(|(k, s, _)| k == kind && s == state)
                    .map_or(0, |(_, _, n)| *n);
                self.i.workflows.record(
                    n,
                    &[KeyValue::new("kind", kind), KeyValue::new("state", state)],
                );
            }
        }
        Ok(())
    }

    async fn record_counts(&self, storage: &Storage) -> Result<()> {
        let i = &self.i;
        for c in storage.queue_counts(None).await? {
            let q = || KeyValue::new("queue", c.queue.clone());
            i.queue_paused.record(i64::from(c.paused), &[q()]);
            for (state, n) in [
                ("available", c.available),
                ("scheduled", c.scheduled),
                ("retryable", c.retryable),
                ("running", c.running),
                ("waiting", c.waiting),
                ("pending", c.pending),
                ("completed", c.completed),
                ("failed", c.failed),
                ("cancelled", c.cancelled),
                ("dead_lettered", c.dead_lettered),
            ] {
                i.queue_jobs
                    .record(n, &[q(), KeyValue::new("state", state)]);
            }
            let waited = if c.available > 0 {
                storage.oldest_available_wait(&c.queue).await?
            } else {
                None
            };
            i.queue_oldest_wait
                .record(waited.map_or(0.0, |w| w.as_secs_f64()), &[q()]);
            let unworked = match waited {
                Some(waited) => {
                    crate::admin::unworked_after_wait(storage, &c, waited, UNWORKED_AFTER)
                        .await?
                        .is_some()
                }
                None => false,
            };
            i.queue_unworked.record(i64::from(unworked), &[q()]);
        }
        Ok(())
    }

    async fn record_rings(&self, storage: &Storage) -> Result<()> {
        let i = &self.i;
        let slots = storage.ring_slots().await?;
        for ring in ["queue", "claim"] {
            let ring_slots: Vec<_> = slots.iter().filter(|s| s.ring == ring).collect();
            for state in ["current", "sealed", "free"] {
                let n = ring_slots.iter().filter(|s| s.state == state).count();
                i.ring_slots.record(
                    n as i64,
                    &[KeyValue::new("ring", ring), KeyValue::new("state", state)],
                );
            }
            if let Some(current) = ring_slots.iter().find(|s| s.state == "current") {
                i.ring_current_slot
                    .record(i64::from(current.slot), &[KeyValue::new("ring", ring)]);
            }
            for reason in ["pending_ready", "open_claims"] {
                let n = ring_slots
                    .iter()
                    .filter(|s| s.state == "sealed" && s.blocker.as_deref() == Some(reason))
                    .count();
                i.ring_sealed_waiting.record(
                    n as i64,
                    &[KeyValue::new("ring", ring), KeyValue::new("reason", reason)],
                );
            }
        }
        Ok(())
    }

    async fn record_prune_blockers(&self, storage: &Storage) -> Result<()> {
        let i = &self.i;
        let blockers = storage.prune_blockers().await?;
        let mut pids: Vec<i32> = blockers.iter().map(|b| b.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        i.prune_blockers.record(pids.len() as i64, &[]);
        let oldest = blockers
            .iter()
            .filter_map(|b| b.xact_age_secs)
            .fold(0.0_f64, f64::max);
        i.prune_blocker_age.record(oldest, &[]);
        Ok(())
    }

    async fn record_horizon(&self, storage: &Storage, min_age: Duration) -> Result<()> {
        let i = &self.i;
        let holders = storage.horizon_holders(min_age).await?;
        let now = chrono::Utc::now();
        for kind in ["session", "replication_slot", "prepared_transaction"] {
            let of_kind: Vec<_> = holders.iter().filter(|h| h.kind == kind).collect();
            let oldest = of_kind
                .iter()
                .filter_map(|h| h.held_since)
                .map(|since| (now - since).num_milliseconds() as f64 / 1000.0)
                .fold(0.0_f64, f64::max);
            let oldest_xmin_age = of_kind.iter().filter_map(|h| h.xmin_age).max().unwrap_or(0);
            let k = [KeyValue::new("kind", kind)];
            i.horizon_holders.record(of_kind.len() as i64, &k);
            i.horizon_oldest.record(oldest, &k);
            i.horizon_xmin_age.record(i64::from(oldest_xmin_age), &k);
        }
        Ok(())
    }

    async fn record_tables(&self, storage: &Storage) -> Result<()> {
        let i = &self.i;
        for t in storage.table_health().await? {
            let table = [KeyValue::new("table", t.table_name.clone())];
            i.table_live.record(t.live_tuples, &table);
            i.table_dead.record(t.dead_tuples, &table);
            i.table_bytes.record(t.total_bytes, &table);
        }
        Ok(())
    }
}

/// A gauge in seconds.
fn gauge_f64(meter: &Meter, name: &'static str, description: &'static str) -> Gauge<f64> {
    meter
        .f64_gauge(name)
        .with_description(description)
        .with_unit("s")
        .build()
}
