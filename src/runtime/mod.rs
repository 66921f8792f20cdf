//! The runtime: a `Client` per process runs one dispatcher per queue, executors for the jobs it
//! claims, a completion batcher, heartbeats for long attempts, a LISTEN/NOTIFY wake-up (with a
//! polling fallback) and, when it wins the election, maintenance.
//!
//! - `client`: the builder, `Client` (inserts, operator calls) and `RunningClient` (shutdown);
//! - `dispatcher`: claims batches for one queue, bounded by its worker slots;
//! - `executor`: runs one claimed job's handler under its deadline, maps the result to an outcome;
//! - `completer`: batches outcomes into one `complete_batch` and one `close_batch` per flush;
//! - `heartbeat`: keeps long attempts from stale rescue, and learns when one was closed under it;
//! - `notifier`: LISTEN for enqueue and cancel notifications;
//! - `handler`: the handler API (`JobContext`, `JobError`) and the registry of kinds.

mod client;
mod completer;
mod dispatcher;
mod executor;
pub(crate) mod handler;
mod heartbeat;
#[cfg(feature = "testing")]
pub(crate) mod inline;
mod notifier;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::job::validate_name;
use crate::maintenance::MaintenanceConfig;
use crate::storage::{AttemptRef, CloseOutcome, Storage};
use handler::{CancelSignal, Registry};

pub use client::{check_reachable, Client, ClientBuilder, RunningClient};
pub(crate) use notifier::NAME_IF_UNNAMED;

/// Per-queue runtime settings.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Handlers of this queue running at once in this process.
    pub max_workers: usize,
    /// Most jobs taken by one claim call.
    pub claim_batch: usize,
    /// How long an idle dispatcher waits for a NOTIFY before claiming anyway, while this process
    /// has no LISTEN connection (not yet connected, reconnecting, or behind a transaction pooler
    /// without a session pool). With one, every insert's NOTIFY wakes the dispatcher, and its
    /// wait doubles at each empty claim up to `IDLE_POLL_MAX` (or this, when longer).
    pub poll_interval: Duration,
    /// Under a backlog (the previous claim came back full), how long the dispatcher may wait for
    /// all of `max_workers` (at most `claim_batch`) to be free before it claims, so that a process
    /// with few workers claims in batches instead of one job per round trip. Zero claims as soon as
    /// one worker is free. It never delays a job when the queue is not saturated. While claiming
    /// ahead, the dispatcher waits for half of what it may hold instead, at most the jobs it claims
    /// ahead (bounded by the handler average, at most `CLAIM_AHEAD_MAX_HANDLER`, at least this):
    /// the `max_workers` or more jobs still claimed keep the workers busy.
    pub claim_linger: Duration,
    /// The most jobs this process may hold claimed beyond its busy workers, waiting for the next
    /// free one, so that the next claim's round trip overlaps the running handlers instead of
    /// leaving the workers idle while it runs. Used only while the queue's handlers are short (a
    /// moving average of at most `CLAIM_AHEAD_MAX_HANDLER`, 50 ms, and none running longer right
    /// now), and bounded by time as well: the jobs claimed ahead are at most `CLAIM_AHEAD_WINDOW`
    /// (200 ms) of work for the queue's workers at their handler average (`max_workers × 200 ms /
    /// average`, at least one), so a claimed job waits at most about 200 ms for its worker however
    /// few workers the process has. A job
    /// that waits longer (a handler turned out long) is handed back to the queue after a bounded
    /// wait, and never waits past half of its deadline. 0 claims only for free workers. A waiting
    /// job is heartbeated like a running one, and runs in about claim order.
    pub claim_ahead: usize,
    /// Optional deadline stamped on every claim batch: the handler is stopped when it passes, and
    /// deadline rescue closes the attempt if its worker cannot.
    pub deadline: Option<Duration>,
    /// Priority aging: a lane's effective priority improves one level per this much waiting by its
    /// oldest job, so low priorities never starve. `None` (or zero) disables aging.
    pub priority_aging: Option<Duration>,
    /// Send this queue's terminal failures to the dead-letter queue (`dlq_entries`) instead of
    /// failed history, for an operator to inspect, retry or purge. Switched on for the queue when
    /// the client is built; never switched off by a client (use `Admin::set_queue_dead_letter`).
    pub dead_letter: bool,
    /// How long this queue's retried attempts wait (default: 2^attempt s, capped at 1 h, + up to
    /// 10 % jitter). A kind's own policy (`ClientBuilder::retry_policy`) wins over it.
    pub retry_policy: Option<handler::RetryPolicy>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_workers: 32,
            claim_batch: 128,
            poll_interval: Duration::from_millis(250),
            claim_linger: Duration::from_millis(2),
            // with 32 workers: hold 256, so claims under a backlog take a whole claim_batch
            claim_ahead: 224,
            deadline: None,
            priority_aging: Some(Duration::from_secs(60)),
            dead_letter: false,
            retry_policy: None,
        }
    }
}

impl QueueConfig {
    pub(crate) fn validate(&self, queue: &str) -> Result<()> {
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
        if self.claim_linger > Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "queue {queue:?}: claim_linger must be at most 1 s, got {:?}",
                self.claim_linger
            )));
        }
        if self.claim_ahead > 10_000 {
            return Err(Error::Config(format!(
                "queue {queue:?}: claim_ahead must be 0..=10000, got {}",
                self.claim_ahead
            )));
        }
        if let Some(policy) = &self.retry_policy {
            policy.validate(&format!("queue {queue:?}"))?;
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config(format!(
                "queue {queue:?}: poll_interval must be > 0"
            )));
        }
        Ok(())
    }
}

/// An idle dispatcher's longest wait between claims while its process LISTENs. The NOTIFY of an
/// insert, a promotion, a rescue or a resume wakes it at once; a lost listener connection wakes
/// every dispatcher and puts them back on `poll_interval`. The poll is then only a safety net, and
/// a 250-ms one was most of an idle process's database load (8 of its 36 statements a second).
pub const IDLE_POLL_MAX: Duration = Duration::from_secs(5);

/// Claim ahead of free workers only while the queue's handlers take at most this long on average:
/// a job claimed ahead then waits about one handler's run for its worker.
pub const CLAIM_AHEAD_MAX_HANDLER: Duration = Duration::from_millis(50);

/// The most work, at the queue's handler average, a process holds claimed ahead of its workers
/// (`QueueConfig::claim_ahead` bounds the count as well): a job claimed ahead waits at most about
/// this long for its worker. 200 ms, not 50: under saturation a 1-ms handler measures well over 2 ms
/// on a busy 2-core machine (its wake-ups wait for a core), and a 50-ms window then cut the claims
/// of processes of 4 workers (at 8x4 saturation, a tenth to a quarter fewer jobs a second).
pub const CLAIM_AHEAD_WINDOW: Duration = Duration::from_millis(200);

/// How long a claim waits for its queue's only shard with work while another claimer holds it
/// (claim.sql), rather than coming back empty: the holder commits within milliseconds, and the
/// waiting claim then takes what it left, or finds nothing and says so. Every process a NOTIFY wakes
/// claims; without the wait, each that lost the shard asked whether work was left, slept, and
/// claimed and asked again.
pub const CLAIM_SHARD_WAIT: Duration = Duration::from_millis(20);

/// How completions are batched (completer.rs): flushes are paced, not delayed.
#[derive(Clone, Debug)]
pub struct CompletionConfig {
    /// Finished attempts per flush at most.
    pub max_batch: usize,
    /// Under load, flushes start at most once per `max_delay`, so a finished attempt waits at most
    /// this long for its flush to start. A completion after a quiet spell is flushed at once, and
    /// so is the last job a queue holds while its last claim came back short and left workers idle
    /// (running dry, or cut by a fleet `max_running`); the queue's earlier jobs then wait at most
    /// 5 ms (`DRY_LINGER`) for the others claimed with them.
    pub max_delay: Duration,
}

impl Default for CompletionConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            max_delay: Duration::from_millis(50),
        }
    }
}

/// Counters a caller can read while the client runs.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) claimed: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) stale: AtomicU64,
    pub(crate) blocked: AtomicU64,
    pub(crate) pickup_ms: Mutex<Option<Vec<f64>>>,
}

impl Metrics {
    /// Attempts this process claimed.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }
    /// Attempts this process completed.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
    /// Attempts that failed and were scheduled to run again.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }
    /// Attempts that failed for good.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Outcomes refused because the attempt had been rescued or cancelled meanwhile.
    pub fn stale(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }
    /// Handler polls that held their thread for more than a second (each reported in the log).
    pub fn blocked(&self) -> u64 {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Start keeping pickup-latency samples (enqueue to handler start, in milliseconds).
    pub fn record_pickup_latency(&self) {
        if let Ok(mut samples) = self.pickup_ms.lock() {
            samples.get_or_insert_with(Vec::new);
        }
    }

    /// The pickup-latency samples kept since `record_pickup_latency` (empty when it was not
    /// called), in milliseconds, in the order the handlers started.
    pub fn pickup_latencies_ms(&self) -> Vec<f64> {
        self.pickup_ms
            .lock()
            .map(|s| s.clone().unwrap_or_default())
            .unwrap_or_default()
    }
}

/// Whether a started client is alive: every dispatcher it started still runs and it is not
/// shutting down. For `/healthz` (`http::Endpoints::liveness`) or a service's own probe.
#[derive(Clone, Debug)]
pub struct Liveness {
    running: Arc<std::sync::atomic::AtomicUsize>,
    expected: usize,
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl Liveness {
    pub(crate) fn new(
        expected: usize,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> (Self, Arc<std::sync::atomic::AtomicUsize>) {
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (
            Self {
                running: Arc::clone(&running),
                expected,
                stopping,
            },
            running,
        )
    }

    /// `Ok` while alive; otherwise why not.
    pub fn check(&self) -> std::result::Result<(), String> {
        if *self.stopping.borrow() {
            return Err("shutting down".into());
        }
        let running = self.running.load(std::sync::atomic::Ordering::Relaxed);
        if running < self.expected {
            return Err(format!(
                "{running} of {} dispatchers running",
                self.expected
            ));
        }
        Ok(())
    }
}

/// Counts one running dispatcher while it lives (a panic included).
pub(crate) struct RunningGuard(pub(crate) Arc<std::sync::atomic::AtomicUsize>);

impl RunningGuard {
    pub(crate) fn new(running: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        running.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(Arc::clone(running))
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One attempt running in this process.
pub(crate) struct RunningAttempt {
    pub(crate) attempt: AttemptRef,
    pub(crate) kind: String,
    pub(crate) started: std::time::Instant,
    pub(crate) cancel: Arc<CancelSignal>,
    /// When the handler's current poll began (ms since `executor::EPOCH`, + 1), 0 between polls:
    /// a poll that lasts seconds is a handler blocking its thread.
    pub(crate) poll_started: Arc<AtomicU64>,
    /// The `poll_started` value of the last poll reported as blocking (0: none), so each blocking
    /// poll is reported once, however close together they come.
    pub(crate) reported_poll: u64,
    /// The handler's own writes for this attempt (buffered progress, for the heartbeats).
    pub(crate) writes: Arc<handler::AttemptWrites>,
}

/// Attempts running in this process, for heartbeats and the blocking watchdog.
pub(crate) type RunningAttempts = Mutex<HashMap<(i64, i64), RunningAttempt>>;

/// The runtime handlers run on, apart from the one that runs the client's own tasks (dispatchers,
/// completion batcher, heartbeats, LISTEN, maintenance): a handler that blocks a thread stalls
/// other handlers at worst, never the heartbeats and completions that keep its neighbours alive.
pub(crate) struct HandlerRuntime(Option<tokio::runtime::Runtime>);

impl HandlerRuntime {
    pub(crate) fn new(threads: usize) -> Result<Self> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ringwork-handler")
            .enable_all()
            .build()
            .map(|rt| Self(Some(rt)))
            .map_err(|e| Error::Config(format!("cannot start the handler runtime: {e}")))
    }

    pub(crate) fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(|rt| rt.handle())
    }
}

impl Drop for HandlerRuntime {
    fn drop(&mut self) {
        // dropping a runtime blocks, which panics inside an async context; this does not
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Inner {
    /// The retry policy of a job: its kind's, else its queue's, else the default curve.
    pub(crate) fn retry_policy(&self, queue: &str, kind: &str) -> handler::RetryPolicy {
        if let Some(policy) = self.registry.retry_policy(kind) {
            return policy.clone();
        }
        self.queues
            .iter()
            .find(|(name, _)| name == queue)
            .and_then(|(_, config)| config.retry_policy.clone())
            .unwrap_or_default()
    }
}

pub(crate) struct Inner {
    pub(crate) running: RunningAttempts,
    pub(crate) handlers: HandlerRuntime,
    /// On the caller's pool: inserts and operator calls made through the `Client`.
    pub(crate) storage: Storage,
    /// On the client's own small pool, opened from the caller's connect options: claims,
    /// completions, heartbeats, LISTEN and maintenance. Apart from the caller's pool because a
    /// connection that a handler opens is driven by the handler runtime, which a blocking handler
    /// can stall; the engine's connections are opened and driven on the client's runtime only.
    pub(crate) engine: Storage,
    pub(crate) queues: Vec<(String, QueueConfig)>,
    pub(crate) registry: Registry,
    pub(crate) completion: CompletionConfig,
    pub(crate) maintenance: MaintenanceConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) telemetry: crate::telemetry::Telemetry,
    /// Schedules this process fires while it is the maintenance leader.
    pub(crate) periodic: Arc<[crate::periodic::Periodic]>,
}

/// A finished attempt on its way to the completion batcher.
pub(crate) struct Finished {
    pub(crate) attempt: AttemptRef,
    pub(crate) result: std::result::Result<(), CloseOutcome>,
    /// How long its handler ran (None: handed back before it started).
    pub(crate) handler_time: Option<std::time::Duration>,
    /// The handler completed the attempt in its own transaction (`JobContext::complete_in`): the
    /// runtime's write for it is expected to be refused (that transaction committed), and applies
    /// only if that transaction rolled back. Either way it is not a stale write.
    pub(crate) completed_in_tx: bool,
    /// The attempt's outcome is written already (it waits for a callback): nothing to flush.
    pub(crate) settled: bool,
    /// When its queue runs dry, how soon it wants its flush (completer.rs).
    pub(crate) flush: completer::FlushHint,
}
