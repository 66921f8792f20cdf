//! Crash and concurrency: rescue racing prune for hundreds of cycles while workers claim and
//! complete, the claim ring under a held horizon, and a server crash-restart under load. (A worker
//! process killed with SIGKILL is in cli/tests/worker_process.rs: it runs the `ringwork` binary.)

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::schema::{churn_class, ChurnClass};
use ringwork::PruneResult;
use ringwork::{JobArgs, JobContext, JobError, NewJob, Outcome, QueueConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescue_and_prune_race_for_hundreds_of_cycles_without_losing_a_claim() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let total = 1500_i64;
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = storage
        .insert_many(
            &mut conn,
            &(0..total)
                .map(|n| NewJob::from_parts("k", json!({ "n": n })).unwrap())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    drop(conn);
    let applied: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let crashing = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for worker in 0..2_i64 {
        let storage = storage.clone();
        let applied = Arc::clone(&applied);
        let crashing = Arc::clone(&crashing);
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut round = 0_i64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let jobs = storage.claim("default", 16, None).await.unwrap();
                if jobs.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                // while "crashing", a worker abandons a fifth of its claims (lost in-memory
                // completions) and completes some others late, after rescue may have taken them
                let (mut now, mut late) = (Vec::new(), Vec::new());
                for job in &jobs {
                    let pick = (job.job_id + round + worker) % 10;
                    if crashing.load(Ordering::Relaxed) && pick < 2 {
                        continue;
                    } else if crashing.load(Ordering::Relaxed) && pick == 2 {
                        late.push(job.attempt_ref());
                    } else {
                        now.push(job.attempt_ref());
                    }
                }
                for batch in [now, late] {
                    if batch.is_empty() {
                        continue;
                    }
                    let outcomes = storage.complete_batch(&batch).await.unwrap();
                    {
                        let mut applied = applied.lock().unwrap();
                        for (attempt, outcome) in batch.iter().zip(outcomes) {
                            if outcome == Outcome::Applied {
                                *applied.entry(attempt.job_id).or_default() += 1;
                            }
                        }
                    }
                    // real time on purpose: a stress test whose interleavings come from a 50 ms
                    // stale cutoff and completions sent 60 ms late (tests/rescue.rs drives each
                    // race of complete against rescue explicitly)
                    tokio::time::sleep(Duration::from_millis(60)).await;
                }
            }
        }));
    }

    // the maintenance side: rotate, rescue, prune every sealed slot, promote — hundreds of times
    let mut pruned = 0;
    let mut rescued = 0;
    for cycle in 0..400 {
        storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
        storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
        rescued += storage
            .rescue(Duration::from_millis(50), 100)
            .await
            .unwrap();
        for slot in storage.sealed_claim_slots().await.unwrap() {
            if storage
                .prune_claim_slot(slot, Duration::from_millis(10))
                .await
                .unwrap()
                == PruneResult::Pruned
            {
                pruned += 1;
            }
        }
        for slot in storage.sealed_queue_slots().await.unwrap() {
            if storage
                .prune_queue_slot(slot, Duration::from_millis(10), Duration::ZERO)
                .await
                .unwrap()
                == PruneResult::Pruned
            {
                pruned += 1;
            }
        }
        // skip the retry backoff so rescued jobs come straight back
        db.exec("UPDATE {s}.deferred_jobs SET run_at = now() WHERE run_at > now()")
            .await;
        storage.promote_due(1000).await.unwrap();
        if cycle == 250 {
            crashing.store(false, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // let the last rescued jobs drain with maintenance still going
    let drained = eventually(Duration::from_secs(60), || {
        let applied = Arc::clone(&applied);
        let storage = storage.clone();
        let db_exec = db.pool.clone();
        let schema = db.schema.clone();
        async move {
            let _ = storage.rescue(Duration::from_millis(50), 100).await;
            let _ = sqlx::query(&format!(
                "UPDATE {schema}.deferred_jobs SET run_at = now() WHERE run_at > now()"
            ))
            .execute(&db_exec)
            .await;
            let _ = storage.promote_due(1000).await;
            applied.lock().unwrap().len() as i64 == total
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    assert!(
        drained,
        "only {} of {total} jobs completed",
        applied.lock().unwrap().len()
    );
    assert!(pruned > 30, "prune ran for real ({pruned} slots reclaimed)");
    assert!(rescued > 0, "rescue ran for real");
    let applied = applied.lock().unwrap().clone();
    for id in &ids {
        assert_eq!(
            applied.get(id),
            Some(&1),
            "job {id} completed {:?} times",
            applied.get(id)
        );
    }
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Noop {}
impl JobArgs for Noop {
    const KIND: &'static str = "noop";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_ring_gains_no_dead_tuples_while_a_transaction_holds_the_horizon() {
    let db = TestDb::new().await;
    // hold the MVCC horizon for the whole run
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT txid_current()")
        .execute(&mut *holder)
        .await
        .unwrap();

    let client = db
        .client()
        .queue(
            "default",
            QueueConfig {
                max_workers: 32,
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, _args: Noop| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    for _ in 0..20 {
        let jobs: Vec<_> = (0..500).map(|_| NewJob::new(&Noop {}).unwrap()).collect();
        client.insert_many(&jobs).await.unwrap();
    }
    let done = eventually(Duration::from_secs(120), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 10_000 }
    })
    .await;
    running.shutdown(Duration::from_secs(10)).await;
    assert!(done);
    let horizon_held: bool = sqlx::query_scalar("SELECT txid_current() > 0")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    assert!(horizon_held);

    let url = db.url.clone();
    let schema = db.schema.clone();
    let stats_pool = TestDb::connect(&url, 1).await;
    db.pool.close().await; // backends flush their statistics as they exit
    drop(holder);
    let flushed = eventually(Duration::from_secs(30), || {
        let pool = stats_pool.clone();
        let schema = schema.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
                 WHERE schemaname = $1 AND relname LIKE 'ready_entries%'",
            )
            .bind(schema.as_str())
            .fetch_one(&pool)
            .await
            .unwrap()
                >= 10_000
        }
    })
    .await;
    assert!(flushed, "statistics never caught up");
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_dead_tup, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1",
    )
    .bind(schema.as_str())
    .fetch_all(&stats_pool)
    .await
    .unwrap();
    let mut claim_families = 0;
    for (table, dead, updated, deleted) in &rows {
        if churn_class(table) == Some(ChurnClass::Ring) {
            assert_eq!((*dead, *updated, *deleted), (0, 0, 0), "{table}");
            if table.starts_with("lease_claim") {
                claim_families += 1;
            }
        }
    }
    assert_eq!(
        claim_families,
        4 * (8 + 1),
        "four claim-ring families: parent and every slot"
    );
    let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&stats_pool)
        .await;
}

/// Claims commit asynchronously (`synchronous_commit = off` inside `claim`). A server crash can
/// therefore lose claims that workers already hold; this shows it loses no job: the cluster (a
/// throwaway one of this test's own) is crash-restarted (`pg_ctl restart -m immediate`, no
/// checkpoint, unflushed WAL gone) while workers claim and complete, and afterwards every job has
/// run and none is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crash_restart_under_load_loses_no_job() {
    #[derive(Serialize, Deserialize)]
    struct Tick {
        n: u64,
    }
    impl JobArgs for Tick {
        const KIND: &'static str = "tick";
    }
    let pg = std::sync::Arc::new(
        support::embedded::EmbeddedPostgres::start().expect("throwaway cluster"),
    );
    let url = pg.url();
    let pool = TestDb::connect(&url, 8).await;
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let seen = Arc::clone(&handled);
    let client = ringwork::Client::builder(pool.clone())
        .schema("crash_restart")
        .queue(
            "default",
            QueueConfig {
                max_workers: 16,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .maintenance(ringwork::MaintenanceConfig {
            tick: Duration::from_millis(100),
            rotate_interval: Duration::from_millis(300),
            stale_after: Duration::from_secs(1),
            ..ringwork::MaintenanceConfig::default()
        })
        .register(move |_ctx: JobContext, job: Tick| {
            let seen = Arc::clone(&seen);
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                *seen.lock().unwrap().entry(job.n).or_default() += 1;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let total = 4000_u64;
    let jobs: Vec<_> = (0..total)
        .map(|n| NewJob::new(&Tick { n }).unwrap())
        .collect();
    for chunk in jobs.chunks(500) {
        client.insert_many(chunk).await.unwrap();
    }
    let running = client.start().await.unwrap();
    let progressed = eventually(Duration::from_secs(60), || {
        let handled = Arc::clone(&handled);
        async move { handled.lock().unwrap().len() as u64 >= total / 3 }
    })
    .await;
    assert!(progressed, "workers made progress before the crash");
    let crashing = Arc::clone(&pg);
    tokio::task::spawn_blocking(move || crashing.restart())
        .await
        .unwrap()
        .expect("crash-restart");

    let storage = client.storage().clone();
    let drained = eventually(Duration::from_secs(120), || {
        let handled = Arc::clone(&handled);
        let storage = storage.clone();
        async move {
            if (handled.lock().unwrap().len() as u64) < total {
                return false;
            }
            match storage.queue_counts(Some("default")).await {
                Ok(c) => c[0].available + c[0].running + c[0].scheduled + c[0].retryable == 0,
                Err(_) => false,
            }
        }
    })
    .await;
    running.shutdown(Duration::from_secs(10)).await;
    let handled = handled.lock().unwrap().clone();
    let missing: Vec<u64> = (0..total).filter(|n| !handled.contains_key(n)).collect();
    assert!(
        missing.is_empty(),
        "never ran: {:?}",
        &missing[..missing.len().min(20)]
    );
    assert!(drained, "jobs still pending two minutes after the crash");
    let reruns: u32 = handled.values().map(|c| c - 1).sum();
    eprintln!("crash-restart: {total} jobs, all ran; {reruns} ran again (at-least-once)");
    if tokio::time::timeout(Duration::from_secs(10), pool.close())
        .await
        .is_err()
    {
        eprintln!("pool close timed out");
    }
}
