//! Runs one claimed job: registers the attempt for heartbeats, runs its handler in a task of its own
//! on the handler runtime (a panic is a failed attempt, not a dead worker; a blocking handler stalls
//! handlers, not heartbeats and completions) under the attempt's deadline, and turns the handler's
//! result into the attempt's outcome.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::field::Empty;
use tracing::Instrument;

use super::completer::FlushHint;
use super::handler::{
    retry_backoff, AttemptWrites, CancelSignal, JobContext, JobError, RetryPolicy,
};
use super::{Finished, Inner, RunningAttempt, CLAIM_AHEAD_MAX_HANDLER};
use crate::storage::{AwaitOutcome, ClaimedJob, CloseOutcome};

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

/// How a job claimed ahead of free workers waits for one, and how its queue learns of long handlers.
pub(super) struct WorkerWait {
    /// The queue's `max_workers` permits.
    pub(super) workers: Arc<Semaphore>,
    /// This queue's handlers that have run longer than `CLAIM_AHEAD_MAX_HANDLER` and are still
    /// running: while there are any, the dispatcher does not claim ahead.
    pub(super) long_running: Arc<AtomicUsize>,
}

/// Run one claimed job. `worker` is its worker permit when the dispatcher took one before claiming;
/// otherwise (claimed ahead) the job waits here for a free one, in about claim order (the
/// semaphore is fair; tasks join its queue as they are first polled). It is registered for
/// heartbeats from the start, so a job that waits is not rescued as stale.
pub(super) async fn run_job(
    inner: &Inner,
    queue: &str,
    job: ClaimedJob,
    worker: Option<OwnedSemaphorePermit>,
    wait: &WorkerWait,
    wait_limit: Duration,
) -> Finished {
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
                worker = Arc::clone(&wait.workers).acquire_owned() => worker.ok(),
                _ = tokio::time::sleep(limit) => None,
            }
        }
    };
    let worker = worker.filter(|_| !cancel.is_set());
    let finished = match worker {
        Some(_worker) => {
            run_handler(
                inner,
                queue,
                job,
                cancel,
                poll_started,
                writes,
                &wait.long_running,
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

pub(super) async fn run_handler(
    inner: &Inner,
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
            // stopped (deadline rescue closes the claim if this process cannot).
            let watched = WatchedPolls {
                future: handler(ctx, job.args.clone()).instrument(span.clone()),
                poll_started,
            };
            let task = match inner.handlers.handle() {
                Some(handlers) => handlers.spawn(watched),
                None => tokio::spawn(watched),
            };
            let abort = task.abort_handle();
            let limit = job
                .deadline_at
                .map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO));
            let task = count_while_long(task, long_running);
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
    // a wait for a callback ends the attempt here, not in a completion batch: its claim closes and
    // its lease waits (or a callback that came meanwhile applies at once)
    let (result, settled) = match result {
        Err(JobError::WaitForCallback) => match await_callback(inner, &writes, attempt).await {
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
        if let Err(e) = inner
            .engine
            .heartbeat_batch(&[(attempt, Some(progress))])
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
    inner: &Inner,
    writes: &AttemptWrites,
    attempt: crate::storage::AttemptRef,
) -> crate::Result<AwaitOutcome> {
    if let Some(progress) = writes.take_progress() {
        if let Err(e) = inner
            .engine
            .heartbeat_batch(&[(attempt, Some(progress))])
            .await
        {
            tracing::warn!(job_id = attempt.job_id, error = %e, "could not write the progress of an attempt that starts to wait");
        }
    }
    let mut tries = 0_u32;
    loop {
        match inner.engine.await_callback(&attempt).await {
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
