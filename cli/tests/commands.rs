//! The operator commands against a real server: a name that does not exist is an error with its
//! own exit status (3), never a success that prints "not found" or quietly creates the thing;
//! destructive commands ask unless `--yes`; time flags take durations and refuse negative ones;
//! `--schema public` and a `--stale-after` that would rescue running jobs are refused.

use std::process::{Command, Output, Stdio};

use ringwork::testing::TestDatabase;
use ringwork::NewJob;
use serde_json::json;

fn ringwork(db: &TestDatabase, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(args)
        .args(["--database-url", db.url(), "--schema", db.schema().as_str()])
        // no terminal: a question is answered "no"
        .stdin(Stdio::null())
        .output()
        .expect("run ringwork")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_name_that_does_not_exist_exits_3_and_creates_nothing() {
    let db = TestDatabase::new().await.unwrap();
    for args in [
        &["job", "987654321"][..],
        &["cancel", "987654321"],
        &["dlq", "retry", "987654321"],
        &["dlq", "purge", "987654321"],
        &["counts", "--queue", "no_such_queue"],
        &["pause", "no_such_queue"],
        &["resume", "no_such_queue"],
        &["limit", "no_such_queue", "--max-running", "3"],
        &["cron", "pause", "no_such_schedule"],
        &["workflow", "show", "987654321"],
        &["workflow", "cancel", "987654321"],
    ] {
        let out = ringwork(&db, args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not found")
                || stderr(&out).contains("does not exist")
                || stderr(&out).contains("not in the dead-letter queue")
                || stderr(&out).contains("has not fired"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(db.storage().queue_names().await.unwrap().is_empty());
    assert!(db.storage().schedules().await.unwrap().is_empty());

    // --create is how a queue is made from the command line
    let out = ringwork(&db, &["pause", "mail", "--create"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(db.storage().queue_counts(Some("mail")).await.unwrap()[0].paused);
    let out = ringwork(&db, &["resume", "mail"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!db.storage().queue_counts(Some("mail")).await.unwrap()[0].paused);
    db.drop().await.unwrap();
}

#[tokio::test]
async fn an_existing_job_is_shown_and_cancelled_in_words() {
    let db = TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let inserted = db
        .storage()
        .insert_many(
            &mut conn,
            &[NewJob::from_parts("k", json!({"n": 1})).unwrap()],
        )
        .await
        .unwrap();
    drop(conn);
    let id = inserted[0].to_string();
    let out = ringwork(&db, &["job", &id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(shown["state"], "available");
    assert_eq!(shown["kind"], "k");
    let out = ringwork(&db, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("cancelled; it will not run"),
        "{}",
        stdout(&out)
    );
    let out = ringwork(&db, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("already finished"),
        "{}",
        stdout(&out)
    );
    db.drop().await.unwrap();
}

#[tokio::test]
async fn time_flags_take_durations_and_refuse_negative_ones() {
    let db = TestDatabase::new().await.unwrap();
    db.storage().set_queue_paused("mail", false).await.unwrap();
    let out = ringwork(&db, &["limit", "mail", "--rate", "10", "--per", "-5"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("negative"), "{}", stderr(&out));
    let out = ringwork(&db, &["limit", "mail", "--rate", "10", "--per", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = ringwork(&db, &["limit", "mail", "--rate", "10", "--per", "30s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("at most 10 claims per 30s"),
        "{}",
        stdout(&out)
    );
    // a bare number is still seconds
    let out = ringwork(&db, &["limit", "mail", "--rate", "10", "--per", "30"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("(unchanged)"), "{}", stdout(&out));

    // below the library's minimum, maintain would rescue jobs that are running
    let out = ringwork(&db, &["maintain", "--stale-after", "0.001"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--stale-after must be at least"),
        "{}",
        stderr(&out)
    );
    let out = ringwork(&db, &["maintain", "--stale-after", "1m"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("rescued 0"), "{}", stdout(&out));
    db.drop().await.unwrap();
}

#[tokio::test]
async fn destructive_commands_ask_and_public_is_refused() {
    let db = TestDatabase::new().await.unwrap();
    let out = ringwork(&db, &["dlq", "purge", "--all"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    let out = ringwork(&db, &["dlq", "purge", "--all", "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("purged 0"), "{}", stdout(&out));
    let out = ringwork(
        &db,
        &[
            "bulk",
            "delete",
            "--state",
            "dead_lettered",
            "--older-than",
            "7d",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));

    let out = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(["counts", "--database-url", db.url(), "--schema", "public"])
        .output()
        .expect("run ringwork");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--schema public is refused"),
        "{}",
        stderr(&out)
    );
    db.drop().await.unwrap();
}

#[tokio::test]
async fn a_workflow_is_shown_step_by_step_and_cancelled() {
    let db = TestDatabase::new().await.unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    let job = || NewJob::from_parts("k", json!({})).unwrap();
    let inserted = db
        .storage()
        .insert_workflow(
            &mut conn,
            &ringwork::Workflow::new()
                .step(ringwork::Step::new("fetch", job()))
                .step(ringwork::Step::new("report", job()).after(&["fetch"])),
        )
        .await
        .unwrap();
    drop(conn);
    let id = inserted.workflow_id.to_string();
    let out = ringwork(&db, &["workflow", "show", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("fetch\t") && text.contains("\tavailable\t"),
        "{text}"
    );
    assert!(
        text.contains("report\t") && text.contains("\tpending\t") && text.contains("\tfetch\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!("workflow {id}: running (1 pending, 1 available)")),
        "{text}"
    );
    let out = ringwork(&db, &["workflow", "show", &id, "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["steps"][1]["depends_on"], json!(["fetch"]));
    assert_eq!(shown["state"], "running");

    let out = ringwork(&db, &["workflow", "cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("2 steps cancelled"),
        "{}",
        stdout(&out)
    );
    let out = ringwork(&db, &["workflow", "show", &id, "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "cancelled");
    assert_eq!(shown["cancelled"], true);
    db.drop().await.unwrap();
}

#[tokio::test]
async fn cron_list_shows_a_declared_schedule_before_its_first_fire() {
    let db = TestDatabase::new().await.unwrap();
    let beat = ringwork::Periodic::every(
        "beat",
        std::time::Duration::from_secs(3600),
        NewJob::from_parts("tick", json!({})).unwrap(),
    )
    .unwrap();
    db.storage().declare_schedules(&[beat]).await.unwrap();
    let out = ringwork(&db, &["cron", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = stdout(&out);
    let row: Vec<&str> = listed
        .lines()
        .find(|l| l.starts_with("beat\t"))
        .unwrap_or_else(|| panic!("{listed}"))
        .split('\t')
        .collect();
    // schedule, paused, next fire, last fire, last job, fires kept, defined as
    assert_eq!(row.len(), 7, "{row:?}");
    assert_eq!(row[1], "false");
    assert!(
        chrono::DateTime::parse_from_rfc3339(row[2]).is_ok(),
        "{row:?}"
    );
    assert_eq!((row[3], row[5], row[6]), ("-", "0", "every 3600s"));

    // forget: the definition goes; a second forget finds nothing and exits 3
    let out = ringwork(&db, &["cron", "forget", "beat"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&ringwork(&db, &["cron", "list"])).contains("beat\t"));
    assert_eq!(
        ringwork(&db, &["cron", "forget", "beat"]).status.code(),
        Some(3)
    );
    db.drop().await.unwrap();
}

#[tokio::test]
async fn archive_search_is_turned_on_and_finds_a_finished_job_by_its_arguments() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let on = ringwork(&db, &["archive", "search-on"]);
    assert!(on.status.success(), "{}", stderr(&on));
    let jobs: Vec<_> = ["ada", "grace"]
        .iter()
        .map(|who| NewJob::from_parts("greet", json!({ "who": who })).unwrap())
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    let ids = storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let claimed = storage.claim("default", 10, None).await.unwrap();
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    storage
        .rotate_queue_ring(std::time::Duration::ZERO)
        .await
        .unwrap();
    let options = ringwork::QueueSlotPrune {
        lock_timeout: std::time::Duration::from_millis(250),
        keep_completed: std::time::Duration::from_secs(86_400),
        keep_failed: std::time::Duration::from_secs(86_400),
        park_idle: None,
    };
    for slot in storage.sealed_queue_slots().await.unwrap() {
        storage.prune_queue_slot_with(slot, &options).await.unwrap();
    }

    let found = ringwork(&db, &["archive", "search", r#"{"who": "grace"}"#]);
    assert!(found.status.success(), "{}", stderr(&found));
    let rows: Vec<_> = stdout(&found).lines().skip(1).map(str::to_string).collect();
    assert_eq!(rows.len(), 1, "{}", stdout(&found));
    assert!(rows[0].starts_with(&format!("{}\tcompleted\tdefault\tgreet\t1\t", ids[1])));
    let none = ringwork(
        &db,
        &[
            "archive",
            "search",
            r#"{"who": "grace"}"#,
            "--state",
            "failed",
        ],
    );
    assert!(none.status.success());
    assert_eq!(stdout(&none).lines().count(), 1, "the header only");

    let bad = ringwork(&db, &["archive", "search", "{who: grace}"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("JSON"), "{}", stderr(&bad));
    let bad = ringwork(&db, &["archive", "search", "{}", "--state", "running"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("completed, failed and cancelled"),
        "{}",
        stderr(&bad)
    );
    let off = ringwork(&db, &["archive", "search-off"]);
    assert!(off.status.success(), "{}", stderr(&off));
    let still = ringwork(&db, &["archive", "search", r#"{"who": "grace"}"#]);
    assert!(stderr(&still).contains("archive search is off"));
    assert_eq!(
        stdout(&still).lines().count(),
        2,
        "what was indexed is still found"
    );
    db.drop().await.unwrap();
}
