//! Handlers: what user code sees of a running attempt, and how it reports the outcome.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::{Error, Result};
use crate::job::JobArgs;
use crate::storage::{AttemptRef, Outcome, Progress, ProgressRecord, Storage};

/// How much of a progress message is kept (it is written with every heartbeat).
pub(crate) const MAX_PROGRESS_MESSAGE_CHARS: usize = 1_000;

/// What a handler knows about the attempt it runs.
#[derive(Clone, Debug)]
pub struct JobContext {
    /// The job's id.
    pub job_id: i64,
    /// This attempt's run lease: one higher for every claim of the job, snoozed runs included.
    pub run_lease: i64,
    /// This attempt's number, from 1; a snoozed run keeps it.
    pub attempt: i32,
    /// Attempts the job may use before it fails for good.
    pub max_attempts: i32,
    /// The job's kind.
    pub kind: String,
    /// The queue the job was claimed from.
    pub queue: String,
    /// When the job was inserted.
    pub created_at: DateTime<Utc>,
    pub(crate) cancel: Arc<CancelSignal>,
    pub(crate) writes: Arc<AttemptWrites>,
}

/// The writes a handler makes on behalf of its own attempt.
#[derive(Debug)]
pub(crate) struct AttemptWrites {
    pub(crate) attempt: AttemptRef,
    pub(crate) storage: Storage,
    /// The process's metrics: steps a handler adds to its workflow count as enqueued.
    telemetry: crate::telemetry::Telemetry,
    /// Set once `complete_in` applied: the runtime's own completion of this attempt will then be
    /// refused as stale (the transaction committed) or apply (it rolled back), both as expected.
    pub(crate) completed_in_tx: std::sync::atomic::AtomicBool,
    /// Progress set since it was last written: the next heartbeat writes it (or the executor, when
    /// the attempt ends to run again).
    pending_progress: std::sync::Mutex<Option<serde_json::Value>>,
}

impl AttemptWrites {
    pub(crate) fn new(
        attempt: AttemptRef,
        storage: Storage,
        telemetry: crate::telemetry::Telemetry,
    ) -> Self {
        Self {
            attempt,
            storage,
            telemetry,
            completed_in_tx: Default::default(),
            pending_progress: Default::default(),
        }
    }

    /// Take the progress not yet written.
    pub(crate) fn take_progress(&self) -> Option<serde_json::Value> {
        self.pending_progress.lock().ok().and_then(|mut p| p.take())
    }

    /// Put back progress whose write failed, unless newer progress was set meanwhile.
    pub(crate) fn restore_progress(&self, progress: serde_json::Value) {
        if let Ok(mut pending) = self.pending_progress.lock() {
            pending.get_or_insert(progress);
        }
    }

    pub(crate) fn has_progress(&self) -> bool {
        self.pending_progress
            .lock()
            .map(|p| p.is_some())
            .unwrap_or(false)
    }
}

impl JobContext {
    /// True once this attempt's claim was closed under it — cancelled by id (`Client::cancel`),
    /// or found closed by a heartbeat (rescued). Its result will be discarded; a handler should
    /// stop at its next safe point.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_set()
    }

    /// Resolves when this attempt is cancelled (for `tokio::select!` in long handlers).
    pub async fn cancelled(&self) {
        self.cancel.wait().await
    }

    /// Report progress: a percentage (0 to 100), a message, and optionally a checkpoint (any JSON)
    /// from which a later attempt can resume. Buffered: written with the attempt's next heartbeat
    /// (every `MaintenanceConfig::stale_after / 4`), or at once with `flush_progress`, and when the
    /// attempt ends to run again (retry, snooze). Kept across retries, snoozes and rescues until the
    /// job ends; `ringwork job <id>` shows it. An invalid value (a percentage outside 0..=100, a NUL
    /// character) is refused and the last valid progress stays.
    pub fn set_progress(
        &self,
        percent: f64,
        message: &str,
        checkpoint: Option<serde_json::Value>,
    ) -> Result<()> {
        let invalid = |reason: String| Error::InvalidArgs {
            kind: self.kind.clone(),
            reason: format!("progress of job {}: {reason}", self.job_id),
        };
        if !(0.0..=100.0).contains(&percent) {
            return Err(invalid(format!("percent must be 0..=100, got {percent}")));
        }
        // stored inside the progress object, one level deeper than itself
        let max_depth = crate::job::MAX_ARGS_DEPTH - 1;
        if checkpoint
            .as_ref()
            .is_some_and(|c| crate::job::json_depth(c) > max_depth)
        {
            return Err(invalid(format!(
                "the checkpoint nests deeper than {max_depth} levels, which could not be read back"
            )));
        }
        // a message is for people: cut, never refused, so a long one costs its heartbeats little
        let message = match message.char_indices().nth(MAX_PROGRESS_MESSAGE_CHARS) {
            Some((cut, _)) => format!(
                "{} [... {} more characters]",
                &message[..cut],
                message[cut..].chars().count()
            ),
            None => message.to_string(),
        };
        let progress = serde_json::to_value(Progress {
            percent,
            message,
            checkpoint,
        })
        .map_err(|e| invalid(e.to_string()))?;
        // PostgreSQL's jsonb cannot hold U+0000 anywhere (message, keys or values)
        if progress.to_string().contains("\\u0000") {
            return Err(invalid("it contains a NUL character".into()));
        }
        if let Ok(mut pending) = self.writes.pending_progress.lock() {
            *pending = Some(progress);
        }
        Ok(())
    }

    /// Write the progress set with `set_progress` now, instead of with the next heartbeat.
    /// `Error::Stale` when this attempt was closed under the handler.
    pub async fn flush_progress(&self) -> Result<()> {
        if self
            .writes
            .completed_in_tx
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // completed in the handler's transaction: there is no attempt to record progress for
            // (and a write would wait for that transaction's lock)
            return Err(Error::Stale {
                job_id: self.job_id,
                run_lease: self.run_lease,
            });
        }
        let Some(progress) = self.writes.take_progress() else {
            return Ok(());
        };
        let outcome = self
            .writes
            .storage
            .heartbeat_batch(&[(self.writes.attempt, Some(progress.clone()))])
            .await;
        match outcome {
            Ok(outcomes) if outcomes.first() == Some(&Outcome::Applied) => Ok(()),
            Ok(_) => Err(Error::Stale {
                job_id: self.job_id,
                run_lease: self.run_lease,
            }),
            Err(e) => {
                self.writes.restore_progress(progress);
                Err(e)
            }
        }
    }

    /// Register an external callback for this attempt: the returned id (64 hex characters,
    /// signed, unguessable) is what the outside world answers with (`Storage::resolve_callback`,
    /// `ringwork callback`, or `POST /callbacks/<id>/<action>` on `ringwork serve`). Then return
    /// `Err(JobError::WaitForCallback)`: the job waits without a worker, at most `timeout` (a
    /// callback heartbeat extends it) before it is retried. A callback that comes before the
    /// handler returned is applied when it returns. One callback per attempt.
    pub async fn register_callback(&self, timeout: std::time::Duration) -> Result<String> {
        if timeout < std::time::Duration::from_secs(1)
            || timeout > std::time::Duration::from_secs(365 * 24 * 3600)
        {
            return Err(Error::Config(format!(
                "callback timeout must be 1 s..=365 days, got {timeout:?}"
            )));
        }
        self.writes
            .storage
            .register_callback(&self.writes.attempt, timeout)
            .await
    }

    /// The payload of the `resume` callback that made this attempt run, if any.
    pub async fn callback_payload<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>> {
        match self
            .writes
            .storage
            .callback_payload(self.job_id, self.run_lease)
            .await?
        {
            None => Ok(None),
            Some(value) => {
                serde_json::from_value(value)
                    .map(Some)
                    .map_err(|e| Error::InvalidArgs {
                        kind: self.kind.clone(),
                        reason: format!("callback payload does not decode: {e}"),
                    })
            }
        }
    }

    /// The last progress recorded for this job: by an earlier attempt that was retried, snoozed
    /// or rescued (resume from its checkpoint), or by this attempt once written.
    pub async fn last_progress(&self) -> Result<Option<ProgressRecord>> {
        self.writes.storage.job_progress(self.job_id).await
    }

    /// Record this step's output for the steps that depend on it (a workflow step only; the last
    /// write wins, so a re-run replaces it). Written at once, whatever the handler returns.
    pub async fn set_workflow_output<T: serde::Serialize>(&self, output: &T) -> Result<()> {
        let value = serde_json::to_value(output).map_err(|e| Error::InvalidArgs {
            kind: self.kind.clone(),
            reason: format!("workflow output of job {}: {e}", self.job_id),
        })?;
        self.writes
            .storage
            .set_workflow_output(self.job_id, &value)
            .await
    }

    /// The output another step of this job's workflow recorded (`None` when it recorded none, or
    /// when this job is not a workflow step).
    pub async fn workflow_output<T: serde::de::DeserializeOwned>(
        &self,
        step: &str,
    ) -> Result<Option<T>> {
        let Some(value) = self
            .writes
            .storage
            .workflow_output(self.job_id, step)
            .await?
        else {
            return Ok(None);
        };
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| Error::InvalidArgs {
                kind: self.kind.clone(),
                reason: format!("workflow output of step {step:?}: {e}"),
            })
    }

    /// The other steps of this job's workflow by their last outcome: what a batch callback reports
    /// (`None` when this job is not a workflow step or batch callback).
    pub async fn workflow_counts(&self) -> Result<Option<crate::WorkflowCounts>> {
        self.writes.storage.workflow_counts(self.job_id).await
    }

    /// Add steps to this job's workflow (dynamic fan-out: a child per row, then a summary that
    /// depends on them). New steps may depend on any step of the workflow, this one included. On
    /// `conn`: pass the transaction you give `complete_in`, so that a re-run after a crash does not
    /// add them twice (a second add of a step name is refused).
    pub async fn add_workflow_steps(
        &self,
        conn: &mut PgConnection,
        steps: crate::Workflow,
    ) -> Result<crate::InsertedWorkflow> {
        let storage = &self.writes.storage;
        let Some((workflow_id, _)) = storage.workflow_of(self.job_id).await? else {
            return Err(Error::Config(format!(
                "job {} is not a workflow step: it cannot add steps",
                self.job_id
            )));
        };
        let added = storage
            .add_workflow_steps(conn, workflow_id, &steps)
            .await?;
        self.writes.telemetry.enqueued(steps.queues());
        Ok(added)
    }

    /// Complete this attempt inside the caller's transaction (`&mut *tx`), so that the handler's
    /// own writes and the job's completion commit or roll back together:
    ///
    /// ```no_run
    /// # async fn handler(ctx: ringwork::JobContext, pool: sqlx::PgPool) -> Result<(), ringwork::BoxError> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO invoices (id) VALUES (1)").execute(&mut *tx).await?;
    /// ctx.complete_in(&mut tx).await?; // Error::Stale if the attempt was rescued or cancelled
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Guarded by `(job_id, run_lease)` like every write for an attempt: when the attempt was
    /// already closed (rescued, cancelled), this returns `Error::Stale` and writes nothing, so `?`
    /// drops (rolls back) the transaction with the effect. Until the transaction ends it holds the
    /// attempt's lock: a rescue or cancel of this attempt waits for it, so commit promptly. When the
    /// handler then returns `Ok`, the runtime's own completion finds the job completed; if the
    /// transaction rolled back instead, the handler's result decides as usual.
    pub async fn complete_in(&self, conn: &mut PgConnection) -> Result<()> {
        let writes = &self.writes;
        match writes.storage.complete_on(conn, &writes.attempt).await? {
            Outcome::Applied => {
                writes
                    .completed_in_tx
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            Outcome::Stale => Err(Error::Stale {
                job_id: self.job_id,
                run_lease: self.run_lease,
            }),
        }
    }
}

/// A one-way flag with a waker: set once, observed by the handler.
#[derive(Debug, Default)]
pub(crate) struct CancelSignal {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl CancelSignal {
    pub(crate) fn set(&self) {
        self.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// A handler's failure. `Retry` uses an attempt and backs off; `Terminal` fails the job for good.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobError {
    /// A failure worth retrying: uses an attempt and runs again after the retry policy's delay
    /// (failed for good once the attempts are used up).
    Retry(String),
    /// Like `Retry`, but runs again after this delay instead of the retry policy's.
    RetryAfter(Duration, String),
    /// Run again after the delay without using an attempt (the job is not ready yet).
    Snooze(Duration),
    /// A failure not worth retrying: the job fails now (dead-lettered if its queue has a DLQ).
    Terminal(String),
    /// The handler registered a callback (`JobContext::register_callback`) and hands the job to
    /// the outside world: the attempt ends, the worker is free, and the job waits in the lease ring
    /// until the callback (complete, fail, retry, resume) or its timeout (a retry, or a failure
    /// once the attempts are used up).
    WaitForCallback,
}

impl JobError {
    /// A failure worth retrying with exponential backoff.
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Self::Retry(error.to_string())
    }

    /// A failure not worth retrying: the job fails now.
    pub fn terminal(error: impl std::fmt::Display) -> Self {
        Self::Terminal(error.to_string())
    }
}

impl std::error::Error for JobError {}

impl JobError {
    /// The outcome of a handler's error of any type: a `JobError` (also one boxed or returned
    /// through `?` into a boxed error) keeps its explicit outcome; any other error is retried with
    /// backoff, recorded with its chain of sources (`top: cause: root cause`).
    pub fn from_handler_error<E: Into<BoxError> + 'static>(error: E) -> Self {
        // anyhow::Error boxes into a wrapper a downcast cannot see through: ask anyhow itself
        let any: Box<dyn std::any::Any> = Box::new(error);
        let error: BoxError = match any.downcast::<anyhow::Error>() {
            Ok(error) => match error.downcast::<JobError>() {
                Ok(explicit) => return explicit,
                Err(error) => error.into(),
            },
            Err(any) => match any.downcast::<E>() {
                Ok(error) => (*error).into(),
                // cannot happen: the box was made from an E just above
                Err(_) => return Self::Retry("a handler error of an unknown type".into()),
            },
        };
        match error.downcast::<JobError>() {
            Ok(explicit) => *explicit,
            Err(other) => {
                let mut text = other.to_string();
                let mut source = other.source();
                while let Some(cause) = source {
                    // an explicit outcome wrapped by another error still decides
                    if let Some(explicit) = cause.downcast_ref::<JobError>() {
                        return explicit.clone();
                    }
                    text.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                Self::Retry(text)
            }
        }
    }
}

/// What a handler may return as its error: anything that converts into a boxed error, so `?` works
/// on `sqlx::Error`, `std::io::Error`, `anyhow::Error`, `String`, your own error types, and
/// `JobError` for an explicit outcome.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Retry(e) => write!(f, "{e}"),
            Self::RetryAfter(d, e) => write!(f, "{e} (retry after {d:?})"),
            Self::Snooze(d) => write!(f, "snoozed for {d:?}"),
            Self::Terminal(e) => write!(f, "{e}"),
            Self::WaitForCallback => write!(f, "waiting for a callback"),
        }
    }
}

pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>;
pub(crate) type ErasedHandler =
    Arc<dyn Fn(JobContext, serde_json::Value) -> HandlerFuture + Send + Sync>;

/// Handlers by job kind.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    handlers: HashMap<String, ErasedHandler>,
    retry_policies: HashMap<String, RetryPolicy>,
}

impl Registry {
    pub(crate) fn register<A, F, Fut, E>(&mut self, handler: F)
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let handler = Arc::new(handler);
        let erased: ErasedHandler = Arc::new(move |ctx, value| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                // Undecodable arguments will not decode on a retry either: fail the job now.
                let args: A = serde_json::from_value(value).map_err(|e| {
                    JobError::Terminal(format!("undecodable arguments for kind {:?}: {e}", A::KIND))
                })?;
                handler(ctx, args)
                    .await
                    .map_err(JobError::from_handler_error)
            })
        });
        self.handlers.insert(A::KIND.to_string(), erased);
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&ErasedHandler> {
        self.handlers.get(kind)
    }

    pub(crate) fn set_retry_policy(&mut self, kind: &str, policy: RetryPolicy) {
        self.retry_policies.insert(kind.to_string(), policy);
    }

    pub(crate) fn retry_policy(&self, kind: &str) -> Option<&RetryPolicy> {
        self.retry_policies.get(kind)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        for (kind, policy) in &self.retry_policies {
            policy.validate(&format!("kind {kind:?}"))?;
        }
        Ok(())
    }
}

/// Delay before retry number `attempt` (1-based): 2^attempt seconds, capped at one hour, plus up to
/// 10 % jitter so that a burst of failures does not come back as a burst. The default
/// `RetryPolicy`.
pub fn retry_backoff(attempt: i32) -> Duration {
    RetryPolicy::default().delay(attempt)
}

/// How long a retried attempt waits before its job runs again, per kind
/// (`ClientBuilder::retry_policy`) or per queue (`QueueConfig::retry_policy`); the kind's policy
/// wins. `JobError::RetryAfter` still sets its own delay. The default is 2^attempt seconds, capped
/// at one hour, plus up to 10 % jitter. (Rescue of a crashed or silent worker's attempt, which the
/// maintenance leader does in SQL without the handler's code, always uses the default curve.)
#[derive(Clone)]
pub enum RetryPolicy {
    /// `base × factor^(attempt − 1)`, capped at `cap`, plus a random share of up to `jitter` of it
    /// (0.1 adds up to 10 %).
    Exponential {
        /// Delay before the first retry.
        base: Duration,
        /// Multiplier applied to the delay for each further retry.
        factor: f64,
        /// Longest delay, before jitter.
        cap: Duration,
        /// Largest random share added to the delay (0.1 adds up to 10 %).
        jitter: f64,
    },
    /// Your own curve: the delay before retry number `attempt` (1 after the first attempt failed).
    Custom(Arc<dyn Fn(i32) -> Duration + Send + Sync>),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::Exponential {
            base: Duration::from_secs(2),
            factor: 2.0,
            cap: Duration::from_secs(3600),
            jitter: 0.1,
        }
    }
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exponential {
                base,
                factor,
                cap,
                jitter,
            } => f
                .debug_struct("Exponential")
                .field("base", base)
                .field("factor", factor)
                .field("cap", cap)
                .field("jitter", jitter)
                .finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// The longest delay a policy may give (a longer one is cut to it): a year.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

impl RetryPolicy {
    /// `base × factor^(attempt − 1)`, capped at `cap`, plus up to `jitter` of it at random.
    pub fn exponential(base: Duration, factor: f64, cap: Duration, jitter: f64) -> Self {
        Self::Exponential {
            base,
            factor,
            cap,
            jitter,
        }
    }

    /// A curve of your own: `delay(attempt)` before retry number `attempt` (1-based).
    pub fn custom(delay: impl Fn(i32) -> Duration + Send + Sync + 'static) -> Self {
        Self::Custom(Arc::new(delay))
    }

    /// The delay before retry number `attempt` (1-based). A custom curve that panics gets the
    /// default curve's delay, with a warning.
    pub fn delay(&self, attempt: i32) -> Duration {
        match self {
            Self::Exponential {
                base,
                factor,
                cap,
                jitter,
            } => {
                let exponent = attempt.clamp(1, 10_000) - 1;
                let raw = base.as_secs_f64() * factor.powi(exponent);
                let capped = if raw.is_finite() {
                    raw.min(cap.as_secs_f64())
                } else {
                    cap.as_secs_f64()
                };
                let with_jitter = capped * (1.0 + rand::random::<f64>() * jitter);
                Duration::from_secs_f64(with_jitter.clamp(0.0, MAX_RETRY_DELAY.as_secs_f64()))
            }
            Self::Custom(delay) => {
                let delay = Arc::clone(delay);
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| delay(attempt))) {
                    Ok(d) => d.min(MAX_RETRY_DELAY),
                    Err(_) => {
                        tracing::warn!(
                            attempt,
                            "a custom retry policy panicked; using the default curve"
                        );
                        Self::default().delay(attempt)
                    }
                }
            }
        }
    }

    /// Refuse values that make no curve: a factor below 1 (or not finite), a cap below the base,
    /// jitter outside 0..=1, a base or cap above a year.
    pub(crate) fn validate(&self, whose: &str) -> Result<()> {
        if let Self::Exponential {
            base,
            factor,
            cap,
            jitter,
        } = self
        {
            let bad =
                |reason: String| Err(Error::Config(format!("retry policy of {whose}: {reason}")));
            if !factor.is_finite() || *factor < 1.0 {
                return bad(format!("factor must be a finite number >= 1, got {factor}"));
            }
            if !(0.0..=1.0).contains(jitter) {
                return bad(format!("jitter must be 0..=1, got {jitter}"));
            }
            if cap < base {
                return bad(format!("cap ({cap:?}) must be at least base ({base:?})"));
            }
            if *cap > MAX_RETRY_DELAY {
                return bad(format!("cap must be at most a year, got {cap:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let one = retry_backoff(1).as_secs_f64();
        assert!((2.0..=2.2).contains(&one), "{one}");
        let ten = retry_backoff(10).as_secs_f64();
        assert!((1024.0..=1126.4).contains(&ten), "{ten}");
        let capped = retry_backoff(25).as_secs_f64();
        assert!((3600.0..=3960.0).contains(&capped), "{capped}");
    }
}
