//! Snooze: a handler that finds its job not ready yet asks to run again later without using an
//! attempt (`JobError::Snooze`). The next run has the same `ctx.attempt` and a higher `run_lease`.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example snooze`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{BoxError, Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct PublishReport {
    report_id: i64,
}

impl JobArgs for PublishReport {
    const KIND: &'static str = "publish_report";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let runs: Arc<Mutex<Vec<(i32, i64)>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let client = Client::builder(pool)
        .schema("ringwork_example_snooze")
        .queue("reports", QueueConfig::default())
        .register(move |ctx: JobContext, job: PublishReport| {
            let seen = Arc::clone(&seen);
            async move {
                let first = {
                    let mut seen = seen.lock().map_err(|_| JobError::terminal("poisoned"))?;
                    seen.push((ctx.attempt, ctx.run_lease));
                    seen.len() == 1
                };
                if first {
                    println!(
                        "report {} is not rendered yet: snoozing for 200 ms",
                        job.report_id
                    );
                    return Err(JobError::Snooze(Duration::from_millis(200)));
                }
                println!("publishing report {}", job.report_id);
                Ok(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let id = client
        .insert(NewJob::new(&PublishReport { report_id: 7 })?.queue("reports"))
        .await?;
    let mut state = None;
    for _ in 0..200 {
        state = client.admin().job_state(id).await?.map(|s| s.state);
        if state == Some(JobStatus::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown(Duration::from_secs(5)).await;
    let runs = runs.lock().map_err(|_| "poisoned")?.clone();
    println!("job {id}: {state:?}; runs as (attempt, run_lease): {runs:?}");
    if state != Some(JobStatus::Completed) || runs.len() != 2 || runs[0].0 != runs[1].0 {
        return Err("expected one snooze, then a completion on the same attempt".into());
    }
    Ok(())
}
