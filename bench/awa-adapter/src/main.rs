//! `awa-adapter`: drives awa 0.6.9 with the same line protocol as ringwork's bench runner.
//!
//! Subcommands: `migrate`, `work`, `produce`, `depth`. See README.md for the protocol.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use awa::{Client, InsertOpts, InsertParams, JobContext, JobResult, QueueConfig, QueueStorage};
use awa::{JobArgs, QueueStorageConfig};
use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::time::MissedTickBehavior;

/// Job kind used for every benchmark job.
const KIND: &str = "bench_noop";
/// Upper bound on rows per producer insert (catch-up after a stall, depth top-ups).
const MAX_INSERT: u64 = 5_000;
/// Batches larger than this go through awa's COPY enqueue path instead of multi-row INSERT.
const COPY_THRESHOLD: usize = 256;

#[derive(Parser)]
#[command(
    name = "awa-adapter",
    about = "awa 0.6.9 driver for ringwork's bench runner"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Rate,
    Depth,
}

#[derive(Subcommand)]
enum Command {
    /// Install awa's schema and activate its queue-storage engine (idempotent).
    Migrate {
        #[arg(long)]
        database_url: String,
    },
    /// Run W concurrent no-op workers until SIGTERM/SIGINT; one JSON line per second.
    Work {
        #[arg(long)]
        database_url: String,
        #[arg(long, default_value_t = 8)]
        workers: u32,
        /// Handler sleep in milliseconds (0 = return immediately).
        #[arg(long, default_value_t = 0)]
        job_ms: u64,
        #[arg(long, default_value = "default")]
        queue: String,
        /// Dispatcher poll interval (awa's default is 200 ms; LISTEN/NOTIFY wakes it sooner).
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
        /// Max connections in the worker process's pool.
        #[arg(long, default_value_t = 16)]
        pool_size: u32,
        /// Per-attempt deadline in ms (awa's own default is 300000). 0 = no deadline, which puts
        /// claims on awa's compact receipt path (crash recovery then relies on heartbeats). The
        /// default here is 0: like for like with ringwork, whose queues have no deadline unless
        /// configured.
        #[arg(long, default_value_t = 0)]
        deadline_ms: u64,
    },
    /// Insert no-op jobs at a fixed rate or to hold a target depth; one JSON line per second.
    Produce {
        #[arg(long)]
        database_url: String,
        #[arg(long, value_enum)]
        mode: Mode,
        /// Jobs per second (rate mode).
        #[arg(long)]
        rate: Option<f64>,
        /// Jobs per insert in rate mode (default: whatever is due every 10 ms).
        #[arg(long)]
        batch: Option<u64>,
        /// Available jobs to maintain (depth mode).
        #[arg(long)]
        depth: Option<u64>,
        #[arg(long, default_value = "default")]
        queue: String,
    },
    /// Hold producer transactions open (open-producer-tx scenario): each of `txs` connections
    /// in turn BEGINs, inserts one job through awa's transactional insert, waits `hold_secs`,
    /// COMMITs, and starts over, until SIGTERM/SIGINT (then the open ones commit).
    Hold {
        #[arg(long)]
        database_url: String,
        #[arg(long, default_value = "default")]
        queue: String,
        #[arg(long, default_value_t = 64)]
        txs: u32,
        #[arg(long, default_value_t = 10)]
        hold_secs: u64,
    },
    /// Print one JSON line with the queue's job counts by state.
    Depth {
        #[arg(long)]
        database_url: String,
        #[arg(long, default_value = "default")]
        queue: String,
        /// Only {"available": A}, from awa's cheap cursor-difference probe (for per-sample depth).
        #[arg(long)]
        fast: bool,
    },
}

/// Job arguments: the producer's wall clock at insert (epoch microseconds) and the producer's
/// sequence number of the job, which the handler reports so the runner can account for every job.
#[derive(Serialize, Deserialize)]
struct BenchNoop {
    enq_us: i64,
    #[serde(default)]
    n: u64,
}

/// Sequence numbers of jobs inserted by held transactions start here, far above the producer's
/// (the same base as ringwork's bench runner uses for its own held transactions).
const HELD_SEQ_BASE: u64 = 1 << 40;

/// Sequence number of the next job this producer inserts (advanced by every attempt).
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

impl JobArgs for BenchNoop {
    fn kind() -> &'static str {
        KIND
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn emit(line: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn connect(url: &str, max: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .with_context(|| "connecting to PostgreSQL")
}

fn store() -> Result<QueueStorage> {
    // The default `awa` schema with default slot counts: what a 0.6 worker uses out of the box.
    Ok(QueueStorage::new(QueueStorageConfig::default())?)
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // sqlx logs every statement over 1 s at WARN; the exact `depth` count is one.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();

    match Cli::parse().command {
        Command::Migrate { database_url } => migrate(&database_url).await,
        Command::Work {
            database_url,
            workers,
            job_ms,
            queue,
            poll_ms,
            pool_size,
            deadline_ms,
        } => {
            let settings = WorkSettings {
                workers,
                job_ms,
                poll_ms,
                pool_size,
                deadline_ms,
            };
            work(&database_url, &queue, settings).await
        }
        Command::Produce {
            database_url,
            mode,
            rate,
            batch,
            depth,
            queue,
        } => match mode {
            Mode::Rate => {
                let Some(rate) = rate.filter(|r| *r > 0.0) else {
                    bail!("--mode rate needs --rate R > 0");
                };
                produce_rate(&database_url, rate, batch, &queue).await
            }
            Mode::Depth => {
                let Some(depth) = depth else {
                    bail!("--mode depth needs --depth N");
                };
                produce_depth(&database_url, depth, &queue).await
            }
        },
        Command::Hold {
            database_url,
            queue,
            txs,
            hold_secs,
        } => hold(&database_url, &queue, txs, Duration::from_secs(hold_secs)).await,
        Command::Depth {
            database_url,
            queue,
            fast,
        } => {
            if fast {
                depth_fast(&database_url, &queue).await
            } else {
                depth(&database_url, &queue).await
            }
        }
    }
}

// ── migrate ─────────────────────────────────────────────────────────────────

async fn migrate(url: &str) -> Result<()> {
    let pool = connect(url, 2).await?;
    awa::migrations::run(&pool)
        .await
        .context("awa migrations")?;

    // awa 0.6 keeps a storage-transition state machine. A fresh schema starts in state
    // `canonical`; the first 0.6 worker would switch it to the queue-storage engine only if no
    // job exists yet. Activating here makes the engine independent of whether the producer or
    // the worker starts first.
    let status = awa::storage::status(&pool).await?;
    let active = matches!(status.state.as_str(), "active" | "mixed_transition")
        && status.active_engine == "queue_storage";
    if !active {
        if status.state != "canonical" || status.prepared_engine.is_some() {
            bail!(
                "awa storage is mid-transition (state {}, prepared {:?}); use a fresh database",
                status.state,
                status.prepared_engine
            );
        }
        store()?
            .install(&pool)
            .await
            .context("activating queue storage")?;
    }
    let status = awa::storage::status(&pool).await?;
    eprintln!(
        "awa schema version {}, storage state {}, engine {}",
        awa::migrations::current_version(&pool).await?,
        status.state,
        status.active_engine
    );
    Ok(())
}

// ── work ────────────────────────────────────────────────────────────────────

#[derive(Default)]
struct WorkStats {
    completed: AtomicU64,
    pickup_ms: Mutex<Vec<f64>>,
}

impl WorkStats {
    fn take_line(&self) -> serde_json::Value {
        let completed = self.completed.swap(0, Ordering::Relaxed);
        let pickups = std::mem::take(&mut *self.pickup_ms.lock().unwrap());
        let pickups: Vec<f64> = pickups
            .into_iter()
            .map(|ms| (ms * 1000.0).round() / 1000.0)
            .collect();
        serde_json::json!({ "completed": completed, "pickup_ms": pickups })
    }
}

struct WorkSettings {
    workers: u32,
    job_ms: u64,
    poll_ms: u64,
    pool_size: u32,
    deadline_ms: u64,
}

async fn work(url: &str, queue: &str, settings: WorkSettings) -> Result<()> {
    if settings.workers == 0 {
        bail!("--workers must be > 0");
    }
    let pool = connect(url, settings.pool_size).await?;
    let stats = Arc::new(WorkStats::default());
    let handler_stats = stats.clone();
    let sleep = Duration::from_millis(settings.job_ms);

    let client = Client::builder(pool.clone())
        .queue(
            queue,
            QueueConfig {
                max_workers: settings.workers,
                poll_interval: Duration::from_millis(settings.poll_ms.max(1)),
                deadline_duration: Duration::from_millis(settings.deadline_ms),
                ..QueueConfig::default()
            },
        )
        .register::<BenchNoop, _, _>(move |args: BenchNoop, _ctx: &JobContext| {
            let stats = handler_stats.clone();
            async move {
                // jobs of held transactions wait for their own commit by design: not a pickup
                if args.n < HELD_SEQ_BASE {
                    let pickup = (now_us() - args.enq_us) as f64 / 1000.0;
                    stats.pickup_ms.lock().unwrap().push(pickup);
                }
                if !sleep.is_zero() {
                    tokio::time::sleep(sleep).await;
                }
                // Counted when the handler returns; awa commits the completion in batches
                // flushed every 1 ms by its completion batcher.
                stats.completed.fetch_add(1, Ordering::Relaxed);
                // The handled line is written before the handler returns, hence before the
                // completion can commit: a SIGKILL can lose a completion (the job is re-run) but
                // never the line of a committed one.
                println!("{{\"handled\":{}}}", args.n);
                Ok(JobResult::Completed)
            }
        })
        .build()?;
    client.start().await.context("starting awa client")?;

    let reporter_stats = stats.clone();
    let reporter = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            emit(&reporter_stats.take_line());
        }
    });

    shutdown_signal().await;
    reporter.abort();
    let _ = reporter.await;
    client.shutdown(Duration::from_secs(30)).await;
    // Whatever finished since the last full second.
    emit(&stats.take_line());
    pool.close().await;
    Ok(())
}

// ── hold ────────────────────────────────────────────────────────────────────

async fn hold(url: &str, queue: &str, txs: u32, hold: Duration) -> Result<()> {
    let pool = connect(url, txs + 1).await?;
    let enqueued = Arc::new(AtomicU64::new(0));
    let reporter = spawn_enqueue_reporter(enqueued.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(HELD_SEQ_BASE));
    let mut tasks = Vec::new();
    for i in 0..txs {
        let (pool, queue, stop, next, enqueued) = (
            pool.clone(),
            queue.to_string(),
            stop.clone(),
            next.clone(),
            enqueued.clone(),
        );
        // staggered, so transactions open and commit all through the hold
        let start_after = hold.mul_f64(f64::from(i) / f64::from(txs));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(start_after).await;
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Ok(mut tx) = pool.begin().await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let args = BenchNoop {
                    enq_us: now_us(),
                    n,
                };
                let opts = InsertOpts {
                    queue: queue.clone(),
                    ..InsertOpts::default()
                };
                if let Err(err) = awa::insert_with(&mut *tx, &args, opts).await {
                    eprintln!("held insert failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let opened = tokio::time::Instant::now();
                while opened.elapsed() < hold && !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if tx.commit().await.is_ok() {
                    enqueued.fetch_add(1, Ordering::Relaxed);
                    emit(&serde_json::json!({ "committed": [n, n + 1] }));
                }
            }
        }));
    }
    shutdown_signal().await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    reporter.abort();
    let _ = reporter.await;
    emit(&serde_json::json!({ "enqueued": enqueued.swap(0, Ordering::Relaxed) }));
    pool.close().await;
    Ok(())
}

// ── produce ─────────────────────────────────────────────────────────────────

fn job_params(first: u64, n: u64, queue: &str) -> Vec<InsertParams> {
    let enq_us = now_us();
    (0..n)
        .map(|i| InsertParams {
            kind: KIND.to_string(),
            args: serde_json::json!({ "enq_us": enq_us, "n": first + i }),
            opts: InsertOpts {
                queue: queue.to_string(),
                ..InsertOpts::default()
            },
        })
        .collect()
}

/// Insert `n` jobs through awa's queue-storage bulk enqueue; returns how many were inserted.
async fn insert_jobs(store: &QueueStorage, pool: &PgPool, queue: &str, n: u64) -> u64 {
    // fresh numbers on every attempt: a batch whose commit reply was lost (it may have committed)
    // never shares numbers with its retry
    let first = NEXT_SEQ.fetch_add(n, Ordering::Relaxed);
    let params = job_params(first, n, queue);
    let result = if params.len() > COPY_THRESHOLD {
        store.enqueue_params_copy(pool, &params).await
    } else {
        store.enqueue_params_batch(pool, &params).await
    };
    match result {
        Ok(count) => {
            emit(&serde_json::json!({ "committed": [first, first + count as u64] }));
            count as u64
        }
        Err(err) => {
            eprintln!("insert of {n} jobs failed: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
            0
        }
    }
}

fn spawn_enqueue_reporter(counter: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let n = counter.swap(0, Ordering::Relaxed);
            emit(&serde_json::json!({ "enqueued": n }));
        }
    })
}

async fn produce_rate(url: &str, rate: f64, batch: Option<u64>, queue: &str) -> Result<()> {
    let pool = connect(url, 4).await?;
    let store = store()?;
    let enqueued = Arc::new(AtomicU64::new(0));
    let reporter = spawn_enqueue_reporter(enqueued.clone());

    let period = match batch {
        Some(b) if b > 0 => Duration::from_secs_f64(b as f64 / rate),
        _ => Duration::from_millis(10),
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let start = Instant::now();
    let mut sent: u64 = 0;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        // Open loop: insert whatever the schedule says is due, so a slow insert is caught up.
        let due = (rate * start.elapsed().as_secs_f64()) as u64;
        let n = due.saturating_sub(sent).min(MAX_INSERT);
        if n == 0 {
            continue;
        }
        let done = insert_jobs(&store, &pool, queue, n).await;
        sent += done;
        enqueued.fetch_add(done, Ordering::Relaxed);
    }
    reporter.abort();
    let _ = reporter.await;
    emit(&serde_json::json!({ "enqueued": enqueued.swap(0, Ordering::Relaxed) }));
    pool.close().await;
    Ok(())
}

async fn produce_depth(url: &str, target: u64, queue: &str) -> Result<()> {
    let pool = connect(url, 4).await?;
    let store = store()?;
    let enqueued = Arc::new(AtomicU64::new(0));
    let reporter = spawn_enqueue_reporter(enqueued.clone());

    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stop = shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        // awa's cheap depth probe (enqueue cursor minus claim cursor), meant for depth-target
        // producers; it can only over-count, so this never overshoots the target.
        let available = match store.queue_counts_fast(&pool, queue).await {
            Ok(c) => c.available.max(0) as u64,
            Err(err) => {
                eprintln!("depth probe failed: {err}");
                continue;
            }
        };
        let n = target.saturating_sub(available).min(MAX_INSERT);
        if n > 0 {
            let done = insert_jobs(&store, &pool, queue, n).await;
            enqueued.fetch_add(done, Ordering::Relaxed);
        }
    }
    reporter.abort();
    let _ = reporter.await;
    emit(&serde_json::json!({ "enqueued": enqueued.swap(0, Ordering::Relaxed) }));
    pool.close().await;
    Ok(())
}

// ── depth ───────────────────────────────────────────────────────────────────

async fn depth_fast(url: &str, queue: &str) -> Result<()> {
    let pool = connect(url, 1).await?;
    let store = store()?;
    let counts = store.queue_counts_fast(&pool, queue).await?;
    emit(&serde_json::json!({ "available": counts.available }));
    pool.close().await;
    Ok(())
}

async fn depth(url: &str, queue: &str) -> Result<()> {
    let pool = connect(url, 2).await?;
    let store = store()?;
    let schema = store.schema().to_string();
    // Exact counts (awa's admin-grade path): available from ready rows past the claim cursor,
    // running including receipt-plane claims, terminal = live + pruned-and-rolled-up rows.
    let counts = store.queue_counts(&pool, queue).await?;
    // Retryable jobs wait in deferred_jobs too; both states are "scheduled" for accounting.
    let scheduled: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*)::bigint FROM {schema}.deferred_jobs \
         WHERE queue = $1 AND state IN ('scheduled', 'retryable')"
    ))
    .bind(queue)
    .fetch_one(&pool)
    .await?;
    // Non-completed terminal rows still in the ring; older ones are in counts.pruned_failed.
    let live_failed: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*)::bigint FROM {schema}.done_entries \
         WHERE queue = $1 AND state IN ('failed', 'cancelled')"
    ))
    .bind(queue)
    .fetch_one(&pool)
    .await?;
    let dlq: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*)::bigint FROM {schema}.dlq_entries WHERE queue = $1"
    ))
    .bind(queue)
    .fetch_one(&pool)
    .await?;
    let failed = live_failed + counts.pruned_failed + dlq;
    let completed = counts.terminal - live_failed - counts.pruned_failed;
    emit(&serde_json::json!({
        "available": counts.available,
        "scheduled": scheduled,
        "running": counts.running,
        "completed": completed,
        "failed": failed,
    }));
    pool.close().await;
    Ok(())
}
