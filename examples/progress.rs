//! Progress and resumable work: a handler records how far it got with a checkpoint; when its
//! attempt is cut off (here: a simulated dropped connection), the next attempt resumes from the
//! checkpoint instead of starting over.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example progress`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{BoxError, Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct CopyRows {
    total: u64,
}

impl JobArgs for CopyRows {
    const KIND: &'static str = "copy_rows";
}

const CHUNK: u64 = 100;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    // the chunks copied, over all attempts: each should be copied once
    let copied: Arc<Mutex<Vec<u64>>> = Arc::default();
    let log = Arc::clone(&copied);
    let client = Client::builder(pool)
        .schema("ringwork_example_progress")
        .queue("etl", QueueConfig::default())
        .register(move |ctx: JobContext, job: CopyRows| {
            let log = Arc::clone(&log);
            async move {
                let mut next = match ctx.last_progress().await? {
                    Some(p) => {
                        println!(
                            "attempt {} resumes: {:.0} % ({})",
                            ctx.attempt, p.progress.percent, p.progress.message
                        );
                        p.progress
                            .checkpoint
                            .and_then(|c| c["next_row"].as_u64())
                            .unwrap_or(0)
                    }
                    None => 0,
                };
                while next < job.total {
                    if ctx.attempt == 1 && next == 400 {
                        // the checkpoint written so far survives the failed attempt
                        return Err(JobError::RetryAfter(
                            Duration::from_millis(100),
                            "connection to the source dropped".into(),
                        )
                        .into());
                    }
                    log.lock().map_err(|_| "poisoned")?.push(next);
                    next += CHUNK;
                    let percent = 100.0 * next as f64 / job.total as f64;
                    ctx.set_progress(
                        percent,
                        &format!("copied {next} of {} rows", job.total),
                        Some(json!({ "next_row": next })),
                    )?;
                }
                Ok::<(), BoxError>(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let id = client
        .insert(NewJob::new(&CopyRows { total: 1000 })?.queue("etl"))
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
    let copied = copied.lock().map_err(|_| "poisoned")?.clone();
    println!("job {id}: {state:?}; chunks copied: {copied:?}");
    let each_once = copied == (0..10).map(|i| i * CHUNK).collect::<Vec<_>>();
    if state != Some(JobStatus::Completed) || !each_once {
        return Err("expected every chunk copied exactly once across two attempts".into());
    }
    Ok(())
}
