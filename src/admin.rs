//! The operator API: what an operator, a dashboard or a script does to a running fleet, apart from
//! the engine's own paths (claim, complete, rotate, prune), which stay with the runtime.
//!
//! Every method is one short read or a bounded write through the same server-side functions the
//! `ringwork` command line and the dashboard use, so each is safe beside running workers: a cancel
//! takes the attempt's lock as rescue and completion do, bulk operations run in steps of at most
//! 500 jobs, and reads wait on a ring's locks only while a prune of it commits. The exception is
//! [`Admin::run_maintenance`], which does what the maintenance leader's tick does, prune's short
//! exclusive locks included.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Result;
use crate::job::NewJob;
use crate::maintenance::{MaintenanceConfig, TickReport};
use crate::schema::SchemaName;
use crate::storage::{
    ArgsText, BulkOutcome, CallbackAction, CallbackOutcome, CancelOutcome, DeadLetter,
    HorizonHolder, JobFilter, JobPage, JobRecord, JobState, LimitsInUse, ProcessSession,
    ProgressRecord, PruneBlocker, QueueCounts, QueueLimits, Readiness, ReplicaStatus, RingSlot,
    ScheduleRecord, Storage, TableHealth,
};
use crate::JobStatus;

/// Operator actions and reads on one schema: queues (counts, pause, limits), jobs (state, history,
/// cancel, retry, bulk), dead letters, periodic schedules, external callbacks, and the health of
/// the rings and the database. Cheap to clone.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> ringwork::Result<()> {
/// let admin = ringwork::Admin::new(pool, "ringwork")?;
/// for q in admin.queue_counts(None).await? {
///     println!("{}: {} available, {} running", q.queue, q.available, q.running);
/// }
/// admin.set_queue_paused("mail", true).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Admin {
    storage: Storage,
}

impl Admin {
    /// An operator handle on `schema` through `pool`. The schema must be migrated (see
    /// `ringwork migrate` or `ClientBuilder::build`); this runs nothing.
    pub fn new(pool: PgPool, schema: &str) -> Result<Self> {
        Ok(Self::from_storage(Storage::new(
            pool,
            SchemaName::new(schema)?,
        )))
    }

    pub(crate) fn from_storage(storage: Storage) -> Self {
        Self { storage }
    }

    /// The engine's storage handle under this operator handle (the dashboard and the HTTP
    /// endpoints read through it).
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The pool the handle runs on.
    pub fn pool(&self) -> &PgPool {
        self.storage.pool()
    }

    /// The schema the handle works on.
    pub fn schema(&self) -> &SchemaName {
        self.storage.schema()
    }

    // ---- queues ---------------------------------------------------------------------------

    /// Exact counts per queue (one queue, or all), in every state.
    pub async fn queue_counts(&self, queue: Option<&str>) -> Result<Vec<QueueCounts>> {
        self.storage.queue_counts(queue).await
    }

    /// Every queue's name, in order.
    pub async fn queue_names(&self) -> Result<Vec<String>> {
        self.storage.queue_names().await
    }

    /// Pause (no claims; inserts still work) or resume a queue, creating it if it does not exist.
    /// Returns whether anything changed.
    pub async fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        self.storage.set_queue_paused(queue, paused).await
    }

    /// Set (or, with `QueueLimits::default()`, remove) a queue's fleet-wide limits: concurrency,
    /// rate, and per key. Returns whether anything changed.
    pub async fn set_queue_limits(&self, queue: &str, limits: QueueLimits) -> Result<bool> {
        self.storage.set_queue_limits(queue, limits).await
    }

    /// Turn a queue's dead-letter hold on or off: with it on, a job that fails for good waits in
    /// the dead-letter queue for an operator instead of ending as failed. Returns whether anything
    /// changed.
    pub async fn set_queue_dead_letter(&self, queue: &str, enabled: bool) -> Result<bool> {
        self.storage.set_queue_dead_letter(queue, enabled).await
    }

    /// How long the queue's oldest available job has waited, or `None` when nothing is
    /// available.
    pub async fn oldest_available_wait(&self, queue: &str) -> Result<Option<Duration>> {
        self.storage.oldest_available_wait(queue).await
    }

    /// The queues that hold available jobs nobody is taking: not paused, none of their jobs
    /// running, their oldest available job has waited at least `idle`, and no process has claimed
    /// from them for `idle` either.
    /// Typically a queue no running process works (a kind whose producer names a queue its workers
    /// do not declare, or workers that are all down); a queue held back by its own rate limit for
    /// that long shows too. A queue that is worked but behind is not listed: its claims are
    /// recent. Reads counts once, then two index probes per lane of each queue with available jobs.
    pub async fn unworked_queues(&self, idle: Duration) -> Result<Vec<UnworkedQueue>> {
        let mut unworked = Vec::new();
        for counts in self.storage.queue_counts(None).await? {
            if let Some(queue) = unworked_queue(&self.storage, &counts, idle).await? {
                unworked.push(queue);
            }
        }
        Ok(unworked)
    }

    // ---- jobs -----------------------------------------------------------------------------

    /// Where a job is now; `None` when unknown (or its history has aged out).
    pub async fn job_state(&self, job_id: i64) -> Result<Option<JobState>> {
        self.storage.job_state(job_id).await
    }

    /// A job's current state and whatever history the schema still holds for it.
    pub async fn load_job(&self, job_id: i64) -> Result<Option<JobRecord>> {
        self.storage.load_job(job_id).await
    }

    /// A job's arguments as JSON text, at most `max_chars` characters of it (text, so that
    /// arguments this binary cannot decode are still shown).
    pub async fn job_args(&self, job_id: i64, max_chars: usize) -> Result<Option<ArgsText>> {
        self.storage.job_args(job_id, max_chars).await
    }

    /// The latest progress its running or last attempt recorded.
    pub async fn job_progress(&self, job_id: i64) -> Result<Option<ProgressRecord>> {
        self.storage.job_progress(job_id).await
    }

    /// One page of the jobs in one state, optionally of one queue and one kind, after the page key
    /// `after` (`None`: the first page); at most `limit` rows (1..=1,000).
    pub async fn list_jobs(
        &self,
        state: JobStatus,
        queue: Option<&str>,
        kind: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        self.storage
            .list_jobs(state, queue, kind, after, limit)
            .await
    }

    /// Search the archive by argument content, newest first, `limit` a page from the page key
    /// `after`. Finds only jobs archived while the schema's `archive_search` setting was on.
    pub async fn search_archive(
        &self,
        search: &crate::ArchiveSearch,
        after: Option<&str>,
        limit: usize,
    ) -> Result<crate::ArchiveSearchPage> {
        self.storage.search_archive(search, after, limit).await
    }

    /// Turn archive search on or off for the schema: while on, the archive copy indexes each
    /// finished job's arguments for [`Admin::search_archive`].
    pub async fn set_archive_search(&self, on: bool) -> Result<()> {
        self.storage.set_archive_search(on).await
    }

    /// Cancel a job by id, wherever it is: an available or scheduled job never runs, a running
    /// one has its claim closed and its handler signalled. `reason` is recorded (cut to the
    /// schema's bound).
    pub async fn cancel_job(&self, job_id: i64, reason: &str) -> Result<CancelOutcome> {
        self.storage.cancel_job(job_id, reason).await
    }

    /// A workflow's steps and where it stands as a whole; `None` for an unknown workflow.
    pub async fn workflow(&self, workflow_id: i64) -> Result<Option<crate::WorkflowStatus>> {
        self.storage.workflow_status(workflow_id).await
    }

    /// Cancel a workflow: waiting steps are cancelled, running ones cancelled like any job, and no
    /// step is released after it. The number of steps cancelled; `None` for an unknown workflow.
    pub async fn cancel_workflow(&self, workflow_id: i64) -> Result<Option<i32>> {
        self.storage.cancel_workflow(workflow_id).await
    }

    /// Cancel the job holding `job`'s unique key (built as a unique insert of `job` now would
    /// build it).
    pub async fn cancel_unique(&self, job: &NewJob, reason: &str) -> Result<CancelOutcome> {
        self.storage.cancel_unique(job, reason).await
    }

    /// Retry one job now: a dead-lettered job runs again with fresh attempts, a scheduled or
    /// retryable one becomes due at once. False when it is in neither state.
    pub async fn retry_job(&self, job_id: i64) -> Result<bool> {
        self.storage.retry_job(job_id).await
    }

    /// Cancel the jobs the filter matches, in bounded steps; jobs created after the call began
    /// are not touched.
    pub async fn bulk_cancel(&self, filter: &JobFilter, reason: &str) -> Result<BulkOutcome> {
        self.storage.bulk_cancel(filter, reason).await
    }

    /// Retry the jobs the filter matches (scheduled and retryable become due now; dead-lettered
    /// run again with fresh attempts), in bounded steps.
    pub async fn bulk_retry(&self, filter: &JobFilter) -> Result<BulkOutcome> {
        self.storage.bulk_retry(filter).await
    }

    /// Delete the dead-lettered jobs the filter matches, in bounded steps. Terminal history is
    /// reclaimed by retention, never row by row.
    pub async fn bulk_delete(&self, filter: &JobFilter) -> Result<BulkOutcome> {
        self.storage.bulk_delete(filter).await
    }

    // ---- dead letters ---------------------------------------------------------------------

    /// Dead-lettered jobs (of one queue, or all), oldest failure first, at most `limit`.
    pub async fn dead_letters(&self, queue: Option<&str>, limit: i64) -> Result<Vec<DeadLetter>> {
        self.storage.dlq_list(queue, limit).await
    }

    /// Move a dead-lettered job back to run now with fresh attempts. False when it is not in the
    /// dead-letter queue.
    pub async fn retry_dead_letter(&self, job_id: i64) -> Result<bool> {
        self.storage.dlq_retry(job_id).await
    }

    /// Delete dead-lettered jobs: one (`job_id`), a queue's, or all. Returns how many.
    pub async fn purge_dead_letters(
        &self,
        queue: Option<&str>,
        job_id: Option<i64>,
    ) -> Result<i64> {
        self.storage.dlq_purge(queue, job_id).await
    }

    /// The processes working the schema (their LISTEN sessions) and the maintenance leader's
    /// backend, as `pg_stat_activity` shows them.
    pub async fn processes(&self) -> Result<Vec<ProcessSession>> {
        self.storage.processes().await
    }

    /// Every queue with limits and what it uses of them now, with its `top_keys` busiest keys.
    pub async fn queue_limits_in_use(&self, top_keys: usize) -> Result<Vec<LimitsInUse>> {
        self.storage.queue_limits_in_use(top_keys).await
    }

    // ---- periodic schedules ---------------------------------------------------------------

    /// Every schedule that has fired (in about the last week) or is paused.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        self.storage.schedules().await
    }

    /// Pause or resume a schedule in every process. True when this changed something.
    pub async fn set_schedule_paused(&self, schedule: &str, paused: bool) -> Result<bool> {
        self.storage.set_schedule_paused(schedule, paused).await
    }

    /// Forget a schedule's recorded definition (one that left the code stops reading as overdue;
    /// its fires stay). False when none was recorded.
    pub async fn forget_schedule(&self, schedule: &str) -> Result<bool> {
        self.storage.forget_schedule(schedule).await
    }

    /// Ask for one fire of a schedule now, made once across the fleet by the next evaluation
    /// pass of a process that declares it. False: a trigger of it is pending already.
    pub async fn trigger_schedule(&self, schedule: &str) -> Result<bool> {
        self.storage.trigger_schedule(schedule).await
    }

    // ---- external callbacks ---------------------------------------------------------------

    /// Answer a job that waits for an external callback, by the id its handler registered. A
    /// malformed or forged id, or a wait already over, is an error and changes nothing.
    pub async fn resolve_callback(
        &self,
        id: &str,
        action: CallbackAction,
    ) -> Result<CallbackOutcome> {
        self.storage.resolve_callback(id, action).await
    }

    // ---- health ---------------------------------------------------------------------------

    /// Readiness checks, each a cheap statement; never an error (a failed check says why).
    pub async fn readiness(&self) -> Readiness {
        self.storage.readiness().await
    }

    /// Every slot of both rings, with the reason a sealed one cannot be pruned yet.
    pub async fn ring_slots(&self) -> Result<Vec<RingSlot>> {
        self.storage.ring_slots().await
    }

    /// The backends whose locks keep prune from sealed slots, longest-open transaction first.
    pub async fn prune_blockers(&self) -> Result<Vec<PruneBlocker>> {
        self.storage.prune_blockers().await
    }

    /// Sessions, replication slots and prepared transactions that have held back the database's
    /// MVCC horizon for at least `min_age`, oldest first.
    pub async fn horizon_holders(&self, min_age: Duration) -> Result<Vec<HorizonHolder>> {
        self.storage.horizon_holders(min_age).await
    }

    /// `None` on a primary. On a hot standby (a read URL for reports and dashboards), how stale its
    /// reads may be: when its last replayed commit was made on the primary, and the WAL it received
    /// but has not replayed yet.
    pub async fn replica_status(&self) -> Result<Option<ReplicaStatus>> {
        self.storage.replica_status().await
    }

    /// Live and dead tuples and size of every table of the schema.
    pub async fn table_health(&self) -> Result<Vec<TableHealth>> {
        self.storage.table_health().await
    }

    /// Run one maintenance pass now (rotate, rescue, prune, promote, retention), as the elected
    /// leader's tick does, and report what it did. Safe beside a running leader: every step takes
    /// the locks the leader's would.
    pub async fn run_maintenance(&self, config: &MaintenanceConfig) -> Result<TickReport> {
        crate::maintenance::tick(&self.storage, config).await
    }
}

/// An operator handle over the engine's storage handle (its pool, pooler mode and schema), for
/// ringwork's own tests and benchmark lab.
#[cfg(feature = "testing")]
#[doc(hidden)]
impl From<Storage> for Admin {
    fn from(storage: Storage) -> Self {
        Self::from_storage(storage)
    }
}

/// A queue that holds available jobs nobody is taking (see [`Admin::unworked_queues`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnworkedQueue {
    /// The queue's name.
    pub queue: String,
    /// Its available jobs.
    pub available: i64,
    /// How long its oldest available job has waited.
    pub oldest_wait: Duration,
    /// How long ago a process last claimed from it; `None` when the ring holds no claim of it.
    pub last_claim_age: Option<Duration>,
}

/// The queue of `counts`, if it holds available jobs nobody is taking (see
/// [`Admin::unworked_queues`]); two index probes per lane that may hold work, none for a queue
/// without available jobs.
pub(crate) async fn unworked_queue(
    storage: &Storage,
    counts: &QueueCounts,
    idle: Duration,
) -> Result<Option<UnworkedQueue>> {
    if !may_be_unworked(counts) {
        return Ok(None);
    }
    let Some(oldest_wait) = storage.oldest_available_wait(&counts.queue).await? else {
        return Ok(None);
    };
    unworked_after_wait(storage, counts, oldest_wait, idle).await
}

/// Whether `counts` leave the queue a candidate for [`unworked_queue`]. Running jobs mean a process
/// works the queue, even one that claims nothing new for a while (long jobs, a concurrency limit
/// reached).
fn may_be_unworked(counts: &QueueCounts) -> bool {
    !counts.paused && counts.available > 0 && counts.running == 0
}

/// [`unworked_queue`] for a caller that has read the queue's oldest wait already (the metrics
/// scrape does, for every queue with available jobs): only a candidate whose oldest job waited
/// `idle` pays for the last-claim probe.
pub(crate) async fn unworked_after_wait(
    storage: &Storage,
    counts: &QueueCounts,
    oldest_wait: Duration,
    idle: Duration,
) -> Result<Option<UnworkedQueue>> {
    if !may_be_unworked(counts) || oldest_wait < idle {
        return Ok(None);
    }
    let last_claim_age = storage.last_claim_age(&counts.queue).await?;
    Ok(last_claim_age
        .is_none_or(|age| age >= idle)
        .then(|| UnworkedQueue {
            queue: counts.queue.clone(),
            available: counts.available,
            oldest_wait,
            last_claim_age,
        }))
}
