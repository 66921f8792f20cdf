//! A frozen or vanished maintenance leader never stops maintenance for the fleet: a leader process
//! stopped with SIGSTOP is fenced and replaced within the takeover bound (2 × stale_after), rescue
//! goes on, the old leader steps down when it wakes, and a killed leader is replaced.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringwork::testing::{eventually, TestDatabase};
use ringwork::NewJob;
use serde_json::json;

/// A child process that is killed (SIGKILL works on a stopped process too) when the test ends,
/// passed or failed, so a failed assertion never leaves a frozen leader behind.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ringwork work` with a 1-s staleness window (takeover bound 2 s), named in pg_stat_activity.
fn work_process(db: &TestDatabase, name: &str) -> Worker {
    let separator = if db.url().contains('?') { '&' } else { '?' };
    Worker(
        Command::new(env!("CARGO_BIN_EXE_ringwork"))
            .args([
                "work",
                "--database-url",
                &format!("{}{separator}application_name={name}", db.url()),
                "--schema",
                db.schema().as_str(),
                "--workers",
                "4",
                "--stale-after",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ringwork work"),
    )
}

/// The application name of the session holding this schema's maintenance leader lock.
async fn leader(db: &TestDatabase) -> Option<String> {
    sqlx::query_scalar(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid::bigint = ($1 >> 32) & 4294967295 AND l.objid::bigint = $1 & 4294967295",
    )
    .bind(ringwork::maintenance::leader_lock_key(db.schema()))
    .fetch_optional(db.pool())
    .await
    .unwrap()
}

fn signal(child: &Worker, sig: &str) {
    // the shell's built-in kill: no dependency on a procps binary
    let status = Command::new("sh")
        .args(["-c", &format!("kill {sig} {}", child.0.id())])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_fenced_and_a_killed_one_replaced_within_the_bound() {
    let db = TestDatabase::new().await.unwrap();
    let prefix = format!("rwl{}", std::process::id());
    let (name_a, name_b) = (format!("{prefix}_a"), format!("{prefix}_b"));
    let mut a = work_process(&db, &name_a);
    let a_leads = eventually(Duration::from_secs(30), || async {
        leader(&db).await.as_deref() == Some(name_a.as_str())
    })
    .await;
    assert!(a_leads, "the first process never became leader");
    let b = work_process(&db, &name_b);
    let b_up = eventually(Duration::from_secs(30), || async {
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name_b}'"
        ))
        .await
        .unwrap()
            > 0
    })
    .await;
    assert!(b_up, "the second process never connected");

    // Freeze the leader, then leave claims behind as a crashed worker would: 20 jobs of a queue
    // nobody works, claimed here and never completed.
    signal(&a, "-STOP");
    let frozen_at = Instant::now();
    let jobs: Vec<_> = (0..20)
        .map(|i| {
            NewJob::from_parts("sleep", json!({ "ms": 1, "n": i }))
                .unwrap()
                .queue("orphans")
        })
        .collect();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    assert_eq!(storage.claim("orphans", 20, None).await.unwrap().len(), 20);
    assert_eq!(storage.count_in_flight(Some("orphans")).await.unwrap(), 20);

    // stale after 1 s; the frozen leader is fenced after 2 s idle (checked every 250 ms)
    // (rescue closes them and sends them to retry; the claim ring may be pruned right after, so
    // count what is still open rather than the closure evidence)
    let all_rescued = eventually(Duration::from_secs(20), || async {
        storage.count_in_flight(Some("orphans")).await.unwrap() == 0
    })
    .await;
    let took = frozen_at.elapsed();
    assert!(
        all_rescued,
        "claims left by a dead worker were not rescued while the leader was frozen"
    );
    assert_eq!(leader(&db).await.as_deref(), Some(name_b.as_str()));
    assert!(
        took < Duration::from_secs(12),
        "rescued only after {took:?}"
    );

    // The old leader wakes: its fenced connection tells it to step down; it must not take the
    // lock back while the new leader is alive.
    signal(&a, "-CONT");
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            leader(&db).await.as_deref(),
            Some(name_b.as_str()),
            "the woken leader acted as leader again"
        );
    }
    assert!(a.0.try_wait().unwrap().is_none(), "the woken process died");

    // A leader that vanishes (SIGKILL closes its socket) is replaced at once.
    drop(b); // SIGKILL
    let a_again = eventually(Duration::from_secs(10), || async {
        leader(&db).await.as_deref() == Some(name_a.as_str())
    })
    .await;
    drop(a);
    assert!(a_again, "no process took over from the killed leader");
    db.drop().await.unwrap();
}

#[test]
fn a_command_against_a_closed_port_fails_fast_and_names_the_cause() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "counts",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/postgres",
        ])
        .output()
        .expect("run ringwork counts");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        stderr.to_lowercase().contains("refused"),
        "the error does not name the cause: {stderr}"
    );
}
