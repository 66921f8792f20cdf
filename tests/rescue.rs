//! The receipt plane (seed ADR-023): heartbeats, stale and deadline rescue with per-slot cursors,
//! row-local claims, per-attempt serialization, prune order, and the races around them.

mod support;

use std::time::Duration;

use ringwork::PruneResult;
use ringwork::{NewJob, Outcome};
use serde_json::json;
use support::{complete_one, TestDb};

fn job(n: i64) -> NewJob {
    NewJob::from_parts("noop", json!({ "n": n })).unwrap()
}

const NO_WAIT: Duration = Duration::from_millis(25);
// Rescue reads the engine clock, which the tests advance (`TestDb::advance_clock`) rather than
// sleep: a stale age of a minute is never reached by a slow machine, only by the clock.
const STALE: Duration = Duration::from_secs(60);
// A rotation's minimum age that no slot reaches: the template's slots are as old as the template,
// which a machine that keeps it may have made hours ago (at an hour, this failed after one).
const NEVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

async fn enqueue(db: &TestDb, jobs: Vec<NewJob>) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage().insert_many(&mut conn, &jobs).await.unwrap()
}

#[tokio::test]
async fn stale_rescue_requeues_an_abandoned_claim_and_the_late_completion_is_stale() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1)]).await;
    let first = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        0,
        "too new to be a candidate"
    );
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 1);
    assert_eq!(complete_one(&storage, &first).await, Outcome::Stale);
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.lease_claim_closure_batches WHERE outcome = 'rescued'"
        )
        .await,
        1
    );
    // re-queued with backoff (2^1 s): due later, then runs again under a higher run_lease
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs WHERE run_at > now()")
            .await,
        1
    );
    db.exec("UPDATE {s}.deferred_jobs SET run_at = now()").await;
    storage.promote_due(10).await.unwrap();
    let second = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!(
        (second.job_id, second.run_lease, second.attempt),
        (first.job_id, 2, 2)
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_fresh_heartbeat_keeps_a_claim_alive_and_the_cursor_wraps_back_to_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1), job(2)]).await;
    let claimed = storage.claim("default", 2, None).await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.attempt_state")
            .await,
        0,
        "short jobs make none"
    );
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    let beat = storage
        .heartbeat_batch(&[(claimed[0].attempt_ref(), Some(json!({"done": 50})))])
        .await
        .unwrap();
    assert_eq!(beat, vec![Outcome::Applied]);
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        1,
        "only the silent claim is rescued"
    );
    assert_eq!(complete_one(&storage, &claimed[1]).await, Outcome::Stale);
    // the sweep stepped over the live claim and will revisit it: once its heartbeat ages, it goes
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        1,
        "revisited after the wrap"
    );
    assert_eq!(complete_one(&storage, &claimed[0]).await, Outcome::Stale);
    // the rescued attempt's row stays only because it holds progress: the checkpoint the job's
    // next attempt resumes from (tests/progress.rs); without progress it goes with the attempt
    let kept = "SELECT count(*) FROM {s}.attempt_state WHERE progress = '{\"done\": 50}'";
    assert_eq!(db.scalar_i64(kept).await, 1, "kept as the checkpoint");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.attempt_state")
            .await,
        1,
        "nothing else is left"
    );
    // a heartbeat for a closed attempt changes nothing
    let late = storage
        .heartbeat_batch(&[(claimed[0].attempt_ref(), Some(json!({"done": 90})))])
        .await
        .unwrap();
    assert_eq!(late, vec![Outcome::Stale]);
    assert_eq!(db.scalar_i64(kept).await, 1);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.attempt_state")
            .await,
        1
    );
    db.cleanup().await;
}

#[tokio::test]
async fn exhausted_attempts_are_failed_by_rescue_not_retried_forever() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let id = enqueue(&db, vec![job(1).max_attempts(1)]).await[0];
    storage.claim("default", 1, None).await.unwrap();
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 1);
    let state: String = sqlx::query_scalar(&format!(
        "SELECT state FROM {}.done_entries WHERE job_id = $1",
        db.schema
    ))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(state, "failed");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    db.cleanup().await;
}

#[tokio::test]
async fn the_stale_cursor_stops_before_a_claim_it_cannot_lock_and_skips_claims_too_new() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, (0..3).map(job).collect()).await;
    let old = storage.claim("default", 1, None).await.unwrap().remove(0);
    let old2 = storage.claim("default", 1, None).await.unwrap().remove(0);
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    let new = storage.claim("default", 1, None).await.unwrap().remove(0);

    // a completion of `old` is in flight: it holds the per-attempt lock
    let mut completer = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT {}.lock_attempt($1)", db.schema))
        .bind(old.job_id)
        .execute(&mut *completer)
        .await
        .unwrap();
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        0,
        "stopped before the locked claim"
    );
    let cursor = db
        .scalar_i64(
            "SELECT count(*) FROM {s}.claim_ring_slots WHERE stale_cursor_claimed_at IS NOT NULL",
        )
        .await;
    assert_eq!(cursor, 0, "the cursor did not move past it");
    completer.rollback().await.unwrap();

    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        2,
        "both old claims, not the new one"
    );
    let batch_of = |receipt: i64| receipt / 4096;
    let cursor_batch = db
        .scalar_i64("SELECT stale_cursor_batch_id FROM {s}.claim_ring_slots WHERE slot = 0")
        .await;
    assert_eq!(cursor_batch, batch_of(old2.receipt_id));
    assert_eq!(complete_one(&storage, &new).await, Outcome::Applied);
    db.cleanup().await;
}

#[tokio::test]
async fn complete_and_rescue_of_the_same_attempt_have_exactly_one_winner() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, (0..40).map(job).collect()).await;
    let claimed = storage.claim("default", 40, None).await.unwrap();
    db.advance_clock(Duration::from_millis(150)).await;
    // race each attempt's completion against a rescue sweep that sees it as stale
    let mut completed = 0;
    let mut rescued = 0;
    for pair in claimed.chunks(2) {
        let refs: Vec<_> = pair.iter().map(|j| j.attempt_ref()).collect();
        let (outcomes, closed) = tokio::join!(
            storage.complete_batch(&refs),
            storage.rescue(Duration::from_millis(100), 100)
        );
        let outcomes = outcomes.unwrap();
        completed += outcomes.iter().filter(|o| **o == Outcome::Applied).count() as i64;
        rescued += closed.unwrap() as i64;
    }
    // whatever the interleaving, every attempt was closed exactly once
    assert_eq!(
        completed + rescued,
        40,
        "completed {completed} + rescued {rescued}"
    );
    let closures = db
        .scalar_i64(
            "SELECT coalesce(sum(closed_count), 0)::int8 FROM {s}.lease_claim_closure_batches",
        )
        .await;
    assert_eq!(closures, 40);
    let history = db
        .scalar_i64(
            "SELECT coalesce(sum(completed_count), 0)::int8 FROM {s}.receipt_completion_batches",
        )
        .await;
    assert_eq!(history, completed);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        rescued
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

/// The stale sweep finds a batch's open members by subtracting the closure batches that overlap it
/// (one index search per batch): members closed by a completion that also spans another claim
/// batch, or by two completions, are left alone; the rest, and only they, are rescued.
#[tokio::test]
async fn stale_rescue_closes_only_the_open_members_of_a_partly_closed_compact_batch() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, (0..6).map(job).collect()).await;
    let first = storage.claim("default", 4, None).await.unwrap();
    let second = storage.claim("default", 2, None).await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_batches")
            .await,
        2
    );
    // one completion covers a member of each batch; another covers a second member of the first
    storage
        .complete_batch(&[first[0].attempt_ref(), second[0].attempt_ref()])
        .await
        .unwrap();
    storage
        .complete_batch(&[first[2].attempt_ref()])
        .await
        .unwrap();
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 3);
    let rescued: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT r FROM {}.lease_claim_closure_batches c, unnest(c.receipt_ranges) m, \
         generate_series(lower(m), upper(m) - 1) r WHERE c.outcome = 'rescued' ORDER BY 1",
        db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut expected = vec![
        first[1].receipt_id,
        first[3].receipt_id,
        second[1].receipt_id,
    ];
    expected.sort();
    assert_eq!(rescued, expected);
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        0,
        "nothing left open"
    );
    // the completed ones stay completed: a late completion of a rescued one is stale
    assert_eq!(complete_one(&storage, &first[1]).await, Outcome::Stale);
    db.cleanup().await;
}

#[tokio::test]
async fn deadline_rescue_closes_the_open_members_of_a_partly_closed_compact_batch() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, (0..3).map(job).collect()).await;
    let claimed = storage
        .claim("default", 3, Some(Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(claimed.iter().all(|j| j.deadline_at.is_some()));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_batches WHERE deadline_at IS NOT NULL")
            .await,
        1
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claims").await,
        0,
        "compact, not row-local"
    );
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(
        storage.rescue(NEVER, 100).await.unwrap(),
        0,
        "deadline not reached"
    );
    db.advance_clock(Duration::from_millis(300)).await;
    assert_eq!(storage.rescue(NEVER, 100).await.unwrap(), 2);
    assert_eq!(
        db.scalar_i64("SELECT coalesce(sum(closed_count), 0)::int8 FROM {s}.lease_claim_closure_batches WHERE outcome = 'deadline_expired'").await,
        2
    );
    let cursor = db
        .scalar_i64(
            "SELECT batch_deadline_cursor_batch_id FROM {s}.claim_ring_slots WHERE slot = 0",
        )
        .await;
    assert_eq!(
        cursor,
        claimed[0].receipt_id / 4096,
        "advanced past the batch once every member closed"
    );
    assert_eq!(storage.rescue(NEVER, 100).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test]
async fn a_job_with_its_own_timeout_gets_a_row_local_claim_with_its_own_deadline() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(
        &db,
        vec![
            job(1),
            job(2).timeout(Duration::from_millis(200)),
            job(3).timeout(Duration::from_secs(600)),
        ],
    )
    .await;
    let claimed = storage.claim("default", 3, None).await.unwrap();
    assert_eq!(claimed[0].deadline_at, None);
    assert!(claimed[1].deadline_at.is_some() && claimed[2].deadline_at.is_some());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claims").await,
        2
    );
    assert_eq!(
        db.scalar_i64("SELECT coalesce(sum(claimed_count), 0)::int8 FROM {s}.lease_claim_batches")
            .await,
        1
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 3);

    db.advance_clock(Duration::from_millis(300)).await;
    assert_eq!(
        storage.rescue(NEVER, 100).await.unwrap(),
        1,
        "only the 200 ms job expired"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.lease_claim_closures WHERE outcome = 'deadline_expired'"
        )
        .await,
        1
    );
    assert_eq!(complete_one(&storage, &claimed[1]).await, Outcome::Stale);
    // row-local completion closes into lease_claim_closures; compact into closure batches
    let done = storage
        .complete_batch(&[claimed[0].attempt_ref(), claimed[2].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(done, vec![Outcome::Applied, Outcome::Applied]);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_closures WHERE outcome = 'completed'")
            .await,
        1
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test]
async fn prune_refuses_an_open_row_local_claim_and_resets_rescue_cursors_when_it_prunes() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1), job(2).timeout(Duration::from_secs(600))]).await;
    let claimed = storage.claim("default", 2, None).await.unwrap();
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    db.advance_clock(Duration::from_millis(50)).await;
    storage.rescue(NEVER, 100).await.unwrap();
    // a moved cursor is a new row in the slot's claim_rescue_cursors child (migration 0005)
    db.exec("INSERT INTO {s}.claim_rescue_cursors (claim_slot, stale_cursor_claimed_at, stale_cursor_batch_id) VALUES (0, now(), 1)").await;
    assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Skipped("open_claims".into())
    );
    assert_eq!(
        storage
            .prune_queue_slot(0, NO_WAIT, Duration::ZERO)
            .await
            .unwrap(),
        PruneResult::Skipped("open_claims".into())
    );
    storage
        .complete_batch(&[claimed[1].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Pruned
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.claim_ring_slots WHERE slot = 0 AND stale_cursor_claimed_at IS NULL AND stale_cursor_batch_id IS NULL").await,
        1,
        "cursors reset"
    );
    assert_eq!(
        storage
            .prune_queue_slot(0, NO_WAIT, Duration::ZERO)
            .await
            .unwrap(),
        PruneResult::Pruned
    );
    db.cleanup().await;
}

#[tokio::test]
async fn an_attempt_listed_twice_in_one_batch_is_closed_and_counted_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1), job(2)]).await;
    let claimed = storage.claim("default", 2, None).await.unwrap();
    let a = claimed[0].attempt_ref();
    assert_eq!(
        storage.complete_batch(&[a, a]).await.unwrap(),
        vec![Outcome::Applied, Outcome::Applied],
        "both entries name the attempt that this call closed"
    );
    assert_eq!(
        db.scalar_i64("SELECT sum(closed_count)::int8 FROM {s}.lease_claim_closure_batches")
            .await,
        1
    );
    // the other claim is still open, so the slot must not be prunable
    storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    assert_eq!(
        storage.prune_claim_slot(0, NO_WAIT).await.unwrap(),
        PruneResult::Skipped("open_claims".into())
    );
    db.cleanup().await;
}

/// `complete_batch` looks each compact claim batch up once (`open_attempts`): every attempt must
/// still be judged against its own batch's evidence, closures and lease.
#[tokio::test]
async fn one_completion_over_several_claim_batches_judges_each_attempt_by_its_own_evidence() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(
        &db,
        vec![job(1), job(2), job(3).timeout(Duration::from_secs(600))],
    )
    .await;
    let first = storage.claim("default", 3, None).await.unwrap();
    enqueue(&db, vec![job(4), job(5), job(6)]).await;
    let second = storage.claim("default", 3, None).await.unwrap();
    assert_ne!(
        first[0].receipt_id / 4096,
        second[0].receipt_id / 4096,
        "two claim batches"
    );
    assert!(
        first[2].deadline_at.is_some(),
        "job 3 has a row-local claim"
    );
    assert_eq!(complete_one(&storage, &first[1]).await, Outcome::Applied);
    let wrong_lease = ringwork::AttemptRef {
        run_lease: second[0].run_lease + 1,
        ..second[0].attempt_ref()
    };
    let wrong_job = ringwork::AttemptRef {
        job_id: second[2].job_id,
        ..second[1].attempt_ref()
    };
    let outcomes = storage
        .complete_batch(&[
            first[0].attempt_ref(),
            first[1].attempt_ref(), // closed by the call above
            first[2].attempt_ref(), // row-local
            wrong_lease,
            second[1].attempt_ref(),
            second[1].attempt_ref(), // listed twice
            wrong_job,               // another attempt's receipt
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Stale,
            Outcome::Applied,
            Outcome::Stale,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Stale,
        ]
    );
    assert_eq!(
        db.scalar_i64("SELECT sum(closed_count)::int8 FROM {s}.lease_claim_closure_batches")
            .await,
        3,
        "compact closures: job 2, then jobs 1 and 5"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.lease_claim_closures")
            .await,
        1
    );
    assert_eq!(
        storage.count_in_flight(None).await.unwrap(),
        2,
        "jobs 4 and 6"
    );
    assert_eq!(
        storage
            .complete_batch(&[second[2].attempt_ref(), second[0].attempt_ref()])
            .await
            .unwrap(),
        vec![Outcome::Applied, Outcome::Applied]
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_slot_does_not_stall_rotation_or_pruning_of_the_others() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(0)]).await;
    let pinned = storage.claim("default", 1, None).await.unwrap().remove(0); // a long job, never finishing
    let mut pruned_claim = std::collections::BTreeSet::new();
    let mut pruned_queue = std::collections::BTreeSet::new();
    for round in 0..40 {
        enqueue(&db, (0..5).map(|i| job(round * 10 + i)).collect()).await;
        let batch = storage.claim("default", 5, None).await.unwrap();
        storage
            .complete_batch(&batch.iter().map(|j| j.attempt_ref()).collect::<Vec<_>>())
            .await
            .unwrap();
        storage
            .heartbeat_batch(&[(pinned.attempt_ref(), None)])
            .await
            .unwrap();
        storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
        storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
        for slot in storage.sealed_claim_slots().await.unwrap() {
            if storage.prune_claim_slot(slot, NO_WAIT).await.unwrap() == PruneResult::Pruned {
                pruned_claim.insert(slot);
            }
        }
        for slot in storage.sealed_queue_slots().await.unwrap() {
            if storage
                .prune_queue_slot(slot, NO_WAIT, Duration::ZERO)
                .await
                .unwrap()
                == PruneResult::Pruned
            {
                pruned_queue.insert(slot);
            }
        }
    }
    assert!(
        !pruned_claim.contains(&0) && !pruned_queue.contains(&0),
        "the pinned slots were kept"
    );
    assert_eq!(
        pruned_claim.len(),
        7,
        "every other claim slot was reclaimed: {pruned_claim:?}"
    );
    assert_eq!(
        pruned_queue.len(),
        15,
        "every other queue slot was reclaimed: {pruned_queue:?}"
    );
    assert_eq!(complete_one(&storage, &pinned).await, Outcome::Applied);
    db.cleanup().await;
}

#[tokio::test]
async fn in_flight_counts_are_exact_per_queue_when_one_closure_batch_spans_queues() {
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(
        &db,
        vec![
            job(1).queue("a"),
            job(2).queue("a"),
            job(3).queue("b"),
            job(4).queue("b"),
        ],
    )
    .await;
    let a = storage.claim("a", 2, None).await.unwrap();
    let b = storage.claim("b", 2, None).await.unwrap();
    storage
        .complete_batch(&[a[0].attempt_ref(), b[0].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(storage.count_in_flight(Some("a")).await.unwrap(), 1);
    assert_eq!(storage.count_in_flight(Some("b")).await.unwrap(), 1);
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 2);
    // a forged entry beside the real one is not reported as accepted
    let mut forged = a[1].attempt_ref();
    forged.job_id = b[1].job_id;
    let outcomes = storage
        .complete_batch(&[a[1].attempt_ref(), forged])
        .await
        .unwrap();
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Stale]);
    assert_eq!(storage.count_in_flight(Some("a")).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test]
async fn rescue_sweeps_a_claim_that_committed_into_a_slot_already_freed() {
    // A claim reads the current claim slot, a rotation and a prune of that slot commit, then the
    // claim's INSERT lands in the freed slot. Found by the model (tests/model.rs); reproduced here
    // by freeing the slot under an open claim.
    let db = TestDb::new().await;
    let storage = db.storage();
    enqueue(&db, vec![job(1)]).await;
    let claimed = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
    // what prune leaves: a 'freed' ledger event (its TRUNCATE is what the open claim would
    // have blocked, and the claim's rows are the point of the test)
    db.exec(&format!(
        "INSERT INTO {{s}}.claim_ring_ledger (claim_slot, generation, event)
         SELECT slot, generation, 'freed' FROM {{s}}.claim_ring_slots WHERE slot = {}",
        claimed.claim_slot
    ))
    .await;
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM {{s}}.claim_ring_slots WHERE slot = {} AND state = 'free'",
            claimed.claim_slot
        ))
        .await,
        1
    );
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(
        storage.rescue(STALE, 100).await.unwrap(),
        1,
        "the stranded claim was rescued"
    );
    assert_eq!(complete_one(&storage, &claimed).await, Outcome::Stale);
    db.cleanup().await;
}

/// A rotation ledger survives a crash between append and use. Rotation appends to
/// the ledger and then points the current-slot sequences (what producers and claimers read) at the
/// new slots, inside its transaction; sequences are not transactional, so a rotation that dies
/// before its commit leaves them naming slots the ledger still calls free. Work written there in
/// the meantime is not lost, rescue still reaches it, and the next rotate call repairs the
/// sequences from the ledger.
#[tokio::test]
async fn a_rotation_killed_between_ledger_append_and_commit_loses_no_job() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // both current slots hold something, so both rings will rotate
    enqueue(&db, vec![job(1)]).await;
    let first = storage.claim("default", 1, None).await.unwrap().remove(0);
    storage
        .complete_batch(&[first.attempt_ref()])
        .await
        .unwrap();
    let current = |ring: &'static str| {
        let storage = db.storage();
        async move {
            storage
                .ring_slots()
                .await
                .unwrap()
                .into_iter()
                .find(|s| s.ring == ring && s.state == "current")
                .unwrap()
                .slot
        }
    };
    let used = || async {
        (
            db.scalar_i64("SELECT {s}.current_queue_slot()::int8").await as i32,
            db.scalar_i64("SELECT {s}.current_claim_slot()::int8").await as i32,
        )
    };
    let before = (current("queue").await, current("claim").await);
    assert_eq!(used().await, before);

    // the maintenance leader rotates both rings and dies before its commit
    let mut rotator = db.pool.acquire().await.unwrap().detach();
    let rotator_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut rotator)
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "BEGIN; SELECT {s}.rotate_queue_ring('0'); SELECT {s}.rotate_claim_ring('0');",
        s = db.schema.as_str()
    ))
    .execute(&mut rotator)
    .await
    .unwrap();
    let ahead = used().await;
    assert!(
        ahead.0 != before.0 && ahead.1 != before.1,
        "the sequences moved before the commit: {ahead:?} vs {before:?}"
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT pg_terminate_backend({rotator_pid})::int::int8"
        ))
        .await,
        1
    );
    drop(rotator);
    let ledger_unchanged = support::eventually(Duration::from_secs(5), || async {
        (current("queue").await, current("claim").await) == before
    })
    .await;
    assert!(
        ledger_unchanged,
        "the killed rotation's ledger rows are gone"
    );
    assert_eq!(
        used().await,
        ahead,
        "the sequences still name the free slots"
    );

    // a job enqueued and claimed now lands in the slots the ledger calls free
    let id = enqueue(&db, vec![job(2)]).await[0];
    let claimed = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!((claimed.job_id, claimed.claim_slot), (id, ahead.1));
    // the next rotate call puts the sequences back on the ledger (min age: no rotation now)
    assert!(!storage.rotate_queue_ring(NEVER).await.unwrap());
    assert!(!storage.rotate_claim_ring(NEVER).await.unwrap());
    assert_eq!(used().await, before);
    // the abandoned claim in the free claim slot is still found by rescue and runs again
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 1);
    // its retry is due after the rescue backoff (2 s for a first attempt)
    let again = support::eventually(Duration::from_secs(8), || async {
        storage.promote_due(100).await.unwrap() > 0
    })
    .await;
    assert!(again, "the rescued job was promoted");
    let retried = storage.claim("default", 1, None).await.unwrap().remove(0);
    assert_eq!((retried.job_id, retried.run_lease), (id, 2));
    assert_eq!(complete_one(&storage, &retried).await, Outcome::Applied);
    assert_eq!(
        storage.job_state(id).await.unwrap().map(|s| s.state),
        Some(ringwork::JobStatus::Completed)
    );
    // and the ring keeps turning and pruning past the slots the dead rotation touched
    for _ in 0..4 {
        enqueue(&db, vec![job(3)]).await;
        for c in storage.claim("default", 10, None).await.unwrap() {
            storage.complete_batch(&[c.attempt_ref()]).await.unwrap();
        }
        assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
        assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
        for slot in storage.sealed_claim_slots().await.unwrap() {
            storage
                .prune_claim_slot(slot, Duration::from_millis(25))
                .await
                .unwrap();
        }
        for slot in storage.sealed_queue_slots().await.unwrap() {
            storage
                .prune_queue_slot(slot, Duration::from_millis(25), Duration::ZERO)
                .await
                .unwrap();
        }
        assert_eq!(
            used().await,
            (current("queue").await, current("claim").await)
        );
    }
    db.cleanup().await;
}
