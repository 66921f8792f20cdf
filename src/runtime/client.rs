//! `ClientBuilder`, `Client` and `RunningClient`: building (validation, migration, queue lanes),
//! inserting, operator calls, starting the runtime's tasks and shutting them down gracefully.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::warn;

use super::dispatcher::Dispatcher;
use super::handler::{JobContext, Registry};
use super::{completer, heartbeat, notifier};
use super::{
    CompletionConfig, Finished, HandlerRuntime, Inner, Liveness, Metrics, QueueConfig, RunningGuard,
};
use crate::error::{Error, Result};
use crate::job::{JobArgs, NewJob};
use crate::maintenance::{self, MaintenanceConfig};
use crate::schema::{self, RingSizes, SchemaName};
use crate::storage::Storage;
use crate::telemetry::Telemetry;

/// Configures a [`Client`]: schema, rings, queues, handlers, schedules, completion, maintenance
/// and telemetry. Made by [`Client::builder`]; `build` checks and connects.
pub struct ClientBuilder {
    pool: PgPool,
    schema: SchemaName,
    schema_error: Option<Error>,
    rings: RingSizes,
    queues: Vec<(String, QueueConfig)>,
    registry: Registry,
    /// Each registered kind with the queue it declares ([`JobArgs::QUEUE`]).
    kind_queues: Vec<(&'static str, &'static str)>,
    completion: CompletionConfig,
    maintenance: MaintenanceConfig,
    migrate: bool,
    handler_threads: Option<usize>,
    engine_pool_size: Option<u32>,
    telemetry: Option<Telemetry>,
    periodic: Vec<crate::periodic::Periodic>,
    /// Some when the pool goes through a transaction-mode pooler; the inner pool reaches the
    /// server directly.
    transaction_pooler: Option<Option<PgPool>>,
}

impl ClientBuilder {
    /// Threads of the runtime that runs handlers (default: the machine's available parallelism,
    /// at least 2). Handlers run apart from the client's own tasks, so a handler that blocks its
    /// thread cannot stop heartbeats or completion flushes; it still takes a handler thread for as
    /// long as it blocks, so run blocking work with `tokio::task::spawn_blocking`.
    pub fn handler_threads(mut self, threads: usize) -> Self {
        self.handler_threads = Some(threads);
        self
    }

    /// Connections the client opens for its own work, apart from your pool (default: the number
    /// of queues plus 4, at most 1000; at least 3, and 4 with periodic schedules, whose first fire
    /// into a queue without lanes holds one connection while it creates them on another). They carry the NOTIFY listener (one, for as long as the
    /// client runs), the maintenance leader's lock (one, while this process leads), and claims,
    /// completion flushes, heartbeats and maintenance passes, which wait for one another when
    /// fewer are free. A process then holds at most this many connections besides your pool's:
    /// the budget to set when many processes share a server's `max_connections`.
    pub fn engine_pool_size(mut self, connections: u32) -> Self {
        self.engine_pool_size = Some(connections);
        self
    }

    /// Schema holding ringwork's tables (default `ringwork`).
    pub fn schema(mut self, name: &str) -> Self {
        match SchemaName::new(name) {
            Ok(s) => self.schema = s,
            Err(e) => self.schema_error = Some(e),
        }
        self
    }

    /// Ring sizes for a schema this build creates (default 16 queue slots, 8 claim slots); fixed
    /// once the schema exists.
    pub fn rings(mut self, rings: RingSizes) -> Self {
        self.rings = rings;
        self
    }

    /// Work this queue in this process.
    pub fn queue(mut self, name: &str, config: QueueConfig) -> Self {
        self.queues.push((name.to_string(), config));
        self
    }

    /// Run `handler` for jobs of kind `A::KIND`. Its error may be of any type that converts into
    /// a boxed error (`?` on `sqlx::Error`, `std::io::Error`, `anyhow::Error`, ...): the attempt is
    /// retried with backoff and the error, with its sources, recorded. Return a `JobError` (also
    /// through `?` or wrapped as a source) for an explicit outcome: retry after, snooze, terminal.
    pub fn register<A, F, Fut, E>(mut self, handler: F) -> Self
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<super::handler::BoxError> + 'static,
    {
        self.registry.register::<A, F, Fut, E>(handler);
        self.kind_queues.push((A::KIND, A::QUEUE));
        self
    }

    /// How long retried attempts of jobs of kind `A::KIND` wait before they run again (see
    /// `RetryPolicy`); it wins over the queue's `QueueConfig::retry_policy`.
    pub fn retry_policy<A: JobArgs>(mut self, policy: super::handler::RetryPolicy) -> Self {
        self.registry.set_retry_policy(A::KIND, policy);
        self
    }

    /// Enqueue a job on a schedule (see `Periodic`). Every started process that declares a
    /// schedule evaluates it each maintenance tick, and exactly one fires each fire time; a
    /// schedule removed from the code stops firing once no running process declares it.
    pub fn periodic(mut self, schedule: crate::periodic::Periodic) -> Self {
        self.periodic.push(schedule);
        self
    }

    /// How this process batches completions (see `CompletionConfig`).
    pub fn completion(mut self, config: CompletionConfig) -> Self {
        self.completion = config;
        self
    }

    /// How this process runs maintenance when it leads (see `MaintenanceConfig`).
    pub fn maintenance(mut self, config: MaintenanceConfig) -> Self {
        self.maintenance = config;
        self
    }

    /// The pool reaches PostgreSQL through a transaction-mode pooler (PgBouncer with `pool_mode =
    /// transaction`; see docs/operations.md). Every statement then runs unnamed inside a
    /// transaction, so the pooler may hand each one to any server connection. `session`, if given,
    /// is a pool that reaches the server directly, for what needs a session of its own:
    /// - LISTEN, which wakes dispatchers as jobs are inserted; without it they poll
    ///   (`QueueConfig::poll_interval`);
    /// - the maintenance leader's session lock; without it this process never leads maintenance
    ///   (rescue, promotion, rotation, prune), so at least one process of the fleet must have it;
    /// - migrations, which otherwise run through the pooler (one transaction, so that works too).
    ///
    /// The application's own statements on this pool (and in `insert_tx`'s transaction) must be
    /// pooler-safe too: disable sqlx's statement cache and use `persistent(false)`.
    pub fn transaction_pooler(mut self, session: Option<PgPool>) -> Self {
        self.transaction_pooler = Some(session);
        self
    }

    /// Apply migrations at build (default true). Without it, build still refuses a newer schema.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Record metrics on `meter` (default: the global meter provider's `ringwork` meter, which
    /// exports nothing until the application installs an OpenTelemetry SDK provider).
    pub fn meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.telemetry = Some(Telemetry::new(meter));
        self
    }

    /// Record metrics on instruments already made (to share them with `http::Endpoints`).
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// Check the configuration, reach the server, apply migrations (or, with `migrate(false)`,
    /// refuse a newer schema), and create the declared queues. Starts nothing: see `start`.
    pub async fn build(self) -> Result<Client> {
        if let Some(e) = self.schema_error {
            return Err(e);
        }
        for (queue, config) in &self.queues {
            config.validate(queue)?;
        }
        self.maintenance.validate()?;
        self.registry.validate()?;
        // A handler on a kind whose jobs go to a queue this process does not work runs only if
        // another process works that queue, or its producers name one this process works: say so
        // once at start, since such jobs otherwise wait without a sign.
        if !self.queues.is_empty() {
            for (kind, queue) in &self.kind_queues {
                // a kind that declares no queue goes to the default one, as before kinds could
                // declare theirs: no sign of a mistake
                if *queue != crate::job::DEFAULT_QUEUE
                    && !self.queues.iter().any(|(name, _)| name == queue)
                {
                    tracing::warn!(
                        kind,
                        queue,
                        "kind {kind:?} declares queue {queue:?}, which this client does not work: \
                         its jobs run here only when their producer names a queue it works"
                    );
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for schedule in &self.periodic {
            if !names.insert(schedule.name()) {
                return Err(Error::Config(format!(
                    "two periodic schedules are named {:?}: a name identifies a schedule's fires",
                    schedule.name()
                )));
            }
        }
        let handler_threads = self.handler_threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .max(2)
        });
        if !(1..=1024).contains(&handler_threads) {
            return Err(Error::Config(format!(
                "handler_threads must be 1..=1024, got {handler_threads}"
            )));
        }
        if self.completion.max_batch == 0 || self.completion.max_batch > 4096 {
            return Err(Error::Config(
                "completion max_batch must be 1..=4096".into(),
            ));
        }
        let engine_pool_size = self
            .engine_pool_size
            .unwrap_or((self.queues.len() as u32).saturating_add(4).min(1000));
        if !(3..=1000).contains(&engine_pool_size) {
            return Err(Error::Config(format!(
                "engine_pool_size must be 3..=1000 (the listener, a claim and a completion flush \
                 at least), got {engine_pool_size}"
            )));
        }
        check_reachable(&self.pool).await?;
        let session = self.transaction_pooler.clone().flatten();
        if let Some(session) = &session {
            check_reachable(session).await?;
        }
        let migrator = session.as_ref().unwrap_or(&self.pool);
        if self.migrate {
            schema::migrate(migrator, &self.schema, self.rings).await?;
        } else {
            // a transaction, so that the read also works through a transaction pooler
            let mut tx = migrator.begin().await?;
            let version = schema::installed_version(&mut tx, &self.schema).await?;
            schema::check_not_newer(&self.schema, version)?;
        }
        let engine_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(engine_pool_size)
            .acquire_timeout(self.pool.options().get_acquire_timeout())
            .connect_lazy_with((*self.pool.connect_options()).clone());
        let mut engine = Storage::new(engine_pool, self.schema.clone());
        let mut storage = Storage::new(self.pool, self.schema);
        if let Some(session) = self.transaction_pooler {
            engine = engine.behind_transaction_pooler(session.clone());
            storage = storage.behind_transaction_pooler(session);
        }
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
                handlers: HandlerRuntime::new(handler_threads)?,
                storage,
                engine,
                queues: self.queues,
                registry: self.registry,
                completion: self.completion,
                maintenance: self.maintenance,
                metrics: Arc::new(Metrics::default()),
                telemetry: self.telemetry.unwrap_or_default(),
                periodic: self.periodic.into(),
            }),
        })
    }
}

/// A ringwork client: inserts jobs, and runs workers and maintenance once started.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// A builder on `pool` with the defaults: schema `ringwork`, default ring sizes, no queues,
    /// migrations applied at build.
    pub fn builder(pool: PgPool) -> ClientBuilder {
        ClientBuilder {
            pool,
            schema: SchemaName::default(),
            schema_error: None,
            rings: RingSizes::default(),
            queues: Vec::new(),
            registry: Registry::default(),
            kind_queues: Vec::new(),
            completion: CompletionConfig::default(),
            maintenance: MaintenanceConfig::default(),
            migrate: true,
            handler_threads: None,
            engine_pool_size: None,
            telemetry: None,
            periodic: Vec::new(),
            transaction_pooler: None,
        }
    }

    /// The operator API on this client's pool and schema: counts, pause, limits, cancel, retry,
    /// bulk, dead letters, schedules, callbacks, health.
    pub fn admin(&self) -> crate::Admin {
        crate::Admin::from_storage(self.inner.storage.clone())
    }

    /// The engine's storage handle on this client's pool and schema (claim, complete, rotate,
    /// prune, ...), for ringwork's own tests and benchmark lab: not a stable API, and only with the
    /// `testing` feature. Operators and services use [`Client::admin`].
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn storage(&self) -> &Storage {
        &self.inner.storage
    }

    #[cfg(feature = "testing")]
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// This client's in-process counters, shared: read them while it runs.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.inner.metrics)
    }

    /// The OpenTelemetry instruments this client records on.
    pub fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    fn count_enqueued(&self, jobs: &[NewJob]) {
        self.inner
            .telemetry
            .enqueued(jobs.iter().map(|j| j.queue.as_str()));
    }

    /// Insert one job in its own transaction.
    pub async fn insert(&self, job: NewJob) -> Result<i64> {
        let storage = &self.inner.storage;
        let id = if storage.transaction_pooler() {
            // behind a transaction pooler a statement needs a transaction around it
            let mut tx = storage.pool().begin().await?;
            let id = storage.insert(&mut tx, &job).await?;
            tx.commit().await?;
            id
        } else {
            let mut conn = storage.pool().acquire().await?;
            storage.insert(&mut conn, &job).await?
        };
        self.count_enqueued(std::slice::from_ref(&job));
        Ok(id)
    }

    /// Insert one job inside the caller's transaction (`&mut *tx`): it exists only if that commits.
    pub async fn insert_tx(&self, conn: &mut PgConnection, job: NewJob) -> Result<i64> {
        let id = self.inner.storage.insert(conn, &job).await?;
        self.count_enqueued(std::slice::from_ref(&job));
        Ok(id)
    }

    /// Insert many jobs (COPY for large lanes) on `conn`, the caller's transaction included.
    pub async fn insert_many_tx(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>> {
        let ids = self.inner.storage.insert_many(conn, jobs).await?;
        self.count_enqueued(jobs);
        Ok(ids)
    }

    /// Insert a workflow in one transaction of its own: its steps without dependencies become
    /// available at once, the others when the steps they depend on are final.
    pub async fn insert_workflow(
        &self,
        workflow: crate::Workflow,
    ) -> Result<crate::InsertedWorkflow> {
        let storage = &self.inner.storage;
        // one statement, atomic on its own: no BEGIN and COMMIT round trips around it, except
        // behind a transaction pooler, where a statement needs a transaction around it
        let inserted = if storage.transaction_pooler() {
            let mut tx = storage.pool().begin().await?;
            let inserted = storage.insert_workflow(&mut tx, &workflow).await?;
            tx.commit().await?;
            inserted
        } else {
            let mut conn = storage.pool().acquire().await?;
            storage.insert_workflow(&mut conn, &workflow).await?
        };
        self.inner.telemetry.enqueued(workflow.queues());
        Ok(inserted)
    }

    /// Insert a workflow inside the caller's transaction (`&mut *tx`): nothing of it exists
    /// unless that commits.
    pub async fn insert_workflow_tx(
        &self,
        conn: &mut PgConnection,
        workflow: crate::Workflow,
    ) -> Result<crate::InsertedWorkflow> {
        let inserted = self.inner.storage.insert_workflow(conn, &workflow).await?;
        self.inner.telemetry.enqueued(workflow.queues());
        Ok(inserted)
    }

    /// Insert many workflows in one transaction of its own and one statement: set-based over all
    /// their steps, several times cheaper a workflow than one insert each. What each wrote, in
    /// the order given; nothing is written if any workflow is refused.
    pub async fn insert_workflows(
        &self,
        workflows: &[crate::Workflow],
    ) -> Result<Vec<crate::InsertedWorkflow>> {
        let storage = &self.inner.storage;
        // one statement, as insert_workflow
        let inserted = if storage.transaction_pooler() {
            let mut tx = storage.pool().begin().await?;
            let inserted = storage.insert_workflows(&mut tx, workflows).await?;
            tx.commit().await?;
            inserted
        } else {
            let mut conn = storage.pool().acquire().await?;
            storage.insert_workflows(&mut conn, workflows).await?
        };
        self.inner
            .telemetry
            .enqueued(workflows.iter().flat_map(crate::Workflow::queues));
        Ok(inserted)
    }

    /// Insert many workflows inside the caller's transaction (`&mut *tx`): nothing of them exists
    /// unless that commits.
    pub async fn insert_workflows_tx(
        &self,
        conn: &mut PgConnection,
        workflows: &[crate::Workflow],
    ) -> Result<Vec<crate::InsertedWorkflow>> {
        let inserted = self.inner.storage.insert_workflows(conn, workflows).await?;
        self.inner
            .telemetry
            .enqueued(workflows.iter().flat_map(crate::Workflow::queues));
        Ok(inserted)
    }

    /// Insert a batch in one transaction of its own (sealed when it has a callback).
    pub async fn insert_batch(&self, batch: crate::Batch) -> Result<crate::InsertedBatch> {
        let mut tx = self.inner.storage.pool().begin().await?;
        let inserted = self.inner.storage.insert_batch(&mut tx, &batch).await?;
        tx.commit().await?;
        self.inner.telemetry.enqueued(batch.queues());
        Ok(inserted)
    }

    /// Insert a batch inside the caller's transaction (`&mut *tx`).
    pub async fn insert_batch_tx(
        &self,
        conn: &mut PgConnection,
        batch: crate::Batch,
    ) -> Result<crate::InsertedBatch> {
        let inserted = self.inner.storage.insert_batch(conn, &batch).await?;
        self.inner.telemetry.enqueued(batch.queues());
        Ok(inserted)
    }

    /// Add members to an open batch on `conn` (the caller's transaction, or a pool connection);
    /// refused once the batch is sealed. Their job ids.
    pub async fn add_to_batch_tx(
        &self,
        conn: &mut PgConnection,
        batch_id: i64,
        members: &[NewJob],
    ) -> Result<Vec<i64>> {
        let ids = self
            .inner
            .storage
            .add_to_batch(conn, batch_id, members)
            .await?;
        self.count_enqueued(members);
        Ok(ids)
    }

    /// Seal an open batch on `conn` with its callback, run once every member is final (only if
    /// every member completed, with `success_only`). Members already final count at once. The
    /// callback's job id.
    pub async fn seal_batch_tx(
        &self,
        conn: &mut PgConnection,
        batch_id: i64,
        callback: NewJob,
        success_only: bool,
    ) -> Result<i64> {
        let id = self
            .inner
            .storage
            .seal_batch(conn, batch_id, &callback, success_only)
            .await?;
        self.count_enqueued(std::slice::from_ref(&callback));
        Ok(id)
    }

    /// Insert many jobs in one transaction of their own.
    pub async fn insert_many(&self, jobs: &[NewJob]) -> Result<Vec<i64>> {
        let mut tx = self.inner.storage.pool().begin().await?;
        let ids = self.inner.storage.insert_many(&mut tx, jobs).await?;
        tx.commit().await?;
        self.count_enqueued(jobs);
        Ok(ids)
    }

    /// Insert jobs (unique ones deduplicated) and say for each whether it was a duplicate.
    pub async fn insert_many_reporting(
        &self,
        jobs: &[NewJob],
    ) -> Result<Vec<crate::storage::Inserted>> {
        let mut tx = self.inner.storage.pool().begin().await?;
        let inserted = self.insert_many_reporting_tx(&mut tx, jobs).await?;
        tx.commit().await?;
        Ok(inserted)
    }

    /// `insert_many_reporting` on `conn`, the caller's transaction included: the jobs exist only
    /// if it commits.
    pub async fn insert_many_reporting_tx(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<crate::storage::Inserted>> {
        let inserted = self.inner.storage.insert_many_reporting(conn, jobs).await?;
        self.inner.telemetry.enqueued(
            jobs.iter()
                .zip(&inserted)
                .filter(|(_, i)| !i.duplicate)
                .map(|(j, _)| j.queue.as_str()),
        );
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
            wakers.insert(queue.clone(), Arc::new(notifier::QueueWake::default()));
        }
        let wakers = Arc::new(wakers);
        let mut tasks = Vec::new();

        let listening = Arc::new(AtomicBool::new(false));
        let maintenance_signals = Arc::new(maintenance::Signals::default());
        tasks.push(tokio::spawn(notifier::listen(
            Arc::clone(&self.inner),
            Arc::clone(&wakers),
            Arc::clone(&listening),
            Arc::clone(&maintenance_signals),
            stop_rx.clone(),
        )));
        let flush = Arc::new(completer::FlushSignals::default());
        let batcher = tokio::spawn(completer::completion_batcher(
            self.inner.engine.clone(),
            self.inner.completion.clone(),
            Arc::clone(&self.inner.metrics),
            self.inner.telemetry.clone(),
            Arc::clone(&flush),
            done_rx,
        ));
        let mut dispatchers = Vec::new();
        let (liveness, running) = Liveness::new(self.inner.queues.len(), stop_rx.clone());
        for (queue, config) in &self.inner.queues {
            let dispatcher = Dispatcher {
                inner: Arc::clone(&self.inner),
                queue: queue.clone(),
                config: config.clone(),
                workers: Arc::new(Semaphore::new(config.max_workers)),
                claims: Arc::new(Semaphore::new(config.max_workers + config.claim_ahead)),
                claims_total: config.max_workers + config.claim_ahead,
                wake: Arc::clone(&wakers[queue]),
                listening: Arc::clone(&listening),
                done: done_tx.clone(),
                flush: Arc::clone(&flush),
                dry: Arc::new(AtomicBool::new(false)),
                finished: Arc::new(Notify::new()),
            };
            dispatchers.push(QueueRoom {
                claims: Arc::clone(&dispatcher.claims),
                claims_total: dispatcher.claims_total,
                workers: Arc::clone(&dispatcher.workers),
            });
            let guard = RunningGuard::new(&running);
            let stop = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                let _running = guard;
                dispatcher.run(stop).await
            }));
        }
        // Heartbeats have a stop of their own: they go on through the shutdown drain, so a handler
        // still finishing its job is not rescued (and run again elsewhere) while it drains.
        let (heartbeat_stop, heartbeat_stop_rx) = watch::channel(false);
        let heartbeat = tokio::spawn(heartbeat::heartbeats(
            Arc::clone(&self.inner),
            heartbeat_stop_rx,
        ));
        tasks.push(tokio::spawn(heartbeat::watch_blocking(
            Arc::clone(&self.inner),
            stop_rx.clone(),
        )));
        if self.inner.maintenance.enabled {
            tasks.push(tokio::spawn(maintenance::run(
                self.inner.engine.clone(),
                self.inner.maintenance.clone(),
                self.inner.telemetry.clone(),
                Arc::clone(&listening),
                maintenance_signals,
                stop_rx.clone(),
            )));
        }
        if !self.inner.periodic.is_empty() {
            tasks.push(tokio::spawn(crate::periodic::run(
                self.inner.engine.clone(),
                Arc::clone(&self.inner.periodic),
                self.inner.maintenance.tick,
                stop_rx.clone(),
            )));
        }
        Ok(RunningClient {
            inner: Arc::clone(&self.inner),
            stop: stop_tx,
            tasks,
            heartbeat_stop,
            heartbeat: Some(heartbeat),
            dispatchers,
            done: Some(done_tx),
            batcher: Some(batcher),
            liveness,
        })
    }
}

/// One queue's semaphores, as shutdown sees them.
struct QueueRoom {
    /// Idle when all `claims_total` permits are back: every claimed job has finished.
    claims: Arc<Semaphore>,
    claims_total: usize,
    /// Closed at shutdown: jobs claimed ahead and still waiting for a worker are handed back.
    workers: Arc<Semaphore>,
}

/// A started client. `shutdown` stops claiming, drains running handlers and flushes completions.
pub struct RunningClient {
    inner: Arc<Inner>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    heartbeat_stop: watch::Sender<bool>,
    heartbeat: Option<JoinHandle<()>>,
    dispatchers: Vec<QueueRoom>,
    done: Option<mpsc::UnboundedSender<Finished>>,
    batcher: Option<JoinHandle<()>>,
    liveness: Liveness,
}

impl RunningClient {
    /// Whether this client's dispatchers all still run (for a liveness probe).
    pub fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// Graceful shutdown: stop claiming, wait up to `drain` for running handlers, flush completions.
    /// Heartbeats go on during the drain, so a long handler is not rescued while it finishes.
    /// Handlers still running after `drain` are told to stop (`JobContext::cancelled`) and are not
    /// waited for; their heartbeats stop and their claims stay open for rescue unless they finish
    /// while the completions flush. Jobs claimed ahead that have not started are handed back to
    /// their queue at once (a snooze to now, which uses no attempt).
    pub async fn shutdown(mut self, drain: Duration) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        // No new handler starts from here: jobs claimed ahead that still wait for a worker go
        // back to their queue at once (a snooze to now, no attempt used) for another process,
        // instead of starting now and perhaps outliving the drain.
        for queue in &self.dispatchers {
            queue.workers.close();
        }
        let wait_idle = async {
            for queue in &self.dispatchers {
                let _ = queue.claims.acquire_many(queue.claims_total as u32).await;
            }
        };
        if tokio::time::timeout(drain, wait_idle).await.is_err() {
            warn!("shutdown: handlers still running after {drain:?}; they are told to stop and their claims are left for rescue");
            // Their heartbeats stop now: rescue will run them elsewhere, so ask them to stop here
            // rather than run on beside the new attempt.
            if let Ok(running) = self.inner.running.lock() {
                for attempt in running.values() {
                    attempt.cancel.set();
                }
            }
        }
        let _ = self.heartbeat_stop.send(true);
        if let Some(heartbeat) = self.heartbeat.take() {
            let _ = heartbeat.await;
        }
        drop(self.done.take());
        if let Some(batcher) = self.batcher.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), batcher).await;
        }
    }
}

/// Fail within a few seconds, with the cause, when the server cannot be reached. A pool keeps
/// retrying a refused or unreachable server until its acquire timeout (30 s by default) and then
/// reports only that it timed out; one direct connection reports "connection refused", a DNS
/// failure or a wrong password at once. Costs nothing when the pool already has a connection.
pub async fn check_reachable(pool: &PgPool) -> Result<()> {
    if pool.size() > 0 {
        return Ok(());
    }
    let options = pool.connect_options();
    let target = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(sqlx::Error::Io(e))) => Err(Error::Unreachable {
            target,
            reason: e.to_string(),
        }),
        // The server answered but is starting up or out of connection slots: transient, so
        // leave it to the pool, which retries until its acquire timeout.
        Ok(Err(sqlx::Error::Database(e)))
            if matches!(e.code().as_deref(), Some("57P03") | Some("53300")) =>
        {
            Ok(())
        }
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(Error::Unreachable {
            target,
            reason: "no answer within 5 s".into(),
        }),
    }
}
