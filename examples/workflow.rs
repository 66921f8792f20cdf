//! A workflow: fetch a day's orders, price each region in parallel, then write one report that
//! reads every region's total. The report runs once, after all regions are final; a region that
//! fails for good cancels the report (the default policy).
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example workflow`

use std::time::Duration;

use ringwork::{
    BoxError, Client, JobArgs, JobContext, NewJob, QueueConfig, Step, Workflow, WorkflowState,
};
use serde::{Deserialize, Serialize};

const REGIONS: [&str; 3] = ["north", "south", "west"];

#[derive(Serialize, Deserialize)]
struct Fetch {
    day: String,
}

impl JobArgs for Fetch {
    const KIND: &'static str = "fetch_orders";
}

#[derive(Serialize, Deserialize)]
struct Price {
    region: String,
}

impl JobArgs for Price {
    const KIND: &'static str = "price_region";
}

#[derive(Serialize, Deserialize)]
struct Report {}

impl JobArgs for Report {
    const KIND: &'static str = "write_report";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let (report_tx, mut report_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let client = Client::builder(pool)
        .schema("ringwork_example_workflow")
        .queue("default", QueueConfig::default())
        .register(|ctx: JobContext, fetch: Fetch| async move {
            // what the dependents read: the orders per region
            let orders: Vec<(String, u64)> = REGIONS
                .iter()
                .enumerate()
                .map(|(i, r)| (r.to_string(), 10 * (i as u64 + 1)))
                .collect();
            println!("fetched orders of {}", fetch.day);
            ctx.set_workflow_output(&orders).await?;
            Ok::<(), BoxError>(())
        })
        .register(|ctx: JobContext, price: Price| async move {
            let orders: Vec<(String, u64)> =
                ctx.workflow_output("fetch").await?.unwrap_or_default();
            let count = orders
                .iter()
                .find(|(r, _)| *r == price.region)
                .map(|(_, n)| *n)
                .unwrap_or(0);
            ctx.set_workflow_output(&(count * 25)).await?;
            Ok::<(), BoxError>(())
        })
        .register(move |ctx: JobContext, _: Report| {
            let report_tx = report_tx.clone();
            async move {
                let mut total = 0;
                for region in REGIONS {
                    total += ctx
                        .workflow_output::<u64>(&format!("price-{region}"))
                        .await?
                        .unwrap_or(0);
                }
                println!("report: {total} in sales");
                let _ = report_tx.send(total);
                Ok::<(), BoxError>(())
            }
        })
        .build()
        .await?;

    let mut workflow = Workflow::new().step(Step::new(
        "fetch",
        NewJob::new(&Fetch {
            day: "2026-12-05".into(),
        })?,
    ));
    let prices: Vec<String> = REGIONS.iter().map(|r| format!("price-{r}")).collect();
    for (region, name) in REGIONS.iter().zip(&prices) {
        workflow = workflow.step(
            Step::new(
                name,
                NewJob::new(&Price {
                    region: region.to_string(),
                })?,
            )
            .after(&["fetch"]),
        );
    }
    let names: Vec<&str> = prices.iter().map(String::as_str).collect();
    workflow = workflow.step(Step::new("report", NewJob::new(&Report {})?).after(&names));
    let inserted = client.insert_workflow(workflow).await?;
    println!(
        "workflow {} with {} steps",
        inserted.workflow_id,
        inserted.steps.len()
    );

    let running = client.start().await?;
    let total = tokio::time::timeout(Duration::from_secs(30), report_rx.recv())
        .await?
        .ok_or("the report never ran")?;
    // the report's own completion is flushed after it returns: wait for the workflow to say so
    let mut status = client.admin().workflow(inserted.workflow_id).await?;
    for _ in 0..100 {
        if status.as_ref().map(|s| s.state) == Some(WorkflowState::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = client.admin().workflow(inserted.workflow_id).await?;
    }
    running.shutdown(Duration::from_secs(5)).await;
    let status = status.ok_or("the workflow is gone")?;
    for step in &status.steps {
        println!("  {:<12} {}", step.step, step.state);
    }
    if total != (10 + 20 + 30) * 25 || status.state != WorkflowState::Completed {
        return Err(format!(
            "expected 1500 and a completed workflow, got {total} and {:?}",
            status.state
        )
        .into());
    }
    println!("workflow {}: {}", status.workflow_id, status.state.as_str());
    Ok(())
}
