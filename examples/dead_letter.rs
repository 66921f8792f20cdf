//! The dead-letter queue: with `QueueConfig::dead_letter`, a job that fails for good is held for an
//! operator instead of going to failed history; the operator inspects it, fixes the cause, and
//! retries it (`ringwork dlq list|retry|purge` on the command line).
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example dead_letter`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{BoxError, Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Webhook {
    url: String,
}

impl JobArgs for Webhook {
    const KIND: &'static str = "webhook";
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
    // the receiving end is misconfigured until the operator fixes it
    let fixed = Arc::new(AtomicBool::new(false));
    let endpoint_ok = Arc::clone(&fixed);
    let client = Client::builder(pool)
        .schema("ringwork_example_dlq")
        .queue(
            "webhooks",
            QueueConfig {
                dead_letter: true,
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, hook: Webhook| {
            let endpoint_ok = Arc::clone(&endpoint_ok);
            async move {
                if !endpoint_ok.load(Ordering::SeqCst) {
                    return Err(JobError::terminal(format!(
                        "{} answered 410 Gone",
                        hook.url
                    )));
                }
                println!("delivered to {}", hook.url);
                Ok(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let id = client
        .insert(
            NewJob::new(&Webhook {
                url: "https://example.com/hook".into(),
            })?
            .queue("webhooks"),
        )
        .await?;
    if !wait_for(&client, id, JobStatus::DeadLettered).await? {
        return Err("the job never reached the dead-letter queue".into());
    }
    let held = client.admin().dead_letters(Some("webhooks"), 10).await?;
    for dead in &held {
        println!("dead-lettered job {}: {:?}", dead.job_id, dead.error);
    }
    if !held.iter().any(|d| d.job_id == id) {
        return Err("the job is not listed in the dead-letter queue".into());
    }

    // the operator fixes the endpoint and retries the job
    fixed.store(true, Ordering::SeqCst);
    client.admin().retry_dead_letter(id).await?;
    let completed = wait_for(&client, id, JobStatus::Completed).await?;
    running.shutdown(Duration::from_secs(5)).await;
    println!("job {id} after the retry: completed = {completed}");
    if !completed {
        return Err("the retried job did not complete".into());
    }
    Ok(())
}
