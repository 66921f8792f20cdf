//! Operator controls: cancel (by id or unique key), pause/resume, the dead-letter switch
//! (`sql/functions/control.sql`).

use chrono::Utc;

use super::Storage;
use crate::error::Result;
use crate::job::{JobStatus, NewJob};
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    cancel_job: String,
    retry_job: String,
    unique_job: String,
    set_queue_paused: String,
    set_queue_dead_letter: String,
    set_queue_limits: String,
    bulk_cancel: String,
    bulk_retry: String,
    bulk_delete: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            cancel_job: format!("SELECT {s}.cancel_job($1, $2)"),
            retry_job: format!("SELECT {s}.retry_job($1)"),
            unique_job: format!("SELECT {s}.unique_job($1)"),
            set_queue_paused: format!("SELECT {s}.set_queue_paused($1, $2)"),
            set_queue_dead_letter: format!("SELECT {s}.set_queue_dead_letter($1, $2)"),
            set_queue_limits: format!(
                "SELECT {s}.set_queue_limits($1, $2, $3, make_interval(secs => $4), $5, $6, $7, \
                 make_interval(secs => $8))"
            ),
            bulk_cancel: format!("SELECT * FROM {s}.bulk_cancel($1, $2, $3, $4, $5, $6, $7)"),
            bulk_retry: format!("SELECT * FROM {s}.bulk_retry($1, $2, $3, $4, $5, $6)"),
            bulk_delete: format!("SELECT * FROM {s}.bulk_delete($1, $2, $3, $4, $5, $6)"),
        }
    }
}

/// Which jobs a bulk operation touches (`Storage::bulk_cancel`, `bulk_retry`, `bulk_delete`). Every
/// field narrows the set; `states` must name at least one state the operation applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only jobs of this queue; `None`: every queue.
    pub queue: Option<String>,
    /// Only jobs of this kind; `None`: every kind.
    pub kind: Option<String>,
    /// The states to touch; at least one must be a state the operation applies to.
    pub states: Vec<JobStatus>,
    /// Only jobs at least this old: waiting and running jobs by when they were created,
    /// dead-lettered and history rows by when they failed or finished.
    pub older_than: Option<std::time::Duration>,
}

/// What a bulk operation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkOutcome {
    /// Jobs that matched the filter when their step looked at them.
    pub matched: u64,
    /// Of those, the ones the operation changed (a job that finished meanwhile is matched, not
    /// changed).
    pub changed: u64,
    /// Bounded steps (transactions) it took.
    pub steps: u64,
}

/// The states `Storage::bulk_cancel` acts on.
pub const BULK_CANCEL_STATES: &[JobStatus] = &[
    JobStatus::Pending,
    JobStatus::Available,
    JobStatus::Scheduled,
    JobStatus::Retryable,
    JobStatus::Running,
];
/// The states `Storage::bulk_retry` acts on.
pub const BULK_RETRY_STATES: &[JobStatus] = &[
    JobStatus::Scheduled,
    JobStatus::Retryable,
    JobStatus::DeadLettered,
];

/// Jobs per step of a bulk operation: one short transaction each.
const BULK_STEP: i32 = 500;

#[derive(Clone, Copy)]
enum Bulk {
    Cancel,
    Retry,
    Delete,
}

impl Bulk {
    fn name(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Retry => "retry",
            Self::Delete => "delete",
        }
    }

    fn applies_to(self) -> &'static [JobStatus] {
        match self {
            Self::Cancel => BULK_CANCEL_STATES,
            Self::Retry => BULK_RETRY_STATES,
            Self::Delete => &[JobStatus::DeadLettered],
        }
    }
}

impl JobFilter {
    fn validate(&self, op: Bulk) -> Result<()> {
        if let Some(queue) = &self.queue {
            crate::job::validate_name("queue name", queue)?;
        }
        if let Some(kind) = &self.kind {
            crate::job::validate_name("job kind", kind)?;
        }
        if self.states.is_empty() {
            return Err(crate::Error::Config(format!(
                "bulk {}: name the states to {} (any of {})",
                op.name(),
                op.name(),
                list(op.applies_to())
            )));
        }
        let terminal = [
            JobStatus::Completed,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ];
        if let (Bulk::Delete, Some(state)) = (op, self.states.iter().find(|s| terminal.contains(s)))
        {
            return Err(crate::Error::Config(format!(
                "bulk delete does not apply to {state} jobs: terminal history lives in ring storage and is \
                 reclaimed a whole slot or archive bucket at a time (set MaintenanceConfig::keep_completed / \
                 keep_failed to keep less)"
            )));
        }
        if let Some(state) = self.states.iter().find(|s| !op.applies_to().contains(s)) {
            return Err(crate::Error::Config(format!(
                "bulk {} does not apply to {state} jobs (it applies to {})",
                op.name(),
                list(op.applies_to())
            )));
        }
        if let Some(age) = self.older_than {
            if chrono::Duration::from_std(age).is_err()
                || age > std::time::Duration::from_secs(100 * 365 * 86_400)
            {
                return Err(crate::Error::Config(format!(
                    "older_than out of range: {age:?}"
                )));
            }
        }
        Ok(())
    }
}

fn list(states: &[JobStatus]) -> String {
    states
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fleet-wide limits of one queue, held by every claim of every process (`Storage::set_queue_limits`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueLimits {
    /// At most this many of the queue's attempts claimed and not yet closed (running, or claimed
    /// ahead and waiting for a worker), across the fleet.
    pub max_running: Option<u32>,
    /// At most this many claims per period (a sliding window), across the fleet.
    pub rate: Option<(u32, std::time::Duration)>,
    /// At most this many running per value of a key in the job's args (a tenant), across the
    /// fleet: a hot key cannot take every worker from the others.
    pub per_key: Option<KeyLimit>,
}

/// Limits per key: the key is the text at `path` in a job's args (`["tenant_id"]`, or
/// `["customer", "id"]` for a nested field; numbers and strings alike, compared as text). Jobs
/// whose args lack the key are limited by the queue's own limits only. At least one of
/// `max_running` and `rate`:
///
/// ```
/// # use std::time::Duration;
/// use ringwork::KeyLimit;
/// let per_tenant = KeyLimit::arg("tenant_id").max_running(2).rate(10, Duration::from_secs(1));
/// let nested = KeyLimit::path(&["customer", "id"]).max_running(1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLimit {
    /// The field path in the job's args whose value is the key (`["customer", "id"]`).
    pub path: Vec<String>,
    /// At most this many running per key value, across the fleet.
    pub max_running: Option<u32>,
    /// At most this many claims per period (a sliding window) per key value, across the fleet.
    pub rate: Option<(u32, std::time::Duration)>,
}

impl KeyLimit {
    /// Limits on a top-level field of the args (set them with `max_running` and `rate`).
    pub fn arg(field: &str) -> Self {
        Self::path(&[field])
    }

    /// Limits on a nested field: `KeyLimit::path(&["customer", "id"])`.
    pub fn path(path: &[&str]) -> Self {
        Self {
            path: path.iter().map(|p| p.to_string()).collect(),
            max_running: None,
            rate: None,
        }
    }

    /// At most `max` running per key value, across the fleet.
    pub fn max_running(mut self, max: u32) -> Self {
        self.max_running = Some(max);
        self
    }

    /// At most `count` claims per `period` (a sliding window) per key value, across the fleet.
    pub fn rate(mut self, count: u32, period: std::time::Duration) -> Self {
        self.rate = Some((count, period));
        self
    }
}

fn validate_rate(
    what: &str,
    (n, period): (u32, std::time::Duration),
) -> std::result::Result<(), String> {
    if !(1..=1_000_000_000).contains(&n) {
        return Err(format!("{what}'s count must be 1..=1000000000, got {n}"));
    }
    if period < std::time::Duration::from_millis(1)
        || period > std::time::Duration::from_secs(86_400)
    {
        return Err(format!(
            "{what}'s period must be 1 ms to 1 day, got {period:?}"
        ));
    }
    Ok(())
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
        if let Some(rate) = self.rate {
            validate_rate("the rate", rate).or_else(bad)?;
        }
        if let Some(key) = &self.per_key {
            if key.max_running.is_none() && key.rate.is_none() {
                return bad("a key limit needs max_running, a rate, or both".into());
            }
            if let Some(n) = key.max_running {
                if !(1..=1_000_000).contains(&n) {
                    return bad(format!(
                        "the per-key max_running must be 1..=1000000, got {n}"
                    ));
                }
            }
            if let Some(rate) = key.rate {
                validate_rate("the per-key rate", rate).or_else(bad)?;
            }
            if key.path.is_empty() || key.path.len() > 8 {
                return bad(format!(
                    "the key path must have 1 to 8 fields, got {:?}",
                    key.path
                ));
            }
            if let Some(field) = key
                .path
                .iter()
                .find(|f| f.is_empty() || f.len() > 128 || f.contains('\0'))
            {
                return bad(format!(
                    "key path field {field:?}: must be 1..=128 bytes, without NUL"
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
    /// It had already ended: nothing changed.
    AlreadyFinished,
    /// No such job: it never existed, or its records are gone.
    NotFound,
}

impl Storage {
    /// Cancel a job by id, wherever it is (see `CancelOutcome`).
    pub async fn cancel_job(&self, job_id: i64, reason: &str) -> Result<CancelOutcome> {
        crate::job::validate_name("cancel reason", reason)?;
        let text: String = sqlx::query_scalar(&self.sql.control.cancel_job)
            .bind(job_id)
            .bind(reason)
            .fetch_one(self.db())
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
            .fetch_one(self.db())
            .await?;
        match holder {
            Some(job_id) => self.cancel_job(job_id, reason).await,
            None => Ok(CancelOutcome::NotFound),
        }
    }

    /// Retry one job now: a dead-lettered job runs again with fresh attempts, a scheduled or
    /// retryable job becomes due at once. Returns false when the job is in neither state (waiting,
    /// running, finished, or unknown): history is not rewritten.
    pub async fn retry_job(&self, job_id: i64) -> Result<bool> {
        let text: String = sqlx::query_scalar(&self.sql.control.retry_job)
            .bind(job_id)
            .fetch_one(self.db())
            .await?;
        Ok(text == "retried")
    }

    /// Pause (no claims; enqueue still works) or resume a queue. Returns whether anything changed.
    pub async fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.control.set_queue_paused)
            .bind(queue)
            .bind(paused)
            .fetch_one(self.db())
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
            .bind(limits.per_key.as_ref().map(|k| k.path.clone()))
            .bind(
                limits
                    .per_key
                    .as_ref()
                    .and_then(|k| k.max_running)
                    .map(|n| n as i32),
            )
            .bind(
                limits
                    .per_key
                    .as_ref()
                    .and_then(|k| k.rate)
                    .map(|(n, _)| n as i32),
            )
            .bind(
                limits
                    .per_key
                    .as_ref()
                    .and_then(|k| k.rate)
                    .map(|(_, period)| period.as_secs_f64()),
            )
            .fetch_one(self.db())
            .await?)
    }

    /// Send this queue's terminal failures to the dead-letter queue (or stop doing so).
    pub async fn set_queue_dead_letter(&self, queue: &str, enabled: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.control.set_queue_dead_letter)
            .bind(queue)
            .bind(enabled)
            .fetch_one(self.db())
            .await?)
    }

    /// Cancel the jobs the filter matches (available, scheduled, retryable, running), in bounded
    /// steps (one short transaction of at most 500 jobs each), each through the same path as a
    /// cancel by id. Jobs created after the call began are not touched.
    pub async fn bulk_cancel(&self, filter: &JobFilter, reason: &str) -> Result<BulkOutcome> {
        if reason.contains('\0') {
            return Err(crate::Error::Config(
                "cancel reason contains a NUL byte".into(),
            ));
        }
        self.bulk(Bulk::Cancel, filter, Some(reason)).await
    }

    /// Retry the jobs the filter matches: scheduled and retryable jobs become due now;
    /// dead-lettered jobs run again with fresh attempts. Bounded steps, as `bulk_cancel`.
    pub async fn bulk_retry(&self, filter: &JobFilter) -> Result<BulkOutcome> {
        self.bulk(Bulk::Retry, filter, None).await
    }

    /// Delete the dead-lettered jobs the filter matches, in bounded steps as `bulk_cancel`.
    /// Terminal history (completed, failed, cancelled) is not deleted row by row: it lives in ring
    /// storage (the queue ring, then the archive's time buckets), reclaimed a whole slot or bucket
    /// at a time by prune and retention (`MaintenanceConfig::keep_completed`, `keep_failed`).
    pub async fn bulk_delete(&self, filter: &JobFilter) -> Result<BulkOutcome> {
        self.bulk(Bulk::Delete, filter, None).await
    }

    async fn bulk(
        &self,
        op: Bulk,
        filter: &JobFilter,
        reason: Option<&str>,
    ) -> Result<BulkOutcome> {
        filter.validate(op)?;
        // one cutoff for the whole operation: jobs that arrive while it runs are not swept
        let age = filter
            .older_than
            .and_then(|a| chrono::Duration::from_std(a).ok())
            .unwrap_or_else(chrono::Duration::zero);
        let before = Utc::now() - age;
        let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
        let mut after = 0_i64;
        let mut outcome = BulkOutcome::default();
        loop {
            let query = match op {
                Bulk::Cancel => {
                    sqlx::query_as::<_, (Option<i64>, i32, i32)>(&self.sql.control.bulk_cancel)
                }
                Bulk::Retry => sqlx::query_as(&self.sql.control.bulk_retry),
                Bulk::Delete => sqlx::query_as(&self.sql.control.bulk_delete),
            };
            let query = query
                .bind(filter.queue.as_deref())
                .bind(filter.kind.as_deref())
                .bind(&states)
                .bind(before)
                .bind(after)
                .bind(BULK_STEP);
            let query = match op {
                Bulk::Cancel => query.bind(reason.unwrap_or("cancelled")),
                _ => query,
            };
            let (last, looked_at, changed) = query.fetch_one(self.db()).await?;
            outcome.steps += 1;
            outcome.matched += looked_at as u64;
            outcome.changed += changed as u64;
            match last {
                Some(last) if looked_at >= BULK_STEP => after = last,
                _ => return Ok(outcome),
            }
        }
    }
}
