//! Bulk operations by filter: cancel, retry and delete in bounded steps, on a real
//! server, with the races a sweep can meet (a running client claiming the same jobs).

mod support;

use futures::StreamExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use ringwork::{
    CloseOutcome, Error, JobArgs, JobContext, JobError, JobFilter, JobStatus, NewJob, QueueConfig,
    QueueCounts, Storage,
};
use serde_json::json;
use support::TestDb;

#[derive(serde::Serialize, serde::Deserialize)]
struct Race {}

impl JobArgs for Race {
    const KIND: &'static str = "race";
}

fn job(kind: &str, queue: &str) -> NewJob {
    NewJob::from_parts(kind, json!({})).unwrap().queue(queue)
}

async fn insert(storage: &Storage, db: &TestDb, jobs: &[NewJob]) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert_many(&mut conn, jobs).await.unwrap()
}

async fn counts(storage: &Storage, queue: &str) -> QueueCounts {
    storage.queue_counts(Some(queue)).await.unwrap().remove(0)
}

fn filter(queue: &str, kind: Option<&str>, states: &[JobStatus]) -> JobFilter {
    JobFilter {
        queue: Some(queue.into()),
        kind: kind.map(Into::into),
        states: states.to_vec(),
        older_than: None,
    }
}

/// More jobs than one step holds, in every state a cancel applies to, beside jobs the filter must
/// leave alone (another kind, another queue, a state not named).
#[tokio::test]
async fn bulk_cancel_takes_every_matching_job_in_bounded_steps_and_nothing_else() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let available = insert(&storage, &db, &vec![job("a", "bulk"); 1200]).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    insert(&storage, &db, &vec![job("a", "bulk").run_at(later); 5]).await;
    insert(&storage, &db, &vec![job("b", "bulk"); 10]).await;
    insert(&storage, &db, &vec![job("a", "other"); 10]).await;
    let running = storage.claim("bulk", 3, None).await.unwrap();
    assert_eq!(running.len(), 3);
    assert!(running.iter().all(|j| available.contains(&j.job_id)));

    // scheduled is not named: those five stay
    let only_waiting = filter(
        "bulk",
        Some("a"),
        &[JobStatus::Available, JobStatus::Running],
    );
    let outcome = storage
        .bulk_cancel(&only_waiting, "bulk test")
        .await
        .unwrap();
    assert_eq!(outcome.matched, 1200);
    assert_eq!(outcome.changed, 1200);
    assert!(outcome.steps >= 3, "500 per step: {outcome:?}");

    let after = counts(&storage, "bulk").await;
    assert_eq!(
        (
            after.available,
            after.running,
            after.scheduled,
            after.cancelled
        ),
        (10, 0, 5, 1200)
    );
    assert_eq!(counts(&storage, "other").await.available, 10);
    // the running attempts were closed as cancelled: their late completions are stale
    let refs: Vec<_> = running.iter().map(|j| j.attempt_ref()).collect();
    let outcomes = storage.complete_batch(&refs).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == ringwork::Outcome::Stale));
    let state = storage.job_state(running[0].job_id).await.unwrap().unwrap();
    assert_eq!(state.state, JobStatus::Cancelled);
    assert_eq!(state.detail.as_deref(), Some("bulk test"));

    // a second run finds nothing more to do
    let again = storage.bulk_cancel(&only_waiting, "again").await.unwrap();
    assert_eq!((again.matched, again.changed), (0, 0));
    // the scheduled ones, by their own state
    let scheduled = filter("bulk", None, &[JobStatus::Scheduled]);
    let outcome = storage.bulk_cancel(&scheduled, "bulk test").await.unwrap();
    assert_eq!((outcome.matched, outcome.changed), (5, 5));
    assert_eq!(counts(&storage, "bulk").await.scheduled, 0);
    db.cleanup().await;
}

/// A sweep races a running client over the same queue: every job ends exactly once, completed or
/// cancelled, and none is lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_racing_running_workers_ends_every_job_exactly_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let ids = insert(&storage, &db, &vec![job("race", "race"); 3000]).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&ran);
    // Past the first 1,000 runs the handlers wait until the sweep has returned, so a slow sweep on
    // a loaded machine still finds jobs to cancel; the first 1,000 race it freely.
    let (swept, sweep_done) = tokio::sync::watch::channel(false);
    let client = db
        .client()
        .queue(
            "race",
            QueueConfig {
                max_workers: 8,
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, _args: Race| {
            let seen = Arc::clone(&seen);
            let mut sweep_done = sweep_done.clone();
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) >= 1000 {
                    let _ = sweep_done.wait_for(|done| *done).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap()
        .start()
        .await
        .unwrap();
    assert!(
        support::eventually(Duration::from_secs(30), || async {
            ran.load(Ordering::SeqCst) >= 50
        })
        .await,
        "the workers started"
    );
    let sweep = filter("race", None, &[JobStatus::Available, JobStatus::Running]);
    let outcome = storage.bulk_cancel(&sweep, "race").await.unwrap();
    swept.send_replace(true);
    assert!(
        support::eventually(Duration::from_secs(30), || async {
            let c = counts(&storage, "race").await;
            c.available == 0 && c.running == 0 && c.completed + c.cancelled == 3000
        })
        .await,
        "{:?}",
        counts(&storage, "race").await
    );
    client.shutdown(Duration::from_secs(5)).await;
    let end = counts(&storage, "race").await;
    assert_eq!(end.cancelled as u64, outcome.changed, "{outcome:?}");
    assert!(end.completed > 0, "the workers ran some before the sweep");
    assert!(end.cancelled > 0, "the sweep cancelled some");
    assert!(ran.load(Ordering::SeqCst) >= end.completed as usize);
    // eight lookups at a time: a completed job's lookup scans its slot's completion batches
    let mut states = std::collections::HashMap::new();
    let mut lookups =
        futures::stream::iter(ids.iter().map(|id| storage.job_state(*id))).buffer_unordered(8);
    while let Some(state) = lookups.next().await {
        *states.entry(state.unwrap().unwrap().state).or_insert(0) += 1;
    }
    assert_eq!(
        states.get(&JobStatus::Completed).copied().unwrap_or(0) as i64,
        end.completed
    );
    db.cleanup().await;
}

/// Retry: scheduled jobs become due now; dead-lettered jobs run again. Delete: dead-lettered jobs
/// go, filtered by kind; terminal history is refused (retention reclaims it).
#[tokio::test]
async fn bulk_retry_and_delete_by_filter() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.set_queue_dead_letter("dl", true).await.unwrap();
    let later = Utc::now() + chrono::Duration::hours(1);
    let scheduled = insert(&storage, &db, &vec![job("s", "dl").run_at(later); 3]).await;
    // six dead-lettered jobs of two kinds
    let mut dead = insert(&storage, &db, &vec![job("x", "dl").max_attempts(1); 3]).await;
    dead.extend(insert(&storage, &db, &vec![job("y", "dl").max_attempts(1); 3]).await);
    let claimed = storage.claim("dl", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 6);
    let fails: Vec<_> = claimed
        .iter()
        .map(|c| {
            (
                c.attempt_ref(),
                CloseOutcome::Failed {
                    error: "boom".into(),
                },
            )
        })
        .collect();
    storage.close_batch(&fails).await.unwrap();
    assert_eq!(counts(&storage, "dl").await.dead_lettered, 6);

    let retry = storage
        .bulk_retry(&filter(
            "dl",
            Some("x"),
            &[JobStatus::DeadLettered, JobStatus::Scheduled],
        ))
        .await
        .unwrap();
    assert_eq!((retry.matched, retry.changed), (3, 3), "only kind x");
    // the three dead letters now wait in the backlog as scheduled, due already: matched, unchanged
    let retry = storage
        .bulk_retry(&filter("dl", None, &[JobStatus::Scheduled]))
        .await
        .unwrap();
    assert_eq!((retry.matched, retry.changed), (6, 3));
    storage.promote_due(100).await.unwrap();
    for id in scheduled.iter().chain(&dead[..3]) {
        let state = storage.job_state(*id).await.unwrap().unwrap().state;
        assert_eq!(state, JobStatus::Available, "job {id}");
    }
    assert_eq!(counts(&storage, "dl").await.dead_lettered, 3);

    // delete: the remaining dead letters (kind y); an age filter no row is old enough for first
    let mut old_only = filter("dl", None, &[JobStatus::DeadLettered]);
    old_only.older_than = Some(Duration::from_secs(3600));
    assert_eq!(storage.bulk_delete(&old_only).await.unwrap().matched, 0);
    let deleted = storage
        .bulk_delete(&filter("dl", Some("y"), &[JobStatus::DeadLettered]))
        .await
        .unwrap();
    assert_eq!((deleted.matched, deleted.changed), (3, 3), "{deleted:?}");
    assert!(storage.dlq_list(Some("dl"), 100).await.unwrap().is_empty());
    assert_eq!(counts(&storage, "dl").await.dead_lettered, 0);
    // terminal history is reclaimed by retention, never row by row
    let history = filter("dl", None, &[JobStatus::Failed]);
    assert!(matches!(
        storage.bulk_delete(&history).await,
        Err(Error::Config(m)) if m.contains("retention") || m.contains("keep_failed")
    ));
    db.cleanup().await;
}

#[tokio::test]
async fn bulk_operations_refuse_a_filter_they_cannot_apply() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let none = filter("q", None, &[]);
    assert!(
        matches!(storage.bulk_cancel(&none, "x").await, Err(Error::Config(m)) if m.contains("name the states"))
    );
    let completed = filter("q", None, &[JobStatus::Completed]);
    for result in [
        storage.bulk_cancel(&completed, "x").await,
        storage.bulk_retry(&completed).await,
        storage.bulk_delete(&completed).await,
    ] {
        assert!(
            matches!(&result, Err(Error::Config(m)) if m.contains("does not apply to completed")),
            "{result:?}"
        );
    }
    let bad_queue = filter("bad\0queue", None, &[JobStatus::Available]);
    assert!(matches!(
        storage.bulk_cancel(&bad_queue, "x").await,
        Err(Error::InvalidName { .. })
    ));
    db.cleanup().await;
}
