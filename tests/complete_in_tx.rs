//! Completing inside the handler's own transaction: the handler's effect and the
//! job's completion commit or roll back together, guarded by `(job_id, run_lease)`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringwork::{
    CancelOutcome, Error, JobArgs, JobContext, JobError, JobStatus, MaintenanceConfig, NewJob,
    QueueConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::TestDb;
use tokio::sync::Notify;

#[derive(Serialize, Deserialize)]
struct Charge {
    /// What the handler does after completing in its transaction: "commit", "rollback_ok"
    /// (roll back, return Ok), "rollback_fail" (roll back, return a terminal error).
    then: String,
}

impl JobArgs for Charge {
    const KIND: &'static str = "charge";
}

async fn settled(db: &TestDb, id: i64, want: JobStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = db.storage().job_state(id).await.unwrap().map(|s| s.state);
        if state == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} never became {want}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn effects(db: &TestDb, id: i64) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM {{s}}.effects WHERE job_id = {id}"
    ))
    .await
}

fn fast() -> QueueConfig {
    QueueConfig {
        poll_interval: Duration::from_millis(50),
        ..QueueConfig::default()
    }
}

/// The handler's effect: a row in a table of the application (here in the test's schema).
async fn write_effect(
    tx: &mut sqlx::PgConnection,
    schema: &str,
    job_id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "INSERT INTO {schema}.effects (job_id) VALUES ($1)"
    ))
    .bind(job_id)
    .execute(tx)
    .await
    .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effect_and_the_completion_commit_or_roll_back_together() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE {s}.effects (job_id bigint PRIMARY KEY)")
        .await;
    let pool: PgPool = db.pool.clone();
    let schema = db.schema.as_str().to_string();
    let client = db
        .client()
        // no rotation during the test: the completion history is read from the ring below
        .maintenance(MaintenanceConfig {
            enabled: false,
            ..MaintenanceConfig::default()
        })
        .queue("default", fast())
        .register(move |ctx: JobContext, job: Charge| {
            let pool = pool.clone();
            let schema = schema.clone();
            async move {
                let mut tx = pool.begin().await?;
                write_effect(&mut tx, &schema, ctx.job_id).await?;
                ctx.complete_in(&mut tx).await?;
                match job.then.as_str() {
                    "commit" => tx.commit().await?,
                    "rollback_ok" => tx.rollback().await?,
                    _ => {
                        tx.rollback().await?;
                        return Err(JobError::terminal("the charge was declined").into());
                    }
                }
                Ok::<(), ringwork::BoxError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let insert = |then: &str| {
        let client = client.clone();
        let job = NewJob::new(&Charge { then: then.into() }).unwrap();
        async move { client.insert(job).await.unwrap() }
    };
    let committed = insert("commit").await;
    let rolled_back_ok = insert("rollback_ok").await;
    let rolled_back_failed = insert("rollback_fail").await;
    let running = client.start().await.unwrap();

    // committed: the effect is there and the job is completed, by the handler's transaction
    settled(&db, committed, JobStatus::Completed).await;
    assert_eq!(effects(&db, committed).await, 1);
    // rolled back, then Ok: no effect; the runtime's own completion completes the job
    settled(&db, rolled_back_ok, JobStatus::Completed).await;
    assert_eq!(effects(&db, rolled_back_ok).await, 0);
    // rolled back, then a terminal error: no effect, and the job failed (the rollback undid the
    // completion, so the error decides)
    settled(&db, rolled_back_failed, JobStatus::Failed).await;
    assert_eq!(effects(&db, rolled_back_failed).await, 0);

    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(metrics.completed(), 2);
    assert_eq!(metrics.failed(), 1);
    // the runtime's follow-up write for the committed job was refused, as expected: not stale
    assert_eq!(metrics.stale(), 0);
    // exactly one completion is recorded for the job completed in its transaction
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM {{s}}.receipt_completion_batches WHERE {committed} = ANY (job_ids)"
        ))
        .await,
        1
    );
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Gated {}

impl JobArgs for Gated {
    const KIND: &'static str = "gated";
}

/// Both orders of the race between completing in a transaction and a cancel of the same attempt:
/// cancel first, then the completion is refused (`Error::Stale`) and its effect rolled back;
/// completion first (transaction still open), then the cancel waits for it and finds the job
/// finished. Exactly one wins each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_fails_the_transaction_and_a_racing_cancel_waits_for_the_commit() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE {s}.effects (job_id bigint PRIMARY KEY)")
        .await;
    let pool: PgPool = db.pool.clone();
    let schema = db.schema.as_str().to_string();
    // per job: "cancel first" (wait for `go` before completing) or "complete first" (complete,
    // signal `completed`, wait for `go`, commit)
    let go = Arc::new(Notify::new());
    let completed = Arc::new(Notify::new());
    let results: Arc<Mutex<Vec<String>>> = Arc::default();
    let cancel_first = Arc::new(Mutex::new(true));
    let client = {
        let (go, completed, results, cancel_first) = (
            Arc::clone(&go),
            Arc::clone(&completed),
            Arc::clone(&results),
            Arc::clone(&cancel_first),
        );
        db.client()
            .queue("default", fast())
            .register(move |ctx: JobContext, _job: Gated| {
                let (pool, schema) = (pool.clone(), schema.clone());
                let (go, completed, results) = (
                    Arc::clone(&go),
                    Arc::clone(&completed),
                    Arc::clone(&results),
                );
                let cancel_first = *cancel_first.lock().unwrap();
                async move {
                    if cancel_first {
                        go.notified().await;
                    }
                    let mut tx = pool.begin().await?;
                    write_effect(&mut tx, &schema, ctx.job_id).await?;
                    let outcome = ctx.complete_in(&mut tx).await;
                    results.lock().unwrap().push(match &outcome {
                        Ok(()) => "completed".to_string(),
                        Err(Error::Stale { .. }) => "stale".to_string(),
                        Err(e) => format!("error: {e}"),
                    });
                    outcome?;
                    completed.notify_one();
                    go.notified().await;
                    tx.commit().await?;
                    Ok::<(), ringwork::BoxError>(())
                }
            })
            .build()
            .await
            .unwrap()
    };
    let running = client.start().await.unwrap();

    // 1. cancel first: the handler's completion in its transaction is refused
    let first = client
        .insert(NewJob::new(&Gated {}).unwrap())
        .await
        .unwrap();
    settled(&db, first, JobStatus::Running).await;
    assert_eq!(
        client.cancel(first).await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    go.notify_one();
    settled(&db, first, JobStatus::Cancelled).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while results.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the handler never tried to complete"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(results.lock().unwrap().as_slice(), ["stale"]);
    assert_eq!(
        effects(&db, first).await,
        0,
        "the stale completion's effect rolled back"
    );

    // 2. complete first: the cancel blocks on the attempt's lock until the handler commits
    *cancel_first.lock().unwrap() = false;
    let second = client
        .insert(NewJob::new(&Gated {}).unwrap())
        .await
        .unwrap();
    completed.notified().await;
    let cancel = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (client.cancel(second).await.unwrap(), started.elapsed())
        })
    };
    // a wait for something not to happen: the cancel stays blocked on the attempt's lock
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !cancel.is_finished(),
        "the cancel must wait for the open completion"
    );
    go.notify_one();
    let (outcome, waited) = cancel.await.unwrap();
    assert_eq!(outcome, CancelOutcome::AlreadyFinished);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    settled(&db, second, JobStatus::Completed).await;
    assert_eq!(effects(&db, second).await, 1);
    assert_eq!(results.lock().unwrap().as_slice(), ["stale", "completed"]);

    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
