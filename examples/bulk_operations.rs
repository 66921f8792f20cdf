//! Bulk operations by filter: cancel every waiting job of one kind in a queue, in short bounded
//! transactions (at most 500 jobs each), leaving other kinds alone; `ringwork bulk cancel` does the
//! same from the command line.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example bulk_operations`

use ringwork::{BoxError, Client, JobArgs, JobFilter, JobStatus, NewJob, SchemaName};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct SendNewsletter {
    subscriber: i64,
}

impl JobArgs for SendNewsletter {
    const KIND: &'static str = "send_newsletter";
}

#[derive(Serialize, Deserialize)]
struct SendReceipt {
    order: i64,
}

impl JobArgs for SendReceipt {
    const KIND: &'static str = "send_receipt";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let schema = SchemaName::new("ringwork_example_bulk_operations")?;
    ringwork::schema::drop_schema(&pool, &schema).await?;
    // a producer only: nothing is worked, so the jobs wait
    let client = Client::builder(pool)
        .schema(schema.as_str())
        .build()
        .await?;
    let mut jobs = Vec::new();
    for n in 0..2_000 {
        jobs.push(NewJob::new(&SendNewsletter { subscriber: n })?.queue("emails"));
    }
    for n in 0..10 {
        jobs.push(NewJob::new(&SendReceipt { order: n })?.queue("emails"));
    }
    client.insert_many(&jobs).await?;

    // the newsletter was withdrawn: cancel what has not run yet
    let withdrawn = JobFilter {
        queue: Some("emails".into()),
        kind: Some(SendNewsletter::KIND.into()),
        states: vec![
            JobStatus::Available,
            JobStatus::Scheduled,
            JobStatus::Running,
        ],
        older_than: None,
    };
    let done = client
        .admin()
        .bulk_cancel(&withdrawn, "newsletter withdrawn")
        .await?;
    let counts = client.admin().queue_counts(Some("emails")).await?;
    println!(
        "cancelled {} of {} matching jobs in {} steps; still waiting: {} (the receipts)",
        done.changed, done.matched, done.steps, counts[0].available
    );
    if done.changed != 2_000 || done.steps < 4 || counts[0].available != 10 {
        return Err("expected 2,000 cancelled in steps of 500, and the 10 receipts left".into());
    }
    Ok(())
}
