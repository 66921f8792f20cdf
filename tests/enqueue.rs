//! Enqueue: a job exists only if the producer's transaction commits, including an insert
//! inside a transaction the producer opened with a raw `BEGIN`; a job kind's declared defaults
//! (queue, priority, attempts, timeout) put its jobs where its handler works.

mod support;

use std::time::Duration;

use ringwork::{Error, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, job, state, TestDb};

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

/// The server's count of transactions rolled back in this test's database, with this
/// connection's own counts flushed to it first.
async fn rolled_back(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A bulk insert outside a transaction (several statements: a COPY group and a scheduled job)
/// finds out that it must open its own without a statement that fails on the server: a failed
/// one writes an ERROR to the server's log at every such insert, and counts as a rollback.
#[tokio::test]
async fn a_bulk_insert_outside_a_transaction_makes_the_server_refuse_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("default").await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let mut jobs: Vec<NewJob> = (0..100).map(job).collect();
    jobs.push(job(201).run_at(chrono::Utc::now() + chrono::Duration::hours(1)));
    let before = rolled_back(&mut conn).await;
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    assert_eq!(rolled_back(&mut conn).await, before, "a statement failed");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        100
    );
    db.cleanup().await;
}

/// A kind that declares where its jobs go and how they run.
#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
    const QUEUE: &'static str = "mail";
    const PRIORITY: i16 = 1;
    const MAX_ATTEMPTS: i32 = 3;
    const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));
}

/// A kind whose declared queue no insert accepts.
#[derive(Serialize, Deserialize)]
struct Misdeclared {}

impl JobArgs for Misdeclared {
    const KIND: &'static str = "misdeclared";
    const QUEUE: &'static str = "mail\u{200B}";
}

fn email() -> SendEmail {
    SendEmail {
        to: "a@example.com".into(),
    }
}

#[tokio::test]
async fn a_kinds_declared_defaults_place_its_jobs_and_the_producer_still_overrides_them() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let declared = storage
        .insert(&mut conn, &NewJob::new(&email()).unwrap())
        .await
        .unwrap();
    let overridden = storage
        .insert(
            &mut conn,
            &NewJob::new(&email())
                .unwrap()
                .queue("default")
                .priority(3)
                .max_attempts(7),
        )
        .await
        .unwrap();
    // nothing of the kind in the default queue but the overridden one
    let in_default = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        in_default.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [overridden]
    );
    assert_eq!(
        (in_default[0].priority, in_default[0].max_attempts),
        (3, 7),
        "the producer's values win"
    );
    let in_mail = storage.claim("mail", 10, None).await.unwrap();
    assert_eq!(in_mail.len(), 1);
    let mail = &in_mail[0];
    assert_eq!(mail.job_id, declared);
    assert_eq!(
        (mail.priority, mail.max_attempts),
        (1, 3),
        "the kind's values"
    );
    let deadline = mail
        .deadline_at
        .expect("the kind's timeout gives a deadline");
    let limit = deadline - chrono::Utc::now();
    assert!(
        limit > chrono::Duration::seconds(20) && limit <= chrono::Duration::seconds(30),
        "deadline {limit} from now, for a 30 s timeout"
    );
    // a default no insert accepts is refused like a value the producer set
    let refused = storage
        .insert(&mut conn, &NewJob::new(&Misdeclared {}).unwrap())
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidName { .. })),
        "{refused:?}"
    );
    db.cleanup().await;
}

/// The trap the defaults close: a handler registered on its kind's queue runs a job whose producer
/// named no queue.
#[tokio::test]
async fn a_job_inserted_without_a_queue_runs_on_the_queue_its_kind_declares() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .maintenance(support::no_maintenance())
        .queue("mail", QueueConfig::default())
        .register(|_ctx: JobContext, _job: SendEmail| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let id = client.insert(NewJob::new(&email()).unwrap()).await.unwrap();
    let running = client.start().await.unwrap();
    let done = eventually(Duration::from_secs(20), || async {
        state(&db, id).await == "completed"
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(done, "the job ran: {}", state(&db, id).await);
    db.cleanup().await;
}
