//! Workflows: a step runs only once every step it depends on is final, is released exactly once
//! (two last dependencies finishing at once included), and a failed or cancelled dependency does
//! what the step's policy says.

mod support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{
    AwaitOutcome, CallbackAction, CancelOutcome, CloseOutcome, DependencyFailure, JobArgs,
    JobContext, JobStatus, NewJob, Outcome, Step, Workflow, WorkflowState,
};
use serde::{Deserialize, Serialize};
use support::{complete_one, eventually, job, one_waits_for_a_lock, state, TestDb};

const STALE: Duration = Duration::from_secs(60);

fn step(name: &str, after: &[&str]) -> Step {
    Step::new(name, job(0)).after(after)
}

/// The steps' names in the order a claim of `queue` returns them (up to 100).
async fn claim_names(
    storage: &ringwork::Storage,
    inserted: &ringwork::InsertedWorkflow,
) -> Vec<(String, ringwork::ClaimedJob)> {
    let claimed = storage.claim("default", 100, None).await.unwrap();
    claimed
        .into_iter()
        .map(|c| {
            let name = inserted
                .steps
                .iter()
                .find(|(_, id)| *id == c.job_id)
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| format!("job {}", c.job_id));
            (name, c)
        })
        .collect()
}

/// Every one of these tables of the schema is empty.
async fn assert_empty(db: &TestDb, tables: &[&str]) {
    for table in tables {
        assert_eq!(
            db.scalar_i64(&format!("SELECT count(*) FROM {{s}}.{table}"))
                .await,
            0,
            "{table}"
        );
    }
}

async fn insert(db: &TestDb, workflow: Workflow) -> ringwork::InsertedWorkflow {
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage()
        .insert_workflow(&mut conn, &workflow)
        .await
        .unwrap()
}

/// The default queue's (pending, available) exact counts.
async fn counts_of(storage: &ringwork::Storage) -> (i64, i64) {
    let counts = storage.queue_counts(Some("default")).await.unwrap();
    (counts[0].pending, counts[0].available)
}

/// The default queue dead-letters its failed jobs, so that an operator can retry them.
async fn dead_letter_default_queue(storage: &ringwork::Storage) {
    storage.ensure_queue("default").await.unwrap();
    assert!(storage
        .set_queue_dead_letter("default", true)
        .await
        .unwrap());
}

async fn fail(storage: &ringwork::Storage, claimed: &ringwork::ClaimedJob) {
    let outcome = storage
        .close_batch(&[(
            claimed.attempt_ref(),
            CloseOutcome::Failed {
                error: "broken".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(outcome, vec![Outcome::Applied]);
}

#[tokio::test]
async fn a_diamond_runs_in_dependency_order_and_passes_outputs() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("fetch", &[]))
            .step(step("left", &["fetch"]))
            .step(step("right", &["fetch"]))
            .step(step("join", &["left", "right"])),
    )
    .await;
    assert_eq!(w.steps.len(), 4);
    let id = |s: &str| w.job_id(s).unwrap();
    assert_eq!(state(&db, id("join")).await, "pending");
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Running);
    assert_eq!(status.count(JobStatus::Pending), 3);
    // the exact counts see the steps that wait as pending, the released one as available
    assert_eq!(counts_of(&storage).await, (3, 1));
    assert_eq!(
        status.step("join").unwrap().depends_on,
        vec!["left", "right"]
    );

    let first = claim_names(&storage, &w).await;
    assert_eq!(
        first.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        vec!["fetch"],
        "only the step without dependencies is available"
    );
    storage
        .set_workflow_output(id("fetch"), &serde_json::json!({"rows": 3}))
        .await
        .unwrap();
    assert_eq!(complete_one(&storage, &first[0].1).await, Outcome::Applied);
    assert_eq!(counts_of(&storage).await, (1, 2));
    // the ring's slots turn over while steps wait: nothing of a workflow lives in them
    support::rotate_and_prune(&storage, Duration::from_secs(3600)).await;

    let second = claim_names(&storage, &w).await;
    let mut names: Vec<&str> = second.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(names, vec!["left", "right"]);
    assert_eq!(complete_one(&storage, &second[0].1).await, Outcome::Applied);
    assert_eq!(state(&db, id("join")).await, "pending");
    let detail = storage.job_state(id("join")).await.unwrap().unwrap().detail;
    assert_eq!(detail.as_deref(), Some("waiting for 1 of 2 dependencies"));
    assert!(claim_names(&storage, &w).await.is_empty());
    assert_eq!(complete_one(&storage, &second[1].1).await, Outcome::Applied);

    let last = claim_names(&storage, &w).await;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].0, "join");
    assert_eq!(
        storage.workflow_output(id("join"), "fetch").await.unwrap(),
        Some(serde_json::json!({"rows": 3}))
    );
    assert_eq!(
        storage.workflow_output(id("join"), "left").await.unwrap(),
        None
    );
    assert_eq!(complete_one(&storage, &last[0].1).await, Outcome::Applied);
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Completed);
    assert_eq!(status.count(JobStatus::Completed), 4);
    assert_eq!(counts_of(&storage).await, (0, 0));
    assert!(status.steps.iter().all(|s| s.finished_at.is_some()));
    db.cleanup().await;
}

#[tokio::test]
async fn the_last_two_dependencies_completing_at_once_release_the_dependent_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("a", &[]))
            .step(step("b", &[]))
            .step(step("join", &["a", "b"])),
    )
    .await;
    let claimed = claim_names(&storage, &w).await;
    assert_eq!(claimed.len(), 2);
    // two processes complete the two last dependencies, each inside its own transaction
    let mut first = db.pool.begin().await.unwrap();
    assert_eq!(
        storage
            .complete_on(&mut first, &claimed[0].1.attempt_ref())
            .await
            .unwrap(),
        Outcome::Applied
    );
    let second_storage = storage.clone();
    let second_attempt = claimed[1].1.attempt_ref();
    let pool = db.pool.clone();
    let second = tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        let outcome = second_storage
            .complete_on(&mut tx, &second_attempt)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        outcome
    });
    // the second waits for the workflow's lock, held by the first until it commits
    assert!(one_waits_for_a_lock(&db).await);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_released")
            .await,
        2,
        "join is not released by either while the first has not committed"
    );
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), Outcome::Applied);
    let join = w.job_id("join").unwrap();
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM {{s}}.ready_entries WHERE job_id = {join}"
        ))
        .await,
        1,
        "released once"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.workflow_arrivals WHERE step = 'join' AND seen IN (1, 2)"
        )
        .await,
        2
    );
    let last = claim_names(&storage, &w).await;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].0, "join");
    db.cleanup().await;
}

/// A dependent of one dependency is released by that dependency's end alone, with no arrival to
/// count (its first arrival is its last); one of several counts its arrivals, one row for the
/// edges that arrive in one call (under policy `cancel`, an edge arrives once). Both in one
/// completion batch, each released once.
#[tokio::test]
async fn a_dependent_of_one_dependency_is_released_without_counting_and_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("a", &[]))
            .step(step("x", &[]))
            .step(step("after_a", &["a"]))
            .step(step("after_both", &["a", "x"])),
    )
    .await;
    let first = claim_names(&storage, &w).await;
    assert_eq!(first.len(), 2);
    let attempts: Vec<_> = first.iter().map(|(_, c)| c.attempt_ref()).collect();
    let outcomes = storage.complete_batch(&attempts).await.unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Applied),
        "{outcomes:?}"
    );
    let mut next: Vec<String> = claim_names(&storage, &w)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    next.sort();
    assert_eq!(next, vec!["after_a", "after_both"]);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_arrivals WHERE step = 'after_a'")
            .await,
        0,
        "nothing to count for one dependency"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.workflow_arrivals WHERE step = 'after_both' AND seen = 2"
        )
        .await,
        1,
        "both edges counted by one arrival"
    );
    for name in ["after_a", "after_both"] {
        let job = w.job_id(name).unwrap();
        assert_eq!(
            db.scalar_i64(&format!(
                "SELECT count(*) FROM {{s}}.ready_entries WHERE job_id = {job}"
            ))
            .await,
            1,
            "{name} released once"
        );
    }
    db.cleanup().await;
}

/// A completion batch asks for workflow steps in its job range first: a batch of plain jobs whose
/// highest job (the range's end) is a workflow's first step releases that step's dependent.
#[tokio::test]
async fn a_step_at_the_end_of_a_batch_of_plain_jobs_releases_its_dependent() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let plain = support::enqueue(&db, (0..4).map(job).collect()).await;
    let w = insert(
        &db,
        Workflow::new().step(step("a", &[])).step(step("b", &["a"])),
    )
    .await;
    let a = w.job_id("a").unwrap();
    assert!(
        plain.iter().all(|id| *id < a),
        "the step is the batch's highest job"
    );
    let first = claim_names(&storage, &w).await;
    assert_eq!(first.len(), 5);
    let attempts: Vec<_> = first.iter().map(|(_, c)| c.attempt_ref()).collect();
    assert_eq!(
        storage.complete_batch(&attempts).await.unwrap(),
        vec![Outcome::Applied; 5]
    );
    let next: Vec<String> = claim_names(&storage, &w)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(next, vec!["b"]);
    db.cleanup().await;
}

/// Arrivals at dependents of several dependencies, by policy: under `run` a dependency's failure
/// arrives and its later completion after a retry does not arrive again (the dependent still waits
/// for its other dependency); under `hold` the completion after the retry is the arrival; under
/// `cancel` the edges arriving in one completion batch are counted by one row. Each dependent is
/// released once, when its last dependency ends.
#[tokio::test]
async fn dependents_of_several_dependencies_count_each_edge_once_under_every_policy() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    let w = insert(
        &db,
        Workflow::new()
            .step(step("d1", &[]))
            .step(step("d2", &[]))
            .step(step("d3", &[]))
            .step(step("d4", &[]))
            .step(step("runs", &["d1", "d2"]).on_dependency_failure(DependencyFailure::Run))
            .step(step("held", &["d1", "d2"]).on_dependency_failure(DependencyFailure::Hold))
            .step(step("fan_in", &["d2", "d3", "d4"])),
    )
    .await;
    let id = |s: &str| w.job_id(s).unwrap();
    let first: std::collections::HashMap<String, ringwork::ClaimedJob> =
        claim_names(&storage, &w).await.into_iter().collect();
    assert_eq!(first.len(), 4);
    fail(&storage, &first["d1"]).await;
    let batch = [first["d3"].attempt_ref(), first["d4"].attempt_ref()];
    let outcomes = storage.complete_batch(&batch).await.unwrap();
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Applied]);
    // d1 retried and completed: held counts it now, runs counted its failure already
    assert!(storage.dlq_retry(id("d1")).await.unwrap());
    storage.promote_due(10).await.unwrap();
    let again = claim_names(&storage, &w).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, "d1");
    assert_eq!(complete_one(&storage, &again[0].1).await, Outcome::Applied);
    assert!(
        claim_names(&storage, &w).await.is_empty(),
        "every dependent still waits for d2"
    );
    for name in ["runs", "held", "fan_in"] {
        assert_eq!(state(&db, id(name)).await, "pending", "{name}");
    }
    assert_eq!(complete_one(&storage, &first["d2"]).await, Outcome::Applied);
    let mut released: Vec<String> = claim_names(&storage, &w)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    released.sort();
    assert_eq!(released, vec!["fan_in", "held", "runs"]);
    assert!(claim_names(&storage, &w).await.is_empty());
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.workflow_arrivals WHERE step = 'fan_in' AND seen IN (2, 3)"
        )
        .await,
        2,
        "d3 and d4 in one row, then d2"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_failed_dependency_cancels_runs_or_holds_its_dependents_by_policy() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    let w = insert(
        &db,
        Workflow::new()
            .step(step("load", &[]))
            .step(step("cancelled", &["load"]))
            .step(step("cancelled_too", &["cancelled"]))
            .step(step("runs", &["load"]).on_dependency_failure(DependencyFailure::Run))
            .step(step("held", &["load"]).on_dependency_failure(DependencyFailure::Hold)),
    )
    .await;
    let id = |s: &str| w.job_id(s).unwrap();
    let load = claim_names(&storage, &w).await;
    assert_eq!(load.len(), 1);
    fail(&storage, &load[0].1).await;
    assert_eq!(state(&db, id("load")).await, "dead_lettered");
    assert_eq!(state(&db, id("cancelled")).await, "cancelled");
    assert_eq!(state(&db, id("cancelled_too")).await, "cancelled");
    assert_eq!(state(&db, id("runs")).await, "available");
    assert_eq!(state(&db, id("held")).await, "pending");
    let runs = claim_names(&storage, &w).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, "runs");
    assert_eq!(complete_one(&storage, &runs[0].1).await, Outcome::Applied);
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Running, "held waits");

    // the operator retries the failed step; once it completes, the held step runs
    assert!(storage.dlq_retry(id("load")).await.unwrap());
    storage.promote_due(10).await.unwrap();
    let again = claim_names(&storage, &w).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, "load");
    assert_eq!(state(&db, id("held")).await, "pending");
    assert_eq!(complete_one(&storage, &again[0].1).await, Outcome::Applied);
    let held = claim_names(&storage, &w).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].0, "held");
    assert_eq!(complete_one(&storage, &held[0].1).await, Outcome::Applied);
    // the cancelled stay cancelled, and "runs" is not run twice
    assert_eq!(state(&db, id("cancelled")).await, "cancelled");
    assert!(claim_names(&storage, &w).await.is_empty());
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Cancelled);
    assert_eq!(status.count(JobStatus::Completed), 3);
    assert_eq!(status.count(JobStatus::Cancelled), 2);
    db.cleanup().await;
}

#[tokio::test]
async fn a_rescued_dependency_holds_its_dependent_until_the_re_run_completes() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new().step(step("a", &[])).step(step("b", &["a"])),
    )
    .await;
    let first = claim_names(&storage, &w).await.remove(0).1;
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 1);
    assert_eq!(state(&db, w.job_id("a").unwrap()).await, "retryable");
    assert_eq!(state(&db, w.job_id("b").unwrap()).await, "pending");
    assert_eq!(complete_one(&storage, &first).await, Outcome::Stale);
    assert_eq!(state(&db, w.job_id("b").unwrap()).await, "pending");
    db.advance_clock(Duration::from_secs(3600)).await;
    storage.promote_due(10).await.unwrap();
    let rerun = claim_names(&storage, &w).await;
    assert_eq!(rerun.len(), 1);
    assert_eq!(rerun[0].0, "a");
    assert_eq!(complete_one(&storage, &rerun[0].1).await, Outcome::Applied);
    assert_eq!(state(&db, w.job_id("b").unwrap()).await, "available");
    db.cleanup().await;
}

#[tokio::test]
async fn cancelling_a_workflow_cancels_waiting_and_running_steps_and_releases_nothing_after() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("a", &[]))
            .step(step("side", &[]))
            .step(step("b", &["a"]))
            .step(step("c", &["b"])),
    )
    .await;
    let running = claim_names(&storage, &w).await;
    assert_eq!(running.len(), 2);
    assert_eq!(
        storage.cancel_workflow(w.workflow_id).await.unwrap(),
        Some(4)
    );
    for (_, claimed) in &running {
        assert_eq!(complete_one(&storage, claimed).await, Outcome::Stale);
    }
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert!(status.cancelled);
    assert_eq!(status.state, WorkflowState::Cancelled);
    assert_eq!(status.count(JobStatus::Cancelled), 4);
    // the steps cancelled before their release are not pending any more
    assert_eq!(counts_of(&storage).await, (0, 0));
    assert!(claim_names(&storage, &w).await.is_empty());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_released")
            .await,
        2
    );
    // adding to a cancelled workflow is refused; an unknown workflow is None
    let mut conn = db.pool.acquire().await.unwrap();
    let refused = storage
        .add_workflow_steps(
            &mut conn,
            w.workflow_id,
            &Workflow::new().step(step("late", &[])),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("is cancelled"), "{refused}");
    assert_eq!(
        storage.cancel_workflow(w.workflow_id + 1000).await.unwrap(),
        None
    );
    assert!(storage
        .workflow_status(w.workflow_id + 1000)
        .await
        .unwrap()
        .is_none());
    db.cleanup().await;
}

#[tokio::test]
async fn a_waiting_step_cancelled_by_id_cancels_its_dependents() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("a", &[]))
            .step(step("b", &["a"]))
            .step(step("c", &["b"]))
            .step(step("d", &["a"])),
    )
    .await;
    let b = w.job_id("b").unwrap();
    let pending = storage
        .list_jobs(JobStatus::Pending, None, None, None, 10)
        .await
        .unwrap();
    assert_eq!(
        pending.jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![b, w.job_id("c").unwrap(), w.job_id("d").unwrap()]
    );
    assert_eq!(
        storage.cancel_job(b, "not needed").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        storage.cancel_job(b, "again").await.unwrap(),
        CancelOutcome::AlreadyFinished
    );
    assert_eq!(state(&db, w.job_id("c").unwrap()).await, "cancelled");
    let a = claim_names(&storage, &w).await.remove(0).1;
    assert_eq!(complete_one(&storage, &a).await, Outcome::Applied);
    let next = claim_names(&storage, &w).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, "d");
    // the listing shows only steps still waiting as pending: none now
    let pending = storage
        .list_jobs(JobStatus::Pending, None, None, None, 10)
        .await
        .unwrap();
    assert!(pending.jobs.is_empty());
    db.cleanup().await;
}

#[tokio::test]
async fn a_workflow_inserted_in_a_rolled_back_transaction_leaves_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut tx = db.pool.begin().await.unwrap();
    let w = storage
        .insert_workflow(
            &mut tx,
            &Workflow::new().step(step("a", &[])).step(step("b", &["a"])),
        )
        .await
        .unwrap();
    assert_eq!(w.steps.len(), 2);
    tx.rollback().await.unwrap();
    assert_empty(
        &db,
        &[
            "workflows",
            "workflow_steps",
            "workflow_edges",
            "workflow_released",
            "ready_entries",
        ],
    )
    .await;
    assert!(storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .is_none());
    db.cleanup().await;
}

/// Steps may be listed before the steps they depend on: the cycle check's shortcut (every
/// dependency listed first) does not apply, the full check finds no cycle, and the steps run in
/// dependency order.
#[tokio::test]
async fn a_workflow_from_sql_may_list_a_step_before_its_dependencies() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let steps = r#"[{"step": "last", "kind": "k", "depends_on": ["middle"]},
                    {"step": "middle", "kind": "k", "depends_on": ["first"]},
                    {"step": "first", "kind": "k"}]"#;
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT step, job_id FROM {}.enqueue_workflow($1::jsonb)",
        db.schema
    ))
    .bind(steps)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let inserted = ringwork::InsertedWorkflow {
        workflow_id: 0,
        steps: rows,
    };
    for expected in ["first", "middle", "last"] {
        let claimed = claim_names(&storage, &inserted).await;
        assert_eq!(
            claimed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            vec![expected]
        );
        assert_eq!(
            complete_one(&storage, &claimed[0].1).await,
            Outcome::Applied
        );
    }
    assert!(claim_names(&storage, &inserted).await.is_empty());
    db.cleanup().await;
}

#[tokio::test]
async fn bad_workflows_are_refused_with_a_clear_error_and_write_nothing() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let refused = [
        (Workflow::new(), "at least one step"),
        (
            Workflow::new().step(step("a", &[])).step(step("a", &[])),
            "appears twice",
        ),
        (Workflow::new().step(step("a", &["a"])), "depends on itself"),
        (
            Workflow::new().step(step("a", &["nowhere"])),
            "not a step of this workflow",
        ),
        (
            Workflow::new()
                .step(step("a", &["c"]))
                .step(step("b", &["a"]))
                .step(step("c", &["b"]))
                .step(step("free", &[])),
            "[\"a\", \"b\", \"c\"] depend on each other in a cycle",
        ),
        (
            Workflow::new().step(Step::new("a", job(1).queue("bad\u{7}queue"))),
            "queue name",
        ),
        (
            Workflow::new().step(Step::new(
                "a",
                job(1).run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
            )),
            "cannot be unique or have a run_at",
        ),
        (
            Workflow::new().step(step("bad\u{0}name", &[])),
            "workflow step name",
        ),
    ];
    for (workflow, expected) in refused {
        let error = storage
            .insert_workflow(&mut conn, &workflow)
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains(expected),
            "{error} vs {expected}"
        );
    }
    // the SQL API refuses the same, with SQLSTATE 22023, for producers in other languages
    let sql_refused = [
        (r#"[]"#, "non-empty JSON array"),
        (r#"[{"step": "a"}]"#, "invalid job kind"),
        (
            r#"[{"step": "a", "kind": "k", "when": 1}]"#,
            "unknown fields",
        ),
        (
            r#"[{"step": "a", "kind": "k", "priority": 9}]"#,
            "priority must be 1..4",
        ),
        (
            r#"[{"step": "a", "kind": "k", "depends_on": ["b"]}, {"step": "b", "kind": "k", "depends_on": ["a"]}]"#,
            "cycle",
        ),
        (
            r#"[{"step": "a", "kind": "k", "depends_on": ["x"]}]"#,
            "not a step of workflow",
        ),
        (
            r#"[{"step": "a", "kind": "k", "on_dependency_failure": "explode"}]"#,
            "cancel, run or hold",
        ),
        (
            r#"[{"step": "a", "kind": "k", "args": null}]"#,
            "must not be NULL",
        ),
    ];
    for (steps, expected) in sql_refused {
        let error = sqlx::query(&format!(
            "SELECT * FROM {}.enqueue_workflow($1::jsonb)",
            db.schema
        ))
        .bind(steps)
        .fetch_all(&db.pool)
        .await
        .unwrap_err();
        let db_error = error.as_database_error().expect("a database error");
        assert_eq!(
            db_error.code().as_deref(),
            Some("22023"),
            "{steps}: {db_error}"
        );
        assert!(db_error.message().contains(expected), "{steps}: {db_error}");
    }
    assert_empty(&db, &["workflows", "workflow_steps", "ready_entries"]).await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_running_step_fans_out_and_a_summary_runs_once_after_its_children() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(&db, Workflow::new().step(step("plan", &[]))).await;
    let plan = claim_names(&storage, &w).await.remove(0).1;
    // while "plan" runs it adds a child per row and a summary after all of them, and completes in
    // the same transaction
    let mut fan_out = Workflow::new();
    let children: Vec<String> = (0..5).map(|i| format!("row-{i}")).collect();
    for child in &children {
        fan_out = fan_out.step(step(child, &["plan"]));
    }
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    fan_out = fan_out.step(step("summary", &names));
    let mut tx = db.pool.begin().await.unwrap();
    let added = storage
        .add_workflow_steps(&mut tx, w.workflow_id, &fan_out)
        .await
        .unwrap();
    assert_eq!(added.steps.len(), 6);
    assert_eq!(
        storage
            .complete_on(&mut tx, &plan.attempt_ref())
            .await
            .unwrap(),
        Outcome::Applied
    );
    tx.commit().await.unwrap();
    let all = ringwork::InsertedWorkflow {
        workflow_id: w.workflow_id,
        steps: added.steps.clone(),
    };
    let rows = claim_names(&storage, &all).await;
    assert_eq!(rows.len(), 5, "the children, not the summary");
    assert!(rows.iter().all(|(n, _)| n.starts_with("row-")));
    for (_, claimed) in &rows {
        assert_eq!(complete_one(&storage, claimed).await, Outcome::Applied);
    }
    let summary = claim_names(&storage, &all).await;
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0].0, "summary");
    // a step added after its dependency completed is released at once
    let mut conn = db.pool.acquire().await.unwrap();
    let late = storage
        .add_workflow_steps(
            &mut conn,
            w.workflow_id,
            &Workflow::new().step(step("late", &["plan"])),
        )
        .await
        .unwrap();
    assert_eq!(state(&db, late.steps[0].1).await, "available");
    db.cleanup().await;
}

#[tokio::test]
async fn finished_workflows_expire_and_running_ones_stay() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let done = insert(&db, Workflow::new().step(step("only", &[]))).await;
    let running = insert(
        &db,
        Workflow::new().step(step("x", &[])).step(step("y", &["x"])),
    )
    .await;
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let only = claimed
        .iter()
        .find(|c| c.job_id == done.job_id("only").unwrap())
        .unwrap();
    assert_eq!(complete_one(&storage, only).await, Outcome::Applied);
    let keep = Duration::from_secs(3600);
    assert_eq!(
        storage.workflow_expire(keep, 100).await.unwrap(),
        0,
        "too new"
    );
    db.advance_clock(keep + Duration::from_secs(1)).await;
    assert_eq!(storage.workflow_expire(keep, 100).await.unwrap(), 1);
    assert!(storage
        .workflow_status(done.workflow_id)
        .await
        .unwrap()
        .is_none());
    assert!(storage
        .workflow_status(running.workflow_id)
        .await
        .unwrap()
        .is_some());
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct Part {
    n: i64,
}

impl JobArgs for Part {
    const KIND: &'static str = "part";
}

#[derive(Serialize, Deserialize)]
struct Sum {}

impl JobArgs for Sum {
    const KIND: &'static str = "sum";
}

#[tokio::test]
async fn a_fan_out_fan_in_workflow_runs_in_a_client_and_the_fan_in_reads_every_output() {
    let db = TestDb::new().await;
    let total = Arc::new(AtomicI64::new(-1));
    let sums = Arc::new(AtomicI64::new(0));
    let client = db
        .client()
        .queue("default", support::queue(8))
        .register(|ctx: JobContext, part: Part| async move {
            ctx.set_workflow_output(&(part.n * part.n)).await?;
            Ok::<_, ringwork::BoxError>(())
        })
        .register({
            let total = total.clone();
            let sums = sums.clone();
            move |ctx: JobContext, _: Sum| {
                let total = total.clone();
                let sums = sums.clone();
                async move {
                    let mut sum = 0;
                    for n in 0..20 {
                        sum += ctx
                            .workflow_output::<i64>(&format!("part-{n}"))
                            .await?
                            .unwrap_or(0);
                    }
                    total.store(sum, Ordering::SeqCst);
                    sums.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ringwork::BoxError>(())
                }
            }
        })
        .build()
        .await
        .unwrap();
    let mut workflow = Workflow::new();
    let names: Vec<String> = (0..20).map(|n| format!("part-{n}")).collect();
    for (n, name) in names.iter().enumerate() {
        workflow = workflow.step(Step::new(name, NewJob::new(&Part { n: n as i64 }).unwrap()));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    workflow = workflow.step(Step::new("sum", NewJob::new(&Sum {}).unwrap()).after(&refs));
    let inserted = client.insert_workflow(workflow).await.unwrap();
    let running = client.start().await.unwrap();
    let admin = client.admin();
    assert!(
        eventually(Duration::from_secs(20), || async {
            admin
                .workflow(inserted.workflow_id)
                .await
                .unwrap()
                .is_some_and(|w| w.state == WorkflowState::Completed)
        })
        .await,
        "the workflow completes"
    );
    assert_eq!(
        total.load(Ordering::SeqCst),
        (0..20).map(|n| n * n).sum::<i64>()
    );
    assert_eq!(sums.load(Ordering::SeqCst), 1, "the fan-in ran once");
    running.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_step_completed_through_its_callback_releases_its_dependents() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(
        &db,
        Workflow::new()
            .step(step("approve", &[]))
            .step(step("ship", &["approve"])),
    )
    .await;
    let approve = claim_names(&storage, &w).await.remove(0).1;
    let id = storage
        .register_callback(&approve.attempt_ref(), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        storage
            .await_callback(&approve.attempt_ref())
            .await
            .unwrap(),
        AwaitOutcome::Waiting
    );
    assert_eq!(state(&db, w.job_id("ship").unwrap()).await, "pending");
    storage
        .resolve_callback(&id, CallbackAction::Complete)
        .await
        .unwrap();
    assert_eq!(state(&db, w.job_id("approve").unwrap()).await, "completed");
    assert_eq!(state(&db, w.job_id("ship").unwrap()).await, "available");
    db.cleanup().await;
}

#[tokio::test]
async fn steps_added_behind_a_cancelled_branch_are_released_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let w = insert(&db, Workflow::new().step(step("s", &[]))).await;
    let s = claim_names(&storage, &w).await.remove(0).1;
    fail(&storage, &s).await;
    // x is cancelled at once (its dependency failed); z runs anyway, released by that cancel
    let mut conn = db.pool.acquire().await.unwrap();
    let added = storage
        .add_workflow_steps(
            &mut conn,
            w.workflow_id,
            &Workflow::new()
                .step(step("x", &["s"]))
                .step(step("z", &["x"]).on_dependency_failure(DependencyFailure::Run)),
        )
        .await
        .unwrap();
    assert_eq!(state(&db, added.job_id("x").unwrap()).await, "cancelled");
    assert_eq!(state(&db, added.job_id("z").unwrap()).await, "available");
    db.cleanup().await;
}

#[tokio::test]
async fn a_held_step_is_cancelled_when_its_dependency_can_never_complete() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // no dead-letter queue: a failure is final, nothing can retry it
    let w = insert(
        &db,
        Workflow::new()
            .step(step("load", &[]))
            .step(step("held", &["load"]).on_dependency_failure(DependencyFailure::Hold)),
    )
    .await;
    let load = claim_names(&storage, &w).await.remove(0).1;
    fail(&storage, &load).await;
    assert_eq!(state(&db, w.job_id("load").unwrap()).await, "failed");
    assert_eq!(state(&db, w.job_id("held").unwrap()).await, "cancelled");
    let status = storage
        .workflow_status(w.workflow_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Failed);
    db.cleanup().await;
}

#[tokio::test]
async fn a_batch_callback_runs_once_after_every_member_and_reads_their_counts() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let batch = storage
        .insert_batch(
            &mut conn,
            &ringwork::Batch::new()
                .member(job(1))
                .member(job(2))
                .member(job(3))
                .callback(job(9)),
        )
        .await
        .unwrap();
    assert_eq!(batch.members.len(), 3);
    let callback = batch.callback.unwrap();
    assert_eq!(state(&db, callback).await, "pending");
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 3, "the members, not the callback");
    assert_eq!(complete_one(&storage, &claimed[0]).await, Outcome::Applied);
    fail(&storage, &claimed[1]).await;
    assert_eq!(state(&db, callback).await, "pending");
    assert_eq!(complete_one(&storage, &claimed[2]).await, Outcome::Applied);
    let run = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        run.iter().map(|c| c.job_id).collect::<Vec<_>>(),
        vec![callback]
    );
    let counts = storage.workflow_counts(callback).await.unwrap().unwrap();
    assert_eq!(
        (
            counts.workflow_id,
            counts.completed,
            counts.failed,
            counts.cancelled,
            counts.unfinished
        ),
        (batch.batch_id, 2, 1, 0, 0)
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_success_callback_is_cancelled_by_a_member_that_fails() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let batch = storage
        .insert_batch(
            &mut conn,
            &ringwork::Batch::new()
                .member(job(1))
                .member(job(2))
                .success_callback(job(9)),
        )
        .await
        .unwrap();
    let claimed = storage.claim("default", 10, None).await.unwrap();
    fail(&storage, &claimed[0]).await;
    assert_eq!(state(&db, batch.callback.unwrap()).await, "cancelled");
    assert_eq!(complete_one(&storage, &claimed[1]).await, Outcome::Applied);
    assert!(storage.claim("default", 10, None).await.unwrap().is_empty());
    let status = storage
        .workflow_status(batch.batch_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, WorkflowState::Failed);
    db.cleanup().await;
}

#[tokio::test]
async fn an_open_batch_takes_members_until_sealed_and_a_member_ending_during_the_seal_counts_once()
{
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let batch = storage
        .insert_batch(
            &mut conn,
            &ringwork::Batch::new().member(job(1)).member(job(2)),
        )
        .await
        .unwrap();
    assert!(batch.callback.is_none());
    let first = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(first.len(), 2);
    // a member that ends before the seal counts when the seal comes
    assert_eq!(complete_one(&storage, &first[0]).await, Outcome::Applied);
    let added = storage
        .add_to_batch(&mut conn, batch.batch_id, &[job(3)])
        .await
        .unwrap();
    assert_eq!(added.len(), 1);
    // the seal and a member's completion at once: the completion waits for the batch's lock
    let mut sealing = db.pool.begin().await.unwrap();
    let callback = storage
        .seal_batch(&mut sealing, batch.batch_id, &job(9), false)
        .await
        .unwrap();
    let completer = storage.clone();
    let second = first[1].attempt_ref();
    let racing = tokio::spawn(async move { completer.complete_batch(&[second]).await.unwrap() });
    assert!(one_waits_for_a_lock(&db).await);
    sealing.commit().await.unwrap();
    assert_eq!(racing.await.unwrap(), vec![Outcome::Applied]);
    assert_eq!(
        state(&db, callback).await,
        "pending",
        "member 3 is not final yet"
    );
    let third = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(third.iter().map(|c| c.job_id).collect::<Vec<_>>(), added);
    assert_eq!(complete_one(&storage, &third[0]).await, Outcome::Applied);
    let last = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(
        last.iter().map(|c| c.job_id).collect::<Vec<_>>(),
        vec![callback]
    );
    // sealed: no more members, no second seal
    let refused = storage
        .add_to_batch(&mut conn, batch.batch_id, &[job(4)])
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("is sealed"), "{refused}");
    let refused = storage
        .seal_batch(&mut conn, batch.batch_id, &job(9), false)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("sealed already"), "{refused}");
    // a workflow that is not a batch takes no members
    let w = insert(&db, Workflow::new().step(step("a", &[]))).await;
    let refused = storage
        .add_to_batch(&mut conn, w.workflow_id, &[job(5)])
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("no batch"), "{refused}");
    db.cleanup().await;
}

#[tokio::test]
async fn a_batch_from_sql_refuses_bad_members_with_22023() {
    let db = TestDb::new().await;
    for (members, expected) in [
        (r#"[]"#, "non-empty JSON array"),
        (
            r#"[{"kind": "k", "depends_on": []}]"#,
            "a batch member is a job object",
        ),
        (r#"[{"kind": ""}]"#, "invalid job kind"),
    ] {
        let error = sqlx::query(&format!(
            "SELECT * FROM {}.enqueue_batch($1::jsonb, '{{\"kind\": \"done\"}}')",
            db.schema
        ))
        .bind(members)
        .fetch_all(&db.pool)
        .await
        .unwrap_err();
        let db_error = error.as_database_error().expect("a database error");
        assert_eq!(
            db_error.code().as_deref(),
            Some("22023"),
            "{members}: {db_error}"
        );
        assert!(
            db_error.message().contains(expected),
            "{members}: {db_error}"
        );
    }
    let rows: Vec<(i64, i64, bool)> = sqlx::query_as(&format!(
        "SELECT * FROM {}.enqueue_batch('[{{\"kind\": \"a\"}}, {{\"kind\": \"b\"}}]', '{{\"kind\": \"done\"}}')",
        db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.iter().filter(|r| r.2).count(), 1);
    assert_eq!(rows.len(), 3);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_batches")
            .await,
        1
    );
    db.cleanup().await;
}

fn in_sequence(key: &str, n: i64) -> NewJob {
    job(n).sequence(key, DependencyFailure::Run)
}

/// The `n` of each claimed job's args, in claim order.
async fn claim_ns(storage: &ringwork::Storage) -> Vec<(i64, ringwork::ClaimedJob)> {
    storage
        .claim("default", 100, None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.args["n"].as_i64().unwrap(), c))
        .collect()
}

#[tokio::test]
async fn a_sequence_runs_its_jobs_one_at_a_time_in_insert_order_and_keys_in_parallel() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(
        &db,
        vec![
            in_sequence("customer-1", 11),
            in_sequence("customer-2", 21),
            in_sequence("customer-1", 12),
            in_sequence("customer-1", 13),
            job(99),
        ],
    )
    .await;
    // a key's backlog is never in another's way: each key's head and the plain job run at once
    let mut running = claim_ns(&storage).await;
    running.sort_by_key(|(n, _)| *n);
    assert_eq!(
        running.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![11, 21, 99]
    );
    assert!(claim_ns(&storage).await.is_empty(), "12 waits for 11");
    // each completion releases exactly the next job of its key
    let mut head = running.remove(0).1;
    for next in [12, 13] {
        assert_eq!(complete_one(&storage, &head).await, Outcome::Applied);
        let mut claimed = claim_ns(&storage).await;
        assert_eq!(
            claimed.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            vec![next]
        );
        head = claimed.remove(0).1;
    }
    // the key's last job completes; a job inserted later starts at once, in a new workflow
    assert_eq!(complete_one(&storage, &head).await, Outcome::Applied);
    support::enqueue(&db, vec![in_sequence("customer-1", 14)]).await;
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![14]
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.workflow_sequences WHERE sequence_key = 'customer-1'"
        )
        .await,
        2
    );
    db.cleanup().await;
}

/// An append skips asking where its tail is when nothing settled the tail since its release (it
/// cannot be final then). What that rule could lose: a tail ended by the appending transaction
/// itself (claimed and completed, or cancelled) before the next append, which must then see a
/// final tail and start at once rather than wait behind it forever.
#[tokio::test]
async fn an_append_after_its_tail_ended_in_the_same_transaction_starts_at_once() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let s = db.schema.to_string();
    let append = |key: &'static str, n: i64| {
        format!(
            "SELECT {s}.enqueue_in_sequence('{key}', '{{\"kind\": \"k\", \"args\": {{\"n\": {n}}}}}')"
        )
    };
    let mut tx = db.pool.begin().await.unwrap();
    // completed in the transaction that released it
    let first: i64 = sqlx::query_scalar(&append("done-here", 1))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let (slot, receipt, job, lease): (i32, i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT claim_slot, receipt_id, job_id, run_lease FROM {s}.claim('default', 10)"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(job, first);
    sqlx::query(&format!(
        "SELECT * FROM {s}.complete_batch(ARRAY[$1], ARRAY[$2], ARRAY[$3], ARRAY[$4])"
    ))
    .bind(slot)
    .bind(receipt)
    .bind(job)
    .bind(lease)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(&append("done-here", 2))
        .execute(&mut *tx)
        .await
        .unwrap();
    // cancelled in the transaction that released it
    let cancelled: i64 = sqlx::query_scalar(&append("cancelled-here", 3))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&format!("SELECT {s}.cancel_job($1, 'not needed')"))
        .bind(cancelled)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&append("cancelled-here", 4))
        .execute(&mut *tx)
        .await
        .unwrap();
    // and a tail released here and still open: the next waits behind it
    sqlx::query(&append("open-here", 5))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&append("open-here", 6))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut claimed: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    claimed.sort_unstable();
    assert_eq!(
        claimed,
        vec![2, 4, 5],
        "6 waits for 5; 2 and 4 do not wait for ended tails"
    );
    db.cleanup().await;
}

/// Many appends in one statement (what a producer's transaction of sequence jobs sends): each
/// job's id comes back with its position, keys keep their order, and arrays of different lengths
/// are refused.
#[tokio::test]
async fn many_appends_in_one_statement_return_each_jobs_id_with_its_position() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let s = db.schema.to_string();
    let job = |n: i64| serde_json::json!({ "kind": "k", "args": { "n": n } });
    let appended: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT ord, job_id FROM {s}.enqueue_in_sequence_many($1, $2, $3)"
    ))
    .bind(vec!["a", "a", "b"])
    .bind(vec![job(1), job(2), job(3)])
    .bind(vec!["run", "run", "run"])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        appended.iter().map(|(ord, _)| *ord).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let heads = claim_ns(&storage).await;
    let mut by_n: Vec<(i64, i64)> = heads.iter().map(|(n, c)| (*n, c.job_id)).collect();
    by_n.sort_unstable();
    assert_eq!(
        by_n,
        vec![(1, appended[0].1), (3, appended[2].1)],
        "2 waits for 1"
    );
    let err = sqlx::query(&format!(
        "SELECT * FROM {s}.enqueue_in_sequence_many(ARRAY['a'], ARRAY[]::jsonb[], ARRAY['run'])"
    ))
    .execute(&db.pool)
    .await
    .expect_err("lengths differ");
    assert!(
        err.to_string().contains("as many keys, jobs and policies"),
        "{err}"
    );
    db.cleanup().await;
}

/// Bad sequence input through SQL gets its own clear error, alone or among good jobs in one call
/// (which then appends nothing: the statement is the unit), and good jobs that look unusual still
/// go in.
#[tokio::test]
async fn bad_sequence_jobs_are_refused_with_a_clear_error_through_sql_and_append_nothing() {
    let db = TestDb::new().await;
    let s = db.schema.to_string();
    let good = serde_json::json!({ "kind": "k", "args": { "n": 1 } });
    let cases = [
        (
            "k",
            serde_json::json!(5),
            "run",
            "a sequence job is a job object",
        ),
        (
            "k",
            serde_json::json!({ "kind": "k", "step": "x" }),
            "run",
            "unknown fields {step}",
        ),
        (
            "k",
            serde_json::json!({ "kind": "k", "depends_on": [] }),
            "run",
            "unknown fields {depends_on}",
        ),
        (
            "k",
            serde_json::json!({ "kind": "k", "priority": 9 }),
            "run",
            "priority must be 1..4",
        ),
        (
            "k",
            serde_json::json!({ "kind": 7 }),
            "run",
            "must be strings",
        ),
        (
            "k",
            serde_json::json!({ "args": {} }),
            "run",
            "invalid job kind",
        ),
        (
            "k",
            serde_json::json!({ "kind": "k", "timeout_ms": 0 }),
            "run",
            "timeout_ms must be",
        ),
        ("", good.clone(), "run", "invalid sequence key"),
        (
            "k",
            good.clone(),
            "sometimes",
            "on a failure a sequence continues",
        ),
    ];
    // arrays that are not lists: two-dimensional, or numbered from 0
    for (keys, jobs, policies) in [
        (
            "ARRAY['a', 'b']",
            format!("ARRAY[['{good}'], ['{good}']]::jsonb[]"),
            "ARRAY['run', 'run']",
        ),
        (
            "'[0:1]={a,b}'::text[]",
            format!(
                "'[0:1]={{\"{g}\",\"{g}\"}}'::jsonb[]",
                g = good.to_string().replace('"', "\\\"")
            ),
            "'[0:1]={run,run}'::text[]",
        ),
    ] {
        let call =
            format!("SELECT * FROM {s}.enqueue_in_sequence_many({keys}, {jobs}, {policies})");
        let error = sqlx::query(&call)
            .execute(&db.pool)
            .await
            .expect_err(&call)
            .to_string();
        assert!(
            error.contains("one-dimensional arrays from 1"),
            "{call}: {error}"
        );
    }
    // args no worker could decode, which JSON values here cannot hold: given as SQL text
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for (args, expected) in [
        (
            r#"{"n": 1e400}"#.to_string(),
            "beyond the range of a 64-bit float",
        ),
        (nested(128), "deeper than 127 levels"),
    ] {
        let job = format!(r#"{{"kind": "k", "args": {args}}}"#);
        for call in [
            format!("SELECT {s}.enqueue_in_sequence('k', '{job}'::jsonb)"),
            format!(
                "SELECT * FROM {s}.enqueue_in_sequence_many(ARRAY['a', 'k', 'z'], \
                 ARRAY['{good}', '{job}', '{good}']::jsonb[], ARRAY['run', 'run', 'run'])"
            ),
        ] {
            let error = sqlx::query(&call)
                .execute(&db.pool)
                .await
                .expect_err(expected)
                .to_string();
            assert!(error.contains(expected), "{call}: {error}");
        }
    }
    for (key, job, policy, expected) in cases {
        let one = sqlx::query(&format!("SELECT {s}.enqueue_in_sequence($1, $2, $3)"))
            .bind(key)
            .bind(&job)
            .bind(policy)
            .execute(&db.pool)
            .await
            .expect_err(expected);
        assert!(one.to_string().contains(expected), "one: {one}");
        // the bad job between two good ones of other keys
        let many = sqlx::query(&format!(
            "SELECT * FROM {s}.enqueue_in_sequence_many($1, $2, $3)"
        ))
        .bind(vec!["a", key, "z"])
        .bind(vec![good.clone(), job.clone(), good.clone()])
        .bind(vec!["run", policy, "run"])
        .execute(&db.pool)
        .await
        .expect_err(expected);
        assert!(many.to_string().contains(expected), "many: {many}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_steps")
            .await,
        0,
        "nothing appended"
    );
    // an optional field given as null, and every field at once, are good jobs
    let unusual = vec![
        serde_json::json!({ "kind": "k", "timeout_ms": null, "traceparent": null }),
        serde_json::json!({ "kind": "k", "args": { "n": [1, { "deep": true }] }, "queue": "q2",
                            "priority": 4, "max_attempts": 3, "timeout_ms": 5000 }),
        // deeper than the quick check vouches for, within what a worker decodes
        serde_json::from_str(&format!(r#"{{"kind": "k", "args": {}}}"#, nested(120))).unwrap(),
    ];
    let appended: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT ord, job_id FROM {s}.enqueue_in_sequence_many($1, $2, $3)"
    ))
    .bind(vec!["k", "k", "k"])
    .bind(&unusual)
    .bind(vec!["run", "hold", "run"])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(appended.len(), 3);
    db.cleanup().await;
}

/// The jobs of one call that are due at once (each new key's first) go to the queue ring together,
/// in one segment, not one a key; a key's later jobs in the call wait behind its first as behind
/// any tail that has not ended, and run after it, in order.
#[tokio::test]
async fn a_calls_first_jobs_of_new_keys_are_released_together_and_the_rest_wait_behind_them() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let s = db.schema.to_string();
    // keys key-00 .. key-49, three jobs each, in key order: n = 3 * key + its place
    let keys: Vec<String> = (0..150).map(|n| format!("key-{:02}", n / 3)).collect();
    let jobs: Vec<serde_json::Value> = (0..150)
        .map(|n| serde_json::json!({ "kind": "k", "args": { "n": n } }))
        .collect();
    let segments = "SELECT count(*) FROM {s}.ready_segments";
    let before = db.scalar_i64(segments).await;
    let appended: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT ord, job_id FROM {s}.enqueue_in_sequence_many($1, $2, $3)"
    ))
    .bind(&keys)
    .bind(&jobs)
    .bind(vec!["run"; 150])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(appended.len(), 150);
    assert_eq!(
        db.scalar_i64(segments).await - before,
        1,
        "one segment for the 50 first jobs"
    );
    for place in 0..3 {
        // every job available now (a claim can stop at a segment boundary: claim until empty),
        // completed only once all are claimed
        let mut claimed = Vec::new();
        loop {
            let more = claim_ns(&storage).await;
            if more.is_empty() {
                break;
            }
            claimed.extend(more);
        }
        let mut ran: Vec<i64> = Vec::new();
        for (n, c) in &claimed {
            ran.push(*n);
            complete_one(&storage, c).await;
        }
        ran.sort_unstable();
        let expected: Vec<i64> = (0..50).map(|key| 3 * key + place).collect();
        assert_eq!(ran, expected, "each key's job {place}, and only it");
    }
    assert!(claim_ns(&storage).await.is_empty());
    db.cleanup().await;
}

/// An append reads its key's tail by key, however many steps other workflows have released: the
/// tail's released mark is one probe, not a read of every released step. In the select list of
/// the tail's lookup it was planned as a hashed subplan over the whole table once a wide workflow
/// made each workflow look large (here: a 1 -> 10,000 -> 1 fan-out, and 200 keys' heads released).
#[tokio::test]
async fn an_append_reads_only_its_keys_rows_however_many_steps_other_workflows_released() {
    let db = TestDb::new().await;
    let s = db.schema.to_string();
    let mut wide = Workflow::new().step(step("root", &[]));
    let children: Vec<String> = (0..10_000).map(|n| format!("c{n}")).collect();
    for child in &children {
        wide = wide.step(step(child, &["root"]));
    }
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    insert(&db, wide.step(step("fan-in", &names))).await;
    db.exec(
        "SELECT count(*) FROM {s}.enqueue_in_sequence_many(
             (SELECT array_agg('key-' || n::text) FROM generate_series(1, 200) n),
             (SELECT array_agg('{\"kind\": \"k\"}'::jsonb) FROM generate_series(1, 200) n),
             (SELECT array_agg('run'::text) FROM generate_series(1, 200) n))",
    )
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    let append =
        format!("SELECT {s}.enqueue_in_sequence('k', '{{\"kind\": \"k\", \"args\": {{}}}}')");
    // the key's first job (released at once), then one behind it, then one behind that
    for tail in ["none", "released", "waiting"] {
        let (before, _) = table_reads(&mut tx, &s, "workflow_released").await;
        sqlx::query(&append).execute(&mut *tx).await.unwrap();
        let (after, scans) = table_reads(&mut tx, &s, "workflow_released").await;
        assert_eq!(scans, 0, "{tail}: sequential scans of workflow_released");
        assert!(
            after - before <= 2,
            "{tail}: {} released steps read by one append",
            after - before
        );
    }
    tx.commit().await.unwrap();
    let pending: i64 = db
        .scalar_i64("SELECT count(*) FROM {s}.sequence_pending('k') WHERE state = 'pending'")
        .await;
    assert_eq!(pending, 2, "the second and third wait in order");
    db.cleanup().await;
}

#[tokio::test]
async fn a_sequence_continues_holds_or_cancels_after_a_failure_by_policy() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    support::enqueue(
        &db,
        vec![
            job(1).sequence("go-on", DependencyFailure::Run),
            job(2).sequence("go-on", DependencyFailure::Run),
            job(3).sequence("held", DependencyFailure::Run),
            job(4).sequence("held", DependencyFailure::Hold),
            job(5).sequence("held", DependencyFailure::Hold),
            job(6).sequence("stop", DependencyFailure::Run),
            job(7).sequence("stop", DependencyFailure::Cancel),
            job(8).sequence("stop", DependencyFailure::Cancel),
        ],
    )
    .await;
    let heads = claim_ns(&storage).await;
    assert_eq!(
        heads.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![1, 3, 6]
    );
    for (_, claimed) in &heads {
        fail(&storage, claimed).await;
    }
    // go-on continues; held waits for its dead-lettered head; stop cancels what waited behind
    let next = claim_ns(&storage).await;
    assert_eq!(next.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![2]);
    let ids: Vec<i64> = heads.iter().map(|(_, c)| c.job_id).collect();
    for (n, expected) in [
        (4, "pending"),
        (5, "pending"),
        (7, "cancelled"),
        (8, "cancelled"),
    ] {
        assert_eq!(
            state(&db, job_of_n(&db, n).await).await,
            expected,
            "job {n}"
        );
    }
    // the operator retries held's head; once it completes the sequence goes on in order
    assert!(storage.dlq_retry(ids[1]).await.unwrap());
    storage.promote_due(10).await.unwrap();
    let again = claim_ns(&storage).await;
    assert_eq!(again.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![3]);
    assert_eq!(complete_one(&storage, &again[0].1).await, Outcome::Applied);
    let four = claim_ns(&storage).await;
    assert_eq!(four.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![4]);
    db.cleanup().await;
}

#[tokio::test]
async fn two_producers_appending_to_one_key_at_once_keep_their_commit_order() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut first = db.pool.begin().await.unwrap();
    let a = storage
        .insert(&mut first, &in_sequence("k", 1))
        .await
        .unwrap();
    let second_storage = storage.clone();
    let pool = db.pool.clone();
    let second = tokio::spawn(async move {
        let mut tx = pool.begin().await.unwrap();
        let id = second_storage
            .insert(&mut tx, &in_sequence("k", 2))
            .await
            .unwrap();
        tx.commit().await.unwrap();
        id
    });
    // the second waits for the key's lock, held by the first until it commits
    assert!(one_waits_for_a_lock(&db).await);
    first.commit().await.unwrap();
    let b = second.await.unwrap();
    assert!(b > a);
    let heads = claim_ns(&storage).await;
    assert_eq!(heads.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1]);
    assert_eq!(complete_one(&storage, &heads[0].1).await, Outcome::Applied);
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![2]
    );
    // a job in a sequence cannot also be unique or scheduled
    let mut conn = db.pool.acquire().await.unwrap();
    let refused = storage
        .insert(
            &mut conn,
            &in_sequence("k", 3).run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("sequence"), "{refused}");
    db.cleanup().await;
}

/// One call of `enqueue_in_sequence_many`: (key, the job's `n`, policy) in order; each job's
/// position and id.
async fn append_many(db: &TestDb, calls: &[(&str, i64, &str)]) -> Vec<(i32, i64)> {
    sqlx::query_as(&format!(
        "SELECT ord, job_id FROM {}.enqueue_in_sequence_many($1, $2, $3)",
        db.schema
    ))
    .bind(calls.iter().map(|c| c.0).collect::<Vec<_>>())
    .bind(
        calls
            .iter()
            .map(|c| serde_json::json!({ "kind": "k", "args": { "n": c.1 } }))
            .collect::<Vec<_>>(),
    )
    .bind(calls.iter().map(|c| c.2).collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// One call to keys in every state: a key whose tail completed starts a new workflow and its first
/// job runs at once; a key whose tail still runs waits for it; a new key starts at once; each
/// key's second job waits for its first.
#[tokio::test]
async fn one_call_appends_to_finished_running_and_new_keys_each_by_its_tail() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(&db, vec![in_sequence("done", 1), in_sequence("busy", 2)]).await;
    let heads = claim_ns(&storage).await;
    assert_eq!(heads.len(), 2);
    let done = heads.iter().find(|(n, _)| *n == 1).unwrap();
    assert_eq!(complete_one(&storage, &done.1).await, Outcome::Applied);
    let appended = append_many(
        &db,
        &[
            ("busy", 10, "run"),
            ("busy", 11, "run"),
            ("done", 12, "run"),
            ("done", 13, "run"),
            ("new", 14, "run"),
            ("new", 15, "run"),
        ],
    )
    .await;
    assert_eq!(appended.len(), 6);
    let mut now: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    now.sort_unstable();
    assert_eq!(now, vec![12, 14], "busy's 10 waits for 2");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_sequences WHERE sequence_key = 'done'")
            .await,
        2,
        "a finished key's next burst is a workflow of its own"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(DISTINCT q.workflow_id) FROM {s}.workflow_sequences q \
             JOIN {s}.workflow_steps w ON w.workflow_id = q.workflow_id \
             WHERE q.sequence_key IN ('busy', 'new')"
        )
        .await,
        2,
        "busy appends to its workflow, new has one"
    );
    let busy = heads.iter().find(|(n, _)| *n == 2).unwrap();
    assert_eq!(complete_one(&storage, &busy.1).await, Outcome::Applied);
    let mut next: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    next.sort_unstable();
    assert_eq!(next, vec![10]);
    db.cleanup().await;
}

/// An append to several keys and a completion batch of their jobs never wait for each other in a
/// cycle. Key z's workflow is older than key a's, so key order and workflow order differ: an
/// append that took a's workflow lock and then waited for z's key would hold what a completion of
/// both heads (z's workflow, then a's) waits for, and then wait for z's workflow itself. The
/// append takes all its keys' locks first, then their workflows' in id order.
#[tokio::test]
async fn an_append_to_several_keys_and_a_completion_of_their_jobs_never_wait_in_a_cycle() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let s = db.schema.to_string();
    support::enqueue(&db, vec![in_sequence("z", 1)]).await;
    support::enqueue(&db, vec![in_sequence("a", 2)]).await;
    let heads = claim_ns(&storage).await;
    assert_eq!(heads.len(), 2);
    // another producer holds key z: the append takes key a and waits for z
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_xact_lock({s}.lock_ns('sequence'), hashtext('z'))"
    ))
    .execute(&mut *holder)
    .await
    .unwrap();
    let pool = db.pool.clone();
    let append_sql = format!(
        "SELECT ord, job_id FROM {s}.enqueue_in_sequence_many(ARRAY['a', 'z'], \
         ARRAY['{{\"kind\": \"k\", \"args\": {{\"n\": 3}}}}'::jsonb, \
               '{{\"kind\": \"k\", \"args\": {{\"n\": 4}}}}'::jsonb], ARRAY['run', 'run'])"
    );
    let append = tokio::spawn(async move {
        sqlx::query_as::<_, (i32, i64)>(&append_sql)
            .fetch_all(&pool)
            .await
    });
    assert!(one_waits_for_a_lock(&db).await);
    // the completion of both heads is not in the append's way
    let completer = storage.clone();
    let attempts: Vec<_> = heads.iter().map(|(_, c)| c.attempt_ref()).collect();
    let complete = tokio::spawn(async move { completer.complete_batch(&attempts).await });
    assert!(
        eventually(Duration::from_secs(10), || async { complete.is_finished() }).await,
        "the completion waits for a lock the append holds"
    );
    let outcomes = complete.await.unwrap().unwrap();
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Applied]);
    holder.commit().await.unwrap();
    let appended = append
        .await
        .unwrap()
        .expect("the append is not a deadlock's victim");
    assert_eq!(appended.len(), 2);
    let mut next: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    next.sort_unstable();
    assert_eq!(next, vec![3, 4]);
    db.cleanup().await;
}

#[tokio::test]
async fn a_rescued_sequence_head_holds_the_next_until_its_re_run_ends() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(&db, vec![in_sequence("k", 1), in_sequence("k", 2)]).await;
    let head = claim_ns(&storage).await.remove(0).1;
    db.advance_clock(STALE + Duration::from_secs(1)).await;
    assert_eq!(storage.rescue(STALE, 100).await.unwrap(), 1);
    assert!(
        claim_ns(&storage).await.is_empty(),
        "2 waits through the rescue"
    );
    db.advance_clock(Duration::from_secs(3600)).await;
    storage.promote_due(10).await.unwrap();
    let rerun = claim_ns(&storage).await;
    assert_eq!(rerun.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1]);
    assert_eq!(complete_one(&storage, &head).await, Outcome::Stale);
    assert_eq!(complete_one(&storage, &rerun[0].1).await, Outcome::Applied);
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![2]
    );
    db.cleanup().await;
}

/// The job id of the sequence job whose args' `n` is `n`.
async fn job_of_n(db: &TestDb, n: i64) -> i64 {
    db.scalar_i64(&format!(
        "SELECT job_id FROM {{s}}.workflow_steps WHERE (args->>'n')::int = {n}"
    ))
    .await
}

#[tokio::test]
async fn a_sequence_job_cancelled_while_it_waits_is_skipped_not_a_turn() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(
        &db,
        vec![
            in_sequence("k", 1),
            in_sequence("k", 2),
            in_sequence("k", 3),
        ],
    )
    .await;
    let head = claim_ns(&storage).await.remove(0).1;
    // the middle job is cancelled while 1 runs: 3 still waits for 1
    assert_eq!(
        storage
            .cancel_job(job_of_n(&db, 2).await, "not needed")
            .await
            .unwrap(),
        CancelOutcome::Cancelled
    );
    assert!(claim_ns(&storage).await.is_empty(), "3 runs only after 1");
    // the last waiting job is cancelled, then another is appended: it waits for 1 too
    assert_eq!(
        storage
            .cancel_job(job_of_n(&db, 3).await, "not needed")
            .await
            .unwrap(),
        CancelOutcome::Cancelled
    );
    support::enqueue(&db, vec![in_sequence("k", 4)]).await;
    assert!(claim_ns(&storage).await.is_empty(), "4 runs only after 1");
    assert_eq!(complete_one(&storage, &head).await, Outcome::Applied);
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![4]
    );
    db.cleanup().await;
}

/// An append behind a tail that was never released (here one that waits, through a skipped
/// job's edge, for the running head) knows the tail waits without asking job_state: it runs after
/// the tail, not beside it.
#[tokio::test]
async fn a_job_appended_behind_a_waiting_tail_runs_after_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    support::enqueue(
        &db,
        vec![
            in_sequence("k", 1),
            in_sequence("k", 2),
            in_sequence("k", 3),
        ],
    )
    .await;
    let head = claim_ns(&storage).await.remove(0).1;
    assert_eq!(
        storage
            .cancel_job(job_of_n(&db, 2).await, "not needed")
            .await
            .unwrap(),
        CancelOutcome::Cancelled
    );
    support::enqueue(&db, vec![in_sequence("k", 4)]).await;
    assert!(claim_ns(&storage).await.is_empty(), "3 and 4 wait for 1");
    assert_eq!(complete_one(&storage, &head).await, Outcome::Applied);
    let third = claim_ns(&storage).await;
    assert_eq!(
        third.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![3],
        "4 waits for 3"
    );
    assert_eq!(complete_one(&storage, &third[0].1).await, Outcome::Applied);
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![4]
    );
    db.cleanup().await;
}

#[tokio::test]
async fn a_dead_lettered_sequence_job_holds_its_key_until_retried_or_purged() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    support::enqueue(&db, vec![job(1).sequence("k", DependencyFailure::Hold)]).await;
    let first = claim_ns(&storage).await.remove(0).1;
    fail(&storage, &first).await;
    // retried from the dead-letter queue, then a job appended: it waits for the retried run
    assert!(storage.dlq_retry(first.job_id).await.unwrap());
    support::enqueue(&db, vec![job(2).sequence("k", DependencyFailure::Hold)]).await;
    storage.promote_due(10).await.unwrap();
    let rerun = claim_ns(&storage).await;
    assert_eq!(rerun.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1]);
    fail(&storage, &rerun[0].1).await;
    assert_eq!(state(&db, job_of_n(&db, 2).await).await, "pending");
    // its entry purged, nothing can retry it: the held job is cancelled and the key moves on
    assert_eq!(
        storage.dlq_purge(None, Some(first.job_id)).await.unwrap(),
        1
    );
    assert_eq!(state(&db, job_of_n(&db, 2).await).await, "cancelled");
    support::enqueue(&db, vec![job(3).sequence("k", DependencyFailure::Hold)]).await;
    assert_eq!(
        claim_ns(&storage)
            .await
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![3]
    );
    db.cleanup().await;
}

/// One call appends to keys in any order: each key's jobs run in the order given, whatever lies
/// between them, and a key whose tail is dead-lettered goes on, waits or cancels by the policy of
/// its first job in the call (the steps and edges of a call are written together, so its later jobs
/// must still follow a first job cancelled there).
#[tokio::test]
async fn one_call_appends_interleaved_keys_in_order_and_behind_a_dead_letter_by_policy() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    support::enqueue(
        &db,
        vec![
            job(1).sequence("dl-run", DependencyFailure::Run),
            job(2).sequence("dl-cancel", DependencyFailure::Run),
            job(3).sequence("dl-hold", DependencyFailure::Run),
        ],
    )
    .await;
    let heads = claim_ns(&storage).await;
    assert_eq!(heads.len(), 3);
    for (_, claimed) in &heads {
        fail(&storage, claimed).await;
    }
    let calls = [
        ("x", 10, "run"),
        ("dl-run", 11, "run"),
        ("y", 12, "run"),
        ("dl-cancel", 13, "cancel"),
        ("x", 14, "run"),
        ("dl-hold", 15, "hold"),
        ("dl-run", 16, "run"),
        ("y", 17, "run"),
        ("dl-cancel", 18, "run"),
        ("x", 19, "run"),
    ];
    let appended = append_many(&db, &calls).await;
    assert_eq!(
        appended.iter().map(|(ord, _)| *ord).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    assert!(
        appended.windows(2).all(|w| w[0].1 < w[1].1),
        "job ids follow the positions: {appended:?}"
    );
    // x and y start; dl-run's first goes on past its dead letter; dl-cancel's first is
    // cancelled, and the job behind it (continuing) runs in its place; dl-hold's first waits
    let mut first: Vec<(i64, ringwork::ClaimedJob)> = claim_ns(&storage).await;
    first.sort_by_key(|(n, _)| *n);
    assert_eq!(
        first.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![10, 11, 12, 18]
    );
    for (n, expected) in [
        (13, "cancelled"),
        (14, "pending"),
        (15, "pending"),
        (16, "pending"),
        (17, "pending"),
        (19, "pending"),
    ] {
        assert_eq!(
            state(&db, job_of_n(&db, n).await).await,
            expected,
            "job {n}"
        );
    }
    for (_, claimed) in &first {
        assert_eq!(complete_one(&storage, claimed).await, Outcome::Applied);
    }
    let mut second: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    second.sort_unstable();
    assert_eq!(second, vec![14, 16, 17], "each key's next, 19 behind 14");
    db.cleanup().await;
}

/// A step's release keeps its plans for the session, so they may have been made while
/// `workflow_steps` held a handful of rows. Each step must still be found by an index probe once the
/// table is large: a cached plan that scans it whole would cost every later release a pass over
/// every step of every workflow kept.
#[tokio::test]
async fn a_release_planned_on_a_small_steps_table_never_scans_it_once_large() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // this connection's session caches the release's plans with the table nearly empty
    let mut session = db.pool.acquire().await.unwrap();
    // more than five calls: past the plan cache's custom plans for a plan_cache_mode of auto
    for _ in 0..8 {
        storage
            .insert_workflow(&mut session, &Workflow::new().step(step("first", &[])))
            .await
            .unwrap();
    }
    // then the table grows, through another session
    let mut wide = Workflow::new();
    for n in 0..3000 {
        wide = wide.step(step(&format!("s{n}"), &[]));
    }
    insert(&db, wide).await;

    let mut tx = sqlx::Connection::begin(&mut *session).await.unwrap();
    let chain = Workflow::new().step(step("a", &[])).step(step("b", &["a"]));
    let inserted = storage.insert_workflow(&mut tx, &chain).await.unwrap();
    let (_, scans) = table_reads(&mut tx, db.schema.as_str(), "workflow_steps").await;
    tx.commit().await.unwrap();
    assert_eq!(scans, 0, "sequential scans of workflow_steps in one insert");
    let (pending, available) = counts_of(&storage).await;
    assert_eq!(
        (pending, available),
        (1, 3009),
        "a released at once, b waits for it: {inserted:?}"
    );
    db.cleanup().await;
}

/// On `conn`, in one transaction: claim every available job of the default queue and complete
/// them. Returns the jobs completed and the rows the workflow tables gave up meanwhile (tuples
/// read by sequential and index scans) and their sequential scans.
async fn claim_and_complete_on(
    conn: &mut sqlx::PgConnection,
    schema: &str,
) -> (Vec<i64>, i64, i64) {
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let claimed: Vec<(i32, i64, i64, i64)> = sqlx::query_as(&format!(
        "SELECT claim_slot, receipt_id, job_id, run_lease FROM {schema}.claim('default', 100)"
    ))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let completed: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT job_id FROM {schema}.complete_batch($1, $2, $3, $4) WHERE accepted"
    ))
    .bind(claimed.iter().map(|c| c.0).collect::<Vec<_>>())
    .bind(claimed.iter().map(|c| c.1).collect::<Vec<_>>())
    .bind(claimed.iter().map(|c| c.2).collect::<Vec<_>>())
    .bind(claimed.iter().map(|c| c.3).collect::<Vec<_>>())
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let (read, scans) = table_reads(&mut tx, schema, "workflow%").await;
    tx.commit().await.unwrap();
    (completed, read, scans)
}

/// The rows the tables named like `tables` gave up in this transaction so far (tuples read by
/// sequential and index scans), and their sequential scans.
async fn table_reads(conn: &mut sqlx::PgConnection, schema: &str, tables: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)::int8, \
                coalesce(sum(coalesce(seq_scan, 0)), 0)::int8 \
         FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE $2",
    )
    .bind(schema)
    .bind(tables)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Settling a completed step keeps its plans for the session too (planning them at every
/// completion was most of a workflow step's cost), so they may have been made on nearly empty
/// workflow tables. Once those hold thousands of rows, a completion must still read only the rows
/// of its own workflow.
#[tokio::test]
async fn a_settle_planned_on_small_workflow_tables_reads_only_its_workflow_once_they_are_large() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let schema = db.schema.to_string();
    let chain = || Workflow::new().step(step("a", &[])).step(step("b", &["a"]));
    // this connection's session settles a small chain first: its plans are made now
    let mut session = db.pool.acquire().await.unwrap();
    storage
        .insert_workflow(&mut session, &chain())
        .await
        .unwrap();
    for _ in 0..2 {
        let (completed, _, _) = claim_and_complete_on(&mut session, &schema).await;
        assert_eq!(completed.len(), 1);
    }
    // then a 1 -> 2,000 -> 1 workflow runs to its end through other sessions
    let mut wide = Workflow::new().step(step("root", &[]));
    let children: Vec<String> = (0..2000).map(|n| format!("c{n}")).collect();
    for child in &children {
        wide = wide.step(step(child, &["root"]));
    }
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    wide = wide.step(step("fan-in", &names));
    insert(&db, wide).await;
    let mut done = 0;
    loop {
        let claimed = storage.claim("default", 4096, None).await.unwrap();
        if claimed.is_empty() {
            break;
        }
        let refs: Vec<_> = claimed.iter().map(|c| c.attempt_ref()).collect();
        done += storage.complete_batch(&refs).await.unwrap().len();
    }
    assert_eq!(done, 2002);

    storage
        .insert_workflow(&mut session, &chain())
        .await
        .unwrap();
    let (completed, read, scans) = claim_and_complete_on(&mut session, &schema).await;
    assert_eq!(completed.len(), 1, "a");
    assert_eq!(scans, 0, "sequential scans of the workflow tables");
    // about 40 (index probes of the chain's own rows); the tables hold over 6,000
    assert!(
        read <= 100,
        "{read} rows of the workflow tables read to settle one step"
    );
    let (completed, _, _) = claim_and_complete_on(&mut session, &schema).await;
    assert_eq!(completed.len(), 1, "b, released by a");
    db.cleanup().await;
}

/// A diamond a → (b, c) → d.
fn diamond() -> Workflow {
    Workflow::new()
        .step(step("a", &[]))
        .step(step("b", &["a"]))
        .step(step("c", &["a"]))
        .step(step("d", &["b", "c"]))
}

#[tokio::test]
async fn many_workflows_in_one_call_release_their_first_steps_together_and_run_in_dependency_order()
{
    let db = TestDb::new().await;
    let storage = db.storage();
    let segments = "SELECT count(*) FROM {s}.ready_segments";
    let before = db.scalar_i64(segments).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let workflows: Vec<Workflow> = (0..30).map(|_| diamond()).collect();
    let inserted = storage
        .insert_workflows(&mut conn, &workflows)
        .await
        .unwrap();
    drop(conn);
    assert_eq!(
        db.scalar_i64(segments).await - before,
        1,
        "one segment for the 30 first steps"
    );
    assert_eq!(inserted.len(), 30);
    let mut last_job = 0;
    for pair in inserted.windows(2) {
        assert!(pair[0].workflow_id < pair[1].workflow_id, "ids in order");
    }
    for w in &inserted {
        let names: Vec<&str> = w.steps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        for (_, job_id) in &w.steps {
            assert!(*job_id > last_job, "job ids follow the order given");
            last_job = *job_id;
        }
    }
    assert_eq!(counts_of(&storage).await, (90, 30));
    // each round runs exactly every workflow's next level, and nothing of the one after: all that
    // is available is claimed (a claim can stop at a segment's end), then completed
    for level in [&["a"][..], &["b", "c"], &["d"]] {
        let mut claimed = Vec::new();
        loop {
            let more = storage.claim("default", 100, None).await.unwrap();
            if more.is_empty() {
                break;
            }
            claimed.extend(more);
        }
        let mut ran = Vec::new();
        for c in &claimed {
            let (w, name) = inserted
                .iter()
                .find_map(|w| {
                    w.steps
                        .iter()
                        .find(|(_, id)| *id == c.job_id)
                        .map(|(n, _)| (w.workflow_id, n.clone()))
                })
                .expect("a step of the call");
            ran.push((w, name));
            complete_one(&storage, c).await;
        }
        ran.sort();
        let mut expected: Vec<(i64, String)> = inserted
            .iter()
            .flat_map(|w| level.iter().map(|n| (w.workflow_id, n.to_string())))
            .collect();
        expected.sort();
        assert_eq!(ran, expected, "level {level:?}");
    }
    for w in &inserted {
        let status = storage
            .workflow_status(w.workflow_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.state, WorkflowState::Completed);
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_call_of_many_workflows_with_one_bad_is_refused_whole_with_a_clear_error() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let good = r#"[{"step": "a", "kind": "k"}, {"step": "b", "kind": "k", "depends_on": ["a"]}]"#;
    let refused = [
        (
            r#"[{"step": "a", "kind": "k"}, {"step": "a", "kind": "k"}]"#,
            "twice",
        ),
        (
            r#"[{"step": "a", "kind": "k", "depends_on": ["a"]}]"#,
            "depends on itself",
        ),
        (
            r#"[{"step": "a", "kind": "k", "depends_on": ["x"]}]"#,
            "not a step of workflow",
        ),
        (
            r#"[{"step": "a", "kind": "k", "depends_on": ["b"]}, {"step": "b", "kind": "k", "depends_on": ["a"]}]"#,
            "cycle",
        ),
        (r#"[{"step": "a"}]"#, "invalid job kind"),
        (
            r#"[{"step": "a", "kind": "k", "when": 1}]"#,
            "unknown fields",
        ),
        (r#"[]"#, "non-empty JSON array"),
        (r#"5"#, "non-empty JSON array"),
        (r#"{"step": "a", "kind": "k"}"#, "non-empty JSON array"),
    ];
    // the bad workflow between two good ones, and alone
    for (bad, expected) in refused {
        for call in [format!("[{good}, {bad}, {good}]"), format!("[{bad}]")] {
            let error = sqlx::query(&format!(
                "SELECT * FROM {}.enqueue_workflows($1::jsonb)",
                db.schema
            ))
            .bind(&call)
            .fetch_all(&db.pool)
            .await
            .unwrap_err();
            let db_error = error.as_database_error().expect("a database error");
            assert_eq!(
                db_error.code().as_deref(),
                Some("22023"),
                "{call}: {db_error}"
            );
            assert!(db_error.message().contains(expected), "{call}: {db_error}");
        }
    }
    for call in ["[]", "{}", "null"] {
        let error = sqlx::query(&format!(
            "SELECT * FROM {}.enqueue_workflows($1::jsonb)",
            db.schema
        ))
        .bind(call)
        .fetch_all(&db.pool)
        .await
        .unwrap_err();
        assert!(
            error.to_string().contains("non-empty JSON array"),
            "{call}: {error}"
        );
    }
    assert_empty(
        &db,
        &[
            "workflows",
            "workflow_steps",
            "workflow_edges",
            "ready_entries",
        ],
    )
    .await;
    // a shape the quick check does not vouch for (a timeout above 999,999,999 ms) is inserted by
    // the careful path, with each workflow's position
    let unusual = r#"[{"step": "a", "kind": "k", "timeout_ms": 2000000000}]"#;
    let rows: Vec<(i32, i64, String)> = sqlx::query_as(&format!(
        "SELECT workflow_index, workflow_id, step FROM {}.enqueue_workflows($1::jsonb)",
        db.schema
    ))
    .bind(format!("[{good}, {unusual}]"))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let shape: Vec<(i32, &str)> = rows.iter().map(|(i, _, s)| (*i, s.as_str())).collect();
    assert_eq!(shape, [(1, "a"), (1, "b"), (2, "a")]);
    assert!(rows[0].1 < rows[2].1);
    // dependencies listed after their steps: the cycle check peels the call's steps level by level,
    // and the call's two first steps go to the ring together while the two others wait
    let reversed =
        r#"[{"step": "b", "kind": "k", "depends_on": ["a"]}, {"step": "a", "kind": "k"}]"#;
    let segments = "SELECT count(*) FROM {s}.ready_segments";
    let segments_before = db.scalar_i64(segments).await;
    let counts_before = counts_of(&storage).await;
    let rows: Vec<(i32, String)> = sqlx::query_as(&format!(
        "SELECT workflow_index, step FROM {}.enqueue_workflows($1::jsonb)",
        db.schema
    ))
    .bind(format!("[{good}, {reversed}]"))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let shape: Vec<(i32, &str)> = rows.iter().map(|(i, s)| (*i, s.as_str())).collect();
    assert_eq!(shape, [(1, "a"), (1, "b"), (2, "b"), (2, "a")]);
    assert_eq!(db.scalar_i64(segments).await - segments_before, 1);
    let counts = counts_of(&storage).await;
    assert_eq!(
        (counts.0 - counts_before.0, counts.1 - counts_before.1),
        (2, 2),
        "(pending, available): each workflow's a runs, its b waits"
    );
    // through the Rust API: the workflow's position in the error, and nothing written
    let mut conn = db.pool.acquire().await.unwrap();
    let before = db
        .scalar_i64("SELECT count(*) FROM {s}.workflow_steps")
        .await;
    let error = storage
        .insert_workflows(
            &mut conn,
            &[
                diamond(),
                Workflow::new().step(step("a", &[])).step(step("a", &[])),
                diamond(),
            ],
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("workflow 2 of 3"), "{error}");
    assert!(storage
        .insert_workflows(&mut conn, &[])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.workflow_steps")
            .await,
        before
    );
    db.cleanup().await;
}

/// The workflow locks this session holds.
async fn workflow_locks_held(conn: &mut sqlx::PgConnection, schema: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' \
         AND classid = {schema}.lock_ns('workflow')::oid"
    ))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A call creates its workflows without a lock each: no other transaction can see them before it
/// commits, and an advisory lock per workflow would fill the server's shared lock table in a
/// large call. Nothing of the call exists after a rollback.
#[tokio::test]
async fn a_call_of_thousands_of_workflows_takes_no_lock_per_workflow_and_rolls_back_whole() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let workflows: Vec<Workflow> = (0..3_000)
        .map(|_| {
            Workflow::new()
                .step(step("a", &[]))
                .step(step("b", &["a"]))
                .step(step("c", &["b"]))
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    let inserted = storage.insert_workflows(&mut tx, &workflows).await.unwrap();
    assert_eq!(inserted.len(), 3_000);
    let workflow_locks = workflow_locks_held(&mut tx, db.schema.as_str()).await;
    assert_eq!(workflow_locks, 0);
    // nor does a call that goes a workflow at a time, for a shape the quick check does not vouch
    // for (a timeout above 999,999,999 ms)
    let good = r#"[{"step": "a", "kind": "k"}, {"step": "b", "kind": "k", "depends_on": ["a"]}]"#;
    let unusual = r#"[{"step": "a", "kind": "k", "timeout_ms": 2000000000}]"#;
    let mut call = vec![good; 100];
    call.push(unusual);
    let written: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.enqueue_workflows($1::jsonb)",
        db.schema
    ))
    .bind(format!("[{}]", call.join(", ")))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(written, 201);
    let workflow_locks = workflow_locks_held(&mut tx, db.schema.as_str()).await;
    assert_eq!(workflow_locks, 0, "the careful path");
    tx.rollback().await.unwrap();
    assert_empty(
        &db,
        &[
            "workflows",
            "workflow_steps",
            "workflow_edges",
            "workflow_released",
            "ready_entries",
        ],
    )
    .await;
    db.cleanup().await;
}

/// An append behind a tail whose last attempt completed, or was cancelled while it ran, knows the
/// tail is final from the tail's result alone: nothing runs such a job again. It starts a new
/// burst at once without `job_state`'s search of every plane (about 1.5 ms an append, most of a
/// sequence insert's time when keys drain between inserts).
#[tokio::test]
async fn an_append_behind_a_completed_or_cancelled_tail_starts_at_once_without_searching_the_planes(
) {
    let db = TestDb::new().await;
    let storage = db.storage();
    let s = db.schema.to_string();
    support::enqueue(&db, vec![in_sequence("done", 1), in_sequence("stopped", 2)]).await;
    let mut ran = claim_ns(&storage).await;
    ran.sort_by_key(|(n, _)| *n);
    assert_eq!(ran.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2]);
    complete_one(&storage, &ran[0].1).await;
    let stopped: String = sqlx::query_scalar(&format!("SELECT {s}.cancel_job($1, 'stop')"))
        .bind(ran[1].1.job_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(stopped, "cancelled_running");
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut *tx)
        .await
        .unwrap();
    for (key, n) in [("done", 3), ("stopped", 4)] {
        sqlx::query(&format!(
            "SELECT {s}.enqueue_in_sequence($1, jsonb_build_object('kind', 'k', 'args', jsonb_build_object('n', $2::int)))"
        ))
        .bind(key)
        .bind(n)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    let searches: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions \
         WHERE schemaname = $1 AND funcname = 'job_state'",
    )
    .bind(&s)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(searches, 0);
    tx.commit().await.unwrap();
    let mut next: Vec<i64> = claim_ns(&storage).await.iter().map(|(n, _)| *n).collect();
    next.sort_unstable();
    assert_eq!(next, [3, 4], "each starts at once, behind a final tail");
    for key in ["done", "stopped"] {
        assert_eq!(
            storage.sequence_bursts(key, 10).await.unwrap().len(),
            2,
            "{key}"
        );
    }
    db.cleanup().await;
}

/// A dead-lettered step that an operator retries and then cancels before it runs can never
/// complete: the steps held behind it are cancelled, as behind any cancelled dependency. The
/// retry's next attempt must not share the dead-lettered attempt's run lease, whose failed result
/// would hide the cancellation (a result is recorded once per run lease).
#[tokio::test]
async fn a_retried_dead_letter_cancelled_before_it_runs_cancels_the_steps_held_behind_it() {
    let db = TestDb::new().await;
    let storage = db.storage();
    dead_letter_default_queue(&storage).await;
    let s = db.schema.to_string();
    // cancelled while scheduled by the retry, and while available after its promotion
    for promoted in [false, true] {
        let w = insert(
            &db,
            Workflow::new()
                .step(step("load", &[]))
                .step(step("held", &["load"]).on_dependency_failure(DependencyFailure::Hold)),
        )
        .await;
        let id = |s: &str| w.job_id(s).unwrap();
        let load = claim_names(&storage, &w).await;
        fail(&storage, &load[0].1).await;
        assert_eq!(state(&db, id("load")).await, "dead_lettered");
        assert_eq!(state(&db, id("held")).await, "pending");
        assert!(storage.dlq_retry(id("load")).await.unwrap());
        if promoted {
            storage.promote_due(10).await.unwrap();
            assert_eq!(state(&db, id("load")).await, "available");
        }
        let cancelled: String = sqlx::query_scalar(&format!("SELECT {s}.cancel_job($1, 'no')"))
            .bind(id("load"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(cancelled, "cancelled");
        assert_eq!(
            state(&db, id("held")).await,
            "cancelled",
            "promoted: {promoted}"
        );
        let status = storage
            .workflow_status(w.workflow_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            status.state,
            WorkflowState::Cancelled,
            "promoted: {promoted}"
        );
        assert!(claim_names(&storage, &w).await.is_empty());
    }
    db.cleanup().await;
}
