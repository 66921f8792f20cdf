//! A batch: resize every image of an album, then notify once, when all are done, with how many
//! made it. One image is broken and fails for good; the callback still runs and says so.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example batch`

use std::time::Duration;

use ringwork::{Batch, BoxError, Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Resize {
    image: u32,
}

impl JobArgs for Resize {
    const KIND: &'static str = "resize_image";
}

#[derive(Serialize, Deserialize)]
struct Notify {
    album: u32,
}

impl JobArgs for Notify {
    const KIND: &'static str = "notify_album";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(u32, i64, i64)>();
    let client = Client::builder(pool)
        .schema("ringwork_example_batch")
        .queue("default", QueueConfig::default())
        .register(|_ctx: JobContext, job: Resize| async move {
            if job.image == 3 {
                return Err(JobError::terminal("image 3 is not an image"));
            }
            Ok(())
        })
        .register(move |ctx: JobContext, job: Notify| {
            let done_tx = done_tx.clone();
            async move {
                let counts = ctx
                    .workflow_counts()
                    .await?
                    .ok_or("a batch callback knows its batch")?;
                println!(
                    "album {}: {} resized, {} failed",
                    job.album, counts.completed, counts.failed
                );
                let _ = done_tx.send((job.album, counts.completed, counts.failed));
                Ok::<(), BoxError>(())
            }
        })
        .build()
        .await?;

    let mut batch = Batch::new();
    for image in 1..=5 {
        batch = batch.member(NewJob::new(&Resize { image })?);
    }
    let inserted = client
        .insert_batch(batch.callback(NewJob::new(&Notify { album: 7 })?))
        .await?;
    println!(
        "batch {}: {} members, callback job {:?}",
        inserted.batch_id,
        inserted.members.len(),
        inserted.callback
    );

    let running = client.start().await?;
    let (album, completed, failed) = tokio::time::timeout(Duration::from_secs(30), done_rx.recv())
        .await?
        .ok_or("the callback never ran")?;
    running.shutdown(Duration::from_secs(5)).await;
    if (album, completed, failed) != (7, 4, 1) {
        return Err(format!(
            "expected album 7 with 4 resized and 1 failed, got {album}, {completed}, {failed}"
        )
        .into());
    }
    Ok(())
}
