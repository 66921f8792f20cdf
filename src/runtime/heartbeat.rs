//! Heartbeats for long attempts, batched into one statement per tick.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::warn;

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
        let due: Vec<(AttemptRef, Option<serde_json::Value>)> = match inner.running.lock() {
            Ok(running) => running
                .values()
                .filter(|(_, started, _)| started.elapsed() >= every)
                .map(|(attempt, _, _)| (*attempt, None))
                .collect(),
            Err(_) => continue,
        };
        match inner.storage.heartbeat_batch(&due).await {
            Ok(outcomes) => {
                for ((attempt, _), outcome) in due.iter().zip(outcomes) {
                    if outcome == Outcome::Stale {
                        // closed under us (rescued or cancelled): tell the handler to stop
                        signal_cancel(&inner, &format!("{}:{}", attempt.job_id, attempt.run_lease));
                        warn!(job_id = attempt.job_id, run_lease = attempt.run_lease,
                              "attempt is no longer open (rescued or cancelled); its handler is told to stop");
                    }
                }
            }
            Err(e) => warn!(error = %e, "heartbeat failed"),
        }
    }
}
