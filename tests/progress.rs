//! Progress: `ctx.set_progress(percent, message, checkpoint)`, buffered and
//! written with heartbeats, kept across retries, snoozes and rescues until the job ends, and read
//! back by the next attempt to resume from its checkpoint.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::testing::{self, Drain, RunOutcome};
use ringwork::{
    JobArgs, JobContext, JobError, MaintenanceConfig, NewJob, Outcome, Progress, QueueConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, TestDb};

/// Copies rows in chunks; its first attempt stops after the first chunk, as if cut off.
#[derive(Serialize, Deserialize)]
struct CopyRows {
    /// "retry": the first attempt records a checkpoint and fails; "snooze": it records one
    /// (without flushing) and snoozes; "plain": runs through.
    first: String,
}

impl JobArgs for CopyRows {
    const KIND: &'static str = "copy_rows";
}

/// Where each attempt started from: (attempt, the checkpoint it found).
type Resumes = Arc<Mutex<Vec<(i32, Option<serde_json::Value>)>>>;

fn copy_rows_handler(
    resumes: Resumes,
) -> impl Fn(
    JobContext,
    CopyRows,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), ringwork::BoxError>> + Send>,
> + Send
       + Sync
       + 'static {
    move |ctx: JobContext, job: CopyRows| {
        let resumes = Arc::clone(&resumes);
        Box::pin(async move {
            let last = ctx.last_progress().await?;
            let from = last.and_then(|p| p.progress.checkpoint);
            let first_run = resumes.lock().unwrap().is_empty();
            resumes.lock().unwrap().push((ctx.attempt, from));
            if first_run && job.first != "plain" {
                ctx.set_progress(
                    40.0,
                    "copied 400 of 1000 rows",
                    Some(json!({"next_row": 400})),
                )?;
                if job.first == "retry" {
                    ctx.flush_progress().await?;
                    return Err(JobError::retry("connection reset").into());
                }
                // not flushed: written by the runtime as the attempt ends to run again
                return Err(JobError::Snooze(Duration::from_secs(3600)).into());
            }
            ctx.set_progress(100.0, "copied 1000 rows", None)?;
            Ok(())
        })
    }
}

#[tokio::test]
async fn a_retried_or_snoozed_attempt_leaves_its_checkpoint_for_the_next_and_completion_clears_it()
{
    for first in ["retry", "snooze"] {
        let db = TestDb::new().await;
        let resumes: Resumes = Arc::default();
        let client = db
            .client()
            .queue("default", QueueConfig::default())
            .register(copy_rows_handler(Arc::clone(&resumes)))
            .build()
            .await
            .unwrap();
        let id = client
            .insert(
                NewJob::new(&CopyRows {
                    first: first.into(),
                })
                .unwrap(),
            )
            .await
            .unwrap();
        let drained = testing::drain(&client, "default").await.unwrap();
        assert_eq!(drained.runs.len(), 1, "{first}: {:?}", drained.runs);

        // between attempts: the job shows its last progress (ringwork job <id> prints this)
        let record = client.storage().load_job(id).await.unwrap().unwrap();
        let progress = record
            .progress
            .expect("progress kept across the attempt's end");
        assert_eq!(
            progress.progress,
            Progress {
                percent: 40.0,
                message: "copied 400 of 1000 rows".into(),
                checkpoint: Some(json!({"next_row": 400})),
            },
            "{first}"
        );
        assert_eq!(progress.run_lease, 1);

        let drained = testing::drain_with(&client, "default", Drain::with_scheduled())
            .await
            .unwrap();
        assert_eq!(drained.completed(), 1, "{first}: {:?}", drained.runs);
        let resumes = resumes.lock().unwrap().clone();
        let expected_attempt = if first == "retry" { 2 } else { 1 };
        assert_eq!(
            resumes,
            [
                (1, None),
                (expected_attempt, Some(json!({"next_row": 400})))
            ],
            "{first}: the second attempt resumed from the first one's checkpoint"
        );
        // the job ended: its progress went with it, and attempt_state holds nothing for it
        assert_eq!(client.storage().job_progress(id).await.unwrap(), None);
        assert_eq!(
            db.scalar_i64(&format!(
                "SELECT count(*) FROM {{s}}.attempt_state WHERE job_id = {id}"
            ))
            .await,
            0
        );
        db.cleanup().await;
    }
}

#[derive(Serialize, Deserialize)]
struct Long {}

impl JobArgs for Long {
    const KIND: &'static str = "long";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_s_progress_is_written_by_the_heartbeat_and_bad_values_are_refused() {
    let db = TestDb::new().await;
    let go = Arc::new(tokio::sync::Notify::new());
    let refused: Arc<Mutex<Vec<String>>> = Arc::default();
    let client = {
        let (go, refused) = (Arc::clone(&go), Arc::clone(&refused));
        db.client()
            // heartbeats every stale_after / 4 = 500 ms (and a heartbeat late by more than 2 s
            // on a loaded machine would get the attempt rescued)
            .maintenance(MaintenanceConfig {
                stale_after: Duration::from_secs(2),
                ..support::fast_maintenance()
            })
            .queue(
                "default",
                QueueConfig {
                    poll_interval: Duration::from_millis(50),
                    ..QueueConfig::default()
                },
            )
            .register(move |ctx: JobContext, _job: Long| {
                let (go, refused) = (Arc::clone(&go), Arc::clone(&refused));
                async move {
                    ctx.set_progress(25.0, "a quarter", Some(json!({"page": 3})))?;
                    for bad in [
                        ctx.set_progress(150.0, "too far", None),
                        ctx.set_progress(f64::NAN, "not a number", None),
                        ctx.set_progress(50.0, "nul \u{0} inside", None),
                        ctx.set_progress(50.0, "ok", Some(json!({"k": "nul \u{0}"}))),
                    ] {
                        refused.lock().unwrap().push(match bad {
                            Ok(()) => "accepted".into(),
                            Err(e) => e.to_string(),
                        });
                    }
                    go.notified().await;
                    Ok::<(), ringwork::BoxError>(())
                }
            })
            .build()
            .await
            .unwrap()
    };
    let id = client.insert(NewJob::new(&Long {}).unwrap()).await.unwrap();
    let running = client.start().await.unwrap();
    let storage = client.storage().clone();
    let written = eventually(Duration::from_secs(10), || {
        let storage = storage.clone();
        async move {
            storage
                .job_progress(id)
                .await
                .unwrap()
                .map(|p| p.progress.percent)
                == Some(25.0)
        }
    })
    .await;
    assert!(written, "the heartbeat wrote the buffered progress");
    let refused = refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 4);
    assert!(refused.iter().all(|r| r != "accepted"), "{refused:?}");
    assert!(refused[0].contains("0..=100"), "{}", refused[0]);
    assert!(refused[2].contains("NUL"), "{}", refused[2]);
    let progress = storage.job_progress(id).await.unwrap().unwrap();
    assert_eq!(
        progress.progress.message, "a quarter",
        "the last valid progress stays"
    );
    go.notify_one();
    let cleared = eventually(Duration::from_secs(10), || {
        let storage = storage.clone();
        async move { storage.job_progress(id).await.unwrap().is_none() }
    })
    .await;
    running.shutdown(Duration::from_secs(5)).await;
    assert!(cleared, "completion removed the progress");
    db.cleanup().await;
}

/// A worker records progress and dies; rescue re-queues its job and keeps the checkpoint, and a
/// progress write of the dead attempt that arrives after the rescue is refused and changes nothing.
#[tokio::test]
async fn rescue_keeps_a_crashed_attempt_s_checkpoint_and_refuses_its_late_progress() {
    let db = TestDb::new().await;
    let resumes: Resumes = Arc::default();
    let client = db
        .client()
        .maintenance(support::no_maintenance())
        .queue("default", QueueConfig::default())
        .register(copy_rows_handler(Arc::clone(&resumes)))
        .build()
        .await
        .unwrap();
    let storage = client.storage().clone();
    let id = client
        .insert(
            NewJob::new(&CopyRows {
                first: "plain".into(),
            })
            .unwrap(),
        )
        .await
        .unwrap();
    // the worker that dies: claims, heartbeats its progress, and is never heard from again
    let claimed = storage.claim("default", 1, None).await.unwrap();
    let attempt = claimed[0].attempt_ref();
    let checkpoint =
        json!({"percent": 70.0, "message": "copied 700", "checkpoint": {"next_row": 700}});
    assert_eq!(
        storage
            .heartbeat_batch(&[(attempt, Some(checkpoint))])
            .await
            .unwrap(),
        [Outcome::Applied]
    );
    db.advance_clock(Duration::from_millis(50)).await;
    assert_eq!(
        storage
            .rescue(Duration::from_millis(10), 100)
            .await
            .unwrap(),
        1
    );

    // the dead attempt's late write loses: refused, and the kept checkpoint is unchanged
    let late = json!({"percent": 90.0, "message": "late", "checkpoint": {"next_row": 900}});
    assert_eq!(
        storage
            .heartbeat_batch(&[(attempt, Some(late))])
            .await
            .unwrap(),
        [Outcome::Stale]
    );
    let kept = storage.job_progress(id).await.unwrap().unwrap();
    assert_eq!(kept.progress.checkpoint, Some(json!({"next_row": 700})));

    // the next attempt resumes from it
    let drained = testing::drain_with(&client, "default", Drain::with_scheduled())
        .await
        .unwrap();
    assert_eq!(drained.runs.len(), 1);
    assert_eq!(drained.runs[0].outcome, RunOutcome::Completed);
    assert_eq!(
        resumes.lock().unwrap().as_slice(),
        [(2, Some(json!({"next_row": 700})))]
    );
    assert_eq!(storage.job_progress(id).await.unwrap(), None);
    db.cleanup().await;
}

/// Cancelling a job that waits to run again takes the progress its earlier attempt left with it
/// (no attempt_state row outlives its job).
#[tokio::test]
async fn cancelling_a_retried_job_removes_its_kept_progress() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", QueueConfig::default())
        .register(copy_rows_handler(Arc::default()))
        .build()
        .await
        .unwrap();
    let id = client
        .insert(
            NewJob::new(&CopyRows {
                first: "retry".into(),
            })
            .unwrap(),
        )
        .await
        .unwrap();
    testing::drain(&client, "default").await.unwrap();
    assert!(client.storage().job_progress(id).await.unwrap().is_some());
    assert_eq!(
        client.cancel(id).await.unwrap(),
        ringwork::CancelOutcome::Cancelled
    );
    assert_eq!(client.storage().job_progress(id).await.unwrap(), None);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.attempt_state")
            .await,
        0
    );
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Chatty {
    n: i32,
}

impl JobArgs for Chatty {
    const KIND: &'static str = "progress_chatty";
}

#[tokio::test]
async fn a_long_progress_message_is_kept_cut_and_a_too_deep_checkpoint_refused() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("default", QueueConfig::default())
        .register(|ctx: JobContext, _job: Chatty| async move {
            let deep = (0..200).fold(json!(1), |inner, _| json!([inner]));
            let refused = ctx.set_progress(10.0, "deep", Some(deep)).unwrap_err();
            assert!(refused.to_string().contains("deeper than 126"), "{refused}");
            // at the bound: stored and read back
            let at_bound = (0..125).fold(json!(1), |inner, _| json!([inner]));
            ctx.set_progress(20.0, "at the bound", Some(json!({ "deep": at_bound })))?;
            ctx.flush_progress().await?;
            ctx.last_progress().await?.expect("read back");
            ctx.set_progress(50.0, &"m".repeat(5_000), None)?;
            Err::<(), ringwork::BoxError>(JobError::Snooze(Duration::from_secs(3600)).into())
        })
        .build()
        .await
        .unwrap();
    let id = client
        .insert(NewJob::new(&Chatty { n: 1 }).unwrap())
        .await
        .unwrap();
    testing::drain(&client, "default").await.unwrap();
    let progress = client
        .storage()
        .job_progress(id)
        .await
        .unwrap()
        .expect("the snoozed attempt's progress");
    assert_eq!(
        progress.progress.message,
        format!("{} [... 4000 more characters]", "m".repeat(1_000))
    );
    db.cleanup().await;
}
