//! Enqueue: a job exists only if the producer's transaction commits, including an insert
//! inside a transaction the producer opened with a raw `BEGIN`.

mod support;

use ringwork::NewJob;
use support::{job, TestDb};

#[tokio::test]
async fn transactional_enqueue_commit_makes_visible_rollback_leaves_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();

    let mut tx = db.pool.begin().await.unwrap();
    storage.insert(&mut tx, &job(1)).await.unwrap();
    storage
        .insert_many(&mut tx, &(0..100).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    assert!(storage.claim("default", 10, None).await.unwrap().is_empty());

    let mut tx = db.pool.begin().await.unwrap();
    let id = storage.insert(&mut tx, &job(2)).await.unwrap();
    tx.commit().await.unwrap();
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job_id, id);
    assert_eq!(claimed[0].run_lease, 1);
    db.cleanup().await;
}

#[tokio::test]
async fn an_insert_inside_a_raw_begin_transaction_does_not_commit_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("default").await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    // a transaction sqlx does not know about
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    storage.insert(&mut conn, &job(1)).await.unwrap();
    // several statements: a COPY group, a small group of another priority, a scheduled job
    let mut jobs: Vec<NewJob> = (0..100).map(job).collect();
    jobs.push(job(200).priority(1));
    jobs.push(job(201).run_at(chrono::Utc::now() + chrono::Duration::hours(1)));
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    let inside = db
        .scalar_i64("SELECT count(*) FROM {s}.ready_entries")
        .await;
    assert_eq!(inside, 0, "nothing is visible outside the open transaction");
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0,
        "the caller's rollback undid every insert"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    // the same on a plain connection commits
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        101
    );
    db.cleanup().await;
}
