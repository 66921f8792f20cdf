//! Every runnable example of the library runs against the test server and exits 0: each one checks
//! its own outcome (the job completed, the duplicate was refused, the cancel reached the handler)
//! and exits non-zero otherwise. `cargo test` builds the examples before it runs this.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::TestDb;

const EXAMPLES: [&str; 14] = [
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

#[tokio::test]
async fn every_example_runs_and_checks_its_own_outcome() {
    let db = TestDb::new().await;
    for name in EXAMPLES {
        let binary = example_binary(name);
        assert!(
            binary.exists(),
            "example {name} is not built at {}: run the whole `cargo test` (it builds the examples)",
            binary.display()
        );
        let started = Instant::now();
        let output = tokio::task::spawn_blocking({
            let url = db.url.clone();
            move || {
                Command::new(&binary)
                    .env("DATABASE_URL", url)
                    .output()
                    .expect("run the example")
            }
        })
        .await
        .unwrap();
        let took = started.elapsed();
        assert!(
            output.status.success(),
            "example {name} failed ({:?}) after {took:?}\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            took < Duration::from_secs(60),
            "example {name} took {took:?}"
        );
    }
    db.cleanup().await;
}
