//! Claiming ahead of free workers (`QueueConfig::claim_ahead`): while handlers are short, a process
//! claims more jobs than it has free workers so the next claim overlaps the running handlers. What
//! it must never do: run more handlers than `max_workers`, run a job twice, claim ahead behind long
//! handlers, or leave jobs claimed ahead stranded (waiting for rescue) when the process shuts down.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, fast_maintenance, no_maintenance, TestDb};

#[derive(Serialize, Deserialize)]
struct Sleep {
    ms: u64,
}
impl JobArgs for Sleep {
    const KIND: &'static str = "sleep";
}

/// Handler runs per job, and the most handlers seen running at once.
#[derive(Default)]
struct Observed {
    runs: Mutex<HashMap<i64, u32>>,
    active: AtomicUsize,
    peak_active: AtomicUsize,
}

fn client(
    db: &TestDb,
    workers: usize,
    ahead: usize,
    seen: &Arc<Observed>,
) -> ringwork::ClientBuilder {
    let seen = Arc::clone(seen);
    Client::builder(db.pool.clone())
        .schema(db.schema.as_str())
        .maintenance(no_maintenance())
        .queue(
            "default",
            QueueConfig {
                max_workers: workers,
                claim_ahead: ahead,
                claim_batch: 64,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, args: Sleep| {
            let seen = Arc::clone(&seen);
            async move {
                let now = seen.active.fetch_add(1, Ordering::SeqCst) + 1;
                seen.peak_active.fetch_max(now, Ordering::SeqCst);
                *seen.runs.lock().unwrap().entry(ctx.job_id).or_default() += 1;
                // 0 ms returns at once (a timer rounds up to the next millisecond tick)
                if args.ms > 0 {
                    tokio::time::sleep(Duration::from_millis(args.ms)).await;
                }
                seen.active.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
}

async fn start(builder: ringwork::ClientBuilder) -> ringwork::RunningClient {
    builder.build().await.unwrap().start().await.unwrap()
}

fn assert_each_ran_once(seen: &Observed, ids: &[i64]) {
    let runs = seen.runs.lock().unwrap();
    for id in ids {
        assert_eq!(
            runs.get(id),
            Some(&1),
            "job {id} ran {:?} times",
            runs.get(id)
        );
    }
}

async fn insert(db: &TestDb, n: usize, ms: u64) -> Vec<i64> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob::new(&Sleep { ms }).unwrap())
        .collect();
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage().insert_many(&mut conn, &jobs).await.unwrap()
}

/// The largest claim batch so far (claims are not pruned here: maintenance is off).
async fn largest_claim(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT coalesce(max(claimed_count), 0)::int8 FROM {}.lease_claim_batches",
        db.schema.as_str()
    ))
    .await
}

async fn all_ran(seen: &Arc<Observed>, n: usize) -> bool {
    eventually(Duration::from_secs(60), || {
        let seen = Arc::clone(seen);
        async move { seen.runs.lock().unwrap().len() == n }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_ahead_never_runs_more_handlers_than_max_workers_nor_a_job_twice() {
    let db = TestDb::new().await;
    let seen = Arc::new(Observed::default());
    let running = start(client(&db, 2, 8, &seen)).await;
    let ids = insert(&db, 300, 3).await;
    assert!(all_ran(&seen, 300).await, "not every job ran");
    running.shutdown(Duration::from_secs(10)).await;

    assert!(
        seen.peak_active.load(Ordering::SeqCst) <= 2,
        "{} handlers ran at once with max_workers 2",
        seen.peak_active.load(Ordering::SeqCst)
    );
    assert_each_ran_once(&seen, &ids);
    // it did claim ahead: some claim took more jobs than the process has workers
    let largest = largest_claim(&db).await;
    assert!(
        (3..=10).contains(&largest),
        "largest claim {largest}, expected more than max_workers (2) and at most max_workers + claim_ahead (10)"
    );
    assert_eq!(
        db.storage().count_in_flight(Some("default")).await.unwrap(),
        0
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_handlers_are_never_claimed_ahead() {
    let db = TestDb::new().await;
    let seen = Arc::new(Observed::default());
    let running = start(client(&db, 1, 8, &seen)).await;
    // 120 ms per job, above the 50-ms bound: each claim must take one job, for the one worker
    insert(&db, 5, 120).await;
    assert!(all_ran(&seen, 5).await, "not every job ran");
    running.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        largest_claim(&db).await,
        1,
        "a claim took more jobs than free workers"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_jobs_claimed_ahead_without_using_their_attempt() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let seen = Arc::new(Observed::default());
    let first = start(client(&db, 1, 16, &seen)).await;
    let ids = insert(&db, 200, 10).await;
    // wait until jobs are waiting claimed ahead of the one worker
    assert!(
        eventually(Duration::from_secs(30), || async {
            largest_claim(&db).await > 1
        })
        .await,
        "never claimed ahead"
    );
    // a drain too short for the waiting jobs: they are handed back, not left for rescue
    first.shutdown(Duration::from_millis(1)).await;
    assert_eq!(
        storage.count_in_flight(Some("default")).await.unwrap(),
        0,
        "claims were left open after shutdown"
    );
    let ran_before = seen.runs.lock().unwrap().len();
    assert!(
        ran_before < 200,
        "everything ran before shutdown ({ran_before})"
    );

    // another process runs the rest; every job runs exactly once, at attempt 1
    let second = start(client(&db, 4, 16, &seen).maintenance(fast_maintenance())).await;
    assert!(all_ran(&seen, 200).await, "not every job ran");
    assert!(
        eventually(Duration::from_secs(30), || async {
            storage.count_in_flight(Some("default")).await.unwrap() == 0
        })
        .await
    );
    second.shutdown(Duration::from_secs(10)).await;
    assert_each_ran_once(&seen, &ids);
    for id in &ids {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!(state.attempt, 1, "job {id} used an attempt while it waited");
    }
    db.cleanup().await;
}

/// Claiming ahead is bounded by time, not only by `claim_ahead`: one worker with 40-ms handlers
/// holds 5 jobs ahead (at most 200 ms of work), not the 96 it may; with handlers of a few
/// microseconds the same process claims far ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_claimed_ahead_are_at_most_two_hundred_milliseconds_of_work() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let seen = Arc::new(Observed::default());
    let slow = start(client(&db, 1, 96, &seen)).await;
    insert(&db, 30, 40).await;
    // the most jobs claimed and not yet completed, sampled while the 30 run (about 1.2 s)
    let mut peak_in_flight = 0;
    while seen.runs.lock().unwrap().len() < 30 {
        peak_in_flight =
            peak_in_flight.max(storage.count_in_flight(Some("default")).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    slow.shutdown(Duration::from_secs(10)).await;
    let largest_slow = largest_claim(&db).await;
    // one running + 5 ahead (200 ms / 40 ms); in flight also counts a completion or two waiting
    // for their flush (a fixed count of 96 made claims of 28 here)
    assert!(
        largest_slow <= 6,
        "a claim took {largest_slow} jobs of 40 ms for one worker"
    );
    assert!(
        peak_in_flight <= 9,
        "{peak_in_flight} jobs of 40 ms were claimed at once for one worker"
    );

    let fast = start(client(&db, 1, 96, &seen)).await;
    insert(&db, 400, 0).await;
    assert!(all_ran(&seen, 430).await, "not every job ran");
    fast.shutdown(Duration::from_secs(10)).await;
    let largest_fast = largest_claim(&db).await;
    assert!(
        largest_fast >= 30,
        "handlers of microseconds never claimed far ahead (largest claim {largest_fast})"
    );
    db.cleanup().await;
}

/// A handler that turns out long while jobs wait claimed behind it: they are handed back within a
/// bounded wait and another process runs them, long before the long handler ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_waiting_behind_a_handler_that_turned_out_long_are_handed_back() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let seen = Arc::new(Observed::default());
    let first = start(client(&db, 1, 40, &seen)).await;
    // short handlers first, so the client claims ahead, and all finished (their room is free);
    // 0 ms: their average lets the one worker claim 10 ahead within 200 ms of work (and 8, not
    // more: no warm-up claim takes more than the 11 below)
    insert(&db, 8, 0).await;
    assert!(all_ran(&seen, 8).await);
    assert!(
        eventually(Duration::from_secs(10), || async {
            storage.count_in_flight(Some("default")).await.unwrap() == 0
        })
        .await
    );
    // then one long job with 10 short ones behind it, in one segment: one claim takes all 11 (a
    // handler average up to 20 ms lets one worker claim 10 ahead), and the short ones that start
    // after the long one wait for the only worker
    let mut jobs = vec![NewJob::new(&Sleep { ms: 4_000 }).unwrap()];
    jobs.extend((0..10).map(|_| NewJob::new(&Sleep { ms: 1 }).unwrap()));
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = storage.insert_many(&mut conn, &jobs).await.unwrap();
    let inserted = std::time::Instant::now();
    let long_started = eventually(Duration::from_secs(10), || {
        let seen = Arc::clone(&seen);
        let long = ids[0];
        async move { seen.runs.lock().unwrap().contains_key(&long) }
    });
    assert!(long_started.await, "the long job did not start");
    assert_eq!(
        largest_claim(&db).await,
        11,
        "one claim did not take all 11 jobs"
    );
    // a second process, which also promotes the handed-back jobs
    let second = start(client(&db, 4, 8, &seen).maintenance(fast_maintenance())).await;
    let short_ran = eventually(Duration::from_secs(10), || {
        let seen = Arc::clone(&seen);
        let ids = ids.clone();
        async move {
            let runs = seen.runs.lock().unwrap();
            ids[1..].iter().all(|id| runs.contains_key(id))
        }
    });
    assert!(short_ran.await, "the short jobs never ran");
    let waited = inserted.elapsed();
    assert!(
        waited < Duration::from_millis(3_500),
        "the short jobs waited {waited:?}, behind the 4-s handler"
    );
    assert!(all_ran(&seen, 19).await);
    first.shutdown(Duration::from_secs(10)).await;
    second.shutdown(Duration::from_secs(10)).await;
    assert_each_ran_once(&seen, &ids);
    for id in &ids {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!((state.state.as_str(), state.attempt), ("completed", 1));
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_claim_ahead_over_ten_thousand_is_refused() {
    let db = TestDb::new().await;
    let seen = Arc::new(Observed::default());
    let mut builder = client(&db, 1, 10_001, &seen);
    builder = builder.maintenance(no_maintenance());
    match builder.build().await {
        Err(ringwork::Error::Config(message)) => {
            assert!(message.contains("claim_ahead"), "{message}")
        }
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("claim_ahead 10001 was accepted"),
    }
    db.cleanup().await;
}
