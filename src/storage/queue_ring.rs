//! Queue plane: lanes and enqueue into the queue ring (`sql/functions/queue_ring.sql`).
//!
//! An enqueue reserves a contiguous lane range and appends `ready_entries` (COPY for large groups)
//! and one `ready_segments` row per range, in the caller's transaction; future jobs go to
//! `deferred_jobs`, unique jobs through the unique-key lock.

use chrono::{DateTime, Utc};
use sqlx::{Executor, PgConnection, Row};

use super::Storage;
use crate::error::Result;
use crate::job::NewJob;
use crate::schema::SchemaName;

/// Whether the connection is inside a transaction block, as a simple query (no parameters): its
/// statement and transaction start together only when it is a transaction of its own.
const IN_TRANSACTION_BLOCK: &str = "SELECT statement_timestamp() <> transaction_timestamp()";

/// Groups at or below this size go through one `enqueue_jobs` call; larger ones through COPY.
const COPY_THRESHOLD: usize = 64;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    enqueue_jobs: String,
    schedule_jobs: String,
    reserve_segment: String,
    copy_ready: String,
    ensure_lane: String,
    lane_exists: String,
    insert_unique: String,
    enqueue_in_sequence_many: String,
    max_args_bytes: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            enqueue_jobs: format!("SELECT * FROM {s}.enqueue_jobs($1, $2, $3, $4, $5, $6, $7)"),
            schedule_jobs: format!(
                "SELECT * FROM {s}.schedule_jobs($1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            reserve_segment: format!(
                "SELECT g.ready_slot, g.lane_id, g.base_pos,
                        ARRAY(SELECT nextval('{s}.job_ids') FROM generate_series(1, $3)) AS job_ids
                 FROM {s}.enqueue_segment($1, $2, $3) g"
            ),
            copy_ready: format!(
                "COPY {s}.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority, \
                 attempt, run_lease, max_attempts, timeout_ms, traceparent) FROM STDIN (FORMAT csv)"
            ),
            ensure_lane: format!("SELECT 1 FROM {s}.ensure_lane($1, $2)"),
            lane_exists: format!(
                "SELECT count(*) = {s}.lane_base_shards() FROM {s}.queue_lanes
                 WHERE queue = $1 AND priority = $2 AND shard < {s}.lane_base_shards()"
            ),
            enqueue_in_sequence_many: format!(
                "SELECT ord, job_id FROM {s}.enqueue_in_sequence_many($1, $2, $3)"
            ),
            insert_unique: format!(
                "SELECT o_job_id, o_inserted FROM {s}.insert_unique($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            ),
            max_args_bytes: format!("SELECT {s}.setting('max_args_bytes')"),
        }
    }
}

impl Storage {
    /// The schema's limit on a job's arguments (JSON text, bytes), read once per process: the
    /// COPY path writes rows without the SQL API's checks, so the client applies the limit itself.
    /// Read on the caller's connection: a producer holding a pool connection in its transaction
    /// must not wait for a second one.
    async fn max_args_bytes(&self, conn: &mut PgConnection) -> Result<i64> {
        if let Some(limit) = self.max_args_bytes.get() {
            return Ok(*limit);
        }
        let limit: i64 = sqlx::query_scalar(&self.sql.queue_ring.max_args_bytes)
            .fetch_one(self.on(conn))
            .await?;
        let _ = self.max_args_bytes.set(limit);
        Ok(limit)
    }
}

/// Does `insert_groups` write these jobs with one statement? One (queue, priority, due or future)
/// group small enough for `enqueue_jobs` (or any size when scheduled), or one unique job.
fn single_statement(jobs: &[NewJob], now: DateTime<Utc>) -> bool {
    match jobs {
        [] => true,
        [_] => true,
        [first, rest @ ..] => {
            let same_group = |job: &NewJob| {
                job.unique.is_none()
                    && job.sequence.is_none()
                    && job.queue == first.queue
                    && job.priority == first.priority
                    && job.is_future(now) == first.is_future(now)
            };
            first.unique.is_none()
                && first.sequence.is_none()
                && rest.iter().all(same_group)
                && (first.is_future(now) || jobs.len() <= COPY_THRESHOLD)
        }
    }
}

/// One job as an insert writes it: its validated args as JSON text, and its W3C traceparent.
struct Encoded {
    args: String,
    traceparent: Option<String>,
}

/// What an insert did with one job: `duplicate` is true when a unique job's key was already held
/// and `job_id` is the holder's id (nothing was inserted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// The new job's id, or, for a duplicate, the id of the job holding the key.
    pub job_id: i64,
    /// A unique job's key was already held: nothing was inserted.
    pub duplicate: bool,
}

impl Storage {
    /// Create the queue and its lane at the default priority in a transaction of its own, once per
    /// process. A queue's other priorities get their lanes when a job first uses them
    /// (`ensure_lane`).
    pub async fn ensure_queue(&self, queue: &str) -> Result<()> {
        self.ensure_lane(queue, crate::job::DEFAULT_PRIORITY).await
    }

    /// Create the lane of (queue, priority), its base shards, in a transaction of its own, once per
    /// process. Creating a lane inside a caller's transaction would hold the lane-creation lock
    /// until that transaction ends and block every other producer of the queue. Only the
    /// priorities a queue uses get lanes: every claim reads each lane's segment sequence, and a
    /// sequence read opens and locks a relation.
    pub async fn ensure_lane(&self, queue: &str, priority: i16) -> Result<()> {
        crate::job::validate_name("queue name", queue)?;
        crate::job::validate_priority(priority)?;
        if self.lane_known(queue, priority) {
            return Ok(());
        }
        sqlx::query(&self.sql.queue_ring.ensure_lane)
            .bind(queue)
            .bind(priority)
            .execute(self.db())
            .await?;
        self.learn_lane(queue, priority);
        Ok(())
    }

    fn lane_known(&self, queue: &str, priority: i16) -> bool {
        self.known_lanes
            .lock()
            .map(|known| known.contains(&(queue.to_string(), priority)))
            .unwrap_or(false)
    }

    fn learn_lane(&self, queue: &str, priority: i16) {
        if let Ok(mut known) = self.known_lanes.lock() {
            known.insert((queue.to_string(), priority));
        }
    }

    /// `ensure_lane` for an insert on `conn`: when the lane already exists (the common case for a
    /// process that has not seen it yet) this is learnt on `conn` itself, so a producer holding a
    /// transaction never needs a second pool connection, and a pool's worth of concurrent
    /// transactional producers cannot starve one another. Only a lane's first use anywhere takes a
    /// pool connection to create it.
    async fn ensure_lane_from(
        &self,
        conn: &mut PgConnection,
        queue: &str,
        priority: i16,
    ) -> Result<()> {
        crate::job::validate_name("queue name", queue)?;
        crate::job::validate_priority(priority)?;
        if self.lane_known(queue, priority) {
            return Ok(());
        }
        let exists: bool = sqlx::query_scalar(&self.sql.queue_ring.lane_exists)
            .bind(queue)
            .bind(priority)
            .fetch_one(self.on(conn))
            .await?;
        if exists {
            self.learn_lane(queue, priority);
            return Ok(());
        }
        self.ensure_lane(queue, priority).await
    }

    /// `ensure_lane_from` for the lane of each of `jobs`, each lane once.
    pub(crate) async fn ensure_lanes_from<'a>(
        &self,
        conn: &mut PgConnection,
        jobs: impl Iterator<Item = &'a NewJob>,
    ) -> Result<()> {
        let mut lanes: Vec<(&str, i16)> = Vec::new();
        for job in jobs {
            let lane = (job.queue.as_str(), job.priority);
            if !lanes.contains(&lane) {
                lanes.push(lane);
            }
        }
        for (queue, priority) in lanes {
            self.ensure_lane_from(conn, queue, priority).await?;
        }
        Ok(())
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
        // each job's args as JSON text, and its trace: its own, else the span this insert runs in
        // (the span is the same for the whole call: looked up once, and only if a job needs it)
        let mut ambient: Option<Option<String>> = None;
        let texts = jobs
            .iter()
            .map(|job| {
                let traceparent = match &job.traceparent {
                    Some(own) => Some(own.clone()),
                    None => ambient
                        .get_or_insert_with(crate::trace_context::current_traceparent)
                        .clone(),
                };
                Ok(Encoded {
                    args: job.validate()?,
                    traceparent,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let max_args_bytes = self.max_args_bytes(conn).await?;
        for (job, text) in jobs.iter().zip(&texts) {
            if text.args.len() as i64 > max_args_bytes {
                return Err(crate::Error::InvalidArgs {
                    kind: job.kind.clone(),
                    reason: format!(
                        "arguments are {} bytes of JSON, over the schema's max_args_bytes ({max_args_bytes})",
                        text.args.len()
                    ),
                });
            }
        }
        // One statement is atomic on its own: no transaction of ours around it, so it also never
        // touches a transaction the caller opened with a raw `BEGIN` (sqlx cannot see those).
        // Behind a transaction pooler a statement needs a transaction around it, so a connection
        // sqlx knows no transaction of takes the path below, which finds or opens one.
        // one clock for the check and the grouping, so both see the same due and future jobs
        let now = Utc::now();
        let in_known_transaction = sqlx::Connection::is_in_transaction(&*conn);
        if single_statement(jobs, now) && (in_known_transaction || !self.transaction_pooler()) {
            return self.insert_groups(conn, jobs, &texts, now).await;
        }
        // Several statements, all or nothing: a savepoint inside the caller's transaction, a
        // transaction of their own otherwise (a COPY group's segment must not commit without its
        // rows). When sqlx knows of no transaction, the caller may have opened one with a raw
        // `BEGIN`, and committing our own `BEGIN` there would commit the caller's transaction
        // early. Inside a transaction block a statement starts after its transaction (the BEGIN
        // was an exchange of its own); outside one, a simple query is its own transaction and both
        // start at the same instant. Asking that, rather than trying a SAVEPOINT, leaves no ERROR
        // in the server's log for every bulk insert outside a transaction. A SAVEPOINT refused
        // all the same (25P01) still means a plain connection. (These statements have no
        // parameters and go as simple queries: one exchange, safe behind a transaction pooler.)
        let in_block = !in_known_transaction
            && conn
                .fetch_one(IN_TRANSACTION_BLOCK)
                .await?
                .try_get::<bool, _>(0)?;
        if in_block {
            match conn.execute("SAVEPOINT ringwork_insert").await {
                Ok(_) => {
                    let inserted = self.insert_groups(conn, jobs, &texts, now).await;
                    if inserted.is_err() {
                        conn.execute("ROLLBACK TO SAVEPOINT ringwork_insert")
                            .await?;
                    }
                    conn.execute("RELEASE SAVEPOINT ringwork_insert").await?;
                    return inserted;
                }
                // 25P01 no_active_sql_transaction: a plain connection
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("25P01") => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let ids = self.insert_groups(&mut tx, jobs, &texts, now).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Write the jobs (their lanes first, if this process has not seen them) on `conn`.
    async fn insert_groups(
        &self,
        conn: &mut PgConnection,
        jobs: &[NewJob],
        texts: &[Encoded],
        now: DateTime<Utc>,
    ) -> Result<Vec<Inserted>> {
        self.ensure_lanes_from(conn, jobs.iter()).await?;
        let mut ids: Vec<Inserted> = (0..jobs.len())
            .map(|_| Inserted {
                job_id: 0,
                duplicate: false,
            })
            .collect();
        // group by lane (immediate) or by (queue, priority) for the backlog, keeping input order
        let mut groups: Vec<((String, i16, bool), Vec<usize>)> = Vec::new();
        let mut unique: Vec<(String, usize)> = Vec::new();
        let mut sequenced: Vec<usize> = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            if job.sequence.is_some() {
                sequenced.push(index);
                continue;
            }
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
            let traceparents: Vec<Option<&str>> = members
                .iter()
                .map(|&i| texts[i].traceparent.as_deref())
                .collect();
            let group_ids: Vec<i64> = if future {
                let args: Vec<serde_json::Value> =
                    members.iter().map(|&i| jobs[i].args.clone()).collect();
                let run_at: Vec<DateTime<Utc>> = members
                    .iter()
                    .map(|&i| jobs[i].run_at.unwrap_or(now))
                    .collect();
                sqlx::query_scalar(&self.sql.queue_ring.schedule_jobs)
                    .bind(&queue)
                    .bind(priority)
                    .bind(&kinds)
                    .bind(&args)
                    .bind(&max_attempts)
                    .bind(&run_at)
                    .bind(&timeouts)
                    .bind(&traceparents)
                    .fetch_all(self.on(conn))
                    .await?
            } else if members.len() <= COPY_THRESHOLD {
                let args: Vec<serde_json::Value> =
                    members.iter().map(|&i| jobs[i].args.clone()).collect();
                sqlx::query_scalar(&self.sql.queue_ring.enqueue_jobs)
                    .bind(&queue)
                    .bind(priority)
                    .bind(&kinds)
                    .bind(&args)
                    .bind(&max_attempts)
                    .bind(&timeouts)
                    .bind(&traceparents)
                    .fetch_all(self.on(conn))
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
            let (job_id, inserted): (i64, bool) =
                sqlx::query_as(&self.sql.queue_ring.insert_unique)
                    .bind(&key)
                    .bind(&states)
                    .bind(&job.queue)
                    .bind(job.priority)
                    .bind(&job.kind)
                    .bind(&job.args)
                    .bind(job.max_attempts)
                    .bind(job.run_at)
                    .bind(job.timeout_ms())
                    .bind(texts[index].traceparent.as_deref())
                    .fetch_one(self.on(conn))
                    .await?;
            ids[index] = Inserted {
                job_id,
                duplicate: !inserted,
            };
        }
        // Jobs of a sequence in one statement, keys in order (two producers appending to the
        // same keys take their locks in the same order), each key's jobs in input order
        let mut appends: Vec<(usize, &str, &str)> = sequenced
            .iter()
            .filter_map(|&index| {
                let (key, on_failure) = jobs[index].sequence.as_ref()?;
                Some((index, key.as_str(), on_failure.as_str()))
            })
            .collect();
        if appends.is_empty() {
            return Ok(ids);
        }
        appends.sort_by(|a, b| a.1.cmp(b.1));
        let keys: Vec<&str> = appends.iter().map(|a| a.1).collect();
        let policies: Vec<&str> = appends.iter().map(|a| a.2).collect();
        let jsons = appends
            .iter()
            .map(|a| crate::workflow::job_json(&jobs[a.0], &texts[a.0].traceparent, "sequence job"))
            .collect::<Result<Vec<_>>>()?;
        let appended: Vec<(i32, i64)> =
            sqlx::query_as(&self.sql.queue_ring.enqueue_in_sequence_many)
                .bind(&keys)
                .bind(&jsons)
                .bind(&policies)
                .fetch_all(self.on(conn))
                .await?;
        for (ord, job_id) in appended {
            let index = usize::try_from(ord - 1)
                .ok()
                .and_then(|at| appends.get(at))
                .map(|a| a.0)
                .ok_or_else(|| {
                    crate::Error::Database(sqlx::Error::Protocol(format!(
                        "enqueue_in_sequence_many returned position {ord} of {}",
                        appends.len()
                    )))
                })?;
            ids[index] = Inserted {
                job_id,
                duplicate: false,
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
        texts: &[Encoded],
    ) -> Result<Vec<i64>> {
        let row = sqlx::query(&self.sql.queue_ring.reserve_segment)
            .bind(queue)
            .bind(priority)
            .bind(members.len() as i32)
            .fetch_one(self.on(conn))
            .await?;
        let slot: i32 = row.try_get("ready_slot")?;
        let lane: i32 = row.try_get("lane_id")?;
        let base: i64 = row.try_get("base_pos")?;
        let ids: Vec<i64> = row.try_get("job_ids")?;
        let mut csv = String::with_capacity(members.len() * 128);
        for (ordinal, (&index, id)) in members.iter().zip(&ids).enumerate() {
            let job = &jobs[index];
            csv.push_str(&format!(
                "{slot},{lane},{},{id},{},{},{},{priority},0,0,{},{},{}\n",
                base + ordinal as i64,
                csv_quote(queue),
                csv_quote(&job.kind),
                csv_quote(&texts[index].args),
                job.max_attempts,
                // an unquoted empty CSV field is NULL
                job.timeout_ms().map(|t| t.to_string()).unwrap_or_default(),
                // validated: a bytea literal of hex digits, safe unquoted
                texts[index]
                    .traceparent
                    .as_deref()
                    .map(crate::trace_context::copy_literal)
                    .unwrap_or_default()
            ));
        }
        let mut copy = conn.copy_in_raw(&self.sql.queue_ring.copy_ready).await?;
        copy.send(csv.into_bytes()).await?;
        copy.finish().await?;
        Ok(ids)
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
