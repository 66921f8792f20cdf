//! Retry policies: per kind and per queue, exponential with base, factor, cap
//! and jitter, or a function; the kind's policy wins; `RetryAfter` still sets its own delay; bad
//! values are refused when the client is built.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ringwork::testing;
use ringwork::{Client, Error, JobArgs, JobContext, JobError, NewJob, QueueConfig, RetryPolicy};
use serde::{Deserialize, Serialize};
use support::{eventually, queue, TestDb};

/// Always fails: with `after_ms`, asking for that delay itself (`RetryAfter`).
#[derive(Serialize, Deserialize)]
struct Flaky {
    after_ms: Option<u64>,
}

impl JobArgs for Flaky {
    const KIND: &'static str = "flaky";
}

#[derive(Serialize, Deserialize)]
struct Other {}

impl JobArgs for Other {
    const KIND: &'static str = "other";
}

/// Seconds until the job's next run, as stored: in deferred_jobs, or in the ring once promoted
/// (a short retry comes due, and is promoted, while a round runs on a loaded machine).
async fn next_run_in(db: &TestDb, id: i64) -> f64 {
    let sql = format!(
        "SELECT extract(epoch FROM x.run_at - now())::float8 FROM (
             SELECT run_at, run_lease FROM {s}.deferred_jobs WHERE job_id = $1
             UNION ALL SELECT run_at, run_lease FROM {s}.ready_entries WHERE job_id = $1) x
         ORDER BY x.run_lease DESC LIMIT 1",
        s = db.schema
    );
    sqlx::query_scalar(&sql)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Run the queue's due jobs once (the retries made due first), and return each job's remaining
/// delay with how long the round took: a delay counts from its close, inside the round, so the
/// remaining one is between `want - took` and `want`.
async fn one_round(db: &TestDb, client: &Client, queue: &str, ids: &[i64]) -> (Vec<f64>, f64) {
    let started = std::time::Instant::now();
    client.storage().run_deferred_now(queue).await.unwrap();
    // each job once: a short retry can come due again while the round runs (on a loaded machine)
    let once = testing::Drain {
        with_scheduled: false,
        max_runs: ids.len(),
    };
    let drained = testing::drain_with(client, queue, once).await.unwrap();
    assert_eq!(drained.retried(), ids.len(), "{:?}", drained.runs);
    let mut ran: Vec<i64> = drained.runs.iter().map(|r| r.job_id).collect();
    ran.sort();
    assert_eq!(
        ran,
        ids.iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    let mut delays = Vec::new();
    for id in ids {
        delays.push(next_run_in(db, *id).await);
    }
    (delays, started.elapsed().as_secs_f64())
}

fn close_to(got: f64, want: f64, took: f64) -> bool {
    got <= want + 0.01 && got >= want - took - 0.01
}

#[tokio::test]
async fn a_kind_policy_wins_over_its_queue_s_and_each_follows_its_curve() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", QueueConfig::default())
        .queue(
            "slow",
            QueueConfig {
                retry_policy: Some(RetryPolicy::custom(|attempt| {
                    Duration::from_secs(10 * attempt as u64)
                })),
                ..QueueConfig::default()
            },
        )
        .retry_policy::<Flaky>(RetryPolicy::exponential(
            Duration::from_millis(100),
            3.0,
            Duration::from_secs(1),
            0.0,
        ))
        .register(|_ctx: JobContext, job: Flaky| async move {
            Err::<(), JobError>(match job.after_ms {
                Some(ms) => JobError::RetryAfter(Duration::from_millis(ms), "asked".into()),
                None => JobError::retry("down"),
            })
        })
        .register(|_ctx: JobContext, _job: Other| async move {
            Err::<(), JobError>(JobError::retry("down"))
        })
        .build()
        .await
        .unwrap();
    let flaky = client
        .insert(NewJob::new(&Flaky { after_ms: None }).unwrap())
        .await
        .unwrap();
    // the kind's policy, also in a queue with a policy of its own
    let flaky_slow = client
        .insert(
            NewJob::new(&Flaky { after_ms: None })
                .unwrap()
                .queue("slow"),
        )
        .await
        .unwrap();
    // the queue's policy for a kind without one
    let other_slow = client
        .insert(NewJob::new(&Other {}).unwrap().queue("slow"))
        .await
        .unwrap();
    // the default curve: neither has a policy
    let other = client
        .insert(NewJob::new(&Other {}).unwrap())
        .await
        .unwrap();
    // RetryAfter keeps its own delay whatever the policy
    let asked = client
        .insert(
            NewJob::new(&Flaky {
                after_ms: Some(5_000),
            })
            .unwrap(),
        )
        .await
        .unwrap();

    // 100 ms x 3^(attempt - 1), capped at 1 s: 0.1, 0.3, 0.9, 1.0, 1.0
    for (round, want) in [0.1, 0.3, 0.9, 1.0, 1.0].into_iter().enumerate() {
        let (got, took) = one_round(&db, &client, "default", &[flaky, other, asked]).await;
        assert!(
            close_to(got[0], want, took),
            "kind policy: {got:?}, want {want}, took {took}"
        );
        assert!(close_to(got[2], 5.0, took), "RetryAfter: {got:?}");
        let (got, took) = one_round(&db, &client, "slow", &[flaky_slow, other_slow]).await;
        assert!(
            close_to(got[0], want, took),
            "kind policy in a slow queue: {got:?}"
        );
        // the queue's custom curve: 10 s x attempt
        let queue_want = 10.0 * (round + 1) as f64;
        assert!(
            close_to(got[1], queue_want, took),
            "queue policy: {got:?}, want {queue_want}"
        );
    }
    // the default curve: 2^5 s plus up to 10 %
    let default_delay = next_run_in(&db, other).await;
    assert!(
        (31.7..=35.3).contains(&default_delay),
        "default curve after the fifth attempt: {default_delay}"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn jitter_spreads_delays_within_its_share() {
    let policy =
        RetryPolicy::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(60), 0.5);
    let delays: Vec<f64> = (0..200).map(|_| policy.delay(3).as_secs_f64()).collect();
    assert!(delays.iter().all(|d| (4.0..=6.0).contains(d)), "{delays:?}");
    let spread = delays.iter().cloned().fold(f64::MIN, f64::max)
        - delays.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread > 0.5, "jitter spreads the delays: {spread}");
    // huge factors and attempts stay at the cap instead of overflowing
    let steep = RetryPolicy::exponential(Duration::from_secs(1), 1e6, Duration::from_secs(90), 0.0);
    assert_eq!(steep.delay(10_000), Duration::from_secs(90));
    // a custom curve that panics falls back to the default curve
    let broken = RetryPolicy::custom(|_| panic!("oops"));
    let d = broken.delay(1).as_secs_f64();
    assert!((2.0..=2.2).contains(&d), "{d}");
}

#[tokio::test]
async fn a_policy_that_makes_no_curve_is_refused_at_build() {
    let db = TestDb::new().await;
    let cases = [
        (
            RetryPolicy::exponential(Duration::from_secs(1), 0.5, Duration::from_secs(10), 0.1),
            "factor",
        ),
        (
            RetryPolicy::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(10), 1.5),
            "jitter",
        ),
        (
            RetryPolicy::exponential(Duration::from_secs(10), 2.0, Duration::from_secs(1), 0.1),
            "cap",
        ),
        (
            RetryPolicy::exponential(
                Duration::from_secs(1),
                f64::NAN,
                Duration::from_secs(10),
                0.1,
            ),
            "factor",
        ),
    ];
    for (policy, word) in cases {
        let by_kind = db
            .client()
            .retry_policy::<Flaky>(policy.clone())
            .build()
            .await;
        match by_kind {
            Err(Error::Config(msg)) => {
                assert!(msg.contains(word) && msg.contains("flaky"), "{msg}")
            }
            other => panic!(
                "{word}: expected a config error, got {:?}",
                other.map(|_| ())
            ),
        }
        let by_queue = db
            .client()
            .queue(
                "q",
                QueueConfig {
                    retry_policy: Some(policy),
                    ..QueueConfig::default()
                },
            )
            .build()
            .await;
        match by_queue {
            Err(Error::Config(msg)) => {
                assert!(msg.contains(word) && msg.contains("\"q\""), "{msg}")
            }
            other => panic!(
                "{word}: expected a config error, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct FailsFirst {
    fail_times: i32,
}

impl JobArgs for FailsFirst {
    const KIND: &'static str = "fails_first";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_retry_through_deferred_and_then_complete_or_fail_for_good() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", queue(4))
        .register(|ctx: JobContext, args: FailsFirst| async move {
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
        .insert(NewJob::new(&FailsFirst { fail_times: 2 }).unwrap())
        .await
        .unwrap();
    let exhausts = client
        .insert(
            NewJob::new(&FailsFirst { fail_times: 10 })
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
