//! Least privilege, against real roles: the schema's owner migrates and grants
//! (`ringwork::roles::grant_statements`); a producer enqueues (a new queue included) and a worker
//! claims, completes and runs maintenance as roles without CREATE on the schema; a reader reads
//! every count and listing but cannot write, cannot create lanes, and cannot read the callback key.

mod support;

use std::time::Duration;

use ringwork::roles::{grant_statements, Access};
use ringwork::{
    JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig, SchemaName, Storage,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use support::{eventually, fast_maintenance, TestDb};

#[derive(Serialize, Deserialize)]
struct Chore {
    n: i64,
}

impl JobArgs for Chore {
    const KIND: &'static str = "roles_chore";
}

/// Cluster-wide roles for one test, dropped by `drop`.
struct Roles {
    admin: PgPool,
    names: Vec<String>,
}

impl Roles {
    async fn create(admin: &PgPool, names: &[String]) -> Self {
        for name in names {
            sqlx::query(&format!("CREATE ROLE {name} LOGIN"))
                .execute(admin)
                .await
                .unwrap();
        }
        Self {
            admin: admin.clone(),
            names: names.to_vec(),
        }
    }

    async fn drop(self, schema: &SchemaName) {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&self.admin)
            .await;
        for name in &self.names {
            let _ = sqlx::query(&format!("DROP OWNED BY {name}"))
                .execute(&self.admin)
                .await;
            let _ = sqlx::query(&format!("DROP ROLE IF EXISTS {name}"))
                .execute(&self.admin)
                .await;
        }
    }
}

async fn pool_as(url: &str, role: &str) -> PgPool {
    let options: PgConnectOptions = url.parse().unwrap();
    PgPoolOptions::new()
        .max_connections(6)
        .connect_with(options.username(role))
        .await
        .unwrap_or_else(|e| panic!("connect as {role}: {e}"))
}

fn refused(result: Result<impl std::fmt::Debug, impl std::fmt::Display>, what: &str) {
    let error = result.expect_err(what).to_string();
    assert!(error.contains("permission denied"), "{what}: {error}");
}

#[tokio::test]
async fn workers_producers_and_readers_run_without_create_on_the_schema() {
    let db = TestDb::new().await;
    let tag = format!("{}_{}", std::process::id(), rand::random::<u32>() % 100_000);
    let [owner, worker, producer, reader] =
        ["owner", "worker", "producer", "reader"].map(|r| format!("rwt_{r}_{tag}"));
    let roles = Roles::create(
        &db.pool,
        &[
            owner.clone(),
            worker.clone(),
            producer.clone(),
            reader.clone(),
        ],
    )
    .await;
    let schema = SchemaName::new(&format!("rwt_roles_{tag}")).unwrap();
    sqlx::query(&format!("CREATE SCHEMA {schema} AUTHORIZATION {owner}"))
        .execute(&db.pool)
        .await
        .unwrap();

    // the owner migrates and grants
    let as_owner = pool_as(&db.url, &owner).await;
    ringwork::schema::migrate(&as_owner, &schema, ringwork::RingSizes::default())
        .await
        .unwrap();
    for (role, access) in [
        (&worker, Access::Worker),
        (&producer, Access::Producer),
        (&reader, Access::Reader),
    ] {
        for statement in grant_statements(&schema, role, access).unwrap() {
            sqlx::query(&statement)
                .execute(&as_owner)
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
    }
    for role in [&worker, &producer, &reader] {
        let can_create: bool = sqlx::query_scalar("SELECT has_schema_privilege($1, $2, 'CREATE')")
            .bind(role)
            .bind(schema.as_str())
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(!can_create, "{role} has CREATE on the schema");
    }

    // the producer: a queue nobody used yet (its lanes are created as the owner), a unique job,
    // and the SQL API
    let as_producer = pool_as(&db.url, &producer).await;
    let producing = ringwork::Client::builder(as_producer.clone())
        .schema(schema.as_str())
        .migrate(false)
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(
            producing
                .insert(NewJob::new(&Chore { n }).unwrap().queue("roles_q"))
                .await
                .unwrap(),
        );
    }
    let unique = NewJob::new(&Chore { n: 100 })
        .unwrap()
        .queue("roles_q")
        .unique(ringwork::Unique::default());
    ids.push(producing.insert(unique).await.unwrap());
    ids.push(
        sqlx::query_scalar(&format!(
            "SELECT {schema}.enqueue('roles_q', 'roles_chore', '{{\"n\": 200}}')"
        ))
        .fetch_one(&as_producer)
        .await
        .unwrap(),
    );
    refused(
        sqlx::query_scalar::<_, Vec<u8>>(&format!("SELECT secret FROM {schema}.callback_keys"))
            .fetch_optional(&as_producer)
            .await,
        "the producer reads the callback key",
    );

    // the worker: claims, completes, and leads maintenance (rotation and prune truncate)
    let as_worker = pool_as(&db.url, &worker).await;
    let working = ringwork::Client::builder(as_worker.clone())
        .schema(schema.as_str())
        .migrate(false)
        .maintenance(fast_maintenance())
        .queue("roles_q", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Chore| async move { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let storage = working.storage().clone();
    refused(
        ringwork::testing::advance_clock(&as_worker, &schema, std::time::Duration::from_secs(60))
            .await,
        "the worker moves the engine clock",
    );
    let running = working.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            let mut done = 0;
            for id in &ids {
                if storage.job_state(*id).await.unwrap().map(|s| s.state)
                    == Some(JobStatus::Completed)
                {
                    done += 1;
                }
            }
            done == ids.len()
        })
        .await,
        "every job ran under the worker role"
    );
    running.shutdown(Duration::from_secs(5)).await;
    // prune as the worker role, driven here: every job is done, so a sealed slot is provably dead
    let worker_storage = Storage::new(as_worker.clone(), schema.clone());
    for n in 0..5 {
        producing
            .insert(NewJob::new(&Chore { n }).unwrap().queue("roles_q"))
            .await
            .unwrap();
    }
    let claimed = worker_storage.claim("roles_q", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 5);
    let attempts: Vec<_> = claimed.iter().map(|job| job.attempt_ref()).collect();
    worker_storage.complete_batch(&attempts).await.unwrap();
    let mut pruned = 0;
    let mut last = Vec::new();
    for _ in 0..3 {
        let results = support::rotate_and_prune(&worker_storage, Duration::ZERO).await;
        last = results.clone();
        pruned += results
            .iter()
            .filter(|r| **r == ringwork::PruneResult::Pruned)
            .count();
    }
    assert!(pruned > 0, "the worker role pruned a queue slot: {last:?}");

    // the reader: every read, and no write
    let as_reader = pool_as(&db.url, &reader).await;
    let reading = Storage::new(as_reader.clone(), schema.clone());
    let counts = reading.queue_counts(Some("roles_q")).await.unwrap();
    assert_eq!(counts[0].completed, ids.len() as i64 + 5);
    for state in JobStatus::ALL {
        reading
            .list_jobs(state, None, None, None, 50)
            .await
            .unwrap_or_else(|e| panic!("{state}: {e}"));
    }
    reading.load_job(ids[0]).await.unwrap().expect("the job");
    reading.job_args(ids[0], 100).await.unwrap();
    reading
        .search_archive(&ringwork::ArchiveSearch::default(), None, 10)
        .await
        .unwrap();
    refused(
        sqlx::query_scalar::<_, i64>(&format!("SELECT {schema}.enqueue('roles_q', 'k')"))
            .fetch_one(&as_reader)
            .await,
        "the reader enqueues",
    );
    refused(
        sqlx::query(&format!(
            "SELECT {schema}.create_lane_shard('reader_q', 2::smallint, 0)"
        ))
        .execute(&as_reader)
        .await,
        "the reader creates a lane",
    );
    refused(
        sqlx::query_scalar::<_, Vec<u8>>(&format!("SELECT secret FROM {schema}.callback_keys"))
            .fetch_optional(&as_reader)
            .await,
        "the reader reads the callback key",
    );

    for pool in [as_owner, as_producer, as_worker, as_reader] {
        pool.close().await;
    }
    roles.drop(&schema).await;
    db.cleanup().await;
}
