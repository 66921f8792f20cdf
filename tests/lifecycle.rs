//! Job lifecycle: pause/resume, cancel in every state (and against a racing claim), priority
//! aging, job inspection.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{
    CancelOutcome, JobArgs, JobContext, JobError, JobStatus, NewJob, Outcome, QueueConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, TestDb};

fn job(n: i64) -> NewJob {
    NewJob::from_parts("noop", json!({ "n": n })).unwrap()
}

async fn enqueue(db: &TestDb, jobs: Vec<NewJob>) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage().insert_many(&mut conn, &jobs).await.unwrap()
}

async fn state(db: &TestDb, id: i64) -> String {
    db.storage()
        .job_state(id)
        .await
        .unwrap()
        .map(|s| s.state.to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_paused_queue_is_not_claimed_from_but_still_accepts_jobs() {
    let db = TestDb::new().await;
    let storage = db.storage();
    assert!(storage.set_queue_paused("default", true).await.unwrap());
    assert!(
        !storage.set_queue_paused("default", true).await.unwrap(),
        "already paused"
    );
    let id = enqueue(&db, vec![job(1)]).await[0];
    assert!(storage.claim("default", 10, None).await.unwrap().is_empty());
    assert_eq!(state(&db, id).await, "available");
    assert!(storage.set_queue_paused("default", false).await.unwrap());
    assert_eq!(
        storage.claim("default", 10, None).await.unwrap()[0].job_id,
        id
    );
    assert_eq!(state(&db, id).await, "running");
    db.cleanup().await;
}

#[tokio::test]
async fn cancel_reaches_a_job_in_every_state() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let ids = enqueue(&db, vec![job(1), job(2), job(3)]).await;
    let scheduled = enqueue(
        &db,
        vec![job(4).run_at(chrono::Utc::now() + chrono::Duration::hours(1))],
    )
    .await[0];
    assert_eq!(state(&db, scheduled).await, "scheduled");

    // available: tombstoned, the claim steps over it
    assert_eq!(
        storage.cancel_job(ids[0], "not needed").await.unwrap(),
        CancelOutcome::Cancelled
    );
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![ids[1], ids[2]]
    );
    assert_eq!(state(&db, ids[0]).await, "cancelled");
    // scheduled
    assert_eq!(
        storage.cancel_job(scheduled, "no").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    assert_eq!(state(&db, scheduled).await, "cancelled");
    // running: its claim closes; the late completion is stale
    assert_eq!(
        storage.cancel_job(ids[1], "stop").await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    assert_eq!(
        storage
            .complete_batch(&[claimed[0].attempt_ref()])
            .await
            .unwrap(),
        vec![Outcome::Stale]
    );
    assert_eq!(state(&db, ids[1]).await, "cancelled");
    // finished
    storage
        .complete_batch(&[claimed[1].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(state(&db, ids[2]).await, "completed");
    assert_eq!(
        storage.cancel_job(ids[2], "late").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    assert_eq!(
        storage.cancel_job(ids[0], "again").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    assert_eq!(
        storage.cancel_job(999_999, "x").await.unwrap(),
        CancelOutcome::NotFound
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_claim_of_the_same_available_job_never_both_win() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (mut as_available, mut as_running) = (0, 0);
    for n in 0..40 {
        let id = enqueue(&db, vec![job(n)]).await[0];
        let (claimed, cancelled) = tokio::join!(
            storage.claim("default", 1, None),
            storage.cancel_job(id, "race")
        );
        let claimed = claimed.unwrap();
        match cancelled.unwrap() {
            CancelOutcome::Cancelled => {
                assert!(
                    claimed.is_empty(),
                    "job {id} was tombstoned as available yet claimed"
                );
                as_available += 1;
            }
            CancelOutcome::CancelledRunning => {
                assert_eq!(claimed.len(), 1, "cancelled as running, so it was claimed");
                assert_eq!(
                    storage
                        .complete_batch(&[claimed[0].attempt_ref()])
                        .await
                        .unwrap(),
                    vec![Outcome::Stale],
                    "and its completion loses"
                );
                as_running += 1;
            }
            other => panic!("job {id}: unexpected {other:?}"),
        }
        assert_eq!(state(&db, id).await, "cancelled");
        assert!(
            storage.claim("default", 1, None).await.unwrap().is_empty(),
            "nothing left to run"
        );
    }
    assert_eq!(as_available + as_running, 40);
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Long {}
impl JobArgs for Long {
    const KIND: &'static str = "long";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_is_told_it_was_cancelled() {
    let db = TestDb::new().await;
    let noticed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&noticed);
    let client = db
        .client()
        .queue(
            "default",
            QueueConfig {
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, _args: Long| {
            let flag = Arc::clone(&flag);
            async move {
                tokio::select! {
                    _ = ctx.cancelled() => flag.store(true, Ordering::SeqCst),
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let id = client.insert(NewJob::new(&Long {}).unwrap()).await.unwrap();
    let running = client.start().await.unwrap();
    let started =
        eventually(Duration::from_secs(10), || {
            let db_state = db.storage();
            async move {
                db_state.job_state(id).await.unwrap().map(|s| s.state) == Some(JobStatus::Running)
            }
        })
        .await;
    assert!(started);
    // The cancel reaches the handler through NOTIFY: wait until the client's listener has issued
    // its LISTEN on the cancel channel (the heartbeat fallback would take stale_after / 4).
    let channel = format!("ringwork_{}_cancel", db.schema);
    let listening = eventually(Duration::from_secs(10), || {
        let pool = db.pool.clone();
        let channel = channel.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                WHERE query LIKE 'LISTEN%' AND position($1 in query) > 0)",
            )
            .bind(channel)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    assert!(listening, "the client never listened on {channel}");
    assert_eq!(
        client.cancel(id).await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    let told = eventually(Duration::from_secs(10), || {
        let noticed = Arc::clone(&noticed);
        async move { noticed.load(Ordering::SeqCst) }
    })
    .await;
    let stale = eventually(Duration::from_secs(5), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.stale() == 1 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(told, "the handler saw ctx.cancelled()");
    assert!(stale, "its completion was reported stale");
    assert_eq!(state(&db, id).await, "cancelled");
    db.cleanup().await;
}

#[tokio::test]
async fn priority_aging_lets_an_old_low_priority_job_through_a_steady_high_priority_stream() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let low = enqueue(&db, vec![job(0).priority(4)]).await[0];
    let aging = Duration::from_millis(100);
    // without aging the stream would starve it; with 100 ms aging it must run once it has waited
    // 3 levels' worth (300 ms), while fresh priority-1 jobs keep arriving
    let started = std::time::Instant::now();
    let mut ran_after = None;
    for n in 0..60 {
        enqueue(&db, vec![job(n).priority(1), job(n).priority(1)]).await;
        let claimed = storage
            .claim_aged("default", 1, None, Some(aging))
            .await
            .unwrap();
        if claimed.iter().any(|j| j.job_id == low) {
            ran_after = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waited = ran_after.expect("the low-priority job starved");
    assert!(
        waited >= Duration::from_millis(300),
        "ran too early: {waited:?}"
    );
    // four levels (a tie at effective priority 1 goes to the real priority-1 lane): 400 ms + slack
    assert!(
        waited < Duration::from_millis(2000),
        "aging bound exceeded: {waited:?}"
    );
    // and without aging, priority is strict
    let low2 = enqueue(&db, vec![job(1).priority(4)]).await[0];
    enqueue(&db, vec![job(2).priority(1)]).await;
    db.advance_clock(Duration::from_millis(400)).await;
    let strict = storage.claim("default", 1, None).await.unwrap();
    assert_ne!(strict[0].job_id, low2);
    db.cleanup().await;
}

#[tokio::test]
async fn a_snooze_runs_the_job_later_without_using_an_attempt() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1).max_attempts(1)]).await;
    let first = storage.claim("default", 1, None).await.unwrap().remove(0);
    let at = chrono::Utc::now() + chrono::Duration::milliseconds(200);
    let snoozed = storage
        .close_batch(&[(first.attempt_ref(), ringwork::CloseOutcome::Snooze { at })])
        .await
        .unwrap();
    assert_eq!(snoozed, vec![Outcome::Applied]);
    assert_eq!(storage.promote_due(10).await.unwrap(), 0, "not due yet");
    let promoted = eventually(Duration::from_secs(5), || {
        let storage = storage.clone();
        async move { storage.promote_due(10).await.unwrap() == 1 }
    })
    .await;
    assert!(promoted, "the snoozed job never became due");
    let second = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(second.attempt, 1, "the snooze did not use the only attempt");
    assert_eq!(
        second.run_lease,
        first.run_lease + 1,
        "but the run_lease still moved on"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn exhausted_jobs_of_a_dead_letter_queue_can_be_listed_retried_once_and_purged() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage
        .set_queue_dead_letter("default", true)
        .await
        .unwrap();
    let ids = enqueue(&db, vec![job(1), job(2), job(3).max_attempts(1)]).await;
    let claimed = storage.claim("default", 3, None).await.unwrap();
    let fail = |j: &ringwork::ClaimedJob| {
        (
            j.attempt_ref(),
            ringwork::CloseOutcome::Failed {
                error: format!("boom {}", j.job_id),
            },
        )
    };
    storage
        .close_batch(&[fail(&claimed[0]), fail(&claimed[1])])
        .await
        .unwrap();
    // exhausted by rescue also lands in the DLQ
    db.advance_clock(Duration::from_millis(150)).await;
    assert_eq!(
        storage
            .rescue(Duration::from_millis(100), 100)
            .await
            .unwrap(),
        1
    );

    let dead = storage.dlq_list(Some("default"), 10).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.job_id).collect::<Vec<_>>(), ids);
    assert_eq!(
        dead[0].error.as_deref(),
        Some(format!("boom {}", ids[0]).as_str())
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.done_entries").await,
        0,
        "not failed history"
    );
    assert_eq!(state(&db, ids[0]).await, "dead_lettered");

    // two concurrent retries: exactly one wins
    let (a, b) = tokio::join!(storage.dlq_retry(ids[0]), storage.dlq_retry(ids[0]));
    assert!(a.unwrap() ^ b.unwrap(), "exactly one retry takes the job");
    assert_eq!(storage.promote_due(10).await.unwrap(), 1);
    let again = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(again.job_id, ids[0]);
    assert_eq!(again.attempt, 1, "fresh attempts");
    assert!(
        again.run_lease > claimed[0].run_lease,
        "a higher run_lease, never a reset one"
    );

    assert_eq!(storage.dlq_purge(None, Some(ids[1])).await.unwrap(), 1);
    assert_eq!(
        storage.dlq_expire(Duration::ZERO, 100).await.unwrap(),
        1,
        "retention removes the rest"
    );
    assert!(storage.dlq_list(None, 10).await.unwrap().is_empty());
    db.cleanup().await;
}

#[tokio::test]
async fn many_jobs_due_at_once_are_promoted_in_bounded_batches_in_run_at_order() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // 250 jobs inserted in one call with run_at descending: job i is due (250 - i) ms after base.
    let base = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let jobs: Vec<_> = (0..250)
        .map(|i| job(i).run_at(base + chrono::Duration::milliseconds(250 - i)))
        .collect();
    let ids = enqueue(&db, jobs).await;
    assert_eq!(storage.promote_due(100).await.unwrap(), 0, "none due yet");
    db.advance_clock(Duration::from_millis(1900)).await;
    let batches = [
        storage.promote_due(100).await.unwrap(),
        storage.promote_due(100).await.unwrap(),
        storage.promote_due(100).await.unwrap(),
        storage.promote_due(100).await.unwrap(),
    ];
    assert_eq!(batches, [100, 100, 50, 0], "bounded batches");
    let mut order = Vec::new();
    loop {
        let claimed = storage.claim("default", 64, None).await.unwrap();
        if claimed.is_empty() {
            break;
        }
        order.extend(claimed.iter().map(|j| j.job_id));
    }
    let expected: Vec<i64> = ids.iter().rev().copied().collect();
    assert_eq!(
        order, expected,
        "claimed in run_at order across promotion batches"
    );
    db.cleanup().await;
}

/// A claim never waits for a shard: shards locked by someone's open transaction (here every shard
/// of the queue, as a cancel inside a long transaction would) are skipped, so claims of the queue
/// keep going (here: return empty at once) instead of hanging until that transaction ends.
#[tokio::test]
async fn a_claim_does_not_wait_for_shards_held_by_an_open_transaction() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1)]).await;
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {}.queue_lanes WHERE queue = 'default' FOR UPDATE",
        db.schema
    ))
    .execute(&mut *holder)
    .await
    .unwrap();
    let claim = tokio::time::timeout(Duration::from_secs(5), storage.claim("default", 10, None))
        .await
        .expect("claim returned while the shards were held")
        .unwrap();
    assert!(claim.is_empty(), "the held shards were skipped");
    holder.rollback().await.unwrap();
    assert_eq!(storage.claim("default", 10, None).await.unwrap().len(), 1);
    db.cleanup().await;
}
