//! A test kit for services that use ringwork (feature `testing`): a throwaway database or schema
//! per test, jobs run inline through their real handlers, and assertions on what a transaction
//! enqueued. It runs against a real PostgreSQL server, like ringwork's own tests.
//!
//! [`TestDatabase`] clones a database that was migrated once per schema version (a template), so a
//! test pays for a `CREATE DATABASE` (a fraction of a second) instead of a migration of a few
//! hundred tables; it needs a role that may create databases. [`TestSchema`] migrates a schema of
//! its own in the caller's database, for roles that may not.
//!
//! ```no_run
//! use ringwork::testing::{self, TestSchema};
//! # use ringwork::{JobArgs, JobContext, NewJob, QueueConfig};
//! # #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! # struct SendEmail { to: String }
//! # impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
//! # async fn send_email(_ctx: JobContext, _job: SendEmail) -> anyhow::Result<()> { Ok(()) }
//! # async fn signup(_tx: &mut sqlx::PgConnection, _c: &ringwork::Client) -> ringwork::Result<()> { Ok(()) }
//! # async fn test(pool: sqlx::PgPool) -> ringwork::Result<()> {
//! let schema = TestSchema::create(&pool).await?;
//! let client = schema.client().queue("default", QueueConfig::default()).register(send_email).build().await?;
//!
//! // what did my code enqueue in its transaction?
//! let mut tx = pool.begin().await?;
//! signup(&mut tx, &client).await?;
//! let mails: Vec<SendEmail> = testing::enqueued(&mut tx, &client.admin()).await?;
//! assert_eq!(mails, [SendEmail { to: "a@example.com".into() }]);
//! tx.commit().await?;
//!
//! // run the queue's jobs through their real handlers, here, until none is left
//! let drained = testing::drain(&client, "default").await?;
//! assert_eq!(drained.completed(), 1);
//! schema.drop().await?;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

use crate::error::{Error, Result};
use crate::job::{JobArgs, NewJob};
use crate::runtime::{Client, ClientBuilder};
use crate::schema::{RingSizes, SchemaName};
use crate::storage::Storage;

pub use crate::runtime::inline::{Drain, Drained, Run, RunOutcome};

static SCHEMAS: AtomicU32 = AtomicU32::new(0);
static DATABASES: AtomicU32 = AtomicU32::new(0);
/// The template this process clones, made (or found) by the first `TestDatabase::create`.
static TEMPLATE: OnceCell<String> = OnceCell::const_new();
/// The server this process's tests run on, chosen by the first `server_url`.
static SERVER_URL: OnceCell<String> = OnceCell::const_new();

/// The PostgreSQL server tests run on, chosen once per process: `DATABASE_URL` when it is set; else
/// `postgres://postgres@127.0.0.1:5432/test` when it answers within 3 s; else a throwaway cluster
/// from the installed server binaries ([`crate::embedded`]), stopped when the process exits.
pub async fn server_url() -> Result<String> {
    SERVER_URL
        .get_or_try_init(|| async {
            if let Ok(url) = std::env::var("DATABASE_URL") {
                return Ok(url);
            }
            let default = "postgres://postgres@127.0.0.1:5432/test".to_string();
            let reachable = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(3))
                .connect(&default)
                .await
                .is_ok();
            if reachable {
                return Ok(default);
            }
            let unstartable = |e: crate::embedded::EmbeddedError| {
                Error::Config(format!(
                    "no PostgreSQL server reachable at {default}, and none could be started: {e}"
                ))
            };
            crate::embedded::EmbeddedPostgres::start()
                .map_err(unstartable)?
                .stop_when_process_exits(std::process::id())
                .map_err(unstartable)
        })
        .await
        .cloned()
}

/// Maintenance for tests that watch it work: a tick every 50 ms and a rotation every 200 ms.
pub fn fast_maintenance() -> crate::MaintenanceConfig {
    crate::MaintenanceConfig {
        tick: Duration::from_millis(50),
        rotate_interval: Duration::from_millis(200),
        ..crate::MaintenanceConfig::default()
    }
}

/// Whether a program that a test needs beyond Rust and PostgreSQL (pgbouncer, a browser driver) is
/// installed: `found` is its path when it is. When it is not, the test should say so and return:
/// this prints `NOT RUN: <test> needs <program> ...` and returns `None`. With
/// `RINGWORK_TEST_REQUIRE_TOOLS` set (ringwork's CI sets it) it panics instead, so a CI run cannot
/// pass without the program.
pub fn tool_or_skip<T>(test: &str, program: &str, found: Option<T>) -> Option<T> {
    if found.is_some() {
        return found;
    }
    let install = "`apt-get install pgbouncer chromium chromium-driver` (see README, Tests)";
    if std::env::var_os("RINGWORK_TEST_REQUIRE_TOOLS").is_some_and(|v| !v.is_empty() && v != "0") {
        panic!("{test} needs {program}, which is not installed: {install}");
    }
    eprintln!("NOT RUN: {test} needs {program}, which is not installed: {install}");
    None
}

/// Insert one job (kind `approval`, arguments `{"order": 1}`) into `queue`, claim it and register
/// and await a callback for it, as a handler returning `JobError::WaitForCallback` would: the job
/// then waits for the callback id returned with its claim (for tests of a callback endpoint). The
/// insert runs on `conn`, outside any transaction of the caller's.
pub async fn waiting_for_callback(
    admin: &crate::Admin,
    conn: &mut PgConnection,
    queue: &str,
    max_attempts: i32,
    timeout: Duration,
) -> Result<(crate::ClaimedJob, String)> {
    let storage = admin.storage();
    storage
        .insert_many(
            conn,
            &[
                NewJob::from_parts("approval", serde_json::json!({ "order": 1 }))?
                    .queue(queue)
                    .max_attempts(max_attempts),
            ],
        )
        .await?;
    let claimed = storage
        .claim(queue, 1, None)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Config(format!("the job inserted into {queue:?} was not claimed")))?;
    let id = storage
        .register_callback(&claimed.attempt_ref(), timeout)
        .await?;
    match storage.await_callback(&claimed.attempt_ref()).await? {
        crate::AwaitOutcome::Waiting => Ok((claimed, id)),
        other => Err(Error::Config(format!(
            "the job did not wait for its callback: {other:?}"
        ))),
    }
}

/// Move the engine clock of `schema` forward by `by`, as if that much time had passed: the decisions
/// that read the engine's clock (stale and deadline rescue, claim times and deadlines, heartbeats,
/// rate windows, promotion of due jobs, callback timeouts, lane idleness) then see a later time.
/// The clock never moves back.
pub async fn advance_clock(pool: &PgPool, schema: &SchemaName, by: Duration) -> Result<()> {
    sqlx::query(&format!(
        "SELECT {schema}.advance_clock(make_interval(secs => $1))"
    ))
    .bind(by.as_secs_f64())
    .execute(pool)
    .await?;
    Ok(())
}

/// Poll `check` every 20 ms until it is true (then `true`) or `within` has passed (then `false`):
/// for a test that waits on work another task or process does, with a deadline instead of a guess.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The schema ringwork is migrated into in every test database (not the default `ringwork`, so a
/// name written into the code instead of the configured schema shows up in tests).
pub const TEST_DATABASE_SCHEMA: &str = "ringwork_test";
const TEST_DATABASE_PREFIX: &str = "ringwork_test_";
const TEMPLATE_PREFIX: &str = "ringwork_template_";
/// Serialises the making of a template across processes (an advisory lock in the server's
/// database): two test binaries started together build it once.
const TEMPLATE_LOCK_KEY: i64 = 0x7269_6e67_776f_726b;

/// A database of its own for one test: cloned from a template that holds a migrated ringwork
/// schema ([`TEST_DATABASE_SCHEMA`]), dropped by `drop`. The template is made once per schema
/// version (its name carries [`crate::schema::schema_checksum`]) and reused by later runs.
///
/// Databases left by a test process that died are dropped when a later process first makes or
/// finds the template, if that process runs on the server's host (a dead process id there means
/// its databases are orphans).
pub struct TestDatabase {
    server_url: String,
    name: String,
    url: String,
    pool: PgPool,
    schema: SchemaName,
}

impl TestDatabase {
    /// `create` on the server of [`server_url`].
    pub async fn new() -> Result<Self> {
        Self::create(&server_url().await?).await
    }

    /// Clone the template into a new database named `ringwork_test_<pid>_<n>_<random>` on the
    /// server of `server_url` (whose own database is only used to issue `CREATE DATABASE`).
    pub async fn create(server_url: &str) -> Result<Self> {
        let template = TEMPLATE
            .get_or_try_init(|| make_template(server_url))
            .await?
            .clone();
        let name = format!(
            "{TEST_DATABASE_PREFIX}{}_{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>() % 1_000_000
        );
        let mut admin = PgConnection::connect(server_url).await?;
        sqlx::raw_sql(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let url = database_url(server_url, &name)?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url)
            .await?;
        Ok(Self {
            server_url: server_url.to_string(),
            name,
            url,
            pool,
            schema: SchemaName::new(TEST_DATABASE_SCHEMA)?,
        })
    }

    /// The database's URL (the server's, with this database's name).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool of up to 8 connections to the database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The migrated schema ([`TEST_DATABASE_SCHEMA`]).
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// A client builder on the schema (add queues and handlers, then `build`).
    pub fn client(&self) -> ClientBuilder {
        Client::builder(self.pool.clone()).schema(self.schema.as_str())
    }

    /// The operator API on the schema (direct, no transaction pooler).
    pub fn admin(&self) -> crate::Admin {
        crate::Admin::from_storage(self.storage())
    }

    /// The engine's storage handle on the schema, for ringwork's own tests: not a stable API.
    #[doc(hidden)]
    pub fn storage(&self) -> Storage {
        Storage::new(self.pool.clone(), self.schema.clone())
    }

    /// Move the schema's engine clock forward by `by` (see [`advance_clock`]).
    pub async fn advance_clock(&self, by: Duration) -> Result<()> {
        advance_clock(&self.pool, &self.schema, by).await
    }

    /// The one `bigint` that `sql` returns, with `{s}` in it replaced by the schema's name.
    pub async fn scalar_i64(&self, sql: &str) -> Result<i64> {
        let sql = sql.replace("{s}", self.schema.as_str());
        Ok(sqlx::query_scalar::<_, i64>(&sql)
            .fetch_one(&self.pool)
            .await?)
    }

    /// Run `sql` (one or more statements, `{s}` replaced by the schema's name).
    pub async fn exec(&self, sql: &str) -> Result<()> {
        let sql = sql.replace("{s}", self.schema.as_str());
        sqlx::raw_sql(&sql).execute(&self.pool).await?;
        Ok(())
    }

    /// Close the pool and drop the database; sessions still connected to it (a child process, a
    /// leaked pool) are terminated.
    pub async fn drop(self) -> Result<()> {
        // `close` waits for checked-out connections; FORCE ends any that a test leaked
        let _ = tokio::time::timeout(Duration::from_secs(5), self.pool.close()).await;
        let mut admin = PgConnection::connect(&self.server_url).await?;
        sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .await?;
        admin.close().await?;
        Ok(())
    }
}

/// `server_url` with its database name replaced by `database`.
fn database_url(server_url: &str, database: &str) -> Result<String> {
    let mut url = url::Url::parse(server_url)
        .map_err(|e| Error::Config(format!("the server URL does not parse: {e}")))?;
    url.set_path(&format!("/{database}"));
    Ok(url.to_string())
}

/// Find the template for this binary's schema, or make it: create a database under a building
/// name, migrate it, then rename it (a template is never seen half made).
async fn make_template(server_url: &str) -> Result<String> {
    let checksum = crate::schema::schema_checksum();
    let name = format!("{TEMPLATE_PREFIX}{}", &checksum[..16]);
    let mut admin = PgConnection::connect(server_url).await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(TEMPLATE_LOCK_KEY)
        .execute(&mut admin)
        .await?;
    let made = make_template_locked(&mut admin, server_url, &name).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(TEMPLATE_LOCK_KEY)
        .execute(&mut admin)
        .await;
    made?;
    unlocked?;
    admin.close().await?;
    Ok(name)
}

async fn make_template_locked(
    admin: &mut PgConnection,
    server_url: &str,
    name: &str,
) -> Result<()> {
    drop_orphans(admin, server_url).await?;
    let databases: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname",
    )
    .bind(TEMPLATE_PREFIX)
    .fetch_all(&mut *admin)
    .await?;
    if databases.iter().any(|d| d == name) {
        return Ok(());
    }
    // templates of other schema versions: best effort (another run may be cloning one)
    for old in &databases {
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {old}"))
            .execute(&mut *admin)
            .await;
    }
    let building = format!("{name}_building");
    // one statement per call: several in one simple query run as one transaction block
    for statement in [
        format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
        format!("CREATE DATABASE {building}"),
    ] {
        sqlx::raw_sql(&statement).execute(&mut *admin).await?;
    }
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&database_url(server_url, &building)?)
        .await?;
    let schema = SchemaName::new(TEST_DATABASE_SCHEMA)?;
    crate::schema::migrate(&pool, &schema, RingSizes::default()).await?;
    pool.close().await;
    // A rename refuses a database that has a session (55006), after waiting 5 s for it to leave.
    // The closed pool's backend may still be exiting, and a connection the pool was returning while
    // it closed can stay open (seen once: the rename retried for minutes behind an idle session).
    // Nobody else knows the building name, so its sessions are ours to end.
    let rename = format!("ALTER DATABASE {building} RENAME TO {name}");
    for _ in 0..10 {
        match sqlx::raw_sql(&rename).execute(&mut *admin).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") => {
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                )
                .bind(&building)
                .execute(&mut *admin)
                .await?;
            }
            done => return done.map(|_| ()).map_err(Into::into),
        }
    }
    sqlx::raw_sql(&rename).execute(&mut *admin).await?;
    Ok(())
}

/// Drop the test databases of processes that no longer run, when the server runs on this host
/// (elsewhere a process id says nothing) and nobody is connected to them.
async fn drop_orphans(admin: &mut PgConnection, server_url: &str) -> Result<()> {
    let local = url::Url::parse(server_url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_string))
        .is_none_or(|host| matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]" | "::1"));
    if !local || !std::path::Path::new("/proc/self").exists() {
        return Ok(());
    }
    let unused: Vec<String> = sqlx::query_scalar(
        "SELECT d.datname FROM pg_database d
         WHERE starts_with(d.datname, $1)
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)",
    )
    .bind(TEST_DATABASE_PREFIX)
    .fetch_all(&mut *admin)
    .await?;
    for database in unused {
        let pid = database
            .strip_prefix(TEST_DATABASE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {database}"))
            .execute(&mut *admin)
            .await;
    }
    Ok(())
}

/// A schema of its own for one test: migrated on `create`, dropped (with everything in it) by
/// `drop`. Tests that run in parallel on one database never see each other's jobs.
pub struct TestSchema {
    pool: PgPool,
    schema: SchemaName,
}

impl TestSchema {
    /// Create and migrate a schema named `ringwork_test_<pid>_<n>_<random>`.
    pub async fn create(pool: &PgPool) -> Result<Self> {
        let name = format!(
            "ringwork_test_{}_{}_{}",
            std::process::id(),
            SCHEMAS.fetch_add(1, Ordering::Relaxed),
            rand::random::<u32>() % 1_000_000
        );
        let schema = SchemaName::new(&name)?;
        crate::schema::migrate(pool, &schema, RingSizes::default()).await?;
        Ok(Self {
            pool: pool.clone(),
            schema,
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        self.schema.as_str()
    }

    /// A client builder on this schema (add queues and handlers, then `build`).
    pub fn client(&self) -> ClientBuilder {
        Client::builder(self.pool.clone()).schema(self.schema.as_str())
    }

    /// The operator API on this schema (direct, no transaction pooler).
    pub fn admin(&self) -> crate::Admin {
        crate::Admin::from_storage(self.storage())
    }

    /// The engine's storage handle on this schema, for ringwork's own tests: not a stable API.
    #[doc(hidden)]
    pub fn storage(&self) -> Storage {
        Storage::new(self.pool.clone(), self.schema.clone())
    }

    /// Drop the schema and everything in it.
    pub async fn drop(self) -> Result<()> {
        crate::schema::drop_schema(&self.pool, &self.schema).await
    }
}

/// Run `queue`'s available jobs through their registered handlers, in this task, until none is
/// left; jobs that are scheduled, or retried with a backoff, are left for their time (see
/// `drain_with`). The client need not be started. Each job is settled as in a started client:
/// completed, retried, failed or dead-lettered.
pub async fn drain(client: &Client, queue: &str) -> Result<Drained> {
    drain_with(client, queue, Drain::default()).await
}

/// `drain` with options: `Drain { with_scheduled: true, .. }` also runs scheduled and retryable
/// jobs at once, so a job that keeps failing runs until its attempts are used up.
pub async fn drain_with(client: &Client, queue: &str, options: Drain) -> Result<Drained> {
    crate::runtime::inline::drain(client.inner(), queue, &options, None).await
}

/// Insert `job` and run its queue until it has run once; returns that run. Jobs ahead of it in its
/// queue run first.
pub async fn run_job(client: &Client, job: NewJob) -> Result<Run> {
    let queue = job.queue.clone();
    let job_id = client.insert(job).await?;
    let drained = crate::runtime::inline::drain(
        client.inner(),
        &queue,
        &Drain {
            with_scheduled: false,
            max_runs: usize::MAX,
        },
        Some(job_id),
    )
    .await?;
    drained
        .runs
        .into_iter()
        .find(|run| run.job_id == job_id)
        .ok_or_else(|| {
            Error::Config(format!(
                "job {job_id} did not run: its queue {queue:?} is paused, or it is scheduled for later"
            ))
        })
}

/// The arguments of every job of kind `A::KIND` waiting to run (available, scheduled or
/// retryable), oldest first, as seen on `conn`: on a transaction, the jobs it enqueued and has not
/// committed are included. Arguments that do not decode as `A` are an error.
pub async fn enqueued<A: JobArgs + DeserializeOwned>(
    conn: &mut PgConnection,
    admin: &crate::Admin,
) -> Result<Vec<A>> {
    admin
        .storage()
        .pending_jobs(conn, None, Some(A::KIND), 10_000)
        .await?
        .into_iter()
        .map(|job| {
            serde_json::from_value(job.args).map_err(|e| Error::InvalidArgs {
                kind: A::KIND.to_string(),
                reason: format!("job {} does not decode: {e}", job.job_id),
            })
        })
        .collect()
}
