//! PgQue (github.com/NikolayS/PgQue), the comparison event queue: `ringwork-bench pgque VERB`
//! speaks the runner's adapter protocol (bench/awa-adapter/README.md) against PgQue's SQL, which
//! `migrate` installs from a checkout the user names (`run --pgque-sql PATH/sql/pgque.sql`);
//! nothing of PgQue is vendored here.
//!
//! PgQue cuts its event stream into batches at each tick and a consumer acknowledges a batch as a
//! whole: an event queue with per-batch acks, where ringwork acknowledges each job. Driven as its
//! docs describe:
//! - one queue, `bench`, and one logical consumer, `bench`, shared by cooperative subconsumers
//!   (`receive_coop`, experimental in PgQue 0.2): each worker process holds one subconsumer per 8
//!   workers, so several batches are worked at once in a process and across processes;
//! - a ticker: `pgque.ticker()` every `RINGWORK_BENCH_PGQUE_TICK_MS` (default 100, PgQue's own
//!   period) in the one worker process that holds an advisory lock, with the queue's
//!   `ticker_max_lag` set to that period, so an event is visible about a period after its send;
//! - a process's W handlers run the events of the batches it holds, and a batch is acknowledged
//!   (`ack`) once all of its events ran; subconsumers wait for the tick's NOTIFY between batches.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Subcommand;
use ringwork::{Error, Result};
use serde::Deserialize;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};

use crate::scenario::{args_padding, BenchJob, ARGS_BYTES_ENV};
use crate::worker::{
    env_number, now_us, report_until_signal, wait_for_signal, ProduceInWorker, ProduceMode,
};

const QUEUE: &str = "bench";
const CONSUMER: &str = "bench";
/// Sequence numbers of events sent by held transactions start here (as ringwork's own and awa's).
const HELD_SEQ_BASE: u64 = 1 << 40;
/// The advisory lock whose holder runs the ticker (one ticker for the fleet).
const TICKER_LOCK: i64 = 0x7067_7175_6500;

#[derive(Subcommand)]
pub enum PgqueCommand {
    /// Install PgQue's SQL (idempotent), create the queue and its consumer.
    Migrate {
        #[arg(long)]
        database_url: String,
        /// PgQue's single-file installer, `sql/pgque.sql` of a checkout.
        #[arg(long, env = "RINGWORK_BENCH_PGQUE_SQL")]
        sql: std::path::PathBuf,
    },
    /// W handlers over cooperative batches until SIGTERM; one JSON line a second. With `--mode`,
    /// the process also sends events, from SIGUSR1 to SIGUSR2.
    Work {
        #[arg(long)]
        database_url: String,
        #[arg(long, default_value_t = 32)]
        workers: usize,
        #[arg(long, default_value_t = 0)]
        job_ms: u64,
        #[command(flatten)]
        produce: ProduceInWorker,
    },
    /// Send events at a fixed rate or to hold a depth; one JSON line a second.
    Produce {
        #[arg(long)]
        database_url: String,
        #[arg(long)]
        mode: String,
        #[arg(long)]
        rate: Option<u64>,
        #[arg(long)]
        depth: Option<u64>,
    },
    /// Hold sending transactions open (open-producer-tx), `txs` at once, each `hold_secs`.
    Hold {
        #[arg(long)]
        database_url: String,
        #[arg(long, default_value_t = 64)]
        txs: u32,
        #[arg(long, default_value_t = 10)]
        hold_secs: u64,
    },
    /// One JSON line: the events not yet consumed (`--fast`: only `available`).
    Depth {
        #[arg(long)]
        database_url: String,
        #[arg(long)]
        fast: bool,
    },
}

pub async fn run(command: PgqueCommand) -> Result<()> {
    match command {
        PgqueCommand::Migrate { database_url, sql } => migrate(&database_url, &sql).await,
        PgqueCommand::Work {
            database_url,
            workers,
            job_ms,
            produce,
        } => work(&database_url, workers, job_ms, produce.mode()?).await,
        PgqueCommand::Produce {
            database_url,
            mode,
            rate,
            depth,
        } => produce(&database_url, ProduceMode::parse(&mode, rate, depth)?).await,
        PgqueCommand::Hold {
            database_url,
            txs,
            hold_secs,
        } => hold(&database_url, txs, Duration::from_secs(hold_secs)).await,
        PgqueCommand::Depth { database_url, .. } => {
            let pool = connect(&database_url, 1).await?;
            let available = available(&pool).await?;
            println!("{}", serde_json::json!({ "available": available }));
            Ok(())
        }
    }
}

fn tick_period() -> Duration {
    Duration::from_millis(env_number("RINGWORK_BENCH_PGQUE_TICK_MS").unwrap_or(100))
}

async fn connect(url: &str, max: u32) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?)
}

async fn migrate(url: &str, sql: &Path) -> Result<()> {
    let text = std::fs::read_to_string(sql)
        .map_err(|e| Error::Config(format!("PgQue's installer {}: {e}", sql.display())))?;
    let pool = connect(url, 1).await?;
    // one simple-protocol message: the whole file in one implicit transaction, as `psql -1 -f`
    sqlx::raw_sql(&text).execute(&pool).await?;
    sqlx::query("SELECT pgque.create_queue($1)")
        .bind(QUEUE)
        .execute(&pool)
        .await?;
    let lag = format!("{} milliseconds", tick_period().as_millis());
    sqlx::query("SELECT pgque.set_queue_config($1, 'ticker_max_lag', $2)")
        .bind(QUEUE)
        .bind(&lag)
        .execute(&pool)
        .await?;
    // registered before any event is sent: a consumer sees only what comes after it registered
    sqlx::query("SELECT pgque.register_consumer($1, $2)")
        .bind(QUEUE)
        .bind(CONSUMER)
        .execute(&pool)
        .await?;
    let version: String = sqlx::query_scalar("SELECT pgque.version()")
        .fetch_one(&pool)
        .await?;
    eprintln!("PgQue {version}: queue {QUEUE}, ticker_max_lag {lag}");
    Ok(())
}

/// Events sent and not yet taken into a batch: what the consumer's last tick left, plus what
/// arrived since the queue's last tick.
async fn available(pool: &PgPool) -> Result<i64> {
    let pending: Option<i64> = sqlx::query_scalar(
        "SELECT sum(c.pending_events)::int8 FROM pgque.get_consumer_info($1, $2) c",
    )
    .bind(QUEUE)
    .bind(CONSUMER)
    .fetch_one(pool)
    .await?;
    let unticked: Option<i64> =
        sqlx::query_scalar("SELECT q.ev_new FROM pgque.get_queue_info($1) q")
            .bind(QUEUE)
            .fetch_optional(pool)
            .await?
            .flatten();
    Ok(pending.unwrap_or(0) + unticked.unwrap_or(0))
}

#[derive(Deserialize)]
struct Event {
    enq_us: i64,
    n: u64,
    #[serde(default)]
    held: bool,
}

#[derive(Default)]
struct Stats {
    completed: AtomicU64,
    pickup_ms: Mutex<Vec<f64>>,
    /// Microseconds spent inside handlers (a handler: from its permit to its printed line).
    handler_us: AtomicU64,
}

async fn work(url: &str, workers: usize, job_ms: u64, produce: Option<ProduceMode>) -> Result<()> {
    if workers == 0 {
        return Err(Error::Config("--workers must be > 0".into()));
    }
    // producing in this process (`run --producer-in-worker`): a pool of its own, as the
    // application's beside the consumers'
    let producing = match produce {
        Some(mode) => {
            let (available, send) = sends(connect(url, 2).await?);
            Some(crate::worker::produce_on_signal(mode, available, send)?)
        }
        None => None,
    };
    let slots = workers.div_ceil(8);
    let pool = connect(url, slots as u32 + 1).await?;
    let pid = std::process::id();
    for slot in 0..slots {
        // a normal consumer with no batch becomes the cooperative group's main row
        sqlx::query("SELECT pgque.register_subconsumer($1, $2, $3, true)")
            .bind(QUEUE)
            .bind(CONSUMER)
            .bind(format!("p{pid}s{slot}"))
            .execute(&pool)
            .await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ticked = Arc::new(Notify::new());
    let stats = Arc::new(Stats::default());
    let handlers = Arc::new(Semaphore::new(workers));
    let mut tasks = vec![tokio::spawn(ticker(
        url.to_string(),
        Arc::clone(&stop),
        Arc::clone(&ticked),
    ))];
    for slot in 0..slots {
        tasks.push(tokio::spawn(consume(
            pool.clone(),
            format!("p{pid}s{slot}"),
            Arc::clone(&handlers),
            job_ms,
            Arc::clone(&stats),
            Arc::clone(&stop),
            Arc::clone(&ticked),
        )));
    }
    let report_line = || {
        let completed = stats.completed.swap(0, Ordering::Relaxed);
        let handler_us = stats.handler_us.swap(0, Ordering::Relaxed);
        let samples = stats
            .pickup_ms
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        println!(
            "{}",
            serde_json::json!({ "completed": completed, "pickup_ms": samples, "handler_us": handler_us })
        );
    };
    report_until_signal(&report_line).await?;
    if let Some(producing) = producing {
        producing.abort();
        let _ = producing.await;
    }
    // the batches in hand run to their ack
    stop.store(true, Ordering::Relaxed);
    ticked.notify_waiters();
    for task in tasks {
        let _ = task.await;
    }
    report_line();
    Ok(())
}

/// The fleet's ticker, in the process that holds its advisory lock; every process wakes its
/// subconsumers on the tick's NOTIFY (`pgque_<queue>`), or a period after the last wake.
async fn ticker(url: String, stop: Arc<AtomicBool>, ticked: Arc<Notify>) {
    let period = tick_period();
    let Ok(lock) = connect(&url, 1).await else {
        return;
    };
    let mut listener = PgListener::connect(&url).await.ok();
    if let Some(l) = listener.as_mut() {
        let _ = l.listen(&format!("pgque_{QUEUE}")).await;
    }
    let Ok(mut conn) = lock.acquire().await else {
        return;
    };
    let mut leading = false;
    let mut last_try = Instant::now() - Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        if !leading && last_try.elapsed() >= Duration::from_secs(1) {
            last_try = Instant::now();
            leading = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(TICKER_LOCK)
                .fetch_one(&mut *conn)
                .await
                .unwrap_or(false);
        }
        if leading {
            // its own transaction: a tick's snapshot must be committed before the next
            if let Err(e) = sqlx::query("SELECT pgque.ticker()")
                .execute(&mut *conn)
                .await
            {
                eprintln!("pgque ticker: {e}");
            }
        }
        match listener.as_mut() {
            Some(l) => {
                let deadline = tokio::time::sleep(period);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        n = l.recv() => {
                            if n.is_err() {
                                break;
                            }
                            ticked.notify_waiters();
                        }
                    }
                }
            }
            None => tokio::time::sleep(period).await,
        }
        ticked.notify_waiters();
    }
}

/// One subconsumer: take a batch, run its events on the process's handlers, ack it.
async fn consume(
    pool: PgPool,
    name: String,
    handlers: Arc<Semaphore>,
    job_ms: u64,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    ticked: Arc<Notify>,
) {
    while !stop.load(Ordering::Relaxed) {
        let woken = ticked.notified();
        // at least the queue's ticker_max_count (500): ack() passes the whole batch
        let rows: Vec<(i64, String)> = match sqlx::query_as(
            "SELECT batch_id, payload FROM pgque.receive_coop($1, $2, $3, 100000)",
        )
        .bind(QUEUE)
        .bind(CONSUMER)
        .bind(&name)
        .fetch_all(&pool)
        .await
        {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("pgque receive: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Some(batch_id) = rows.first().map(|r| r.0) else {
            // an empty window was finished inside receive_coop; wait for the next tick
            let _ = tokio::time::timeout(tick_period(), woken).await;
            continue;
        };
        let mut running = Vec::with_capacity(rows.len());
        for (_, payload) in rows {
            let Ok(permit) = Arc::clone(&handlers).acquire_owned().await else {
                return;
            };
            let stats = Arc::clone(&stats);
            running.push(tokio::spawn(async move {
                let _permit = permit;
                let started = Instant::now();
                let Ok(event) = serde_json::from_str::<Event>(&payload) else {
                    return;
                };
                if !event.held {
                    let ms = (now_us() - event.enq_us) as f64 / 1000.0;
                    if let Ok(mut samples) = stats.pickup_ms.lock() {
                        samples.push(ms);
                    }
                }
                if job_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(job_ms)).await;
                }
                // before the ack, as ringwork's worker writes it before its completion
                println!("{{\"handled\":{}}}", event.n);
                stats.completed.fetch_add(1, Ordering::Relaxed);
                stats
                    .handler_us
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            }));
        }
        for handler in running {
            let _ = handler.await;
        }
        if let Err(e) = sqlx::query("SELECT pgque.ack($1)")
            .bind(batch_id)
            .execute(&pool)
            .await
        {
            eprintln!("pgque ack: {e}");
        }
    }
}

/// Events sent with `send_batch`, through the producer loop all systems share.
async fn produce(url: &str, mode: ProduceMode) -> Result<()> {
    let (available, send) = sends(connect(url, 2).await?);
    crate::worker::produce(mode, available, send).await
}

/// The producer's two calls on `pool`: the available count (depth mode) and `send_batch`.
#[allow(clippy::type_complexity)]
fn sends(
    pool: PgPool,
) -> (
    impl Fn() -> Pin<Box<dyn Future<Output = Result<i64>> + Send>> + Send + Sync + 'static,
    impl Fn(u64, u64) -> Pin<Box<dyn Future<Output = Result<u64>> + Send>> + Send + Sync + 'static,
) {
    let probe = pool.clone();
    let available = move || {
        let pool = probe.clone();
        Box::pin(async move { available(&pool).await })
            as Pin<Box<dyn Future<Output = Result<i64>> + Send>>
    };
    let args_bytes = env_number(ARGS_BYTES_ENV).unwrap_or(0) as usize;
    let send = move |first: u64, count: u64| {
        let pool = pool.clone();
        Box::pin(async move {
            let enq_us = now_us();
            let payloads = (first..first + count)
                .map(|n| {
                    serde_json::to_value(BenchJob {
                        enq_us,
                        n,
                        held: false,
                        pad: args_padding(args_bytes, n),
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Config(format!("bench payload: {e}")))?;
            sqlx::query("SELECT pgque.send_batch($1, $2::jsonb[])")
                .bind(QUEUE)
                .bind(&payloads)
                .execute(&pool)
                .await?;
            Ok(count)
        }) as Pin<Box<dyn Future<Output = Result<u64>> + Send>>
    };
    (available, send)
}

/// Each of `txs` connections in turn: BEGIN, send one event, wait `hold`, COMMIT, again.
async fn hold(url: &str, txs: u32, hold: Duration) -> Result<()> {
    let pool = connect(url, txs).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(HELD_SEQ_BASE));
    let mut holders = Vec::new();
    for _ in 0..txs {
        let (pool, stop, next) = (pool.clone(), Arc::clone(&stop), Arc::clone(&next));
        holders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Ok(mut tx) = pool.begin().await else {
                    return;
                };
                let payload = serde_json::json!({ "enq_us": now_us(), "n": n, "held": true });
                if sqlx::query("SELECT pgque.send($1, $2::jsonb)")
                    .bind(QUEUE)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await
                    .is_err()
                {
                    continue;
                }
                let deadline = Instant::now() + hold;
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if tx.commit().await.is_ok() {
                    println!("{}", serde_json::json!({ "committed": [n, n + 1] }));
                }
            }
        }));
    }
    wait_for_signal().await?;
    stop.store(true, Ordering::Relaxed);
    for holder in holders {
        let _ = holder.await;
    }
    Ok(())
}
