//! Claim plane (seed ADR-023): claim, backlog checks and in-flight counts
//! (`sql/functions/claim.sql`). A claimed job carries its attempt's identity, `(job_id, run_lease)`
//! with its claim slot and receipt, which every later write on its behalf names (`complete.rs`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::complete::{AttemptRef, CloseOutcome};
use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    claim: String,
    queue_has_backlog: String,
    count_in_flight: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            claim: format!(
                "SELECT job_id, run_lease, claim_slot, receipt_id, kind, args::text AS args, attempt, max_attempts, \
                 priority, created_at, deadline_at, traceparent, more FROM {s}.claim($1, $2, make_interval(secs => $3), \
                 make_interval(secs => $4), make_interval(secs => $5), true)"
            ),
            queue_has_backlog: format!("SELECT {s}.queue_has_backlog($1)"),
            count_in_flight: format!("SELECT {s}.count_in_flight($1)::int8"),
        }
    }
}

/// A job handed to a worker by `claim`. `(job_id, run_lease)` names the attempt; `claim_slot` and
/// `receipt_id` tie closure evidence back to the exact claim partition and batch item.
#[derive(Clone, Debug)]
pub struct ClaimedJob {
    /// The job's id.
    pub job_id: i64,
    /// This attempt's run lease (the job's previous one plus one).
    pub run_lease: i64,
    /// The claim-ring slot that holds this claim's evidence.
    pub claim_slot: i32,
    /// The claim's receipt in that slot (`batch_id * 4096 + ordinal`).
    pub receipt_id: i64,
    /// The job's kind, which picks its handler.
    pub kind: String,
    /// The job's arguments (`Null` when they could not be decoded).
    pub args: serde_json::Value,
    /// This attempt's number, from 1.
    pub attempt: i32,
    /// Attempts the job may use before it fails for good.
    pub max_attempts: i32,
    /// The job's priority, 1 (first) ..= 4 (last).
    pub priority: i16,
    /// When the job was inserted.
    pub created_at: DateTime<Utc>,
    /// When deadline rescue may close this attempt (queue deadline or the job's own timeout).
    pub deadline_at: Option<DateTime<Utc>>,
    /// The W3C traceparent of the span that enqueued the job, if it was enqueued inside a trace.
    pub traceparent: Option<String>,
}

/// What one claim took: the jobs to run, and the jobs it failed at once (with why) because their
/// arguments cannot be decoded. A failed job's `args` is `Null`.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub(crate) jobs: Vec<ClaimedJob>,
    pub(crate) failed: Vec<(ClaimedJob, String)>,
    /// Whether the claim may have left claimable jobs behind (a shard another claimer held, a walk
    /// cut short, a limit). A claim that took fewer jobs than asked without it saw every job that
    /// was visible: what comes next arrives with a NOTIFY.
    pub(crate) more: bool,
}
impl ClaimedJob {
    /// The identity every write on behalf of this attempt names.
    pub fn attempt_ref(&self) -> AttemptRef {
        AttemptRef {
            job_id: self.job_id,
            run_lease: self.run_lease,
            claim_slot: self.claim_slot,
            receipt_id: self.receipt_id,
        }
    }
}
impl Storage {
    /// Claim up to `max` jobs from `queue` in one round trip.
    pub async fn claim(
        &self,
        queue: &str,
        max: usize,
        deadline: Option<Duration>,
    ) -> Result<Vec<ClaimedJob>> {
        self.claim_aged(queue, max, deadline, None).await
    }

    /// Claim with priority aging: a lane's effective priority improves one level per `aging` its
    /// oldest waiting job has waited.
    pub async fn claim_aged(
        &self,
        queue: &str,
        max: usize,
        deadline: Option<Duration>,
        aging: Option<Duration>,
    ) -> Result<Vec<ClaimedJob>> {
        Ok(self
            .claim_rows(queue, max, deadline, aging, None)
            .await?
            .jobs)
    }

    /// Claim, and say which claimed jobs failed at once because their arguments cannot be decoded.
    /// With `shard_wait`, a claim whose only shard with work another claimer holds waits for it
    /// that long (claim.sql), rather than coming back empty with `more`.
    pub(crate) async fn claim_rows(
        &self,
        queue: &str,
        max: usize,
        deadline: Option<Duration>,
        aging: Option<Duration>,
        shard_wait: Option<Duration>,
    ) -> Result<Claimed> {
        let mut rows = sqlx::query(&self.sql.claim.claim)
            .bind(queue)
            .bind(max.clamp(1, 4096) as i32)
            .bind(deadline.map(|d| d.as_secs_f64()))
            .bind(aging.filter(|a| !a.is_zero()).map(|a| a.as_secs_f64()))
            .bind(shard_wait.map(|d| d.as_secs_f64()))
            .fetch_all(self.db())
            .await?;
        // a claim that took nothing returns one row of NULLs but `more`
        let empty_more = match rows.first() {
            Some(row) if row.try_get::<Option<i64>, _>("job_id")?.is_none() => {
                Some(row.try_get::<Option<bool>, _>("more")?.unwrap_or(true))
            }
            _ => None,
        };
        if empty_more.is_some() {
            rows.clear();
        }
        // Each row is decoded on its own: the claim has committed, so a row this binary cannot
        // decode (a number beyond f64, nesting deeper than serde_json accepts, stored before the
        // enqueue checks or by another writer) must fail alone instead of failing the batch and
        // leaving every job in it to rescue.
        let mut jobs = Vec::with_capacity(rows.len());
        let mut undecodable = Vec::new();
        for r in &rows {
            let args: String = r.try_get("args")?;
            let job = ClaimedJob {
                job_id: r.try_get("job_id")?,
                run_lease: r.try_get("run_lease")?,
                claim_slot: r.try_get("claim_slot")?,
                receipt_id: r.try_get("receipt_id")?,
                kind: r.try_get("kind")?,
                args: serde_json::Value::Null,
                attempt: r.try_get("attempt")?,
                max_attempts: r.try_get("max_attempts")?,
                priority: r.try_get("priority")?,
                created_at: r.try_get("created_at")?,
                deadline_at: r.try_get("deadline_at")?,
                traceparent: r.try_get("traceparent")?,
            };
            match serde_json::from_str(&args) {
                Ok(value) => jobs.push(ClaimedJob { args: value, ..job }),
                Err(e) => undecodable.push((
                    job,
                    format!("ringwork: job arguments cannot be decoded: {e}"),
                )),
            }
        }
        if !undecodable.is_empty() {
            self.fail_undecodable(queue, &undecodable).await;
        }
        // every row carries the same value; no row at all (a paused queue, a limit that left no
        // room): nothing was taken, and the caller asks
        let more = match (rows.first(), empty_more) {
            (Some(row), _) => row.try_get::<Option<bool>, _>("more")?.unwrap_or(true),
            (None, Some(more)) => more,
            (None, None) => true,
        };
        Ok(Claimed {
            jobs,
            failed: undecodable,
            more,
        })
    }

    /// Fail claimed jobs whose arguments cannot be decoded, for good: decoding would fail on every
    /// attempt. If this close fails, the attempts stay open until rescue closes them and the next
    /// claim tries again; the jobs decoded beside them run either way.
    async fn fail_undecodable(&self, queue: &str, failed: &[(ClaimedJob, String)]) {
        let closes: Vec<_> = failed
            .iter()
            .map(|(job, error)| {
                tracing::warn!(queue, job_id = job.job_id, %error, "failing a job whose arguments cannot be decoded");
                (
                    job.attempt_ref(),
                    CloseOutcome::Failed {
                        error: error.clone(),
                    },
                )
            })
            .collect();
        if let Err(e) = self.close_batch(&closes).await {
            tracing::warn!(queue, error = %e, "could not fail jobs with undecodable arguments; rescue will retry");
        }
    }

    /// Does the queue hold ready rows ahead of a lane cursor? (Tells "lane busy" from "empty" after
    /// a claim returned nothing.)
    pub async fn queue_has_backlog(&self, queue: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.claim.queue_has_backlog)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }
    /// Attempts currently claimed and not closed (in one queue, or all).
    pub async fn count_in_flight(&self, queue: Option<&str>) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.claim.count_in_flight)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }
}
