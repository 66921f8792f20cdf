//! The archive: terminal history outlives its queue slot, is found by `job_state`,
//! `load_job` and cancel, and is reclaimed a whole time bucket at a time. Real server, real
//! partitions.

mod support;

use std::time::Duration;

use ringwork::{
    ArchiveSearch, ArchiveTable, CancelOutcome, ClaimedJob, CloseOutcome, JobStatus, NewJob,
    PruneResult, QueueSlotPrune, Storage,
};
use serde_json::json;
use support::TestDb;

const NO_WAIT: Duration = Duration::from_millis(25);
/// A lock timeout that outlasts autovacuum: on a server running it, autovacuum may be analysing a
/// partition a test has just written, and a lock request that waits past `deadlock_timeout` (1 s)
/// makes it give way. Without contention the lock is taken at once.
const OUTWAIT_AUTOVACUUM: Duration = Duration::from_secs(3);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn job(n: i64) -> NewJob {
    NewJob::from_parts("archived_kind", json!({ "n": n })).unwrap()
}

/// The default queue's (completed, failed, cancelled) totals.
async fn terminal_counts(storage: &Storage) -> (i64, i64, i64) {
    let counts = &storage.queue_counts(Some("default")).await.unwrap()[0];
    (counts.completed, counts.failed, counts.cancelled)
}

/// Six jobs in the current queue slot: four completed in one batch, one failed ("boom"), one
/// cancelled before it was claimed. Returns their ids and the five claims.
async fn six_finished_jobs(storage: &Storage, db: &TestDb) -> (Vec<i64>, Vec<ClaimedJob>) {
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = storage
        .insert_many(&mut conn, &(0..6).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        storage.cancel_job(ids[5], "not needed").await.unwrap(),
        CancelOutcome::Cancelled
    );
    let claimed = storage.claim("default", 5, None).await.unwrap();
    assert_eq!(claimed.len(), 5);
    let done: Vec<_> = claimed[..4].iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&done).await.unwrap();
    storage
        .close_batch(&[(
            claimed[4].attempt_ref(),
            CloseOutcome::Failed {
                error: "boom".into(),
            },
        )])
        .await
        .unwrap();
    (ids, claimed)
}

#[tokio::test]
async fn finished_jobs_are_found_in_the_archive_after_their_slot_is_pruned() {
    let db = TestDb::new().await;
    let storage = db.storage();
    assert!(storage.archive_spans().await.unwrap().is_empty());
    let (ids, claimed) = six_finished_jobs(&storage, &db).await;

    assert_eq!(
        support::rotate_and_prune(&storage, DAY).await,
        vec![PruneResult::Pruned]
    );
    // the storage page's span of history: the buckets the completions and the failures went to
    // (their keeps differ, and so do their buckets), oldest first
    let spans = storage.archive_spans().await.unwrap();
    assert!(!spans.is_empty() && spans.len() <= 2, "{spans:?}");
    assert!(spans.windows(2).all(|w| w[0].oldest <= w[1].oldest));
    let newest_archived: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(&format!(
        "SELECT greatest((SELECT max(finalized_at) FROM {s}.archived_jobs), \
                         (SELECT max(finalized_at) FROM {s}.archived_completion_batches))",
        s = db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(spans
        .iter()
        .all(|b| b.oldest <= b.newest && b.total_bytes > 0));
    assert_eq!(spans.iter().map(|b| b.newest).max(), Some(newest_archived));
    for ring_table in [
        "ready_entries",
        "done_entries",
        "receipt_completion_batches",
    ] {
        assert_eq!(
            db.scalar_i64(&format!("SELECT count(*) FROM {{s}}.{ring_table}"))
                .await,
            0,
            "{ring_table} is truncated, nothing carried forward"
        );
    }
    // the four completions are one archive row, as they were one batch
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_completion_batches")
            .await,
        1
    );

    let completed = storage.load_job(ids[2]).await.unwrap().expect("archived");
    assert_eq!(completed.state.state, "completed");
    assert_eq!(completed.state.kind, "archived_kind");
    assert_eq!(completed.state.attempt, 1);
    assert!(completed
        .history
        .iter()
        .any(|h| h.state == "completed" && h.run_lease == claimed[2].run_lease));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT (args ->> 'n')::int8 FROM {{s}}.archived_job({})",
            ids[2]
        ))
        .await,
        2,
        "the args are archived with the batch"
    );
    let failed = storage.job_state(ids[4]).await.unwrap().expect("archived");
    assert_eq!(failed.state, "failed");
    assert_eq!(failed.detail.as_deref(), Some("boom"));
    let cancelled = storage.job_state(ids[5]).await.unwrap().expect("archived");
    assert_eq!(cancelled.state, "cancelled");
    // a finished job stays finished
    assert_eq!(
        storage.cancel_job(ids[0], "late").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    // durable totals: the ring no longer holds the four completions, terminal_totals does
    assert_eq!(terminal_counts(&storage).await, (4, 1, 1));
    db.cleanup().await;
}

/// The archive's rows of completions: at most 256 jobs a row, in job order, every array aligned
/// with the job ids, and each job with its own attempt's ready row (a job retried in the slot has
/// two, one a run lease).
#[tokio::test]
async fn archive_rows_hold_their_jobs_in_job_order_each_with_its_own_attempt() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let ids = support::enqueue(&db, (0..600).map(job).collect()).await;
    let mut claimed = storage.claim("default", 300, None).await.unwrap();
    claimed.extend(storage.claim("default", 300, None).await.unwrap());
    assert_eq!(claimed.len(), 600);
    let retried = claimed.iter().position(|j| j.job_id == ids[7]).unwrap();
    let first_attempt = claimed.remove(retried);
    storage
        .close_batch(&[(
            first_attempt.attempt_ref(),
            CloseOutcome::Retry {
                at: chrono::Utc::now() - chrono::Duration::seconds(1),
                error: "again".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(storage.promote_due(10).await.unwrap(), 1);
    let second_attempt = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(second_attempt.len(), 1);
    assert!(second_attempt[0].run_lease > first_attempt.run_lease);
    storage
        .complete_batch(&[second_attempt[0].attempt_ref()])
        .await
        .unwrap();
    // completion batches of newer jobs first, so no batch's order is the archive's
    for batch in claimed.rchunks(100) {
        let refs: Vec<_> = batch.iter().rev().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&refs).await.unwrap();
    }

    assert_eq!(
        support::rotate_and_prune(&storage, DAY).await,
        vec![PruneResult::Pruned]
    );
    let rows: Vec<(Vec<i64>, Vec<i64>, Vec<i32>)> = sqlx::query_as(&format!(
        "SELECT job_ids, ARRAY(SELECT (a ->> 'n')::int8 FROM unnest(args) a), attempts \
         FROM {s}.archived_completion_batches",
        s = db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(rows.len() >= 3, "600 jobs are three rows or more");
    let mut archived: Vec<i64> = Vec::new();
    for (job_ids, ns, attempts) in &rows {
        assert!(job_ids.len() <= 256, "{} jobs in a row", job_ids.len());
        assert!(job_ids.windows(2).all(|w| w[0] < w[1]), "in job order");
        for (i, job_id) in job_ids.iter().enumerate() {
            let n = ids.iter().position(|id| id == job_id).unwrap() as i64;
            assert_eq!(ns[i], n, "job {job_id}'s arguments");
            let attempt = if *job_id == ids[7] { 2 } else { 1 };
            assert_eq!(attempts[i], attempt, "job {job_id}'s attempt");
        }
        archived.extend(job_ids.iter().copied());
    }
    archived.sort_unstable();
    assert_eq!(archived, ids, "every job archived once");
    db.cleanup().await;
}

#[tokio::test]
async fn a_keep_of_zero_archives_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 3, None).await.unwrap();
    storage
        .complete_batch(&claimed.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        support::rotate_and_prune(&storage, Duration::ZERO).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_completion_batches")
            .await,
        0
    );
    assert!(storage.job_state(ids[0]).await.unwrap().is_none());
    // nothing archived, yet the total survives the prune
    let counts = &storage.queue_counts(Some("default")).await.unwrap()[0];
    assert_eq!(counts.completed, 3);
    db.cleanup().await;
}

/// One synthetic totals row in a bucket other than the current one (test input: prune writes
/// the real ones), `ahead` buckets after the current.
async fn totals_row_elsewhere(db: &TestDb, ahead: i32, completed: i64, failed: i64) {
    db.exec(&format!(
        "INSERT INTO {{s}}.terminal_totals (totals_bucket, queue, completed, failed, cancelled)
         VALUES (({{s}}.totals_bucket(now()) + {ahead}) % {{s}}.totals_buckets(), 'default', {completed},
                 {failed}, 0)"
    ))
    .await;
}

#[tokio::test]
async fn two_concurrent_folds_of_the_totals_keep_every_count_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..2).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    drop(conn);
    let claimed = storage.claim("default", 2, None).await.unwrap();
    storage
        .complete_batch(&claimed.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        support::rotate_and_prune(&storage, DAY).await,
        vec![PruneResult::Pruned]
    );
    for (ahead, completed, failed) in [(1, 10, 1), (3, 100, 2), (5, 1000, 3)] {
        totals_row_elsewhere(&db, ahead, completed, failed).await;
    }
    let before = storage.queue_counts(Some("default")).await.unwrap()[0].clone();
    assert_eq!((before.completed, before.failed), (1112, 6));

    // two leaders' folds at once: one at a time (a second one returns at once, or finds the buckets
    // empty after the first), so nothing is moved twice and they do not deadlock
    let other = Storage::new(
        support::TestDb::connect(&db.url, 2).await,
        db.schema.clone(),
    );
    let wait = Duration::from_secs(10);
    let (a, b) = tokio::join!(
        storage.fold_terminal_totals(wait),
        other.fold_terminal_totals(wait)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 3, "each old bucket folded once");
    let after = storage.queue_counts(Some("default")).await.unwrap()[0].clone();
    assert_eq!((after.completed, after.failed), (1112, 6));
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT totals_bucket) FROM {s}.terminal_totals")
            .await,
        1,
        "everything is in one bucket"
    );
    assert!(
        db.scalar_i64("SELECT count(*) FROM {s}.terminal_totals")
            .await
            <= 4,
        "a handful of rows: the prune's and one per folded bucket"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn prunes_racing_folds_count_every_terminal_job_exactly_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let pruner = {
        let storage = storage.clone();
        tokio::spawn(async move {
            for round in 0..10 {
                let mut conn = storage.pool().acquire().await.unwrap();
                storage
                    .insert_many(
                        &mut conn,
                        &(0..5).map(|n| job(round * 10 + n)).collect::<Vec<_>>(),
                    )
                    .await
                    .unwrap();
                drop(conn);
                let claimed = storage.claim("default", 5, None).await.unwrap();
                let (done, failed) = claimed.split_at(4);
                storage
                    .complete_batch(&done.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
                    .await
                    .unwrap();
                storage
                    .close_batch(&[(
                        failed[0].attempt_ref(),
                        CloseOutcome::Failed {
                            error: "boom".into(),
                        },
                    )])
                    .await
                    .unwrap();
                support::rotate_and_prune(&storage, DAY).await;
            }
        })
    };
    // meanwhile: rows keep landing in an old bucket and folds keep moving them
    let mut injected = 0;
    while !pruner.is_finished() {
        totals_row_elsewhere(&db, 1 + injected % 7, 1, 0).await;
        injected += 1;
        storage.fold_terminal_totals(NO_WAIT).await.unwrap();
    }
    pruner.await.unwrap();
    support::rotate_and_prune(&storage, DAY).await;
    storage
        .fold_terminal_totals(Duration::from_secs(5))
        .await
        .unwrap();
    let counts = &storage.queue_counts(Some("default")).await.unwrap()[0];
    assert!(injected > 0);
    assert_eq!(
        (counts.completed, counts.failed),
        (40 + i64::from(injected), 10),
        "{injected} synthetic completions injected"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.done_entries").await,
        0,
        "every slot was pruned: the totals come from terminal_totals alone"
    );
    db.cleanup().await;
}

/// Archive one synthetic failed job finalized `ago` in the past, in the bucket its time maps to
/// for a keep of one day.
async fn archived_failure(db: &TestDb, job_id: i64, ago: &str) {
    db.exec(&format!(
        "INSERT INTO {{s}}.archived_jobs (archive_bucket, job_id, run_lease, queue, kind, args, priority,
                                          attempt, max_attempts, state, error, created_at, finalized_at)
         SELECT {{s}}.archive_bucket(t, interval '1 day'), {job_id}, 1, 'default', 'k', '{{}}', 2, 1, 1,
                'failed', 'old', t, t
         FROM (SELECT now() - interval '{ago}' AS t) x"
    ))
    .await;
}

#[tokio::test]
async fn retention_truncates_a_whole_bucket_once_its_newest_row_is_past_the_keep() {
    let db = TestDb::new().await;
    let storage = db.storage();
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = '{}.archived_jobs'::regclass",
            db.schema
        ))
        .await,
        db.scalar_i64("SELECT {s}.archive_buckets()::int8").await,
        "one partition per bucket"
    );
    archived_failure(&db, 1, "2 days").await;
    archived_failure(&db, 2, "1 hour").await;
    archived_failure(&db, 3, "1 second").await;
    let bucket_of = |id: i64| {
        format!("SELECT archive_bucket::int8 FROM {{s}}.archived_jobs WHERE job_id = {id}")
    };
    let old_bucket = db.scalar_i64(&bucket_of(1)).await;
    assert_ne!(old_bucket, db.scalar_i64(&bucket_of(3)).await);
    assert_ne!(old_bucket, db.scalar_i64(&bucket_of(2)).await);

    // a reader holding the old bucket keeps it for now: expire gives up after its lock timeout
    let mut reader = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT count(*) FROM {}.archived_jobs_{old_bucket}",
        db.schema
    ))
    .execute(&mut *reader)
    .await
    .unwrap();
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::Jobs, DAY, NO_WAIT)
            .await
            .unwrap(),
        0
    );
    reader.commit().await.unwrap();
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::Jobs, DAY, OUTWAIT_AUTOVACUUM)
            .await
            .unwrap(),
        1,
        "only the bucket whose newest row is older than the keep"
    );
    let remaining: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT job_id FROM {}.archived_jobs ORDER BY job_id",
        db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(remaining, vec![2, 3]);
    // nothing left to do
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::Jobs, DAY, OUTWAIT_AUTOVACUUM)
            .await
            .unwrap(),
        0
    );
    db.cleanup().await;
}

/// Archive search's rows live as long as the archive rows they index: a completed job's by
/// `keep_completed`, a failed one's by `keep_failed`, each in its own half of the partitions.
#[tokio::test]
async fn archive_search_rows_expire_with_the_keep_of_the_archive_rows_they_index() {
    let db = TestDb::new().await;
    let storage = db.storage();
    archive_search_on(&db).await;
    // two jobs finished two days ago: one completed, one failed, bucketed as archive_slot_search
    // buckets them. The failed one's bucket (by its keep of 7 days) must not be the one a keep of a
    // day writes now, which expiring with that keep skips: three days ago when two would be
    db.exec(
        "INSERT INTO {s}.archived_job_args (archive_bucket, job_id, run_lease, attempt, finalized_at, doc)
         SELECT b, id, 1, 1, t, jsonb_build_object('args', jsonb_build_object('n', id), 'queue', 'default',
                                                   'kind', 'k', 'state', st)
         FROM (SELECT CASE WHEN {s}.archive_bucket(now() - interval '2 days', interval '7 days')
                                = {s}.archive_bucket(now(), interval '1 day')
                           THEN now() - interval '3 days' ELSE now() - interval '2 days' END AS t) x,
              LATERAL (VALUES (1, 'completed', {s}.archive_bucket(t, interval '1 day')),
                              (2, 'failed', {s}.archive_buckets() + {s}.archive_bucket(t, interval '7 days'))
                      ) v(id, st, b)",
    )
    .await;
    let searched = |db: &TestDb| {
        let storage = db.storage();
        async move { search_ids(&storage, &ArchiveSearch::default()).await }
    };
    assert_eq!(searched(&db).await, vec![2, 1]);
    // a keep of a day removes the completed job's row; the failed job's, kept 7 days, stays
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::CompletionsSearch, DAY, OUTWAIT_AUTOVACUUM)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::JobsSearch, 7 * DAY, OUTWAIT_AUTOVACUUM)
            .await
            .unwrap(),
        0
    );
    assert_eq!(searched(&db).await, vec![2]);
    assert_eq!(
        storage
            .archive_expire(ArchiveTable::JobsSearch, DAY, OUTWAIT_AUTOVACUUM)
            .await
            .unwrap(),
        1
    );
    assert!(searched(&db).await.is_empty());
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Archive ahead of prune (migration 0016): the copy runs under ACCESS SHARE before the prune, and
// the prune, under its ACCESS EXCLUSIVE locks, copies only what arrived after it.
// ---------------------------------------------------------------------------------------------

fn prune_options() -> QueueSlotPrune {
    QueueSlotPrune {
        lock_timeout: NO_WAIT,
        keep_completed: DAY,
        keep_failed: 7 * DAY,
        park_idle: None,
    }
}

/// (completion batch rows, failed/cancelled rows) in the archive.
async fn archived_rows(db: &TestDb) -> (i64, i64) {
    (
        db.scalar_i64("SELECT count(*) FROM {s}.archived_completion_batches")
            .await,
        db.scalar_i64("SELECT count(*) FROM {s}.archived_jobs")
            .await,
    )
}

/// The one sealed slot of the queue ring, after sealing the current one.
async fn seal_the_current_queue_slot(storage: &Storage) -> i32 {
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    let sealed = storage.sealed_queue_slots().await.unwrap();
    assert_eq!(sealed.len(), 1, "one sealed slot: {sealed:?}");
    sealed[0]
}

/// Every completed job listed, by id, over all pages.
async fn listed_completed(storage: &Storage) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = storage
            .list_jobs(JobStatus::Completed, None, None, after.as_deref(), 2)
            .await
            .unwrap();
        ids.extend(page.jobs.iter().map(|j| j.job_id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ids.sort_unstable();
    ids
}

/// How many times the job's history says it completed.
async fn completions_in_history(storage: &Storage, job_id: i64) -> usize {
    let record = storage.load_job(job_id).await.unwrap().expect("known job");
    record
        .history
        .iter()
        .filter(|h| h.state == JobStatus::Completed)
        .count()
}

#[tokio::test]
async fn a_slot_archived_ahead_of_its_prune_is_copied_once_and_listed_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (ids, _) = six_finished_jobs(&storage, &db).await;
    let slot = seal_the_current_queue_slot(&storage).await;
    let options = prune_options();

    // another archiver has the slot: this one does not copy it a second time
    let mut other = db.pool.acquire().await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_lock({}.lock_ns('archive_ahead'), $1)",
        db.schema.as_str()
    ))
    .bind(slot)
    .execute(&mut *other)
    .await
    .unwrap();
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "busy"
    );
    assert_eq!(archived_rows(&db).await, (0, 0));
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut *other)
        .await
        .unwrap();

    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "copied"
    );
    assert_eq!(
        archived_rows(&db).await,
        (1, 2),
        "one batch, one failure, one cancel"
    );
    // the slot is still in the ring, which stays the record: nothing is listed twice
    assert_eq!(listed_completed(&storage).await, ids[..4].to_vec());
    assert_eq!(completions_in_history(&storage, ids[2]).await, 1);
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "up_to_date"
    );
    assert_eq!(archived_rows(&db).await, (1, 2));

    assert_eq!(
        storage.prune_queue_slot_with(slot, &options).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        archived_rows(&db).await,
        (1, 2),
        "the prune copied nothing again"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.queue_slot_archive_marks")
            .await,
        0,
        "the marks go with their slot"
    );
    assert_eq!(listed_completed(&storage).await, ids[..4].to_vec());
    assert_eq!(completions_in_history(&storage, ids[2]).await, 1);
    assert_eq!(terminal_counts(&storage).await, (4, 1, 1));
    db.cleanup().await;
}

/// Three jobs enqueued, claimed and completed in the current queue slot, which is then sealed; with
/// `late_producer`, a producer's transaction opened before the seal holds two more jobs there,
/// uncommitted (its rows land in the slot when it commits, after whatever the test does first).
/// Returns the slot, the three completed jobs, and the producer's jobs and transaction.
async fn three_completed_jobs_in_a_sealed_slot(
    db: &TestDb,
    storage: &Storage,
    late_producer: bool,
) -> (
    i32,
    Vec<i64>,
    Option<(Vec<i64>, sqlx::Transaction<'static, sqlx::Postgres>)>,
) {
    let mut conn = db.pool.acquire().await.unwrap();
    let early = storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let producer = if late_producer {
        let mut producer = db.pool.begin().await.unwrap();
        let late = storage
            .insert_many(&mut producer, &[job(100), job(101)])
            .await
            .unwrap();
        Some((late, producer))
    } else {
        None
    };
    let claimed = storage.claim("default", 3, None).await.unwrap();
    let done: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&done).await.unwrap();
    (seal_the_current_queue_slot(storage).await, early, producer)
}

#[tokio::test]
async fn rows_finished_after_the_archive_ahead_are_copied_by_the_prune_and_only_they() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // a producer's transaction open across the seal: its rows land in the slot after the copy
    archive_search_on(&db).await;
    let (slot, early, producer) = three_completed_jobs_in_a_sealed_slot(&db, &storage, true).await;
    let (late, producer) = producer.expect("a late producer");
    let options = prune_options();
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "copied"
    );
    assert_eq!(archived_rows(&db).await, (1, 0));

    producer.commit().await.unwrap();
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "up_to_date",
        "archived ahead once, the slot is not proved again: the late rows are left to the prune"
    );
    let claimed = storage.claim("default", 2, None).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(), late);
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    storage
        .close_batch(&[(
            claimed[1].attempt_ref(),
            CloseOutcome::Failed {
                error: "late".into(),
            },
        )])
        .await
        .unwrap();

    // the prune itself (not the archive-ahead step) finds the mark behind and copies the rest
    let pruned: String = sqlx::query_scalar(&format!(
        "SELECT {}.prune_queue_slot($1, '25ms', interval '1 day', interval '7 days', NULL)",
        db.schema.as_str()
    ))
    .bind(slot)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pruned, "pruned");
    assert_eq!(
        archived_rows(&db).await,
        (2, 1),
        "the late batch and failure, once each"
    );
    let mut all = early.clone();
    all.push(late[0]);
    assert_eq!(listed_completed(&storage).await, all);
    for id in all {
        assert_eq!(completions_in_history(&storage, id).await, 1, "job {id}");
    }
    let failed = storage.job_state(late[1]).await.unwrap().expect("archived");
    assert_eq!(failed.state, "failed");
    let counts = &storage.queue_counts(Some("default")).await.unwrap()[0];
    assert_eq!((counts.completed, counts.failed), (4, 1));
    // archive search indexed the first copy and the prune's, each job once
    let mut searched = search_ids(&storage, &ArchiveSearch::default()).await;
    searched.sort_unstable();
    let mut expected = [early.clone(), late.clone()].concat();
    expected.sort_unstable();
    assert_eq!(searched, expected);
    db.cleanup().await;
}

/// Archive search on for the test's schema.
async fn archive_search_on(db: &TestDb) {
    assert_eq!(
        db.scalar_i64("SELECT {s}.set_setting('archive_search', 1)")
            .await,
        1
    );
}

/// The ids an archive search lists over all its pages (two jobs a page), in the order listed.
async fn search_ids(storage: &Storage, search: &ArchiveSearch) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = storage
            .search_archive(search, after.as_deref(), 2)
            .await
            .unwrap();
        assert!(page.enabled && !page.too_wide, "{page:?}");
        ids.extend(page.jobs.iter().map(|j| j.job_id));
        match page.next {
            Some(next) => after = Some(next),
            None => return ids,
        }
    }
}

fn search_for(args: serde_json::Value) -> ArchiveSearch {
    ArchiveSearch {
        args,
        ..ArchiveSearch::default()
    }
}

#[tokio::test]
async fn archive_search_finds_finished_jobs_by_what_their_arguments_contain_through_its_index() {
    let db = TestDb::new().await;
    let storage = db.storage();
    archive_search_on(&db).await;
    let (ids, _) = six_finished_jobs(&storage, &db).await;
    assert_eq!(
        support::rotate_and_prune(&storage, DAY).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_job_args")
            .await,
        6,
        "one row per archived job"
    );

    // the completed, the failed and the cancelled job, each found by its arguments
    let page = storage
        .search_archive(&search_for(json!({ "n": 2 })), None, 10)
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 1, "{page:?}");
    let found = &page.jobs[0];
    assert_eq!(
        (
            found.job_id,
            found.state,
            found.kind.as_str(),
            found.attempt
        ),
        (ids[2], JobStatus::Completed, "archived_kind", 1)
    );
    assert_eq!(found.args, r#"{"n": 2}"#);
    for (n, state) in [(4, JobStatus::Failed), (5, JobStatus::Cancelled)] {
        let page = storage
            .search_archive(&search_for(json!({ "n": n })), None, 10)
            .await
            .unwrap();
        let listed: Vec<_> = page.jobs.iter().map(|j| (j.job_id, j.state)).collect();
        assert_eq!(listed, vec![(ids[n as usize], state)]);
    }
    // filters narrow it: the completed job is not failed, nor in another queue
    for search in [
        ArchiveSearch {
            state: Some(JobStatus::Failed),
            ..search_for(json!({ "n": 2 }))
        },
        ArchiveSearch {
            queue: Some("elsewhere".into()),
            ..search_for(json!({ "n": 2 }))
        },
        ArchiveSearch {
            until: Some(chrono::Utc::now() - chrono::Duration::hours(1)),
            ..search_for(json!({ "n": 2 }))
        },
        search_for(json!({ "n": 2, "other": true })),
    ] {
        let page = storage.search_archive(&search, None, 10).await.unwrap();
        assert!(page.jobs.is_empty(), "{search:?}: {page:?}");
    }
    // every job matches {}: listed newest first over pages of two, each once
    let all = search_ids(&storage, &search_for(json!({}))).await;
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ids);
    db.cleanup().await;
}

#[tokio::test]
async fn archive_search_refuses_a_search_too_wide_to_order_and_bad_input_clearly() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // off by default: nothing is indexed, and the page says so
    let (_, _) = six_finished_jobs(&storage, &db).await;
    assert_eq!(
        support::rotate_and_prune(&storage, DAY).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(archived_rows(&db).await, (1, 2));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_job_args")
            .await,
        0,
        "archive search off writes nothing"
    );
    let page = storage
        .search_archive(&search_for(json!({})), None, 10)
        .await
        .unwrap();
    assert!(!page.enabled && page.jobs.is_empty(), "{page:?}");

    // more matches than the cap: refused as too wide, not read whole; a narrower one is served
    archive_search_on(&db).await;
    db.exec(&format!(
        "INSERT INTO {{s}}.archived_job_args (archive_bucket, job_id, run_lease, attempt, finalized_at, doc) \
         SELECT 0, g, 1, 1, now() - g * interval '1 ms', \
                jsonb_build_object('args', jsonb_build_object('wide', true, 'n', g), 'queue', \
                                   CASE WHEN g % 1000 = 0 THEN 'rare' ELSE 'default' END, \
                                   'kind', 'wide', 'state', 'completed') \
         FROM generate_series(1, {}) g",
        ringwork::ARCHIVE_SEARCH_CAP + 1
    ))
    .await;
    let wide = storage
        .search_archive(&search_for(json!({ "wide": true })), None, 10)
        .await
        .unwrap();
    assert!(wide.too_wide && wide.jobs.is_empty(), "{wide:?}");
    let narrow = storage
        .search_archive(&search_for(json!({ "wide": true, "n": 7 })), None, 10)
        .await
        .unwrap();
    assert!(!narrow.too_wide);
    assert_eq!(
        narrow.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![7]
    );
    // a queue narrows the index lookup itself: its ten jobs, not a too-wide refusal
    let rare = storage
        .search_archive(
            &ArchiveSearch {
                queue: Some("rare".into()),
                ..search_for(json!({ "wide": true }))
            },
            None,
            100,
        )
        .await
        .unwrap();
    assert!(!rare.too_wide, "{rare:?}");
    assert_eq!(
        rare.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        (1..=10).map(|k| k * 1000).collect::<Vec<i64>>(),
        "newest first"
    );
    // found through the index: the narrow search scans nothing whole and fetches a handful of
    // the 10,001 rows (the counters, read before and after on one connection, are the session's
    // not yet flushed, so only their difference is this search's)
    let mut tx = db.pool.begin().await.unwrap();
    let reads = "SELECT coalesce(sum(coalesce(idx_tup_fetch, 0)), 0)::int8, \
                        coalesce(sum(coalesce(seq_scan, 0)), 0)::int8 \
                 FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE 'archived_job_args%'";
    let (fetched_before, scans_before): (i64, i64) = sqlx::query_as(reads)
        .bind(db.schema.as_str())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let found: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.search_archive('{{\"wide\": true, \"n\": 7}}', NULL, NULL, NULL, \
         NULL, NULL, NULL, NULL, 10, 10000)",
        db.schema.as_str()
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(found, 1);
    let (fetched, scans): (i64, i64) = sqlx::query_as(reads)
        .bind(db.schema.as_str())
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(scans - scans_before, 0);
    let fetched = fetched - fetched_before;
    assert!(
        (1..=10).contains(&fetched),
        "{fetched} rows fetched for one match"
    );
    tx.rollback().await.unwrap();

    // bad input: a clear error each, and the setting takes only on or off
    for (search, after, says) in [
        (
            ArchiveSearch {
                state: Some(JobStatus::Available),
                ..search_for(json!({}))
            },
            None,
            "completed, failed and cancelled",
        ),
        (
            ArchiveSearch {
                queue: Some("bad queue\u{0}".into()),
                ..search_for(json!({}))
            },
            None,
            "queue name",
        ),
        (search_for(json!({ "s": "a\u{0}b" })), None, "NUL"),
        (
            search_for(json!({ "s": "x".repeat(5000) })),
            None,
            "4,096 bytes",
        ),
        (search_for(json!({})), Some("L1:2"), "page key"),
        (
            search_for(json!({})),
            Some("T99999999999999999999:1"),
            "page key",
        ),
    ] {
        let err = storage
            .search_archive(&search, after, 10)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
    }
    for bad in ["2", "0", "-1"] {
        let err = sqlx::query(&format!(
            "SELECT {}.set_setting('archive_search', {bad})",
            db.schema.as_str()
        ))
        .execute(&db.pool)
        .await
        .expect_err("only 1 or NULL");
        assert!(err.to_string().contains("archive_search"), "{err}");
    }
    db.cleanup().await;
}

/// The race the kept proof could lose (migration 0018): a producer's transaction open across the
/// seal commits its rows into the slot after the archive-ahead step proved it. The slot has gained a
/// segment since the counted proof, so prune proves it again and keeps it (the rows are unclaimed);
/// trusting the mark there would truncate two jobs nobody ran.
#[tokio::test]
async fn a_late_producer_after_the_archive_ahead_proof_keeps_the_slot_from_prune() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (slot, _, producer) = three_completed_jobs_in_a_sealed_slot(&db, &storage, true).await;
    let (late, producer) = producer.expect("a late producer");
    let options = prune_options();
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &options)
            .await
            .unwrap(),
        "copied",
        "proved without the late rows, which are not committed yet"
    );
    producer.commit().await.unwrap();

    assert_eq!(
        storage.prune_queue_slot_with(slot, &options).await.unwrap(),
        PruneResult::Skipped("pending_ready".into())
    );
    let claimed = storage.claim("default", 5, None).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(), late);
    db.cleanup().await;
}

/// Behind readers that keep a slot busy, the prune is tried every tick; once the slot has been
/// archived ahead (and so proved) and has gained no segment since, the prune runs no proof of its
/// own (a proof reads the slot's ready child once per lane with rows in the slot).
#[tokio::test]
async fn a_prune_after_the_archive_ahead_proof_does_not_prove_the_slot_again() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // a completed job in each of twelve queues: twelve lanes with rows in the slot
    let queues: Vec<String> = (0..12).map(|n| format!("q{n}")).collect();
    let jobs: Vec<_> = queues
        .iter()
        .zip(0..)
        .map(|(queue, n)| job(n).queue(queue))
        .collect();
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    for queue in &queues {
        let claimed = storage.claim(queue, 1, None).await.unwrap();
        assert_eq!(claimed.len(), 1);
        let done: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&done).await.unwrap();
    }
    let slot = seal_the_current_queue_slot(&storage).await;
    assert_eq!(
        storage
            .archive_queue_slot_ahead(slot, &prune_options())
            .await
            .unwrap(),
        "copied"
    );

    // Scans of the slot's ready child, counted by pg_stat_xact_user_tables within one transaction.
    // The proof reads the child once per lane with rows in it; a TRUNCATE counts a scan or two.
    let scans_of_the_ready_child = format!(
        "SELECT coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0)::bigint FROM pg_stat_xact_user_tables
         WHERE schemaname = '{}' AND relname = 'ready_entries_{slot}'",
        db.schema.as_str()
    );
    let scans_of = |statement: String| {
        let pool = db.pool.clone();
        let count = scans_of_the_ready_child.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let before: i64 = sqlx::query_scalar(&count)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            let result: Option<String> = sqlx::query_scalar(&statement)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            let after: i64 = sqlx::query_scalar(&count)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            (result, after - before)
        }
    };
    let s = db.schema.as_str();
    let (blocker, proof_scans) = scans_of(format!("SELECT {s}.queue_slot_blocker({slot})")).await;
    assert_eq!(blocker, None, "the slot is provable");
    let (pruned, prune_scans) = scans_of(format!(
        "SELECT {s}.prune_queue_slot({slot}, '25ms', interval '1 day', interval '7 days', NULL)"
    ))
    .await;
    assert_eq!(pruned.as_deref(), Some("pruned"));
    assert!(
        prune_scans < proof_scans,
        "the prune proved the slot again: {prune_scans} scans of its ready rows, a proof makes {proof_scans}"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_reader_holding_the_slot_delays_only_the_truncate_not_the_archive_copy() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let s = db.schema.as_str().to_owned();
    storage
        .insert_many(&mut conn, &(0..4).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 4, None).await.unwrap();
    let done: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&done).await.unwrap();
    let slot = seal_the_current_queue_slot(&storage).await;
    let options = prune_options();

    // pg_dump holds ACCESS SHARE on every table it dumps until the dump ends
    let mut reader = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {s}.ready_entries_{slot}, {s}.receipt_completion_batches_{slot} IN ACCESS SHARE MODE"
    ))
    .execute(&mut *reader)
    .await
    .unwrap();
    for _ in 0..2 {
        assert_eq!(
            storage.prune_queue_slot_with(slot, &options).await.unwrap(),
            PruneResult::Skipped("busy".into())
        );
        assert_eq!(
            archived_rows(&db).await,
            (1, 0),
            "copied once while the reader holds the slot"
        );
    }
    // the hot path goes on meanwhile
    storage.insert_many(&mut conn, &[job(9)]).await.unwrap();
    let claimed = storage.claim("default", 1, None).await.unwrap();
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    reader.commit().await.unwrap();

    assert_eq!(
        storage.prune_queue_slot_with(slot, &options).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(archived_rows(&db).await, (1, 0));
    assert_eq!(
        storage.queue_counts(Some("default")).await.unwrap()[0].completed,
        5
    );
    // no copy was ever rolled back: the archive holds no dead tuple
    let flushed = support::eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname ~ '^archived_completion_batches_'",
        )
        .bind(&s)
        .fetch_one(&db.pool)
        .await
        .unwrap()
            >= 1
    })
    .await;
    assert!(flushed, "the archive's insert reached the statistics");
    let dead: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(n_dead_tup), 0)::int8 FROM pg_stat_user_tables
         WHERE schemaname = $1 AND relname ~ '^(archived_|queue_slot_archive_marks_)'",
    )
    .bind(&s)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(dead, 0);
    db.cleanup().await;
}
