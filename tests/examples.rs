//! Every runnable example of the library runs against the test server and exits 0: each one checks
//! its own outcome (the job completed, the duplicate was refused, the cancel reached the handler)
//! and exits non-zero otherwise. `cargo test` builds the examples before it runs this.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::TestDb;

const EXAMPLES: [&str; 17] = [
    "transactional_enqueue",
    "handler_errors",
    "complete_in_tx",
    "unique_jobs",
    "snooze",
    "cancel",
    "dead_letter",
    "progress",
    "periodic",
    "queue_limits",
    "retry_policy",
    "bulk_operations",
    "approval",
    "axum_service",
    "workflow",
    "batch",
    "sequence",
];

fn example_binary(name: &str) -> PathBuf {
    // this test runs from target/<profile>/deps; cargo puts examples in target/<profile>/examples
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    profile_dir.join("examples").join(name)
}

/// The examples run three at a time (each lives in a schema of its own): most of their time is
/// spent waiting on the server, so running them one after another only adds their waits up.
#[tokio::test]
async fn every_example_runs_and_checks_its_own_outcome() {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let failures = tokio::task::spawn_blocking(move || {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failures = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(name) = EXAMPLES.get(index) else {
                        return;
                    };
                    if let Err(failure) = run_example(name, &url) {
                        failures.lock().expect("failures").push(failure);
                    }
                });
            }
        });
        failures.into_inner().expect("failures")
    })
    .await
    .expect("the examples' runner");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    db.cleanup().await;
}

/// Run one example to its end: an error names it, with its exit status and output.
fn run_example(name: &str, url: &str) -> Result<(), String> {
    let binary = example_binary(name);
    if !binary.exists() {
        return Err(format!(
            "example {name} is not built at {}: run the whole `cargo test` (it builds the examples)",
            binary.display()
        ));
    }
    let started = Instant::now();
    let output = Command::new(&binary)
        .env("DATABASE_URL", url)
        .output()
        .map_err(|e| format!("example {name} did not start: {e}"))?;
    let took = started.elapsed();
    if !output.status.success() {
        return Err(format!(
            "example {name} failed ({:?}) after {took:?}\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    if took >= Duration::from_secs(60) {
        return Err(format!("example {name} took {took:?}"));
    }
    Ok(())
}
