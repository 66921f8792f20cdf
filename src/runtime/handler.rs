//! Handlers: what user code sees of a running attempt, and how it reports the outcome.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::job::JobArgs;

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

    async fn wait(&self) {
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
    pub(crate) fn register<A, F, Fut>(&mut self, handler: F)
    where
        A: JobArgs,
        F: Fn(JobContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: ErasedHandler = Arc::new(move |ctx, value| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                // Undecodable arguments will not decode on a retry either: fail the job now.
                let args: A = serde_json::from_value(value).map_err(|e| {
                    JobError::Terminal(format!("undecodable arguments for kind {:?}: {e}", A::KIND))
                })?;
                handler(ctx, args).await
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
