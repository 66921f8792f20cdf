//! One bad row never hurts its neighbours. What no worker could decode is refused at the door, by
//! the SQL API and by the Rust client alike, with an error naming the field and the limit; a row
//! stored before those checks (or written around them) fails alone at its claim, terminally, and
//! every job claimed beside it runs on its first attempt; readers show such rows instead of failing
//! on them; recorded errors and reasons are cut to the schema's bound, never refused.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ringwork::{Error, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, queue, TestDb};

#[derive(Serialize, Deserialize)]
struct Valid {
    n: i64,
}

impl JobArgs for Valid {
    const KIND: &'static str = "hostile_valid";
}

/// JSON text `depth` arrays deep.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

/// Store jobs with these JSON arguments in one call of the internal `enqueue_jobs`, past the SQL
/// API's checks, as a row written before them would be: one lane, one segment, so one claim takes
/// them together. Returns their ids in input order.
async fn store_around_the_checks(db: &TestDb, queue: &str, jobs: &[(&str, String)]) -> Vec<i64> {
    let s = db.schema.as_str();
    let kinds: Vec<&str> = jobs.iter().map(|(kind, _)| *kind).collect();
    let args: Vec<&str> = jobs.iter().map(|(_, args)| args.as_str()).collect();
    let n = jobs.len() as i32;
    sqlx::query_scalar(&format!(
        "SELECT * FROM {s}.enqueue_jobs($1, 2::smallint, $2, $3::text[]::jsonb[], array_fill(25, ARRAY[$4]),
                                        array_fill(NULL::int, ARRAY[$4]), array_fill(NULL::text, ARRAY[$4]))"
    ))
    .bind(queue)
    .bind(&kinds)
    .bind(&args)
    .bind(n)
    .fetch_all(&db.pool)
    .await
    .expect("enqueue_jobs")
}

/// Ten valid jobs with two poison rows among them (a number beyond f64, nesting past serde_json's
/// limit). Returns (valid ids, poison ids).
async fn poisoned_queue(db: &TestDb, queue: &str) -> (Vec<i64>, Vec<i64>) {
    let mut jobs: Vec<(&str, String)> = (0..10)
        .map(|n| (Valid::KIND, format!("{{\"n\": {n}}}")))
        .collect();
    jobs.insert(3, (Valid::KIND, r#"{"n": 1e400}"#.to_string()));
    jobs.insert(8, (Valid::KIND, format!("{{\"n\": {}}}", nested(200))));
    let ids = store_around_the_checks(db, queue, &jobs).await;
    let poison = vec![ids[3], ids[8]];
    let valid = ids.into_iter().filter(|id| !poison.contains(id)).collect();
    (valid, poison)
}

#[tokio::test]
async fn a_claim_fails_an_undecodable_job_alone_and_hands_out_every_neighbour() {
    let db = TestDb::new().await;
    let (valid, poison) = poisoned_queue(&db, "hostile_claim").await;
    let storage = db.storage();

    let claimed = storage.claim("hostile_claim", 100, None).await.unwrap();
    let mut claimed_ids: Vec<i64> = claimed.iter().map(|job| job.job_id).collect();
    claimed_ids.sort_unstable();
    assert_eq!(
        claimed_ids, valid,
        "every valid job is handed out by the claim"
    );
    for id in &poison {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!(state.state, JobStatus::Failed, "job {id}");
        assert_eq!(state.attempt, 1);
        let detail = state.detail.unwrap_or_default();
        assert!(
            detail.contains("arguments cannot be decoded"),
            "job {id}: {detail}"
        );
    }
    let attempts: Vec<_> = claimed.iter().map(|job| job.attempt_ref()).collect();
    let outcomes = storage.complete_batch(&attempts).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == ringwork::Outcome::Applied));
    for id in &valid {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!((state.state, state.attempt), (JobStatus::Completed, 1));
    }
    // nothing is left for a later claim or for rescue
    assert!(storage
        .claim("hostile_claim", 100, None)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        storage
            .count_in_flight(Some("hostile_claim"))
            .await
            .unwrap(),
        0
    );
    db.cleanup().await;
}

#[tokio::test]
async fn workers_run_every_valid_job_on_its_first_attempt_beside_poison_rows() {
    let db = TestDb::new().await;
    let (valid, poison) = poisoned_queue(&db, "hostile_run").await;
    let client = db
        .client()
        .queue(
            "hostile_run",
            QueueConfig {
                max_workers: 4,
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, _job: Valid| async move { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let storage = client.storage().clone();
    let running = client.start().await.unwrap();
    let all: Vec<i64> = valid.iter().chain(&poison).copied().collect();
    assert!(
        eventually(Duration::from_secs(20), || async {
            let mut finished = 0;
            for id in &all {
                let state = storage.job_state(*id).await.unwrap().unwrap().state;
                finished += usize::from(matches!(state, JobStatus::Completed | JobStatus::Failed));
            }
            finished == all.len()
        })
        .await,
        "every job reached a final state"
    );
    running.shutdown(Duration::from_secs(5)).await;
    for id in &valid {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!(
            (state.state, state.attempt),
            (JobStatus::Completed, 1),
            "valid job {id}"
        );
    }
    for id in &poison {
        let state = storage.job_state(*id).await.unwrap().unwrap();
        assert_eq!(
            (state.state, state.attempt),
            (JobStatus::Failed, 1),
            "poison job {id}"
        );
    }
    db.cleanup().await;
}

#[tokio::test]
async fn the_sql_api_refuses_what_no_worker_could_decode() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    let deep = nested(128);
    let calls: Vec<(String, &str)> = vec![
        (
            r#"'q', 'k', '{"n": 1e400}'"#.into(),
            "beyond the range of a 64-bit float",
        ),
        (
            r#"'q', 'k', '{"a": [{"n": -2e308}]}'"#.into(),
            "beyond the range of a 64-bit float",
        ),
        (format!("'q', 'k', '{deep}'"), "deeper than 127 levels"),
        (
            "'q', 'k', '{}', p_run_at => 'infinity'".into(),
            "run_at must be a finite time",
        ),
        (
            "'q', 'k', '{}', p_run_at => '-infinity'".into(),
            "run_at must be a finite time",
        ),
        (
            "'q', 'k', '{}', p_run_at => '20000-01-01'".into(),
            "before year 10000",
        ),
        (
            r"E'invoices\u202Etxt', 'k', '{}'".into(),
            "invalid queue name",
        ),
        (r"'q', E'mail\u200B', '{}'".into(), "invalid job kind"),
    ];
    for (call, expected) in &calls {
        for function in ["enqueue", "enqueue_unique"] {
            let error = sqlx::query(&format!("SELECT {s}.{function}({call})"))
                .execute(&db.pool)
                .await
                .expect_err(call)
                .to_string();
            assert!(error.contains(expected), "{function}({call}): {error}");
        }
    }
    // at the limits: accepted
    for call in [
        format!("'q', 'k', '{}'", nested(127)),
        r#"'q', 'k', '{"n": 1.7976931348623157e308, "m": -1e-400}'"#.to_string(),
        "'q', 'k', '{}', p_run_at => '9999-12-31 23:59:59+00'".to_string(),
        "'q', 'envoi-é-日本', '{}'".to_string(),
    ] {
        sqlx::query(&format!("SELECT {s}.enqueue({call})"))
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{call}: {e}"));
    }
    db.cleanup().await;
}

#[tokio::test]
async fn arguments_over_the_schemas_limit_are_refused_by_sql_and_by_the_client() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    let limit: i64 = sqlx::query_scalar(&format!("SELECT {s}.set_setting('max_args_bytes', 1024)"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(limit, 1024);
    let big = serde_json::json!({ "blob": "x".repeat(2000) });
    let error = sqlx::query(&format!("SELECT {s}.enqueue('q', 'k', $1)"))
        .bind(&big)
        .execute(&db.pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_args_bytes (1024)"), "{error}");
    let client = db.client().build().await.unwrap();
    let error = client
        .insert(NewJob::from_parts("k", big).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_args_bytes (1024)"), "{error}");
    let small = NewJob::from_parts("k", serde_json::json!({"blob": "x".repeat(900)})).unwrap();
    client.insert(small).await.unwrap();
    // unknown settings and values out of range are refused; NULL restores the default
    for call in ["'max_bogus', 10", "'max_args_bytes', 0"] {
        assert!(sqlx::query(&format!("SELECT {s}.set_setting({call})"))
            .execute(&db.pool)
            .await
            .is_err());
    }
    let default: i64 =
        sqlx::query_scalar(&format!("SELECT {s}.set_setting('max_args_bytes', NULL)"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(default, 1_048_576);
    db.cleanup().await;
}

#[tokio::test]
async fn errors_and_reasons_are_kept_cut_to_the_schemas_bound() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    let client = db
        .client()
        .queue("hostile_err", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Valid| async move {
            Err::<(), JobError>(JobError::terminal("e".repeat(100_000)))
        })
        .build()
        .await
        .unwrap();
    let storage = client.storage().clone();
    let failing = client
        .insert(NewJob::new(&Valid { n: 1 }).unwrap().queue("hostile_err"))
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(15), || async {
            storage.job_state(failing).await.unwrap().unwrap().state == JobStatus::Failed
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    let detail = storage
        .job_state(failing)
        .await
        .unwrap()
        .unwrap()
        .detail
        .unwrap();
    assert!(detail.starts_with("eeee"), "{}", &detail[..40]);
    assert!(
        detail.ends_with("[... 83616 more characters]"),
        "{}",
        &detail[detail.len() - 60..]
    );

    // a cancel reason from SQL, with the bound lowered
    sqlx::query(&format!("SELECT {s}.set_setting('max_error_chars', 100)"))
        .execute(&db.pool)
        .await
        .unwrap();
    let waiting: i64 = sqlx::query_scalar(&format!("SELECT {s}.enqueue('hostile_idle', 'k')"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let outcome: String = sqlx::query_scalar(&format!("SELECT {s}.cancel_job($1, $2)"))
        .bind(waiting)
        .bind("r".repeat(2_000_000))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(outcome, "cancelled");
    let reason = storage
        .job_state(waiting)
        .await
        .unwrap()
        .unwrap()
        .detail
        .unwrap();
    assert_eq!(
        reason,
        format!("{} [... 1999900 more characters]", "r".repeat(100))
    );
    db.cleanup().await;
}

#[tokio::test]
async fn readers_show_rows_this_binary_cannot_decode() {
    let db = TestDb::new().await;
    let s = db.schema.as_str();
    let storage = db.storage();
    // available poison rows (a paused queue keeps them there), a failed one, and a job scheduled
    // at infinity, all stored past the checks
    sqlx::query(&format!(
        "SELECT {s}.set_queue_paused('hostile_read', true)"
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let (_, poison) = poisoned_queue(&db, "hostile_read").await;
    let (_, failed) = poisoned_queue(&db, "hostile_failed").await;
    storage.claim("hostile_failed", 100, None).await.unwrap();
    let forever: i64 = sqlx::query_scalar(&format!(
        "SELECT * FROM {s}.schedule_jobs('hostile_read', 2::smallint, ARRAY['k'], ARRAY['{{}}'::jsonb],
                                         ARRAY[25], ARRAY['infinity'::timestamptz], ARRAY[NULL::int],
                                         ARRAY[NULL::text])"
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();

    for state in JobStatus::ALL {
        for queue in [None, Some("hostile_read"), Some("hostile_failed")] {
            storage
                .list_jobs(state, queue, None, None, 50)
                .await
                .unwrap_or_else(|e| panic!("{state} in {queue:?}: {e}"));
        }
    }
    let available = storage
        .list_jobs(JobStatus::Available, Some("hostile_read"), None, None, 50)
        .await
        .unwrap();
    let shown = available
        .jobs
        .iter()
        .find(|job| job.job_id == poison[1])
        .expect("the deep poison row is listed");
    assert!(
        shown.args.ends_with('…') && shown.args.chars().count() == 201,
        "{}",
        shown.args
    );
    let scheduled = storage
        .list_jobs(JobStatus::Scheduled, Some("hostile_read"), None, None, 50)
        .await
        .unwrap();
    assert_eq!(scheduled.jobs.len(), 1);
    assert_eq!(scheduled.jobs[0].at.format("%Y").to_string(), "9999");
    let record = storage.load_job(forever).await.unwrap().unwrap();
    assert_eq!(record.state.state, JobStatus::Scheduled);
    let args = storage.job_args(poison[0], 1000).await.unwrap().unwrap();
    assert!(args.text.starts_with("{\"n\": 1000000"), "{}", args.text);
    assert_eq!(args.bytes, 408, "1e400 is stored as its 401 digits");
    assert!(!args.is_cut());
    let cut = storage.job_args(poison[1], 50).await.unwrap().unwrap();
    assert!(cut.is_cut() && cut.text.chars().count() == 50);
    // failed at their claim into a dead-letter queue: listed there like any dead letter
    storage
        .set_queue_dead_letter("hostile_dlq", true)
        .await
        .unwrap();
    let (_, dead) = poisoned_queue(&db, "hostile_dlq").await;
    storage.claim("hostile_dlq", 100, None).await.unwrap();
    let letters = storage.dlq_list(Some("hostile_dlq"), 100).await.unwrap();
    let mut listed: Vec<i64> = letters.iter().map(|d| d.job_id).collect();
    listed.sort_unstable();
    assert_eq!(listed, dead);
    for id in poison.iter().chain(&failed).chain([&forever]) {
        storage.load_job(*id).await.unwrap().expect("a record");
    }
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Strict {
    value: u32,
}

impl JobArgs for Strict {
    const KIND: &'static str = "strict";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kind_and_undecodable_args_fail_that_job_only() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", queue(8))
        .register(|_ctx: JobContext, _args: Strict| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let unknown = client
        .insert(NewJob::from_parts("nobody_handles_this", json!({})).unwrap())
        .await
        .unwrap();
    let undecodable = client
        .insert(NewJob::from_parts("strict", json!({ "value": "not a number" })).unwrap())
        .await
        .unwrap();
    let good: Vec<i64> = client
        .insert_many(
            &(0..20)
                .map(|v| NewJob::new(&Strict { value: v }).unwrap())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let done = eventually(Duration::from_secs(30), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 20 && metrics.failed() == 2 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(
        done,
        "completed {} failed {}",
        metrics.completed(),
        metrics.failed()
    );
    // from done_entries, or from the archive once fast maintenance has pruned the slot
    let storage = db.storage();
    let error_of = |id: i64| {
        let storage = storage.clone();
        async move {
            let state = storage.job_state(id).await.unwrap().unwrap();
            format!("{}: {}", state.state, state.detail.unwrap_or_default())
        }
    };
    let e = error_of(unknown).await;
    assert!(
        e.starts_with("failed: unknown job kind \"nobody_handles_this\""),
        "{e}"
    );
    let e = error_of(undecodable).await;
    assert!(
        e.starts_with("failed: undecodable arguments for kind \"strict\""),
        "{e}"
    );
    assert_eq!(good.len(), 20);
    db.cleanup().await;
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_written() {
    let db = TestDb::new().await;
    let client = db.client().build().await.unwrap();
    let nul = NewJob::from_parts("k", json!({ "s": "a\u{0}b" })).unwrap();
    assert!(matches!(
        client.insert(nul.clone()).await,
        Err(Error::InvalidArgs { .. })
    ));
    // a batch with one bad job writes nothing
    let good = NewJob::from_parts("k", json!({})).unwrap();
    assert!(client.insert_many(&[good.clone(), nul]).await.is_err());
    assert!(client.insert(good.clone().priority(0)).await.is_err());
    assert!(client
        .insert(good.clone().queue("bad\0queue"))
        .await
        .is_err());
    assert!(matches!(
        NewJob::from_parts("k\0", json!({})),
        Err(Error::InvalidName { .. })
    ));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.ready_entries")
            .await,
        0
    );
    // bad configuration
    let bad = db
        .client()
        .queue(
            "q",
            QueueConfig {
                max_workers: 0,
                ..QueueConfig::default()
            },
        )
        .build()
        .await;
    assert!(matches!(bad, Err(Error::Config(_))));
    assert!(matches!(
        db.client().schema("Robert'); DROP").build().await,
        Err(Error::InvalidName { .. })
    ));
    db.cleanup().await;
}
