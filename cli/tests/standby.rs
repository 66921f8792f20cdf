//! The read-only surfaces against a hot standby: a primary and a streaming standby (throwaway
//! clusters of this test), the commands that read pointed at the standby, each saying how stale it
//! may be; a write there refused with what to do instead; and `ringwork serve` whose dashboard
//! reads the standby while its actions go to the primary.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{csrf_of, exchange};
use ringwork::embedded::EmbeddedPostgres;
use sqlx::PgPool;

fn ringwork(args: &[&str], url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(args)
        .args(["--database-url", url])
        .output()
        .expect("run ringwork")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Wait until the standby has replayed everything the primary has written so far.
async fn replayed(primary: &PgPool, standby: &PgPool) {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(primary)
        .await
        .unwrap();
    let caught_up = ringwork::testing::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), $1::pg_lsn) >= 0",
        )
        .bind(&lsn)
        .fetch_one(standby)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(caught_up, "the standby did not replay {lsn}");
}

async fn paused(primary: &PgPool, queue: &str) -> bool {
    ringwork::Admin::new(primary.clone(), "ringwork")
        .unwrap()
        .queue_counts(Some(queue))
        .await
        .unwrap()[0]
        .paused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_work_on_a_hot_standby_and_say_how_stale_they_may_be() {
    let primary = EmbeddedPostgres::start().expect("primary");
    let standby = primary.start_standby(&[]).expect("standby");
    let (p, s) = (primary.url(), standby.url());
    let migrated = ringwork(&["migrate"], &p);
    assert!(migrated.status.success(), "{}", text(&migrated.stderr));
    let primary_pool = PgPool::connect(&p).await.unwrap();
    let standby_pool = PgPool::connect(&s).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id: i64 = sqlx::query_scalar("SELECT ringwork.enqueue('default', 'report', '{}')")
            .fetch_one(&primary_pool)
            .await
            .unwrap();
        ids.push(id);
    }
    replayed(&primary_pool, &standby_pool).await;

    let job = ids[0].to_string();
    let reads: [&[&str]; 6] = [
        &["status"],
        &["counts"],
        &["job", &job],
        &["ring"],
        &["dlq", "list"],
        &["cron", "list"],
    ];
    for args in reads {
        let out = ringwork(args, &s);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("read from a hot standby: last replayed commit"),
            "{args:?} did not say it read a standby: {stderr}"
        );
    }
    let counts = text(&ringwork(&["counts"], &s).stdout);
    let row: Vec<&str> = counts
        .lines()
        .find(|l| l.starts_with("default"))
        .expect("the default queue")
        .split_whitespace()
        .collect();
    assert_eq!(row[2], "3", "available on the standby: {counts}");
    let job_line = text(&ringwork(&["job", &job], &s).stdout);
    assert!(
        job_line.starts_with(&format!("job {job}: available")),
        "{job_line}"
    );
    // on the primary: no note, and `replica` is null in the JSON
    let on_primary = ringwork(&["counts"], &p);
    assert!(!text(&on_primary.stderr).contains("hot standby"));
    let json: serde_json::Value =
        serde_json::from_slice(&ringwork(&["status", "--json"], &p).stdout).unwrap();
    assert!(json["replica"].is_null(), "{json}");
    let json: serde_json::Value =
        serde_json::from_slice(&ringwork(&["status", "--json"], &s).stdout).unwrap();
    assert!(json["replica"]["replay_age_secs"].is_number(), "{json}");
    assert_eq!(json["replica"]["replay_paused"], false);

    // a write against the standby: refused, saying where to send it
    let refused = ringwork(&["pause", "default"], &s);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("refuses writes (a hot standby, or a read-only session)"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!paused(&primary_pool, "default").await);

    // the dashboard reads the standby, and acts on the primary
    let (mut serve, addr) = common::spawn_serve(&[
        "--database-url",
        &p,
        "--read-database-url",
        &s,
        "--dashboard-behind-proxy",
        "--no-maintenance",
    ])
    .await;
    let host = addr.to_string();
    for page in [
        "/dashboard",
        "/dashboard/queues",
        "/dashboard/jobs",
        "/dashboard/dlq",
        "/dashboard/storage",
    ] {
        let (status, _, body) = exchange(addr, "GET", page, &[("Host", &host)], "").await;
        assert_eq!(status, 200, "{page}");
        assert!(
            body.contains("class=\"replica\">read from a hot standby"),
            "{page} does not say it reads a standby"
        );
    }
    let (status, _, body) = exchange(
        addr,
        "GET",
        &format!("/dashboard/jobs/{job}"),
        &[("Host", &host)],
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("report"), "the job's kind on its page");
    let (_, _, page) = exchange(addr, "GET", "/dashboard/queues", &[("Host", &host)], "").await;
    let csrf = csrf_of(&page);
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", &host), ("Origin", &format!("http://{host}"))],
        &format!("queue=default&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303, "the pause went to the primary");
    assert!(paused(&primary_pool, "default").await);
    // the pages read the standby, not the primary: with its replay paused, a job enqueued on the
    // primary since is not on them, and they say replay is paused
    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(&standby_pool)
        .await
        .unwrap();
    sqlx::query("SELECT ringwork.enqueue('default', 'fresh_kind', '{}')")
        .execute(&primary_pool)
        .await
        .unwrap();
    let (_, _, jobs) = exchange(addr, "GET", "/dashboard/jobs", &[("Host", &host)], "").await;
    assert!(jobs.contains("report"), "the jobs the standby has");
    assert!(
        !jobs.contains("fresh_kind"),
        "a job the standby has not replayed is on the page: it read the primary"
    );
    assert!(
        jobs.contains("replay is PAUSED"),
        "the page says replay is paused"
    );
    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&standby_pool)
        .await
        .unwrap();
    serve.kill().await.unwrap();

    // --read-database-url without a dashboard has nothing to read
    let alone = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(["serve", "--database-url", &p, "--read-database-url", &s])
        .output()
        .unwrap();
    assert_eq!(alone.status.code(), Some(1));
    assert!(text(&alone.stderr).contains("add --dashboard"));
    primary_pool.close().await;
    standby_pool.close().await;
}
