//! The test kit, used as a service's tests would use it: a throwaway schema,
//! assertions on what a transaction enqueued, jobs run inline through their real handlers.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::testing::{self, Drain, RunOutcome, TestSchema};
use ringwork::{Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::TestDb;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Welcome {
    user: String,
}

impl JobArgs for Welcome {
    const KIND: &'static str = "welcome";
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Audit {
    event: String,
}

impl JobArgs for Audit {
    const KIND: &'static str = "audit";
}

/// What a handler does, by its argument: "ok", "fail" (terminal), "flaky" (fails its first
/// attempt), "snooze" (always snoozes).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Task {
    how: String,
}

impl JobArgs for Task {
    const KIND: &'static str = "task";
}

async fn client_on(schema: &TestSchema, ran: Arc<AtomicUsize>) -> Client {
    schema
        .client()
        .queue("default", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Welcome| async { Ok::<(), JobError>(()) })
        .register(|_ctx: JobContext, _job: Audit| async { Ok::<(), JobError>(()) })
        .register(move |ctx: JobContext, job: Task| {
            let ran = Arc::clone(&ran);
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                match job.how.as_str() {
                    "ok" => Ok(()),
                    "fail" => Err(JobError::terminal("declined")),
                    "flaky" if ctx.attempt == 1 => Err(JobError::retry("first attempt fails")),
                    "flaky" => Ok(()),
                    _ => Err(JobError::Snooze(Duration::from_secs(3600))),
                }
            }
        })
        .build()
        .await
        .unwrap()
}

/// The code under test: a signup that enqueues its jobs in the caller's transaction.
async fn signup(tx: &mut sqlx::PgConnection, client: &Client, user: &str) -> ringwork::Result<()> {
    client
        .insert_tx(tx, NewJob::new(&Welcome { user: user.into() })?)
        .await?;
    client
        .insert_tx(
            tx,
            NewJob::new(&Audit {
                event: format!("signup {user}"),
            })?,
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn what_a_transaction_enqueued_is_seen_inside_it_and_nowhere_else() {
    let db = TestDb::new().await;
    let schema = TestSchema::create(&db.pool).await.unwrap();
    let client = client_on(&schema, Arc::default()).await;
    let admin = client.admin();

    let mut tx = db.pool.begin().await.unwrap();
    signup(&mut tx, &client, "ada").await.unwrap();
    let welcomes: Vec<Welcome> = testing::enqueued(&mut tx, &admin).await.unwrap();
    assert_eq!(welcomes, [Welcome { user: "ada".into() }]);
    let audits: Vec<Audit> = testing::enqueued(&mut tx, &admin).await.unwrap();
    assert_eq!(
        audits,
        [Audit {
            event: "signup ada".into()
        }]
    );
    // another connection does not see the uncommitted jobs
    let mut other = db.pool.acquire().await.unwrap();
    let outside: Vec<Welcome> = testing::enqueued(&mut other, &admin).await.unwrap();
    assert!(outside.is_empty());
    tx.rollback().await.unwrap();
    let after: Vec<Welcome> = testing::enqueued(&mut other, &admin).await.unwrap();
    assert!(after.is_empty(), "a rolled-back enqueue leaves nothing");

    // committed, then drained inline: nothing is pending any more
    let mut tx = db.pool.begin().await.unwrap();
    signup(&mut tx, &client, "grace").await.unwrap();
    tx.commit().await.unwrap();
    let pending: Vec<Welcome> = testing::enqueued(&mut other, &admin).await.unwrap();
    assert_eq!(
        pending,
        [Welcome {
            user: "grace".into()
        }]
    );
    let drained = testing::drain(&client, "default").await.unwrap();
    assert_eq!(drained.completed(), 2);
    let pending: Vec<Welcome> = testing::enqueued(&mut other, &admin).await.unwrap();
    assert!(pending.is_empty());
    drop(other);
    schema.drop().await.unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn drain_runs_real_handlers_and_settles_each_outcome() {
    let db = TestDb::new().await;
    let schema = TestSchema::create(&db.pool).await.unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let client = client_on(&schema, Arc::clone(&ran)).await;
    let task = |how: &str| NewJob::new(&Task { how: how.into() }).unwrap();
    let ok = client.insert(task("ok")).await.unwrap();
    let fail = client.insert(task("fail")).await.unwrap();
    let flaky = client.insert(task("flaky")).await.unwrap();

    // without scheduled work: each runs once; the flaky one waits out its backoff
    let drained = testing::drain(&client, "default").await.unwrap();
    assert_eq!(drained.runs.len(), 3, "{:?}", drained.runs);
    assert_eq!(
        (drained.completed(), drained.failed(), drained.retried()),
        (1, 1, 1)
    );
    let outcome = |id: i64| {
        drained
            .runs
            .iter()
            .find(|r| r.job_id == id)
            .map(|r| r.outcome.clone())
    };
    assert_eq!(outcome(ok), Some(RunOutcome::Completed));
    assert_eq!(
        outcome(fail),
        Some(RunOutcome::Failed {
            error: "declined".into()
        })
    );
    let state = |id: i64| {
        let storage = client.storage().clone();
        async move { storage.job_state(id).await.unwrap().map(|s| s.state) }
    };
    assert_eq!(state(ok).await, Some(JobStatus::Completed));
    assert_eq!(state(fail).await, Some(JobStatus::Failed));
    assert_eq!(state(flaky).await, Some(JobStatus::Retryable));

    // with scheduled work: the retry runs now, on its second attempt
    let drained = testing::drain_with(&client, "default", Drain::with_scheduled())
        .await
        .unwrap();
    assert_eq!(drained.runs.len(), 1);
    assert_eq!(drained.runs[0].job_id, flaky);
    assert_eq!(drained.runs[0].attempt, 2);
    assert_eq!(drained.runs[0].outcome, RunOutcome::Completed);
    assert_eq!(state(flaky).await, Some(JobStatus::Completed));
    assert_eq!(ran.load(Ordering::SeqCst), 4);

    // run one job inline
    let run = testing::run_job(&client, task("ok")).await.unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed);
    assert_eq!(state(run.job_id).await, Some(JobStatus::Completed));
    schema.drop().await.unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn a_handler_that_always_snoozes_stops_the_drain_at_max_runs_and_the_schema_drops() {
    let db = TestDb::new().await;
    let schema = TestSchema::create(&db.pool).await.unwrap();
    let name = schema.name().to_string();
    let client = client_on(&schema, Arc::default()).await;
    let id = client
        .insert(
            NewJob::new(&Task {
                how: "snooze".into(),
            })
            .unwrap(),
        )
        .await
        .unwrap();
    let drained = testing::drain_with(
        &client,
        "default",
        Drain {
            with_scheduled: true,
            max_runs: 5,
        },
    )
    .await
    .unwrap();
    assert!(drained.hit_max_runs);
    assert_eq!(drained.runs.len(), 5);
    assert!(drained
        .runs
        .iter()
        .all(|r| r.job_id == id && r.outcome == RunOutcome::Snoozed && r.attempt == 1));
    // a paused queue runs nothing: run_job says why
    client
        .storage()
        .set_queue_paused("default", true)
        .await
        .unwrap();
    let err = testing::run_job(&client, NewJob::new(&Task { how: "ok".into() }).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("paused"), "{err}");

    schema.drop().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_namespace WHERE nspname = $1")
        .bind(&name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the test schema is gone");
    db.cleanup().await;
}

#[tokio::test]
async fn drain_runs_a_workflow_in_dependency_order_to_its_end() {
    let db = TestDb::new().await;
    let schema = TestSchema::create(&db.pool).await.unwrap();
    let client = client_on(&schema, Arc::default()).await;
    let task = |how: &str| NewJob::new(&Task { how: how.into() }).unwrap();
    let inserted = client
        .insert_workflow(
            ringwork::Workflow::new()
                .step(ringwork::Step::new("first", task("ok")))
                .step(ringwork::Step::new("left", task("flaky")).after(&["first"]))
                .step(ringwork::Step::new("right", task("ok")).after(&["first"]))
                .step(ringwork::Step::new("last", task("ok")).after(&["left", "right"])),
        )
        .await
        .unwrap();
    // the flaky step retries after a backoff: with_scheduled runs it at once
    let drained = testing::drain_with(&client, "default", Drain::with_scheduled())
        .await
        .unwrap();
    let order: Vec<i64> = drained
        .runs
        .iter()
        .filter(|r| r.outcome == RunOutcome::Completed)
        .map(|r| r.job_id)
        .collect();
    let id = |s: &str| inserted.job_id(s).unwrap();
    assert_eq!(order.len(), 4, "{drained:?}");
    assert_eq!(order[0], id("first"));
    assert_eq!(order[3], id("last"), "last runs after both branches");
    let status = client
        .admin()
        .workflow(inserted.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, ringwork::WorkflowState::Completed);
    schema.drop().await.unwrap();
}
