//! A test kit for services that use ringwork (feature `testing`): a throwaway schema per test, jobs
//! run inline through their real handlers, and assertions on what a transaction enqueued. It runs
//! against a real PostgreSQL server, like ringwork's own tests.
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
//! let mails: Vec<SendEmail> = testing::enqueued(&mut tx, client.storage()).await?;
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

use serde::de::DeserializeOwned;
use sqlx::{PgConnection, PgPool};

use crate::error::{Error, Result};
use crate::job::{JobArgs, NewJob};
use crate::runtime::{Client, ClientBuilder};
use crate::schema::{RingSizes, SchemaName};
use crate::storage::Storage;

pub use crate::runtime::inline::{Drain, Drained, Run, RunOutcome};

static SCHEMAS: AtomicU32 = AtomicU32::new(0);

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

    /// A storage handle on this schema (direct, no transaction pooler).
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
    storage: &Storage,
) -> Result<Vec<A>> {
    storage
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
