//! `ringwork-bench workflows`: what a workflow costs against the same number of plain jobs, run
//! side by side in one process with one client of `--workers` no-op workers, alternating, for
//! `--rounds` rounds:
//!
//! - fan: a 1 → `--width` → 1 fan-out / fan-in workflow against `--width` + 2 independent jobs,
//!   from insert to the last handler's end; and the fan-in's release latency (the last child's
//!   handler end → the fan-in's handler start);
//! - many: `--workflows` workflows of 10 steps (a → 8 parallel → z) against as many plain jobs,
//!   500 workflows a transaction against 5,000 jobs a transaction, and one workflow a transaction
//!   against ten jobs a transaction;
//! - keys: `--keys` sequences of 10 jobs each (inserted a round of keys at a time) against as many
//!   plain jobs;
//! - at a rate: `--rate` jobs/s for `--rate-secs`, each insert its own transaction, as a service
//!   inserts them: plain jobs' pickup (insert → handler start) against chains a → b (`--rate` / 2
//!   workflows/s) and b's release (a's handler end → b's handler start, a's completion flush
//!   included).
//!
//! After the rounds, once: sequence jobs of a key each at `--rate` for `--rate-secs`, their pickup
//! alone; then beside one key with `--hot-key` jobs waiting behind its first, which is held (the
//! backlog alone: nothing of the key drains); then beside the same key running one job at a time
//! (the schema is dropped with what is left of it).
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
    pub rate: u64,
    pub rate_secs: u64,
    pub hot_key: usize,
}

#[derive(Serialize, Deserialize, Default)]
struct Work {
    fan_in: bool,
    /// The producer's clock at insert (µs since the epoch): the handler records its pickup.
    #[serde(default)]
    enq_us: i64,
    /// A chain's number (a → b at a rate), 0 for none.
    #[serde(default)]
    chain: u64,
    /// b, the chain's second step: the handler records its release.
    #[serde(default)]
    second: bool,
    /// A job of the hot key: counted nowhere.
    #[serde(default)]
    hot: bool,
}

impl ringwork::JobArgs for Work {
    const KIND: &'static str = "wf_bench";
}

/// What the handlers saw: how many ran, when the last child ended, when a fan-in started, the
/// pickups and releases of the jobs inserted at a rate.
#[derive(Default)]
struct Seen {
    ran: AtomicU64,
    last_child_end: Mutex<Option<Instant>>,
    fan_in_start: Mutex<Option<Instant>>,
    pickup_ms: Mutex<Vec<f64>>,
    chain_first_end: Mutex<std::collections::HashMap<u64, Instant>>,
    release_ms: Mutex<Vec<f64>>,
    /// The hot key's running job waits while this is set: its other jobs wait behind it, and
    /// nothing of the key drains.
    hold_hot: std::sync::atomic::AtomicBool,
    /// Jobs of the hot key that ran.
    hot_ran: AtomicU64,
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
                if work.hot {
                    while seen.hold_hot.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    seen.hot_ran.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                let start = Instant::now();
                if work.enq_us > 0 && !work.second {
                    let ms = (crate::worker::now_us() - work.enq_us) as f64 / 1000.0;
                    seen.pickup_ms.lock().map(|mut p| p.push(ms)).ok();
                }
                if work.second {
                    let first_end = seen
                        .chain_first_end
                        .lock()
                        .ok()
                        .and_then(|mut ends| ends.remove(&work.chain));
                    if let Some(end) = first_end {
                        let ms = (start - end).as_secs_f64() * 1000.0;
                        seen.release_ms.lock().map(|mut r| r.push(ms)).ok();
                    }
                }
                if work.chain > 0 && !work.second {
                    seen.chain_first_end
                        .lock()
                        .map(|mut ends| ends.insert(work.chain, Instant::now()))
                        .ok();
                }
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
    let job = |fan_in: bool| {
        NewJob::new(&Work {
            fan_in,
            ..Work::default()
        })
    };
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
        let flow = run_workflows(&client, &seen, vec![workflow], plain_n, 1).await?;
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
        // many: workflows of a → 8 → z; inserted 500 a transaction against plain jobs 5,000 a
        // transaction, and one a transaction against plain jobs ten a transaction (as many
        // transactions, each paying its commit)
        let plain_bulk = run_plain(&client, &seen, config.workflows * 10).await?;
        let plain_each = run_plain_in(&client, &seen, config.workflows, 10).await?;
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
        for per_call in [1, 500] {
            let flow = run_workflows(
                &client,
                &seen,
                flows.clone(),
                config.workflows * 10,
                per_call,
            )
            .await?;
            let (how, plain) = if per_call == 1 {
                ("one insert each".to_string(), plain_each)
            } else {
                (format!("{per_call} an insert"), plain_bulk)
            };
            out.push_str(&format!(
                "| {round} | {} × (1 → 8 → 1), {how} | {:.2}, {:.2} | {:.2}, {:.2} | {:.2} | – |\n",
                config.workflows,
                plain.0,
                plain.1,
                flow.0,
                flow.1,
                flow.1 / plain.1
            ));
        }
        // keys: sequences of 10 jobs each, every key in parallel
        let n = config.keys * 10;
        let plain = run_plain(&client, &seen, n).await?;
        let mut jobs = Vec::with_capacity(n);
        for _ in 0..10 {
            for key in 0..config.keys {
                jobs.push(NewJob::new(&Work::default())?.sequence(
                    &format!("r{round}-key-{key}"),
                    ringwork::DependencyFailure::Run,
                ));
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
        // at a rate: plain jobs' pickup, then chains' release
        let per_s = config.rate as f64;
        let secs = config.rate_secs as f64;
        let plain = at_rate(&seen, per_s, secs, |_| async {
            client
                .insert(NewJob::new(&Work {
                    enq_us: crate::worker::now_us(),
                    ..Work::default()
                })?)
                .await
                .map(|_| 1)
        })
        .await?;
        let client = &client;
        let chains = at_rate(&seen, per_s / 2.0, secs, |chain| async move {
            let first = NewJob::new(&Work {
                enq_us: crate::worker::now_us(),
                chain: chain + 1,
                ..Work::default()
            })?;
            let second = NewJob::new(&Work {
                chain: chain + 1,
                second: true,
                ..Work::default()
            })?;
            client
                .insert_workflow(
                    Workflow::new()
                        .step(Step::new("a", first))
                        .step(Step::new("b", second).after(&["a"])),
                )
                .await
                .map(|_| 2)
        })
        .await?;
        let release = take_sorted(&seen.release_ms);
        out.push_str(&format!(
            "| {round} | {} jobs/s for {} s, one insert each | pickup p50 / p95 / p99 {} | chains a → b: pickup of a {} | – | b's release p50 / p95 / p99 {} ms ({} chains) |\n",
            config.rate,
            config.rate_secs,
            plain.summary(),
            chains.summary(),
            percentiles(&release),
            release.len()
        ));
    }
    // once: keyed jobs at a rate, alone and beside a hot key
    let keyed = |hot: bool| {
        let client = &client;
        move |i: u64| async move {
            client
                .insert(
                    NewJob::new(&Work {
                        enq_us: crate::worker::now_us(),
                        ..Work::default()
                    })?
                    .sequence(
                        &format!("{}-{i}", if hot { "beside" } else { "alone" }),
                        ringwork::DependencyFailure::Run,
                    ),
                )
                .await
                .map(|_| 1)
        }
    };
    let alone = at_rate(
        &seen,
        config.rate as f64,
        config.rate_secs as f64,
        keyed(false),
    )
    .await?;
    // the hot key's jobs wait behind its first, held, for the next phase: a backlog alone
    seen.hold_hot.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let hot: Vec<NewJob> = (0..config.hot_key)
        .map(|_| {
            Ok(NewJob::new(&Work {
                hot: true,
                ..Work::default()
            })?
            .sequence("hot", ringwork::DependencyFailure::Run))
        })
        .collect::<Result<_>>()?;
    for chunk in hot.chunks(5_000) {
        client.insert_many(chunk).await?;
    }
    let hot_insert = started.elapsed().as_secs_f64();
    let beside = at_rate(
        &seen,
        config.rate as f64,
        config.rate_secs as f64,
        keyed(true),
    )
    .await?;
    // then the key runs, one job at a time, throughout the next phase
    seen.hold_hot.store(false, Ordering::SeqCst);
    let (ran_before, drain_started) = (seen.hot_ran.load(Ordering::SeqCst), Instant::now());
    let draining = at_rate(
        &seen,
        config.rate as f64,
        config.rate_secs as f64,
        keyed(true),
    )
    .await?;
    let drained_per_s = (seen.hot_ran.load(Ordering::SeqCst) - ran_before) as f64
        / drain_started.elapsed().as_secs_f64();
    let p99 = |r: &Rate| quantile(&r.pickup_ms, 0.99);
    out.push_str(&format!(
        "| – | sequence jobs of a key each, {} jobs/s for {} s | alone: pickup p50 / p95 / p99 {} | beside one key with {} jobs waiting behind its held first job (inserted in {:.1} s): {} (p99 {:.2}× alone); then beside it running one job at a time ({:.0} jobs/s): {} (p99 {:.2}× alone) | – | – |\n",
        config.rate,
        config.rate_secs,
        alone.summary(),
        config.hot_key,
        hot_insert,
        beside.summary(),
        p99(&beside) / p99(&alone).max(1e-9),
        drained_per_s,
        draining.summary(),
        p99(&draining) / p99(&alone).max(1e-9),
    ));
    running.shutdown(Duration::from_secs(10)).await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await?;
    Ok(out)
}

/// Insert `n` plain jobs and wait for their handlers: (seconds to insert, seconds to the last).
async fn run_plain(client: &Client, seen: &Seen, n: usize) -> Result<(f64, f64)> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob::new(&Work::default()))
        .collect::<Result<_>>()?;
    run_jobs(client, seen, jobs).await
}

/// Insert `transactions` transactions of `per_transaction` plain jobs, one after another, and
/// wait for their handlers: (seconds to insert, seconds to the last).
async fn run_plain_in(
    client: &Client,
    seen: &Seen,
    transactions: usize,
    per_transaction: usize,
) -> Result<(f64, f64)> {
    let jobs: Vec<NewJob> = (0..per_transaction)
        .map(|_| NewJob::new(&Work::default()))
        .collect::<Result<_>>()?;
    seen.ran.store(0, Ordering::SeqCst);
    let started = Instant::now();
    for _ in 0..transactions {
        client.insert_many(&jobs).await?;
    }
    let inserted = started.elapsed().as_secs_f64();
    wait_for(seen, transactions * per_transaction).await?;
    Ok((inserted, started.elapsed().as_secs_f64()))
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
    wait_for(seen, n).await?;
    Ok((inserted, started.elapsed().as_secs_f64()))
}

/// Insert these workflows (`per_call` a transaction) and wait for `n` handlers.
async fn run_workflows(
    client: &Client,
    seen: &Seen,
    workflows: Vec<Workflow>,
    n: usize,
    per_call: usize,
) -> Result<(f64, f64)> {
    seen.ran.store(0, Ordering::SeqCst);
    *seen.last_child_end.lock().expect("lock") = None;
    *seen.fan_in_start.lock().expect("lock") = None;
    let started = Instant::now();
    if per_call == 1 {
        for workflow in workflows {
            client.insert_workflow(workflow).await?;
        }
    } else {
        for chunk in workflows.chunks(per_call) {
            client.insert_workflows(chunk).await?;
        }
    }
    let inserted = started.elapsed().as_secs_f64();
    wait_for(seen, n).await?;
    Ok((inserted, started.elapsed().as_secs_f64()))
}

/// Insert at `per_s` inserts a second for `secs` (`insert(i)` inserts the i-th and returns how
/// many jobs it inserted), wait for those jobs' handlers, and return their pickups, sorted (ms).
async fn at_rate<F, Fut>(seen: &Seen, per_s: f64, secs: f64, insert: F) -> Result<Rate>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    seen.ran.store(0, Ordering::SeqCst);
    take_sorted(&seen.pickup_ms);
    take_sorted(&seen.release_ms);
    let started = Instant::now();
    let (mut sent, mut jobs) = (0u64, 0usize);
    while started.elapsed().as_secs_f64() < secs {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let due = (started.elapsed().as_secs_f64() * per_s) as u64;
        while sent < due {
            jobs += insert(sent).await?;
            sent += 1;
        }
    }
    let achieved = sent as f64 / started.elapsed().as_secs_f64();
    wait_for(seen, jobs).await?;
    Ok(Rate {
        pickup_ms: take_sorted(&seen.pickup_ms),
        inserts_per_s: achieved,
    })
}

/// What a shape at a rate saw: its pickups (sorted, ms) and the insert rate it achieved (one
/// insert at a time: a slow insert makes the schedule slip, and the table says so).
struct Rate {
    pickup_ms: Vec<f64>,
    inserts_per_s: f64,
}

impl Rate {
    fn summary(&self) -> String {
        format!(
            "{} ms ({} samples, {:.0} inserts/s)",
            percentiles(&self.pickup_ms),
            self.pickup_ms.len(),
            self.inserts_per_s
        )
    }
}

fn take_sorted(samples: &Mutex<Vec<f64>>) -> Vec<f64> {
    let mut taken = samples
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    taken.sort_by(|a, b| a.total_cmp(b));
    taken
}

fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn percentiles(sorted: &[f64]) -> String {
    if sorted.is_empty() {
        return "–".into();
    }
    let at = |p: f64| quantile(sorted, p);
    format!("{:.1} / {:.1} / {:.1}", at(0.5), at(0.95), at(0.99))
}

/// Wait for `n` handlers; an error after 10 minutes (a shape's figures would be partial, and its
/// stragglers would run into the next shape's).
async fn wait_for(seen: &Seen, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while (seen.ran.load(Ordering::SeqCst) as usize) < n {
        if Instant::now() >= deadline {
            return Err(ringwork::Error::Config(format!(
                "{} of {n} jobs ran within 10 minutes",
                seen.ran.load(Ordering::SeqCst)
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}
