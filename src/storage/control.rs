//! Operator controls: cancel (by id or unique key), pause/resume, the dead-letter switch
//! (`sql/functions/control.sql`).

use chrono::Utc;

use super::Storage;
use crate::error::Result;
use crate::job::NewJob;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    cancel_job: String,
    unique_job: String,
    set_queue_paused: String,
    set_queue_dead_letter: String,
    set_queue_limits: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            cancel_job: format!("SELECT {s}.cancel_job($1, $2)"),
            unique_job: format!("SELECT {s}.unique_job($1)"),
            set_queue_paused: format!("SELECT {s}.set_queue_paused($1, $2)"),
            set_queue_dead_letter: format!("SELECT {s}.set_queue_dead_letter($1, $2)"),
            set_queue_limits: format!(
                "SELECT {s}.set_queue_limits($1, $2, $3, make_interval(secs => $4))"
            ),
        }
    }
}

/// Fleet-wide limits of one queue, held by every claim of every process (`Storage::set_queue_limits`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueLimits {
    /// At most this many of the queue's attempts claimed and not yet closed (running, or claimed
    /// ahead and waiting for a worker), across the fleet.
    pub max_running: Option<u32>,
    /// At most this many claims per period (a sliding window), across the fleet.
    pub rate: Option<(u32, std::time::Duration)>,
}

impl QueueLimits {
    fn validate(&self, queue: &str) -> Result<()> {
        let bad = |reason: String| {
            Err(crate::Error::Config(format!(
                "limits of queue {queue:?}: {reason}"
            )))
        };
        if let Some(n) = self.max_running {
            if !(1..=1_000_000).contains(&n) {
                return bad(format!("max_running must be 1..=1000000, got {n}"));
            }
        }
        if let Some((n, period)) = self.rate {
            if !(1..=1_000_000_000).contains(&n) {
                return bad(format!("the rate's count must be 1..=1000000000, got {n}"));
            }
            if period < std::time::Duration::from_millis(1)
                || period > std::time::Duration::from_secs(86_400)
            {
                return bad(format!(
                    "the rate's period must be 1 ms to 1 day, got {period:?}"
                ));
            }
        }
        Ok(())
    }
}

/// What `cancel_job` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was available or scheduled and will never run.
    Cancelled,
    /// It was running: its claim is closed as cancelled, the handler is signalled, and its
    /// completion will be reported stale.
    CancelledRunning,
    AlreadyFinished,
    NotFound,
}

impl Storage {
    /// Cancel a job by id, wherever it is (see `CancelOutcome`).
    pub async fn cancel_job(&self, job_id: i64, reason: &str) -> Result<CancelOutcome> {
        crate::job::validate_name("cancel reason", reason)?;
        let text: String = sqlx::query_scalar(&self.sql.control.cancel_job)
            .bind(job_id)
            .bind(reason)
            .fetch_one(&self.pool)
            .await?;
        Ok(match text.as_str() {
            "cancelled" => CancelOutcome::Cancelled,
            "cancelled_running" => CancelOutcome::CancelledRunning,
            "already_finished" => CancelOutcome::AlreadyFinished,
            _ => CancelOutcome::NotFound,
        })
    }

    /// Cancel the job holding `job`'s unique key (built exactly as a unique insert of `job` now
    /// would build it). `NotFound` when no job holds the key.
    pub async fn cancel_unique(&self, job: &NewJob, reason: &str) -> Result<CancelOutcome> {
        let Some(options) = &job.unique else {
            return Err(crate::Error::Config(
                "cancel by unique key needs a job with unique options".into(),
            ));
        };
        job.validate()?;
        let key = job.unique_key(options, Utc::now())?;
        let holder: Option<i64> = sqlx::query_scalar(&self.sql.control.unique_job)
            .bind(&key)
            .fetch_one(&self.pool)
            .await?;
        match holder {
            Some(job_id) => self.cancel_job(job_id, reason).await,
            None => Ok(CancelOutcome::NotFound),
        }
    }

    /// Pause (no claims; enqueue still works) or resume a queue. Returns whether anything changed.
    pub async fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.control.set_queue_paused)
            .bind(queue)
            .bind(paused)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Set (or, with `QueueLimits::default()`, remove) the queue's fleet-wide limits. Every claim of
    /// a limited queue counts its open claims and its recent claims from the claim ring (what
    /// claims write anyway; no per-job counter row) under a per-queue lock, so the limits hold
    /// across processes. Returns whether anything changed.
    pub async fn set_queue_limits(&self, queue: &str, limits: QueueLimits) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        limits.validate(queue)?;
        Ok(sqlx::query_scalar(&self.sql.control.set_queue_limits)
            .bind(queue)
            .bind(limits.max_running.map(|n| n as i32))
            .bind(limits.rate.map(|(n, _)| n as i32))
            .bind(limits.rate.map(|(_, period)| period.as_secs_f64()))
            .fetch_one(&self.pool)
            .await?)
    }

    /// Send this queue's terminal failures to the dead-letter queue (or stop doing so).
    pub async fn set_queue_dead_letter(&self, queue: &str, enabled: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.control.set_queue_dead_letter)
            .bind(queue)
            .bind(enabled)
            .fetch_one(&self.pool)
            .await?)
    }
}
