//! Runtime promises: many workers in separate runtimes drain a queue with every job run exactly
//! once, the dead-tuple contract, bad input, retries, the schema version guard.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::schema::{churn_class, ChurnClass, SCHEMA_VERSION};
use ringwork::{
    Client, CompletionConfig, Error, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, fast_maintenance, no_maintenance, TestDb};

#[derive(Serialize, Deserialize)]
struct Count {
    n: u64,
}
impl JobArgs for Count {
    const KIND: &'static str = "count";
}

type Runs = Arc<Mutex<HashMap<i64, u32>>>;

fn queue(workers: usize) -> QueueConfig {
    QueueConfig {
        max_workers: workers,
        claim_batch: 64,
        poll_interval: Duration::from_millis(50),
        ..QueueConfig::default()
    }
}

/// A client in its own OS thread and tokio runtime, with its own pool, until `stop` fires.
fn spawn_worker_process(
    url: String,
    schema: String,
    runs: Runs,
    stop: Arc<tokio::sync::Notify>,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let pool = TestDb::connect(&url, 6).await;
            let client = Client::builder(pool.clone())
                .schema(&schema)
                .maintenance(fast_maintenance())
                .queue("default", queue(16))
                .register(move |ctx: JobContext, _args: Count| {
                    let runs = Arc::clone(&runs);
                    async move {
                        *runs.lock().unwrap().entry(ctx.job_id).or_default() += 1;
                        Ok::<(), JobError>(())
                    }
                })
                .build()
                .await
                .unwrap();
            let metrics = client.metrics();
            let running = client.start().await.unwrap();
            stop.notified().await;
            running.shutdown(Duration::from_secs(10)).await;
            pool.close().await;
            (metrics.completed(), metrics.stale())
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_in_separate_runtimes_run_every_job_exactly_once() {
    let db = TestDb::new().await;
    let runs: Runs = Arc::default();
    let stops: Vec<_> = (0..2)
        .map(|_| Arc::new(tokio::sync::Notify::new()))
        .collect();
    let workers: Vec<_> = stops
        .iter()
        .map(|stop| {
            spawn_worker_process(
                db.url.clone(),
                db.schema.to_string(),
                Arc::clone(&runs),
                Arc::clone(stop),
            )
        })
        .collect();

    // enqueue while they run: batches (COPY) and singles, from two producers
    let storage = db.storage();
    let mut ids = Vec::new();
    let mut conn = db.pool.acquire().await.unwrap();
    for chunk in 0..19 {
        let jobs: Vec<_> = (0..500)
            .map(|i| NewJob::new(&Count { n: chunk * 500 + i }).unwrap())
            .collect();
        ids.extend(storage.insert_many(&mut conn, &jobs).await.unwrap());
    }
    for i in 0..500 {
        ids.push(
            storage
                .insert(&mut conn, &NewJob::new(&Count { n: 9500 + i }).unwrap())
                .await
                .unwrap(),
        );
    }
    assert_eq!(ids.len(), 10_000);
    drop(conn);

    let done = eventually(Duration::from_secs(120), || {
        let runs = Arc::clone(&runs);
        async move { runs.lock().unwrap().len() == 10_000 }
    })
    .await;
    // every attempt's completion has committed (no claim left open), then stop both
    let flushed = eventually(Duration::from_secs(30), || {
        let storage = db.storage();
        async move { storage.count_in_flight(None).await.unwrap() == 0 }
    })
    .await;
    assert!(flushed, "completions never flushed");
    for stop in &stops {
        stop.notify_one();
    }
    let mut completed = 0;
    let mut stale = 0;
    for worker in workers {
        let (c, s) = worker.join().unwrap();
        completed += c;
        stale += s;
    }
    assert!(done, "not every job ran within 120 s");
    let runs = runs.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(
            runs.get(id),
            Some(&1),
            "job {id} ran {:?} times",
            runs.get(id)
        );
    }
    assert_eq!(completed, 10_000, "completed exactly once each");
    assert_eq!(stale, 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_tables_gain_no_dead_tuples_from_enqueue_claim_complete() {
    let db = TestDb::new().await;
    // Maintenance off: no TRUNCATE may reset the counters and hide an UPDATE or DELETE.
    let client = db
        .client()
        .maintenance(no_maintenance())
        .queue("default", queue(32))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    for chunk in 0..40 {
        let jobs: Vec<_> = (0..500)
            .map(|i| NewJob::new(&Count { n: chunk * 500 + i }).unwrap())
            .collect();
        client.insert_many(&jobs).await.unwrap();
    }
    for i in 0..100 {
        client
            .insert(NewJob::new(&Count { n: i }).unwrap())
            .await
            .unwrap();
    }
    let all_done = eventually(Duration::from_secs(120), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 20_100 }
    })
    .await;
    running.shutdown(Duration::from_secs(10)).await;
    assert!(all_done, "completed {}", metrics.completed());

    // Closing every connection makes each backend flush its statistics on exit; then wait until
    // the inserts are visible in the statistics before reading the dead-tuple counts.
    let url = db.url.clone();
    let schema = db.schema.clone();
    db.pool.close().await;
    let pool = TestDb::connect(&url, 2).await;
    let flushed = eventually(Duration::from_secs(30), || {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            let inserted: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
                 WHERE schemaname = $1 AND relname LIKE 'ready_entries%'",
            )
            .bind(schema.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
            inserted >= 20_100
        }
    })
    .await;
    assert!(flushed, "statistics never caught up");
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_dead_tup, n_tup_upd, n_tup_del, n_tup_ins FROM pg_stat_user_tables
         WHERE schemaname = $1",
    )
    .bind(schema.as_str())
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut ring_inserts = 0;
    for (table, dead, updated, deleted, inserted) in &rows {
        let class = churn_class(table)
            .unwrap_or_else(|| panic!("table {table} has no declared churn class"));
        if class == ChurnClass::Ring {
            assert_eq!(
                (*dead, *updated, *deleted),
                (0, 0, 0),
                "ring table {table}: dead/upd/del"
            );
            ring_inserts += inserted;
        }
    }
    assert!(
        ring_inserts > 20_100,
        "ring tables saw the traffic ({ring_inserts} inserts)"
    );
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_table_declares_its_churn_class() {
    let db = TestDb::new().await;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
            .bind(db.schema.as_str())
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(tables.len() > 100, "ring children exist");
    for table in tables {
        assert!(
            churn_class(&table).is_some(),
            "{table} has no churn class in schema::TABLE_CLASSES"
        );
    }
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Strict {
    value: u32,
}
impl JobArgs for Strict {
    const KIND: &'static str = "strict";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kind_and_undecodable_args_fail_that_job_only() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", queue(8))
        .register(|_ctx: JobContext, _args: Strict| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let unknown = client
        .insert(NewJob::from_parts("nobody_handles_this", json!({})).unwrap())
        .await
        .unwrap();
    let undecodable = client
        .insert(NewJob::from_parts("strict", json!({ "value": "not a number" })).unwrap())
        .await
        .unwrap();
    let good: Vec<i64> = client
        .insert_many(
            &(0..20)
                .map(|v| NewJob::new(&Strict { value: v }).unwrap())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let done = eventually(Duration::from_secs(30), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 20 && metrics.failed() == 2 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(
        done,
        "completed {} failed {}",
        metrics.completed(),
        metrics.failed()
    );
    // from done_entries, or from the archive once fast maintenance has pruned the slot
    let storage = db.storage();
    let error_of = |id: i64| {
        let storage = storage.clone();
        async move {
            let state = storage.job_state(id).await.unwrap().unwrap();
            format!("{}: {}", state.state, state.detail.unwrap_or_default())
        }
    };
    let e = error_of(unknown).await;
    assert!(
        e.starts_with("failed: unknown job kind \"nobody_handles_this\""),
        "{e}"
    );
    let e = error_of(undecodable).await;
    assert!(
        e.starts_with("failed: undecodable arguments for kind \"strict\""),
        "{e}"
    );
    assert_eq!(good.len(), 20);
    db.cleanup().await;
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_written() {
    let db = TestDb::new().await;
    let client = db.client().build().await.unwrap();
    let nul = NewJob::from_parts("k", json!({ "s": "a\u{0}b" })).unwrap();
    assert!(matches!(
        client.insert(nul.clone()).await,
        Err(Error::InvalidArgs { .. })
    ));
    // a batch with one bad job writes nothing
    let good = NewJob::from_parts("k", json!({})).unwrap();
    assert!(client.insert_many(&[good.clone(), nul]).await.is_err());
    assert!(client.insert(good.clone().priority(0)).await.is_err());
    assert!(client
        .insert(good.clone().queue("bad\0queue"))
        .await
        .is_err());
    assert!(matches!(
        NewJob::from_parts("k\0", json!({})),
        Err(Error::InvalidName { .. })
    ));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    // bad configuration
    let bad = db
        .client()
        .queue(
            "q",
            QueueConfig {
                max_workers: 0,
                ..QueueConfig::default()
            },
        )
        .build()
        .await;
    assert!(matches!(bad, Err(Error::Config(_))));
    assert!(matches!(
        db.client().schema("Robert'); DROP").build().await,
        Err(Error::InvalidName { .. })
    ));
    db.cleanup().await;
}

#[tokio::test]
async fn a_newer_schema_version_is_refused() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "INSERT INTO {{s}}.schema_migrations (version, name, checksum) VALUES ({}, 'from the future', 'x')",
        SCHEMA_VERSION + 1
    ))
    .await;
    for migrate in [true, false] {
        match db.client().migrate(migrate).build().await {
            Err(Error::SchemaTooNew {
                database, binary, ..
            }) => {
                assert_eq!((database, binary), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("expected SchemaTooNew, got {:?}", other.err()),
        }
    }
    db.cleanup().await;
}

#[tokio::test]
async fn concurrent_migrations_apply_each_version_once() {
    let db = TestDb::new().await;
    let fresh = ringwork::SchemaName::new(&format!("{}_m", db.schema)).unwrap();
    let runs = (0..4).map(|_| {
        let pool = db.pool.clone();
        let fresh = fresh.clone();
        tokio::spawn(
            async move { ringwork::schema::migrate(&pool, &fresh, Default::default()).await },
        )
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().unwrap().applied);
    }
    applied.sort();
    assert_eq!(applied, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    sqlx::query(&format!("DROP SCHEMA {fresh} CASCADE"))
        .execute(&db.pool)
        .await
        .unwrap();
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Flaky {
    fail_times: i32,
}
impl JobArgs for Flaky {
    const KIND: &'static str = "flaky";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_retry_through_deferred_and_then_complete_or_fail_for_good() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", queue(4))
        .register(|ctx: JobContext, args: Flaky| async move {
            if ctx.attempt <= args.fail_times {
                Err(JobError::RetryAfter(
                    Duration::ZERO,
                    format!("attempt {} fails", ctx.attempt),
                ))
            } else {
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let recovers = client
        .insert(NewJob::new(&Flaky { fail_times: 2 }).unwrap())
        .await
        .unwrap();
    let exhausts = client
        .insert(
            NewJob::new(&Flaky { fail_times: 10 })
                .unwrap()
                .max_attempts(3),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let done = eventually(Duration::from_secs(30), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 1 && metrics.failed() == 1 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(done);
    assert_eq!(metrics.retried(), 4);
    // in done_entries, or in the archive once fast maintenance has pruned its slot
    let state: String = sqlx::query_scalar(&format!(
        "SELECT state || ' after attempt ' || attempt || ', lease ' || run_lease FROM {s}.done_entries WHERE job_id = $1
         UNION ALL
         SELECT state || ' after attempt ' || attempt || ', lease ' || run_lease FROM {s}.archived_jobs WHERE job_id = $1",
        s = db.schema
    ))
    .bind(exhausts)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(state, "failed after attempt 3, lease 3");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    let _ = recovers;
    db.cleanup().await;
}

#[tokio::test]
async fn public_futures_are_send() {
    fn assert_send<T: Send>(_: T) {}
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost/x").unwrap();
    assert_send(Client::builder(pool.clone()).build());
    let schema = ringwork::SchemaName::default();
    assert_send(ringwork::schema::migrate(
        &pool,
        &schema,
        Default::default(),
    ));
    let client_insert = async move {
        let client = Client::builder(pool).build().await.unwrap();
        client
            .insert(NewJob::from_parts("k", json!({})).unwrap())
            .await
            .unwrap();
        client
            .start()
            .await
            .unwrap()
            .shutdown(Duration::from_secs(1))
            .await;
    };
    assert_send(client_insert);
}

#[derive(Serialize, Deserialize)]
struct Slow {
    ms: u64,
}
impl JobArgs for Slow {
    const KIND: &'static str = "slow";
}

/// Shutdown drains running handlers with their heartbeats still beating: a handler that outlives
/// `stale_after` during the drain is not rescued (and so not run twice), and its completion lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_go_on_while_shutdown_drains_a_long_handler() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let stale_after = Duration::from_millis(800);
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let client = Client::builder(db.pool.clone())
        .schema(db.schema.as_str())
        .maintenance(ringwork::MaintenanceConfig {
            stale_after,
            ..no_maintenance()
        })
        .queue("default", queue(2))
        .register(move |_ctx: JobContext, args: Slow| {
            let runs = Arc::clone(&counted);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(args.ms)).await;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let id = storage
        .insert(&mut conn, &NewJob::new(&Slow { ms: 3_000 }).unwrap())
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let runs = Arc::clone(&runs);
            async move { runs.load(Ordering::SeqCst) == 1 }
        })
        .await
    );
    // shut down while the handler has about 3 s to go; rescue keeps sweeping meanwhile
    let shutdown = tokio::spawn(running.shutdown(Duration::from_secs(20)));
    let mut rescued = 0;
    while !shutdown.is_finished() {
        rescued += storage.rescue(stale_after, 100).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.await.unwrap();
    assert_eq!(rescued, 0, "the draining attempt was rescued");
    assert_eq!(metrics.completed(), 1);
    assert_eq!(metrics.stale(), 0);
    let state = storage.job_state(id).await.unwrap().unwrap();
    assert_eq!((state.state.as_str(), state.attempt), ("completed", 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    db.cleanup().await;
}

#[tokio::test]
async fn a_claim_linger_over_a_second_is_refused() {
    let db = TestDb::new().await;
    let built = Client::builder(db.pool.clone())
        .schema(db.schema.as_str())
        .maintenance(no_maintenance())
        .queue(
            "default",
            QueueConfig {
                claim_linger: Duration::from_secs(2),
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await;
    match built {
        Err(Error::Config(message)) => assert!(message.contains("claim_linger"), "{message}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("a 2-s claim_linger was accepted"),
    }
    db.cleanup().await;
}

/// Whether every job of `ids` is completed (its completion committed) within `within`.
async fn completed_within(storage: &ringwork::Storage, ids: &[i64], within: Duration) -> bool {
    eventually(within, || {
        let storage = storage.clone();
        let ids = ids.to_vec();
        async move {
            for id in ids {
                let state = storage.job_state(id).await.unwrap().map(|s| s.state);
                if state != Some(JobStatus::Completed) {
                    return false;
                }
            }
            true
        }
    })
    .await
}

/// Completion pacing (completer.rs): flushes start at most once per `max_delay` under load, but a
/// completion after a quiet spell is written at once, and so is one finishing while claims come
/// back short. With a 30-s pace, three jobs run one after another each become durable within
/// seconds (a fixed gather, or pacing without the short-claim flush, holds the second for 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_completions_are_written_at_once_when_the_queue_runs_dry() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .maintenance(no_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue("default", queue(4))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let storage = db.storage();
    for n in 0..3 {
        let id = client
            .insert(NewJob::new(&Count { n }).unwrap())
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let durable = completed_within(&storage, &[id], Duration::from_secs(10)).await;
        assert!(
            durable,
            "job {n}'s completion was not written within 10 s (pace 30 s)"
        );
        eprintln!("job {n}: durable after {:?}", started.elapsed());
    }
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

/// The last jobs of a queue running dry finish one after another, long after the claim that left
/// workers idle: each must be flushed when it finishes, not at the pace (30 s here) nor at the
/// next poll (30 s too). Three jobs of 0, 300 and 600 ms claimed together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_jobs_of_a_draining_queue_are_written_as_they_finish() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs: Vec<_> = (0..3).map(|n| NewJob::new(&Count { n }).unwrap()).collect();
    let ids = storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let client = db
        .client()
        .maintenance(no_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue(
            "default",
            QueueConfig {
                max_workers: 4,
                poll_interval: Duration::from_secs(30),
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, args: Count| async move {
            tokio::time::sleep(Duration::from_millis(args.n * 300)).await;
            Ok::<(), JobError>(())
        })
        .build()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let running = client.start().await.unwrap();
    let durable = completed_within(&storage, &ids, Duration::from_secs(10)).await;
    assert!(
        durable,
        "the three completions were not all written within 10 s (pace and poll 30 s)"
    );
    eprintln!("three staggered jobs durable after {:?}", started.elapsed());
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
