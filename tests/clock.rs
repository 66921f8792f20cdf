//! The engine clock (`sql/functions/clock.sql`): the server's time plus an offset that only a test
//! clock writes. Production has no offset; the offset only moves forward; the planes that read the
//! clock see the moved time.

mod support;

use std::time::Duration;

use ringwork::NewJob;
use serde_json::json;
use support::{enqueue, job, state, TestDb};

#[tokio::test]
async fn the_engine_clock_is_the_servers_until_a_test_moves_it_forward_and_never_back() {
    let db = TestDb::new().await;
    let offset_ms = "SELECT (extract(epoch FROM {s}.clock_offset()) * 1000)::int8";
    assert_eq!(
        db.scalar_i64(offset_ms).await,
        0,
        "no offset without a test clock"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.clock_offset").await,
        0,
        "and no row"
    );
    db.advance_clock(Duration::from_millis(1500)).await;
    db.advance_clock(Duration::from_secs(60)).await;
    assert_eq!(db.scalar_i64(offset_ms).await, 61_500, "advances add up");
    let ahead = "SELECT (extract(epoch FROM {s}.engine_now() - now()) * 1000)::int8";
    assert_eq!(db.scalar_i64(ahead).await, 61_500);
    let back = sqlx::query(&format!(
        "SELECT {}.advance_clock(interval '-1 second')",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .expect_err("the clock does not move back");
    assert!(back.to_string().contains("only moves forward"), "{back}");
    assert_eq!(db.scalar_i64(offset_ms).await, 61_500, "unchanged");
    db.cleanup().await;
}

#[tokio::test]
async fn a_claim_is_stale_and_a_scheduled_job_due_once_the_clock_passes_them() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    storage
        .insert_many(
            &mut conn,
            &[
                NewJob::from_parts("now", json!({})).unwrap(),
                NewJob::from_parts("later", json!({}))
                    .unwrap()
                    .run_at(later),
            ],
        )
        .await
        .unwrap();
    drop(conn);
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let stale_after = Duration::from_secs(600);
    assert_eq!(storage.rescue(stale_after, 100).await.unwrap(), 0);
    assert_eq!(storage.promote_due(100).await.unwrap(), 0);
    db.advance_clock(Duration::from_secs(2 * 3600)).await;
    assert_eq!(
        storage.rescue(stale_after, 100).await.unwrap(),
        1,
        "ten minutes without a heartbeat, on the engine clock"
    );
    assert_eq!(
        storage.promote_due(100).await.unwrap(),
        1,
        "the job scheduled an hour ahead is due two hours on"
    );
    db.cleanup().await;
}

/// The current slots were opened when the test database's template was made: write both (job 1,
/// claimed) and rotate them on to slots opened now, which nothing has written.
async fn move_to_fresh_slots(db: &TestDb) {
    let storage = db.storage();
    enqueue(db, vec![job(1)]).await;
    assert_eq!(storage.claim("default", 1, None).await.unwrap().len(), 1);
    assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
    assert!(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
}

/// A ring slot's age is on the engine clock, and so is the time a rotation records: a slot
/// opened an hour ago on the clock rotates, one opened after the clock moved does not. A job whose
/// `run_at` the clock has passed is enqueued ready, not scheduled.
#[tokio::test]
async fn rotation_ages_and_an_enqueues_run_at_follow_the_clock() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let hour = Duration::from_secs(3600);
    // both current slots hold a claim, so both may rotate once old enough
    move_to_fresh_slots(&db).await;
    enqueue(&db, vec![job(2), job(3)]).await;
    let first = storage.claim("default", 1, None).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(!storage.rotate_queue_ring(hour).await.unwrap(), "young");
    assert!(!storage.rotate_claim_ring(hour).await.unwrap(), "young");
    db.advance_clock(hour + Duration::from_secs(1)).await;
    assert!(
        storage.rotate_queue_ring(hour).await.unwrap(),
        "an hour old on the clock"
    );
    assert!(
        storage.rotate_claim_ring(hour).await.unwrap(),
        "an hour old on the clock"
    );
    // the new slots were opened at the moved time, so, in use, they are young again, and an hour
    // on the clock makes them old
    enqueue(&db, vec![job(4)]).await;
    let second = storage.claim("default", 2, None).await.unwrap();
    assert_eq!(second.len(), 2);
    assert!(
        !storage.rotate_queue_ring(hour).await.unwrap(),
        "opened on the clock"
    );
    assert!(
        !storage.rotate_claim_ring(hour).await.unwrap(),
        "opened on the clock"
    );
    db.advance_clock(hour + Duration::from_secs(1)).await;
    assert!(storage.rotate_queue_ring(hour).await.unwrap(), "an hour on");
    assert!(storage.rotate_claim_ring(hour).await.unwrap(), "an hour on");
    // half an hour ahead of the server's time is already past on the clock
    let run_at = chrono::Utc::now() + chrono::Duration::minutes(30);
    let id: i64 = sqlx::query_scalar(&format!(
        "SELECT {}.enqueue('default', 'later', '{{}}', p_run_at => $1)",
        db.schema
    ))
    .bind(run_at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        state(&db, id).await,
        "available",
        "ready at once, not scheduled"
    );
    db.cleanup().await;
}

/// `rotation_due` (what the maintenance leader reads instead of trying three rotations) says zero
/// exactly when a rotation can move a ring, how long until then while a written slot is young,
/// and nothing while no ring's current slot was written.
#[tokio::test]
async fn rotation_due_agrees_with_the_rotations() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let hour = Duration::from_secs(3600);
    move_to_fresh_slots(&db).await;
    let idle = storage.rotation_due(hour).await.unwrap();
    assert_eq!(idle, None, "no current slot written");
    db.advance_clock(2 * hour).await;
    assert_eq!(
        storage.rotation_due(hour).await.unwrap(),
        None,
        "old, but unwritten"
    );
    assert!(!storage.rotate_queue_ring(hour).await.unwrap());
    assert!(!storage.rotate_claim_ring(hour).await.unwrap());
    // written: due an hour after the slot opened, which the clock has passed
    enqueue(&db, vec![job(2)]).await;
    assert_eq!(
        storage.rotation_due(hour).await.unwrap(),
        Some(Duration::ZERO)
    );
    assert!(storage.rotate_queue_ring(hour).await.unwrap());
    // the claim ring is unwritten and the queue ring's new slot too
    assert_eq!(storage.rotation_due(hour).await.unwrap(), None);
    // a claim writes the claim ring's old slot: due now; once rotated, the new slots are young
    assert_eq!(storage.claim("default", 1, None).await.unwrap().len(), 1);
    assert_eq!(
        storage.rotation_due(hour).await.unwrap(),
        Some(Duration::ZERO)
    );
    assert!(storage.rotate_claim_ring(hour).await.unwrap());
    enqueue(&db, vec![job(3)]).await;
    let due = storage
        .rotation_due(hour)
        .await
        .unwrap()
        .expect("a written slot");
    assert!(
        due > hour - Duration::from_secs(60) && due <= hour,
        "young: due in {due:?}"
    );
    assert!(!storage.rotate_queue_ring(hour).await.unwrap(), "young");
    db.advance_clock(hour).await;
    assert_eq!(
        storage.rotation_due(hour).await.unwrap(),
        Some(Duration::ZERO)
    );
    assert!(storage.rotate_queue_ring(hour).await.unwrap());
    db.cleanup().await;
}
