//! `ringwork status` and the horizon canary against a real server: a held
//! transaction is named with its pid, a paused queue's depth is exact, and the JSON is what the
//! screen shows.

use std::process::Command;
use std::time::Duration;

use ringwork::testing::TestDatabase;
use ringwork::NewJob;
use serde_json::{json, Value};

fn status_json(db: &TestDatabase, extra: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(["status", "--json", "--database-url", db.url()])
        .args(["--schema", db.schema().as_str()])
        .args(extra)
        .output()
        .expect("run ringwork status");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

#[tokio::test]
async fn status_names_a_held_transaction_and_shows_exact_counts_of_a_paused_queue() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    let jobs: Vec<NewJob> = (0..25)
        .map(|n| NewJob::from_parts("k", json!({ "n": n })).unwrap())
        .collect();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    storage.set_queue_paused("default", true).await.unwrap();

    // a session that pins the horizon: an open transaction with an xid, as a forgotten
    // `BEGIN` in psql or a stuck request handler leaves it
    let mut holder = db.pool().acquire().await.unwrap();
    sqlx::query("SET application_name = 'horizon-holder-test'")
        .execute(&mut *holder)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN; SELECT txid_current();")
        .execute(&mut *holder)
        .await
        .unwrap();
    // real time: the holder's age is pg_stat_activity's, which the engine clock does not move
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // the library call
    let holders = storage
        .horizon_holders(Duration::from_secs(1))
        .await
        .unwrap();
    let mine = holders
        .iter()
        .find(|h| h.pid == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} not among {holders:?}"));
    assert_eq!(mine.kind, "session");
    assert_eq!(mine.holder, pid.to_string());
    assert_eq!(mine.application.as_deref(), Some("horizon-holder-test"));
    assert_eq!(mine.backend_state.as_deref(), Some("idle in transaction"));
    assert!(mine.xmin_age.is_some() && mine.held_since.is_some());
    assert!(
        storage
            .horizon_holders(Duration::from_secs(3600))
            .await
            .unwrap()
            .iter()
            .all(|h| h.pid != Some(pid)),
        "a transaction younger than min_age is not listed"
    );

    // the command
    let status = status_json(&db, &["--horizon-min-secs", "1"]);
    let queue = status["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .expect("queue default");
    assert_eq!(queue["paused"], true);
    assert_eq!(queue["available"], 25);
    assert!(
        status["horizon_holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["pid"] == pid && h["application"] == "horizon-holder-test"),
        "{status}"
    );
    let rings = status["rings"].as_array().unwrap();
    for ring in ["queue", "claim"] {
        assert_eq!(
            rings
                .iter()
                .filter(|r| r["ring"] == ring && r["state"] == "current")
                .count(),
            1,
            "{ring}: one current slot in {status}"
        );
    }

    // the transaction ends: it is gone from the report
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *holder)
        .await
        .unwrap();
    let status = status_json(&db, &["--horizon-min-secs", "1"]);
    assert!(
        status["horizon_holders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["pid"] != pid),
        "{status}"
    );
    drop(holder);
    db.drop().await.unwrap();
}

#[test]
fn status_refuses_a_zero_watch_interval() {
    let output = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "status",
            "--watch",
            "0",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/postgres",
        ])
        .output()
        .expect("run ringwork status");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--watch"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A queue whose jobs wait while no process claims from it is named, on the screen and in the
/// JSON; the default queue, claimed from, is not.
#[tokio::test]
async fn status_names_a_queue_whose_jobs_nobody_takes() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    let jobs = [
        NewJob::from_parts("k", json!({})).unwrap().queue("mail"),
        NewJob::from_parts("k", json!({})).unwrap(),
        NewJob::from_parts("k", json!({})).unwrap(),
    ];
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    db.advance_clock(Duration::from_secs(120)).await.unwrap();
    assert_eq!(storage.claim("default", 1, None).await.unwrap().len(), 1);
    let status = status_json(&db, &["--unworked-after", "60s"]);
    let unworked = status["unworked"].as_array().expect("an unworked list");
    assert_eq!(unworked.len(), 1, "{unworked:?}");
    assert_eq!(unworked[0]["queue"], "mail");
    assert_eq!(unworked[0]["available"], 1);
    let screen = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "status",
            "--unworked-after",
            "1m",
            "--database-url",
            db.url(),
        ])
        .args(["--schema", db.schema().as_str()])
        .output()
        .expect("run ringwork status");
    let screen = String::from_utf8_lossy(&screen.stdout);
    assert!(
        screen.contains("mail: 1 available, the oldest waiting 2 min, no claim in the ring"),
        "{screen}"
    );
    db.drop().await.unwrap();
}
