//! A worker process (`ringwork work`) killed with SIGKILL under load loses no job, and no attempt
//! completes twice: its claims are rescued and run by a second process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::testing::{eventually, TestDatabase};
use ringwork::NewJob;
use serde_json::json;

/// `ringwork work` in a child process; returns the child and its latest "completed N" count.
fn worker_process(db: &TestDatabase) -> (Child, Arc<AtomicU64>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "work",
            "--database-url",
            db.url(),
            "--schema",
            db.schema().as_str(),
            "--workers",
            "16",
            "--stale-after",
            "1",
            // keep every slot (and so all completion history) for the checks below: the current
            // slots are the test template's, as old as the template, so an hour is not enough
            "--rotate-every",
            "3650d",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ringwork work");
    let completed = Arc::new(AtomicU64::new(0));
    let stdout = child.stdout.take().expect("stdout");
    let seen = Arc::clone(&completed);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("completed ").and_then(|n| n.parse().ok()) {
                seen.store(n, Ordering::Relaxed);
            }
        }
    });
    (child, completed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_loses_no_job_and_no_attempt_completes_twice() {
    let db = TestDatabase::new().await.unwrap();
    let total = 3000_i64;
    let jobs: Vec<_> = (0..total)
        .map(|_| NewJob::from_parts("sleep", json!({ "ms": 5 })).unwrap())
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    let ids = db.storage().insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);

    let (mut first, first_done) = worker_process(&db);
    let progressed = eventually(Duration::from_secs(60), || {
        let done = Arc::clone(&first_done);
        async move { done.load(Ordering::Relaxed) >= 300 }
    })
    .await;
    assert!(progressed, "the first worker never got going");
    first.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix
    first.wait().unwrap();
    let in_flight_at_kill = db.storage().count_in_flight(None).await.unwrap();

    let (mut second, _) = worker_process(&db);
    let query = format!(
        "SELECT count(DISTINCT j)::int8 FROM {}.receipt_completion_batches, unnest(job_ids) j",
        db.schema()
    );
    let all_done = eventually(Duration::from_secs(120), || {
        let pool = db.pool().clone();
        let query = query.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&query)
                .fetch_one(&pool)
                .await
                .unwrap()
                == total
        }
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert!(all_done, "not every job completed after the crash");
    assert!(
        in_flight_at_kill > 0,
        "the kill left claims open (else this test proves nothing)"
    );
    assert!(
        db.scalar_i64(
            "SELECT count(*) FROM {s}.lease_claim_closure_batches WHERE outcome = 'rescued'"
        )
        .await
        .unwrap()
            > 0,
        "the dead worker's claims were rescued"
    );
    let twice = db
        .scalar_i64(
            "SELECT count(*) FROM (SELECT j, l FROM {s}.receipt_completion_batches,
                 unnest(job_ids, run_leases) AS u(j, l) GROUP BY j, l HAVING count(*) > 1) d",
        )
        .await
        .unwrap();
    assert_eq!(
        twice, 0,
        "an attempt completed twice under the same run_lease"
    );
    let completed: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT DISTINCT j FROM {}.receipt_completion_batches, unnest(job_ids) j ORDER BY j",
        db.schema()
    ))
    .fetch_all(db.pool())
    .await
    .unwrap();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(completed, expected, "every enqueued job completed");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.done_entries")
            .await
            .unwrap(),
        0,
        "none failed"
    );
    db.drop().await.unwrap();
}
