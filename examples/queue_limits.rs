//! Fleet-wide queue limits: at most 3 jobs of the queue running at once, and at most 1 per tenant
//! (a key in the args), across every process. The handlers count what runs at once and check it.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example queue_limits`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{
    BoxError, Client, JobArgs, JobContext, JobError, KeyLimit, NewJob, QueueConfig, QueueLimits,
    SchemaName,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct SyncAccount {
    tenant: String,
}

impl JobArgs for SyncAccount {
    const KIND: &'static str = "sync_account";
}

/// Running now and the peak: in all, and per tenant.
#[derive(Default)]
struct Running {
    now: usize,
    peak: usize,
    by_tenant: HashMap<String, (usize, usize)>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let schema = SchemaName::new("ringwork_example_queue_limits")?;
    ringwork::schema::drop_schema(&pool, &schema).await?;
    let running: Arc<Mutex<Running>> = Arc::default();
    let seen = Arc::clone(&running);
    let client = Client::builder(pool)
        .schema(schema.as_str())
        .queue(
            "sync",
            QueueConfig {
                max_workers: 16,
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, job: SyncAccount| {
            let seen = Arc::clone(&seen);
            async move {
                {
                    let mut r = seen.lock().map_err(|_| JobError::terminal("poisoned"))?;
                    r.now += 1;
                    r.peak = r.peak.max(r.now);
                    let t = r.by_tenant.entry(job.tenant.clone()).or_default();
                    t.0 += 1;
                    t.1 = t.1.max(t.0);
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                let mut r = seen.lock().map_err(|_| JobError::terminal("poisoned"))?;
                r.now -= 1;
                if let Some(t) = r.by_tenant.get_mut(&job.tenant) {
                    t.0 -= 1;
                }
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await?;
    client
        .admin()
        .set_queue_limits(
            "sync",
            QueueLimits {
                max_running: Some(3),
                per_key: Some(KeyLimit::arg("tenant").max_running(1)),
                ..QueueLimits::default()
            },
        )
        .await?;
    let jobs = [
        "acme", "acme", "acme", "acme", "globex", "globex", "initech", "umbrella",
    ]
    .iter()
    .map(|t| {
        NewJob::new(&SyncAccount {
            tenant: t.to_string(),
        })
        .map(|j| j.queue("sync"))
    })
    .collect::<Result<Vec<_>, _>>()?;
    client.insert_many(&jobs).await?;
    let started = client.start().await?;
    for _ in 0..200 {
        let counts = client.admin().queue_counts(Some("sync")).await?;
        if counts.first().is_some_and(|c| c.completed == 8) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.shutdown(Duration::from_secs(5)).await;
    let counts = client.admin().queue_counts(Some("sync")).await?;
    let r = running.lock().map_err(|_| "poisoned")?;
    let per_tenant: Vec<_> = r
        .by_tenant
        .iter()
        .map(|(t, (_, peak))| (t.clone(), *peak))
        .collect();
    println!(
        "completed {}; at most {} running at once; peak per tenant {per_tenant:?}",
        counts[0].completed, r.peak
    );
    if counts[0].completed != 8 || r.peak > 3 || per_tenant.iter().any(|(_, p)| *p > 1) {
        return Err("expected all 8 done, at most 3 at once and 1 per tenant".into());
    }
    Ok(())
}
