//! Cancel: a scheduled job cancelled before its time never runs; a running job's claim is closed
//! and its handler told to stop (`ctx.cancelled()`), and whatever it returns then changes nothing.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example cancel`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{
    BoxError, CancelOutcome, Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Export {
    rows: u64,
}

impl JobArgs for Export {
    const KIND: &'static str = "export";
}

async fn wait_for(client: &Client, id: i64, want: JobStatus) -> ringwork::Result<bool> {
    for _ in 0..200 {
        if client.admin().job_state(id).await?.map(|s| s.state) == Some(want) {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(false)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stopped);
    let client = Client::builder(pool)
        .schema("ringwork_example_cancel")
        .queue("exports", QueueConfig::default())
        .register(move |ctx: JobContext, job: Export| {
            let flag = Arc::clone(&flag);
            async move {
                for chunk in 0..job.rows / 1000 {
                    tokio::select! {
                        _ = ctx.cancelled() => {
                            println!("export cancelled at chunk {chunk}: stopping");
                            flag.store(true, Ordering::SeqCst);
                            return Ok(());
                        }
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;

    // a job scheduled for tomorrow, cancelled today: it never runs
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let scheduled = client
        .insert(
            NewJob::new(&Export { rows: 1000 })?
                .queue("exports")
                .run_at(tomorrow),
        )
        .await?;
    let outcome = client.cancel(scheduled).await?;
    println!("cancelling scheduled job {scheduled}: {outcome:?}");

    // a long export, cancelled while it runs
    let long = client
        .insert(NewJob::new(&Export { rows: 1_000_000 })?.queue("exports"))
        .await?;
    if !wait_for(&client, long, JobStatus::Running).await? {
        return Err("the export never started".into());
    }
    let running_outcome = client.cancel(long).await?;
    println!("cancelling running job {long}: {running_outcome:?}");
    let cancelled = wait_for(&client, long, JobStatus::Cancelled).await?;
    for _ in 0..200 {
        if stopped.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown(Duration::from_secs(5)).await;
    if outcome != CancelOutcome::Cancelled
        || running_outcome != CancelOutcome::CancelledRunning
        || !cancelled
        || !stopped.load(Ordering::SeqCst)
    {
        return Err("expected both jobs cancelled and the running handler told to stop".into());
    }
    Ok(())
}
