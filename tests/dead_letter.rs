//! The dead-letter queue: exhausted jobs of a queue that dead-letters are listed, retried once
//! and purged.

mod support;

use std::time::Duration;
use support::{enqueue, job, state, TestDb};

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
