//! A frozen piece never stops the rest: a handler that blocks its thread does not starve the
//! heartbeats of its neighbours, and a server that cannot be reached is reported at once.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ringwork::{Client, Error, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, no_maintenance, TestDb};

#[derive(Serialize, Deserialize)]
struct Work {
    /// block the thread (std::thread::sleep) instead of waiting (tokio::time::sleep)
    blocking: bool,
    ms: u64,
}
impl JobArgs for Work {
    const KIND: &'static str = "work";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_does_not_get_its_neighbours_rescued() {
    let db = TestDb::new().await;
    // Another process's rescue, on a thread and runtime of its own (nothing this client does can
    // stall it): every 100 ms it rescues claims with no heartbeat or completion for 1 s.
    let rescuer_url = db.url.clone();
    let rescuer_schema = db.schema.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rescuer_stop = std::sync::Arc::clone(&stop);
    let rescuer = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let pool = TestDb::connect(&rescuer_url, 2).await;
            let storage = ringwork::Storage::new(pool, rescuer_schema);
            let mut rescued = 0;
            while !rescuer_stop.load(Ordering::Relaxed) {
                rescued += storage.rescue(Duration::from_secs(1), 100).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            rescued
        })
    });

    let handler_pool = db.pool.clone();
    let client = db
        .client()
        .maintenance(ringwork::MaintenanceConfig {
            stale_after: Duration::from_secs(1), // heartbeats every 250 ms
            ..no_maintenance()
        })
        .handler_threads(2)
        .queue(
            "default",
            QueueConfig {
                max_workers: 16,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, work: Work| {
            let pool = handler_pool.clone();
            async move {
                // Handlers use the caller's pool (as real handlers do): a connection this opens is
                // driven by the handler runtime, so the client's own tasks must not depend on it.
                sqlx::query("SELECT 1")
                    .execute(&pool)
                    .await
                    .map_err(JobError::retry)?;
                if work.blocking {
                    std::thread::sleep(Duration::from_millis(work.ms));
                } else {
                    tokio::time::sleep(Duration::from_millis(work.ms)).await;
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    // two blockers: with two handler threads they hold every handler thread for 3 s, six times
    // the heartbeat interval and three times the staleness window
    let mut jobs = vec![
        NewJob::new(&Work {
            blocking: true,
            ms: 3000,
        })
        .unwrap(),
        NewJob::new(&Work {
            blocking: true,
            ms: 3000,
        })
        .unwrap(),
    ];
    jobs.extend((0..6).map(|_| {
        NewJob::new(&Work {
            blocking: false,
            ms: 2000,
        })
        .unwrap()
    }));
    client.insert_many(&jobs).await.unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let done = eventually(Duration::from_secs(30), || {
        let metrics = std::sync::Arc::clone(&metrics);
        async move { metrics.completed() == 8 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let rescued = rescuer.join().unwrap();
    assert!(done, "not every job completed");
    assert_eq!(rescued, 0, "a job was rescued while its handler was alive");
    assert_eq!(metrics.stale(), 0);
    assert!(
        metrics.blocked() >= 2,
        "the blocking handlers were not reported"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn building_against_a_closed_port_fails_fast_and_names_the_cause() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let started = Instant::now();
    let error = Client::builder(pool)
        .build()
        .await
        .err()
        .expect("build must fail");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(error, Error::Unreachable { .. }), "{error}");
    assert!(
        error.to_string().to_lowercase().contains("refused"),
        "{error}"
    );
}

#[derive(Serialize, Deserialize)]
struct Stubborn {}
impl JobArgs for Stubborn {
    const KIND: &'static str = "stubborn";
}

#[tokio::test]
async fn a_handler_still_running_after_the_drain_is_told_to_stop() {
    let db = TestDb::new().await;
    let (told_tx, told_rx) = tokio::sync::oneshot::channel::<()>();
    let told_tx = std::sync::Arc::new(std::sync::Mutex::new(Some(told_tx)));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let client = db
        .client()
        .maintenance(no_maintenance())
        .queue(
            "default",
            QueueConfig {
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, _job: Stubborn| {
            let told_tx = std::sync::Arc::clone(&told_tx);
            let started_tx = std::sync::Arc::clone(&started_tx);
            async move {
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                // runs for a minute unless told to stop
                tokio::select! {
                    _ = ctx.cancelled() => {
                        if let Some(tx) = told_tx.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                    }
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    client
        .insert(NewJob::new(&Stubborn {}).unwrap())
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), started_rx)
        .await
        .expect("the handler never started")
        .unwrap();
    running.shutdown(Duration::from_millis(200)).await;
    let told = tokio::time::timeout(Duration::from_secs(5), told_rx).await;
    assert!(
        matches!(told, Ok(Ok(()))),
        "the handler was not told to stop at the end of the drain"
    );
    db.cleanup().await;
}
