//! Unique jobs: one job per key under concurrent inserts, keys compared by kind, args, queue and
//! period and released when the job ends, cancel by key, and expiry of finished jobs' keys.

mod support;

use chrono::Utc;
use ringwork::{CancelOutcome, NewJob, Unique, UniqueState};
use serde_json::json;
use std::time::Duration;
use support::{insert_reporting, job, TestDb};

/// A unique job whose key stays held once it completed.
fn sticky() -> NewJob {
    NewJob::from_parts("sticky", json!({}))
        .unwrap()
        .unique(Unique::default().states(&[
            UniqueState::Available,
            UniqueState::Running,
            UniqueState::Completed,
        ]))
}

fn unique_job(args: serde_json::Value) -> NewJob {
    NewJob::from_parts("report", args)
        .unwrap()
        .unique(Unique::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_unique_inserts_make_exactly_one_job() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("default").await.unwrap();
    // Sixteen producers, each in its own transaction that lingers before committing, so the
    // second to arrive must wait for the first and then see its key.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let pool = db.pool.clone();
        let storage = storage.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let inserted = storage
                .insert_many_reporting(&mut tx, &[unique_job(json!({"day": "2026-11-30"}))])
                .await
                .unwrap()[0];
            // real time on purpose: the transaction stays open so the producers' transactions
            // overlap, which is the race under test
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.commit().await.unwrap();
            inserted
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let first = results[0].job_id;
    assert!(results.iter().all(|r| r.job_id == first), "{results:?}");
    assert_eq!(results.iter().filter(|r| !r.duplicate).count(), 1);
    let rows = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM {}.ready_entries WHERE kind = 'report'",
            db.schema
        ))
        .await;
    assert_eq!(rows, 1, "one job row for sixteen concurrent inserts");
    db.cleanup().await;
}

#[tokio::test]
async fn unique_keys_compare_kind_args_queue_and_period_and_are_released_when_the_job_ends() {
    let db = TestDb::new().await;
    let storage = db.storage();

    // key order in the args does not matter; different args do
    let a = insert_reporting(&db, &[unique_job(json!({"a": 1, "b": 2}))]).await[0];
    let again = insert_reporting(&db, &[unique_job(json!({"b": 2, "a": 1}))]).await[0];
    assert!(!a.duplicate && again.duplicate && again.job_id == a.job_id);
    let other = insert_reporting(&db, &[unique_job(json!({"a": 1, "b": 3}))]).await[0];
    assert!(!other.duplicate);

    // without by_queue another queue is still a duplicate; with it, not
    let elsewhere =
        insert_reporting(&db, &[unique_job(json!({"a": 1, "b": 2})).queue("other")]).await[0];
    assert!(elsewhere.duplicate);
    let by_queue = |q: &str| {
        NewJob::from_parts("report", json!({"q": 1}))
            .unwrap()
            .queue(q)
            .unique(Unique::default().by_queue())
    };
    let q1 = insert_reporting(&db, &[by_queue("default")]).await[0];
    let q2 = insert_reporting(&db, &[by_queue("other")]).await[0];
    let q2_again = insert_reporting(&db, &[by_queue("other")]).await[0];
    assert!(!q1.duplicate && !q2.duplicate && q2_again.duplicate);
    assert_ne!(q1.job_id, q2.job_id);

    // a period bucket: the same hour is a duplicate
    let hourly = || {
        NewJob::from_parts("report", json!({"hourly": true}))
            .unwrap()
            .unique(Unique::default().by_period(Duration::from_secs(3600)))
    };
    let h1 = insert_reporting(&db, &[hourly()]).await[0];
    let h2 = insert_reporting(&db, &[hourly()]).await[0];
    assert!(!h1.duplicate && h2.duplicate);

    // a scheduled job holds its key too; a mixed batch keeps input order
    let later = Utc::now() + chrono::Duration::hours(1);
    let batch = insert_reporting(
        &db,
        &[
            job(1),
            unique_job(json!({"scheduled": 1})).run_at(later),
            job(2),
            unique_job(json!({"scheduled": 1})),
        ],
    )
    .await;
    assert!(!batch[1].duplicate && batch[3].duplicate);
    assert_eq!(batch[1].job_id, batch[3].job_id);
    assert_eq!(
        storage
            .job_state(batch[1].job_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        "scheduled"
    );
    assert!(batch[0].job_id != batch[2].job_id && !batch[0].duplicate);

    // a rolled-back unique insert does not take the key
    {
        let mut tx = db.pool.begin().await.unwrap();
        let r = storage
            .insert_many_reporting(&mut tx, &[unique_job(json!({"rolled": "back"}))])
            .await
            .unwrap()[0];
        assert!(!r.duplicate);
        tx.rollback().await.unwrap();
    }
    assert!(!insert_reporting(&db, &[unique_job(json!({"rolled": "back"}))]).await[0].duplicate);

    // once the holder completes, the default states release the key; a unique job that also
    // counts `completed` stays deduplicated
    let s1 = insert_reporting(&db, &[sticky()]).await[0];
    let claimed = storage.claim("default", 100, None).await.unwrap();
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    assert!(storage
        .complete_batch(&attempts)
        .await
        .unwrap()
        .iter()
        .all(|o| *o == ringwork::Outcome::Applied));
    assert_eq!(
        storage.job_state(a.job_id).await.unwrap().unwrap().state,
        "completed"
    );
    let a_after = insert_reporting(&db, &[unique_job(json!({"a": 1, "b": 2}))]).await[0];
    assert!(
        !a_after.duplicate,
        "a completed holder releases a default key"
    );
    assert_ne!(a_after.job_id, a.job_id);
    let s2 = insert_reporting(&db, &[sticky()]).await[0];
    assert!(s2.duplicate && s2.job_id == s1.job_id);

    // bad options are refused before anything is written
    let empty = NewJob::from_parts("report", json!({}))
        .unwrap()
        .unique(Unique::default().states(&[]));
    let mut conn = db.pool.acquire().await.unwrap();
    assert!(storage.insert_many(&mut conn, &[empty]).await.is_err());
    drop(conn);
    db.cleanup().await;
}

#[tokio::test]
async fn cancel_by_unique_key_cancels_the_holder_and_releases_the_key() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let first = insert_reporting(&db, &[unique_job(json!({"user": 7}))]).await[0];
    assert_eq!(
        storage
            .cancel_unique(&unique_job(json!({"user": 7})), "no longer needed")
            .await
            .unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        storage
            .job_state(first.job_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        "cancelled"
    );
    assert_eq!(
        storage
            .cancel_unique(&unique_job(json!({"user": 8})), "x")
            .await
            .unwrap(),
        CancelOutcome::NotFound
    );
    assert!(
        storage.cancel_unique(&job(1), "x").await.is_err(),
        "needs unique options"
    );
    let second = insert_reporting(&db, &[unique_job(json!({"user": 7}))]).await[0];
    assert!(!second.duplicate, "a cancelled holder releases the key");
    // the cancelled job never runs: only the new one is claimed
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![second.job_id]
    );
    db.cleanup().await;
}

#[tokio::test]
async fn old_unique_keys_of_finished_jobs_expire_and_pending_ones_stay() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let done = insert_reporting(&db, &[unique_job(json!({"k": "done"}))]).await[0];
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&attempts).await.unwrap();
    let pending = insert_reporting(&db, &[unique_job(json!({"k": "pending"}))]).await[0];
    let fresh = insert_reporting(&db, &[unique_job(json!({"k": "fresh"}))]).await[0];
    let keys = || async {
        db.scalar_i64(&format!("SELECT count(*) FROM {}.unique_keys", db.schema))
            .await
    };
    assert_eq!(keys().await, 3);
    // age every key but the fresh one's past the retention
    db.exec(&format!(
        "UPDATE {}.unique_keys SET created_at = now() - interval '4 days' WHERE job_id <> {}",
        db.schema, fresh.job_id
    ))
    .await;
    // the fresh holder completes too: finished, but young, so kept
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let attempts: Vec<_> = claimed
        .iter()
        .filter(|j| j.job_id == fresh.job_id)
        .map(|j| j.attempt_ref())
        .collect();
    storage.complete_batch(&attempts).await.unwrap();
    let expired = storage
        .unique_keys_expire(Duration::from_secs(72 * 3600), 100)
        .await
        .unwrap();
    assert_eq!(expired, 1, "only the old key of the finished job goes");
    assert_eq!(keys().await, 2);
    // the pending job (claimed = running) still holds its key
    let again = insert_reporting(&db, &[unique_job(json!({"k": "pending"}))]).await[0];
    assert!(again.duplicate && again.job_id == pending.job_id);
    assert_ne!(done.job_id, pending.job_id);
    db.cleanup().await;
}

/// A unique key whose states include `completed`, tried while the prune of its completed
/// holder's slot commits: the lookup of the holder waits for the prune's locks with a snapshot
/// taken before (TRUNCATE is not MVCC-safe), so it found the holder nowhere and a second job took
/// the key. Both sides are driven: the prune holds its locks open until the insert waits on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_tried_while_its_holders_slot_is_pruned_stays_held() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let holder = insert_reporting(&db, &[sticky()]).await[0];
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&attempts).await.unwrap();
    let pruner = support::prune_held_open(&db).await;

    let mut conn = db.pool.acquire().await.unwrap();
    let inserting = tokio::spawn(async move {
        storage
            .insert_many_reporting(&mut conn, &[sticky()])
            .await
            .unwrap()[0]
    });
    assert!(
        support::one_waits_for_a_lock(&db).await,
        "the insert waits for the prune's locks"
    );
    pruner.commit().await.unwrap();
    let again = inserting.await.unwrap();
    assert!(
        again.duplicate && again.job_id == holder.job_id,
        "the completed holder keeps its key: {again:?}"
    );
    db.cleanup().await;
}
