//! The completion batcher: finished attempts are written in batches, one `complete_batch` for the
//! successes and one `close_batch` for the rest per flush, retried across a lost connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{warn, Instrument};

use super::{CompletionConfig, Finished, Metrics};
use crate::storage::{CloseOutcome, Outcome, Storage};
use crate::telemetry::Telemetry;

/// Collects finished attempts and writes them in batches: one `complete_batch` call for the
/// successes and one `close_batch` call for the rest per flush.
pub(super) async fn completion_batcher(
    storage: Storage,
    config: CompletionConfig,
    metrics: Arc<Metrics>,
    telemetry: Telemetry,
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
        let span = tracing::debug_span!(
            "ringwork.complete",
            otel.name = "settle ringwork",
            otel.kind = "client",
            messaging.system = "ringwork",
            messaging.operation.type = "settle",
            messaging.operation.name = "complete",
            messaging.batch.message_count = batch.len(),
        );
        let stale = flush(&storage, &metrics, batch).instrument(span).await;
        telemetry.stale(stale);
    }
}

/// Write one batch; returns how many of its writes were refused as stale.
async fn flush(storage: &Storage, metrics: &Metrics, batch: Vec<Finished>) -> u64 {
    let mut stale = 0;
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
                stale += count(metrics, &outcomes, &metrics.completed);
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
                    stale += count(metrics, std::slice::from_ref(outcome), counter);
                }
                break;
            }
            Err(e) => {
                warn!(error = %e, attempt, "close flush failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * 2_u64.pow(attempt))).await;
            }
        }
    }
    stale
}

/// Count outcomes into the process's counters; returns how many were stale.
fn count(metrics: &Metrics, outcomes: &[Outcome], applied: &AtomicU64) -> u64 {
    let mut stale = 0;
    for outcome in outcomes {
        match outcome {
            Outcome::Applied => applied.fetch_add(1, Ordering::Relaxed),
            Outcome::Stale => {
                stale += 1;
                metrics.stale.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
    stale
}
