//! Running a queue's jobs inline, in the caller's task, without starting the client: what the test
//! kit (`crate::testing`) drains queues with. Each job runs through the same handler path as in a
//! started client (its own task, deadline, panic capture) and is settled at once.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;

use super::handler::{AttemptWrites, CancelSignal};
use super::{completer, executor, Inner};
use crate::error::Result;
use crate::storage::CloseOutcome;

/// How `drain` runs a queue.
#[derive(Clone, Debug)]
pub struct Drain {
    /// Also run scheduled and retryable jobs (a retry's backoff included) at once, instead of
    /// leaving them for their time.
    pub with_scheduled: bool,
    /// Stop after this many runs (a handler that always retries or snoozes never empties a queue
    /// `with_scheduled`).
    pub max_runs: usize,
}

impl Drain {
    /// Run scheduled and retryable jobs at once too (`with_scheduled`), up to the default
    /// `max_runs`.
    pub fn with_scheduled() -> Self {
        Self {
            with_scheduled: true,
            ..Self::default()
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            with_scheduled: false,
            max_runs: 1000,
        }
    }
}

/// One handler run during a drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The job that ran.
    pub job_id: i64,
    /// The job's kind.
    pub kind: String,
    /// The attempt's number, from 1.
    pub attempt: i32,
    /// How the run ended.
    pub outcome: RunOutcome,
}

/// How a run ended, as it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The handler returned `Ok(())`: the job completed.
    Completed,
    /// Back to the queue after a backoff (uses an attempt).
    Retried {
        /// The error recorded for the attempt.
        error: String,
    },
    /// Back to the queue without using an attempt.
    Snoozed,
    /// Failed for good (or dead-lettered, when the queue has a dead-letter queue).
    Failed {
        /// The error recorded for the failure.
        error: String,
    },
    /// The attempt was closed under the handler (cancelled): its outcome changed nothing.
    Stale,
    /// The handler returned `WaitForCallback`: the job waits for its callback (or a callback that
    /// came while it ran was applied).
    Waiting,
}

/// What a drain ran, in order.
#[derive(Clone, Debug, Default)]
pub struct Drained {
    /// Every run, in the order it ran.
    pub runs: Vec<Run>,
    /// The drain stopped at `Drain::max_runs` with work left.
    pub hit_max_runs: bool,
}

impl Drained {
    /// Runs that ended with this outcome.
    pub fn count(&self, matches: impl Fn(&RunOutcome) -> bool) -> usize {
        self.runs.iter().filter(|r| matches(&r.outcome)).count()
    }

    /// Runs that completed.
    pub fn completed(&self) -> usize {
        self.count(|o| *o == RunOutcome::Completed)
    }

    /// Runs that were retried (used an attempt and went back after a backoff).
    pub fn retried(&self) -> usize {
        self.count(|o| matches!(o, RunOutcome::Retried { .. }))
    }

    /// Runs that failed for good (or dead-lettered).
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, RunOutcome::Failed { .. }))
    }
}

/// Claim and run `queue`'s jobs until a claim comes back empty (or `until` has run once).
pub(crate) async fn drain(
    inner: &Arc<Inner>,
    queue: &str,
    options: &Drain,
    until: Option<i64>,
) -> Result<Drained> {
    let deadline = inner
        .queues
        .iter()
        .find(|(name, _)| name == queue)
        .and_then(|(_, config)| config.deadline);
    let mut drained = Drained::default();
    loop {
        if options.with_scheduled {
            inner.engine.run_deferred_now(queue).await?;
        }
        inner.engine.promote_due(10_000).await?;
        let room = options.max_runs.saturating_sub(drained.runs.len());
        if room == 0 {
            drained.hit_max_runs = inner.engine.queue_has_backlog(queue).await?;
            return Ok(drained);
        }
        // one at a time: a claimed job's deadline runs from its claim, so jobs claimed together
        // and run one after another would spend theirs waiting
        let claimed = inner
            .engine
            .claim_rows(queue, 1, deadline, None, None)
            .await?;
        if claimed.jobs.is_empty() && claimed.failed.is_empty() {
            return Ok(drained);
        }
        for (job, error) in claimed.failed {
            drained.runs.push(Run {
                job_id: job.job_id,
                kind: job.kind,
                attempt: job.attempt,
                outcome: RunOutcome::Failed { error },
            });
        }
        let jobs = claimed.jobs;
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            let (job_id, kind, attempt) = (job.job_id, job.kind.clone(), job.attempt);
            let writes = Arc::new(AttemptWrites::new(
                job.attempt_ref(),
                inner.storage.clone(),
                inner.telemetry.clone(),
            ));
            let finished = executor::run_handler(
                inner,
                &tokio::runtime::Handle::current(),
                queue,
                job,
                Arc::new(CancelSignal::default()),
                Arc::new(AtomicU64::new(0)),
                writes,
                &AtomicUsize::new(0),
            )
            .await;
            let outcome = match &finished.result {
                Ok(()) if finished.settled => RunOutcome::Waiting,
                Ok(()) => RunOutcome::Completed,
                Err(CloseOutcome::Retry { error, .. }) => RunOutcome::Retried {
                    error: error.clone(),
                },
                Err(CloseOutcome::Snooze { .. }) => RunOutcome::Snoozed,
                Err(CloseOutcome::Failed { error }) => RunOutcome::Failed {
                    error: error.clone(),
                },
            };
            let stale = completer::flush(&inner.engine, &inner.metrics, vec![finished]).await;
            drained.runs.push(Run {
                job_id,
                kind,
                attempt,
                outcome: if stale > 0 {
                    RunOutcome::Stale
                } else {
                    outcome
                },
            });
            if until == Some(job_id) {
                // the rest of this claim goes back to the queue at once, using no attempt
                let rest: Vec<_> = jobs
                    .map(|job| {
                        (
                            job.attempt_ref(),
                            CloseOutcome::Snooze {
                                at: chrono::Utc::now(),
                            },
                        )
                    })
                    .collect();
                inner.engine.close_batch(&rest).await?;
                return Ok(drained);
            }
        }
    }
}
