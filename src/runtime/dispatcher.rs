//! One dispatcher per queue: waits for a free worker slot, claims as many jobs as there are free
//! slots in one round trip, and hands each to an executor task. An empty claim waits for a NOTIFY
//! or the poll interval; a claim that found only busy lanes backs off briefly instead.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tracing::{warn, Instrument};

use super::executor::run_job;
use super::{Finished, Inner, QueueConfig};

pub(super) struct Dispatcher {
    pub(super) inner: Arc<Inner>,
    pub(super) queue: String,
    pub(super) config: QueueConfig,
    pub(super) slots: Arc<Semaphore>,
    pub(super) wake: Arc<Notify>,
    pub(super) done: mpsc::UnboundedSender<Finished>,
}

impl Dispatcher {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0_u32;
        let mut busy_rounds = 0_u32;
        let mut last_full = false;
        let linger_target = self.config.max_workers.clamp(1, self.config.claim_batch);
        loop {
            if *stop.borrow() {
                return;
            }
            let first = tokio::select! {
                permit = Arc::clone(&self.slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            let mut permits = vec![first];
            while permits.len() < self.config.claim_batch {
                match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // Under a backlog, gather a batch's worth of free workers (briefly) before claiming:
            // each claim is a round trip and a commit, so a process with few workers would
            // otherwise pay one per job.
            if last_full && permits.len() < linger_target && !self.config.claim_linger.is_zero() {
                let until = tokio::time::Instant::now() + self.config.claim_linger;
                while permits.len() < linger_target {
                    match tokio::time::timeout_at(until, Arc::clone(&self.slots).acquire_owned())
                        .await
                    {
                        Ok(Ok(p)) => permits.push(p),
                        _ => break,
                    }
                }
            }
            let asked = permits.len();
            let span = tracing::debug_span!(
                "ringwork.claim",
                otel.name = %format_args!("receive {}", self.queue),
                otel.kind = "client",
                messaging.system = "ringwork",
                messaging.operation.type = "receive",
                messaging.operation.name = "claim",
                messaging.destination.name = %self.queue,
                messaging.batch.message_count = tracing::field::Empty,
            );
            let claimed = self
                .inner
                .engine
                .claim_aged(
                    &self.queue,
                    permits.len(),
                    self.config.deadline,
                    self.config.priority_aging,
                )
                .instrument(span.clone())
                .await;
            if let Ok(jobs) = &claimed {
                span.record("messaging.batch.message_count", jobs.len());
            }
            match claimed {
                Ok(jobs) if !jobs.is_empty() => {
                    last_full = jobs.len() == asked;
                    failures = 0;
                    busy_rounds = 0;
                    self.inner
                        .metrics
                        .claimed
                        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                    self.inner.telemetry.claimed(&self.queue, jobs.len());
                    for (job, permit) in jobs.into_iter().zip(permits) {
                        let inner = Arc::clone(&self.inner);
                        let done = self.done.clone();
                        let queue = self.queue.clone();
                        tokio::spawn(async move {
                            let finished = run_job(&inner, &queue, job).await;
                            let _ = done.send(finished);
                            drop(permit);
                        });
                    }
                }
                Ok(_) => {
                    drop(permits);
                    last_full = false;
                    failures = 0;
                    // Empty, or every shard with work was locked by another claimer?
                    let busy = self
                        .inner
                        .engine
                        .queue_has_backlog(&self.queue)
                        .await
                        .unwrap_or(false);
                    // A shard locked by another claimer frees up within milliseconds (claims never
                    // wait for a shard): retry after 4, 8, then every 16 ms while the work stays
                    // with other claimers. A paused queue reports no backlog and waits for the
                    // NOTIFY that resume sends, or the poll interval.
                    busy_rounds = if busy {
                        busy_rounds.saturating_add(1)
                    } else {
                        0
                    };
                    let wait = if busy {
                        Duration::from_millis(2 << busy_rounds.min(3))
                            .min(self.config.poll_interval)
                    } else {
                        self.config.poll_interval
                    };
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => return,
                    }
                }
                Err(e) => {
                    drop(permits);
                    last_full = false;
                    failures = failures.saturating_add(1);
                    let backoff = Duration::from_millis(50 * 2_u64.pow(failures.min(6)));
                    warn!(queue = %self.queue, error = %e, "claim failed; retrying in {backoff:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }
}
