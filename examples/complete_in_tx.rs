//! Completing a job inside your own transaction: the handler's effect (an invoice row) and the
//! job's completion commit together or not at all, so a crash between the two can neither lose
//! the effect of a completed job nor leave an effect whose job runs again.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example complete_in_tx`

use std::time::Duration;

use ringwork::{BoxError, Client, JobArgs, JobContext, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct IssueInvoice {
    order_id: i64,
}

impl JobArgs for IssueInvoice {
    const KIND: &'static str = "issue_invoice";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS ringwork_example_complete;
         CREATE TABLE IF NOT EXISTS ringwork_example_complete.invoices (
             order_id bigint PRIMARY KEY, job_id bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let handler_pool = pool.clone();
    let client = Client::builder(pool.clone())
        .schema("ringwork_example_complete")
        .queue("billing", QueueConfig::default())
        .register(move |ctx: JobContext, job: IssueInvoice| {
            let pool = handler_pool.clone();
            async move {
                let mut tx = pool.begin().await?;
                sqlx::query(
                    "INSERT INTO ringwork_example_complete.invoices (order_id, job_id)
                     VALUES ($1, $2) ON CONFLICT (order_id) DO NOTHING",
                )
                .bind(job.order_id)
                .bind(ctx.job_id)
                .execute(&mut *tx)
                .await?;
                // the completion joins the transaction; `?` rolls both back if this attempt was
                // rescued or cancelled meanwhile (Error::Stale)
                ctx.complete_in(&mut tx).await?;
                tx.commit().await?;
                Ok::<(), BoxError>(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;

    let order_id = rand_order_id();
    let job_id = client
        .insert(NewJob::new(&IssueInvoice { order_id })?.queue("billing"))
        .await?;
    let mut state = None;
    for _ in 0..200 {
        state = client.admin().job_state(job_id).await?.map(|s| s.state);
        if state == Some(JobStatus::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let invoiced: Option<i64> = sqlx::query_scalar(
        "SELECT job_id FROM ringwork_example_complete.invoices WHERE order_id = $1",
    )
    .bind(order_id)
    .fetch_optional(&pool)
    .await?;
    running.shutdown(Duration::from_secs(5)).await;
    println!("job {job_id}: {state:?}; invoice of order {order_id} written by job {invoiced:?}");
    if state != Some(JobStatus::Completed) || invoiced != Some(job_id) {
        return Err("the job and its invoice did not commit together".into());
    }
    Ok(())
}

fn rand_order_id() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(1)
}
