//! Unique jobs: an insert that duplicates a pending or running job (same kind and arguments, and
//! optionally the same queue and period) returns the existing job's id instead of a second job.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example unique_jobs`

use std::time::Duration;

use ringwork::{BoxError, Client, JobArgs, JobContext, JobError, NewJob, QueueConfig, Unique};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct RebuildSearchIndex {
    tenant: i64,
}

impl JobArgs for RebuildSearchIndex {
    const KIND: &'static str = "rebuild_search_index";
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let client = Client::builder(pool)
        .schema("ringwork_example_unique")
        .queue("search", QueueConfig::default())
        .register(|_ctx: JobContext, job: RebuildSearchIndex| async move {
            println!("rebuilding the search index of tenant {}", job.tenant);
            Ok::<(), JobError>(())
        })
        .build()
        .await?;

    // at most one rebuild per tenant per hour, whoever asks
    let rebuild = |tenant| -> ringwork::Result<NewJob> {
        Ok(NewJob::new(&RebuildSearchIndex { tenant })?
            .queue("search")
            .unique(Unique::default().by_period(Duration::from_secs(3600))))
    };
    let tenant = std::process::id() as i64;
    let inserted = client
        .insert_many_reporting(&[rebuild(tenant)?, rebuild(tenant)?, rebuild(tenant + 1)?])
        .await?;
    for i in &inserted {
        println!("job {} duplicate: {}", i.job_id, i.duplicate);
    }
    let duplicates = inserted.iter().filter(|i| i.duplicate).count();
    if duplicates != 1 || inserted[0].job_id != inserted[1].job_id {
        return Err(format!("expected the second insert to be a duplicate: {inserted:?}").into());
    }
    // a later insert is a duplicate too while the first job is still pending or running
    let again = client.insert(rebuild(tenant)?).await?;
    println!("inserting it again returns job {again}");
    if again != inserted[0].job_id {
        return Err("a later insert was not deduplicated".into());
    }
    Ok(())
}
