//! Periodic jobs: a schedule every second and a yearly cron schedule in a time zone, fired once per
//! fire time across every process that declares them; the yearly one is fired now by a trigger
//! (`Admin::trigger_schedule`, what `ringwork cron trigger` does).
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example periodic`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringwork::{
    BoxError, Client, JobArgs, JobContext, JobError, MaintenanceConfig, NewJob, Periodic,
    QueueConfig,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct RefreshRates {}

impl JobArgs for RefreshRates {
    const KIND: &'static str = "refresh_rates";
}

#[derive(Serialize, Deserialize)]
struct AnnualReport {}

impl JobArgs for AnnualReport {
    const KIND: &'static str = "annual_report";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let refreshed = Arc::new(AtomicUsize::new(0));
    let reported = Arc::new(AtomicUsize::new(0));
    let (r, a) = (Arc::clone(&refreshed), Arc::clone(&reported));
    let client = Client::builder(pool)
        .schema("ringwork_example_periodic")
        // schedules are evaluated every maintenance tick
        .maintenance(MaintenanceConfig {
            tick: Duration::from_millis(200),
            ..MaintenanceConfig::default()
        })
        .queue("default", QueueConfig::default())
        .periodic(Periodic::every(
            "refresh_rates",
            Duration::from_secs(1),
            NewJob::new(&RefreshRates {})?,
        )?)
        .periodic(Periodic::cron(
            "annual_report",
            "0 9 1 1 *",
            "Europe/Stockholm",
            NewJob::new(&AnnualReport {})?,
        )?)
        .register(move |_ctx: JobContext, _job: RefreshRates| {
            let r = Arc::clone(&r);
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
        .register(move |_ctx: JobContext, _job: AnnualReport| {
            let a = Arc::clone(&a);
            async move {
                a.fetch_add(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    // the annual report fires on 1 January; an operator wants it now
    client.admin().trigger_schedule("annual_report").await?;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    running.shutdown(Duration::from_secs(5)).await;
    let (refreshed, reported) = (
        refreshed.load(Ordering::SeqCst),
        reported.load(Ordering::SeqCst),
    );
    println!("refresh_rates ran {refreshed} times in 3.5 s; annual_report ran {reported} time(s)");
    for schedule in client.admin().schedules().await? {
        println!(
            "  {}: last fire {:?}, {} fires kept",
            schedule.schedule, schedule.last_fire_at, schedule.fires
        );
    }
    if !(2..=6).contains(&refreshed) || reported != 1 {
        return Err("expected about one refresh a second and one triggered report".into());
    }
    Ok(())
}
