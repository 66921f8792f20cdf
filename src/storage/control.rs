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
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            cancel_job: format!("SELECT {s}.cancel_job($1, $2)"),
            unique_job: format!("SELECT {s}.unique_job($1)"),
            set_queue_paused: format!("SELECT {s}.set_queue_paused($1, $2)"),
            set_queue_dead_letter: format!("SELECT {s}.set_queue_dead_letter($1, $2)"),
        }
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
