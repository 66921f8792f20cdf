//! Shared support for the library's own tests: `TestDb` (a database per test from
//! `ringwork::testing`, optionally behind pgbouncer) and the ring helpers the engine's tests share.
//!
//! The server is `ringwork::testing::server_url`'s: `DATABASE_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, else a throwaway cluster started once per test binary.
#![allow(dead_code)]

use std::time::Duration;

use ringwork::testing::TestDatabase;
use ringwork::{Client, ClientBuilder, MaintenanceConfig, NewJob, SchemaName, Storage};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::OnceCell;

pub use ringwork::embedded;
pub mod pgbouncer;

/// With `RINGWORK_TEST_PGBOUNCER` set: one pgbouncer (transaction mode) per test binary, in front
/// of the test server; it stops with the process.
static BOUNCER: OnceCell<pgbouncer::PgBouncer> = OnceCell::const_new();

/// Whether `TestDb::client` and `TestDb::storage` go through a transaction-mode pgbouncer
/// (`RINGWORK_TEST_PGBOUNCER=1`; `.ci/run` runs some test binaries so). Raw SQL of the tests and
/// migrations stay on the direct pool.
pub fn through_pgbouncer() -> bool {
    std::env::var_os("RINGWORK_TEST_PGBOUNCER").is_some_and(|v| !v.is_empty() && v != "0")
}

async fn server_url() -> String {
    ringwork::testing::server_url()
        .await
        .expect("a PostgreSQL server for the tests")
}

/// One test's database: a clone of the kit's migrated template (`ringwork::testing::TestDatabase`),
/// dropped by `cleanup`.
pub struct TestDb {
    pub url: String,
    pub pool: PgPool,
    pub schema: SchemaName,
    /// A pool through pgbouncer, when `through_pgbouncer()`.
    pub bounced: Option<PgPool>,
    database: TestDatabase,
}

impl TestDb {
    pub async fn new() -> Self {
        let server = server_url().await;
        let database = TestDatabase::create(&server)
            .await
            .expect("a test database cloned from the template");
        let bounced = if through_pgbouncer() {
            let bouncer = BOUNCER
                .get_or_init(|| async { pgbouncer::PgBouncer::start(&server, 4) })
                .await;
            Some(bouncer.pool_for(database.name(), 12).await)
        } else {
            None
        };
        Self {
            url: database.url().to_string(),
            pool: database.pool().clone(),
            schema: database.schema().clone(),
            bounced,
            database,
        }
    }

    pub async fn connect(url: &str, max: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
            .expect("connect")
    }

    /// Storage on this schema (through pgbouncer when `through_pgbouncer()`).
    pub fn storage(&self) -> Storage {
        match &self.bounced {
            Some(bounced) => Storage::new(bounced.clone(), self.schema.clone())
                .behind_transaction_pooler(Some(self.pool.clone())),
            None => Storage::new(self.pool.clone(), self.schema.clone()),
        }
    }

    /// A client builder on this schema with fast maintenance (through pgbouncer when
    /// `through_pgbouncer()`, with the direct pool as its session pool).
    pub fn client(&self) -> ClientBuilder {
        let builder = match &self.bounced {
            Some(bounced) => {
                Client::builder(bounced.clone()).transaction_pooler(Some(self.pool.clone()))
            }
            None => Client::builder(self.pool.clone()),
        };
        builder
            .schema(self.schema.as_str())
            .maintenance(fast_maintenance())
    }

    /// Move the engine clock forward by `by` instead of sleeping.
    pub async fn advance_clock(&self, by: Duration) {
        self.database
            .advance_clock(by)
            .await
            .expect("advance the engine clock");
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        self.database
            .scalar_i64(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn exec(&self, sql: &str) {
        self.database
            .exec(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn cleanup(self) {
        if let Some(bounced) = self.bounced {
            bounced.close().await;
        }
        if let Err(e) = self.database.drop().await {
            eprintln!("cleanup: the test database was not dropped: {e}");
        }
    }
}

#[allow(unused_imports)] // each test binary uses a part of it
pub use ringwork::testing::{fast_maintenance, tool_or_skip};

/// Maintenance that never runs (for tests that drive it by hand).
pub fn no_maintenance() -> MaintenanceConfig {
    MaintenanceConfig {
        enabled: false,
        ..MaintenanceConfig::default()
    }
}

#[allow(unused_imports)] // each test binary uses a part of it
pub use ringwork::testing::eventually;

/// The backend of a client's LISTEN session on `channel` (its schema's `ringwork_<schema>`, or
/// a signal's `ringwork_<schema>.cancel`) in the test's database (other tests' schemas share the name), once the
/// client has issued it; None if it has not within 10 s.
pub async fn listener_pid(db: &TestDb, channel: &str) -> Option<i32> {
    let found = std::sync::Mutex::new(None);
    eventually(Duration::from_secs(10), || async {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE query LIKE 'LISTEN%' AND position($1 in query) > 0 \
               AND datname = current_database() LIMIT 1",
        )
        .bind(channel)
        .fetch_optional(&db.pool)
        .await
        .unwrap();
        *found.lock().unwrap() = pid;
        pid.is_some()
    })
    .await;
    found.into_inner().unwrap()
}

/// A job of kind `count` that the runtime tests register a handler for.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Count {
    pub n: u64,
}

impl ringwork::JobArgs for Count {
    const KIND: &'static str = "count";
}

/// A queue of `workers` handlers that claims up to 64 jobs at a time and polls every 50 ms.
pub fn queue(workers: usize) -> ringwork::QueueConfig {
    ringwork::QueueConfig {
        max_workers: workers,
        claim_batch: 64,
        poll_interval: Duration::from_millis(50),
        ..ringwork::QueueConfig::default()
    }
}

/// Insert `jobs` in one call on a connection of their own, reporting for each whether it was
/// inserted or found its unique key held.
pub async fn insert_reporting(db: &TestDb, jobs: &[NewJob]) -> Vec<ringwork::Inserted> {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage()
        .insert_many_reporting(&mut conn, jobs)
        .await
        .unwrap()
}

/// Complete one claimed attempt in a batch of its own: its outcome.
pub async fn complete_one(storage: &Storage, claimed: &ringwork::ClaimedJob) -> ringwork::Outcome {
    let mut outcomes = storage
        .complete_batch(&[claimed.attempt_ref()])
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 1, "one outcome per attempt");
    outcomes.remove(0)
}

/// A job of kind `noop` with arguments `{"n": n}`: what the storage tests claim and complete.
pub fn job(n: i64) -> NewJob {
    NewJob::from_parts("noop", serde_json::json!({ "n": n })).unwrap()
}

/// Insert `jobs` in one call on a connection of their own (committed at once); their ids, in order.
pub async fn enqueue(db: &TestDb, jobs: Vec<NewJob>) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage().insert_many(&mut conn, &jobs).await.unwrap()
}

/// The job's state as its name (`available`, `running`, ...), or empty when no job has the id.
pub async fn state(db: &TestDb, id: i64) -> String {
    db.storage()
        .job_state(id)
        .await
        .unwrap()
        .map(|s| s.state.to_string())
        .unwrap_or_default()
}

/// Seal both rings' current slots and prune every sealed slot of both (prune's lock timeout
/// 25 ms; failed and cancelled history kept 7 days): the ring's history moves to the archive.
pub async fn rotate_and_prune(
    storage: &Storage,
    keep_completed: Duration,
) -> Vec<ringwork::PruneResult> {
    let no_wait = Duration::from_millis(25);
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    for slot in storage.sealed_claim_slots().await.unwrap() {
        storage.prune_claim_slot(slot, no_wait).await.unwrap();
    }
    let options = ringwork::QueueSlotPrune {
        lock_timeout: no_wait,
        keep_completed,
        keep_failed: Duration::from_secs(7 * 24 * 3600),
        park_idle: None,
    };
    let mut results = Vec::new();
    for slot in storage.sealed_queue_slots().await.unwrap() {
        results.push(storage.prune_queue_slot_with(slot, &options).await.unwrap());
    }
    results
}

/// One job (kind `approval`) inserted into `queue` and claimed, its callback registered and
/// awaited: the job waits in the lease ring. Returns the claim and the callback id.
pub async fn waiting_job(
    db: &TestDb,
    storage: &Storage,
    queue: &str,
    max_attempts: i32,
    timeout: Duration,
) -> (ringwork::ClaimedJob, String) {
    let mut conn = db.pool.acquire().await.unwrap();
    ringwork::testing::waiting_for_callback(
        &storage.clone().into(),
        &mut conn,
        queue,
        max_attempts,
        timeout,
    )
    .await
    .expect("a job waiting for its callback")
}

/// Seal the current slots of both rings (their jobs already completed), prune the claim slots, and
/// start the prune of the sealed queue slot in a transaction left open: its children locked and
/// truncated, its totals, archive (completed jobs kept a day) and ledger rows not yet visible.
/// Commit it to finish the prune.
pub async fn prune_held_open(db: &TestDb) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let storage = db.storage();
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    for slot in storage.sealed_claim_slots().await.unwrap() {
        storage
            .prune_claim_slot(slot, Duration::from_millis(25))
            .await
            .unwrap();
    }
    let slot = storage.sealed_queue_slots().await.unwrap()[0];
    let mut pruner = db.pool.begin().await.unwrap();
    let pruned: String = sqlx::query_scalar(&format!(
        "SELECT {}.prune_queue_slot($1, '25ms', interval '1 day', interval '7 days', NULL)",
        db.schema
    ))
    .bind(slot)
    .fetch_one(&mut *pruner)
    .await
    .unwrap();
    assert_eq!(pruned, "pruned");
    pruner
}

/// Whether exactly one session of the test's database waits for a lock, within 10 s.
pub async fn one_waits_for_a_lock(db: &TestDb) -> bool {
    eventually(Duration::from_secs(10), || async {
        db.scalar_i64(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await
            == 1
    })
    .await
}

/// A session holding the producer lock of every shard of `queue` but `lane`, so the next enqueue
/// into the queue (at the lane's priority) writes `lane`: a test that needs the same shard's next
/// segment from another transaction. The locks go with the session.
pub async fn hold_every_shard_but(db: &TestDb, queue: &str, lane: i32) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_lock({s}.lock_ns('shard'), l.lane_id) FROM {s}.queue_lanes l \
         WHERE l.queue = $1 AND l.lane_id <> $2",
        s = db.schema
    ))
    .bind(queue)
    .bind(lane)
    .execute(&mut holder)
    .await
    .unwrap();
    holder
}

/// `claim()` of up to `max` jobs of `queue` inside a transaction left open: the claim's shard stays
/// locked until the caller commits or rolls back. Returns the transaction and the claimed job ids.
pub async fn claim_in_open_transaction(
    db: &TestDb,
    queue: &str,
    max: i32,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, Vec<i64>) {
    let mut tx = db.pool.begin().await.unwrap();
    let taken: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT job_id FROM {}.claim($1, $2, NULL, NULL)",
        db.schema
    ))
    .bind(queue)
    .bind(max)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    (tx, taken)
}
