//! Exact counts: per queue in every state and across prune (with the terminal_jobs view), in
//! flight per queue when one batch spans queues, and a queue's oldest available wait.

mod support;

use chrono::Utc;
use ringwork::{Admin, MaintenanceConfig};
use ringwork::{CancelOutcome, CloseOutcome, NewJob, QueueCounts};
use std::time::Duration;
use support::{insert_reporting, job, TestDb};

async fn counts(db: &TestDb, queue: &str) -> QueueCounts {
    let mut all = db.storage().queue_counts(Some(queue)).await.unwrap();
    assert_eq!(all.len(), 1, "one row for queue {queue}");
    all.remove(0)
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
    insert_reporting(&db, &first).await;
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
    let ids = insert_reporting(&db, &batch).await;
    let singles: Vec<_> = (0..4).map(on).collect();
    for single in singles {
        insert_reporting(&db, &[single]).await;
    }
    let later = Utc::now() + chrono::Duration::hours(1);
    insert_reporting(&db, &[on(900).run_at(later), on(901).run_at(later)]).await;
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
    insert_reporting(&db, &[job(1).queue("dlq")]).await;
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
        pending: 0,
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
        let report = Admin::from(storage.clone())
            .run_maintenance(&config)
            .await
            .unwrap();
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
async fn in_flight_per_queue_is_exact_when_one_completion_batch_spans_queues_and_claim_batches() {
    let db = TestDb::new().await;
    let storage = db.storage();
    for queue in ["flight_a", "flight_b"] {
        let jobs: Vec<NewJob> = (0..10).map(|n| job(n).queue(queue)).collect();
        insert_reporting(&db, &jobs).await;
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
    insert_reporting(&db, &[job(1).queue("wait_q"), job(2).queue("wait_q")]).await;
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

/// A count that starts while a prune of a slot holding completions is committing sees the
/// completions either in the ring or in the totals the prune recorded, never in neither. TRUNCATE
/// is not MVCC-safe: a statement whose snapshot predates the prune's commit, and that waits for the
/// slot's lock, would find the slot empty and the totals row invisible. Both sides are driven
/// explicitly: the prune holds its locks in an open transaction until the count is seen waiting.
/// Three jobs completed in a sealed queue slot, and a prune of that slot in a transaction kept
/// open (its children locked and truncated; its totals, archive and ledger rows not yet visible).
async fn completed_then_pruning(
    db: &TestDb,
) -> (Vec<i64>, sqlx::Transaction<'static, sqlx::Postgres>) {
    let storage = db.storage();
    let ids = support::enqueue(db, (0..3).map(job).collect()).await;
    let claimed = storage.claim("default", 3, None).await.unwrap();
    assert_eq!(claimed.len(), ids.len());
    let attempts: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&attempts).await.unwrap();
    assert_eq!(counts(db, "default").await.completed, 3);
    (ids, support::prune_held_open(db).await)
}

/// Start `sql` on a connection of its own and wait until it waits for a lock.
async fn waiting_on_a_lock<T>(db: &TestDb, sql: String) -> tokio::task::JoinHandle<T>
where
    T: Send
        + Unpin
        + 'static
        + for<'r> sqlx::Decode<'r, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>,
{
    let mut reader = db.pool.acquire().await.unwrap();
    let reader_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    let read = tokio::spawn(async move {
        sqlx::query_scalar::<_, T>(&sql)
            .fetch_one(&mut *reader)
            .await
            .unwrap()
    });
    let waiting = support::eventually(Duration::from_secs(10), || async {
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {reader_pid} AND wait_event_type = 'Lock'"
        ))
        .await
            == 1
    })
    .await;
    assert!(waiting, "the read waits for the prune's locks");
    read
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_waiting_on_a_prune_sees_its_completions_exactly_once() {
    let db = TestDb::new().await;
    // the prune, in a transaction it keeps open: the slot's children are locked and truncated
    let (_, pruner) = completed_then_pruning(&db).await;
    // the count, on a connection of its own: it waits for the prune's locks
    let count = waiting_on_a_lock::<i64>(
        &db,
        format!(
            "SELECT completed FROM {}.queue_counts('default')",
            db.schema
        ),
    )
    .await;
    pruner.commit().await.unwrap();
    assert_eq!(
        count.await.unwrap(),
        3,
        "the completions, counted once: in the ring or in the totals"
    );
    assert_eq!(counts(&db, "default").await.completed, 3);
    db.cleanup().await;
}

/// The same race for one job: a lookup (`Storage::job_state`, what `Admin::job_state`, `ringwork
/// job` and the dashboard use) that starts while the prune of its slot commits finds the job
/// completed, in the ring or in the archive the prune wrote, never nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_looked_up_while_its_slot_is_pruned_is_still_found() {
    let db = TestDb::new().await;
    let (ids, pruner) = completed_then_pruning(&db).await;
    let storage = db.storage();
    let id = ids[0];
    let lookup = tokio::spawn(async move { storage.job_state(id).await.unwrap() });
    assert!(
        support::one_waits_for_a_lock(&db).await,
        "the lookup waits for the prune's locks"
    );
    pruner.commit().await.unwrap();
    assert_eq!(
        lookup.await.unwrap().map(|s| s.state),
        Some(ringwork::JobStatus::Completed),
        "the job, found in the ring or the archive"
    );
    db.cleanup().await;
}
