//! Runtime: many workers in separate runtimes drain a queue with every job run exactly once,
//! heartbeats go on while shutdown drains a long handler, the client's futures are Send, and its
//! configuration is checked.

mod support;

use ringwork::{Client, Error, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{eventually, fast_maintenance, no_maintenance, queue, Count, TestDb};

type Runs = Arc<Mutex<HashMap<i64, u32>>>;

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

#[derive(Serialize, Deserialize)]
struct Slow {
    ms: u64,
}

impl JobArgs for Slow {
    const KIND: &'static str = "slow";
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

/// An idle dispatcher claims again when an insert's NOTIFY arrives, not when its poll says so
/// (here a minute: every pickup below within seconds is the NOTIFY's, or the listener's), and a
/// job inserted as the listener's connection is lost is claimed when the listener wakes every
/// dispatcher, instead of waiting out the poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_dispatcher_is_woken_by_notifications_and_by_a_lost_listener() {
    let db = TestDb::new().await;
    let client = idle_client(&db).await;
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let done = |n: u64| {
        let metrics = Arc::clone(&metrics);
        eventually(Duration::from_secs(10), move || {
            let metrics = Arc::clone(&metrics);
            async move { metrics.completed() >= n }
        })
    };
    let channel = format!("ringwork_{}", db.schema);
    let listener = support::listener_pid(&db, &channel)
        .await
        .expect("the client never listened");
    let insert = |n: u64| {
        let client = &client;
        async move {
            client
                .insert(NewJob::new(&Count { n }).unwrap())
                .await
                .unwrap()
        }
    };
    // the start's claims are over: the dispatcher waits with nothing to do
    insert(1).await;
    assert!(done(1).await, "the first job was not run");
    insert(2).await;
    assert!(
        done(2).await,
        "a job inserted at an idle dispatcher waited for the poll"
    );

    // the listener's session ends: its loss wakes every dispatcher, and it reconnects (a job
    // inserted meanwhile sends its NOTIFY to nobody; its claim is the loss's or the reconnect's)
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(listener)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(terminated);
    insert(3).await;
    assert!(
        done(3).await,
        "a job inserted while the listener was down waited for the poll"
    );
    // and the listener is back: the next insert is a NOTIFY's again
    let again = support::listener_pid(&db, &channel)
        .await
        .expect("the listener did not come back");
    assert_ne!(again, listener);
    insert(4).await;
    assert!(
        done(4).await,
        "a job inserted after the reconnect waited for the poll"
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

/// `engine_pool_size` is the process's connection budget besides the caller's pool: a client of 3
/// engine connections that listens, leads maintenance and runs 300 jobs on 8 workers never holds
/// more (its connections are told apart by their application name), and one of 2 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holds_no_more_connections_than_its_engine_pool_size() {
    let db = TestDb::new().await;
    let refused = Client::builder(db.pool.clone())
        .schema(db.schema.as_str())
        .engine_pool_size(2)
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await;
    match refused {
        Err(Error::Config(message)) => assert!(message.contains("engine_pool_size"), "{message}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("an engine pool of 2 was accepted"),
    }

    let options = (*db.pool.connect_options())
        .clone()
        .application_name("ringwork-budget");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let client = Client::builder(pool.clone())
        .schema(db.schema.as_str())
        .engine_pool_size(3)
        .maintenance(fast_maintenance())
        .queue("default", queue(8))
        .register(|_ctx: JobContext, _args: Count| async {
            tokio::task::yield_now().await;
            Ok::<(), JobError>(())
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let jobs: Vec<_> = (0..300)
        .map(|n| NewJob::new(&Count { n }).unwrap())
        .collect();
    client.insert_many(&jobs).await.unwrap();
    let (peak, done) = peak_connections_until(&db.pool, "ringwork-budget", 400, || {
        metrics.completed() >= 300
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(done, "300 jobs were not run ({} were)", metrics.completed());
    // the engine's 3 and the caller's pool of 1
    assert!(peak <= 4, "the process held {peak} connections");
    assert!(
        peak >= 3,
        "the sampling never saw the engine at work ({peak})"
    );
    pool.close().await;
    db.cleanup().await;
}

/// A fleet of small processes fits a server's connection limit when each states its budget: 16
/// clients, each with an application pool of 2 and `engine_pool_size(3)`, one of them leading
/// maintenance and the others trying its lock, run 1,600 jobs on a throwaway server with
/// `max_connections = 100` and never hold more than 16 x 5 = 80 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_of_five_connections_fit_in_a_hundred() {
    let server = support::embedded::EmbeddedPostgres::start_with(&[("max_connections", "100")])
        .expect("throwaway cluster");
    let url = server.url();
    let watcher = TestDb::connect(&url, 1).await;
    let limit: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&watcher)
        .await
        .unwrap();
    assert_eq!(limit, "100");
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let mut fleet = Vec::new();
    for process in 0..16 {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(30))
            .connect_lazy_with(options.clone().application_name("ringwork-fleet"));
        let client = Client::builder(pool)
            .schema("fleet")
            .engine_pool_size(3)
            .maintenance(fast_maintenance())
            .queue("default", queue(2))
            .register(|_ctx: JobContext, _args: Count| async {
                tokio::task::yield_now().await;
                Ok::<(), JobError>(())
            })
            .build()
            .await
            .unwrap_or_else(|e| panic!("process {process}: {e}"));
        let running = client.start().await.unwrap();
        fleet.push((client, running));
    }
    let jobs: Vec<_> = (0..1600)
        .map(|n| NewJob::new(&Count { n }).unwrap())
        .collect();
    for chunk in jobs.chunks(100) {
        fleet[0].0.insert_many(chunk).await.unwrap();
    }
    let (peak, done) = peak_connections_until(&watcher, "ringwork-fleet", 2400, || {
        fleet
            .iter()
            .map(|(c, _)| c.metrics().completed())
            .sum::<u64>()
            >= 1600
    })
    .await;
    let completed: u64 = fleet.iter().map(|(c, _)| c.metrics().completed()).sum();
    for (_, running) in fleet {
        running.shutdown(Duration::from_secs(5)).await;
    }
    assert!(done, "1,600 jobs were not run ({completed} were)");
    assert!(peak <= 80, "the fleet held {peak} connections");
    assert!(
        peak >= 32,
        "the sampling never saw the fleet at work ({peak})"
    );
    eprintln!("16 processes of 2 + 3 connections: peak {peak} connections of 100");
    watcher.close().await;
}

/// The most server connections named `application` seen at once, sampled every 25 ms until
/// `done` (at most `samples` times), and whether `done` came.
async fn peak_connections_until(
    watcher: &sqlx::PgPool,
    application: &str,
    samples: usize,
    done: impl Fn() -> bool,
) -> (i64, bool) {
    let mut peak = 0_i64;
    for _ in 0..samples {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1",
        )
        .bind(application)
        .fetch_one(watcher)
        .await
        .unwrap();
        peak = peak.max(held);
        if done() {
            return (peak, true);
        }
        // sampling the connections held while the jobs run: real time between samples is what
        // lets the run proceed, and a sample is not a wait for a condition
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (peak, false)
}

/// A client of 2 workers on `default`, counting its jobs, with no maintenance and a poll of a
/// minute: a pickup within seconds is a NOTIFY's (or a lost listener's) wake-up.
async fn idle_client(db: &TestDb) -> Client {
    db.client()
        .maintenance(no_maintenance())
        .queue(
            "default",
            QueueConfig {
                max_workers: 2,
                poll_interval: Duration::from_secs(60),
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap()
}

/// Backends holding `queue`'s first-responder lock (notifier.rs).
async fn responder_holders(db: &TestDb, queue: &str) -> Vec<i32> {
    sqlx::query_scalar(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = {s}.lock_ns('responder')::oid AND objid = hashtext($1)::oid \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        s = db.schema
    ))
    .bind(queue)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// A process that is not the queue's first responder still runs a notified job, one wake-up delay
/// later: here the responder's lock is held by a session that never claims (a frozen responder),
/// and the poll is a minute, so a pickup within seconds is the follower's delayed wake. Once that
/// session lets go, the process takes the lock at its next try, and gives it back at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_runs_notified_jobs_while_a_frozen_responder_holds_the_queue() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let mut frozen = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_lock({}.lock_ns('responder'), hashtext('default'))",
        db.schema
    ))
    .execute(&mut frozen)
    .await
    .unwrap();
    let frozen_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut frozen)
        .await
        .unwrap();
    let client = idle_client(&db).await;
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let channel = format!("ringwork_{}", db.schema);
    let listener = support::listener_pid(&db, &channel)
        .await
        .expect("the client never listened");
    assert_eq!(responder_holders(&db, "default").await, [frozen_pid]);
    for n in 1..=3 {
        client
            .insert(NewJob::new(&Count { n }).unwrap())
            .await
            .unwrap();
        let metrics = Arc::clone(&metrics);
        assert!(
            eventually(Duration::from_secs(10), move || {
                let metrics = Arc::clone(&metrics);
                async move { metrics.completed() >= n }
            })
            .await,
            "a follower's job {n} waited for the poll"
        );
    }
    frozen.close().await.unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            responder_holders(&db, "default").await == [listener]
        })
        .await,
        "the process did not take over the free responder lock: {:?}, its listener {listener}",
        responder_holders(&db, "default").await
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert!(
        responder_holders(&db, "default").await.is_empty(),
        "a session kept the responder lock after shutdown"
    );
    db.cleanup().await;
}

/// A first responder with no room for a notified job (its one worker busy) passes the notification
/// on, on the schema's overflow channel, and the follower runs the job; with room, it passes
/// nothing on. The passing on is watched on the channel itself: without it the follower would
/// still run the job, one delay later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_responder_passes_a_notification_on_to_the_followers() {
    use sqlx::postgres::PgListener;
    let db = TestDb::new().await;
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let start = || async {
        let (release, started) = (Arc::clone(&release), Arc::clone(&started));
        let client = db
            .client()
            .maintenance(no_maintenance())
            .queue(
                "default",
                QueueConfig {
                    max_workers: 1,
                    claim_ahead: 0,
                    poll_interval: Duration::from_secs(60),
                    ..QueueConfig::default()
                },
            )
            // job 0 holds its worker until released
            .register(move |_ctx: JobContext, args: Count| {
                let (release, started) = (Arc::clone(&release), Arc::clone(&started));
                async move {
                    if args.n == 0 {
                        started.store(true, Ordering::SeqCst);
                        let _ = release.acquire().await;
                    }
                    Ok::<(), JobError>(())
                }
            })
            .build()
            .await
            .unwrap();
        let running = client.start().await.unwrap();
        (client, running)
    };
    let (responder, first) = start().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            responder_holders(&db, "default").await.len() == 1
        })
        .await,
        "the first process did not take the responder lock"
    );
    responder
        .insert(NewJob::new(&Count { n: 0 }).unwrap())
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            started.load(Ordering::SeqCst)
        })
        .await,
        "the responder did not start job 0"
    );
    let (follower, second) = start().await;
    let mut overflow = PgListener::connect(&db.url).await.unwrap();
    overflow
        .listen(&db.schema.overflow_channel())
        .await
        .unwrap();

    // full: the notification of job 1 is passed on, and the follower runs the job
    follower
        .insert(NewJob::new(&Count { n: 1 }).unwrap())
        .await
        .unwrap();
    let passed = tokio::time::timeout(Duration::from_secs(10), overflow.recv())
        .await
        .expect("the full responder passed nothing on")
        .unwrap();
    assert_eq!(passed.payload(), "default");
    let metrics = follower.metrics();
    assert!(
        eventually(Duration::from_secs(10), move || {
            let metrics = Arc::clone(&metrics);
            async move { metrics.completed() >= 1 }
        })
        .await,
        "the follower did not run job 1"
    );

    // with room again, job 2's notification stays with the responder: the first thing on the
    // channel after job 2 ran is the marker sent after it
    release.add_permits(1);
    let metrics = responder.metrics();
    assert!(
        eventually(Duration::from_secs(10), || {
            let metrics = Arc::clone(&metrics);
            async move { metrics.completed() >= 1 }
        })
        .await,
        "job 0 did not finish"
    );
    responder
        .insert(NewJob::new(&Count { n: 2 }).unwrap())
        .await
        .unwrap();
    let (responder_metrics, follower_metrics) = (responder.metrics(), follower.metrics());
    assert!(
        eventually(Duration::from_secs(10), move || {
            let done = responder_metrics.completed() + follower_metrics.completed();
            async move { done >= 3 }
        })
        .await,
        "job 2 did not run"
    );
    sqlx::query("SELECT pg_notify($1, 'marker')")
        .bind(db.schema.overflow_channel())
        .execute(&db.pool)
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), overflow.recv())
        .await
        .expect("the marker did not arrive")
        .unwrap();
    assert_eq!(
        next.payload(),
        "marker",
        "a responder with room passed a notification on"
    );
    first.shutdown(Duration::from_secs(5)).await;
    second.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

/// Two processes on one queue: the first to listen holds the queue's first-responder lock, the
/// second is a follower; when the first shuts down it gives the lock back, and the second takes it
/// at its next try and runs the queue's jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_that_shuts_down_hands_the_queue_to_the_other_process() {
    let db = TestDb::new().await;
    let start = || async {
        let client = idle_client(&db).await;
        let running = client.start().await.unwrap();
        (client, running)
    };
    let (_, first) = start().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            responder_holders(&db, "default").await.len() == 1
        })
        .await,
        "the first process did not take the responder lock"
    );
    let holder = responder_holders(&db, "default").await;
    let (second, running) = start().await;
    let channel = format!("ringwork_{}", db.schema);
    assert!(support::listener_pid(&db, &channel).await.is_some());
    assert_eq!(
        responder_holders(&db, "default").await,
        holder,
        "one responder"
    );
    first.shutdown(Duration::from_secs(5)).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            let now = responder_holders(&db, "default").await;
            now.len() == 1 && now != holder
        })
        .await,
        "the second process did not take the lock the first gave back: {:?}",
        responder_holders(&db, "default").await
    );
    let metrics = second.metrics();
    second
        .insert(NewJob::new(&Count { n: 1 }).unwrap())
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), move || {
            let metrics = Arc::clone(&metrics);
            async move { metrics.completed() >= 1 }
        })
        .await,
        "the new responder did not run the job"
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
