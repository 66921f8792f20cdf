//! Retry policies: a kind whose failures retry on its own exponential curve (50 ms, then 100 ms,
//! capped at 1 s, no jitter), instead of the default curve of about a second growing to an hour.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example retry_policy`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringwork::{
    BoxError, Client, JobArgs, JobContext, JobStatus, MaintenanceConfig, NewJob, QueueConfig,
    RetryPolicy,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct CallFlakyApi {}

impl JobArgs for CallFlakyApi {
    const KIND: &'static str = "call_flaky_api";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let client = Client::builder(pool)
        .schema("ringwork_example_retry_policy")
        // due retries move back to the queue every maintenance tick
        .maintenance(MaintenanceConfig {
            tick: Duration::from_millis(50),
            ..MaintenanceConfig::default()
        })
        .queue("default", QueueConfig::default())
        .retry_policy::<CallFlakyApi>(RetryPolicy::exponential(
            Duration::from_millis(50),
            2.0,
            Duration::from_secs(1),
            0.0,
        ))
        .register(move |ctx: JobContext, _job: CallFlakyApi| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?
                    .push(Instant::now());
                if ctx.attempt < 3 {
                    // any error type: it retries on the kind's policy
                    return Err(std::io::Error::other("the API timed out"));
                }
                Ok(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let id = client.insert(NewJob::new(&CallFlakyApi {})?).await?;
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
    let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "job {id}: {state:?} after {} runs; gaps between runs: {gaps:?}",
        runs.len()
    );
    // the gaps are the policy's delays (50 ms, 100 ms) plus up to a tick or two of promotion
    let on_curve = gaps.len() == 2
        && gaps[0] >= Duration::from_millis(50)
        && gaps[1] >= Duration::from_millis(100)
        && gaps.iter().all(|g| *g < Duration::from_millis(900));
    if state != Some(JobStatus::Completed) || !on_curve {
        return Err("expected two quick retries on the kind's curve, then a completion".into());
    }
    Ok(())
}
