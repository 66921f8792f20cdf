//! The runtime: a `Client` per process runs one dispatcher per queue, a completion batcher, a
//! LISTEN/NOTIFY wake-up (with a polling fallback) and, when it wins the election, maintenance.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::job::{validate_name, JobArgs, NewJob};
use crate::maintenance::{self, MaintenanceConfig};
use crate::schema::{self, RingSizes, SchemaName};
use crate::storage::{AttemptRef, ClaimedJob, CloseOutcome, Outcome, Storage};
use crate::worker::{retry_backoff, CancelSignal, JobContext, JobError, Registry};

/// Per-queue runtime settings.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Handlers of this queue running at once in this process.
    pub max_workers: usize,
    /// Most jobs taken by one claim call.
    pub claim_batch: usize,
    /// How long an idle dispatcher waits for a NOTIFY before claiming anyway.
    pub poll_interval: Duration,
    /// Optional deadline stamped on every claim batch: the handler is stopped when it passes, and
    /// deadline rescue closes the attempt if its worker cannot.
    pub deadline: Option<Duration>,
    /// Priority aging: a lane's effective priority improves one level per this much waiting by its
    /// oldest job, so low priorities never starve. `None` (or zero) disables aging.
    pub priority_aging: Option<Duration>,
    /// Send this queue's terminal failures to the dead-letter queue (`dlq_entries`) instead of
    /// failed history, for an operator to inspect, retry or purge. Switched on for the queue when
    /// the client is built; never switched off by a client (use `Storage::set_queue_dead_letter`).
    pub dead_letter: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_workers: 32,
            claim_batch: 128,
            poll_interval: Duration::from_millis(250),
            deadline: None,
            priority_aging: Some(Duration::from_secs(60)),
            dead_letter: false,
        }
    }
}

impl QueueConfig {
    fn validate(&self, queue: &str) -> Result<()> {
        validate_name("queue name", queue)?;
        if !(1..=10_000).contains(&self.max_workers) {
            return Err(Error::Config(format!(
                "queue {queue:?}: max_workers must be 1..=10000, got {}",
                self.max_workers
            )));
        }
        if !(1..=4096).contains(&self.claim_batch) {
            return Err(Error::Config(format!(
                "queue {queue:?}: claim_batch must be 1..=4096, got {}",
                self.claim_batch
            )));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config(format!(
                "queue {queue:?}: poll_interval must be > 0"
            )));
        }
        Ok(())
    }
}

/// How completions are batched.
#[derive(Clone, Debug)]
pub struct CompletionConfig {
    pub max_batch: usize,
    pub max_delay: Duration,
}

impl Default for CompletionConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            max_delay: Duration::from_millis(5),
        }
    }
}

/// Counters a caller can read while the client runs.
#[derive(Debug, Default)]
pub struct Metrics {
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    pub retried: AtomicU64,
    pub failed: AtomicU64,
    pub stale: AtomicU64,
    /// Pickup latency samples (enqueue → handler start), in milliseconds, when enabled.
    pub pickup_ms: Mutex<Option<Vec<f64>>>,
}

impl Metrics {
    /// Start keeping pickup-latency samples.
    pub fn record_pickup_latency(&self) {
        if let Ok(mut samples) = self.pickup_ms.lock() {
            samples.get_or_insert_with(Vec::new);
        }
    }
}

pub struct ClientBuilder {
    pool: PgPool,
    schema: SchemaName,
    schema_error: Option<Error>,
    rings: RingSizes,
    queues: Vec<(String, QueueConfig)>,
    registry: Registry,
    completion: CompletionConfig,
    maintenance: MaintenanceConfig,
    migrate: bool,
}

impl ClientBuilder {
    /// Schema holding ringwork's tables (default `ringwork`).
    pub fn schema(mut self, name: &str) -> Self {
        match SchemaName::new(name) {
            Ok(s) => self.schema = s,
            Err(e) => self.schema_error = Some(e),
        }
        self
    }

    pub fn rings(mut self, rings: RingSizes) -> Self {
        self.rings = rings;
        self
    }

    /// Work this queue in this process.
    pub fn queue(mut self, name: &str, config: QueueConfig) -> Self {
        self.queues.push((name.to_string(), config));
        self
    }

    /// Run `handler` for jobs of kind `A::KIND`.
    pub fn register<A, F, Fut>(mut self, handler: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        self.registry.register::<A, F, Fut>(handler);
        self
    }

    pub fn completion(mut self, config: CompletionConfig) -> Self {
        self.completion = config;
        self
    }

    pub fn maintenance(mut self, config: MaintenanceConfig) -> Self {
        self.maintenance = config;
        self
    }

    /// Apply migrations at build (default true). Without it, build still refuses a newer schema.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    pub async fn build(self) -> Result<Client> {
        if let Some(e) = self.schema_error {
            return Err(e);
        }
        for (queue, config) in &self.queues {
            config.validate(queue)?;
        }
        self.maintenance.validate()?;
        if self.completion.max_batch == 0 || self.completion.max_batch > 4096 {
            return Err(Error::Config(
                "completion max_batch must be 1..=4096".into(),
            ));
        }
        if self.migrate {
            schema::migrate(&self.pool, &self.schema, self.rings).await?;
        } else {
            let mut conn = self.pool.acquire().await?;
            let version = schema::installed_version(&mut conn, &self.schema).await?;
            schema::check_not_newer(&self.schema, version)?;
        }
        let storage = Storage::new(self.pool, self.schema);
        for (queue, config) in &self.queues {
            storage.ensure_queue(queue).await?;
            // only ever switches it on: a process started without the flag must not turn off
            // another process's dead-letter queue (operators switch it off explicitly)
            if config.dead_letter {
                storage.set_queue_dead_letter(queue, true).await?;
            }
        }
        Ok(Client {
            inner: Arc::new(Inner {
                running: Mutex::default(),
                storage,
                queues: self.queues,
                registry: self.registry,
                completion: self.completion,
                maintenance: self.maintenance,
                metrics: Arc::new(Metrics::default()),
            }),
        })
    }
}

/// Attempts running in this process, for heartbeats: (job_id, run_lease) -> (attempt, started).
type RunningAttempts =
    Mutex<HashMap<(i64, i64), (AttemptRef, std::time::Instant, Arc<CancelSignal>)>>;

struct Inner {
    running: RunningAttempts,
    storage: Storage,
    queues: Vec<(String, QueueConfig)>,
    registry: Registry,
    completion: CompletionConfig,
    maintenance: MaintenanceConfig,
    metrics: Arc<Metrics>,
}

/// A ringwork client: inserts jobs, and runs workers and maintenance once started.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    pub fn builder(pool: PgPool) -> ClientBuilder {
        ClientBuilder {
            pool,
            schema: SchemaName::default(),
            schema_error: None,
            rings: RingSizes::default(),
            queues: Vec::new(),
            registry: Registry::default(),
            completion: CompletionConfig::default(),
            maintenance: MaintenanceConfig::default(),
            migrate: true,
        }
    }

    pub fn storage(&self) -> &Storage {
        &self.inner.storage
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.inner.metrics)
    }

    /// Insert one job in its own transaction.
    pub async fn insert(&self, job: NewJob) -> Result<i64> {
        let mut conn = self.inner.storage.pool().acquire().await?;
        self.inner.storage.insert(&mut conn, &job).await
    }

    /// Insert one job inside the caller's transaction (`&mut *tx`): it exists only if that commits.
    pub async fn insert_tx(&self, conn: &mut PgConnection, job: NewJob) -> Result<i64> {
        self.inner.storage.insert(conn, &job).await
    }

    /// Insert many jobs (COPY for large lanes) on `conn`, the caller's transaction included.
    pub async fn insert_many_tx(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        self.inner.storage.insert_many(conn, jobs).await
    }

    /// Insert many jobs in one transaction of their own.
    pub async fn insert_many(&self, jobs: &[NewJob]) -> Result<Vec<i64>> {
        let mut tx = self.inner.storage.pool().begin().await?;
        let ids = self.inner.storage.insert_many(&mut tx, jobs).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Insert jobs (unique ones deduplicated) and say for each whether it was a duplicate.
    pub async fn insert_many_reporting(
        &self,
        jobs: &[NewJob],
    ) -> Result<Vec<crate::storage::Inserted>> {
        let mut tx = self.inner.storage.pool().begin().await?;
        let inserted = self
            .inner
            .storage
            .insert_many_reporting(&mut tx, jobs)
            .await?;
        tx.commit().await?;
        Ok(inserted)
    }

    /// Cancel the job holding this unique job's key (see `NewJob::unique`).
    pub async fn cancel_unique(&self, job: &NewJob) -> Result<crate::storage::CancelOutcome> {
        self.inner.storage.cancel_unique(job, "cancelled").await
    }

    /// Exact per-queue counts (all queues when `queue` is `None`).
    pub async fn queue_counts(
        &self,
        queue: Option<&str>,
    ) -> Result<Vec<crate::storage::QueueCounts>> {
        self.inner.storage.queue_counts(queue).await
    }

    /// Cancel a job by id: an available or scheduled job never runs; a running one has its claim
    /// closed and its handler signalled (`JobContext::cancelled`).
    pub async fn cancel(&self, job_id: i64) -> Result<crate::storage::CancelOutcome> {
        self.inner.storage.cancel_job(job_id, "cancelled").await
    }

    /// Start dispatchers, the completion batcher, the NOTIFY listener and the maintenance loop.
    pub async fn start(&self) -> Result<RunningClient> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Finished>();
        let mut wakers = HashMap::new();
        for (queue, _) in &self.inner.queues {
            wakers.insert(queue.clone(), Arc::new(Notify::new()));
        }
        let wakers = Arc::new(wakers);
        let mut tasks = Vec::new();

        tasks.push(tokio::spawn(listen(
            Arc::clone(&self.inner),
            Arc::clone(&wakers),
            stop_rx.clone(),
        )));
        let batcher = tokio::spawn(completion_batcher(
            self.inner.storage.clone(),
            self.inner.completion.clone(),
            Arc::clone(&self.inner.metrics),
            done_rx,
        ));
        let mut dispatchers = Vec::new();
        for (queue, config) in &self.inner.queues {
            let dispatcher = Dispatcher {
                inner: Arc::clone(&self.inner),
                queue: queue.clone(),
                config: config.clone(),
                slots: Arc::new(Semaphore::new(config.max_workers)),
                wake: Arc::clone(&wakers[queue]),
                done: done_tx.clone(),
            };
            dispatchers.push((Arc::clone(&dispatcher.slots), config.max_workers));
            tasks.push(tokio::spawn(dispatcher.run(stop_rx.clone())));
        }
        tasks.push(tokio::spawn(heartbeats(
            Arc::clone(&self.inner),
            stop_rx.clone(),
        )));
        if self.inner.maintenance.enabled {
            tasks.push(tokio::spawn(maintenance::run(
                self.inner.storage.clone(),
                self.inner.maintenance.clone(),
                stop_rx.clone(),
            )));
        }
        Ok(RunningClient {
            stop: stop_tx,
            tasks,
            dispatchers,
            done: Some(done_tx),
            batcher: Some(batcher),
        })
    }
}

/// A started client. `shutdown` stops claiming, drains running handlers and flushes completions.
pub struct RunningClient {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    dispatchers: Vec<(Arc<Semaphore>, usize)>,
    done: Option<mpsc::UnboundedSender<Finished>>,
    batcher: Option<JoinHandle<()>>,
}

impl RunningClient {
    /// Graceful shutdown: stop claiming, wait up to `drain` for running handlers, flush completions.
    /// Handlers still running after `drain` are abandoned; their claims stay open for rescue.
    pub async fn shutdown(mut self, drain: Duration) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let wait_idle = async {
            for (slots, total) in &self.dispatchers {
                let _ = slots.acquire_many(*total as u32).await;
            }
        };
        if tokio::time::timeout(drain, wait_idle).await.is_err() {
            warn!("shutdown: handlers still running after {drain:?}; their claims are left for rescue");
        }
        drop(self.done.take());
        if let Some(batcher) = self.batcher.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), batcher).await;
        }
    }
}

/// A finished attempt on its way to the completion batcher.
struct Finished {
    attempt: AttemptRef,
    result: std::result::Result<(), CloseOutcome>,
}

struct Dispatcher {
    inner: Arc<Inner>,
    queue: String,
    config: QueueConfig,
    slots: Arc<Semaphore>,
    wake: Arc<Notify>,
    done: mpsc::UnboundedSender<Finished>,
}

impl Dispatcher {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0_u32;
        let mut busy_rounds = 0_u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let first = tokio::select! {
                permit = Arc::clone(&self.slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            let mut permits = vec![first];
            while permits.len() < self.config.claim_batch {
                match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let claimed = self
                .inner
                .storage
                .claim_aged(
                    &self.queue,
                    permits.len(),
                    self.config.deadline,
                    self.config.priority_aging,
                )
                .await;
            match claimed {
                Ok(jobs) if !jobs.is_empty() => {
                    failures = 0;
                    busy_rounds = 0;
                    self.inner
                        .metrics
                        .claimed
                        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                    for (job, permit) in jobs.into_iter().zip(permits) {
                        let inner = Arc::clone(&self.inner);
                        let done = self.done.clone();
                        let queue = self.queue.clone();
                        tokio::spawn(async move {
                            let finished = run_job(&inner, &queue, job).await;
                            let _ = done.send(finished);
                            drop(permit);
                        });
                    }
                }
                Ok(_) => {
                    drop(permits);
                    failures = 0;
                    // Empty, or every lane with work was locked by another claimer?
                    let busy = self
                        .inner
                        .storage
                        .queue_has_backlog(&self.queue)
                        .await
                        .unwrap_or(false);
                    // A lane locked by another claimer frees up within milliseconds; a lane held
                    // behind an open producer transaction may not, so back off towards the poll
                    // interval while it stays busy.
                    busy_rounds = if busy {
                        busy_rounds.saturating_add(1)
                    } else {
                        0
                    };
                    let wait = if busy {
                        Duration::from_millis(2 << busy_rounds.min(8))
                            .min(self.config.poll_interval)
                    } else {
                        self.config.poll_interval
                    };
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => return,
                    }
                }
                Err(e) => {
                    drop(permits);
                    failures = failures.saturating_add(1);
                    let backoff = Duration::from_millis(50 * 2_u64.pow(failures.min(6)));
                    warn!(queue = %self.queue, error = %e, "claim failed; retrying in {backoff:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }
}

async fn run_job(inner: &Inner, queue: &str, job: ClaimedJob) -> Finished {
    let attempt = job.attempt_ref();
    let key = (job.job_id, job.run_lease);
    let cancel = Arc::new(CancelSignal::default());
    if let Ok(mut running) = inner.running.lock() {
        running.insert(
            key,
            (attempt, std::time::Instant::now(), Arc::clone(&cancel)),
        );
    }
    let finished = run_handler(inner, queue, job, cancel).await;
    if let Ok(mut running) = inner.running.lock() {
        running.remove(&key);
    }
    finished
}

async fn run_handler(
    inner: &Inner,
    queue: &str,
    job: ClaimedJob,
    cancel: Arc<CancelSignal>,
) -> Finished {
    let attempt = job.attempt_ref();
    if let Ok(mut samples) = inner.metrics.pickup_ms.lock() {
        if let Some(samples) = samples.as_mut() {
            let ms = (Utc::now() - job.created_at)
                .num_microseconds()
                .unwrap_or(0) as f64
                / 1000.0;
            samples.push(ms);
        }
    }
    let result = match inner.registry.get(&job.kind) {
        None => Err(JobError::Terminal(format!(
            "unknown job kind {:?}: no handler is registered for it in this process",
            job.kind
        ))),
        Some(handler) => {
            let ctx = JobContext {
                job_id: job.job_id,
                run_lease: job.run_lease,
                attempt: job.attempt,
                max_attempts: job.max_attempts,
                kind: job.kind.clone(),
                queue: queue.to_string(),
                created_at: job.created_at,
                cancel,
            };
            // A panicking handler is a failed attempt, not a dead worker; one past its deadline is
            // stopped (deadline rescue closes the claim if this process cannot).
            let task = tokio::spawn(handler(ctx, job.args.clone()));
            let abort = task.abort_handle();
            let limit = job
                .deadline_at
                .map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO));
            let joined = match limit {
                Some(limit) => match tokio::time::timeout(limit, task).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        abort.abort();
                        Ok(Err(JobError::Retry(format!(
                            "deadline exceeded after {limit:?}"
                        ))))
                    }
                },
                None => task.await,
            };
            match joined {
                Ok(result) => result,
                Err(e) => Err(JobError::Retry(format!("handler panicked: {e}"))),
            }
        }
    };
    let result = result.map_err(|error| close_outcome(&job, error));
    Finished { attempt, result }
}

fn close_outcome(job: &ClaimedJob, error: JobError) -> CloseOutcome {
    let exhausted = job.attempt >= job.max_attempts;
    match error {
        JobError::Terminal(e) => CloseOutcome::Failed { error: e },
        JobError::Retry(e) | JobError::RetryAfter(_, e) if exhausted => CloseOutcome::Failed {
            error: format!(
                "{e} (attempt {} of {}, exhausted)",
                job.attempt, job.max_attempts
            ),
        },
        JobError::Retry(e) => CloseOutcome::Retry {
            at: Utc::now() + chrono_duration(retry_backoff(job.attempt)),
            error: e,
        },
        JobError::Snooze(delay) => CloseOutcome::Snooze {
            at: Utc::now() + chrono_duration(delay),
        },
        JobError::RetryAfter(delay, e) => CloseOutcome::Retry {
            at: Utc::now() + chrono_duration(delay),
            error: e,
        },
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::hours(1))
}

/// Heartbeat every attempt that has run for longer than a quarter of the staleness window, in one
/// statement per tick. Short jobs finish before their first heartbeat and never create
/// `attempt_state` rows.
async fn heartbeats(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let every = inner.maintenance.stale_after / 4;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        let due: Vec<(AttemptRef, Option<serde_json::Value>)> = match inner.running.lock() {
            Ok(running) => running
                .values()
                .filter(|(_, started, _)| started.elapsed() >= every)
                .map(|(attempt, _, _)| (*attempt, None))
                .collect(),
            Err(_) => continue,
        };
        match inner.storage.heartbeat_batch(&due).await {
            Ok(outcomes) => {
                for ((attempt, _), outcome) in due.iter().zip(outcomes) {
                    if outcome == Outcome::Stale {
                        // closed under us (rescued or cancelled): tell the handler to stop
                        signal_cancel(&inner, &format!("{}:{}", attempt.job_id, attempt.run_lease));
                        warn!(job_id = attempt.job_id, run_lease = attempt.run_lease,
                              "attempt is no longer open (rescued or cancelled); its handler is told to stop");
                    }
                }
            }
            Err(e) => warn!(error = %e, "heartbeat failed"),
        }
    }
}

/// Collects finished attempts and writes them in batches: one `complete_batch` call for the
/// successes and one `close_batch` call for the rest per flush.
async fn completion_batcher(
    storage: Storage,
    config: CompletionConfig,
    metrics: Arc<Metrics>,
    mut rx: mpsc::UnboundedReceiver<Finished>,
) {
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + config.max_delay;
        while batch.len() < config.max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => batch.push(item),
                Ok(None) | Err(_) => break,
            }
        }
        flush(&storage, &metrics, batch).await;
    }
}

async fn flush(storage: &Storage, metrics: &Metrics, batch: Vec<Finished>) {
    let mut successes = Vec::new();
    let mut closes = Vec::new();
    for item in batch {
        match item.result {
            Ok(()) => successes.push(item.attempt),
            Err(close) => closes.push((item.attempt, close)),
        }
    }
    // A lost connection must not lose completions: retry with backoff. If the database stays
    // away, the claims stay open and rescue re-runs the jobs (at-least-once).
    for attempt in 0..8_u32 {
        match storage.complete_batch(&successes).await {
            Ok(outcomes) => {
                count(metrics, &outcomes, &metrics.completed);
                break;
            }
            Err(e) => {
                warn!(error = %e, attempt, "completion flush failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * 2_u64.pow(attempt))).await;
            }
        }
    }
    for attempt in 0..8_u32 {
        match storage.close_batch(&closes).await {
            Ok(outcomes) => {
                for ((_, close), outcome) in closes.iter().zip(&outcomes) {
                    let counter = match close {
                        CloseOutcome::Retry { .. } | CloseOutcome::Snooze { .. } => {
                            &metrics.retried
                        }
                        CloseOutcome::Failed { .. } => &metrics.failed,
                    };
                    count(metrics, std::slice::from_ref(outcome), counter);
                }
                break;
            }
            Err(e) => {
                warn!(error = %e, attempt, "close flush failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * 2_u64.pow(attempt))).await;
            }
        }
    }
}

fn count(metrics: &Metrics, outcomes: &[Outcome], applied: &AtomicU64) {
    for outcome in outcomes {
        match outcome {
            Outcome::Applied => applied.fetch_add(1, Ordering::Relaxed),
            Outcome::Stale => metrics.stale.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// `cancel_job` notifies "job_id:run_lease" of a running attempt it closed; tell its handler.
fn signal_cancel(inner: &Inner, payload: &str) {
    let parsed = payload
        .split_once(':')
        .and_then(|(job, lease)| Some((job.parse::<i64>().ok()?, lease.parse::<i64>().ok()?)));
    if let (Some(key), Ok(running)) = (parsed, inner.running.lock()) {
        if let Some((_, _, signal)) = running.get(&key) {
            signal.set();
        }
    }
}

/// LISTEN for enqueue notifications and wake the matching dispatcher. Reconnects on failure; the
/// dispatchers' poll interval covers the gap (and PgBouncer transaction pooling, where LISTEN
/// does not work at all).
async fn listen(
    inner: Arc<Inner>,
    wakers: Arc<HashMap<String, Arc<Notify>>>,
    mut stop: watch::Receiver<bool>,
) {
    let storage = &inner.storage;
    let channel = storage.schema().notify_channel();
    let cancel_channel = format!("{channel}_cancel");
    loop {
        let mut listener = match PgListener::connect_with(storage.pool()).await {
            Ok(l) => l,
            Err(e) => {
                debug!(error = %e, "listener connect failed; polling only for now");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        if let Err(e) = listener
            .listen_all([channel.as_str(), cancel_channel.as_str()])
            .await
        {
            debug!(error = %e, "LISTEN failed; polling only for now");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                _ = stop.changed() => return,
            }
        }
        loop {
            tokio::select! {
                message = listener.try_recv() => match message {
                    Ok(Some(n)) if n.channel() == cancel_channel => signal_cancel(&inner, n.payload()),
                    Ok(Some(n)) => {
                        if let Some(w) = wakers.get(n.payload()) {
                            w.notify_one();
                        }
                    }
                    // connection lost: wake everyone (notifications may have been missed), reconnect
                    Ok(None) | Err(_) => {
                        for w in wakers.values() {
                            w.notify_one();
                        }
                        break;
                    }
                },
                _ = stop.changed() => return,
            }
        }
    }
}
