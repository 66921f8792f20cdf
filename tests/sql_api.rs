//! The stable SQL API for producers in other languages (issue 15, item 7): `<schema>.enqueue(...)`
//! from a plain SQL session, in the caller's transaction, at once or scheduled, validated like the
//! Rust client validates; a Rust worker runs what SQL enqueued.

mod support;

use std::time::Duration;

use ringwork::{JobArgs, JobContext, JobError, JobStatus, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, TestDb};

#[derive(Serialize, Deserialize)]
struct FromSql {
    n: i64,
}

impl JobArgs for FromSql {
    const KIND: &'static str = "from_sql";
}

#[tokio::test]
async fn jobs_enqueued_from_sql_run_in_a_rust_worker_and_bad_input_is_refused_clearly() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    // enqueued as another language would, before any Rust client touched the queue
    let now: i64 = sqlx::query_scalar(&format!(
        "SELECT {s}.enqueue('sql_q', 'from_sql', '{{\"n\": 1}}')"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let later: i64 = sqlx::query_scalar(&format!(
        "SELECT {s}.enqueue('sql_q', 'from_sql', '{{\"n\": 2}}', p_priority => 1, p_max_attempts => 3,
                            p_run_at => now() + interval '1 second')"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // in a transaction that rolls back: never exists
    let mut tx = db.pool.begin().await.unwrap();
    let rolled_back: i64 = sqlx::query_scalar(&format!(
        "SELECT {s}.enqueue('sql_q', 'from_sql', '{{\"n\": 3}}')"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();

    let storage = db.storage();
    assert_eq!(
        storage.job_state(later).await.unwrap().unwrap().state,
        JobStatus::Scheduled
    );
    assert!(storage.job_state(rolled_back).await.unwrap().is_none());

    let client = db
        .client()
        .queue("sql_q", QueueConfig::default())
        .register(|_ctx: JobContext, job: FromSql| async move {
            assert!(job.n == 1 || job.n == 2, "the rolled-back job never runs");
            Ok::<(), JobError>(())
        })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            let a = storage.job_state(now).await.unwrap().map(|s| s.state);
            let b = storage.job_state(later).await.unwrap().map(|s| s.state);
            a == Some(JobStatus::Completed) && b == Some(JobStatus::Completed)
        })
        .await,
        "both SQL-enqueued jobs ran"
    );
    running.shutdown(Duration::from_secs(5)).await;

    for (call, expected) in [
        (
            "'sql_q', 'k', '{}', p_priority => 9",
            "priority must be 1..4",
        ),
        (
            "'sql_q', 'k', '{}', p_max_attempts => 0",
            "max_attempts must be",
        ),
        ("E'bad\\nqueue', 'k', '{}'", "invalid queue name"),
        ("'sql_q', '', '{}'", "invalid job kind"),
        ("'sql_q', 'k', NULL", "must not be NULL"),
    ] {
        let error = sqlx::query(&format!("SELECT {s}.enqueue({call})"))
            .execute(&db.pool)
            .await
            .expect_err(call)
            .to_string();
        assert!(error.contains(expected), "{call}: {error}");
    }
    db.cleanup().await;
}
