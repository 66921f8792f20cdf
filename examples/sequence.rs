//! A sequence: a customer's account events must apply one at a time, in the order they arrived,
//! while different customers' events run in parallel. Each job inserted with the same sequence key
//! starts only when the one inserted before it is final.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example sequence`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{BoxError, Client, DependencyFailure, JobArgs, JobContext, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct ApplyEvent {
    customer: u32,
    event: u32,
}

impl JobArgs for ApplyEvent {
    const KIND: &'static str = "apply_account_event";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let applied: Arc<Mutex<HashMap<u32, Vec<u32>>>> = Arc::default();
    let seen = Arc::clone(&applied);
    let client = Client::builder(pool)
        .schema("ringwork_example_sequence")
        .queue("default", QueueConfig::default())
        .register(move |_ctx: JobContext, e: ApplyEvent| {
            let seen = Arc::clone(&seen);
            async move {
                // a later event of the same customer would see a half-applied account if two ran
                // at once: the sequence guarantees they do not
                tokio::time::sleep(Duration::from_millis(5)).await;
                seen.lock()
                    .map_err(|_| "poisoned")?
                    .entry(e.customer)
                    .or_default()
                    .push(e.event);
                Ok::<(), BoxError>(())
            }
        })
        .build()
        .await?;

    let mut jobs = Vec::new();
    for event in 1..=5 {
        for customer in 1..=3 {
            jobs.push(
                NewJob::new(&ApplyEvent { customer, event })?
                    .sequence(&format!("customer-{customer}"), DependencyFailure::Run),
            );
        }
    }
    client.insert_many(&jobs).await?;
    let running = client.start().await?;
    for _ in 0..300 {
        let done: usize = applied
            .lock()
            .map_err(|_| "poisoned")?
            .values()
            .map(Vec::len)
            .sum();
        if done == 15 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown(Duration::from_secs(5)).await;
    let applied = applied.lock().map_err(|_| "poisoned")?.clone();
    for customer in 1..=3 {
        let order = applied.get(&customer).cloned().unwrap_or_default();
        println!("customer {customer}: events applied in order {order:?}");
        if order != vec![1, 2, 3, 4, 5] {
            return Err(format!("customer {customer}'s events ran out of order: {order:?}").into());
        }
    }
    Ok(())
}
