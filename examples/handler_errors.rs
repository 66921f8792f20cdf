//! Handler errors: `?` on any error type retries with backoff and records the error with its
//! causes; a `JobError` chooses the outcome explicitly (terminal, retry after, snooze), also from
//! inside an `anyhow` context.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example handler_errors`

use std::time::Duration;

use anyhow::Context as _;
use ringwork::{Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Import {
    path: String,
}

impl JobArgs for Import {
    const KIND: &'static str = "import";
}

async fn import(ctx: JobContext, job: Import) -> anyhow::Result<()> {
    if job.path.is_empty() {
        // will never succeed: fail now, no retries
        return Err(JobError::terminal("no file given").into());
    }
    if ctx.attempt == 1 && job.path.starts_with("s3://") {
        // not there yet: run again in a second without using an attempt
        return Err(JobError::Snooze(Duration::from_secs(1)).into());
    }
    // any other error: retried with backoff, recorded as "reading …: No such file …"
    let bytes = std::fs::read(&job.path).with_context(|| format!("reading {}", job.path))?;
    println!("imported {} bytes from {}", bytes.len(), job.path);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let client = Client::builder(pool)
        .schema("ringwork_example_errors")
        .queue("imports", QueueConfig::default())
        .register(import)
        .build()
        .await?;
    let mut ids = Vec::new();
    for path in ["/etc/hostname", "", "/no/such/file"] {
        let job = NewJob::new(&Import { path: path.into() })?
            .queue("imports")
            .max_attempts(3);
        ids.push(client.insert(job).await?);
    }
    let running = client.start().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in ids {
        println!("{:?}", client.admin().job_state(id).await?);
    }
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
