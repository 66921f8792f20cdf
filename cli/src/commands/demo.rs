//! `ringwork demo`: enqueue N no-op jobs while W workers run them, then report throughput, pickup
//! latency, WAL bytes per job and dead tuples per table. Uses DATABASE_URL, or a throwaway cluster.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use ringwork::embedded::EmbeddedPostgres;
use ringwork::Result;
use ringwork::{Client, JobContext, JobError, QueueConfig, SchemaName};
use ringwork::{JobArgs, NewJob};

#[derive(clap::Args)]
pub struct Args {
    /// A server to run on (default: a throwaway cluster from the installed server binaries).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The schema the demo creates, and drops before and after.
    #[arg(long, default_value = "ringwork_demo")]
    schema: String,
    /// How many no-op jobs to enqueue and run.
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Concurrent handlers.
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// Hold the MVCC horizon for the whole run (a session sits in `BEGIN; SELECT
    /// txid_current()`), the condition under which row-mutating queues bloat.
    #[arg(long)]
    hold_horizon: bool,
    /// Do not ask before dropping an existing --schema on --database-url.
    #[arg(long)]
    yes: bool,
}

#[derive(Serialize, Deserialize)]
struct Noop {
    n: u64,
}

impl JobArgs for Noop {
    const KIND: &'static str = "noop";
}

/// Rows of the final table: (table, live, dead).
pub async fn table_stats(pool: &PgPool, schema: &SchemaName) -> Result<Vec<(String, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables
         WHERE schemaname = $1 ORDER BY relname",
    )
    .bind(schema.as_str())
    .fetch_all(pool)
    .await?)
}

pub async fn run(options: Args) -> super::Result<()> {
    let schema = super::schema_name(&options.schema)?;
    let (embedded, url) = match options.database_url {
        Some(url) => (None, url),
        None => {
            eprintln!("no DATABASE_URL: starting a throwaway PostgreSQL cluster…");
            let pg =
                EmbeddedPostgres::start().map_err(|e| super::CliError::Runtime(e.to_string()))?;
            let url = pg.url();
            (Some(pg), url)
        }
    };
    let pool = super::connect(&url, 16).await?;
    if embedded.is_none() {
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema.as_str())
                .fetch_one(&pool)
                .await?;
        if exists {
            super::confirm(
                options.yes,
                &format!("the demo drops schema {schema} and everything in it"),
            )?;
        }
    }
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&pool)
        .await?;
    let client = Client::builder(pool.clone())
        .schema(schema.as_str())
        .queue(
            "default",
            QueueConfig {
                max_workers: options.workers,
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, _job: Noop| async { Ok::<(), JobError>(()) })
        .build()
        .await?;
    let metrics = client.metrics();
    metrics.record_pickup_latency();

    // A transaction with an xid, idle for the whole run, pins the MVCC horizon database-wide.
    let mut horizon = if options.hold_horizon {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT txid_current()")
            .execute(&mut *tx)
            .await?;
        Some(tx)
    } else {
        None
    };
    let commits_start: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await?;
    let wal_start: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await?;
    let started = Instant::now();
    let running = client.start().await?;

    let producer = {
        let client = client.clone();
        let total = options.jobs;
        tokio::spawn(async move {
            let mut n = 0;
            while n < total {
                let chunk = (total - n).min(1000);
                let jobs: Vec<NewJob> = (n..n + chunk)
                    .map(|i| NewJob::new(&Noop { n: i }))
                    .collect::<Result<_>>()?;
                client.insert_many(&jobs).await?;
                n += chunk;
            }
            Ok::<Duration, ringwork::Error>(started.elapsed())
        })
    };

    let bar = ProgressBar::new(options.jobs);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} jobs  {per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    loop {
        let done = metrics.completed() + metrics.failed();
        bar.set_position(done);
        if done >= options.jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let enqueue_time = producer
        .await
        .map_err(|e| ringwork::Error::Config(format!("producer task: {e}")))??;
    running.shutdown(Duration::from_secs(10)).await;

    if let Some(tx) = horizon.take() {
        // still holding it at the end (read, then release)
        let mut tx = tx;
        sqlx::query("SELECT 1").execute(&mut *tx).await?;
        tx.rollback().await?;
    }
    let commits: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await?;
    let wal_bytes: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(&wal_start)
            .fetch_one(&pool)
            .await?;
    // let one maintenance pass reclaim what it can, then close every connection so the server
    // flushes their statistics before we read them
    let admin = client.admin();
    let config = ringwork::MaintenanceConfig {
        rotate_interval: Duration::ZERO,
        ..ringwork::MaintenanceConfig::default()
    };
    for _ in 0..3 {
        admin.run_maintenance(&config).await?;
    }
    drop(client);
    drop(admin);
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pool = super::connect(&url, 2).await?;
    let stats = table_stats(&pool, &schema).await?;

    let mut samples = metrics.pickup_latencies_ms();
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| -> f64 {
        if samples.is_empty() {
            return 0.0;
        }
        samples[((samples.len() - 1) as f64 * p).round() as usize]
    };
    let completed = metrics.completed();
    println!();
    println!("| metric | value |");
    println!("|---|---|");
    println!(
        "| jobs completed | {completed} (failed {}, stale {}) |",
        metrics.failed(),
        metrics.stale()
    );
    println!("| workers | {} |", options.workers);
    println!(
        "| MVCC horizon held for the whole run | {} |",
        if options.hold_horizon { "yes" } else { "no" }
    );
    println!(
        "| enqueue rate | {:.0} jobs/s |",
        options.jobs as f64 / enqueue_time.as_secs_f64()
    );
    println!(
        "| throughput (enqueue → complete, end to end) | {:.0} jobs/s |",
        completed as f64 / elapsed.as_secs_f64()
    );
    println!(
        "| pickup latency p50 / p99 (enqueue → handler start; includes time queued behind the backlog) | {:.1} ms / {:.1} ms |",
        pct(0.50),
        pct(0.99)
    );
    println!(
        "| WAL per completed job (enqueue + claim + complete + maintenance) | {:.0} B |",
        wal_bytes / completed.max(1) as f64
    );
    println!(
        "| commits per completed job (all sessions; statistics lag ≤ 1 s) | {:.3} |",
        (commits - commits_start) as f64 / completed.max(1) as f64
    );
    println!();
    println!("| table | live tuples | dead tuples |");
    println!("|---|---|---|");
    for (table, live, dead) in stats
        .iter()
        .filter(|(_, live, dead)| *live > 0 || *dead > 0)
    {
        println!("| {table} | {live} | {dead} |");
    }
    let total_dead: i64 = stats.iter().map(|(_, _, d)| d).sum();
    println!("| **all {} tables** | | **{total_dead}** |", stats.len());
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&pool)
        .await?;
    Ok(())
}

/// Arguments of the `sleep` job kind run by `ringwork work`.
#[derive(Serialize, Deserialize)]
pub struct Sleep {
    pub ms: u64,
}

impl JobArgs for Sleep {
    const KIND: &'static str = "sleep";
}

/// A worker process for `sleep` jobs; runs until SIGINT/SIGTERM, then shuts down gracefully.
pub async fn work(
    url: &str,
    schema: &str,
    queue: &str,
    workers: usize,
    maintenance: ringwork::MaintenanceConfig,
) -> super::Result<()> {
    let pool = super::connect(url, 8).await?;
    let client = Client::builder(pool)
        .schema(schema)
        .queue(
            queue,
            QueueConfig {
                max_workers: workers,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .maintenance(maintenance)
        .register(|_ctx: JobContext, job: Sleep| async move {
            tokio::time::sleep(Duration::from_millis(job.ms)).await;
            Ok::<(), JobError>(())
        })
        .build()
        .await?;
    let metrics = client.metrics();
    let running = client.start().await?;
    println!("ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| super::CliError::Runtime(format!("cannot install SIGTERM handler: {e}")))?;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                println!("completed {}", metrics.completed());
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    running.shutdown(Duration::from_secs(30)).await;
    Ok(())
}
