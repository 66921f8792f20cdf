//! `ringwork-bench workflows`: what a workflow costs against the same number of plain jobs, run
//! side by side in one process with one client of `--workers` no-op workers, alternating, for
//! `--rounds` rounds:
//!
//! - fan: a 1 → `--width` → 1 fan-out / fan-in workflow against `--width` + 2 independent jobs,
//!   from insert to the last handler's end; and the fan-in's release latency (the last child's
//!   handler end → the fan-in's handler start);
//! - many: `--workflows` workflows of 10 steps (a → 8 parallel → z) against as many plain jobs;
//! - keys: `--keys` sequences of 10 jobs each (inserted a round of keys at a time) against as many
//!   plain jobs.
//!
//! Prints a Markdown table; on a throwaway cluster with production defaults unless DATABASE_URL
//! is given.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringwork::{Client, JobContext, NewJob, QueueConfig, Result, SchemaName, Step, Workflow};
use serde::{Deserialize, Serialize};

pub struct WorkflowsConfig {
    pub database_url: Option<String>,
    pub width: usize,
    pub workflows: usize,
    pub keys: usize,
    pub workers: usize,
    pub rounds: usize,
}

#[derive(Serialize, Deserialize)]
struct Work {
    fan_in: bool,
}

impl ringwork::JobArgs for Work {
    const KIND: &'static str = "wf_bench";
}

/// What the handlers saw: how many ran, when the last child ended, when a fan-in started.
#[derive(Default)]
struct Seen {
    ran: AtomicU64,
    last_child_end: Mutex<Option<Instant>>,
    fan_in_start: Mutex<Option<Instant>>,
}

pub async fn run(config: WorkflowsConfig) -> Result<String> {
    let (_embedded, url) = crate::counts::server(&config.database_url)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;
    let schema = SchemaName::new(&format!("rw_workflows_{}", std::process::id()))?;
    let seen = Arc::new(Seen::default());
    let handler_seen = Arc::clone(&seen);
    let client = Client::builder(pool.clone())
        .schema(schema.as_str())
        .queue(
            "default",
            QueueConfig {
                max_workers: config.workers,
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, work: Work| {
            let seen = Arc::clone(&handler_seen);
            async move {
                if work.fan_in {
                    seen.fan_in_start
                        .lock()
                        .map(|mut s| *s = Some(Instant::now()))
                        .ok();
                } else {
                    seen.last_child_end
                        .lock()
                        .map(|mut s| *s = Some(Instant::now()))
                        .ok();
                }
                seen.ran.fetch_add(1, Ordering::SeqCst);
                Ok::<(), ringwork::BoxError>(())
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let job = |fan_in: bool| NewJob::new(&Work { fan_in });
    let mut out = String::from(
        "| round | shape | plain: insert, to the last handler (s) | workflow: insert, to the last handler (s) | workflow ÷ plain | fan-in release (ms) |\n|---|---|---|---|---|---|\n",
    );
    for round in 1..=config.rounds {
        // fan: 1 → width → 1
        let plain_n = config.width + 2;
        let plain = run_plain(&client, &seen, plain_n).await?;
        let children: Vec<String> = (0..config.width).map(|i| format!("c{i}")).collect();
        let names: Vec<&str> = children.iter().map(String::as_str).collect();
        let mut workflow = Workflow::new().step(Step::new("root", job(false)?));
        for name in &names {
            workflow = workflow.step(Step::new(name, job(false)?).after(&["root"]));
        }
        workflow = workflow.step(Step::new("fan_in", job(true)?).after(&names));
        let flow = run_workflows(&client, &seen, vec![workflow], plain_n).await?;
        let release = match (
            *seen.last_child_end.lock().expect("lock"),
            *seen.fan_in_start.lock().expect("lock"),
        ) {
            (Some(end), Some(start)) if start > end => {
                format!("{:.1}", (start - end).as_secs_f64() * 1000.0)
            }
            _ => "–".into(),
        };
        out.push_str(&format!(
            "| {round} | 1 → {} → 1 | {:.2}, {:.2} | {:.2}, {:.2} | {:.2} | {release} |\n",
            config.width,
            plain.0,
            plain.1,
            flow.0,
            flow.1,
            flow.1 / plain.1
        ));
        // many: workflows of a → 8 → z
        let plain = run_plain(&client, &seen, config.workflows * 10).await?;
        let mut flows = Vec::with_capacity(config.workflows);
        for _ in 0..config.workflows {
            let mut w = Workflow::new().step(Step::new("a", job(false)?));
            let middle: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
            for m in &middle {
                w = w.step(Step::new(m, job(false)?).after(&["a"]));
            }
            let refs: Vec<&str> = middle.iter().map(String::as_str).collect();
            flows.push(w.step(Step::new("z", job(false)?).after(&refs)));
        }
        let flow = run_workflows(&client, &seen, flows, config.workflows * 10).await?;
        out.push_str(&format!(
            "| {round} | {} × (1 → 8 → 1) | {:.2}, {:.2} | {:.2}, {:.2} | {:.2} | – |\n",
            config.workflows,
            plain.0,
            plain.1,
            flow.0,
            flow.1,
            flow.1 / plain.1
        ));
        // keys: sequences of 10 jobs each, every key in parallel
        let n = config.keys * 10;
        let plain = run_plain(&client, &seen, n).await?;
        let mut jobs = Vec::with_capacity(n);
        for _ in 0..10 {
            for key in 0..config.keys {
                jobs.push(
                    NewJob::new(&Work { fan_in: false })?
                        .sequence(&format!("key-{key}"), ringwork::DependencyFailure::Run),
                );
            }
        }
        let keyed = run_jobs(&client, &seen, jobs).await?;
        out.push_str(&format!(
            "| {round} | {} keys × 10 in sequence | {:.2}, {:.2} | {:.2}, {:.2} | {:.2} | – |\n",
            config.keys,
            plain.0,
            plain.1,
            keyed.0,
            keyed.1,
            keyed.1 / plain.1
        ));
    }
    running.shutdown(Duration::from_secs(10)).await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await?;
    Ok(out)
}

/// Insert `n` plain jobs and wait for their handlers: (seconds to insert, seconds to the last).
async fn run_plain(client: &Client, seen: &Seen, n: usize) -> Result<(f64, f64)> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob::new(&Work { fan_in: false }))
        .collect::<Result<_>>()?;
    run_jobs(client, seen, jobs).await
}

/// Insert these jobs, 5,000 a transaction, and wait for their handlers.
async fn run_jobs(client: &Client, seen: &Seen, jobs: Vec<NewJob>) -> Result<(f64, f64)> {
    let n = jobs.len();
    seen.ran.store(0, Ordering::SeqCst);
    let started = Instant::now();
    for chunk in jobs.chunks(5_000) {
        client.insert_many(chunk).await?;
    }
    let inserted = started.elapsed().as_secs_f64();
    wait_for(seen, n).await;
    Ok((inserted, started.elapsed().as_secs_f64()))
}

/// Insert these workflows (one transaction each) and wait for `n` handlers.
async fn run_workflows(
    client: &Client,
    seen: &Seen,
    workflows: Vec<Workflow>,
    n: usize,
) -> Result<(f64, f64)> {
    seen.ran.store(0, Ordering::SeqCst);
    *seen.last_child_end.lock().expect("lock") = None;
    *seen.fan_in_start.lock().expect("lock") = None;
    let started = Instant::now();
    for workflow in workflows {
        client.insert_workflow(workflow).await?;
    }
    let inserted = started.elapsed().as_secs_f64();
    wait_for(seen, n).await;
    Ok((inserted, started.elapsed().as_secs_f64()))
}

async fn wait_for(seen: &Seen, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while (seen.ran.load(Ordering::SeqCst) as usize) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
