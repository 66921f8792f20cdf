//! The operator API (`ringwork::Admin`): what the command line, the dashboard and an operator's
//! script do to a schema, through one handle that never reaches into the engine's paths.

mod support;

use std::time::Duration;

use ringwork::{
    Admin, CancelOutcome, Error, JobFilter, JobStatus, MaintenanceConfig, NewJob, Outcome,
};
use serde_json::json;
use support::{complete_one, enqueue, job, TestDb};

#[tokio::test]
async fn an_operator_pauses_cancels_retries_and_reads_health_through_one_handle() {
    let db = TestDb::new().await;
    assert!(
        matches!(
            Admin::new(db.pool.clone(), "bad name"),
            Err(Error::InvalidName { .. })
        ),
        "a schema name is checked before anything runs"
    );
    let admin = Admin::new(db.pool.clone(), db.schema.as_str()).unwrap();
    let ids = enqueue(&db, vec![job(1), job(2), job(3)]).await;

    // a queue paused through the handle is not claimed from, and counts say so
    assert!(admin.set_queue_paused("default", true).await.unwrap());
    assert!(db
        .storage()
        .claim("default", 10, None)
        .await
        .unwrap()
        .is_empty());
    let counts = admin.queue_counts(Some("default")).await.unwrap();
    assert_eq!((counts[0].paused, counts[0].available), (true, 3));
    assert_eq!(admin.queue_names().await.unwrap(), ["default"]);

    // one job cancelled by id, the rest by filter
    assert_eq!(
        admin.cancel_job(ids[0], "operator").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        admin.job_state(ids[0]).await.unwrap().unwrap().state,
        JobStatus::Cancelled
    );
    let filter = JobFilter {
        queue: Some("default".into()),
        kind: None,
        states: vec![JobStatus::Available],
        older_than: None,
    };
    let bulk = admin.bulk_cancel(&filter, "operator").await.unwrap();
    assert_eq!(bulk.changed, 2, "{bulk:?}");
    let counts = admin.queue_counts(Some("default")).await.unwrap();
    assert_eq!((counts[0].available, counts[0].cancelled), (0, 3));

    // a scheduled job is made due now; retry of a finished job changes nothing
    let later = db
        .client()
        .build()
        .await
        .unwrap()
        .insert(
            NewJob::from_parts("noop", json!({}))
                .unwrap()
                .run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    assert!(admin.retry_job(later).await.unwrap(), "scheduled: due now");
    assert!(
        !admin.retry_job(ids[0]).await.unwrap(),
        "cancelled: history stays"
    );
    assert!(admin.set_queue_paused("default", false).await.unwrap());
    let report = admin
        .run_maintenance(&MaintenanceConfig::default())
        .await
        .unwrap();
    assert_eq!(
        report.promoted, 1,
        "the retried job was promoted: {report:?}"
    );

    // schedules and health
    assert!(admin.trigger_schedule("nightly").await.unwrap());
    assert!(
        !admin.trigger_schedule("nightly").await.unwrap(),
        "one pending trigger at a time"
    );
    assert!(admin.dead_letters(None, 10).await.unwrap().is_empty());
    assert!(!admin.retry_dead_letter(ids[1]).await.unwrap());
    let readiness = admin.readiness().await;
    assert!(
        readiness.migrated && readiness.functions_current,
        "{readiness:?}"
    );
    assert!(!admin.ring_slots().await.unwrap().is_empty());
    assert!(admin
        .table_health()
        .await
        .unwrap()
        .iter()
        .any(|t| t.table_name == "ready_entries"));
    assert!(admin
        .horizon_holders(Duration::from_secs(3600))
        .await
        .unwrap()
        .is_empty());
    db.cleanup().await;
}

fn names(unworked: &[ringwork::UnworkedQueue]) -> Vec<&str> {
    unworked.iter().map(|u| u.queue.as_str()).collect()
}

/// A queue whose jobs wait while nobody claims from it is named; one that is claimed from but
/// behind, a paused one, and one whose jobs just arrived are not.
#[tokio::test]
async fn queues_with_waiting_jobs_that_nobody_claims_are_named() {
    let db = TestDb::new().await;
    let admin = Admin::new(db.pool.clone(), db.schema.as_str()).unwrap();
    let storage = db.storage();
    enqueue(
        &db,
        vec![
            job(1).queue("mail"),
            job(2).queue("mail"),
            job(3).queue("busy"),
            job(4).queue("busy"),
            job(5).queue("held"),
        ],
    )
    .await;
    assert!(admin.set_queue_paused("held", true).await.unwrap());
    let idle = Duration::from_secs(300);
    assert!(
        admin.unworked_queues(idle).await.unwrap().is_empty(),
        "jobs that just arrived are not a sign of anything"
    );
    db.advance_clock(Duration::from_secs(600)).await;
    // "busy" is claimed from now, so its remaining job is merely behind
    let busy = storage.claim("busy", 1, None).await.unwrap();
    assert_eq!(busy.len(), 1);
    let unworked = admin.unworked_queues(idle).await.unwrap();
    assert_eq!(names(&unworked), ["mail"], "{unworked:?}");
    assert_eq!(unworked[0].available, 2);
    assert!(unworked[0].oldest_wait >= Duration::from_secs(600));
    assert_eq!(unworked[0].last_claim_age, None, "never claimed");
    // a process starts working it
    let mail = storage.claim("mail", 1, None).await.unwrap();
    assert_eq!(mail.len(), 1);
    assert!(admin.unworked_queues(idle).await.unwrap().is_empty());
    // a queue with a job running is worked, however long ago its last claim
    db.advance_clock(Duration::from_secs(600)).await;
    assert!(admin.unworked_queues(idle).await.unwrap().is_empty());
    // then every worker finishes and stops: both queues' last claims are past the bound
    for claimed in busy.iter().chain(&mail) {
        assert_eq!(complete_one(&storage, claimed).await, Outcome::Applied);
    }
    let unworked = admin.unworked_queues(idle).await.unwrap();
    assert_eq!(names(&unworked), ["busy", "mail"], "{unworked:?}");
    assert!(unworked.iter().all(|u| u
        .last_claim_age
        .is_some_and(|age| age >= Duration::from_secs(600))));
    db.cleanup().await;
}
