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
use crate::storage::{AttemptRef, Outcome, Storage};

/// What a handler knows about the attempt it runs.
#[derive(Clone, Debug)]
pub struct JobContext {
    pub job_id: i64,
    pub run_lease: i64,
    pub attempt: i32,
    pub max_attempts: i32,
    pub kind: String,
    pub queue: String,
    pub created_at: DateTime<Utc>,
    pub(crate) cancel: Arc<CancelSignal>,
    pub(crate) writes: Arc<AttemptWrites>,
}

/// The writes a handler makes on behalf of its own attempt.
#[derive(Debug)]
pub(crate) struct AttemptWrites {
    pub(crate) attempt: AttemptRef,
    pub(crate) storage: Storage,
    /// Set once `complete_in` applied: the runtime's own completion of this attempt will then be
    /// refused as stale (the transaction committed) or apply (it rolled back), both as expected.
    pub(crate) completed_in_tx: std::sync::atomic::AtomicBool,
}

impl AttemptWrites {
    pub(crate) fn new(attempt: AttemptRef, storage: Storage) -> Self {
        Self {
            attempt,
            storage,
            completed_in_tx: Default::default(),
        }
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
pub enum JobError {
    Retry(String),
    RetryAfter(Duration, String),
    /// Run again after the delay without using an attempt (the job is not ready yet).
    Snooze(Duration),
    Terminal(String),
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
}

/// Delay before retry number `attempt` (1-based): 2^attempt seconds, capped at one hour, plus up to
/// 10 % jitter so that a burst of failures does not come back as a burst.
pub fn retry_backoff(attempt: i32) -> Duration {
    let base = 2_f64.powi(attempt.clamp(0, 30)).min(3600.0);
    let jitter = rand::random::<f64>() * 0.1 * base;
    Duration::from_secs_f64(base + jitter)
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
