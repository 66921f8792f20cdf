//! One dispatcher per queue: waits for claim room, claims as many jobs as there is room for in one
//! round trip, and hands each to a task of its own on the handler runtime (executor.rs), which runs it on
//! a free worker. An empty claim waits for a NOTIFY or the poll interval; a claim that found only busy
//! lanes backs off briefly.
//!
//! Two semaphores bound a queue in a process: `workers` (`max_workers` handlers running) and
//! `claims` (`max_workers + claim_ahead` jobs claimed and not yet finished). While the queue's
//! handlers are short, the dispatcher claims ahead: jobs wait in about claim order for the next free
//! worker, and the next claim's round trip overlaps the running handlers. How many it claims ahead
//! is bounded by time as well (`ahead_now`): the dispatcher holds at most `max_workers + ahead_now`
//! claimed jobs and waits for one to finish (`room`). While they are long (on
//! average, or one is running long now), each claimed job first takes its worker; a job already
//! waiting behind a handler that turned out long is handed back after a bounded wait.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{warn, Instrument};

use super::completer::{FlushHint, FlushSignals};
use super::executor::{a_handler_blocks, register, run_job, QueueTasks};
use super::notifier::QueueWake;
use super::{
    Finished, Inner, QueueConfig, CLAIM_AHEAD_MAX_HANDLER, CLAIM_AHEAD_WINDOW, CLAIM_SHARD_WAIT,
    IDLE_POLL_MAX,
};

pub(super) struct Dispatcher {
    pub(super) inner: Arc<Inner>,
    pub(super) queue: String,
    pub(super) config: QueueConfig,
    /// `max_workers` permits: one per running handler.
    pub(super) workers: Arc<Semaphore>,
    /// `claims_total` (`max_workers + claim_ahead`) permits: one per claimed job not yet finished.
    pub(super) claims: Arc<Semaphore>,
    pub(super) claims_total: usize,
    pub(super) wake: Arc<QueueWake>,
    /// The process's LISTEN is in place (notifier.rs): an idle wait may be long.
    pub(super) listening: Arc<AtomicBool>,
    pub(super) done: mpsc::UnboundedSender<Finished>,
    /// Rung when a claim comes back short while the completion batcher holds attempts: it
    /// flushes them now (completer.rs).
    pub(super) flush: Arc<FlushSignals>,
    /// The last claim came back short and left workers idle (`after_claim`): every job of the
    /// queue that finishes rings `flush` until a claim fills the workers again.
    pub(super) dry: Arc<AtomicBool>,
    /// Rung by each job of the queue as it gives back its claim permit: a dispatcher holding all
    /// the jobs it may claim ahead right now waits for it (`room`).
    pub(super) finished: Arc<Notify>,
}

/// The handler-time average before any handler has run.
const UNKNOWN: u64 = u64::MAX;

/// Fold one handler's run time into the queue's average: a longer run than the average replaces
/// it at once (one long handler stops claiming ahead), a shorter one pulls it down by an eighth.
fn record_handler_time(average_us: &AtomicU64, took: Duration) {
    let took = took.as_micros().min(u128::from(UNKNOWN - 1)) as u64;
    // a compare-and-swap loop: a short run finishing beside a long one must not undo it
    let _ = average_us.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
        Some(if was == UNKNOWN || took >= was {
            took
        } else {
            was - was / 8 + took / 8
        })
    });
}

/// How many jobs to claim ahead of the workers now: at most `CLAIM_AHEAD_WINDOW` of work for all of
/// the queue's workers at its handler average (rounded down, but at least one), at most
/// `claim_ahead`. A fixed count would let a process with one worker and 40-ms handlers hold
/// `claim_ahead` × 40 ms of work that other processes could be running; bounded by time, it holds
/// 5 jobs ahead, while a process of 4 workers with 4-ms handlers may hold 200 (capped at
/// `claim_ahead`), so its claims take many jobs.
fn ahead_now(average_us: u64, max_workers: usize, claim_ahead: usize) -> usize {
    let window_us = CLAIM_AHEAD_WINDOW.as_micros() as u64 * max_workers as u64;
    let ahead = window_us / average_us.max(1);
    usize::try_from(ahead)
        .unwrap_or(usize::MAX)
        .clamp(1, claim_ahead.max(1))
}

/// An idle dispatcher's wait after its `rounds`-th empty claim in a row (`Dispatcher::idle_wait`).
fn idle_wait(poll: Duration, listening: bool, rounds: u32) -> Duration {
    if !listening {
        return poll;
    }
    poll.saturating_mul(1 << rounds.saturating_sub(1).min(16))
        .min(IDLE_POLL_MAX.max(poll))
}

/// How long a job claimed ahead may wait for a worker before it is handed back: four times the
/// wait the queue's handler average predicts, at least 500 ms (a busy machine's hiccup is not a
/// long handler, and a hand-back costs a trip through `deferred_jobs`), at most what handlers at
/// `CLAIM_AHEAD_MAX_HANDLER` would cause, twice over.
fn wait_limit(average_us: u64, runs_ahead: u32) -> Duration {
    let average = Duration::from_micros(average_us.min(CLAIM_AHEAD_MAX_HANDLER.as_micros() as u64));
    (average * 4 * runs_ahead).clamp(
        Duration::from_millis(500),
        (CLAIM_AHEAD_MAX_HANDLER * 2 * runs_ahead).max(Duration::from_millis(500)),
    )
}

/// Room for one claimed job: its claim permit, and its worker when it was taken before the claim.
struct Room {
    claim: OwnedSemaphorePermit,
    worker: Option<OwnedSemaphorePermit>,
}

/// A claimed job's claim permit in its task: given back when the task ends, however it ends (a
/// panic included), with a ring of the dispatcher's `finished`, which may be waiting for it.
struct HeldClaim {
    permit: Option<OwnedSemaphorePermit>,
    finished: Arc<Notify>,
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        // the permit first: a dispatcher woken before it is back would count it as held and wait
        // again, for a ring that never comes (`notify_one` keeps one ring for a dispatcher that
        // is not waiting yet, so ringing after is never lost)
        drop(self.permit.take());
        self.finished.notify_one();
    }
}

impl Dispatcher {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0_u32;
        let mut busy_rounds = 0_u32;
        // empty claims in a row that found no work anywhere (`idle_wait`)
        let mut idle_rounds = 0_u32;
        let mut last_full = false;
        // the last claim came back empty while other claimers held the queue's work
        let mut last_busy = false;
        let linger_target = self.config.max_workers.clamp(1, self.config.claim_batch);
        // No handler has run yet: assume long ones, so a queue of long jobs never claims ahead.
        let handler_us = Arc::new(AtomicU64::new(UNKNOWN));
        let tasks = Arc::new(QueueTasks {
            workers: Arc::clone(&self.workers),
            long_running: Arc::new(AtomicUsize::new(0)),
            // the client's runtime, where the dispatcher runs
            client: tokio::runtime::Handle::current(),
        });
        loop {
            if *stop.borrow() {
                return;
            }
            // A moving average of this queue's handler durations decides whether to claim ahead.
            let average = handler_us.load(Ordering::Relaxed);
            let ahead = self.config.claim_ahead > 0
                && average != UNKNOWN
                && Duration::from_micros(average) <= CLAIM_AHEAD_MAX_HANDLER
                && tasks.long_running.load(Ordering::Relaxed) == 0
                && !a_handler_blocks(&self.inner, CLAIM_AHEAD_MAX_HANDLER);
            let ahead_now = if ahead {
                ahead_now(average, self.config.max_workers, self.config.claim_ahead)
            } else {
                0
            };
            // Claiming ahead, the queue holds at most this many claimed jobs; not claiming ahead,
            // each claimed job takes a free worker first.
            let hold = self.config.max_workers + ahead_now;
            // A job claimed ahead waits for about `ahead_now / max_workers + 1` handler runs.
            let runs_ahead = ahead_now.div_ceil(self.config.max_workers) as u32 + 1;
            // Without room now, the dispatcher is full until some frees up: a notification meanwhile
            // is passed on to the other processes, if this one is the queue's first responder.
            let first = match self.try_room(ahead, hold) {
                Some(room) => room,
                None => {
                    self.wake.set_full(true);
                    let room = tokio::select! {
                        room = self.room(ahead, hold) => room,
                        _ = stop.changed() => None,
                    };
                    self.wake.set_full(false);
                    match room {
                        Some(room) => room,
                        None => return,
                    }
                }
            };
            let mut permits = vec![first];
            while permits.len() < self.config.claim_batch {
                match self.try_room(ahead, hold) {
                    Some(room) => permits.push(room),
                    None => break,
                }
            }
            // Under a backlog, gather a batch's worth of room (briefly) before claiming: each
            // claim is a round trip and a commit, so a process with few workers would otherwise
            // pay one per job or two. Claiming ahead, a batch is half of what the queue may hold,
            // and never more than `ahead_now`: the rest is jobs claimed and not finished, at least
            // `max_workers` of them, so the workers stay busy while the room fills and while the
            // claim runs. The wait is bounded by what the handler average predicts for the
            // missing room (twice over), never more than `CLAIM_AHEAD_MAX_HANDLER`, and ends
            // at once when the client stops.
            let target = if ahead {
                (hold / 2).min(ahead_now).clamp(1, self.config.claim_batch)
            } else {
                linger_target
            };
            // Work held by other claimers is still a backlog: claiming ahead, the claim after
            // such an empty one gathers room as one after a full claim does (claiming whatever
            // room was free the moment a shard freed up made many small claims with many small
            // processes: 8x4 made more claims and commits per job). Not claiming ahead, workers
            // would wait idle for it, and a fleet limit that cut the claim answers "busy" too.
            let backlog = last_full || (last_busy && ahead);
            if backlog && permits.len() < target && !self.config.claim_linger.is_zero() {
                let linger = if ahead {
                    let missing = (target - permits.len()) as u64;
                    Duration::from_micros(
                        (average.saturating_mul(missing) * 2 / self.config.max_workers as u64)
                            .min(CLAIM_AHEAD_MAX_HANDLER.as_micros() as u64),
                    )
                    .max(self.config.claim_linger)
                } else {
                    self.config.claim_linger
                };
                let until = tokio::time::Instant::now() + linger;
                while permits.len() < target {
                    tokio::select! {
                        room = tokio::time::timeout_at(until, self.room(ahead, hold)) => match room {
                            Ok(Some(room)) => permits.push(room),
                            _ => break,
                        },
                        _ = stop.changed() => return,
                    }
                }
            }
            // stopped while gathering room: claim nothing (shutdown starts no new handler)
            if *stop.borrow() {
                return;
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
                .claim_rows(
                    &self.queue,
                    permits.len(),
                    self.config.deadline,
                    self.config.priority_aging,
                    Some(CLAIM_SHARD_WAIT),
                )
                .instrument(span.clone())
                .await;
            if let Ok(claimed) = &claimed {
                span.record("messaging.batch.message_count", claimed.jobs.len());
            }
            // jobs failed at the claim (undecodable arguments) took rows from the queue: claim again
            // at once rather than wait as if the queue were empty
            let claimed = claimed.map(|c| {
                for (job, _) in &c.failed {
                    self.inner.metrics.failed.fetch_add(1, Ordering::Relaxed);
                    self.inner
                        .telemetry
                        .finished(&self.queue, &job.kind, "failed", Duration::ZERO);
                }
                (c.jobs, c.failed.len(), c.more)
            });
            match claimed {
                Ok((jobs, failed, more)) if !jobs.is_empty() || failed > 0 => {
                    self.wake.claimed(true);
                    last_full = jobs.len() + failed == asked;
                    // short, and it saw every visible job: nothing is left to claim until a NOTIFY
                    // (another claim now would come back empty, at a claim's fixed cost)
                    let drained = !last_full && !more && failed == 0;
                    last_busy = false;
                    failures = 0;
                    busy_rounds = 0;
                    idle_rounds = 0;
                    self.inner
                        .metrics
                        .claimed
                        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
                    self.inner.telemetry.claimed(&self.queue, jobs.len());
                    let wait_limit = wait_limit(average, runs_ahead);
                    for (job, room) in jobs.into_iter().zip(permits) {
                        // registered here, on the client's runtime: its heartbeats keep the claim
                        // alive however long the handler runtime takes to start its task
                        let registered = register(&self.inner, &job);
                        let inner = Arc::clone(&self.inner);
                        let done = self.done.clone();
                        let queue = self.queue.clone();
                        let tasks = Arc::clone(&tasks);
                        let handler_us = Arc::clone(&handler_us);
                        let dry = Arc::clone(&self.dry);
                        let claims = Arc::clone(&self.claims);
                        let claims_total = self.claims_total;
                        let finished = Arc::clone(&self.finished);
                        let run = async move {
                            let Room { claim, worker } = room;
                            let claim = HeldClaim {
                                permit: Some(claim),
                                finished,
                            };
                            let finished = run_job(
                                &inner, &queue, job, registered, worker, &tasks, wait_limit,
                            )
                            .await;
                            if let Some(took) = finished.handler_time {
                                record_handler_time(&handler_us, took);
                            }
                            let mut finished = finished;
                            drop(claim);
                            // running dry: the queue's last claimed job flushes now; an earlier
                            // one lets the jobs claimed with it (which mostly finish within the
                            // same few milliseconds) join its flush (completer.rs)
                            if dry.load(Ordering::Relaxed) {
                                finished.flush = if claims.available_permits() >= claims_total {
                                    FlushHint::Now
                                } else {
                                    FlushHint::Soon
                                };
                            }
                            let _ = done.send(finished);
                        };
                        match self.inner.handlers.handle() {
                            Some(handlers) => drop(handlers.spawn(run)),
                            None => drop(tokio::spawn(run)),
                        }
                    }
                    self.after_claim(!last_full);
                    if drained
                        && !self
                            .wait_for_work(self.config.poll_interval, &mut stop)
                            .await
                    {
                        return;
                    }
                }
                Ok((_, _, more)) => {
                    drop(permits);
                    self.after_claim(true);
                    failures = 0;
                    // Empty: the claim saw every visible job (no more), or may have left some behind:
                    // every shard with work locked by another claimer, or a limit. Which of those?
                    let busy = more
                        && self
                            .inner
                            .engine
                            .queue_has_backlog(&self.queue)
                            .await
                            .unwrap_or(false);
                    last_full = false;
                    last_busy = busy;
                    // A shard locked by another claimer frees up within milliseconds (a claim waits
                    // only for a lone shard, CLAIM_SHARD_WAIT): retry after 4, 8, then every 16 ms
                    // while the work stays with other claimers. A paused queue reports no backlog and waits for the
                    // NOTIFY that resume sends, or the poll interval.
                    if !busy {
                        // found no work at all: a follower waits longer for the next NOTIFY
                        self.wake.claimed(false);
                    }
                    busy_rounds = if busy {
                        busy_rounds.saturating_add(1)
                    } else {
                        0
                    };
                    let wait = if busy {
                        idle_rounds = 0;
                        Duration::from_millis(2 << busy_rounds.min(3))
                            .min(self.config.poll_interval)
                    } else {
                        idle_rounds = idle_rounds.saturating_add(1);
                        self.idle_wait(idle_rounds)
                    };
                    if !self.wait_for_work(wait, &mut stop).await {
                        return;
                    }
                }
                Err(e) => {
                    drop(permits);
                    last_full = false;
                    last_busy = false;
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

    /// After each claim (the room it did not use released): a short claim that leaves this queue
    /// holding fewer jobs than it has workers means idle workers: the queue is running dry, or a
    /// fleet `max_running` cut the claim, and then the completions waiting for their flush count
    /// as running and hold the limit's room. Either way, flush them now, and every completion of
    /// the queue until a claim fills the workers again (completer.rs). A queue still holding work
    /// for every worker (a claim cut short by other claimers' shards, under a backlog) keeps the
    /// flush pace: flushing at every such claim made as many flushes per job as before pacing at
    /// 8x4.
    /// How long to wait for a NOTIFY after the `rounds`-th empty claim in a row that found no work:
    /// `poll_interval` without a LISTEN (the poll is the only way to see new work), and with one,
    /// twice as long at each round, up to `IDLE_POLL_MAX` (or `poll_interval` when longer).
    fn idle_wait(&self, rounds: u32) -> Duration {
        idle_wait(
            self.config.poll_interval,
            self.listening.load(Ordering::Relaxed),
            rounds,
        )
    }

    /// Wait for a NOTIFY of new work in the queue, or `wait`; false when the client stops.
    async fn wait_for_work(&self, wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        tokio::select! {
            _ = self.wake.notify.notified() => true,
            _ = tokio::time::sleep(wait) => true,
            _ = stop.changed() => false,
        }
    }

    fn after_claim(&self, short: bool) {
        let dry = short && self.held() < self.config.max_workers;
        self.dry.store(dry, Ordering::Relaxed);
        if dry && self.flush.holding.load(Ordering::Relaxed) {
            self.flush.now.notify_one();
        }
    }

    /// Jobs of this queue claimed and not finished (including room in the dispatcher's hand).
    fn held(&self) -> usize {
        self.claims_total
            .saturating_sub(self.claims.available_permits())
    }

    /// Wait for room for one more claimed job: a claim permit, and (not claiming ahead) a free
    /// worker too; claiming ahead, while the queue holds `hold` jobs, for one of them to finish.
    /// The claim permit comes first, so a dispatcher never holds a worker while it waits for jobs
    /// claimed ahead to finish. None: the semaphores are closed.
    async fn room(&self, ahead: bool, hold: usize) -> Option<Room> {
        // `notify_one` keeps one wake-up for a waiter that is not waiting yet: a job finishing
        // between the check and the wait is not missed
        while ahead && self.held() >= hold {
            self.finished.notified().await;
        }
        let claim = Arc::clone(&self.claims).acquire_owned().await.ok()?;
        let worker = if ahead {
            None
        } else {
            Some(Arc::clone(&self.workers).acquire_owned().await.ok()?)
        };
        Some(Room { claim, worker })
    }

    /// Room for one more claimed job if there is some now.
    fn try_room(&self, ahead: bool, hold: usize) -> Option<Room> {
        if ahead && self.held() >= hold {
            return None;
        }
        let claim = Arc::clone(&self.claims).try_acquire_owned().ok()?;
        let worker = if ahead {
            None
        } else {
            Some(Arc::clone(&self.workers).try_acquire_owned().ok()?)
        };
        Some(Room { claim, worker })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_wait_doubles_up_to_its_cap_only_while_the_process_listens() {
        let poll = Duration::from_millis(250);
        let ms = |rounds| idle_wait(poll, true, rounds).as_millis();
        assert_eq!(
            [1, 2, 3, 4, 5, 6].map(ms),
            [250, 500, 1000, 2000, 4000, 5000]
        );
        assert_eq!(ms(u32::MAX), 5000);
        // without a LISTEN the poll is the only way to see new work
        assert_eq!(idle_wait(poll, false, 9), poll);
        // a poll longer than the cap is kept
        let long = Duration::from_secs(60);
        assert_eq!(idle_wait(long, true, 3), long);
    }
}
