//! Parking: a paused or unworked lane no longer pins its queue slots. Prune moves the
//! lane's unclaimed rows out of the ring, the slot is truncated, and the lane's next claim (or its
//! queue's resume) brings them back in their original order. Real transactions on a real server.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{CancelOutcome, NewJob, PruneResult, QueueSlotPrune, Storage};
use serde_json::json;
use sqlx::Connection;
use support::TestDb;

const NO_WAIT: Duration = Duration::from_millis(25);
const KEEP: Duration = Duration::from_secs(3600);
const IDLE: Option<Duration> = Some(Duration::from_secs(30));

fn job(queue: &str, n: i64) -> NewJob {
    NewJob::from_parts("noop", json!({ "n": n }))
        .unwrap()
        .queue(queue)
}

async fn insert(db: &TestDb, queue: &str, range: std::ops::Range<i64>) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    let jobs: Vec<_> = range.map(|n| job(queue, n)).collect();
    db.storage().insert_many(&mut conn, &jobs).await.unwrap()
}

/// Claim and complete batches of `max` until a claim comes back empty; the job ids in claim order.
async fn drain(storage: &Storage, queue: &str, max: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    loop {
        let batch = storage.claim(queue, max, None).await.unwrap();
        if batch.is_empty() {
            return ids;
        }
        let refs: Vec<_> = batch.iter().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&refs).await.unwrap();
        ids.extend(batch.iter().map(|j| j.job_id));
    }
}

async fn parked(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT count(*) FROM {s}.parked_entries")
        .await
}

async fn state_of(storage: &Storage, job_id: i64) -> ringwork::JobStatus {
    storage.job_state(job_id).await.unwrap().unwrap().state
}

async fn available(storage: &Storage, queue: &str) -> i64 {
    storage.queue_counts(Some(queue)).await.unwrap()[0].available
}

fn options(park_idle: Option<Duration>) -> QueueSlotPrune {
    QueueSlotPrune {
        lock_timeout: NO_WAIT,
        keep_completed: KEEP,
        keep_failed: KEEP,
        park_idle,
    }
}

/// Seal the current queue slot (and the claim slot) and try to prune every sealed queue slot.
async fn rotate_and_prune(storage: &Storage, park_idle: Option<Duration>) -> Vec<PruneResult> {
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    let mut results = Vec::new();
    for slot in storage.sealed_queue_slots().await.unwrap() {
        results.push(
            storage
                .prune_queue_slot_with(slot, &options(park_idle))
                .await
                .unwrap(),
        );
    }
    results
}

#[tokio::test]
async fn a_paused_queue_is_parked_its_slot_reclaimed_and_resume_brings_its_jobs_back_in_order() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.set_queue_paused("cold", true).await.unwrap();
    let cold_first = insert(&db, "cold", 0..30).await;
    // other queues keep running meanwhile
    insert(&db, "default", 0..10).await;
    assert_eq!(drain(&storage, "default", 4).await.len(), 10);

    // Without parking the paused queue pins the slot, as before.
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    let sealed = storage.sealed_queue_slots().await.unwrap();
    assert_eq!(sealed.len(), 1);
    assert_eq!(
        storage
            .prune_queue_slot(sealed[0], NO_WAIT, KEEP)
            .await
            .unwrap(),
        PruneResult::Skipped("pending_ready".into())
    );
    // With parking, the slot is reclaimed and the paused queue's jobs wait outside the ring.
    assert_eq!(
        storage
            .prune_queue_slot_with(sealed[0], &options(IDLE))
            .await
            .unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    assert_eq!(parked(&db).await, 30);
    assert_eq!(available(&storage, "cold").await, 30, "parked jobs count");
    let state = storage.job_state(cold_first[7]).await.unwrap().unwrap();
    assert_eq!(state.state, "available");
    // a parked job can be cancelled; it never runs and counts drop at once
    assert_eq!(
        storage.cancel_job(cold_first[7], "test").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(available(&storage, "cold").await, 29);
    assert_eq!(state_of(&storage, cold_first[7]).await, "cancelled");

    // More jobs while paused; a second park of the same lanes adds to the first.
    let cold_second = insert(&db, "cold", 30..40).await;
    assert_eq!(
        rotate_and_prune(&storage, IDLE).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(available(&storage, "cold").await, 39);
    // paused: a claim returns nothing and brings nothing back
    assert!(storage.claim("cold", 10, None).await.unwrap().is_empty());
    assert_eq!(parked(&db).await, 40);

    // The cancel's own record can end before the parked row does (keep_failed): the row still
    // says cancelled, parked and after it is back in the ring. Test-only: these DELETEs stand in
    // for that record aging out of the ring and the archive; no engine path deletes ring rows.
    let forget_cancel = format!(
        "DELETE FROM {{s}}.done_entries WHERE job_id = {0}; DELETE FROM {{s}}.archived_jobs WHERE job_id = {0}",
        cold_first[7]
    );
    db.exec(&forget_cancel).await;
    assert_eq!(state_of(&storage, cold_first[7]).await, "cancelled");
    // Resume: the parked rows are back in the ring at once, and drain in enqueue order.
    storage.set_queue_paused("cold", false).await.unwrap();
    db.exec(&forget_cancel).await;
    assert_eq!(state_of(&storage, cold_first[7]).await, "cancelled");
    assert_eq!(parked(&db).await, 0);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.parked_lanes").await,
        0
    );
    let expected: Vec<i64> = cold_first
        .iter()
        .chain(cold_second.iter())
        .copied()
        .filter(|id| *id != cold_first[7])
        .collect();
    // one producer connection writes one shard, so enqueue order is claim order
    assert_eq!(drain(&storage, "cold", 7).await, expected);
    assert_eq!(available(&storage, "cold").await, 0);
    // and the ring is reclaimed after them as usual
    assert_eq!(
        rotate_and_prune(&storage, IDLE).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    db.cleanup().await;
}

#[tokio::test]
async fn an_unworked_lane_is_parked_and_its_first_claim_takes_the_parked_jobs_before_newer_ones() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // a queue nobody works (say a misspelt name): never claimed, so cold once its oldest job has
    // waited park_idle
    let idle = Some(Duration::from_secs(1));
    let old = insert(&db, "unworked", 0..12).await;
    assert_eq!(
        rotate_and_prune(&storage, idle).await,
        vec![PruneResult::Skipped("pending_ready".into())],
        "not yet: its jobs have just arrived"
    );
    db.advance_clock(Duration::from_millis(1100)).await;
    assert_eq!(
        rotate_and_prune(&storage, idle).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.parked_entries WHERE queue = 'unworked'")
            .await,
        12
    );
    assert_eq!(available(&storage, "unworked").await, 12);
    // newer jobs stay in the ring, behind the parked ones in their lane
    let new = insert(&db, "unworked", 12..20).await;
    assert_eq!(available(&storage, "unworked").await, 20);
    // a worker shows up: its claims take the parked jobs first, then the newer ones
    let claimed = drain(&storage, "unworked", 5).await;
    assert_eq!(
        claimed,
        old.iter().chain(new.iter()).copied().collect::<Vec<_>>()
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.parked_lanes").await,
        0
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_lane_being_worked_is_not_parked() {
    let db = TestDb::new().await;
    let storage = db.storage();
    insert(&db, "default", 0..20).await;
    // claimed from a moment ago, with a backlog left in the slot
    let batch = storage.claim("default", 5, None).await.unwrap();
    let refs: Vec<_> = batch.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    assert_eq!(
        rotate_and_prune(&storage, IDLE).await,
        vec![PruneResult::Skipped("pending_ready".into())]
    );
    assert_eq!(parked(&db).await, 0);
    // a lane with a claim still open on the slot is not parked either, even when paused
    let open = storage.claim("default", 5, None).await.unwrap();
    assert_eq!(open.len(), 5);
    storage.set_queue_paused("default", true).await.unwrap();
    for slot in storage.sealed_queue_slots().await.unwrap() {
        assert_eq!(
            storage
                .prune_queue_slot_with(slot, &options(IDLE))
                .await
                .unwrap(),
            PruneResult::Skipped("open_claims".into())
        );
    }
    let refs: Vec<_> = open.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    for slot in storage.sealed_queue_slots().await.unwrap() {
        assert_eq!(
            storage
                .prune_queue_slot_with(slot, &options(IDLE))
                .await
                .unwrap(),
            PruneResult::Pruned
        );
    }
    assert_eq!(available(&storage, "default").await, 10);
    storage.set_queue_paused("default", false).await.unwrap();
    assert_eq!(drain(&storage, "default", 3).await.len(), 10);
    db.cleanup().await;
}

/// The race parking could lose: a claim that looked for parked lanes before a park committed and
/// locks the lane after it. Producers, claimers, a pause/resume toggler and a parking prune loop
/// run at once on one queue; every job must be claimed exactly once, none through the fallback
/// (deferred_jobs stays empty: nothing here retries), and the ring must have been parked and
/// pruned along the way.
#[tokio::test]
async fn parking_racing_claims_pauses_and_producers_loses_and_repeats_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("hot").await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();

    let producer = {
        let (db_pool, schema, stop) = (db.pool.clone(), db.schema.clone(), stop.clone());
        tokio::spawn(async move {
            let storage = Storage::new(db_pool.clone(), schema);
            let mut ids = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut conn = db_pool.acquire().await.unwrap();
                let jobs: Vec<_> = (n..n + 7).map(|i| job("hot", i)).collect();
                ids.extend(storage.insert_many(&mut conn, &jobs).await.unwrap());
                n += 7;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            ids
        })
    };
    for _ in 0..3 {
        let (storage, stop) = (storage.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let batch = storage.claim("hot", 5, None).await.unwrap();
                let refs: Vec<_> = batch.iter().map(|j| j.attempt_ref()).collect();
                storage.complete_batch(&refs).await.unwrap();
                ids.extend(batch.iter().map(|j| j.job_id));
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            ids
        }));
    }
    let toggler = {
        let (storage, stop) = (storage.clone(), stop.clone());
        tokio::spawn(async move {
            let mut paused = false;
            while !stop.load(Ordering::Relaxed) {
                paused = !paused;
                storage.set_queue_paused("hot", paused).await.unwrap();
                tokio::time::sleep(Duration::from_millis(if paused { 40 } else { 25 })).await;
            }
            storage.set_queue_paused("hot", false).await.unwrap();
        })
    };
    let maintainer = {
        let (storage, stop) = (storage.clone(), stop.clone());
        tokio::spawn(async move {
            let mut pruned = 0;
            while !stop.load(Ordering::Relaxed) {
                for result in rotate_and_prune(&storage, IDLE).await {
                    pruned += usize::from(result == PruneResult::Pruned);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pruned
        })
    };
    // count parks while it runs (a park is a parked_lanes row appearing)
    let mut parks_seen = 0;
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        parks_seen += db.scalar_i64("SELECT count(*) FROM {s}.parked_lanes").await;
    }
    stop.store(true, Ordering::Relaxed);
    let produced = producer.await.unwrap();
    toggler.await.unwrap();
    let pruned = maintainer.await.unwrap();
    let mut claimed: Vec<i64> = Vec::new();
    for task in tasks {
        claimed.extend(task.await.unwrap());
    }
    claimed.extend(drain(&storage, "hot", 50).await);

    eprintln!("parks_seen {parks_seen} pruned {pruned}");
    assert!(parks_seen > 0, "the run parked lanes");
    assert!(pruned > 5, "the ring kept being reclaimed: {pruned} prunes");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0,
        "no parked row was ever found behind its cursor"
    );
    let mut sorted = claimed.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), claimed.len(), "a job was claimed twice");
    let mut expected = produced.clone();
    expected.sort_unstable();
    assert_eq!(sorted, expected, "every produced job was claimed");
    db.cleanup().await;
}

/// A claim looks for a lane's rows only in the slots its segments are in, and usually in the
/// current slot alone: when the segments there from the cursor's on are numbered without a hole up
/// to the lane's last allocated one. Unparking breaks the usual order of slots: the parked rows
/// come back into the current slot, behind a newer segment of the same lane in an older slot. A
/// claim that took the current slot alone there would drain the unparked segment and never reach
/// the newer one.
#[tokio::test]
async fn a_lane_unparked_behind_its_own_newer_segment_is_claimed_from_both_slots_in_order() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.set_queue_paused("cold", true).await.unwrap();
    let first = insert(&db, "cold", 0..10).await;
    assert_eq!(
        rotate_and_prune(&storage, IDLE).await,
        vec![PruneResult::Pruned]
    );
    assert_eq!(parked(&db).await, 10);
    let lane = db
        .scalar_i64("SELECT lane_id::int8 FROM {s}.parked_lanes")
        .await;
    // the lane's next segment, in the next slot: every other shard of the queue is held, so the
    // producer writes this one
    let holder = support::hold_every_shard_but(&db, "cold", lane as i32).await;
    let second = insert(&db, "cold", 10..20).await;
    holder.close().await.unwrap();
    let lane_of_second = db
        .scalar_i64(&format!(
            "SELECT min(lane_id)::int8 FROM {{s}}.ready_entries WHERE job_id = {}",
            second[0]
        ))
        .await;
    assert_eq!(lane_of_second, lane, "the parked lane's own next segment");
    // that slot is sealed (not pruned), and resume brings the parked rows back into the new one
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    storage.set_queue_paused("cold", false).await.unwrap();
    assert_eq!(parked(&db).await, 0);
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(DISTINCT ready_slot) FROM {{s}}.ready_entries WHERE lane_id = {lane}"
        ))
        .await,
        2,
        "the lane's rows are in two slots, its older ones in the current slot"
    );
    let expected: Vec<i64> = first.iter().chain(second.iter()).copied().collect();
    assert_eq!(drain(&storage, "cold", 3).await, expected);
    assert_eq!(available(&storage, "cold").await, 0);
    db.cleanup().await;
}
