//! Cancel: reaches a job in every state, never wins beside a racing claim of the same job, and
//! tells a running handler.

mod support;

use ringwork::{
    CancelOutcome, JobArgs, JobContext, JobError, JobStatus, NewJob, Outcome, QueueConfig,
    RingSizes, SchemaName,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{complete_one, enqueue, eventually, job, state, TestDb};
use tokio::sync::Semaphore;

#[derive(Serialize, Deserialize)]
struct Long {}

impl JobArgs for Long {
    const KIND: &'static str = "long";
}

#[tokio::test]
async fn cancel_reaches_a_job_in_every_state() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let ids = enqueue(&db, vec![job(1), job(2), job(3)]).await;
    let scheduled = enqueue(
        &db,
        vec![job(4).run_at(chrono::Utc::now() + chrono::Duration::hours(1))],
    )
    .await[0];
    assert_eq!(state(&db, scheduled).await, "scheduled");

    // available: tombstoned, the claim steps over it
    assert_eq!(
        storage.cancel_job(ids[0], "not needed").await.unwrap(),
        CancelOutcome::Cancelled
    );
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![ids[1], ids[2]]
    );
    assert_eq!(state(&db, ids[0]).await, "cancelled");
    // scheduled
    assert_eq!(
        storage.cancel_job(scheduled, "no").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.deferred_jobs")
            .await,
        0
    );
    assert_eq!(state(&db, scheduled).await, "cancelled");
    // running: its claim closes; the late completion is stale
    assert_eq!(
        storage.cancel_job(ids[1], "stop").await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    assert_eq!(complete_one(&storage, &claimed[0]).await, Outcome::Stale);
    assert_eq!(state(&db, ids[1]).await, "cancelled");
    // finished
    storage
        .complete_batch(&[claimed[1].attempt_ref()])
        .await
        .unwrap();
    assert_eq!(state(&db, ids[2]).await, "completed");
    assert_eq!(
        storage.cancel_job(ids[2], "late").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    assert_eq!(
        storage.cancel_job(ids[0], "again").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    assert_eq!(
        storage.cancel_job(999_999, "x").await.unwrap(),
        CancelOutcome::NotFound
    );
    assert_eq!(storage.count_in_flight(None).await.unwrap(), 0);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_claim_of_the_same_available_job_never_both_win() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (mut as_available, mut as_running) = (0, 0);
    for n in 0..40 {
        let id = enqueue(&db, vec![job(n)]).await[0];
        let (claimed, cancelled) = tokio::join!(
            storage.claim("default", 1, None),
            storage.cancel_job(id, "race")
        );
        let claimed = claimed.unwrap();
        match cancelled.unwrap() {
            CancelOutcome::Cancelled => {
                assert!(
                    claimed.is_empty(),
                    "job {id} was tombstoned as available yet claimed"
                );
                as_available += 1;
            }
            CancelOutcome::CancelledRunning => {
                assert_eq!(claimed.len(), 1, "cancelled as running, so it was claimed");
                assert_eq!(
                    complete_one(&storage, &claimed[0]).await,
                    Outcome::Stale,
                    "and its completion loses"
                );
                as_running += 1;
            }
            other => panic!("job {id}: unexpected {other:?}"),
        }
        assert_eq!(state(&db, id).await, "cancelled");
        assert!(
            storage.claim("default", 1, None).await.unwrap().is_empty(),
            "nothing left to run"
        );
    }
    assert_eq!(as_available + as_running, 40);
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_is_told_it_was_cancelled() {
    let db = TestDb::new().await;
    let noticed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&noticed);
    let client = db
        .client()
        .queue(
            "default",
            QueueConfig {
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, _args: Long| {
            let flag = Arc::clone(&flag);
            async move {
                tokio::select! {
                    _ = ctx.cancelled() => flag.store(true, Ordering::SeqCst),
                    // a cap on a handler that only ends by being cancelled, not a wait
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let id = client.insert(NewJob::new(&Long {}).unwrap()).await.unwrap();
    let running = client.start().await.unwrap();
    let started =
        eventually(Duration::from_secs(10), || {
            let db_state = db.storage();
            async move {
                db_state.job_state(id).await.unwrap().map(|s| s.state) == Some(JobStatus::Running)
            }
        })
        .await;
    assert!(started);
    // The cancel reaches the handler through NOTIFY: wait until the client's listener has issued
    // its LISTEN on the cancel channel (the heartbeat fallback would take stale_after / 4).
    let channel = db.schema.cancel_channel();
    let listening = support::listener_pid(&db, &channel).await.is_some();
    assert!(listening, "the client never listened on {channel}");
    assert_eq!(
        client.cancel(id).await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    let told = eventually(Duration::from_secs(10), || {
        let noticed = Arc::clone(&noticed);
        async move { noticed.load(Ordering::SeqCst) }
    })
    .await;
    let stale = eventually(Duration::from_secs(5), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.stale() == 1 }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(told, "the handler saw ctx.cancelled()");
    assert!(stale, "its completion was reported stale");
    assert_eq!(state(&db, id).await, "cancelled");
    db.cleanup().await;
}

/// Several schemas can share a database. A schema named like another with `_cancel` appended
/// sends its enqueue notifications (payload: the queue's name, which can read as `job:lease`) on
/// a channel of its own, so they never cancel the other schema's running attempt. No clock: the
/// listener reads its session's notifications in commit order and sets cancel flags as it reads
/// them, so once the second job's real cancel has reached its handler, the other schema's
/// enqueue, committed before it, was read, and the first job's flag says what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_schemas_enqueue_never_cancels_a_running_job() {
    let db = TestDb::new().await;
    let other = SchemaName::new(&format!("{}_cancel", db.schema)).unwrap();
    ringwork::schema::migrate(&db.pool, &other, RingSizes::default())
        .await
        .unwrap();
    // each job's (job id, run lease) when it starts, and (job id, cancelled) when it ends
    let started = Arc::new(Mutex::new(Vec::<(i64, i64)>::new()));
    let ended = Arc::new(Mutex::new(Vec::<(i64, bool)>::new()));
    let release = Arc::new(Semaphore::new(0));
    let (on_start, on_end, gate) = (
        Arc::clone(&started),
        Arc::clone(&ended),
        Arc::clone(&release),
    );
    let client = db
        .client()
        .queue(
            "default",
            QueueConfig {
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, _args: Long| {
            let (on_start, on_end, gate) = (
                Arc::clone(&on_start),
                Arc::clone(&on_end),
                Arc::clone(&gate),
            );
            async move {
                on_start.lock().unwrap().push((ctx.job_id, ctx.run_lease));
                tokio::select! {
                    _ = ctx.cancelled() => {}
                    permit = gate.acquire() => permit.unwrap().forget(),
                }
                on_end
                    .lock()
                    .unwrap()
                    .push((ctx.job_id, ctx.is_cancelled()));
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let first = client.insert(NewJob::new(&Long {}).unwrap()).await.unwrap();
    let second = client.insert(NewJob::new(&Long {}).unwrap()).await.unwrap();
    let running = client.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let started = Arc::clone(&started);
            async move { started.lock().unwrap().len() == 2 }
        })
        .await,
        "both jobs should run"
    );
    let channel = db.schema.cancel_channel();
    assert!(
        support::listener_pid(&db, &channel).await.is_some(),
        "the client never listened on {channel}"
    );
    let lease = started
        .lock()
        .unwrap()
        .iter()
        .find(|(id, _)| *id == first)
        .map(|(_, lease)| *lease)
        .unwrap();

    // the other schema's enqueue into a queue named as the first attempt's cancel payload
    sqlx::query(&format!("SELECT {other}.enqueue($1, 'other')"))
        .bind(format!("{first}:{lease}"))
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        client.cancel(second).await.unwrap(),
        CancelOutcome::CancelledRunning
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            let ended = Arc::clone(&ended);
            async move { ended.lock().unwrap().contains(&(second, true)) }
        })
        .await,
        "the second job's handler was not told of its cancel"
    );
    release.add_permits(1);
    assert!(
        eventually(Duration::from_secs(10), || {
            let ended = Arc::clone(&ended);
            async move { ended.lock().unwrap().iter().any(|(id, _)| *id == first) }
        })
        .await,
        "the first job did not end"
    );
    assert!(
        ended.lock().unwrap().contains(&(first, false)),
        "another schema's enqueue cancelled the first job"
    );
    running.shutdown(Duration::from_secs(5)).await;
    assert_eq!(state(&db, first).await, "completed");
    ringwork::schema::drop_schema(&db.pool, &other)
        .await
        .unwrap();
    db.cleanup().await;
}
