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
