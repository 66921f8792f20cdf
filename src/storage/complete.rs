//! Completion plane (seed ADR-023): batched completion and close by claim shape, and heartbeats
//! (`sql/functions/complete.sql`). Every write on behalf of an attempt names `(job_id, run_lease)`
//! and its claim slot and receipt; a write that loses to another is `Stale`.

use chrono::{DateTime, Utc};

use super::{outcome, Storage};
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    complete_batch: String,
    complete_one: String,
    close_batch: String,
    heartbeat_batch: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            complete_batch: format!("SELECT job_id, accepted FROM {s}.complete_batch($1, $2, $3, $4)"),
            complete_one: format!(
                "SELECT accepted FROM {s}.complete_batch(ARRAY[$1::int], ARRAY[$2::int8], ARRAY[$3::int8], \
                 ARRAY[$4::int8])"
            ),
            close_batch: format!("SELECT job_id, accepted FROM {s}.close_batch($1, $2, $3, $4, $5, $6, $7)"),
            heartbeat_batch: format!("SELECT job_id, accepted FROM {s}.heartbeat_batch($1, $2, $3, $4, $5)"),
        }
    }
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

impl Storage {
    /// Complete a batch of attempts successfully. Returns one outcome per input, in input order.
    pub async fn complete_batch(&self, attempts: &[AttemptRef]) -> Result<Vec<Outcome>> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.complete.complete_batch)
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
        let accepted: Option<bool> = sqlx::query_scalar(&self.sql.complete.complete_one)
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
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.complete.close_batch)
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
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.complete.heartbeat_batch)
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
}
