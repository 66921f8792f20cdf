//! Handler errors of any type: `?` works on `sqlx::Error`, `std::io::Error` and
//! `anyhow::Error`; such an error retries the attempt with its chain of causes recorded, while a
//! `JobError` keeps its explicit outcome, even wrapped as the source of another error. A panic is a
//! retried attempt with its message, not a lost worker.

mod support;

use std::time::Duration;

use anyhow::Context as _;
use ringwork::{JobArgs, JobContext, JobError, NewJob, QueueConfig, Storage};
use serde::{Deserialize, Serialize};
use support::TestDb;

#[derive(Serialize, Deserialize)]
struct Fallible {
    how: String,
}

impl JobArgs for Fallible {
    const KIND: &'static str = "fallible";
}

/// Wait until the job reaches `state`; returns its recorded error.
async fn settles(storage: &Storage, job_id: i64, state: &str) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = storage.job_state(job_id).await.unwrap();
        match now {
            Some(s) if s.state == state => return s.detail,
            other if tokio::time::Instant::now() > deadline => {
                panic!("job {job_id} never became {state}: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test]
async fn question_mark_on_any_error_retries_with_its_causes_and_job_errors_keep_their_outcome() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let client = db
        .client()
        .queue("fallible_q", QueueConfig::default())
        .register(move |_ctx: JobContext, job: Fallible| {
            let pool = pool.clone();
            async move {
                match job.how.as_str() {
                    "sqlx" => {
                        sqlx::query("SELECT no_such_function_here()")
                            .execute(&pool)
                            .await?;
                    }
                    "io" => {
                        std::fs::read("/no/such/file/for/ringwork")?;
                    }
                    "anyhow" => {
                        std::fs::read("/no/such/file/for/ringwork")
                            .context("loading the report template")?;
                    }
                    "anyhow-wrapping-terminal" => {
                        Err(JobError::terminal("the customer is gone"))
                            .context("sending the invoice")?;
                    }
                    "job-error" => return Err(JobError::terminal("explicitly terminal").into()),
                    _ => {}
                }
                Ok::<(), anyhow::Error>(())
            }
        })
        .build()
        .await
        .unwrap();
    let mut ids = std::collections::HashMap::new();
    for how in [
        "sqlx",
        "io",
        "anyhow",
        "anyhow-wrapping-terminal",
        "job-error",
        "fine",
    ] {
        let job = NewJob::new(&Fallible { how: how.into() })
            .unwrap()
            .queue("fallible_q");
        ids.insert(how, client.insert(job).await.unwrap());
    }
    let running = client.start().await.unwrap();
    let storage = db.storage();

    let sqlx = settles(&storage, ids["sqlx"], "retryable").await.unwrap();
    assert!(sqlx.contains("no_such_function_here"), "{sqlx}");
    let io = settles(&storage, ids["io"], "retryable").await.unwrap();
    assert!(io.contains("No such file"), "{io}");
    let with_context = settles(&storage, ids["anyhow"], "retryable").await.unwrap();
    assert!(
        with_context.starts_with("loading the report template: ")
            && with_context.contains("No such file"),
        "the context and its cause are both recorded: {with_context}"
    );
    let wrapped = settles(&storage, ids["anyhow-wrapping-terminal"], "failed")
        .await
        .unwrap();
    assert_eq!(
        wrapped, "the customer is gone",
        "a JobError under a context keeps its terminal outcome"
    );
    let explicit = settles(&storage, ids["job-error"], "failed").await.unwrap();
    assert_eq!(explicit, "explicitly terminal");
    settles(&storage, ids["fine"], "completed").await;

    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_panicking_handler_retries_its_attempt_with_the_message_and_its_worker_runs_the_next_job()
{
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue(
            "fallible_q",
            QueueConfig {
                // one worker: the job after the panic runs only if the panic did not take it
                max_workers: 1,
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, job: Fallible| async move {
            if job.how == "panic" {
                panic!("the handler panicked on purpose");
            }
            Ok::<(), JobError>(())
        })
        .build()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for how in ["panic", "fine", "fine"] {
        let job = NewJob::new(&Fallible { how: how.into() })
            .unwrap()
            .queue("fallible_q");
        ids.push(client.insert(job).await.unwrap());
    }
    let running = client.start().await.unwrap();
    let storage = db.storage();
    let detail = settles(&storage, ids[0], "retryable").await.unwrap();
    assert_eq!(detail, "handler panicked: the handler panicked on purpose");
    settles(&storage, ids[1], "completed").await;
    settles(&storage, ids[2], "completed").await;
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[test]
fn job_error_is_a_std_error_and_converts_back_from_a_box() {
    let boxed: ringwork::BoxError = Box::new(JobError::Snooze(Duration::from_secs(3)));
    assert_eq!(
        JobError::from_handler_error(boxed),
        JobError::Snooze(Duration::from_secs(3))
    );
    assert_eq!(
        JobError::from_handler_error("plain text"),
        JobError::Retry("plain text".into())
    );
    let io = std::io::Error::other("disk on fire");
    assert_eq!(
        JobError::from_handler_error(io),
        JobError::Retry("disk on fire".into())
    );
}
