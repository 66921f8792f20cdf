//! Transactional enqueue: a job inserted inside your transaction exists only if it commits, and
//! becomes claimable the moment it does; a rolled-back one never runs. An open transaction holds
//! back only its own job (lane shards), never other producers'.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example transactional_enqueue`

use std::time::Duration;

use ringwork::{Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct WelcomeEmail {
    user_id: i64,
}

impl JobArgs for WelcomeEmail {
    const KIND: &'static str = "welcome_email";
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let client = Client::builder(pool.clone())
        .schema("ringwork_example_tx")
        .queue("mail", QueueConfig::default())
        .register(|_ctx: JobContext, job: WelcomeEmail| async move {
            println!("sending the welcome email of user {}", job.user_id);
            Ok::<(), JobError>(())
        })
        .build()
        .await?;
    let running = client.start().await?;

    // the user row and its email job commit together...
    let mut tx = pool.begin().await?;
    // (your own writes go here, on `&mut *tx`)
    client
        .insert_tx(
            &mut tx,
            NewJob::new(&WelcomeEmail { user_id: 1 })?.queue("mail"),
        )
        .await?;
    tx.commit().await?;

    // ...or not at all: this one is rolled back and never runs
    let mut tx = pool.begin().await?;
    client
        .insert_tx(
            &mut tx,
            NewJob::new(&WelcomeEmail { user_id: 2 })?.queue("mail"),
        )
        .await?;
    tx.rollback().await?;

    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = client.queue_counts(Some("mail")).await?;
    println!("mail queue: {:?}", counts.first());
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
