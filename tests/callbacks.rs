//! External callbacks and the lease ring on a real server: a waiting job frees its
//! worker; complete, fail, retry and resume from outside; a callback that comes before the handler
//! returned; timeouts; forged, malformed and late callbacks refused; complete vs timeout vs heartbeat
//! on one callback; cancel of a waiting job; the lease ring's rotation truncates ended leases and
//! keeps live ones.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ringwork::{
    AwaitOutcome, CallbackAction, CallbackOutcome, Error, JobArgs, JobContext, JobError, JobStatus,
    NewJob, QueueConfig, Storage,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use support::{eventually, TestDb};
use tokio::sync::{mpsc, Mutex};

#[derive(Serialize, Deserialize)]
struct Approval {
    order: i64,
}

impl JobArgs for Approval {
    const KIND: &'static str = "approval";
}

#[derive(Serialize, Deserialize)]
struct Quick {
    n: i64,
}

impl JobArgs for Quick {
    const KIND: &'static str = "quick";
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Decision {
    approved: bool,
}

async fn state(storage: &Storage, job_id: i64) -> JobStatus {
    storage.job_state(job_id).await.unwrap().unwrap().state
}

fn is_over(result: Result<CallbackOutcome, Error>) -> bool {
    matches!(result, Err(Error::Callback { ref reason, .. }) if reason.contains("no such wait"))
}

#[tokio::test]
async fn a_waiting_job_frees_its_worker_and_a_callback_completes_it() {
    let db = TestDb::new().await;
    let (ids_tx, mut ids_rx) = mpsc::unbounded_channel::<String>();
    let quick_ran = Arc::new(Mutex::new(Vec::new()));
    let client = {
        let quick_ran = Arc::clone(&quick_ran);
        db.client()
            .maintenance(support::fast_maintenance())
            // one worker: the quick job runs only if the waiting one gave its worker back
            .queue(
                "approvals",
                QueueConfig {
                    max_workers: 1,
                    ..QueueConfig::default()
                },
            )
            .register(move |ctx: JobContext, _job: Approval| {
                let ids_tx = ids_tx.clone();
                async move {
                    let id = ctx
                        .register_callback(Duration::from_secs(3600))
                        .await
                        .map_err(JobError::retry)?;
                    ids_tx.send(id).map_err(JobError::retry)?;
                    Err::<(), _>(JobError::WaitForCallback)
                }
            })
            .register(move |_ctx: JobContext, job: Quick| {
                let quick_ran = Arc::clone(&quick_ran);
                async move {
                    quick_ran.lock().await.push(job.n);
                    Ok::<(), JobError>(())
                }
            })
            .build()
            .await
            .unwrap()
    };
    let approval = client
        .insert(
            NewJob::new(&Approval { order: 7 })
                .unwrap()
                .queue("approvals"),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let id = tokio::time::timeout(Duration::from_secs(20), ids_rx.recv())
        .await
        .expect("the handler registered a callback")
        .unwrap();
    assert_eq!(id.len(), 64);
    client
        .insert(NewJob::new(&Quick { n: 1 }).unwrap().queue("approvals"))
        .await
        .unwrap();
    let storage = db.storage();
    assert!(
        eventually(Duration::from_secs(20), || async {
            quick_ran.lock().await.as_slice() == [1]
        })
        .await,
        "the quick job did not run while the approval waited"
    );
    assert_eq!(state(&storage, approval).await, JobStatus::Waiting);
    // the quick job's completion is written in its completion batch, a moment after it ran
    assert!(
        eventually(Duration::from_secs(10), || async {
            let counts = storage
                .queue_counts(Some("approvals"))
                .await
                .unwrap()
                .remove(0);
            (counts.waiting, counts.running, counts.completed) == (1, 0, 1)
        })
        .await,
        "{:?}",
        storage.queue_counts(Some("approvals")).await
    );

    assert_eq!(
        storage
            .resolve_callback(&id, CallbackAction::Complete)
            .await
            .unwrap(),
        CallbackOutcome::Applied
    );
    assert_eq!(state(&storage, approval).await, JobStatus::Completed);
    let counts = storage
        .queue_counts(Some("approvals"))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((counts.waiting, counts.completed), (0, 2));
    // a second answer finds no wait, and changes nothing
    assert!(is_over(
        storage
            .resolve_callback(
                &id,
                CallbackAction::Fail {
                    error: "late".into()
                }
            )
            .await
    ));
    assert_eq!(state(&storage, approval).await, JobStatus::Completed);
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[tokio::test]
async fn resume_runs_the_handler_again_with_the_payload_without_using_an_attempt() {
    let db = TestDb::new().await;
    let (ids_tx, mut ids_rx) = mpsc::unbounded_channel::<String>();
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<(i32, Decision)>();
    let client = db
        .client()
        .maintenance(support::fast_maintenance())
        .queue("default", QueueConfig::default())
        .register(move |ctx: JobContext, _job: Approval| {
            let ids_tx = ids_tx.clone();
            let seen_tx = seen_tx.clone();
            async move {
                match ctx
                    .callback_payload::<Decision>()
                    .await
                    .map_err(JobError::retry)?
                {
                    None => {
                        let id = ctx
                            .register_callback(Duration::from_secs(3600))
                            .await
                            .map_err(JobError::retry)?;
                        ids_tx.send(id).map_err(JobError::retry)?;
                        Err(JobError::WaitForCallback)
                    }
                    Some(decision) => {
                        seen_tx
                            .send((ctx.attempt, decision))
                            .map_err(JobError::retry)?;
                        Ok(())
                    }
                }
            }
        })
        .build()
        .await
        .unwrap();
    let job = client
        .insert(NewJob::new(&Approval { order: 1 }).unwrap().max_attempts(1))
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let id = tokio::time::timeout(Duration::from_secs(20), ids_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let storage = db.storage();
    // applied now, or recorded and applied when the handler returns (it may still be returning)
    let outcome = storage
        .resolve_callback(
            &id,
            CallbackAction::Resume {
                payload: json!({ "approved": true }),
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            CallbackOutcome::Applied | CallbackOutcome::Recorded
        ),
        "{outcome:?}"
    );
    let (attempt, decision) = tokio::time::timeout(Duration::from_secs(20), seen_rx.recv())
        .await
        .expect("the handler ran again")
        .unwrap();
    assert_eq!(decision, Decision { approved: true });
    assert_eq!(attempt, 1, "the wait did not use the only attempt");
    assert!(
        eventually(Duration::from_secs(10), || async {
            state(&storage, job).await == JobStatus::Completed
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[tokio::test]
async fn forged_malformed_and_late_callbacks_are_refused_and_a_timeout_retries_then_fails() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (claimed, id) = support::waiting_job(&db, &storage, "q", 2, Duration::from_secs(1)).await;

    // a forged id: the right shape, another signature
    let mut forged = id.clone();
    let last = if forged.ends_with('0') { "1" } else { "0" };
    forged.replace_range(63.., last);
    let err = storage
        .resolve_callback(&forged, CallbackAction::Complete)
        .await
        .expect_err("forged");
    assert!(
        err.to_string().contains("signature does not match"),
        "{err}"
    );
    for bad in ["", "nothex", &"zz".repeat(32), &id[..62]] {
        let err = storage
            .resolve_callback(bad, CallbackAction::Complete)
            .await
            .expect_err(bad);
        assert!(
            err.to_string().contains("not a callback id"),
            "{bad}: {err}"
        );
    }
    let err = storage
        .resolve_callback(
            &id,
            CallbackAction::Resume {
                payload: json!({ "nul": "a\u{0}b" }),
            },
        )
        .await
        .expect_err("NUL");
    assert!(err.to_string().contains("NUL"), "{err}");
    assert_eq!(state(&storage, claimed.job_id).await, JobStatus::Waiting);

    // maintenance's rescue also asks whether a wait exists, and skips rescue_callbacks when not
    let minute = Duration::from_secs(60);
    assert_eq!(
        storage
            .rescue_and_callbacks_waiting(minute, 100)
            .await
            .unwrap(),
        (0, true)
    );
    // the timeout passes: retried (one attempt left)
    db.advance_clock(Duration::from_millis(1200)).await;
    assert_eq!(storage.rescue_callbacks(100).await.unwrap(), 1);
    assert_eq!(
        storage
            .rescue_and_callbacks_waiting(minute, 100)
            .await
            .unwrap(),
        (0, false),
        "no wait left"
    );
    let after = storage.job_state(claimed.job_id).await.unwrap().unwrap();
    assert!(
        matches!(after.state, JobStatus::Scheduled | JobStatus::Retryable),
        "{after:?}"
    );
    assert_eq!(after.detail.as_deref(), Some("callback timed out"));
    assert!(is_over(
        storage
            .resolve_callback(&id, CallbackAction::Complete)
            .await
    ));

    // the second attempt waits and times out too: failed for good
    storage.promote_due(100).await.unwrap();
    let second = storage.claim("q", 1, None).await.unwrap().remove(0);
    assert_eq!(second.attempt, 2);
    let id2 = storage
        .register_callback(&second.attempt_ref(), Duration::from_secs(1))
        .await
        .unwrap();
    storage.await_callback(&second.attempt_ref()).await.unwrap();
    db.advance_clock(Duration::from_millis(1200)).await;
    assert_eq!(storage.rescue_callbacks(100).await.unwrap(), 1);
    let failed = storage.job_state(claimed.job_id).await.unwrap().unwrap();
    assert_eq!(failed.state, JobStatus::Failed);
    assert!(is_over(
        storage
            .resolve_callback(&id2, CallbackAction::Complete)
            .await
    ));
    db.cleanup().await;
}

#[tokio::test]
async fn complete_timeout_and_heartbeat_race_and_exactly_one_ends_the_wait() {
    let db = TestDb::new().await;
    let storage = db.storage();
    for round in 0..12 {
        let queue = format!("race_{round}");
        let (claimed, id) =
            support::waiting_job(&db, &storage, &queue, 1, Duration::from_secs(1)).await;
        db.advance_clock(Duration::from_millis(1050)).await;
        let (complete, heartbeat, rescued) = tokio::join!(
            storage.resolve_callback(&id, CallbackAction::Complete),
            storage.resolve_callback(
                &id,
                CallbackAction::Heartbeat {
                    extend: Duration::from_secs(60)
                }
            ),
            storage.rescue_callbacks(100),
        );
        let rescued = rescued.unwrap();
        let completed = matches!(complete, Ok(CallbackOutcome::Applied));
        assert!(completed || is_over(complete), "round {round}");
        assert!(
            matches!(heartbeat, Ok(CallbackOutcome::Extended)) || is_over(heartbeat),
            "round {round}"
        );
        // one of the two ended it, never both; the job has exactly one outcome
        let final_state = state(&storage, claimed.job_id).await;
        if completed {
            assert_eq!(rescued, 0, "round {round}");
            assert_eq!(final_state, JobStatus::Completed);
        } else {
            assert_eq!(rescued, 1, "round {round}");
            assert_eq!(final_state, JobStatus::Failed);
        }
        let outcomes = db
            .scalar_i64(&format!(
                "SELECT (SELECT count(*) FROM {{s}}.done_entries WHERE job_id = {0})
                      + (SELECT count(*) FROM {{s}}.deferred_jobs WHERE job_id = {0})
                      + (SELECT count(*) FROM {{s}}.dlq_entries WHERE job_id = {0})
                      + (SELECT count(*) FROM {{s}}.leases WHERE job_id = {0})",
                claimed.job_id
            ))
            .await;
        assert_eq!(outcomes, 1, "round {round}");
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_callback_before_the_handler_returns_is_applied_when_it_does() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(
            &mut conn,
            &[NewJob::from_parts("approval", json!({ "order": 2 })).unwrap()],
        )
        .await
        .unwrap();
    let claimed = storage.claim("default", 1, None).await.unwrap().remove(0);
    let attempt = claimed.attempt_ref();
    let id = storage
        .register_callback(&attempt, Duration::from_secs(60))
        .await
        .unwrap();
    // one callback per attempt
    assert!(storage
        .register_callback(&attempt, Duration::from_secs(60))
        .await
        .is_err());
    assert_eq!(
        storage
            .resolve_callback(
                &id,
                CallbackAction::Fail {
                    error: "declined".into()
                }
            )
            .await
            .unwrap(),
        CallbackOutcome::Recorded
    );
    let err = storage
        .resolve_callback(&id, CallbackAction::Complete)
        .await
        .expect_err("already answered");
    assert!(err.to_string().contains("already answered"), "{err}");
    assert_eq!(state(&storage, claimed.job_id).await, JobStatus::Running);
    assert_eq!(
        storage.await_callback(&attempt).await.unwrap(),
        AwaitOutcome::Applied
    );
    let failed = storage.job_state(claimed.job_id).await.unwrap().unwrap();
    assert_eq!(failed.state, JobStatus::Failed);
    assert_eq!(failed.detail.as_deref(), Some("declined"));
    // the claim is closed: a second return of the handler changes nothing
    assert_eq!(
        storage.await_callback(&attempt).await.unwrap(),
        AwaitOutcome::Stale
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_waiting_job_can_be_cancelled_and_a_wait_without_a_callback_fails_clearly() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (claimed, id) =
        support::waiting_job(&db, &storage, "cancel_q", 3, Duration::from_secs(600)).await;
    assert_eq!(
        storage
            .cancel_job(claimed.job_id, "not needed")
            .await
            .unwrap(),
        ringwork::CancelOutcome::Cancelled
    );
    assert_eq!(state(&storage, claimed.job_id).await, JobStatus::Cancelled);
    assert!(is_over(
        storage
            .resolve_callback(&id, CallbackAction::Complete)
            .await
    ));

    // a handler that returns WaitForCallback without registering: failed, saying why
    let client = db
        .client()
        .maintenance(support::fast_maintenance())
        .queue("default", QueueConfig::default())
        .register(
            |_ctx: JobContext, _job: Quick| async move { Err::<(), _>(JobError::WaitForCallback) },
        )
        .build()
        .await
        .unwrap();
    let job = client
        .insert(NewJob::new(&Quick { n: 0 }).unwrap().max_attempts(5))
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            state(&storage, job).await == JobStatus::Failed
        })
        .await,
        "{:?}",
        storage.job_state(job).await
    );
    let detail = storage
        .job_state(job)
        .await
        .unwrap()
        .unwrap()
        .detail
        .unwrap();
    assert!(
        detail.contains("without registering a callback"),
        "{detail}"
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[tokio::test]
async fn lease_ring_rotation_truncates_ended_leases_and_carries_live_ones() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (live, live_id) =
        support::waiting_job(&db, &storage, "ring_q", 1, Duration::from_secs(3600)).await;
    let (ended, ended_id) =
        support::waiting_job(&db, &storage, "ring_q", 1, Duration::from_secs(3600)).await;
    storage
        .resolve_callback(&ended_id, CallbackAction::Complete)
        .await
        .unwrap();
    let relfilenode = |slot: i32| {
        let db = &db;
        async move {
            db.scalar_i64(&format!(
                "SELECT relfilenode::int8 FROM pg_class WHERE oid = '{{s}}.leases_{slot}'::regclass"
            ))
            .await
        }
    };
    let before = relfilenode(0).await;
    // a full cycle: 0 -> 1 -> ... -> 7 -> 0; the live lease moves forward each time its slot is taken
    for step in 1..=8 {
        assert_eq!(
            storage
                .rotate_lease_ring(Duration::ZERO, Duration::from_millis(100))
                .await
                .unwrap(),
            "rotated",
            "step {step}"
        );
    }
    assert_ne!(relfilenode(0).await, before, "slot 0 was truncated");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.leases").await,
        1,
        "only the live lease is left"
    );
    assert_eq!(state(&storage, live.job_id).await, JobStatus::Waiting);
    assert_eq!(state(&storage, ended.job_id).await, JobStatus::Completed);
    assert_eq!(
        storage
            .resolve_callback(&live_id, CallbackAction::Complete)
            .await
            .unwrap(),
        CallbackOutcome::Applied
    );
    // nothing left: the ring turns until its current slot is one never written, then stays put
    let mut turns = 0;
    while storage
        .rotate_lease_ring(Duration::ZERO, Duration::from_millis(100))
        .await
        .unwrap()
        == "rotated"
    {
        turns += 1;
        assert!(turns <= 8, "an empty ring keeps turning");
    }
    assert_eq!(db.scalar_i64("SELECT count(*) FROM {s}.leases").await, 0);
    db.cleanup().await;
}

/// The lease ring's dead row versions do not accumulate under a held MVCC horizon: each wait
/// writes three versions (registered, waiting, ended) that no vacuum can reclaim while the horizon
/// is held, but every slot is truncated when the ring comes round to it. The table's size stays in
/// a band over six ring cycles of steady traffic.
#[tokio::test]
async fn lease_dead_tuples_stay_bounded_under_a_held_horizon() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();")
        .execute(&mut *holder)
        .await
        .unwrap();
    let size = || async {
        db.scalar_i64(
            "SELECT sum(pg_relation_size(c.oid))::int8 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = '{s}.leases'::regclass",
        )
        .await
    };
    let mut sizes = Vec::new();
    for round in 0..48 {
        for _ in 0..30 {
            let (_, id) =
                support::waiting_job(&db, &storage, "held_q", 1, Duration::from_secs(600)).await;
            storage
                .resolve_callback(&id, CallbackAction::Complete)
                .await
                .unwrap();
        }
        assert_eq!(
            storage
                .rotate_lease_ring(Duration::ZERO, Duration::from_millis(100))
                .await
                .unwrap(),
            "rotated",
            "round {round}"
        );
        sizes.push(size().await);
    }
    // 48 rounds of 30 waits, 8 slots: each slot written six times, truncated in between. The size
    // ramps up over the first cycles (a slot's pages vary by a page or two from cycle to cycle),
    // then stays in a band; without the truncates it would grow by a round's size (~30 KB) every
    // round, past 1.4 MB. The band is 8 pages wide: under the full suite's load a cycle's slots
    // came out 5 pages larger than the third cycle's once (270 KB against 229 KB), while 24 rounds
    // without truncation would add about 700 KB.
    let first_round = sizes[0];
    let third = sizes[16..24].iter().max().copied().unwrap_or(0);
    let sixth = sizes[40..48].iter().max().copied().unwrap_or(0);
    // the same 8-page band as below: under the full suite's load a slot came out a page larger
    // than 16 first rounds once (270,336 against 262,144 bytes)
    let band = 8 * 8192;
    assert!(
        sizes.iter().all(|&size| size <= 16 * first_round + band),
        "the lease ring grew under a held horizon: {sizes:?}"
    );
    assert!(
        sixth <= third + 65_536,
        "the lease ring grew under a held horizon: {sizes:?}"
    );
    assert!(sizes[47] > 0);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *holder)
        .await
        .unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn a_resume_payload_survives_a_retry_of_the_resumed_attempt() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let (claimed, id) =
        support::waiting_job(&db, &storage, "payload_q", 3, Duration::from_secs(600)).await;
    storage
        .resolve_callback(
            &id,
            CallbackAction::Resume {
                payload: json!({ "approved": true }),
            },
        )
        .await
        .unwrap();
    storage.promote_due(100).await.unwrap();
    let resumed = storage.claim("payload_q", 1, None).await.unwrap().remove(0);
    assert_eq!(resumed.job_id, claimed.job_id);
    assert_eq!(resumed.attempt, claimed.attempt, "a resume uses no attempt");
    let payload = storage
        .callback_payload(resumed.job_id, resumed.run_lease)
        .await
        .unwrap();
    assert_eq!(payload, Some(json!({ "approved": true })));
    // the resumed attempt fails and is retried: the next attempt still reads the payload
    storage
        .close_batch(&[(
            resumed.attempt_ref(),
            ringwork::CloseOutcome::Retry {
                at: chrono::Utc::now(),
                error: "flaky".into(),
            },
        )])
        .await
        .unwrap();
    storage.promote_due(100).await.unwrap();
    let again = storage.claim("payload_q", 1, None).await.unwrap().remove(0);
    assert!(again.run_lease > resumed.run_lease);
    assert_eq!(
        storage
            .callback_payload(again.job_id, again.run_lease)
            .await
            .unwrap(),
        Some(json!({ "approved": true }))
    );
    // the job ends: its payload goes with it
    storage
        .complete_batch(&[again.attempt_ref()])
        .await
        .unwrap();
    assert_eq!(
        storage
            .callback_payload(again.job_id, again.run_lease)
            .await
            .unwrap(),
        None
    );
    db.cleanup().await;
}

#[tokio::test]
async fn an_answer_recorded_for_an_attempt_that_ends_otherwise_is_dropped_with_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(
            &mut conn,
            &[NewJob::from_parts("approval", json!({ "order": 3 })).unwrap()],
        )
        .await
        .unwrap();
    let claimed = storage.claim("default", 1, None).await.unwrap().remove(0);
    let id = storage
        .register_callback(&claimed.attempt_ref(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        storage
            .resolve_callback(&id, CallbackAction::Complete)
            .await
            .unwrap(),
        CallbackOutcome::Recorded
    );
    // the handler returns Ok instead of WaitForCallback: its own completion wins
    storage
        .complete_batch(&[claimed.attempt_ref()])
        .await
        .unwrap();
    assert!(is_over(
        storage
            .resolve_callback(&id, CallbackAction::Complete)
            .await
    ));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.leases").await,
        0,
        "the orphaned lease went with the answer"
    );
    assert_eq!(state(&storage, claimed.job_id).await, JobStatus::Completed);
    db.cleanup().await;
}
