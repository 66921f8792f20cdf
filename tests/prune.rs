//! Rotate and prune: a sealed slot is truncated only once its proof holds (no open claim, no
//! unclaimed ready row, no producer committing into it), its failed history goes to the archive,
//! and a long reader or transaction makes prune skip the slot instead of stalling claims.

mod support;

use ringwork::{CloseOutcome, PruneResult};
use std::time::Duration;
use support::{job, TestDb};

const NO_WAIT: Duration = Duration::from_millis(25);

const KEEP: Duration = Duration::ZERO;

async fn rotate_both(storage: &ringwork::Storage) {
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
}

/// The reasons a tick gave for the queue-ring slots it left sealed, in order.
fn queue_skips(report: &ringwork::maintenance::TickReport) -> Vec<String> {
    report
        .prune_skips
        .iter()
        .filter(|(ring, _)| *ring == "queue")
        .map(|(_, reason)| reason.clone())
        .collect()
}

/// Three jobs claimed and completed in slot 0 of both rings, both rings rotated, and three more
/// enqueued into the new current queue slot: slot 0 is sealed and provable.
async fn seal_a_slot_of_completed_jobs(db: &TestDb, storage: &ringwork::Storage) {
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 3, None).await.unwrap();
    storage
        .complete_batch(&claimed.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    rotate_both(storage).await;
    storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
}

#[tokio::test]
async fn prune_refuses_a_slot_holding_an_open_claim() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 3, None).await.unwrap();
    storage
        .complete_batch(&[claimed[0].attempt_ref(), claimed[1].attempt_ref()])
        .await
        .unwrap();
    rotate_both(&storage).await;
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Skipped("open_claims".into())
    );
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Skipped("open_claims".into()),
        "the open claim still needs its ready row (rescue re-queues from it)"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_batches_0")
            .await,
        1
    );
    // closing the last claim unblocks both
    storage
        .complete_batch(&[claimed[2].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Pruned
    );
    db.cleanup().await;
}

#[tokio::test]
async fn prune_refuses_a_slot_holding_unclaimed_ready_rows() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..5).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 2, None).await.unwrap();
    storage
        .complete_batch(&claimed.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    rotate_both(&storage).await;
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Skipped("pending_ready".into())
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries_0")
            .await,
        5
    );
    // the current slot is never pruned
    assert_eq!(
        storage.prune_queue_slot(1, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Skipped("not_sealed".into())
    );
    db.cleanup().await;
}

/// The proof reads the cursors of the lanes with rows in the slot only. A cursor read locks the
/// lane's sequence until the transaction ends; reading every lane's took one lock per lane, and with
/// a thousand queues (32,000 lanes) overflowed the server's lock table: "out of shared memory" for
/// the prune and for every other session that asked for a lock meanwhile.
#[tokio::test]
async fn the_proof_locks_the_sequences_of_the_lanes_in_the_slot_only() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    // forty queues with a job each in slot 0 (eight shards each: 320 lanes), then one job of
    // another queue alone in slot 1
    let quiet: Vec<_> = (0..40)
        .map(|n| job(n).queue(&format!("quiet-{n}")))
        .collect();
    storage.insert_many(&mut conn, &quiet).await.unwrap();
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    storage
        .insert_many(&mut conn, &[job(40).queue("busy")])
        .await
        .unwrap();
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    drop(conn);

    let mut tx = db.pool.begin().await.unwrap();
    let s = db.schema.as_str();
    let blocker: Option<String> = sqlx::query_scalar(&format!("SELECT {s}.queue_slot_blocker(1)"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(blocker.as_deref(), Some("pending_ready"));
    let pending: Vec<String> =
        sqlx::query_scalar(&format!("SELECT queue FROM {s}.slot_pending_lanes(1)"))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(pending, ["busy"]);
    let lanes: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {s}.queue_lanes"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert!(lanes >= 328, "{lanes} lanes");
    // the sequences this transaction holds locks on: the busy lane's, not the quiet lanes'
    let locked: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_locks k JOIN pg_class c ON c.oid = k.relation \
         WHERE k.pid = pg_backend_pid() AND c.relkind = 'S' ORDER BY 1",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let quiet_cursors: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {s}.queue_lanes l \
         WHERE l.queue LIKE 'quiet-%' AND l.cursor_seq::text LIKE ANY ($1)"
    ))
    .bind(locked.iter().map(|n| format!("%{n}")).collect::<Vec<_>>())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(quiet_cursors, 0, "the quiet lanes' cursors were read");
    assert!(locked.len() <= 4, "{} sequences locked", locked.len());
    tx.rollback().await.unwrap();
    db.cleanup().await;
}

/// The prune proves a slot without the rows of a producer's transaction still open (they are not
/// visible), then waits for its locks, which that transaction holds until it commits. The rows are
/// visible once the locks are granted: the slot has gained a segment since the proof, so the prune
/// proves it again and keeps it, rather than truncating a committed job.
#[tokio::test]
async fn a_producer_committing_while_prune_waits_for_its_locks_keeps_the_slot() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert_many(&mut conn, &[job(1)]).await.unwrap();
    let mut producer = db.pool.begin().await.unwrap();
    let late = storage.insert(&mut producer, &job(2)).await.unwrap();
    let claimed = storage.claim("default", 1, None).await.unwrap();
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    rotate_both(&storage).await;

    let options = ringwork::QueueSlotPrune {
        lock_timeout: Duration::from_secs(20),
        keep_completed: Duration::ZERO,
        keep_failed: Duration::ZERO,
        park_idle: None,
    };
    let pruning = {
        let storage = storage.clone();
        tokio::spawn(async move { storage.prune_queue_slot_with(0, &options).await })
    };
    let waiting = support::eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE NOT l.granted AND l.mode = 'AccessExclusiveLock' AND n.nspname = $1",
        )
        .bind(db.schema.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap()
            > 0
    })
    .await;
    assert!(waiting, "the prune proved the slot and waits for its locks");
    producer.commit().await.unwrap();
    assert_eq!(
        pruning.await.unwrap().unwrap(),
        PruneResult::Skipped("pending_ready".into())
    );
    let claimed = storage.claim("default", 1, None).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(), [late]);
    db.cleanup().await;
}

#[tokio::test]
async fn prune_reclaims_a_fully_closed_slot_and_leaves_its_children_empty() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..300).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 300, None).await.unwrap();
    let (ok, bad) = claimed.split_at(250);
    storage
        .complete_batch(&ok.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    let fails: Vec<_> = bad
        .iter()
        .map(|j| (j.attempt_ref(), CloseOutcome::Failed { error: "no".into() }))
        .collect();
    storage.close_batch(&fails).await.unwrap();
    rotate_both(&storage).await;
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Pruned
    );
    for table in [
        "ready_entries_0",
        "ready_segments_0",
        "ready_tombstones_0",
        "ready_claim_attempt_batches_0",
        "done_entries_0",
        "receipt_completion_batches_0",
        "lease_claim_batches_0",
        "lease_claims_0",
        "lease_claim_closures_0",
        "lease_claim_closure_batches_0",
    ] {
        assert_eq!(
            db.scalar_i64(&format!("SELECT count(*) FROM {{s}}.{table}"))
                .await,
            0,
            "{table}"
        );
    }
    // the cursor survived the truncation of its ledger: nothing comes back
    assert!(storage.claim("default", 10, None).await.unwrap().is_empty());
    // and the ring keeps working on the reclaimed slot
    storage.insert(&mut conn, &job(1)).await.unwrap();
    assert_eq!(storage.claim("default", 10, None).await.unwrap().len(), 1);
    db.cleanup().await;
}

#[tokio::test]
async fn failed_history_is_archived_when_its_slot_is_pruned() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..4).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let claimed = storage.claim("default", 4, None).await.unwrap();
    storage
        .complete_batch(&[claimed[0].attempt_ref(), claimed[1].attempt_ref()])
        .await
        .unwrap();
    let fails: Vec<_> = claimed[2..]
        .iter()
        .map(|j| {
            (
                j.attempt_ref(),
                CloseOutcome::Failed {
                    error: "kept".into(),
                },
            )
        })
        .collect();
    storage.close_batch(&fails).await.unwrap();
    rotate_both(&storage).await;
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Pruned
    );
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, week).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.done_entries").await,
        0,
        "nothing is carried forward into the ring"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.archived_jobs WHERE state = 'failed' AND error = 'kept'"
        )
        .await,
        2,
        "both failures are in the archive"
    );
    let failed = storage.job_state(claimed[2].job_id).await.unwrap().unwrap();
    assert_eq!(failed.state, "failed");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.receipt_completion_batches")
            .await,
        0
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_blocked_by_a_long_reader_gives_up_instead_of_stalling_claims() {
    let db = TestDb::new().await;
    let storage = db.storage();
    seal_a_slot_of_completed_jobs(&db, &storage).await;

    // a long transaction that has read the queue (AccessShareLock on every ready child)
    let mut reader = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {}.ready_entries", db.schema))
        .execute(&mut *reader)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (pruned, claimed) = tokio::join!(
        storage.prune_queue_slot(0, Duration::from_millis(25), KEEP),
        async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            storage.claim("default", 3, None).await
        }
    );
    assert_eq!(pruned.unwrap(), PruneResult::Skipped("busy".into()));
    assert_eq!(
        claimed.unwrap().len(),
        3,
        "the claim ran while the reader was still open"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?}",
        started.elapsed()
    );
    // the operator can see why: the slot is provable, and the reader is named as its blocker
    let reader_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    let slots = storage.ring_slots().await.unwrap();
    let sealed = slots
        .iter()
        .find(|s| s.ring == "queue" && s.slot == 0)
        .unwrap();
    assert_eq!(
        (sealed.state.as_str(), sealed.blocker.as_deref()),
        ("sealed", None)
    );
    let blockers = storage.prune_blockers().await.unwrap();
    assert!(
        blockers.iter().any(|b| b.pid == reader_pid
            && b.ring == "queue"
            && b.slot == 0
            && b.lock_modes.contains("AccessShareLock")),
        "{blockers:?}"
    );
    assert!(
        blockers.iter().all(|b| b.ring != "queue" || b.slot == 0),
        "only sealed slots are listed: {blockers:?}"
    );
    reader.rollback().await.unwrap();
    assert_eq!(
        storage.prune_queue_slot(0, NO_WAIT, KEEP).await.unwrap(),
        PruneResult::Pruned
    );
    db.cleanup().await;
}

/// Long readers: the maintenance tick does not try a sealed slot that a long transaction holds
/// a lock on (idle in it for a second, or open ten): `held`, with no proof run and no lock waited
/// for. A holder that is running, and one that has just gone idle, are still tried (`busy`): a
/// prune that tries every tick gets in between readers that come and go. Slots the holder does not
/// hold are pruned in the same tick, and the first tick after the holder ends prunes the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_skips_a_slot_a_long_transaction_holds_and_prunes_it_once_released() {
    let db = TestDb::new().await;
    let storage = db.storage();
    seal_a_slot_of_completed_jobs(&db, &storage).await;
    let config = ringwork::MaintenanceConfig {
        rotate_interval: Duration::from_secs(3600),
        ..ringwork::MaintenanceConfig::default()
    };

    let read_the_queue_ring = format!("SELECT count(*) FROM {}.ready_entries", db.schema);

    // a report's transaction that has read the queue ring (it holds every queue child) and has
    // just gone idle: tried, and the prune times out on its lock
    let mut reader = db.pool.begin().await.unwrap();
    sqlx::query(&read_the_queue_ring)
        .execute(&mut *reader)
        .await
        .unwrap();
    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(queue_skips(&report), vec!["busy".to_string()], "{report:?}");
    assert_eq!(
        report.pruned_claim_slots,
        vec![0],
        "the claim slot, which the reader never read, is pruned in the same tick"
    );
    // idle in it for over a second: held, not tried (real time: a backend's age is
    // pg_stat_activity's, which the engine clock does not move)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(queue_skips(&report), vec!["held".to_string()], "{report:?}");
    assert!(report.pruned_queue_slots.is_empty(), "{report:?}");
    // busy with a statement, in a transaction open for over a second (under ten): tried
    let running = tokio::spawn(async move {
        sqlx::query("SELECT pg_sleep(1)")
            .execute(&mut *reader)
            .await
            .map(|_| reader)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(queue_skips(&report), vec!["busy".to_string()], "{report:?}");
    running.await.unwrap().unwrap().rollback().await.unwrap();

    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(report.pruned_queue_slots, vec![0], "{report:?}");
    db.cleanup().await;
}

/// Long readers: once a ring's lock attempt times out in a tick, the ring's other sealed slots
/// wait for the next tick (`after_busy`) instead of each running its proof and queueing the hot path
/// behind another ACCESS EXCLUSIVE request. The first tick after the holder ends prunes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_tries_one_busy_slot_a_ring_and_prunes_the_rest_once_released() {
    let db = TestDb::new().await;
    let storage = db.storage();
    seal_a_slot_of_completed_jobs(&db, &storage).await;
    // the helper's last three jobs, in slot 1: completed and sealed too
    let claimed = storage.claim("default", 3, None).await.unwrap();
    assert_eq!(claimed.len(), 3);
    storage
        .complete_batch(&claimed.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
        .await
        .unwrap();
    rotate_both(&storage).await;
    assert_eq!(storage.sealed_queue_slots().await.unwrap(), vec![0, 1]);
    let config = ringwork::MaintenanceConfig {
        rotate_interval: Duration::from_secs(3600),
        ..ringwork::MaintenanceConfig::default()
    };

    // a reader between statements (not idle long enough to count as held) holds both slots
    let mut reader = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {}.ready_entries", db.schema))
        .execute(&mut *reader)
        .await
        .unwrap();
    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(
        queue_skips(&report),
        vec!["busy".to_string(), "after_busy".to_string()],
        "{report:?}"
    );
    assert!(report.pruned_queue_slots.is_empty(), "{report:?}");
    assert_eq!(
        report.pruned_claim_slots,
        vec![0, 1],
        "the claim ring, which the reader never read, is pruned in the same tick"
    );
    reader.rollback().await.unwrap();

    let report = ringwork::Admin::from(storage.clone())
        .run_maintenance(&config)
        .await
        .unwrap();
    assert_eq!(report.pruned_queue_slots, vec![0, 1], "{report:?}");
    assert!(queue_skips(&report).is_empty(), "{report:?}");
    db.cleanup().await;
}
