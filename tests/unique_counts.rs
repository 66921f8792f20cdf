//! Unique jobs (dedupe, concurrency, release, cancel by key), exact per-queue counts across prune,
//! and the terminal_jobs view.

mod support;

use std::time::Duration;

use chrono::Utc;
use ringwork::maintenance::{tick, MaintenanceConfig};
use ringwork::{CancelOutcome, CloseOutcome, NewJob, QueueCounts, Unique, UniqueState};
use serde_json::json;
use support::TestDb;

fn job(n: i64) -> NewJob {
    NewJob::from_parts("noop", json!({ "n": n })).unwrap()
}

fn unique_job(args: serde_json::Value) -> NewJob {
    NewJob::from_parts("report", args)
        .unwrap()
        .unique(Unique::default())
}

async fn insert(db: &TestDb, jobs: &[NewJob]) -> Vec<ringwork::Inserted> {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage()
        .insert_many_reporting(&mut conn, jobs)
        .await
        .unwrap()
}

async fn counts(db: &TestDb, queue: &str) -> QueueCounts {
    let mut all = db.storage().queue_counts(Some(queue)).await.unwrap();
    assert_eq!(all.len(), 1, "one row for queue {queue}");
    all.remove(0)
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
    let a = insert(&db, &[unique_job(json!({"a": 1, "b": 2}))]).await[0];
    let again = insert(&db, &[unique_job(json!({"b": 2, "a": 1}))]).await[0];
    assert!(!a.duplicate && again.duplicate && again.job_id == a.job_id);
    let other = insert(&db, &[unique_job(json!({"a": 1, "b": 3}))]).await[0];
    assert!(!other.duplicate);

    // without by_queue another queue is still a duplicate; with it, not
    let elsewhere = insert(&db, &[unique_job(json!({"a": 1, "b": 2})).queue("other")]).await[0];
    assert!(elsewhere.duplicate);
    let by_queue = |q: &str| {
        NewJob::from_parts("report", json!({"q": 1}))
            .unwrap()
            .queue(q)
            .unique(Unique::default().by_queue())
    };
    let q1 = insert(&db, &[by_queue("default")]).await[0];
    let q2 = insert(&db, &[by_queue("other")]).await[0];
    let q2_again = insert(&db, &[by_queue("other")]).await[0];
    assert!(!q1.duplicate && !q2.duplicate && q2_again.duplicate);
    assert_ne!(q1.job_id, q2.job_id);

    // a period bucket: the same hour is a duplicate
    let hourly = || {
        NewJob::from_parts("report", json!({"hourly": true}))
            .unwrap()
            .unique(Unique::default().by_period(Duration::from_secs(3600)))
    };
    let h1 = insert(&db, &[hourly()]).await[0];
    let h2 = insert(&db, &[hourly()]).await[0];
    assert!(!h1.duplicate && h2.duplicate);

    // a scheduled job holds its key too; a mixed batch keeps input order
    let later = Utc::now() + chrono::Duration::hours(1);
    let batch = insert(
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
    assert!(!insert(&db, &[unique_job(json!({"rolled": "back"}))]).await[0].duplicate);

    // once the holder completes, the default states release the key; a unique job that also
    // counts `completed` stays deduplicated
    let sticky = || {
        NewJob::from_parts("sticky", json!({}))
            .unwrap()
            .unique(Unique::default().states(&[
                UniqueState::Available,
                UniqueState::Running,
                UniqueState::Completed,
            ]))
    };
    let s1 = insert(&db, &[sticky()]).await[0];
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
    let a_after = insert(&db, &[unique_job(json!({"a": 1, "b": 2}))]).await[0];
    assert!(
        !a_after.duplicate,
        "a completed holder releases a default key"
    );
    assert_ne!(a_after.job_id, a.job_id);
    let s2 = insert(&db, &[sticky()]).await[0];
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
    let first = insert(&db, &[unique_job(json!({"user": 7}))]).await[0];
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
    let second = insert(&db, &[unique_job(json!({"user": 7}))]).await[0];
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
async fn counts_are_exact_in_every_state_and_stay_exact_across_prune() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let q = "counts";
    let on = |n: i64| job(n).queue(q);

    // Phase 1: 100 jobs (a COPY batch), all completed, in the first queue slot, so that slot can
    // later be pruned.
    let first: Vec<_> = (0..100).map(on).collect();
    insert(&db, &first).await;
    let claimed = storage.claim(q, 100, None).await.unwrap();
    assert_eq!(claimed.len(), 100);
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&attempts).await.unwrap();
    assert_eq!(counts(&db, q).await.completed, 100);

    // Phase 2, in a later slot: a rolled-back insert leaves a gap in the lane
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    {
        let mut tx = db.pool.begin().await.unwrap();
        storage
            .insert_many(&mut tx, &(0..5).map(on).collect::<Vec<_>>())
            .await
            .unwrap();
        tx.rollback().await.unwrap();
    }
    let batch: Vec<_> = (0..80).map(on).collect(); // COPY path, one segment
    let ids = insert(&db, &batch).await;
    let singles: Vec<_> = (0..4).map(on).collect();
    for single in singles {
        insert(&db, &[single]).await;
    }
    let later = Utc::now() + chrono::Duration::hours(1);
    insert(&db, &[on(900).run_at(later), on(901).run_at(later)]).await;
    // claim 6 of the 80: complete 2, fail 1 for good, retry 1, cancel-while-running 1, keep 1
    let claimed = storage.claim(q, 6, None).await.unwrap();
    assert_eq!(claimed.len(), 6);
    let a: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&a[0..2]).await.unwrap();
    storage
        .close_batch(&[
            (
                a[2],
                CloseOutcome::Failed {
                    error: "boom".into(),
                },
            ),
            (
                a[3],
                CloseOutcome::Retry {
                    at: later,
                    error: "again".into(),
                },
            ),
        ])
        .await
        .unwrap();
    assert_eq!(
        storage.cancel_job(a[4].job_id, "stop").await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    // cancel one available job (a tombstone above the cursor)
    assert_eq!(
        storage.cancel_job(ids[50].job_id, "nope").await.unwrap(),
        CancelOutcome::Cancelled
    );
    // a dead-letter queue with one entry
    storage.set_queue_dead_letter("dlq", true).await.unwrap();
    insert(&db, &[job(1).queue("dlq")]).await;
    let d = storage.claim("dlq", 1, None).await.unwrap()[0].attempt_ref();
    storage
        .close_batch(&[(
            d,
            CloseOutcome::Failed {
                error: "bad".into(),
            },
        )])
        .await
        .unwrap();

    let expected = QueueCounts {
        queue: q.to_string(),
        paused: false,
        available: 80 - 6 - 1 + 4,
        scheduled: 2,
        retryable: 1,
        running: 1,
        completed: 102,
        failed: 1,
        cancelled: 2,
        dead_lettered: 0,
        waiting: 0,
    };
    assert_eq!(counts(&db, q).await, expected);
    assert_eq!(counts(&db, "dlq").await.dead_lettered, 1);
    // the view agrees with the counts
    let view = |state: &str| {
        format!(
            "SELECT count(*) FROM {}.terminal_jobs WHERE queue = '{q}' AND state = '{state}'",
            db.schema
        )
    };
    assert_eq!(db.scalar_i64(&view("completed")).await, 102);
    assert_eq!(db.scalar_i64(&view("failed")).await, 1);
    assert_eq!(db.scalar_i64(&view("cancelled")).await, 2);
    let error: Option<String> = sqlx::query_scalar(&format!(
        "SELECT error FROM {}.terminal_jobs WHERE job_id = $1",
        db.schema
    ))
    .bind(a[2].job_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(error.as_deref(), Some("boom"));
    let record = storage.load_job(a[2].job_id).await.unwrap().unwrap();
    assert_eq!(record.state.state, "failed");
    assert_eq!(
        record
            .history
            .iter()
            .map(|h| (h.state.as_str(), h.error.as_deref()))
            .collect::<Vec<_>>(),
        vec![("failed", Some("boom"))]
    );
    let record = storage.load_job(a[3].job_id).await.unwrap().unwrap();
    assert_eq!(record.state.state, "retryable");
    assert_eq!(record.history[0].state, "retryable");
    assert_eq!(record.history[0].error.as_deref(), Some("again"));
    let record = storage.load_job(a[0].job_id).await.unwrap().unwrap();
    assert_eq!(record.history.len(), 1);
    assert_eq!(record.history[0].state, "completed");

    // Rotate and prune everything prunable: the first queue slot (all 100 completed) goes, its
    // completions archived and counted in terminal_totals; every count is unchanged.
    let config = MaintenanceConfig {
        rotate_interval: Duration::ZERO,
        ..MaintenanceConfig::default()
    };
    let mut pruned = 0;
    for _ in 0..40 {
        let report = tick(&storage, &config).await.unwrap();
        pruned += report.pruned_queue_slots.len();
    }
    assert!(pruned >= 1, "the fully completed slot was pruned");
    let after = counts(&db, q).await;
    assert_eq!(
        after, expected,
        "every count exact after prune: completed is a durable total (terminal_totals), though \
         the ring's view keeps only the unpruned slot's completions"
    );
    assert_eq!(db.scalar_i64(&view("completed")).await, 2);
    assert_eq!(
        storage.count_in_flight(Some(q)).await.unwrap(),
        1,
        "the running job is still in flight"
    );
    // the per-queue count (one probe per claim batch) agrees with the global one (sums)
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 1);
    // and draining the rest makes the available count reach zero exactly
    let mut drained = 0;
    loop {
        let got = storage.claim(q, 64, None).await.unwrap().len();
        if got == 0 {
            break;
        }
        drained += got as i64;
    }
    assert_eq!(drained, expected.available);
    let c = counts(&db, q).await;
    assert_eq!((c.available, c.running), (0, 1 + expected.available));
    db.cleanup().await;
}

#[tokio::test]
async fn old_unique_keys_of_finished_jobs_expire_and_pending_ones_stay() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let done = insert(&db, &[unique_job(json!({"k": "done"}))]).await[0];
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&attempts).await.unwrap();
    let pending = insert(&db, &[unique_job(json!({"k": "pending"}))]).await[0];
    let fresh = insert(&db, &[unique_job(json!({"k": "fresh"}))]).await[0];
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
    let again = insert(&db, &[unique_job(json!({"k": "pending"}))]).await[0];
    assert!(again.duplicate && again.job_id == pending.job_id);
    assert_ne!(done.job_id, pending.job_id);
    db.cleanup().await;
}

#[tokio::test]
async fn in_flight_per_queue_is_exact_when_one_completion_batch_spans_queues_and_claim_batches() {
    let db = TestDb::new().await;
    let storage = db.storage();
    for queue in ["flight_a", "flight_b"] {
        let jobs: Vec<NewJob> = (0..10).map(|n| job(n).queue(queue)).collect();
        insert(&db, &jobs).await;
    }
    let a = storage.claim("flight_a", 10, None).await.unwrap();
    let b = storage.claim("flight_b", 10, None).await.unwrap();
    assert_eq!((a.len(), b.len()), (10, 10));
    // one completion batch with jobs of both queues, not contiguous within either claim batch
    let mixed: Vec<_> = [&a[1], &a[4], &a[7], &b[0], &b[2], &b[3], &b[9]]
        .iter()
        .map(|j| j.attempt_ref())
        .collect();
    storage.complete_batch(&mixed).await.unwrap();
    storage
        .complete_batch(&[a[0].attempt_ref(), a[9].attempt_ref()])
        .await
        .unwrap();
    storage
        .close_batch(&[(
            b[5].attempt_ref(),
            CloseOutcome::Retry {
                at: Utc::now(),
                error: "again".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(storage.count_in_flight(Some("flight_a")).await.unwrap(), 5);
    assert_eq!(storage.count_in_flight(Some("flight_b")).await.unwrap(), 5);
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 10);
    assert_eq!(counts(&db, "flight_a").await.running, 5);
    db.cleanup().await;
}

#[tokio::test]
async fn oldest_available_wait_follows_the_queue_head_and_skips_open_transactions() {
    let db = TestDb::new().await;
    let storage = db.storage();
    assert_eq!(storage.oldest_available_wait("wait_q").await.unwrap(), None);
    // a producer transaction still open: its job is not available yet
    let mut open = db.pool.begin().await.unwrap();
    storage
        .insert(&mut open, &job(0).queue("wait_q"))
        .await
        .unwrap();
    insert(&db, &[job(1).queue("wait_q"), job(2).queue("wait_q")]).await;
    db.advance_clock(Duration::from_millis(1200)).await;
    let waited = storage
        .oldest_available_wait("wait_q")
        .await
        .unwrap()
        .expect("two committed jobs are available");
    assert!(
        waited >= Duration::from_millis(1100) && waited < Duration::from_secs(30),
        "{waited:?}"
    );
    let claimed = storage.claim("wait_q", 10, None).await.unwrap();
    assert_eq!(
        claimed.len(),
        2,
        "the open transaction's job is not claimable"
    );
    assert_eq!(
        storage.oldest_available_wait("wait_q").await.unwrap(),
        None,
        "nothing committed is left"
    );
    open.commit().await.unwrap();
    let waited = storage
        .oldest_available_wait("wait_q")
        .await
        .unwrap()
        .expect("committed now");
    assert!(waited >= Duration::from_millis(1100), "{waited:?}");
    db.cleanup().await;
}
