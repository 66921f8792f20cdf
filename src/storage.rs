//! The storage layer: every statement ringwork runs, by name, against one schema.
//!
//! The runtime asks this layer for "insert these jobs", "claim up to N from queue Q", "complete this
//! batch"; it never builds SQL itself. The heavy lifting is done by server-side functions created by
//! the migrations (`migrations/0002_engine.sql`), so claim and completion are one round trip each.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};

use crate::error::Result;
use crate::job::NewJob;
use crate::schema::SchemaName;

/// Groups at or below this size go through one `enqueue_jobs` call; larger ones through COPY.
const COPY_THRESHOLD: usize = 64;

/// Named statements, rendered once per schema.
#[derive(Debug)]
struct Statements {
    enqueue_jobs: String,
    schedule_jobs: String,
    reserve_segment: String,
    copy_ready: String,
    claim: String,
    ensure_lanes: String,
    queue_has_backlog: String,
    complete_batch: String,
    close_batch: String,
    promote_due: String,
    heartbeat_batch: String,
    set_queue_dead_letter: String,
    dlq_list: String,
    dlq_retry: String,
    dlq_purge: String,
    dlq_expire: String,
    cancel_job: String,
    set_queue_paused: String,
    job_state: String,
    rescue: String,
    count_in_flight: String,
    rotate_queue_ring: String,
    rotate_claim_ring: String,
    sealed_queue_slots: String,
    sealed_claim_slots: String,
    prune_queue_slot: String,
    prune_claim_slot: String,
    insert_unique: String,
    unique_job: String,
    unique_keys_expire: String,
    queue_counts: String,
    queue_lanes_exist: String,
    job_history: String,
    available_count: String,
}

impl Statements {
    fn new(s: &SchemaName) -> Self {
        Self {
            enqueue_jobs: format!("SELECT * FROM {s}.enqueue_jobs($1, $2, $3, $4, $5, $6)"),
            schedule_jobs: format!("SELECT * FROM {s}.schedule_jobs($1, $2, $3, $4, $5, $6, $7)"),
            reserve_segment: format!(
                "SELECT g.ready_slot, g.lane_id, g.base_pos,
                        ARRAY(SELECT nextval('{s}.job_ids') FROM generate_series(1, $3)) AS job_ids
                 FROM {s}.enqueue_segment($1, $2, $3) g"
            ),
            copy_ready: format!(
                "COPY {s}.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority, \
                 attempt, run_lease, max_attempts, timeout_ms) FROM STDIN (FORMAT csv)"
            ),
            claim: format!(
                "SELECT job_id, run_lease, claim_slot, receipt_id, kind, args, attempt, max_attempts, priority, \
                 created_at, deadline_at FROM {s}.claim($1, $2, make_interval(secs => $3), \
                 make_interval(secs => $4))"
            ),
            ensure_lanes: format!("SELECT count({s}.ensure_lane($1, p::smallint)) FROM generate_series(1, 4) p"),
            queue_has_backlog: format!(
                "SELECT EXISTS (SELECT 1 FROM {s}.queue_lanes l WHERE l.queue = $1
                   AND (SELECT max(e.lane_pos) FROM {s}.ready_entries e WHERE e.lane_id = l.lane_id)
                       > {s}.lane_cursor(l.lane_id))"
            ),
            complete_batch: format!("SELECT job_id, accepted FROM {s}.complete_batch($1, $2, $3, $4)"),
            close_batch: format!("SELECT job_id, accepted FROM {s}.close_batch($1, $2, $3, $4, $5, $6, $7)"),
            promote_due: format!("SELECT {s}.promote_due($1)"),
            cancel_job: format!("SELECT {s}.cancel_job($1, $2)"),
            set_queue_paused: format!("SELECT {s}.set_queue_paused($1, $2)"),
            job_state: format!(
                "SELECT state, queue, kind, attempt, run_lease, detail FROM {s}.job_state($1)"
            ),
            set_queue_dead_letter: format!("SELECT {s}.set_queue_dead_letter($1, $2)"),
            dlq_list: format!(
                "SELECT job_id, queue, kind, args, attempt, run_lease, error, failed_at FROM {s}.dlq_entries
                 WHERE $1::text IS NULL OR queue = $1 ORDER BY failed_at, job_id LIMIT $2"
            ),
            dlq_retry: format!("SELECT {s}.dlq_retry($1)"),
            dlq_purge: format!(
                "WITH gone AS (DELETE FROM {s}.dlq_entries WHERE ($1::text IS NULL OR queue = $1)
                   AND ($2::int8 IS NULL OR job_id = $2) RETURNING 1) SELECT count(*)::int8 FROM gone"
            ),
            dlq_expire: format!("SELECT {s}.dlq_expire(make_interval(secs => $1), $2)"),
            heartbeat_batch: format!("SELECT job_id, accepted FROM {s}.heartbeat_batch($1, $2, $3, $4, $5)"),
            rescue: format!("SELECT {s}.rescue(make_interval(secs => $1), $2)"),
            count_in_flight: format!("SELECT {s}.count_in_flight($1)::int8"),
            rotate_queue_ring: format!("SELECT {s}.rotate_queue_ring(make_interval(secs => $1))"),
            rotate_claim_ring: format!("SELECT {s}.rotate_claim_ring(make_interval(secs => $1))"),
            sealed_queue_slots: format!(
                "SELECT slot FROM {s}.queue_ring_slots WHERE state = 'sealed' ORDER BY generation"
            ),
            sealed_claim_slots: format!(
                "SELECT slot FROM {s}.claim_ring_slots WHERE state = 'sealed' ORDER BY generation"
            ),
            prune_queue_slot: format!("SELECT {s}.prune_queue_slot($1, $2, make_interval(secs => $3))"),
            prune_claim_slot: format!("SELECT {s}.prune_claim_slot($1, $2)"),
            available_count: format!(
                "SELECT coalesce(sum({s}.lane_available(lane_id)), 0)::int8 FROM {s}.queue_lanes WHERE queue = $1"
            ),
            job_history: format!("SELECT run_lease, state, error, at FROM {s}.job_history($1)"),
            queue_lanes_exist: format!("SELECT count(*) = 4 FROM {s}.queue_lanes WHERE queue = $1"),
            insert_unique: format!(
                "SELECT o_job_id, o_inserted FROM {s}.insert_unique($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            ),
            unique_job: format!("SELECT {s}.unique_job($1)"),
            unique_keys_expire: format!("SELECT {s}.unique_keys_expire(make_interval(secs => $1), $2)"),
            queue_counts: format!(
                "SELECT queue, paused, available, scheduled, retryable, running, completed, failed, cancelled, \
                 dead_lettered FROM {s}.queue_counts($1)"
            ),
        }
    }
}

/// A job handed to a worker by `claim`. `(job_id, run_lease)` names the attempt; `claim_slot` and
/// `receipt_id` tie closure evidence back to the exact claim partition and batch item.
#[derive(Clone, Debug)]
pub struct ClaimedJob {
    pub job_id: i64,
    pub run_lease: i64,
    pub claim_slot: i32,
    pub receipt_id: i64,
    pub kind: String,
    pub args: serde_json::Value,
    pub attempt: i32,
    pub max_attempts: i32,
    pub priority: i16,
    pub created_at: DateTime<Utc>,
    /// When deadline rescue may close this attempt (queue deadline or the job's own timeout).
    pub deadline_at: Option<DateTime<Utc>>,
}

impl ClaimedJob {
    pub fn attempt_ref(&self) -> AttemptRef {
        AttemptRef {
            job_id: self.job_id,
            run_lease: self.run_lease,
            claim_slot: self.claim_slot,
            receipt_id: self.receipt_id,
        }
    }
}

/// The identity of one attempt, as every write on its behalf must name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptRef {
    pub job_id: i64,
    pub run_lease: i64,
    pub claim_slot: i32,
    pub receipt_id: i64,
}

/// How an attempt ended, other than success.
#[derive(Clone, Debug)]
pub enum CloseOutcome {
    /// Back to `deferred_jobs`, runnable again at `at`.
    Retry { at: DateTime<Utc>, error: String },
    /// Terminal failure: a failed `done_entries` row, or a `dlq_entries` row when the queue has a
    /// dead-letter queue.
    Failed { error: String },
    /// Back to `deferred_jobs` at `at` without using an attempt.
    Snooze { at: DateTime<Utc> },
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

/// A dead-lettered job.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub job_id: i64,
    pub queue: String,
    pub kind: String,
    pub args: serde_json::Value,
    pub attempt: i32,
    pub run_lease: i64,
    pub error: Option<String>,
    pub failed_at: DateTime<Utc>,
}

/// A job's current state (see `Storage::job_state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobState {
    pub job_id: i64,
    pub state: String,
    pub queue: String,
    pub kind: String,
    pub attempt: i32,
    pub run_lease: i64,
    /// The recorded error of a failed/cancelled/retryable job.
    pub detail: Option<String>,
}

/// What an insert did with one job: `duplicate` is true when a unique job's key was already held
/// and `job_id` is the holder's id (nothing was inserted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    pub job_id: i64,
    pub duplicate: bool,
}

/// Exact per-queue counts (see `Storage::queue_counts`). Terminal counts cover the history the
/// queue ring still holds (failed and cancelled jobs at least `keep_failed`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub queue: String,
    pub paused: bool,
    pub available: i64,
    pub scheduled: i64,
    pub retryable: i64,
    pub running: i64,
    pub completed: i64,
    pub failed: i64,
    pub cancelled: i64,
    pub dead_lettered: i64,
}

/// One recorded step of a job's history (see `Storage::load_job`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    pub run_lease: i64,
    /// `completed`, `failed`, `cancelled`, `scheduled`, `retryable` or `dead_lettered`.
    pub state: String,
    pub error: Option<String>,
    /// When it ended, or (scheduled/retryable) when it is due.
    pub at: DateTime<Utc>,
}

/// A job's current state with its recorded history (see `Storage::load_job`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRecord {
    pub state: JobState,
    pub history: Vec<HistoryEntry>,
}

/// Whether a write on behalf of an attempt took effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// The attempt was already closed (completed, rescued, cancelled) or never existed: nothing changed.
    Stale,
}

/// Result of one prune attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PruneResult {
    Pruned,
    /// Not pruned; the reason (`open_claims`, `pending_ready`, `busy`, `not_sealed`).
    Skipped(String),
}

/// Storage handle for one schema. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Storage {
    pool: PgPool,
    schema: SchemaName,
    sql: Arc<Statements>,
    /// Queues whose lanes are known to exist (committed).
    known_queues: Arc<Mutex<HashSet<String>>>,
}

impl Storage {
    pub fn new(pool: PgPool, schema: SchemaName) -> Self {
        let sql = Arc::new(Statements::new(&schema));
        Self {
            pool,
            schema,
            sql,
            known_queues: Arc::default(),
        }
    }

    /// Create the queue's four lanes (priorities 1..=4) in a transaction of their own, once per
    /// process. Creating a lane inside a caller's transaction would hold the lane-creation lock until
    /// that transaction ends and block every other producer of the queue.
    pub async fn ensure_queue(&self, queue: &str) -> Result<()> {
        crate::job::validate_name("queue name", queue)?;
        if self
            .known_queues
            .lock()
            .map(|q| q.contains(queue))
            .unwrap_or(false)
        {
            return Ok(());
        }
        sqlx::query(&self.sql.ensure_lanes)
            .bind(queue)
            .execute(&self.pool)
            .await?;
        if let Ok(mut known) = self.known_queues.lock() {
            known.insert(queue.to_string());
        }
        Ok(())
    }

    /// `ensure_queue` for an insert on `conn`: when the lanes already exist (the common case for a
    /// process that has not seen the queue yet) this is learnt on `conn` itself, so a producer
    /// holding a transaction never needs a second pool connection, and a pool's worth of concurrent
    /// transactional producers cannot starve one another. Only a queue's first use anywhere takes a
    /// pool connection to create its lanes.
    async fn ensure_queue_from(&self, conn: &mut PgConnection, queue: &str) -> Result<()> {
        crate::job::validate_name("queue name", queue)?;
        let known = self
            .known_queues
            .lock()
            .map(|q| q.contains(queue))
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        let exists: bool = sqlx::query_scalar(&self.sql.queue_lanes_exist)
            .bind(queue)
            .fetch_one(&mut *conn)
            .await?;
        if exists {
            if let Ok(mut known) = self.known_queues.lock() {
                known.insert(queue.to_string());
            }
            return Ok(());
        }
        self.ensure_queue(queue).await
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// Insert one job on `conn` (a pool connection or the caller's transaction).
    pub async fn insert(&self, conn: &mut PgConnection, job: &NewJob) -> Result<i64> {
        let ids = self.insert_many(conn, std::slice::from_ref(job)).await?;
        Ok(ids[0])
    }

    /// Insert many jobs on `conn`; returns their ids in input order. Every job is validated before
    /// any row is written. Within one (queue, priority) lane, input order is claim order, except that
    /// unique jobs are inserted after the others (in key order).
    pub async fn insert_many(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<Vec<i64>> {
        Ok(self
            .insert_many_reporting(conn, jobs)
            .await?
            .into_iter()
            .map(|inserted| inserted.job_id)
            .collect())
    }

    /// Like `insert_many`, and says for each job whether it was a unique duplicate.
    pub async fn insert_many_reporting(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Inserted>> {
        let texts = jobs
            .iter()
            .map(NewJob::validate)
            .collect::<Result<Vec<_>>>()?;
        for job in jobs {
            self.ensure_queue_from(conn, &job.queue).await?;
        }
        // All or nothing: a transaction of its own on a plain connection, a savepoint inside the
        // caller's transaction. Without it a COPY group's segment reservation could commit alone
        // and leave a hole the lane waits on.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let ids = self.insert_groups(&mut tx, jobs, &texts).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn insert_groups(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
        texts: &[String],
    ) -> Result<Vec<Inserted>> {
        let now = Utc::now();
        let mut ids: Vec<Inserted> = (0..jobs.len())
            .map(|_| Inserted {
                job_id: 0,
                duplicate: false,
            })
            .collect();
        // group by lane (immediate) or by (queue, priority) for the backlog, keeping input order
        let mut groups: Vec<((String, i16, bool), Vec<usize>)> = Vec::new();
        let mut unique: Vec<(String, usize)> = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            if let Some(options) = &job.unique {
                unique.push((job.unique_key(options, now)?, index));
                continue;
            }
            let key = (job.queue.clone(), job.priority, job.is_future(now));
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(index),
                None => groups.push((key, vec![index])),
            }
        }
        for ((queue, priority, future), members) in groups {
            let kinds: Vec<&str> = members.iter().map(|&i| jobs[i].kind.as_str()).collect();
            let max_attempts: Vec<i32> = members.iter().map(|&i| jobs[i].max_attempts).collect();
            let timeouts: Vec<Option<i32>> =
                members.iter().map(|&i| jobs[i].timeout_ms()).collect();
            let group_ids: Vec<i64> = if future {
                let args: Vec<serde_json::Value> =
                    members.iter().map(|&i| jobs[i].args.clone()).collect();
                let run_at: Vec<DateTime<Utc>> = members
                    .iter()
                    .map(|&i| jobs[i].run_at.unwrap_or(now))
                    .collect();
                sqlx::query_scalar(&self.sql.schedule_jobs)
                    .bind(&queue)
                    .bind(priority)
                    .bind(&kinds)
                    .bind(&args)
                    .bind(&max_attempts)
                    .bind(&run_at)
                    .bind(&timeouts)
                    .fetch_all(&mut *conn)
                    .await?
            } else if members.len() <= COPY_THRESHOLD {
                let args: Vec<serde_json::Value> =
                    members.iter().map(|&i| jobs[i].args.clone()).collect();
                sqlx::query_scalar(&self.sql.enqueue_jobs)
                    .bind(&queue)
                    .bind(priority)
                    .bind(&kinds)
                    .bind(&args)
                    .bind(&max_attempts)
                    .bind(&timeouts)
                    .fetch_all(&mut *conn)
                    .await?
            } else {
                self.copy_group(conn, &queue, priority, &members, jobs, texts)
                    .await?
            };
            for (&index, id) in members.iter().zip(group_ids) {
                ids[index].job_id = id;
            }
        }
        // Unique jobs one statement each, after the others, in key order: two single calls with
        // overlapping key sets take the per-key locks in the same order. (Several calls in one
        // transaction, or two keys whose lock hashes collide, can still order them differently;
        // PostgreSQL then reports a deadlock and one transaction fails, nothing is half-written.)
        unique.sort();
        for (key, index) in unique {
            let job = &jobs[index];
            let states: Vec<&str> = job
                .unique
                .iter()
                .flat_map(|u| u.states.iter().map(|state| state.as_str()))
                .collect();
            let (job_id, inserted): (i64, bool) = sqlx::query_as(&self.sql.insert_unique)
                .bind(&key)
                .bind(&states)
                .bind(&job.queue)
                .bind(job.priority)
                .bind(&job.kind)
                .bind(&job.args)
                .bind(job.max_attempts)
                .bind(job.run_at)
                .bind(job.timeout_ms())
                .fetch_one(&mut *conn)
                .await?;
            ids[index] = Inserted {
                job_id,
                duplicate: !inserted,
            };
        }
        Ok(ids)
    }

    async fn copy_group(
        &self,
        conn: &mut PgConnection,
        queue: &str,
        priority: i16,
        members: &[usize],
        jobs: &[NewJob],
        texts: &[String],
    ) -> Result<Vec<i64>> {
        let row = sqlx::query(&self.sql.reserve_segment)
            .bind(queue)
            .bind(priority)
            .bind(members.len() as i32)
            .fetch_one(&mut *conn)
            .await?;
        let slot: i32 = row.try_get("ready_slot")?;
        let lane: i32 = row.try_get("lane_id")?;
        let base: i64 = row.try_get("base_pos")?;
        let ids: Vec<i64> = row.try_get("job_ids")?;
        let mut csv = String::with_capacity(members.len() * 128);
        for (ordinal, (&index, id)) in members.iter().zip(&ids).enumerate() {
            let job = &jobs[index];
            csv.push_str(&format!(
                "{slot},{lane},{},{id},{},{},{},{priority},0,0,{},{}\n",
                base + ordinal as i64,
                csv_quote(queue),
                csv_quote(&job.kind),
                csv_quote(&texts[index]),
                job.max_attempts,
                // an unquoted empty CSV field is NULL
                job.timeout_ms().map(|t| t.to_string()).unwrap_or_default()
            ));
        }
        let mut copy = conn.copy_in_raw(&self.sql.copy_ready).await?;
        copy.send(csv.into_bytes()).await?;
        copy.finish().await?;
        Ok(ids)
    }

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
        let rows = sqlx::query(&self.sql.claim)
            .bind(queue)
            .bind(max.clamp(1, 4096) as i32)
            .bind(deadline.map(|d| d.as_secs_f64()))
            .bind(aging.filter(|a| !a.is_zero()).map(|a| a.as_secs_f64()))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ClaimedJob {
                    job_id: r.try_get("job_id")?,
                    run_lease: r.try_get("run_lease")?,
                    claim_slot: r.try_get("claim_slot")?,
                    receipt_id: r.try_get("receipt_id")?,
                    kind: r.try_get("kind")?,
                    args: r.try_get("args")?,
                    attempt: r.try_get("attempt")?,
                    max_attempts: r.try_get("max_attempts")?,
                    priority: r.try_get("priority")?,
                    created_at: r.try_get("created_at")?,
                    deadline_at: r.try_get("deadline_at")?,
                })
            })
            .collect()
    }

    /// Does the queue hold ready rows ahead of a lane cursor? (Tells "lane busy" from "empty" after
    /// a claim returned nothing.)
    pub async fn queue_has_backlog(&self, queue: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.queue_has_backlog)
            .bind(queue)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Complete a batch of attempts successfully. Returns one outcome per input, in input order.
    pub async fn complete_batch(&self, attempts: &[AttemptRef]) -> Result<Vec<Outcome>> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.complete_batch)
            .bind(attempts.iter().map(|a| a.claim_slot).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.receipt_id).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.job_id).collect::<Vec<_>>())
            .bind(attempts.iter().map(|a| a.run_lease).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
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
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.close_batch)
            .bind(closes.iter().map(|(a, _)| a.claim_slot).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.receipt_id).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.job_id).collect::<Vec<_>>())
            .bind(closes.iter().map(|(a, _)| a.run_lease).collect::<Vec<_>>())
            .bind(&outcomes)
            .bind(&retry_at)
            .bind(&errors)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
    }

    /// Cancel a job by id, wherever it is (see `CancelOutcome`).
    pub async fn cancel_job(&self, job_id: i64, reason: &str) -> Result<CancelOutcome> {
        crate::job::validate_name("cancel reason", reason)?;
        let text: String = sqlx::query_scalar(&self.sql.cancel_job)
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
        let holder: Option<i64> = sqlx::query_scalar(&self.sql.unique_job)
            .bind(&key)
            .fetch_one(&self.pool)
            .await?;
        match holder {
            Some(job_id) => self.cancel_job(job_id, reason).await,
            None => Ok(CancelOutcome::NotFound),
        }
    }

    /// Forget up to `limit` unique keys older than `older` whose job is no longer pending.
    pub async fn unique_keys_expire(&self, older: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.unique_keys_expire)
            .bind(older.as_secs_f64())
            .bind(limit)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Available (claimable, uncancelled) jobs of one queue; the `available` of `queue_counts`
    /// alone, for producers that keep a target depth.
    pub async fn available_count(&self, queue: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.available_count)
            .bind(queue)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Exact counts per queue (one queue, or all), without scanning `ready_entries`: available
    /// jobs come from the segment map above each lane's claim cursor, running ones from the
    /// in-flight anti-join over the active claim slots.
    pub async fn queue_counts(&self, queue: Option<&str>) -> Result<Vec<QueueCounts>> {
        let rows = sqlx::query(&self.sql.queue_counts)
            .bind(queue)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|row| {
                Ok(QueueCounts {
                    queue: row.try_get("queue")?,
                    paused: row.try_get("paused")?,
                    available: row.try_get("available")?,
                    scheduled: row.try_get("scheduled")?,
                    retryable: row.try_get("retryable")?,
                    running: row.try_get("running")?,
                    completed: row.try_get("completed")?,
                    failed: row.try_get("failed")?,
                    cancelled: row.try_get("cancelled")?,
                    dead_lettered: row.try_get("dead_lettered")?,
                })
            })
            .collect()
    }

    /// Pause (no claims; enqueue still works) or resume a queue. Returns whether anything changed.
    pub async fn set_queue_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.set_queue_paused)
            .bind(queue)
            .bind(paused)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Where a job is now: `available`, `running`, `scheduled`, `retryable`, `completed`,
    /// `failed`, `cancelled` or `dead_lettered`; `None` when unknown (or its history has aged out).
    pub async fn job_state(&self, job_id: i64) -> Result<Option<JobState>> {
        let row: Option<(String, String, String, i32, i64, Option<String>)> =
            sqlx::query_as(&self.sql.job_state)
                .bind(job_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(
            |(state, queue, kind, attempt, run_lease, detail)| JobState {
                job_id,
                state,
                queue,
                kind,
                attempt,
                run_lease,
                detail,
            },
        ))
    }

    /// The job's current state and whatever history the schema still holds for it: terminal rows
    /// from `terminal_jobs`, its pending retry or schedule, its dead-letter entry.
    pub async fn load_job(&self, job_id: i64) -> Result<Option<JobRecord>> {
        let Some(state) = self.job_state(job_id).await? else {
            return Ok(None);
        };
        let rows: Vec<(i64, String, Option<String>, DateTime<Utc>)> =
            sqlx::query_as(&self.sql.job_history)
                .bind(job_id)
                .fetch_all(&self.pool)
                .await?;
        let history = rows
            .into_iter()
            .map(|(run_lease, state, error, at)| HistoryEntry {
                run_lease,
                state,
                error,
                at,
            })
            .collect();
        Ok(Some(JobRecord { state, history }))
    }

    /// Send this queue's terminal failures to the dead-letter queue (or stop doing so).
    pub async fn set_queue_dead_letter(&self, queue: &str, enabled: bool) -> Result<bool> {
        crate::job::validate_name("queue name", queue)?;
        Ok(sqlx::query_scalar(&self.sql.set_queue_dead_letter)
            .bind(queue)
            .bind(enabled)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Dead-lettered jobs, oldest failure first.
    pub async fn dlq_list(&self, queue: Option<&str>, limit: i64) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(&self.sql.dlq_list)
            .bind(queue)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetter {
                    job_id: r.try_get("job_id")?,
                    queue: r.try_get("queue")?,
                    kind: r.try_get("kind")?,
                    args: r.try_get("args")?,
                    attempt: r.try_get("attempt")?,
                    run_lease: r.try_get("run_lease")?,
                    error: r.try_get("error")?,
                    failed_at: r.try_get("failed_at")?,
                })
            })
            .collect()
    }

    /// Move a dead-lettered job back to run now with fresh attempts. False when it is not in the
    /// DLQ (already retried, purged, or never there).
    pub async fn dlq_retry(&self, job_id: i64) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.dlq_retry)
            .bind(job_id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Delete dead-lettered jobs: one (`job_id`), a queue's, or all. Returns how many.
    pub async fn dlq_purge(&self, queue: Option<&str>, job_id: Option<i64>) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.dlq_purge)
            .bind(queue)
            .bind(job_id)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Retention: delete up to `limit` DLQ rows older than `keep`.
    pub async fn dlq_expire(&self, keep: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.dlq_expire)
            .bind(keep.as_secs_f64())
            .bind(limit)
            .fetch_one(&self.pool)
            .await?)
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
        let rows: Vec<(i64, bool)> = sqlx::query_as(&self.sql.heartbeat_batch)
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
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|(_, ok)| outcome(ok)).collect())
    }

    /// One rescue pass (deadline, then stale) over every claim slot. Returns attempts closed.
    pub async fn rescue(&self, stale_after: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.rescue)
            .bind(stale_after.as_secs_f64())
            .bind(limit)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Attempts currently claimed and not closed (in one queue, or all).
    pub async fn count_in_flight(&self, queue: Option<&str>) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.count_in_flight)
            .bind(queue)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Move up to `limit` due `deferred_jobs` to ready. Returns how many moved.
    pub async fn promote_due(&self, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.promote_due)
            .bind(limit)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Rotate the queue ring if its current slot is older than `min_age` and in use.
    pub async fn rotate_queue_ring(&self, min_age: Duration) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.rotate_queue_ring)
            .bind(min_age.as_secs_f64())
            .fetch_one(&self.pool)
            .await?)
    }

    /// Rotate the claim ring if its current slot is older than `min_age` and in use.
    pub async fn rotate_claim_ring(&self, min_age: Duration) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.rotate_claim_ring)
            .bind(min_age.as_secs_f64())
            .fetch_one(&self.pool)
            .await?)
    }

    pub async fn sealed_queue_slots(&self) -> Result<Vec<i32>> {
        Ok(sqlx::query_scalar(&self.sql.sealed_queue_slots)
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn sealed_claim_slots(&self) -> Result<Vec<i32>> {
        Ok(sqlx::query_scalar(&self.sql.sealed_claim_slots)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Try to reclaim one sealed queue-ring slot (ARCHITECTURE §5). Failed and cancelled history
    /// younger than `keep_failed` is carried forward into the current slot.
    pub async fn prune_queue_slot(
        &self,
        slot: i32,
        lock_timeout: Duration,
        keep_failed: Duration,
    ) -> Result<PruneResult> {
        let result: String = sqlx::query_scalar(&self.sql.prune_queue_slot)
            .bind(slot)
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .bind(keep_failed.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        Ok(prune_result(result))
    }

    /// Try to reclaim one sealed claim-ring slot (ADR-023 prune order).
    pub async fn prune_claim_slot(&self, slot: i32, lock_timeout: Duration) -> Result<PruneResult> {
        let result: String = sqlx::query_scalar(&self.sql.prune_claim_slot)
            .bind(slot)
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(&self.pool)
            .await?;
        Ok(prune_result(result))
    }
}

fn outcome(accepted: bool) -> Outcome {
    if accepted {
        Outcome::Applied
    } else {
        Outcome::Stale
    }
}

fn prune_result(text: String) -> PruneResult {
    if text == "pruned" {
        PruneResult::Pruned
    } else {
        PruneResult::Skipped(text)
    }
}

/// Quote one CSV field for COPY (FORMAT csv): wrap in quotes, double inner quotes.
fn csv_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn csv_quote_doubles_quotes() {
        assert_eq!(super::csv_quote(r#"{"a":"b,c"}"#), r#""{""a"":""b,c""}""#);
    }
}
