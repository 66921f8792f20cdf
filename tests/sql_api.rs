//! The stable SQL API for producers in other languages: `<schema>.enqueue(...)`
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

/// `enqueue_unique` builds the Rust client's unique key: a SQL producer and a Rust producer
/// deduplicate against each other, whatever the key order and spacing of the JSON text, with
/// nested objects, escapes and non-ASCII text; by queue and by period too.
#[tokio::test]
async fn unique_jobs_from_sql_and_from_rust_share_one_key() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    let client = db.client().build().await.unwrap();
    let args = serde_json::json!({
        "zeta": [1, 2.5, "tab\there", {"b": null, "a": true}],
        "alpha": {"nested": "quote \" and \\ backslash", "émoji": "日本 🎉"},
        "big": 9007199254740993_i64,
        "ctrl": "\u{1f}unit",
    });
    // the same args, written another way: other key order, other spacing
    let sql_text = r#"{"ctrl": "\u001funit", "big": 9007199254740993,
        "alpha": {"émoji": "日本 🎉", "nested": "quote \" and \\ backslash"},
        "zeta": [1, 2.5, "tab\there", {"a": true, "b": null}]}"#;
    let enqueue_unique = |extra: &'static str| {
        format!(
            "SELECT job_id, inserted FROM {s}.enqueue_unique('u_q', 'shared', $1::jsonb{extra})"
        )
    };
    let (first, inserted): (i64, bool) = sqlx::query_as(&enqueue_unique(""))
        .bind(sql_text)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(inserted);
    let (again, inserted): (i64, bool) = sqlx::query_as(&enqueue_unique(""))
        .bind(sql_text)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((again, inserted), (first, false), "a duplicate from SQL");
    // the Rust client, same kind and args, default Unique: a duplicate of the SQL job
    let job = ringwork::NewJob::from_parts("shared", args.clone())
        .unwrap()
        .queue("other_q")
        .unique(ringwork::Unique::default());
    let from_rust = client.insert_many_reporting(&[job]).await.unwrap()[0];
    assert_eq!((from_rust.job_id, from_rust.duplicate), (first, true));

    // by queue and by period: Rust first, then SQL with the same options
    let keyed = ringwork::NewJob::from_parts("shared", args.clone())
        .unwrap()
        .queue("u_q")
        .unique(
            ringwork::Unique::default()
                .by_queue()
                .by_period(Duration::from_secs(3600)),
        );
    let rust_first = client.insert_many_reporting(&[keyed]).await.unwrap()[0];
    assert!(!rust_first.duplicate);
    let (sql_dup, inserted): (i64, bool) = sqlx::query_as(&enqueue_unique(
        ", p_by_queue => true, p_period => interval '1 hour'",
    ))
    .bind(sql_text)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((sql_dup, inserted), (rust_first.job_id, false));
    // another queue with by_queue: a different key
    let (other, inserted): (i64, bool) = sqlx::query_as(&format!(
        "SELECT job_id, inserted FROM {s}.enqueue_unique('u_other', 'shared', $1::jsonb, p_by_queue => true)"
    ))
    .bind(sql_text)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(inserted && other != first);

    // refused clearly
    for (call, word) in [
        (
            format!(
                "SELECT {s}.enqueue_unique('u_q', 'shared', '{{}}', p_states => ARRAY['bogus'])"
            ),
            "unique states",
        ),
        (
            format!(
                "SELECT {s}.enqueue_unique('u_q', 'shared', '{{}}', p_period => interval '10 ms')"
            ),
            "period",
        ),
        (
            format!("SELECT {s}.enqueue_unique('', 'shared')"),
            "queue name",
        ),
    ] {
        let err = sqlx::query(&call).execute(&db.pool).await.unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(word), "{call}: {msg}");
    }
    db.cleanup().await;
}
