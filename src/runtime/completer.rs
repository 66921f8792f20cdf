//! The completion batcher: finished attempts are written in batches, one `complete_batch` for the
//! successes and one `close_batch` for the rest per flush, retried across a lost connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tracing::{warn, Instrument};

use super::{CompletionConfig, Finished, Metrics};
use crate::storage::{CloseOutcome, Outcome, Storage};
use crate::telemetry::Telemetry;

/// Collects finished attempts and writes them in batches: one `complete_batch` call for the
/// successes and one `close_batch` call for the rest per flush.
///
/// Flushes are paced, not delayed: a completion that arrives after a quiet spell (no flush for
/// `max_delay`) is flushed at once, with whatever else is already waiting; under load, flushes
/// start at most once per `max_delay`, so a process's completions share one round trip and one
/// commit per interval however few workers it has (with a fixed 5-ms gather, a process of 4
/// workers made a flush per 26 jobs at saturation, one of 32 workers a flush per 105).
/// A gather ends early while a queue runs dry: when a claim of the queue came back short and left
/// workers idle (`signals.now`, rung only while attempts wait here), and, until a claim fills its
/// workers again, with each of the queue's finished attempts (`Finished::flush`): the last job the
/// queue held asks for its flush now, an earlier one within `DRY_LINGER` (dispatcher.rs,
/// `after_claim`). The attempts waiting here may then be what holds the queue back (a fleet
/// `max_running` counts them as running until their flush commits), and a queue running dry has
/// little load to share a flush with.
pub(super) async fn completion_batcher(
    storage: Storage,
    config: CompletionConfig,
    metrics: Arc<Metrics>,
    telemetry: Telemetry,
    signals: Arc<FlushSignals>,
    mut rx: mpsc::UnboundedReceiver<Finished>,
) {
    let mut last_flush: Option<Instant> = None;
    loop {
        // `holding` stays set while attempts wait in the channel (through a flush too), so a
        // short claim meanwhile rings for them; it is cleared only to wait on an empty channel,
        // and a ring stored before that was for attempts already flushed
        let first = match rx.try_recv() {
            Ok(item) => item,
            Err(_) => {
                signals.holding.store(false, Ordering::Relaxed);
                let _ = signals.now.notified().now_or_never();
                let Some(item) = rx.recv().await else { return };
                signals.holding.store(true, Ordering::Relaxed);
                item
            }
        };
        let now = Instant::now();
        let mut deadline = last_flush.map_or(now, |at| at + config.max_delay);
        let mut flush_now = hurry(&first, &mut deadline);
        let mut batch = vec![first];
        if deadline <= now {
            // after a quiet spell: what is waiting already, at once (no timer tick)
            take_waiting(&mut rx, &mut batch, config.max_batch);
        }
        while !flush_now && batch.len() < config.max_batch && deadline > Instant::now() {
            tokio::select! {
                biased;
                item = tokio::time::timeout_at(deadline, rx.recv()) => match item {
                    Ok(Some(item)) => {
                        flush_now = hurry(&item, &mut deadline);
                        batch.push(item);
                    }
                    Ok(None) | Err(_) => break,
                },
                _ = signals.now.notified() => break,
            }
        }
        take_waiting(&mut rx, &mut batch, config.max_batch);
        // a batch of attempts already settled writes nothing: it must not cost the next
        // completion its quiet-spell flush
        if batch.iter().any(|item| !item.settled) {
            last_flush = Some(Instant::now());
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

/// How long a dry queue's completion waits for the jobs claimed with it before its flush: at a
/// modest rate a claim takes a few jobs, which run at once and finish within milliseconds of each
/// other; flushing at each of them cost a `complete_batch` round trip and commit per two jobs (at
/// a fixed 400 jobs/s, 2 flushes per claim of 5). A longer job does not hold the others: the
/// flush goes at this bound.
pub(super) const DRY_LINGER: Duration = Duration::from_millis(5);

/// How soon a finished attempt wants its flush, set by its dispatcher (dispatcher.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushHint {
    /// At the pace (`max_delay`): its queue has work for every worker.
    Paced,
    /// Within `DRY_LINGER`: its queue runs dry, and other jobs it holds still run.
    Soon,
    /// Now: its queue runs dry, and it was the last job the queue held.
    Now,
}

/// The dispatchers' signal to the batcher while their queue runs dry (dispatcher.rs).
#[derive(Default)]
pub(crate) struct FlushSignals {
    /// Flush what is waiting now: a claim came back short.
    pub(crate) now: Notify,
    /// Attempts wait in the batcher or its channel: a short claim rings `now` only then (a ring
    /// stored while it waited empty would flush the next attempt alone).
    pub(crate) holding: AtomicBool,
}

/// Bring the gather's `deadline` forward as `item` asks; true when it asks for its flush now.
fn hurry(item: &Finished, deadline: &mut Instant) -> bool {
    match item.flush {
        FlushHint::Paced => false,
        FlushHint::Soon => {
            *deadline = (*deadline).min(Instant::now() + DRY_LINGER);
            false
        }
        FlushHint::Now => true,
    }
}

/// Add what is in the channel already to `batch`, up to `max_batch`, without waiting.
fn take_waiting(
    rx: &mut mpsc::UnboundedReceiver<Finished>,
    batch: &mut Vec<Finished>,
    max_batch: usize,
) {
    while batch.len() < max_batch {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// Write one batch; returns how many of its writes were refused as stale.
pub(super) async fn flush(storage: &Storage, metrics: &Metrics, batch: Vec<Finished>) -> u64 {
    let mut stale = 0;
    let mut successes = Vec::new();
    let mut success_in_tx = Vec::new();
    let mut closes = Vec::new();
    let mut close_in_tx = Vec::new();
    for item in batch {
        if item.settled {
            continue;
        }
        match item.result {
            Ok(()) => {
                successes.push(item.attempt);
                success_in_tx.push(item.completed_in_tx);
            }
            Err(close) => {
                closes.push((item.attempt, close));
                close_in_tx.push(item.completed_in_tx);
            }
        }
    }
    // A lost connection must not lose completions: retry with backoff. If the database stays
    // away, the claims stay open and rescue re-runs the jobs (at-least-once).
    for attempt in 0..8_u32 {
        match storage.complete_batch(&successes).await {
            Ok(outcomes) => {
                for (outcome, in_tx) in outcomes.iter().zip(&success_in_tx) {
                    stale += count(metrics, outcome, *in_tx, &metrics.completed);
                }
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
                for (((_, close), outcome), in_tx) in closes.iter().zip(&outcomes).zip(&close_in_tx)
                {
                    let counter = match close {
                        CloseOutcome::Retry { .. } | CloseOutcome::Snooze { .. } => {
                            &metrics.retried
                        }
                        CloseOutcome::Failed { .. } => &metrics.failed,
                    };
                    stale += count(metrics, outcome, *in_tx, counter);
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

/// Count one outcome into the process's counters; returns 1 when it was an unexpected stale write.
/// An attempt the handler completed in its own transaction counts as completed whatever the
/// runtime's own write for it found: refused because that transaction committed, or applied
/// because it rolled back (then `applied` counts it).
fn count(metrics: &Metrics, outcome: &Outcome, completed_in_tx: bool, applied: &AtomicU64) -> u64 {
    match (outcome, completed_in_tx) {
        (Outcome::Applied, _) => {
            applied.fetch_add(1, Ordering::Relaxed);
            0
        }
        (Outcome::Stale, true) => {
            metrics.completed.fetch_add(1, Ordering::Relaxed);
            0
        }
        (Outcome::Stale, false) => {
            metrics.stale.fetch_add(1, Ordering::Relaxed);
            1
        }
    }
}
