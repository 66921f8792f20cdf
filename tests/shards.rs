//! Lane shards: an open producer transaction holds back only its own jobs, claimers take
//! different shards at once, and counts, cancel and prune stay exact across shards. Every test runs
//! real transactions against a real server.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use ringwork::NewJob;
use serde_json::json;
use support::TestDb;

fn job(n: i64) -> NewJob {
    NewJob::from_parts("noop", json!({ "n": n })).unwrap()
}

async fn claim_ids(storage: &ringwork::Storage, max: usize) -> Vec<i64> {
    storage
        .claim("default", max, None)
        .await
        .unwrap()
        .iter()
        .map(|j| j.job_id)
        .collect()
}

/// Claim batches of `max` until a claim comes back empty; the jobs in claim order.
async fn claim_all(storage: &ringwork::Storage, max: usize) -> Vec<ringwork::ClaimedJob> {
    let mut claimed = Vec::new();
    loop {
        let batch = storage.claim("default", max, None).await.unwrap();
        if batch.is_empty() {
            return claimed;
        }
        claimed.extend(batch);
    }
}

/// The ids of `claim_all`'s jobs, in claim order.
async fn claim_all_ids(storage: &ringwork::Storage, max: usize) -> Vec<i64> {
    claim_all(storage, max)
        .await
        .iter()
        .map(|j| j.job_id)
        .collect()
}

async fn available(storage: &ringwork::Storage) -> i64 {
    storage.queue_counts(Some("default")).await.unwrap()[0].available
}

#[tokio::test]
async fn an_open_transaction_holds_back_only_its_own_jobs_and_a_rolled_back_one_is_skipped() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // A allocates first but commits last; B allocates second and commits first.
    let mut a = db.pool.begin().await.unwrap();
    let a_id = storage.insert(&mut a, &job(1)).await.unwrap();
    let mut b = db.pool.begin().await.unwrap();
    let b_id = storage.insert(&mut b, &job(2)).await.unwrap();
    b.commit().await.unwrap();
    assert_eq!(available(&storage).await, 1, "A's job is not counted yet");
    assert_eq!(
        claim_ids(&storage, 10).await,
        vec![b_id],
        "B is claimed while A is still open"
    );
    a.commit().await.unwrap();
    assert_eq!(claim_ids(&storage, 10).await, vec![a_id], "A after commit");

    // C allocates and rolls back while D commits: D is claimed, C's gap is stepped over for good.
    let mut c = db.pool.begin().await.unwrap();
    storage.insert(&mut c, &job(3)).await.unwrap();
    let mut d = db.pool.begin().await.unwrap();
    let d_id = storage.insert(&mut d, &job(4)).await.unwrap();
    d.commit().await.unwrap();
    assert_eq!(claim_ids(&storage, 10).await, vec![d_id]);
    c.rollback().await.unwrap();
    // E writes after C's rollback, possibly into C's shard, behind C's permanent gap
    let e_ids = storage
        .insert_many(
            &mut db.pool.acquire().await.unwrap(),
            &(5..8).map(job).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert_eq!(claim_ids(&storage, 10).await, e_ids);
    assert!(claim_ids(&storage, 10).await.is_empty());
    assert_eq!(available(&storage).await, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn one_transaction_writes_one_shard_per_lane_even_across_a_rolled_back_savepoint() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = vec![storage.insert(&mut tx, &job(1)).await.unwrap()];
    {
        // a savepoint that rolls back: its rows go, the transaction keeps writing one shard
        let mut sp = sqlx::Connection::begin(&mut *tx).await.unwrap();
        storage.insert(&mut sp, &job(2)).await.unwrap();
        sp.rollback().await.unwrap();
    }
    ids.extend(
        storage
            .insert_many(&mut tx, &(3..200).map(job).collect::<Vec<_>>())
            .await
            .unwrap(),
    );
    let shards: i64 = sqlx::query_scalar(&format!(
        "SELECT count(DISTINCT lane_id) FROM {}.ready_entries",
        db.schema
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(shards, 1, "one open transaction, one shard");
    tx.commit().await.unwrap();
    let claimed = claim_all_ids(&storage, 50).await;
    assert_eq!(
        claimed, ids,
        "FIFO within the shard, the rolled-back job skipped"
    );
    db.cleanup().await;
}

/// The lane id and shard number of each job, in the order given.
async fn lanes_of(db: &TestDb, ids: &[i64]) -> Vec<(i32, i32)> {
    sqlx::query_as(&format!(
        "SELECT e.lane_id, l.shard FROM unnest($1::bigint[]) WITH ORDINALITY AS i(job_id, n)
         JOIN {0}.ready_entries e ON e.job_id = i.job_id
         JOIN {0}.queue_lanes l ON l.lane_id = e.lane_id ORDER BY i.n",
        db.schema
    ))
    .bind(ids)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The shard (lane id) of each job, in the order given.
async fn shards_of(db: &TestDb, ids: &[i64]) -> Vec<i32> {
    lanes_of(db, ids).await.into_iter().map(|l| l.0).collect()
}

/// The shard number of each job, in the order given.
async fn shard_numbers(db: &TestDb, ids: &[i64]) -> Vec<i32> {
    lanes_of(db, ids).await.into_iter().map(|l| l.1).collect()
}

/// `job` inserted by a backend of its own, which is closed after the insert.
async fn insert_on_a_new_connection(db: &TestDb, job: NewJob) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let id = db.storage().insert(&mut conn, &job).await.unwrap();
    conn.close().await.unwrap();
    id
}

#[tokio::test]
async fn a_steady_producer_keeps_to_one_shard_until_a_segment_waits() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // Each enqueue on a new connection: backends break ties from different shards, so only the
    // shard choice itself can keep them on one. Each job is claimed before the next is written,
    // which leaves that shard's cursor sequence one segment behind (it moves at the next claim).
    let mut steady = Vec::new();
    for n in 0..6 {
        steady.push(insert_on_a_new_connection(&db, job(n)).await);
        assert_eq!(claim_ids(&storage, 10).await, vec![steady[n as usize]]);
    }
    let shards = shards_of(&db, &steady).await;
    assert!(
        shards.iter().all(|s| *s == shards[0]),
        "a producer at a steady rate keeps to one shard, so a claim visits one: {shards:?}"
    );
    assert_eq!(
        shard_numbers(&db, &steady[..1]).await,
        vec![0],
        "the first free shard without a backlog is the lowest-numbered, the same in every backend"
    );
    // Now without claims. The shard's cursor sequence is one segment behind its last claim, which
    // counts as no backlog: the next segment goes to the same shard. Then that segment waits
    // unclaimed, a backlog, and the one after spreads to another shard.
    let mut waiting = Vec::new();
    for n in 6..8 {
        waiting.push(insert_on_a_new_connection(&db, job(n)).await);
    }
    let later = shards_of(&db, &waiting).await;
    assert_eq!(later[0], shards[0], "{later:?}");
    assert_ne!(later[1], shards[0], "a segment waits: the next spreads");
    assert_eq!(claim_all(&storage, 10).await.len(), 2);
    db.cleanup().await;
}

/// Eighteen segments of three jobs, each inserted on a new connection, so that they interleave
/// across the shards by age: first fit gives shard 0 the first two, shard 1 the next two, and so
/// on to shard 7, then shards 0 and 1 one more each (the least behind). Every job has a timeout of
/// its own when `own_timeouts` (a row-local claim each). The ids in insertion order.
async fn interleaved_backlog(db: &TestDb, own_timeouts: bool) -> Vec<i64> {
    use sqlx::Connection;
    let mut ids = Vec::new();
    for segment in 0..18 {
        let jobs: Vec<NewJob> = (0..3)
            .map(|n| {
                let job = job(segment * 3 + n);
                if own_timeouts {
                    job.timeout(Duration::from_secs(600))
                } else {
                    job
                }
            })
            .collect();
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        ids.extend(db.storage().insert_many(&mut conn, &jobs).await.unwrap());
        conn.close().await.unwrap();
    }
    let shards = shard_numbers(db, &ids).await;
    let by_segment: Vec<i32> = shards.chunks(3).map(|c| c[0]).collect();
    assert_eq!(
        by_segment,
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 0, 1]
    );
    ids
}

#[tokio::test]
async fn claims_merge_the_shards_by_age_at_segment_boundaries_in_either_walk() {
    // A shard's walk stops before a segment younger than the next shard's head, so a backlog spread
    // over shards is claimed oldest segment first: here the insertion order. Shard 0's third
    // segment is younger than every other shard's first, so a walk that did not stop would take it
    // third. Both walks are held to it: the one-statement walk (plain jobs) and the row-by-row walk
    // (jobs with timeouts of their own take row-local claims), with claims that take everything
    // at once and claims of four that stop inside segments.
    for own_timeouts in [false, true] {
        for max in [100, 4] {
            let db = TestDb::new().await;
            let ids = interleaved_backlog(&db, own_timeouts).await;
            let claimed = claim_all_ids(&db.storage(), max).await;
            assert_eq!(
                claimed, ids,
                "own timeouts {own_timeouts}, claims of {max}: oldest segment first"
            );
            db.cleanup().await;
        }
    }
}

#[tokio::test]
async fn a_backlog_on_every_shard_sends_each_next_segment_to_the_least_behind() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // Nothing is claimed. A shard reads as behind once two of its segments wait (the cursor
    // sequence's lag of one counts as none), so sixteen inserts fill the eight base shards in
    // order, two segments each, and every shard is then one segment behind.
    let mut filling = Vec::new();
    for n in 0..16 {
        filling.push(insert_on_a_new_connection(&db, job(n)).await);
    }
    let filled = shard_numbers(&db, &filling).await;
    assert_eq!(
        filled,
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7],
        "first fit: the lowest-numbered shard without a backlog"
    );
    // Now every shard is behind by one: each next segment goes to a shard of the least backlog,
    // which then is behind by two, so eight inserts take the eight shards once each.
    let mut spread = Vec::new();
    for n in 16..24 {
        spread.push(insert_on_a_new_connection(&db, job(n)).await);
    }
    let later = shard_numbers(&db, &spread).await;
    assert_eq!(
        later,
        vec![0, 1, 2, 3, 4, 5, 6, 7],
        "the least behind first: {later:?}"
    );
    // The least behind held by an open transaction: the next least takes the segment (no new
    // shard). A takes shard 0 and stays open, seven more inserts take shards 1 to 7, and all eight
    // are then three behind, shard 0 first in shard order.
    let mut a = db.pool.begin().await.unwrap();
    let a_id = storage.insert(&mut a, &job(24)).await.unwrap();
    let mut around = Vec::new();
    for n in 25..32 {
        around.push(insert_on_a_new_connection(&db, job(n)).await);
    }
    let e_id = insert_on_a_new_connection(&db, job(32)).await;
    a.commit().await.unwrap();
    let held = shard_numbers(&db, &[a_id]).await;
    let others = shard_numbers(&db, &around).await;
    assert_eq!((held, others), (vec![0], vec![1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(
        shard_numbers(&db, &[e_id]).await,
        vec![1],
        "shard 0 is held: the next of the least backlog, in shard order"
    );
    let lanes: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}.queue_lanes", db.schema))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(lanes, 8, "no shard was created while a free one was left");
    assert_eq!(claim_all(&storage, 10).await.len(), 33);
    db.cleanup().await;
}

#[tokio::test]
async fn a_claim_walks_a_lone_shard_whose_segment_is_not_committed_and_moves_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // A first job claimed, so the shard has a cursor; then an open transaction allocates the
    // shard's next segment. Its sequences say it may have work, and as the only such shard the
    // claim walks it without a head probe first: the walk sees nothing and must leave the cursor
    // where it was, or the job would be stepped over once its transaction commits.
    let mut conn = db.pool.acquire().await.unwrap();
    let first = storage.insert(&mut conn, &job(1)).await.unwrap();
    assert_eq!(claim_ids(&storage, 10).await, vec![first]);
    let mut open = db.pool.begin().await.unwrap();
    let held = storage.insert(&mut open, &job(2)).await.unwrap();
    let ledger = "SELECT count(*) FROM {s}.ready_claim_attempt_batches";
    let before = db.scalar_i64(ledger).await;
    for _ in 0..3 {
        assert!(claim_ids(&storage, 10).await.is_empty());
    }
    assert_eq!(db.scalar_i64(ledger).await, before, "no cursor moved");
    open.commit().await.unwrap();
    assert_eq!(claim_ids(&storage, 10).await, vec![held]);
    db.cleanup().await;
}

/// A walk that runs out of rows moves the cursor to the end of the last segment it walked, without
/// asking `ready_segments`: a segment's rows commit together, so running out means its last row
/// was walked. The race it must not lose: the shard's next segment is allocated by an open
/// transaction while the walk runs. Its rows must still be claimed once it commits, and a claim
/// cut short by its size inside a segment must not mark that segment drained.
#[tokio::test]
async fn a_walk_that_runs_out_of_rows_drains_its_own_segment_and_not_the_next_one() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let first: Vec<i64> = storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let mut open = db.pool.begin().await.unwrap();
    let late = storage
        .insert_many(&mut open, &(3..5).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let shard = shards_of(&db, &first).await[0];
    assert_eq!(
        shards_of(&db, &first[..1]).await,
        [shard],
        "the committed segment"
    );
    let cursor = format!("SELECT {{s}}.lane_cursor({shard})");

    // cut by its size inside the first segment: the cursor stays on the row it reached
    assert_eq!(claim_ids(&storage, 2).await, first[..2].to_vec());
    assert_eq!(db.scalar_i64(&cursor).await & 1_048_575, 1);
    // runs out of rows: the first segment is drained, the open one is not touched
    assert_eq!(claim_ids(&storage, 10).await, first[2..].to_vec());
    let drained = db.scalar_i64(&cursor).await;
    assert_eq!(drained & 1_048_575, 1_048_575, "the segment's end");
    assert!(claim_ids(&storage, 10).await.is_empty());
    assert_eq!(db.scalar_i64(&cursor).await, drained);

    open.commit().await.unwrap();
    assert_eq!(
        shards_of(&db, &late).await,
        [shard, shard],
        "the late segment is the same shard's next one"
    );
    assert_eq!(claim_ids(&storage, 10).await, late);
    assert_eq!(
        db.scalar_i64(&cursor).await >> 20,
        (drained >> 20) + 1,
        "the late segment drained in turn"
    );
    assert_eq!(available(&storage).await, 0);
    db.cleanup().await;
}

#[tokio::test]
async fn more_open_transactions_than_shards_each_get_a_shard_and_never_block_others() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("default").await.unwrap();
    let base: i64 = db
        .scalar_i64("SELECT count(*) FROM {s}.queue_lanes WHERE priority = 2")
        .await;
    // more open producer transactions than base shards, on connections of their own
    let held_count = base as usize + 4;
    let pool = TestDb::connect(&db.url, held_count as u32 + 2).await;
    let mut held = Vec::new();
    let mut held_ids = Vec::new();
    for n in 0..held_count {
        let mut tx = pool.begin().await.unwrap();
        held_ids.push(storage.insert(&mut tx, &job(n as i64)).await.unwrap());
        held.push(tx);
    }
    let shards: i64 = db
        .scalar_i64("SELECT count(*) FROM {s}.queue_lanes WHERE priority = 2")
        .await;
    assert_eq!(
        shards, base,
        "extra shards are not visible before their creators commit"
    );

    // producers that commit are never held back, in any number
    let mut flowing = Vec::new();
    for round in 0..20 {
        let mut conn = db.pool.acquire().await.unwrap();
        flowing.extend(
            storage
                .insert_many(
                    &mut conn,
                    &(0..5)
                        .map(|i| job(1000 + round * 5 + i))
                        .collect::<Vec<_>>(),
                )
                .await
                .unwrap(),
        );
        let got = claim_ids(&storage, 100).await;
        assert_eq!(
            got.len(),
            5,
            "round {round}: the committed jobs are claimed at once"
        );
    }
    assert_eq!(available(&storage).await, 0);

    // half commit, half roll back: exactly the committed ones come through, once
    let mut committed = HashSet::new();
    for (n, tx) in held.into_iter().enumerate() {
        if n % 2 == 0 {
            tx.commit().await.unwrap();
            committed.insert(held_ids[n]);
        } else {
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(available(&storage).await, committed.len() as i64);
    let got: HashSet<i64> = claim_ids(&storage, 100).await.into_iter().collect();
    assert_eq!(got, committed);
    assert!(claim_ids(&storage, 100).await.is_empty());
    assert!(
        db.scalar_i64("SELECT count(*) FROM {s}.queue_lanes WHERE priority = 2")
            .await
            > base,
        "the committed creators' extra shards exist now"
    );
    pool.close().await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_claimer_holding_one_shard_does_not_stop_another_from_claiming_the_rest() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // four producers at once: four shards with work
    let mut txs = Vec::new();
    let mut all = HashSet::new();
    for p in 0..4 {
        let mut tx = db.pool.begin().await.unwrap();
        all.extend(
            storage
                .insert_many(
                    &mut tx,
                    &(0..50).map(|i| job(p * 100 + i)).collect::<Vec<_>>(),
                )
                .await
                .unwrap(),
        );
        txs.push(tx);
    }
    for tx in txs {
        tx.commit().await.unwrap();
    }
    // claimer 1 stays inside its claim transaction, holding the shard it took
    let mut first = db.pool.begin().await.unwrap();
    let held: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT job_id FROM {}.claim('default', 50)",
        db.schema
    ))
    .fetch_all(&mut *first)
    .await
    .unwrap();
    assert_eq!(held.len(), 50);
    // claimer 2 is not blocked and takes other shards' jobs
    let started = std::time::Instant::now();
    let second = claim_ids(&storage, 200).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(second.len(), 150, "the other three shards");
    assert!(second.iter().all(|id| !held.contains(id)), "no job twice");
    // claimer 1 rolls back: its jobs are claimable again, exactly once
    first.rollback().await.unwrap();
    let again = claim_ids(&storage, 200).await;
    let mut sorted_again = again.clone();
    sorted_again.sort();
    let mut sorted_held = held.clone();
    sorted_held.sort();
    assert_eq!(sorted_again, sorted_held);
    let union: HashSet<i64> = second.iter().chain(&again).copied().collect();
    assert_eq!(union, all);
    db.cleanup().await;
}

#[tokio::test]
async fn parallel_claimers_over_many_shards_take_every_job_exactly_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // producers writing at once spread over shards
    let mut expected = HashSet::new();
    let mut producers = Vec::new();
    for p in 0..6 {
        let pool = db.pool.clone();
        let storage = db.storage();
        producers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for round in 0..10 {
                let mut tx = pool.begin().await.unwrap();
                ids.extend(
                    storage
                        .insert_many(
                            &mut tx,
                            &(0..20)
                                .map(|i| job(p * 10_000 + round * 100 + i))
                                .collect::<Vec<_>>(),
                        )
                        .await
                        .unwrap(),
                );
                tx.commit().await.unwrap();
            }
            ids
        }));
    }
    for p in producers {
        expected.extend(p.await.unwrap());
    }
    let shards_used = db
        .scalar_i64("SELECT count(DISTINCT lane_id) FROM {s}.ready_entries")
        .await;
    assert!(shards_used > 1, "concurrent producers spread over shards");
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let storage = db.storage();
        claimers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut empty = 0;
            while empty < 3 {
                let batch = storage.claim("default", 7, None).await.unwrap();
                if batch.is_empty() {
                    empty += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                got.extend(batch.iter().map(|j| j.attempt_ref()));
            }
            got
        }));
    }
    let mut seen = HashSet::new();
    let mut attempts = Vec::new();
    for c in claimers {
        for a in c.await.unwrap() {
            assert!(seen.insert(a.job_id), "job {} claimed twice", a.job_id);
            attempts.push(a);
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(
        storage.count_in_flight(Some("default")).await.unwrap(),
        expected.len() as i64
    );
    // complete them all: the queue's counts are exact across shards
    for chunk in attempts.chunks(100) {
        storage.complete_batch(chunk).await.unwrap();
    }
    let counts = storage.queue_counts(Some("default")).await.unwrap();
    assert_eq!(
        (counts[0].available, counts[0].running, counts[0].completed),
        (0, 0, expected.len() as i64)
    );
    db.cleanup().await;
}

#[tokio::test]
async fn cancel_reaches_an_available_job_in_any_shard_and_prune_frees_every_shard_slot() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut txs = Vec::new();
    let mut ids = Vec::new();
    for p in 0..3 {
        let mut tx = db.pool.begin().await.unwrap();
        ids.push(
            storage
                .insert_many(
                    &mut tx,
                    &(0..10).map(|i| job(p * 10 + i)).collect::<Vec<_>>(),
                )
                .await
                .unwrap(),
        );
        txs.push(tx);
    }
    for tx in txs {
        tx.commit().await.unwrap();
    }
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT lane_id) FROM {s}.ready_entries")
            .await,
        3
    );
    // one job of each shard cancelled while available
    for shard_ids in &ids {
        assert_eq!(
            storage.cancel_job(shard_ids[3], "test").await.unwrap(),
            ringwork::CancelOutcome::Cancelled
        );
    }
    assert_eq!(available(&storage).await, 27);
    // claim and complete everything; the cancelled ones never come back
    let claimed = claim_all(&storage, 8).await;
    assert_eq!(claimed.len(), 27);
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    // the slot that holds all three shards' rows is proven dead and truncated
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
    let sealed = storage.sealed_queue_slots().await.unwrap();
    assert_eq!(sealed.len(), 1);
    let pruned = storage
        .prune_queue_slot(sealed[0], Duration::from_millis(25), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(pruned, ringwork::PruneResult::Pruned);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    // the cursors survived the truncate: nothing is claimable again
    assert!(claim_ids(&storage, 100).await.is_empty());
    assert_eq!(available(&storage).await, 0);
    db.cleanup().await;
}

/// A queue has shards only at the priorities its jobs use: every claim reads each shard's segment
/// sequence, and a queue created with all four priorities' shards made a claim read 32 of them when
/// 8 were ever written. A new priority's shards are made outside the producer's transaction, so
/// they stay when it rolls back and no other producer waits for its commit.
#[tokio::test]
async fn a_queue_has_shards_only_at_the_priorities_its_jobs_use() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let lanes = "SELECT count(*) FROM {s}.queue_lanes WHERE queue = 'default'";
    storage.ensure_queue("default").await.unwrap();
    assert_eq!(
        db.scalar_i64(lanes).await,
        8,
        "the default priority's shards"
    );
    let mut conn = db.pool.acquire().await.unwrap();
    let first = storage.insert(&mut conn, &job(1)).await.unwrap();
    assert_eq!(db.scalar_i64(lanes).await, 8);

    let mut open = db.pool.begin().await.unwrap();
    storage
        .insert(&mut open, &job(2).priority(4))
        .await
        .unwrap();
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.queue_lanes WHERE queue = 'default' AND priority = 4"
        )
        .await,
        8,
        "the new priority's shards are committed before the producer's transaction ends"
    );
    // another process's producer of the new priority does not wait for the open transaction
    let other = insert_on_a_new_connection(&db, job(3).priority(4)).await;
    open.rollback().await.unwrap();
    assert_eq!(db.scalar_i64(lanes).await, 16, "priorities 2 and 4");

    // the claim reads the sequences of the 16 shards, not 32
    let mut tx = db.pool.begin().await.unwrap();
    let claimed: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT job_id FROM {}.claim('default', 10)",
        db.schema
    ))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let sequences: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks k JOIN pg_class c ON c.oid = k.relation \
         WHERE k.pid = pg_backend_pid() AND c.relkind = 'S' AND c.relname LIKE 'lane\\_%\\_segment'",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(claimed, [first, other]);
    assert_eq!(sequences, 16, "segment sequences a claim read");
    db.cleanup().await;
}

#[tokio::test]
async fn a_lane_from_before_shards_keeps_its_jobs_and_gains_its_base_shards() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // Before migration 0002 a lane was one queue_lanes row, now shard 0. Recreate that shape: a
    // queue whose priority-2 lane has shard 0 only, with jobs in it.
    storage.ensure_queue("default").await.unwrap();
    db.exec("DELETE FROM {s}.queue_lanes WHERE shard <> 0")
        .await;
    let mut conn = db.pool.acquire().await.unwrap();
    let old = storage
        .insert_many(&mut conn, &(0..5).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT lane_id) FROM {s}.ready_entries")
            .await,
        1
    );
    // a process of the new binary ensures the queue: the missing base shards appear, the old
    // shard keeps its jobs and its cursor
    let fresh = ringwork::Storage::new(db.pool.clone(), db.schema.clone());
    fresh.ensure_queue("default").await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.queue_lanes WHERE queue = 'default'")
            .await,
        8
    );
    assert_eq!(claim_ids(&fresh, 3).await, old[..3].to_vec());
    let new = fresh
        .insert_many(&mut conn, &(5..10).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    let rest = claim_all_ids(&fresh, 4).await;
    let expected: Vec<i64> = old[3..].iter().chain(&new).copied().collect();
    assert_eq!(rest, expected, "the old jobs first, then the new ones");
    db.cleanup().await;
}

/// The backlog check races the claims of its shard. While a claimer holds the shard it says yes
/// (the claimer may leave work); with a job left past the cursor, yes; once a claim drained the
/// shard, no, although the cursor sequence still lags the ledger by that claim: the check reads
/// the cursor from the ledger under the shard's lock and catches the sequence up, so that the
/// other processes' checks answer from the sequences alone instead of claiming again for nothing.
#[tokio::test]
async fn the_backlog_check_reads_a_drained_shard_from_the_ledger_and_catches_its_sequence_up() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = storage
        .insert_many(&mut conn, &[job(1), job(2)])
        .await
        .unwrap();
    let (first, taken) = support::claim_in_open_transaction(&db, "default", 1).await;
    assert_eq!(taken, [ids[0]]);
    assert!(
        storage.queue_has_backlog("default").await.unwrap(),
        "a claimer holds the shard"
    );
    first.commit().await.unwrap();
    assert!(
        storage.queue_has_backlog("default").await.unwrap(),
        "one job past the cursor"
    );
    assert_eq!(claim_ids(&storage, 10).await, [ids[1]]);

    let cursors = format!(
        "SELECT coalesce(pg_sequence_last_value(l.cursor_seq), 0), {s}.lane_cursor(l.lane_id) \
         FROM {s}.queue_lanes l WHERE l.lane_id = (SELECT e.lane_id FROM {s}.ready_entries e WHERE e.job_id = $1)",
        s = db.schema
    );
    let (sequence, ledger): (i64, i64) = sqlx::query_as(&cursors)
        .bind(ids[1])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        sequence < ledger,
        "the sequence lags the last claim: {sequence} < {ledger}"
    );
    assert!(
        !storage.queue_has_backlog("default").await.unwrap(),
        "drained, by the ledger"
    );
    let (sequence, after): (i64, i64) = sqlx::query_as(&cursors)
        .bind(ids[1])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (sequence, after),
        (ledger, ledger),
        "the sequence caught up"
    );

    let next = storage.insert(&mut conn, &job(3)).await.unwrap();
    assert!(storage.queue_has_backlog("default").await.unwrap());
    assert_eq!(claim_ids(&storage, 10).await, [next]);
    db.cleanup().await;
}

#[tokio::test]
async fn a_paused_queue_reports_no_backlog_and_resume_wakes_its_dispatchers() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert(&mut conn, &job(1)).await.unwrap();
    assert!(storage.queue_has_backlog("default").await.unwrap());
    assert!(storage.set_queue_paused("default", true).await.unwrap());
    // nothing to claim: a dispatcher waits for the poll or a NOTIFY instead of retrying every few ms
    assert!(storage.claim("default", 10, None).await.unwrap().is_empty());
    assert!(!storage.queue_has_backlog("default").await.unwrap());
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener
        .listen(&format!("ringwork_{}", db.schema))
        .await
        .unwrap();
    assert!(storage.set_queue_paused("default", false).await.unwrap());
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("resume sends a NOTIFY")
        .unwrap();
    assert_eq!(note.payload(), "default");
    assert!(storage.queue_has_backlog("default").await.unwrap());
    assert_eq!(claim_ids(&storage, 10).await.len(), 1);
    db.cleanup().await;
}

/// A claim finds the slots of its lane's segments before it walks the lane's rows in those slots
/// only. The race it must not lose: the lane's next segment commits into a newer slot between the
/// two. The walk does not see it, so it must not step over it either; the next claim takes it.
/// Driven from both sides: a session holding the claim ledger stops the claim after it found the
/// slots, and the producer commits meanwhile.
#[tokio::test]
async fn a_segment_that_commits_into_a_new_slot_while_a_claim_walks_is_claimed_next_and_not_skipped(
) {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let first: Vec<i64> = storage
        .insert_many(&mut conn, &(0..3).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    drop(conn);
    let lane = shards_of(&db, &first).await[0];
    assert_eq!(claim_ids(&storage, 1).await, first[..1].to_vec());
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());

    let mut ledger = db.pool.begin().await.unwrap();
    sqlx::raw_sql(&format!(
        "LOCK TABLE {}.ready_claim_attempt_batches IN ACCESS EXCLUSIVE MODE",
        db.schema
    ))
    .execute(&mut *ledger)
    .await
    .unwrap();
    let claimer = {
        let storage = storage.clone();
        tokio::spawn(async move {
            let jobs = storage.claim("default", 10, None).await.unwrap();
            jobs.into_iter().map(|j| j.job_id).collect::<Vec<_>>()
        })
    };
    assert!(support::one_waits_for_a_lock(&db).await);

    // the lane's next segment, written into the new current slot: every other shard is held
    let holder = support::hold_every_shard_but(&db, "default", lane).await;
    let late = insert_on_a_new_connection(&db, job(3)).await;
    holder.close().await.unwrap();
    assert_eq!(shards_of(&db, &[late]).await, [lane]);
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT ready_slot) FROM {s}.ready_entries")
            .await,
        2
    );

    ledger.rollback().await.unwrap();
    // the claim walked the slot it had found: the first segment's rest, not the late one
    assert_eq!(claimer.await.unwrap(), first[1..].to_vec());
    assert_eq!(claim_ids(&storage, 10).await, vec![late]);
    assert!(claim_ids(&storage, 10).await.is_empty());
    assert_eq!(available(&storage).await, 0);
    db.cleanup().await;
}
