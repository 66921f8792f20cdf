//! Complete: the stale-writer guard on completion, and the completion batcher's pace (written at
//! once when a queue runs dry or drains).

mod support;

use ringwork::{
    CloseOutcome, CompletionConfig, JobContext, JobError, JobStatus, NewJob, Outcome, QueueConfig,
};
use std::time::Duration;
use support::{complete_one, eventually, job, no_maintenance, queue, Count, TestDb};

#[tokio::test]
async fn stale_completion_is_rejected_and_changes_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert(&mut conn, &job(1)).await.unwrap();
    let first = storage.claim("default", 1, None).await.unwrap().remove(0);

    // attempt 1 fails and is retried; attempt 2 is claimed with a higher run_lease
    let retry = CloseOutcome::Retry {
        at: chrono::Utc::now(),
        error: "boom".into(),
    };
    assert_eq!(
        storage
            .close_batch(&[(first.attempt_ref(), retry)])
            .await
            .unwrap(),
        vec![Outcome::Applied]
    );
    assert_eq!(storage.promote_due(10).await.unwrap(), 1);
    let second = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(second.job_id, first.job_id);
    assert_eq!(second.run_lease, first.run_lease + 1);

    let evidence = "SELECT (SELECT count(*) FROM {s}.lease_claim_closure_batches)
                         + (SELECT count(*) FROM {s}.receipt_completion_batches)
                         + (SELECT count(*) FROM {s}.done_entries)
                         + (SELECT count(*) FROM {s}.deferred_jobs)";
    let before = db.scalar_i64(evidence).await;
    // the old attempt's completion is stale: nothing changes
    assert_eq!(complete_one(&storage, &first).await, Outcome::Stale);
    let failed = CloseOutcome::Failed {
        error: "late".into(),
    };
    assert_eq!(
        storage
            .close_batch(&[(first.attempt_ref(), failed)])
            .await
            .unwrap(),
        vec![Outcome::Stale]
    );
    assert_eq!(db.scalar_i64(evidence).await, before);

    // the live attempt completes once; a second completion of it is stale too
    assert_eq!(complete_one(&storage, &second).await, Outcome::Applied);
    assert_eq!(complete_one(&storage, &second).await, Outcome::Stale);
    // a mixed batch reports per attempt
    let mixed = storage
        .complete_batch(&[first.attempt_ref(), second.attempt_ref()])
        .await
        .unwrap();
    assert_eq!(mixed, vec![Outcome::Stale, Outcome::Stale]);
    // a forged receipt is stale, not an error
    let mut forged = second.attempt_ref();
    forged.receipt_id += 1;
    assert_eq!(
        storage.complete_batch(&[forged]).await.unwrap(),
        vec![Outcome::Stale]
    );
    db.cleanup().await;
}

/// A batch whose attempts sit in the claim ring's last slot and, after the ring wrapped, in its
/// first: the batch's lowest and highest slot bound its evidence lookup, and across the wrap that
/// bound is the whole ring. Both shapes of evidence (a compact batch member, a row-local claim of
/// a job with its own timeout), heartbeated and then completed together.
#[tokio::test]
async fn a_batch_across_the_claim_ring_wrap_finds_every_attempt() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let last_slot = db
        .scalar_i64("SELECT slot_count::int8 - 1 FROM {s}.claim_ring_state")
        .await;
    let in_last_slot = loop {
        storage.insert(&mut conn, &job(1)).await.unwrap();
        let claimed = storage.claim("default", 1, None).await.unwrap().remove(0);
        if i64::from(claimed.claim_slot) == last_slot {
            break claimed;
        }
        assert_eq!(complete_one(&storage, &claimed).await, Outcome::Applied);
        support::rotate_and_prune(&storage, Duration::from_secs(3600)).await;
    };
    support::rotate_and_prune(&storage, Duration::from_secs(3600)).await;
    let own_timeout = job(2).timeout(Duration::from_secs(600));
    storage.insert(&mut conn, &own_timeout).await.unwrap();
    let in_first_slot = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(in_first_slot.claim_slot, 0, "the ring wrapped");
    let row_local = db.scalar_i64("SELECT count(*) FROM {s}.lease_claims").await;
    assert_eq!(
        row_local, 1,
        "the job with its own timeout has a row-local claim"
    );

    let both = [in_last_slot.attempt_ref(), in_first_slot.attempt_ref()];
    assert_eq!(
        storage
            .heartbeat_batch(&[(both[0], None), (both[1], None)])
            .await
            .unwrap(),
        vec![Outcome::Applied, Outcome::Applied]
    );
    assert_eq!(
        storage.complete_batch(&both).await.unwrap(),
        vec![Outcome::Applied, Outcome::Applied]
    );
    assert_eq!(
        storage.complete_batch(&both).await.unwrap(),
        vec![Outcome::Stale, Outcome::Stale]
    );
    db.cleanup().await;
}

/// One claim of jobs with and without a timeout of their own: the row-local member's receipt is a
/// hole in the claim batch's receipts, and one completion of all three closes each in its shape.
#[tokio::test]
async fn a_claim_of_both_shapes_leaves_the_row_local_receipt_out_of_its_batch() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs = [job(1), job(2).timeout(Duration::from_secs(600)), job(3)];
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    let claimed = storage.claim("default", 3, None).await.unwrap();
    assert_eq!(claimed.len(), 3);
    let base = claimed[0].receipt_id;
    assert_eq!(
        claimed
            .iter()
            .map(|j| j.receipt_id - base)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let batch = format!(
        "SELECT count(*) FROM {{s}}.lease_claim_batches WHERE claimed_count = 2 \
         AND receipt_ranges = int8multirange(int8range({base}, {b1}), int8range({b2}, {b3}))",
        b1 = base + 1,
        b2 = base + 2,
        b3 = base + 3
    );
    assert_eq!(
        db.scalar_i64(&batch).await,
        1,
        "receipts 0 and 2 are compact"
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM {{s}}.lease_claims WHERE receipt_id = {}",
            base + 1
        ))
        .await,
        1,
        "receipt 1 is row-local"
    );
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    assert_eq!(
        storage.complete_batch(&refs).await.unwrap(),
        vec![Outcome::Applied; 3]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_closures")
            .await,
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT sum(closed_count)::int8 FROM {s}.lease_claim_closure_batches")
            .await,
        2
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

/// A completion waiting for an attempt lock holds no lock on the claim ring: a relation lock is held
/// to the transaction's end, so one taken before the wait would queue a prune's TRUNCATE of the
/// slot (and every reader of the slot behind it) on the attempt lock's holder. Both sides driven:
/// a session holds the attempt lock, the completion waits on it, and the slot's partitions can be
/// locked exclusively without waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_waiting_for_an_attempt_lock_holds_no_claim_ring_lock() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let own_timeout = job(1).timeout(Duration::from_secs(600));
    storage
        .insert_many(&mut conn, &[job(0), own_timeout])
        .await
        .unwrap();
    let claimed = storage.claim("default", 2, None).await.unwrap();
    assert_eq!(claimed.len(), 2, "a compact and a row-local attempt");
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT {}.lock_attempt($1)", db.schema))
        .bind(claimed[0].job_id)
        .execute(&mut *holder)
        .await
        .unwrap();
    let completion = tokio::spawn({
        let storage = db.storage();
        let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
        async move { storage.complete_batch(&refs).await.unwrap() }
    });
    assert!(
        support::one_waits_for_a_lock(&db).await,
        "the completion waits for the attempt lock"
    );
    let mut prune = db.pool.begin().await.unwrap();
    for table in [
        "lease_claims",
        "lease_claim_batches",
        "lease_claim_closures",
        "lease_claim_closure_batches",
    ] {
        sqlx::query(&format!(
            "LOCK TABLE {s}.{table}_{slot} IN ACCESS EXCLUSIVE MODE NOWAIT",
            s = db.schema,
            slot = claimed[0].claim_slot
        ))
        .execute(&mut *prune)
        .await
        .unwrap_or_else(|e| panic!("{table} is locked by the waiting completion: {e}"));
    }
    prune.rollback().await.unwrap();
    holder.commit().await.unwrap();
    assert_eq!(completion.await.unwrap(), vec![Outcome::Applied; 2]);
    db.cleanup().await;
}

/// A claim batch of 1,000 jobs is stored compressed (its arrays are over 2 kB); one completion of all
/// of them finds every attempt once (the completion copies the arrays once, decompressed).
#[tokio::test]
async fn a_claim_batch_stored_compressed_is_completed_in_one_batch() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs: Vec<NewJob> = (0..1000).map(job).collect();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    let claimed = storage.claim("default", 1000, None).await.unwrap();
    assert_eq!(claimed.len(), 1000);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.lease_claim_batches \
             WHERE pg_column_compression(job_ids) IS NOT NULL AND claimed_count = 1000"
        )
        .await,
        1,
        "the batch's arrays are stored compressed"
    );
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    assert_eq!(
        storage.complete_batch(&refs).await.unwrap(),
        vec![Outcome::Applied; 1000]
    );
    assert_eq!(
        storage.complete_batch(&refs).await.unwrap(),
        vec![Outcome::Stale; 1000]
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

/// A completion batch asks for heartbeat rows in its job range first: rows of its lowest and
/// highest jobs (the range's ends) go with their jobs, and a row of a job outside the batch stays.
#[tokio::test]
async fn a_completion_removes_the_heartbeat_rows_at_both_ends_of_its_batch_and_no_other() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(&db, (0..6).map(job).collect()).await;
    let claimed = storage.claim("default", 6, None).await.unwrap();
    assert_eq!(claimed.len(), 6);
    let (batch, outside) = claimed.split_at(5);
    let beats = [
        (batch[0].attempt_ref(), None),
        (batch[4].attempt_ref(), None),
        (outside[0].attempt_ref(), None),
    ];
    assert_eq!(
        storage.heartbeat_batch(&beats).await.unwrap(),
        vec![Outcome::Applied; 3]
    );
    let refs: Vec<_> = batch.iter().map(|j| j.attempt_ref()).collect();
    assert_eq!(
        storage.complete_batch(&refs).await.unwrap(),
        vec![Outcome::Applied; 5]
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM {{s}}.attempt_state WHERE job_id <> {}",
            outside[0].job_id
        ))
        .await,
        0,
        "the batch's heartbeat rows went with its jobs"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.attempt_state")
            .await,
        1,
        "the running job outside the batch keeps its row"
    );
    db.cleanup().await;
}

/// Whether every job of `ids` is completed (its completion committed) within `within`.
async fn completed_within(storage: &ringwork::Storage, ids: &[i64], within: Duration) -> bool {
    eventually(within, || {
        let storage = storage.clone();
        let ids = ids.to_vec();
        async move {
            for id in ids {
                let state = storage.job_state(id).await.unwrap().map(|s| s.state);
                if state != Some(JobStatus::Completed) {
                    return false;
                }
            }
            true
        }
    })
    .await
}

/// Completion pacing (completer.rs): flushes start at most once per `max_delay` under load, but a
/// completion after a quiet spell is written at once, and so is one finishing while claims come
/// back short. With a 30-s pace, three jobs run one after another each become durable within
/// seconds (a fixed gather, or pacing without the short-claim flush, holds the second for 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_completions_are_written_at_once_when_the_queue_runs_dry() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .maintenance(no_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue("default", queue(4))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let storage = db.storage();
    for n in 0..3 {
        let id = client
            .insert(NewJob::new(&Count { n }).unwrap())
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let durable = completed_within(&storage, &[id], Duration::from_secs(10)).await;
        assert!(
            durable,
            "job {n}'s completion was not written within 10 s (pace 30 s)"
        );
        eprintln!("job {n}: durable after {:?}", started.elapsed());
    }
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

/// The last jobs of a queue running dry finish one after another, long after the claim that left
/// workers idle: each must be flushed when it finishes, not at the pace (30 s here) nor at the
/// next poll (30 s too). Three jobs of 0, 300 and 600 ms claimed together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_jobs_of_a_draining_queue_are_written_as_they_finish() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs: Vec<_> = (0..3).map(|n| NewJob::new(&Count { n }).unwrap()).collect();
    let ids = storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let client = db
        .client()
        .maintenance(no_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue(
            "default",
            QueueConfig {
                max_workers: 4,
                poll_interval: Duration::from_secs(30),
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, args: Count| async move {
            // the handler's own work: jobs that finish at different real times
            tokio::time::sleep(Duration::from_millis(args.n * 300)).await;
            Ok::<(), JobError>(())
        })
        .build()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let running = client.start().await.unwrap();
    let durable = completed_within(&storage, &ids, Duration::from_secs(10)).await;
    assert!(
        durable,
        "the three completions were not all written within 10 s (pace and poll 30 s)"
    );
    eprintln!("three staggered jobs durable after {:?}", started.elapsed());
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

/// While a queue runs dry, the jobs of one claim share a flush: the last to finish flushes now, an
/// earlier one waits at most a few milliseconds for the others (completer.rs, `DRY_LINGER`). A job
/// that runs on must not hold the others' completions. With a 30-s pace and poll, three jobs
/// claimed together, each held by the test until it lets it go: the first is durable at once (a
/// quiet spell), the second while the third still runs, the third once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_job_does_not_hold_the_flush_of_the_jobs_claimed_with_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs: Vec<_> = (0..3).map(|n| NewJob::new(&Count { n }).unwrap()).collect();
    let ids = storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let gates: std::sync::Arc<Vec<tokio::sync::Semaphore>> =
        std::sync::Arc::new((0..3).map(|_| tokio::sync::Semaphore::new(0)).collect());
    let handler_gates = std::sync::Arc::clone(&gates);
    let client = db
        .client()
        .maintenance(no_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue(
            "default",
            QueueConfig {
                max_workers: 4,
                poll_interval: Duration::from_secs(30),
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, args: Count| {
            let gates = std::sync::Arc::clone(&handler_gates);
            async move {
                let _ = gates[args.n as usize].acquire().await;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let state = |id: i64| {
        let storage = storage.clone();
        async move { storage.job_state(id).await.unwrap().map(|s| s.state) }
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            state(ids[2]).await == Some(JobStatus::Running)
        })
        .await,
        "the three jobs were not claimed"
    );
    for (n, id) in ids.iter().enumerate().take(2) {
        gates[n].add_permits(1);
        assert!(
            completed_within(&storage, &[*id], Duration::from_secs(10)).await,
            "job {n}'s completion waited for the held job (pace 30 s)"
        );
    }
    assert_eq!(state(ids[2]).await, Some(JobStatus::Running));
    gates[2].add_permits(1);
    assert!(
        completed_within(&storage, &ids[2..], Duration::from_secs(10)).await,
        "the held job's completion, the last the queue held, waited for the pace"
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
