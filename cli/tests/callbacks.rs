//! External callbacks from outside the process: `POST /callbacks/<id>/<action>` on
//! `ringwork serve`, and `ringwork callback`, against jobs that wait in the lease ring.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use ringwork::testing::TestDatabase;
use ringwork::{JobStatus, Storage};

async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    common::post(addr, path, &[], "application/json", body).await
}

async fn waiting_job(db: &TestDatabase, storage: &Storage) -> (i64, String) {
    let mut conn = db.pool().acquire().await.unwrap();
    let (claimed, id) = ringwork::testing::waiting_for_callback(
        &storage.clone().into(),
        &mut conn,
        "default",
        25,
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    (claimed.job_id, id)
}

#[tokio::test]
async fn callbacks_over_http_and_the_command_line_end_waits_and_refuse_bad_ids() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let (completed, completed_id) = waiting_job(&db, &storage).await;
    let (resumed, resumed_id) = waiting_job(&db, &storage).await;
    let (by_cli, cli_id) = waiting_job(&db, &storage).await;
    let (_serve, addr) = common::spawn_serve(&[
        "--no-maintenance",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await;

    let (status, body) = post(addr, &format!("/callbacks/{completed_id}/complete"), "").await;
    assert_eq!(
        (status, body.contains("\"applied\"")),
        (200, true),
        "{body}"
    );
    assert_eq!(
        storage.job_state(completed).await.unwrap().unwrap().state,
        JobStatus::Completed
    );
    // the same id again: the wait is over
    let (status, body) = post(addr, &format!("/callbacks/{completed_id}/complete"), "").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no such wait"), "{body}");
    // a forged id (another signature), a malformed one, a bad action, a bad body
    let forged = format!("{}{}", &resumed_id[..32], "0".repeat(32));
    let (status, body) = post(addr, &format!("/callbacks/{forged}/complete"), "").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("signature"), "{body}");
    let (status, _) = post(addr, "/callbacks/not-an-id/complete", "").await;
    assert_eq!(status, 400);
    let (status, body) = post(addr, &format!("/callbacks/{resumed_id}/explode"), "").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(
        addr,
        &format!("/callbacks/{resumed_id}/resume"),
        "{\"payload\": ",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        storage.job_state(resumed).await.unwrap().unwrap().state,
        JobStatus::Waiting,
        "refused callbacks changed nothing"
    );
    // heartbeat, then resume with a payload
    let (status, body) = post(
        addr,
        &format!("/callbacks/{resumed_id}/heartbeat"),
        "{\"extend_secs\": 3600}",
    )
    .await;
    assert_eq!((status, body.contains("extended")), (200, true), "{body}");
    let (status, body) = post(
        addr,
        &format!("/callbacks/{resumed_id}/resume"),
        "{\"payload\": {\"approved\": true}}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        storage.job_state(resumed).await.unwrap().unwrap().state,
        JobStatus::Scheduled,
        "resumed: due again without using an attempt"
    );

    // the command line
    let run = |args: Vec<String>| {
        let url = db.url().to_string();
        let schema = db.schema().as_str().to_string();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_ringwork"))
                .arg("callback")
                .args(args)
                .args(["--database-url", &url, "--schema", &schema])
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(vec![
        "fail".into(),
        cli_id.clone(),
        "--error".into(),
        "declined by a human".into(),
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "applied");
    let failed = storage.job_state(by_cli).await.unwrap().unwrap();
    assert_eq!(failed.state, JobStatus::Failed);
    assert_eq!(failed.detail.as_deref(), Some("declined by a human"));
    let out = run(vec!["complete".into(), cli_id]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such wait"));
    let out = run(vec![
        "resume".into(),
        "0".repeat(64),
        "--payload".into(),
        "not json".into(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--payload is not JSON"));
    db.drop().await.unwrap();
}
