//! Runs one claimed job: registers the attempt for heartbeats (on the client's runtime, when it is
//! claimed), then, in one task on the handler runtime, waits for a free worker, runs the handler
//! under the attempt's deadline (a panic is a failed attempt, not a dead worker; a blocking handler
//! stalls handlers, not heartbeats and completions) and turns its result into the attempt's outcome.
//! The whole run is one task there, so a worker freed by one handler passes straight to the next
//! job waiting for one on the same runtime: a job that crossed between the two runtimes twice left
//! workers idle between handlers about a sixth of the time at 1x32 saturation
//! (docs/decisions/022-one-task-a-job.md).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::FutureExt;
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::field::Empty;
use tracing::Instrument;

use super::completer::FlushHint;
use super::handler::{
    retry_backoff, AttemptWrites, CancelSignal, JobContext, JobError, RetryPolicy,
};
use super::{Finished, Inner, RunningAttempt, CLAIM_AHEAD_MAX_HANDLER};
use crate::storage::{AwaitOutcome, ClaimedJob, CloseOutcome, Storage};

/// The zero of `RunningAttempt::poll_started`.
pub(super) static EPOCH: OnceLock<Instant> = OnceLock::new();

pub(super) fn millis_since_epoch() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A handler future that records when each of its polls begins, so a poll that never returns (a
/// handler blocking its thread) is visible from outside while it lasts.
struct WatchedPolls<F> {
    future: F,
    poll_started: Arc<AtomicU64>,
}

impl<F: Future + Unpin> Future for WatchedPolls<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.poll_started
            .store(millis_since_epoch() + 1, Ordering::Relaxed);
        let result = Pin::new(&mut self.future).poll(cx);
        self.poll_started.store(0, Ordering::Relaxed);
        result
    }
}

/// What the tasks of one queue's jobs share: how a job claimed ahead of free workers waits for one,
/// how the queue learns of long handlers, and where the engine's statements run.
pub(super) struct QueueTasks {
    /// The queue's `max_workers` permits.
    pub(super) workers: Arc<Semaphore>,
    /// This queue's handlers that have run longer than `CLAIM_AHEAD_MAX_HANDLER` and are still
    /// running: while there are any, the dispatcher does not claim ahead.
    pub(super) long_running: Arc<AtomicUsize>,
    /// The client's runtime: the engine's connections are opened and driven there only (`on_client`).
    pub(super) client: Handle,
}

/// A claimed job registered for heartbeats: what its run shares with the heartbeat task.
pub(super) struct Registered {
    key: (i64, i64),
    cancel: Arc<CancelSignal>,
    poll_started: Arc<AtomicU64>,
    writes: Arc<AttemptWrites>,
}

/// Register a claimed job for heartbeats, before its task is spawned: a job whose task has not
/// started yet (its handler runtime busy, or blocked by handlers that block their threads) keeps its
/// claim alive all the same.
pub(super) fn register(inner: &Inner, job: &ClaimedJob) -> Registered {
    let key = (job.job_id, job.run_lease);
    let cancel = Arc::new(CancelSignal::default());
    let poll_started = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AttemptWrites::new(
        job.attempt_ref(),
        inner.storage.clone(),
        inner.telemetry.clone(),
    ));
    if let Ok(mut running) = inner.running.lock() {
        running.insert(
            key,
            RunningAttempt {
                attempt: job.attempt_ref(),
                kind: job.kind.clone(),
                started: Instant::now(),
                cancel: Arc::clone(&cancel),
                poll_started: Arc::clone(&poll_started),
                reported_poll: 0,
                writes: Arc::clone(&writes),
            },
        );
    }
    Registered {
        key,
        cancel,
        poll_started,
        writes,
    }
}

/// Run one registered job. `worker` is its worker permit when the dispatcher took one before
/// claiming; otherwise (claimed ahead) the job waits here for a free one, in about claim order (the
/// semaphore is fair; tasks join its queue as they are first polled).
pub(super) async fn run_job(
    inner: &Inner,
    queue: &str,
    job: ClaimedJob,
    registered: Registered,
    worker: Option<OwnedSemaphorePermit>,
    tasks: &QueueTasks,
    wait_limit: Duration,
) -> Finished {
    let Registered {
        key,
        cancel,
        poll_started,
        writes,
    } = registered;
    let worker = match worker {
        Some(worker) => Some(worker),
        None => {
            // Hand the job back (a snooze to now: no attempt used) if no worker is free within
            // `wait_limit`, or within half of what is left of its deadline: a handler that turned
            // out long must not hold the jobs claimed behind it while other processes could run them.
            let limit = match job.deadline_at {
                Some(at) => {
                    wait_limit.min((at - Utc::now()).to_std().unwrap_or(Duration::ZERO) / 2)
                }
                None => wait_limit,
            };
            // Cancellation first: a job told to stop never starts, even when a worker frees up at
            // the same moment. A closed semaphore (shutdown) is an error: hand back.
            tokio::select! {
                biased;
                _ = cancel.wait() => None,
                worker = Arc::clone(&tasks.workers).acquire_owned() => worker.ok(),
                _ = tokio::time::sleep(limit) => None,
            }
        }
    };
    let worker = worker.filter(|_| !cancel.is_set());
    let finished = match worker {
        Some(_worker) => {
            run_handler(
                inner,
                &tasks.client,
                queue,
                job,
                cancel,
                poll_started,
                writes,
                &tasks.long_running,
            )
            .await
        }
        // Told to stop (shutdown, or the claim was closed under us), or no worker came free in
        // time: hand the job back at once without using its attempt.
        None => Finished {
            attempt: job.attempt_ref(),
            result: Err(CloseOutcome::Snooze { at: Utc::now() }),
            handler_time: None,
            completed_in_tx: false,
            settled: false,
            flush: FlushHint::Paced,
        },
    };
    if let Ok(mut running) = inner.running.lock() {
        running.remove(&key);
    }
    finished
}

/// Whether a handler of this process has been inside one poll for longer than `limit`: it blocks
/// its thread. Its job's own task cannot say so (the handler is polled in it), and the handler
/// threads are every queue's: while one blocks, no queue of the process claims ahead, so jobs do
/// not pile up behind threads that cannot run them.
pub(super) fn a_handler_blocks(inner: &Inner, limit: Duration) -> bool {
    let now = millis_since_epoch() + 1;
    let limit = limit.as_millis() as u64;
    inner.running.lock().is_ok_and(|running| {
        running.values().any(|r| {
            let since = r.poll_started.load(Ordering::Relaxed);
            since != 0 && now.saturating_sub(since) > limit
        })
    })
}

/// Run `statement` on the client's runtime and wait for it. The engine's connections are opened and
/// driven there only: one opened from the handler runtime would be driven by that runtime's I/O
/// driver, which handlers that block every handler thread would stall for the whole client.
async fn on_client<T: Send + 'static>(
    client: &Handle,
    statement: impl Future<Output = crate::Result<T>> + Send + 'static,
) -> crate::Result<T> {
    client
        .spawn(statement)
        .await
        .unwrap_or_else(|e| Err(crate::Error::Config(format!("engine task failed: {e}"))))
}

/// A panic's message, as the handler wrote it.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Run a job's handler in the calling task under the attempt's deadline, and turn its result into
/// the attempt's outcome.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_handler(
    inner: &Inner,
    client: &Handle,
    queue: &str,
    job: ClaimedJob,
    cancel: Arc<CancelSignal>,
    poll_started: Arc<AtomicU64>,
    writes: Arc<AttemptWrites>,
    long_running: &AtomicUsize,
) -> Finished {
    let attempt = job.attempt_ref();
    let started = Instant::now();
    // One span per execution, named and attributed after OpenTelemetry's messaging conventions
    // (with tracing-opentelemetry, `otel.name` and `otel.kind` become the span's name and kind).
    let span = tracing::info_span!(
        "ringwork.process",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "ringwork",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %queue,
        messaging.message.id = job.job_id,
        ringwork.job.kind = %job.kind,
        ringwork.job.attempt = job.attempt,
        ringwork.job.run_lease = job.run_lease,
        ringwork.outcome = Empty,
        error.type = Empty,
    );
    crate::trace_context::set_parent(&span, job.traceparent.as_deref());
    if job.attempt == 1 {
        let waited = (Utc::now() - job.created_at).to_std().unwrap_or_default();
        inner.telemetry.pickup(queue, waited);
    }
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
                writes: Arc::clone(&writes),
            };
            // A panicking handler is a failed attempt, not a dead worker; one past its deadline is
            // dropped at its next await (deadline rescue closes the claim if this process cannot).
            let watched = WatchedPolls {
                future: AssertUnwindSafe(handler(ctx, job.args.clone()).instrument(span.clone()))
                    .catch_unwind(),
                poll_started,
            };
            let limit = job
                .deadline_at
                .map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO));
            let run = count_while_long(watched, long_running);
            let joined = match limit {
                Some(limit) => match tokio::time::timeout(limit, run).await {
                    Ok(joined) => joined,
                    Err(_) => Ok(Err(JobError::Retry(format!(
                        "deadline exceeded after {limit:?}"
                    )))),
                },
                None => run.await,
            };
            match joined {
                Ok(result) => result,
                Err(panic) => Err(JobError::Retry(format!(
                    "handler panicked: {}",
                    panic_message(panic.as_ref())
                ))),
            }
        }
    };
    // a wait for a callback ends the attempt here, not in a completion batch: its claim closes and
    // its lease waits (or a callback that came meanwhile applies at once)
    let (result, settled) = match result {
        Err(JobError::WaitForCallback) => match on_client(
            client,
            await_callback(inner.engine.clone(), writes.take_progress(), attempt),
        )
        .await
        {
            Ok(AwaitOutcome::NoCallback) => (
                Err(JobError::Terminal(
                    "the handler returned WaitForCallback without registering a callback \
                     (JobContext::register_callback)"
                        .into(),
                )),
                false,
            ),
            Ok(_) => (Ok(()), true),
            Err(e) => {
                // the claim stays open: stale rescue runs the job again (at least once)
                tracing::error!(job_id = attempt.job_id, error = %e, "could not hand an attempt to its callback; rescue will run it again");
                (Ok(()), true)
            }
        },
        other => (other, false),
    };
    let result = result.map_err(|error| {
        let policy = match &error {
            JobError::Retry(_) => Some(inner.retry_policy(queue, &job.kind)),
            _ => None,
        };
        close_outcome(&job, error, policy.as_ref())
    });
    if let (Err(CloseOutcome::Retry { .. } | CloseOutcome::Snooze { .. }), Some(progress)) =
        (&result, writes.take_progress())
    {
        // the job runs again: what it reported since its last heartbeat is the next attempt's
        // checkpoint, so write it before the attempt closes (a refusal means it closed already)
        let engine = inner.engine.clone();
        if let Err(e) = on_client(client, async move {
            engine.heartbeat_batch(&[(attempt, Some(progress))]).await
        })
        .await
        {
            tracing::warn!(job_id = attempt.job_id, error = %e, "could not write the progress of an attempt that ends to run again");
        }
    }
    let outcome = match &result {
        Ok(()) if settled => "waiting",
        Ok(()) => "completed",
        Err(CloseOutcome::Retry { .. }) => "retried",
        Err(CloseOutcome::Snooze { .. }) => "snoozed",
        Err(CloseOutcome::Failed { .. }) => "failed",
    };
    span.record("ringwork.outcome", outcome);
    if matches!(outcome, "retried" | "failed") {
        span.record("error.type", outcome);
    }
    // a kind no handler is registered for (another producer's) is one series, not one per kind
    let kind = if inner.registry.get(&job.kind).is_some() {
        job.kind.as_str()
    } else {
        "unregistered"
    };
    inner
        .telemetry
        .finished(queue, kind, outcome, started.elapsed());
    Finished {
        attempt,
        result,
        handler_time: Some(started.elapsed()),
        completed_in_tx: writes.completed_in_tx.load(Ordering::SeqCst),
        settled,
        flush: FlushHint::Paced,
    }
}

/// Hand an attempt whose handler returned `WaitForCallback` to its callback: first the progress it
/// reported since its last heartbeat (the next attempt resumes from it), then `await_callback`,
/// retried with backoff like a completion batch (a lost connection must not cost the attempt).
async fn await_callback(
    engine: Storage,
    progress: Option<serde_json::Value>,
    attempt: crate::storage::AttemptRef,
) -> crate::Result<AwaitOutcome> {
    if let Some(progress) = progress {
        if let Err(e) = engine.heartbeat_batch(&[(attempt, Some(progress))]).await {
            tracing::warn!(job_id = attempt.job_id, error = %e, "could not write the progress of an attempt that starts to wait");
        }
    }
    let mut tries = 0_u32;
    loop {
        match engine.await_callback(&attempt).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) if tries < 5 => {
                tracing::warn!(job_id = attempt.job_id, error = %e, "await_callback failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * 2_u64.pow(tries))).await;
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Await `run`; once it has taken longer than `CLAIM_AHEAD_MAX_HANDLER`, count it in `long` until it
/// ends (or is dropped), so the dispatcher stops claiming ahead while a long handler runs, not only
/// after it finished.
async fn count_while_long<F: Future>(run: F, long: &AtomicUsize) -> F::Output {
    struct Counted<'a>(&'a AtomicUsize);
    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    tokio::pin!(run);
    tokio::select! {
        biased;
        out = &mut run => return out,
        _ = tokio::time::sleep(CLAIM_AHEAD_MAX_HANDLER) => {}
    }
    long.fetch_add(1, Ordering::Relaxed);
    let _counted = Counted(long);
    run.await
}

/// `policy`: the job's retry policy, for a `JobError::Retry` (default curve when `None`).
fn close_outcome(job: &ClaimedJob, error: JobError, policy: Option<&RetryPolicy>) -> CloseOutcome {
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
            at: Utc::now()
                + chrono_duration(match policy {
                    Some(policy) => policy.delay(job.attempt),
                    None => retry_backoff(job.attempt),
                }),
            error: e,
        },
        JobError::Snooze(delay) => CloseOutcome::Snooze {
            at: Utc::now() + chrono_duration(delay),
        },
        JobError::RetryAfter(delay, e) => CloseOutcome::Retry {
            at: Utc::now() + chrono_duration(delay),
            error: e,
        },
        // handled before: the attempt waits, nothing to close
        JobError::WaitForCallback => CloseOutcome::Failed {
            error: "waiting for a callback".into(),
        },
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::hours(1))
}
