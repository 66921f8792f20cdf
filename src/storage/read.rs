//! Reads: exact per-queue counts, a job's state and history (`sql/functions/read.sql`).

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use sqlx::Row;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    available_count: String,
    queue_counts: String,
    oldest_available_wait: String,
    last_claim_age: String,
    job_state_locks: String,
    job_state: String,
    job_history: String,
    pending_jobs: String,
    job_progress: String,
    job_args: String,
    list_jobs: String,
    queue_names: String,
    queue_counts_of: String,
    queue_names_page: String,
    dead_letter_counts: String,
    queue_limits_in_use: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            available_count: format!(
                "SELECT coalesce(sum({s}.lane_available(lane_id)), 0)::int8 FROM {s}.queue_lanes WHERE queue = $1"
            ),
            queue_counts: format!(
                "SELECT queue, paused, available, scheduled, retryable, running, completed, failed, cancelled, \
                 dead_lettered, waiting, pending FROM {s}.queue_counts($1)"
            ),
            oldest_available_wait: format!(
                "SELECT extract(epoch FROM {s}.oldest_available_wait($1))::float8"
            ),
            last_claim_age: format!(
                "SELECT extract(epoch FROM {s}.engine_now() - {s}.queue_last_claim($1))::float8"
            ),

            // a gate that waits out a queue slot's prune: tables it truncates (the ledger, which it
            // locks first, and those job_state reads), in prune's order (prune.sql), so the two
            // never wait on each other in a cycle
            job_state_locks: format!(
                "LOCK TABLE {s}.queue_ring_ledger, {s}.ready_entries, {s}.ready_tombstones, \
                 {s}.done_entries, {s}.receipt_completion_batches IN ACCESS SHARE MODE"
            ),
            job_state: format!(
                "SELECT state, queue, kind, attempt, run_lease, left(detail, {MAX_DETAIL_CHARS}) AS detail \
                 FROM {s}.job_state($1)"
            ),
            job_history: format!(
                "SELECT run_lease, state, left(error, {MAX_DETAIL_CHARS}) AS error, {s}.readable_time(at) AS at \
                 FROM {s}.job_history($1)"
            ),
            job_progress: format!("SELECT run_lease, progress, recorded_at FROM {s}.job_progress($1)"),
            job_args: format!(
                "SELECT left(a.text, $2) AS text, octet_length(a.text)::int8 AS bytes \
                 FROM (SELECT {s}.job_args($1)::text AS text) a WHERE a.text IS NOT NULL"
            ),
            // arguments and details cut in the database: a page of a queue of large jobs never
            // carries their whole payloads
            list_jobs: format!(
                "SELECT job_id, state, queue, kind, left(args::text, {cut}) AS args, attempt, \
                 {s}.readable_time(at) AS at, left(detail, {LIST_DETAIL_CHARS}) AS detail, page_key \
                 FROM {s}.list_jobs($1, $2, $3, $4, $5)",
                cut = ARGS_PREVIEW_CHARS + 1
            ),
            queue_names: format!("SELECT queue FROM {s}.queues ORDER BY queue"),
            queue_counts_of: format!(
                "SELECT queue, paused, available, scheduled, retryable, running, completed, failed, cancelled, \
                 dead_lettered, waiting, pending FROM {s}.queue_counts_of($1)"
            ),
            queue_names_page: format!(
                "SELECT q.queue FROM {s}.queues q WHERE ($1::text IS NULL OR q.queue > $1) \
                 AND ($2::text IS NULL OR strpos(q.queue, $2) > 0) ORDER BY q.queue LIMIT $3"
            ),
            dead_letter_counts: format!(
                "SELECT queue, count(*)::int8 FROM {s}.dlq_entries GROUP BY queue ORDER BY queue"
            ),
            queue_limits_in_use: format!(
                "SELECT queue, max_running, running, rate_limit, extract(epoch FROM rate_period)::float8 AS rate_period, \
                 rate_used, key_path, key_max_running, key_rate_limit, \
                 extract(epoch FROM key_rate_period)::float8 AS key_rate_period, held, top_keys \
                 FROM {s}.queue_limits_in_use($1)"
            ),
            pending_jobs: format!(
                "SELECT job_id, state, queue, kind, args::text AS args, priority, attempt, \
                 {s}.readable_time(run_at) AS run_at FROM {s}.pending_jobs($1, $2, $3)"
            ),
        }
    }
}

/// A queue's limits (`Storage::set_queue_limits`) and what it uses of them now
/// (`Storage::queue_limits_in_use`).
#[derive(Clone, Debug, PartialEq)]
pub struct LimitsInUse {
    /// The queue.
    pub queue: String,
    /// At most this many attempts open at once, across the fleet.
    pub max_running: Option<i32>,
    /// Attempts open now (running, or claimed ahead).
    pub running: i64,
    /// At most this many claims per `rate_period`.
    pub rate_limit: Option<i32>,
    /// The rate's window.
    pub rate_period: Option<std::time::Duration>,
    /// Jobs claimed in the current window.
    pub rate_used: i64,
    /// The path in a job's args whose value is its key, for per-key limits.
    pub key_path: Option<Vec<String>>,
    /// At most this many attempts open per key.
    pub key_max_running: Option<i32>,
    /// At most this many claims per key per `key_rate_period`.
    pub key_rate_limit: Option<i32>,
    /// The per-key rate's window.
    pub key_rate_period: Option<std::time::Duration>,
    /// Jobs held out of the ring until their key has room again.
    pub held: i64,
    /// The busiest keys, busiest first.
    pub top_keys: Vec<KeyInUse>,
}

/// What one key of a per-key limit uses now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInUse {
    /// The key's value (the text at the limit's path in the job's args).
    pub key: String,
    /// Its attempts open now.
    pub running: i64,
    /// Its claims in the key's rate window.
    pub claims: i64,
}

/// The rows of a listing as jobs.
pub(super) fn listed(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<ListedJob>> {
    rows.into_iter()
        .map(|row| {
            Ok(ListedJob {
                job_id: row.try_get("job_id")?,
                state: row.try_get::<String, _>("state")?.parse()?,
                queue: row.try_get("queue")?,
                kind: row.try_get("kind")?,
                args: preview(row.try_get("args")?),
                attempt: row.try_get("attempt")?,
                at: row.try_get("at")?,
                detail: row.try_get("detail")?,
                page_key: row.try_get("page_key")?,
            })
        })
        .collect()
}

/// How many statements one page of a listing makes at most before it returns a short page with
/// its next key (each reads a bounded number of shards: 32 x 256 over queues with nothing
/// available).
const MAX_LIST_CALLS: usize = 32;

/// How many queues one statement counts. Counting a queue reads the two sequences of each of its
/// lane shards (8 shards for each priority it uses, up to 64 sequences), and a statement holds a
/// lock on every sequence it read until it ends: one statement over every queue took 64 locks per
/// queue from the server's shared lock table (about 64 x max_connections entries, 6,400 by
/// default), so from about 100 queues it failed with "out of shared memory", and failed other
/// sessions' lock requests while it ran.
const COUNTED_PER_STATEMENT: usize = 8;

/// How many of those statements a page of queue counts runs at once (each on its own connection).
const COUNTED_AT_ONCE: usize = 3;

/// How much of a job's arguments a listing carries: the first characters of their JSON text.
pub const ARGS_PREVIEW_CHARS: usize = 200;
/// How much of a recorded error or reason a read of one job returns: the schema's bound,
/// `max_error_chars` (at most this), applies when it is written; this one also covers rows
/// written before it.
pub const MAX_DETAIL_CHARS: usize = 65_536;
/// How much of a recorded error or reason a listing carries.
pub const LIST_DETAIL_CHARS: usize = 1_000;

/// A job's arguments as stored, for people to read: the JSON text, cut to the length asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsText {
    /// The JSON text (or its first characters, when `bytes` is larger).
    pub text: String,
    /// The length of the whole text in bytes.
    pub bytes: i64,
}

impl ArgsText {
    /// Whether `text` is only the beginning of the arguments.
    pub fn is_cut(&self) -> bool {
        (self.text.len() as i64) < self.bytes
    }
}

/// A job's current state (see `Storage::job_state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobState {
    /// The job's id.
    pub job_id: i64,
    /// Where the job is now.
    pub state: crate::JobStatus,
    /// The job's queue.
    pub queue: String,
    /// The job's kind.
    pub kind: String,
    /// Attempts it used (for a running job, the running attempt's number).
    pub attempt: i32,
    /// Its latest run lease (for a running job, the running attempt's).
    pub run_lease: i64,
    /// The recorded error of a failed/cancelled/retryable job.
    pub detail: Option<String>,
}

/// Exact per-queue counts (see `Storage::queue_counts`). `completed`, `failed` and `cancelled` are
/// durable totals: every job of the queue that reached that state since migration 0006, whether its
/// queue slot was pruned and its history archived or expired since.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueCounts {
    /// The queue's name.
    pub queue: String,
    /// The queue is paused: its jobs are not claimed (inserts still work).
    pub paused: bool,
    /// Jobs ready to run (claimable, parked, or held under a key limit).
    pub available: i64,
    /// Jobs waiting in `deferred_jobs` for their first attempt.
    pub scheduled: i64,
    /// Jobs waiting in `deferred_jobs` to run again after an attempt.
    pub retryable: i64,
    /// Attempts claimed and not yet closed.
    pub running: i64,
    /// Jobs completed (durable total).
    pub completed: i64,
    /// Jobs failed for good (durable total).
    pub failed: i64,
    /// Jobs cancelled (durable total).
    pub cancelled: i64,
    /// Jobs in the dead-letter queue now.
    pub dead_lettered: i64,
    /// Waiting for an external callback (the lease ring): no worker, no open claim.
    pub waiting: i64,
    /// Workflow steps, batch callbacks and sequence jobs waiting for the jobs before them: no job
    /// row in the queue yet.
    pub pending: i64,
}

/// One recorded step of a job's history (see `Storage::load_job`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The run lease of the attempt this step belongs to.
    pub run_lease: i64,
    /// `Completed`, `Failed`, `Cancelled`, `Scheduled`, `Retryable` or `DeadLettered`.
    pub state: crate::JobStatus,
    /// The error or cancel reason recorded (for a pending retry, the previous attempt's error).
    pub error: Option<String>,
    /// When it ended, or (scheduled/retryable) when it is due.
    pub at: DateTime<Utc>,
}

/// A job's current state with its recorded history (see `Storage::load_job`).
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// The job's current state, as `Storage::job_state` reports it.
    pub state: JobState,
    /// The recorded steps the schema still holds, oldest run lease first.
    pub history: Vec<HistoryEntry>,
    /// The last progress an attempt recorded, while the job runs or waits to run again.
    pub progress: Option<ProgressRecord>,
}

/// What a handler reported with `JobContext::set_progress`, stored with its attempt's heartbeat.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// 0 to 100.
    pub percent: f64,
    /// What the handler says it is doing (cut after 1,000 characters).
    pub message: String,
    /// What the handler needs to resume where it was (read back with `JobContext::last_progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<serde_json::Value>,
}

/// A job's last recorded progress: which attempt recorded it, and when it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressRecord {
    /// The run lease of the attempt that recorded it.
    pub run_lease: i64,
    /// What it recorded.
    pub progress: Progress,
    /// When it was written (the attempt's heartbeat time).
    pub recorded_at: DateTime<Utc>,
}

/// A job waiting to run (see `Storage::pending_jobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct PendingJob {
    /// The job's id.
    pub job_id: i64,
    /// `Available`, `Scheduled` or `Retryable`.
    pub state: crate::JobStatus,
    /// The job's queue.
    pub queue: String,
    /// The job's kind.
    pub kind: String,
    /// The job's arguments, decoded.
    pub args: serde_json::Value,
    /// The job's priority, 1 (first) ..= 4 (last).
    pub priority: i16,
    /// Attempts it used so far.
    pub attempt: i32,
    /// When it is (or was) due to run; the listing is ordered by it.
    pub run_at: DateTime<Utc>,
}

/// One row of a job listing (see `Storage::list_jobs`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ListedJob {
    /// The job's id.
    pub job_id: i64,
    /// The job's state (the listing's state).
    pub state: crate::JobStatus,
    /// The job's queue.
    pub queue: String,
    /// The job's kind.
    pub kind: String,
    /// The JSON text of the job's arguments, cut in the database to `ARGS_PREVIEW_CHARS`
    /// characters and a trailing `…` (the whole arguments: `Storage::job_args`).
    pub args: String,
    /// Attempts it used (for a running job, the running attempt's number).
    pub attempt: i32,
    /// Waiting jobs: when they are (or were) due; running: when claimed; finished: when they
    /// finished; dead-lettered: when they failed.
    pub at: DateTime<Utc>,
    /// The recorded error, or why a waiting job waits (`parked`, held under a key limit).
    pub detail: Option<String>,
    /// Pass the last row's key to get the next page.
    pub page_key: String,
}

/// One page of a job listing: its rows and the key of the next page (`None` at the end).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct JobPage {
    /// The page's rows, in the listing's order.
    pub jobs: Vec<ListedJob>,
    /// The page key of the next page; `None` on the last page.
    pub next: Option<String>,
}

impl Storage {
    /// The page key that starts a newest-first listing (completed, failed, cancelled and
    /// dead-lettered jobs) at `before`: its first page holds the jobs that finished (or were
    /// dead-lettered) before then. `None` for the states listed in another order.
    pub fn page_key_before(state: crate::JobStatus, before: DateTime<Utc>) -> Option<String> {
        use crate::JobStatus::*;
        matches!(state, Completed | Failed | Cancelled | DeadLettered).then(|| {
            let micros = before.timestamp_micros();
            // job id 0 sorts before every job: a job that finished at exactly `before` is not
            // before it (it is "since" it)
            format!("T{micros}:0")
        })
    }

    /// One page of the jobs of one state, optionally of one queue and one kind, after the page
    /// key `after` (`None`: the first page). Available jobs lane by lane, highest priority first;
    /// scheduled, retryable, running and waiting ones by job id; finished and dead-lettered jobs
    /// newest first. At most `limit` rows (1..=1,000). The backlog tables and the archive are
    /// walked by index; what the rings hold (seconds to minutes of history) is read whole for the
    /// queue (`sql/functions/read.sql`, `list_jobs`).
    pub async fn list_jobs(
        &self,
        state: crate::JobStatus,
        queue: Option<&str>,
        kind: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        let limit = limit.clamp(1, 1000);
        if let Some(after) = after {
            crate::job::validate_name("page key", after)?;
        }
        if let Some(queue) = queue {
            crate::job::validate_name("queue name", queue)?;
        }
        if let Some(kind) = kind {
            crate::job::validate_name("job kind", kind)?;
        }
        let mut rows = Vec::new();
        let mut from = after.map(str::to_string);
        // a row without a job ends a call that stopped short (the available walk reads a bounded
        // number of shards per call): go on from its page key in a new statement, whose locks
        // are its own
        let mut calls = 0;
        loop {
            calls += 1;
            let mut got = sqlx::query(&self.sql.read.list_jobs)
                .bind(queue)
                .bind(state.as_str())
                .bind(kind)
                .bind(from.as_deref())
                // one more row than asked: whether a next page exists
                .bind((limit + 1 - rows.len()) as i32)
                .fetch_all(self.db())
                .await?;
            let resume = match got.last() {
                Some(last) if last.try_get::<Option<i64>, _>("job_id")?.is_none() => {
                    let key: String = last.try_get("page_key")?;
                    got.pop();
                    Some(key)
                }
                _ => None,
            };
            rows.extend(got);
            match resume {
                Some(key) if rows.len() <= limit && calls < MAX_LIST_CALLS => from = Some(key),
                Some(key) => {
                    // a page cut short after many calls: the next page goes on from the key
                    return Ok(JobPage {
                        jobs: listed(rows)?,
                        next: Some(key),
                    });
                }
                None => break,
            }
        }
        let mut jobs = listed(rows)?;
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|job| job.page_key.clone())
        } else {
            None
        };
        Ok(JobPage { jobs, next })
    }

    /// The job's arguments from its newest stored row as JSON text, at most `max_chars`
    /// characters of it; `None` when the job is unknown or its history has aged out. Text, not a
    /// decoded value, so that arguments this binary cannot decode (a number beyond f64, stored by
    /// an older build) are still shown.
    pub async fn job_args(&self, job_id: i64, max_chars: usize) -> Result<Option<ArgsText>> {
        let row: Option<(String, i64)> = sqlx::query_as(&self.sql.read.job_args)
            .bind(job_id)
            .bind(max_chars.min(i32::MAX as usize) as i32)
            .fetch_optional(self.db())
            .await?;
        Ok(row.map(|(text, bytes)| ArgsText { text, bytes }))
    }

    /// Jobs waiting to run (available, scheduled, retryable), optionally of one queue and kind,
    /// oldest first, at most `limit`, read on `conn`: inside a transaction this includes the jobs
    /// that transaction enqueued and has not committed. It reads job rows; for tests and small
    /// inspections, not for scraping a large queue. Behind a transaction pooler, `conn` must be in
    /// a transaction.
    pub async fn pending_jobs(
        &self,
        conn: &mut sqlx::PgConnection,
        queue: Option<&str>,
        kind: Option<&str>,
        limit: i32,
    ) -> Result<Vec<PendingJob>> {
        let rows = sqlx::query(&self.sql.read.pending_jobs)
            .bind(queue)
            .bind(kind)
            .bind(limit)
            .fetch_all(self.on(conn))
            .await?;
        rows.into_iter()
            .map(|row| {
                let job_id: i64 = row.try_get("job_id")?;
                let kind: String = row.try_get("kind")?;
                let args: String = row.try_get("args")?;
                let args = serde_json::from_str(&args).map_err(|e| crate::Error::InvalidArgs {
                    kind: kind.clone(),
                    reason: format!("job {job_id}'s stored arguments cannot be decoded: {e}"),
                })?;
                Ok(PendingJob {
                    job_id,
                    state: row.try_get::<String, _>("state")?.parse()?,
                    queue: row.try_get("queue")?,
                    kind,
                    args,
                    priority: row.try_get("priority")?,
                    attempt: row.try_get("attempt")?,
                    run_at: row.try_get("run_at")?,
                })
            })
            .collect()
    }

    /// Every queue's name, in order: one read of `queues`, for a page's queue filter (what
    /// `queue_counts` would count per queue is not needed there).
    pub async fn queue_names(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(&self.sql.read.queue_names)
            .fetch_all(self.db())
            .await?)
    }

    /// The queues that hold dead-lettered jobs, with how many each.
    pub async fn dead_letter_counts(&self) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(&self.sql.read.dead_letter_counts)
            .fetch_all(self.db())
            .await?)
    }

    /// Every queue with limits, and what it uses of them now: attempts open against its running
    /// limit, claims in its rate window, jobs held for keys at their limit, and its `top_keys`
    /// busiest keys (by open attempts, then by claims in the key's rate window).
    pub async fn queue_limits_in_use(&self, top_keys: usize) -> Result<Vec<LimitsInUse>> {
        let rows = sqlx::query(&self.sql.read.queue_limits_in_use)
            .bind(top_keys.clamp(1, 1000) as i32)
            .fetch_all(self.db())
            .await?;
        rows.iter()
            .map(|row| {
                let period = |secs: Option<f64>| secs.map(std::time::Duration::from_secs_f64);
                let top: serde_json::Value = row.try_get("top_keys")?;
                let top_keys = top
                    .as_array()
                    .map(|keys| {
                        keys.iter()
                            .map(|k| KeyInUse {
                                key: k["key"].as_str().unwrap_or_default().to_string(),
                                running: k["running"].as_i64().unwrap_or(0),
                                claims: k["claims"].as_i64().unwrap_or(0),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(LimitsInUse {
                    queue: row.try_get("queue")?,
                    max_running: row.try_get("max_running")?,
                    running: row.try_get("running")?,
                    rate_limit: row.try_get("rate_limit")?,
                    rate_period: period(row.try_get("rate_period")?),
                    rate_used: row.try_get("rate_used")?,
                    key_path: row.try_get("key_path")?,
                    key_max_running: row.try_get("key_max_running")?,
                    key_rate_limit: row.try_get("key_rate_limit")?,
                    key_rate_period: period(row.try_get("key_rate_period")?),
                    held: row.try_get("held")?,
                    top_keys,
                })
            })
            .collect()
    }

    /// Available (claimable, uncancelled) jobs of one queue; the `available` of `queue_counts`
    /// alone, for producers that keep a target depth.
    pub async fn available_count(&self, queue: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(&self.sql.read.available_count)
            .bind(queue)
            .fetch_one(self.db())
            .await?)
    }

    /// Exact counts per queue (one queue, or all), without scanning `ready_entries`: available
    /// jobs come from the segment map above each lane's claim cursor, running ones from the
    /// in-flight anti-join over the active claim slots.
    ///
    /// Every queue is counted a few queues per statement (`queue_counts_of`), so each queue's
    /// counts are exact as of its own statement, not one snapshot of them all.
    pub async fn queue_counts(&self, queue: Option<&str>) -> Result<Vec<QueueCounts>> {
        if queue.is_some() {
            let rows = sqlx::query(&self.sql.read.queue_counts)
                .bind(queue)
                .fetch_all(self.db())
                .await?;
            return rows.iter().map(queue_counts_row).collect();
        }
        // every queue's name, then their counts a few queues per statement (queue_counts_of)
        let names = self.queue_names().await?;
        self.queue_counts_of(&names).await
    }

    /// `queue_counts` for one page of queues in name order: those after `after`, whose names
    /// contain `contains` when given, at most `limit` (1..=1,000). Returns the page and the name to
    /// pass as `after` for the next one (`None`: the last page).
    pub async fn queue_counts_page(
        &self,
        after: Option<&str>,
        contains: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<QueueCounts>, Option<String>)> {
        let limit = limit.clamp(1, 1000);
        if let Some(after) = after {
            crate::job::validate_name("page key", after)?;
        }
        let contains = contains.filter(|c| !c.is_empty());
        if let Some(contains) = contains {
            crate::job::validate_name("queue filter", contains)?;
        }
        // the page's names, then their counts a few queues per statement (one statement's reads
        // of every lane's sequences hold their locks to its end: see COUNTED_PER_STATEMENT), and
        // COUNTED_AT_ONCE statements at a time: a page of 50 queues is about 150 ms of server work
        let mut names: Vec<String> = sqlx::query_scalar(&self.sql.read.queue_names_page)
            .bind(after)
            .bind(contains)
            .bind((limit + 1) as i64)
            .fetch_all(self.db())
            .await?;
        // one more name than asked: whether a next page exists
        let next = if names.len() > limit {
            names.truncate(limit);
            names.last().cloned()
        } else {
            None
        };
        let page = self.queue_counts_of(&names).await?;
        Ok((page, next))
    }

    /// `queue_counts` for the named queues, in name order (a name that is not a queue gives no
    /// row): `COUNTED_PER_STATEMENT` queues a statement, `COUNTED_AT_ONCE` statements at a time.
    pub async fn queue_counts_of(&self, queues: &[String]) -> Result<Vec<QueueCounts>> {
        let chunks: Vec<Vec<String>> = queues
            .chunks(COUNTED_PER_STATEMENT)
            .map(<[String]>::to_vec)
            .collect();
        let counted: Vec<Vec<QueueCounts>> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let rows = sqlx::query(&self.sql.read.queue_counts_of)
                    .bind(&chunk)
                    .fetch_all(self.db())
                    .await?;
                rows.iter()
                    .map(queue_counts_row)
                    .collect::<Result<Vec<_>>>()
            })
            .buffered(COUNTED_AT_ONCE)
            .try_collect()
            .await?;
        let mut all: Vec<QueueCounts> = counted.into_iter().flatten().collect();
        all.sort_by(|a, b| a.queue.cmp(&b.queue));
        Ok(all)
    }

    /// How long the queue's oldest available job has waited (since it became runnable), or
    /// `None` when nothing is available. One index probe per shard that may hold work.
    pub async fn oldest_available_wait(&self, queue: &str) -> Result<Option<std::time::Duration>> {
        self.queue_seconds(&self.sql.read.oldest_available_wait, queue)
            .await
    }

    /// How long ago a process last claimed from the queue's lanes that may hold work, or `None`
    /// when the ring holds no claim of theirs (never claimed, or not within a ring cycle).
    pub async fn last_claim_age(&self, queue: &str) -> Result<Option<std::time::Duration>> {
        self.queue_seconds(&self.sql.read.last_claim_age, queue)
            .await
    }

    /// A statement of one queue that returns seconds (or NULL), as a duration.
    async fn queue_seconds(&self, sql: &str, queue: &str) -> Result<Option<std::time::Duration>> {
        let secs: Option<f64> = sqlx::query_scalar(sql)
            .bind(queue)
            .fetch_one(self.db())
            .await?;
        Ok(secs.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))))
    }

    /// Where a job is now: `available`, `running`, `scheduled`, `retryable`, `completed`,
    /// `failed`, `cancelled` or `dead_lettered`; `None` when unknown (or its history has aged out).
    pub async fn job_state(&self, job_id: i64) -> Result<Option<JobState>> {
        let mut tx = self.begin_job_lookup().await?;
        let state = self.job_state_in(&mut tx, job_id).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// A transaction for looking a job up, after any prune of a queue slot has committed. A
    /// slot's TRUNCATE is not MVCC-safe: a lookup whose snapshot predates a prune's commit and
    /// that then waits for the slot's locks would find the ring rows gone and the archive rows the
    /// prune wrote invisible, and call the job unknown. So the transaction first waits out any
    /// prune (ACCESS SHARE on the tables it truncates), and each lookup in it is a statement of
    /// its own, with a snapshot taken after (READ COMMITTED).
    pub(super) async fn begin_job_lookup(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql.read.job_state_locks)
            .execute(self.on(&mut tx))
            .await?;
        Ok(tx)
    }

    async fn job_state_in(
        &self,
        conn: &mut sqlx::PgConnection,
        job_id: i64,
    ) -> Result<Option<JobState>> {
        let row: Option<(String, String, String, i32, i64, Option<String>)> =
            sqlx::query_as(&self.sql.read.job_state)
                .bind(job_id)
                .fetch_optional(self.on(conn))
                .await?;
        row.map(|(state, queue, kind, attempt, run_lease, detail)| {
            Ok(JobState {
                job_id,
                state: state.parse()?,
                queue,
                kind,
                attempt,
                run_lease,
                detail,
            })
        })
        .transpose()
    }

    /// The job's current state and whatever history the schema still holds for it: terminal rows
    /// from `terminal_jobs`, its pending retry or schedule, its dead-letter entry. State and
    /// history are read in one lookup transaction (`begin_job_lookup`), so a prune committing
    /// meanwhile cannot take the history rows from under the state.
    pub async fn load_job(&self, job_id: i64) -> Result<Option<JobRecord>> {
        let mut tx = self.begin_job_lookup().await?;
        let Some(state) = self.job_state_in(&mut tx, job_id).await? else {
            tx.commit().await?;
            return Ok(None);
        };
        let rows: Vec<(i64, String, Option<String>, DateTime<Utc>)> =
            sqlx::query_as(&self.sql.read.job_history)
                .bind(job_id)
                .fetch_all(self.on(&mut tx))
                .await?;
        tx.commit().await?;
        let history = rows
            .into_iter()
            .map(|(run_lease, state, error, at)| {
                Ok(HistoryEntry {
                    run_lease,
                    state: state.parse()?,
                    error,
                    at,
                })
            })
            .collect::<Result<_>>()?;
        let progress = self.job_progress(job_id).await?;
        Ok(Some(JobRecord {
            state,
            history,
            progress,
        }))
    }

    /// The last progress recorded for the job: by its running attempt (as of its last heartbeat),
    /// or left by an earlier attempt that was retried, snoozed or rescued. `None` once the job
    /// ended, or when no attempt reported any.
    pub async fn job_progress(&self, job_id: i64) -> Result<Option<ProgressRecord>> {
        let row: Option<(i64, serde_json::Value, DateTime<Utc>)> =
            sqlx::query_as(&self.sql.read.job_progress)
                .bind(job_id)
                .fetch_optional(self.db())
                .await?;
        row.map(|(run_lease, progress, recorded_at)| {
            Ok(ProgressRecord {
                run_lease,
                progress: serde_json::from_value(progress).map_err(|e| {
                    crate::error::Error::SchemaMismatch {
                        schema: self.schema.as_str().to_string(),
                        reason: format!("job {job_id} has progress this binary cannot read: {e}"),
                    }
                })?,
                recorded_at,
            })
        })
        .transpose()
    }
}

/// A listing's argument text, marked when the database cut it.
pub(super) fn preview(text: String) -> String {
    match text.char_indices().nth(ARGS_PREVIEW_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

fn queue_counts_row(row: &sqlx::postgres::PgRow) -> Result<QueueCounts> {
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
        waiting: row.try_get("waiting")?,
        pending: row.try_get("pending")?,
    })
}
