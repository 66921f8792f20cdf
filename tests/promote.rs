//! Scheduled jobs: promotion of due jobs in bounded batches, in run_at order, and a snooze that
//! runs the job later without using an attempt.

mod support;

use ringwork::Outcome;
use std::time::Duration;
use support::{enqueue, eventually, job, TestDb};

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

/// The maintenance leader sleeps until the earliest deferred job is due, so every path that makes
/// one due sooner must tell it (`wake_promotion()`, on `ringwork_<schema>.maintenance`); the
/// successful completion of a batch, the hot path, tells nobody.
#[tokio::test]
async fn every_path_that_makes_a_deferred_job_due_sooner_wakes_the_leader_and_completion_does_not()
{
    use sqlx::postgres::PgListener;
    let db = TestDb::new().await;
    let storage = db.storage();
    let channel = db.schema.maintenance_channel();
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen(&channel).await.unwrap();
    // What arrives next on the channel, after `what` committed: the sentinel sent after it comes
    // first when `what` sent nothing.
    async fn next(listener: &mut PgListener, db: &TestDb, channel: &str) -> String {
        db.exec(&format!("NOTIFY \"{channel}\", 'sentinel'")).await;
        let n = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .expect("a notification within 10 s")
            .unwrap();
        let payload = n.payload().to_string();
        if payload != "sentinel" {
            // drain the sentinel
            let s = listener.recv().await.unwrap();
            assert_eq!(s.payload(), "sentinel");
        }
        payload
    }
    storage
        .set_queue_dead_letter("default", true)
        .await
        .unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);

    // a scheduled insert
    let ids = enqueue(
        &db,
        vec![job(1).run_at(later), job(2).max_attempts(1), job(3)],
    )
    .await;
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "scheduled insert"
    );
    // an operator's retry of it (due now)
    assert!(storage.retry_job(ids[0]).await.unwrap());
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "retry_job"
    );
    // run-now of a queue's scheduled jobs
    storage.promote_due(10).await.unwrap();
    enqueue(&db, vec![job(4).run_at(later)]).await;
    assert_eq!(next(&mut listener, &db, &channel).await, "deferred");
    assert_eq!(storage.run_deferred_now("default").await.unwrap(), 1);
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "run now"
    );
    storage.promote_due(10).await.unwrap();

    // claims: a successful completion is silent; a snooze and a retry are not
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let by_id = |id: i64| {
        claimed
            .iter()
            .find(|c| c.job_id == id)
            .expect("claimed")
            .attempt_ref()
    };
    storage.complete_batch(&[by_id(ids[2])]).await.unwrap();
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "sentinel",
        "completion"
    );
    storage
        .close_batch(&[(by_id(ids[0]), ringwork::CloseOutcome::Snooze { at: later })])
        .await
        .unwrap();
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "snooze"
    );
    // a terminal failure into the dead-letter queue is silent, its retry is not
    storage
        .close_batch(&[(
            by_id(ids[1]),
            ringwork::CloseOutcome::Failed { error: "no".into() },
        )])
        .await
        .unwrap();
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "sentinel",
        "dead-lettered"
    );
    assert!(storage.dlq_retry(ids[1]).await.unwrap());
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "dead-letter retry"
    );
    storage.promote_due(10).await.unwrap();
    let again = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(again.len(), 1);
    storage
        .close_batch(&[(
            again[0].attempt_ref(),
            ringwork::CloseOutcome::Retry {
                at: later,
                error: "again".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "retry"
    );

    // an operator's bulk retry of scheduled jobs
    enqueue(&db, vec![job(5).run_at(later)]).await;
    assert_eq!(next(&mut listener, &db, &channel).await, "deferred");
    let scheduled = ringwork::JobFilter {
        queue: Some("default".into()),
        kind: None,
        states: vec![ringwork::JobStatus::Scheduled],
        older_than: None,
    };
    assert!(storage.bulk_retry(&scheduled).await.unwrap().changed >= 1);
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "bulk retry"
    );
    storage.promote_due(10).await.unwrap();

    // a callback answered with a retry
    let (_waiting, callback) =
        support::waiting_job(&db, &storage, "callbacks", 3, Duration::from_secs(60)).await;
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "sentinel",
        "a wait"
    );
    storage
        .resolve_callback(
            &callback,
            ringwork::CallbackAction::Retry {
                error: "again".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        next(&mut listener, &db, &channel).await,
        "deferred",
        "callback retry"
    );

    // a moved engine clock makes every service due
    db.advance_clock(Duration::from_secs(1)).await;
    assert_eq!(next(&mut listener, &db, &channel).await, "clock");
    db.cleanup().await;
}

/// A leader that promoted and found the next deferred job an hour away waits up to its idle bound
/// (5 s) before it looks again; a job made due meanwhile tells it, and runs at the next tick.
#[tokio::test]
async fn a_deferred_job_made_due_while_the_leader_sleeps_runs_at_the_next_tick() {
    use ringwork::{JobContext, JobError, NewJob};
    use support::{state, Count};
    let db = TestDb::new().await;
    let storage = db.storage();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let scheduled = |n| NewJob::new(&Count { n }).unwrap().run_at(later);
    let ids = enqueue(&db, vec![scheduled(1), scheduled(2)]).await;
    // no rotation, so no prune adds a promotion to its pass
    let maintenance = ringwork::MaintenanceConfig {
        tick: Duration::from_millis(50),
        rotate_interval: Duration::from_secs(3600),
        ..ringwork::MaintenanceConfig::default()
    };
    let client = db
        .client()
        .maintenance(maintenance)
        .queue("default", support::queue(1))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    // listening before anything is asked: a LISTEN that came later would make every service due
    // by itself (the notifications it may have missed), and prove nothing
    support::listener_pid(&db, &db.schema.notify_channel())
        .await
        .expect("the client listens");
    let completed = |id: i64| {
        let db = &db;
        async move { state(db, id).await == "completed" }
    };
    // the first may meet the leader's first pass; once it ran, the leader has promoted and sleeps
    assert!(storage.retry_job(ids[0]).await.unwrap());
    assert!(eventually(Duration::from_secs(10), || completed(ids[0])).await);
    let asked = std::time::Instant::now();
    assert!(storage.retry_job(ids[1]).await.unwrap());
    assert!(eventually(Duration::from_secs(10), || completed(ids[1])).await);
    assert!(
        asked.elapsed() < Duration::from_millis(2500),
        "ran {:?} after it was made due: the leader slept through its notification",
        asked.elapsed()
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
