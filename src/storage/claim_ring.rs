//! Claim plane (seed ADR-023): claim, batched completion and close by claim shape, heartbeats,
//! in-flight counts (`sql/functions/claim_ring.sql`). Every write on behalf of an attempt names
//! `(job_id, run_lease)` and its claim slot and receipt; a write that loses to another is `Stale`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{outcome, Storage};
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    claim: String,
    queue_has_backlog: String,
    complete_batch: String,
    complete_one: String,
    close_batch: String,
    heartbeat_batch: String,
    count_in_flight: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            claim: format!(
                "SELECT job_id, run_lease, claim_slot, receipt_id, kind, args::text AS args, attempt, max_attempts, \
                 priority, created_at, deadline_at, traceparent FROM {s}.claim($1, $2, make_interval(secs => $3), \
                 make_interval(secs => $4))"
            ),
            queue_has_backlog: format!("SELECT {s}.queue_has_backlog($1)"),
            complete_batch: format!("SELECT job_id, accepted FROM {s}.complete_batch($1, $2, $3, $4)"),
            complete_one: format!(
                "SELECT accepted FROM {s}.complete_batch(ARRAY[$1::int], ARRAY[$2::int8], ARRAY[$3::int8], \
                 ARRAY[$4::int8])"
            ),
            close_batch: format!("SELECT job_id, accepted FROM {s}.close_batch($1, $2, $3, $4, $5, $6, $7)"),
            heartbeat_batch: format!("SELECT job_id, accepted FROM {s}.heartbeat_batch($1, $2, $3, $4, $5)"),
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
}

/// The identity of one attempt, as every write on its behalf must name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptRef {
    /// The job's id.
    pub job_id: i64,
    /// The attempt's run lease.
    pub run_lease: i64,
    /// The claim-ring slot of the attempt's claim.
    pub claim_slot: i32,
    /// The attempt's receipt in that slot.
    pub receipt_id: i64,
}

/// How an attempt ended, other than success.
#[derive(Clone, Debug)]
pub enum CloseOutcome {
    /// Back to `deferred_jobs`, runnable again at `at`.
    Retry {
        /// When the job may run again.
        at: DateTime<Utc>,
        /// The error recorded for the attempt.
        error: String,
    },
    /// Terminal failure: a failed `done_entries` row, or a `dlq_entries` row when the queue has a
    /// dead-letter queue.
    Failed {
        /// The error recorded for the failure.
        error: String,
    },
    /// Back to `deferred_jobs` at `at` without using an attempt.
    Snooze {
        /// When the job may run again.
        at: DateTime<Utc>,
    },
}

/// Whether a write on behalf of an attempt took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The write took effect.
    Applied,
    /// The attempt was already closed (completed, rescued, cancelled) or never existed: nothing changed.
    Stale,
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
        Ok(self.claim_rows(queue, max, deadline, aging).await?.jobs)
    }

    /// Claim, and say which claimed jobs failed at once because their arguments cannot be decoded.
    pub(crate) async fn claim_rows(
        &self,
        queue: &str,
        max: usize,
        deadline: Option<Duration>,
        aging: Option<Duration>,
    ) -> Result<Claimed> {
        let rows = sqlx::query(&self.sql.claim_ring.claim)
            .bind(queue)
            .bind(max.clamp(1, 4096) as i32)
            .bind(deadline.map(|d| d.as_secs_f64()))
            .bind(aging.filter(|a| !a.is_zero()).map(|a| a.as_secs_f64()))
            .fetch_all(self.db())
            .await?;
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
        Ok(Claimed {
            jobs,
            failed: undecodable,
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
        Ok(sqlx::query_scalar(&self.sql.claim_ring.queue_has_backlog)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }

    /// Complete a batch of attempts successfully. Returns one outcome per input, in input order.
    pub async fn complete_batch(&self, attempts: &[AttemptRef]) -> Result<Vec<Outcome>> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.claim_ring.complete_batch)
            .bind(attempts.iter().map(|a| a.claim_slot).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.receipt_id).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.job_id).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.run_lease).collect::<Vec<_>>())
            .fetch_all(self.db())
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
    }

    /// Complete one attempt on the caller's connection, inside the caller's transaction: the
    /// completion commits or rolls back with the caller's own writes. The attempt's lock is held
    /// until that transaction ends, so a racing rescue or cancel waits for it and then finds the
    /// attempt closed (or open again, after a rollback). `Stale`: the attempt was already closed
    /// (rescued, cancelled, completed), and nothing was written.
    pub async fn complete_on(
        &self,
        conn: &mut sqlx::PgConnection,
        attempt: &AttemptRef,
    ) -> Result<Outcome> {
        let accepted: Option<bool> = sqlx::query_scalar(&self.sql.claim_ring.complete_one)
            .bind(attempt.claim_slot)
            .bind(attempt.receipt_id)
            .bind(attempt.job_id)
            .bind(attempt.run_lease)
            .fetch_optional(self.on(conn))
            .await?;
        Ok(outcome(accepted.unwrap_or(false)))
    }

    /// Close a batch of attempts without success (retry or terminal failure).
    pub async fn close_batch(&self, closes: &[(AttemptRef, CloseOutcome)]) -> Result<Vec<Outcome>> {
        if closes.is_empty() {
            return Ok(Vec::new());
        }
        let mut outcomes = Vec::with_capacity(closes.len());
        let mut retry_at = Vec::with_capacity(closes.len());
        let mut errors = Vec::with_capacity(closes.len());
        for (_, close) in closes {
            match close {
                CloseOutcome::Retry { at, error } => {
                    outcomes.push("retry");
                    retry_at.push(Some(*at));
                    errors.push(error.as_str());
                }
                CloseOutcome::Failed { error } => {
                    outcomes.push("failed");
                    retry_at.push(None);
                    errors.push(error.as_str());
                }
                CloseOutcome::Snooze { at } => {
                    outcomes.push("snoozed");
                    retry_at.push(Some(*at));
                    errors.push("snoozed");
                }
            }
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.claim_ring.close_batch)
            .bind(closes.iter().map(|(a, _)| a.claim_slot).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.receipt_id).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.job_id).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.run_lease).collect::<Vec<_>>())
            .bind(&outcomes)
            .bind(&retry_at)
            .bind(&errors)
            .fetch_all(self.db())
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
    }

    /// Record a heartbeat (and optional progress) for running attempts. `Stale` means the attempt
    /// is no longer open: it was rescued or cancelled and its handler should stop.
    pub async fn heartbeat_batch(
        &self,
        attempts: &[(AttemptRef, Option<serde_json::Value>)],
    ) -> Result<Vec<Outcome>> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.claim_ring.heartbeat_batch)
            .bind(
                attempts
                    .iter()
                    .map(|(a, _)| a.claim_slot)
                    .collect::<Vec<_>>(),
            )
            .bind(
                attempts
                    .iter()
                    .map(|(a, _)| a.receipt_id)
                    .collect::<Vec<_>>(),
            )
            .bind(attempts.iter().map(|(a, _)| a.job_id).collect::<Vec<_>>())
            .bind(
                attempts
                    .iter()
                    .map(|(a, _)| a.run_lease)
                    .collect::<Vec<_>>(),
            )
            .bind(attempts.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>())
            .fetch_all(self.db())
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
    }

    /// Attempts currently claimed and not closed (in one queue, or all).
    pub async fn count_in_flight(&self, queue: Option<&str>) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.claim_ring.count_in_flight)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }
}
