//! Heartbeats for long attempts, batched into one statement per tick, and the watchdog that reports
//! handlers blocking their thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::warn;

use super::executor::millis_since_epoch;
use super::handler::AttemptWrites;
use super::notifier::signal_cancel;
use super::Inner;
use crate::storage::{AttemptRef, Outcome};

/// Heartbeat every attempt that has run for longer than a quarter of the staleness window, in one
/// statement per tick. Short jobs finish before their first heartbeat and never create
/// `attempt_state` rows.
pub(super) async fn heartbeats(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let every = inner.maintenance.stale_after / 4;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        // long attempts, and any attempt with progress to write
        let due: Vec<(AttemptRef, Option<serde_json::Value>, Arc<AttemptWrites>)> =
            match inner.running.lock() {
                Ok(running) => running
                    .values()
                    // an attempt completed in the handler's own transaction holds its lock until
                    // that commits: a heartbeat would wait for it, holding the others' locks
                    .filter(|r| !r.writes.completed_in_tx.load(Ordering::SeqCst))
                    .filter(|r| r.started.elapsed() >= every || r.writes.has_progress())
                    .map(|r| (r.attempt, r.writes.take_progress(), Arc::clone(&r.writes)))
                    .collect(),
                Err(_) => continue,
            };
        let writes: Vec<(AttemptRef, Option<serde_json::Value>)> = due
            .iter()
            .map(|(attempt, progress, _)| (*attempt, progress.clone()))
            .collect();
        match inner.engine.heartbeat_batch(&writes).await {
            Ok(outcomes) => {
                for ((attempt, _, _), outcome) in due.iter().zip(outcomes) {
                    if outcome == Outcome::Stale {
                        // closed under us (rescued or cancelled): tell the handler to stop
                        signal_cancel(&inner, &format!("{}:{}", attempt.job_id, attempt.run_lease));
                        warn!(job_id = attempt.job_id, run_lease = attempt.run_lease,
                              "attempt is no longer open (rescued or cancelled); its handler is told to stop");
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "heartbeat failed");
                for (_, progress, writes) in due {
                    if let Some(progress) = progress {
                        writes.restore_progress(progress);
                    }
                }
            }
        }
    }
}

/// Report every handler poll that has held its thread for more than a second, once per poll, with
/// its job id: blocking code belongs in `tokio::task::spawn_blocking`. Runs beside the heartbeats,
/// on the client's runtime, which a blocking handler cannot stall.
pub(super) async fn watch_blocking(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    const BLOCKING_MS: u64 = 1000;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => return,
        }
        let now = millis_since_epoch() + 1;
        let Ok(mut running) = inner.running.lock() else {
            continue;
        };
        for r in running.values_mut() {
            let since = r.poll_started.load(Ordering::Relaxed);
            if since != 0 && since != r.reported_poll && now.saturating_sub(since) > BLOCKING_MS {
                r.reported_poll = since;
                inner.metrics.blocked.fetch_add(1, Ordering::Relaxed);
                warn!(
                    job_id = r.attempt.job_id,
                    kind = %r.kind,
                    blocked_ms = now.saturating_sub(since),
                    "a handler is blocking its thread; run blocking work with tokio::task::spawn_blocking"
                );
            }
        }
    }
}
