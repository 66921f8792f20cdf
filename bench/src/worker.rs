//! The ringwork side of the line protocol: the worker and producer processes themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use ringwork::NewJob;
use ringwork::SchemaName;
use ringwork::Storage;
use ringwork::{Client, CompletionConfig, JobContext, JobError, MaintenanceConfig, QueueConfig};
use ringwork::{Error, Result};
use tracing::Instrument;

use crate::scenario::{args_padding, BenchJob, ARGS_BYTES_ENV, BENCH_QUEUE};

pub(crate) fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

/// Print `report_line` once a second until SIGINT or SIGTERM.
pub(crate) async fn report_until_signal(report_line: &dyn Fn()) -> Result<()> {
    let report = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            report_line();
        }
    };
    tokio::select! {
        _ = report => Ok(()),
        result = wait_for_signal() => result,
    }
}

pub(crate) async fn wait_for_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::Config(format!("cannot install SIGTERM handler: {e}")))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// `ringwork-bench worker`: W workers on the bench queue; one JSON line per second. With `produce`,
/// the process also inserts the bench jobs, from SIGUSR1 to SIGUSR2 (`produce_on_signal`).
pub async fn worker_process(
    url: &str,
    schema: &str,
    workers: usize,
    job_ms: u64,
    produce: Option<ProduceMode>,
) -> Result<()> {
    // the client's own pool does the work; this one serves its start-up checks and, producing
    // in this process, the inserts (the application's pool)
    let (pool, session) = connect(url, 2).await?;
    let producing = match produce {
        Some(mode) => {
            let (available, send) = bench_inserts(pool.clone(), schema, session.clone())?;
            Some(produce_on_signal(mode, available, send)?)
        }
        None => None,
    };
    let pickups: Arc<Mutex<Vec<f64>>> = Arc::default();
    let recorder = Arc::clone(&pickups);
    // microseconds spent inside handlers: against the workers' time, how busy the runtime keeps them
    let handler_us: Arc<AtomicU64> = Arc::default();
    let handler_clock = Arc::clone(&handler_us);
    let mut builder = Client::builder(pool);
    if let Some(session) = session {
        builder = builder.transaction_pooler(Some(session));
    }
    if telemetry_part("metrics") {
        let exporter = Arc::new(ringwork::http::PrometheusExporter::new(|provider| {
            provider
        })?);
        builder = builder.telemetry(exporter.telemetry());
        // a scrape every 10 s, as a Prometheus server would
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let _ = exporter.render();
            }
        });
    }
    // RINGWORK_BENCH_ENGINE_POOL=N: the client's own connections (a fleet's connection budget)
    if let Some(n) = env_number("RINGWORK_BENCH_ENGINE_POOL") {
        builder = builder.engine_pool_size(n as u32);
    }
    let client = builder
        .schema(schema)
        .migrate(false)
        .queue(
            BENCH_QUEUE,
            QueueConfig {
                max_workers: workers,
                // RINGWORK_BENCH_CLAIM_AHEAD=N: the claim-ahead baseline (0 claims only for free
                // workers, as before claim ahead existed)
                claim_ahead: env_number("RINGWORK_BENCH_CLAIM_AHEAD")
                    .unwrap_or(QueueConfig::default().claim_ahead as u64)
                    as usize,
                ..QueueConfig::default()
            },
        )
        // A crashed worker's claims are rescued after 10 s (heartbeats every 2.5 s keep live
        // ones), so crash scenarios recover within a phase; RINGWORK_BENCH_STALE_AFTER_S=N sets
        // it (60: the default, for what an idle process costs as configured out of the box).
        // Baselines, through the environment inherited from the bench process:
        // RINGWORK_BENCH_NO_PARK turns parking off (the paused-queue baseline),
        // RINGWORK_BENCH_NO_ARCHIVE the archive (the WAL cost of history), and
        // RINGWORK_BENCH_KEEP_COMPLETED_S=N keeps completed jobs N seconds instead of 24 h (a run
        // of hours then reaches the archive's expiry, which 24 h never does).
        .maintenance(MaintenanceConfig {
            stale_after: Duration::from_secs(
                env_number("RINGWORK_BENCH_STALE_AFTER_S").unwrap_or(10),
            ),
            park_idle: match std::env::var_os("RINGWORK_BENCH_NO_PARK") {
                Some(_) => None,
                None => MaintenanceConfig::default().park_idle,
            },
            keep_completed: match std::env::var_os("RINGWORK_BENCH_NO_ARCHIVE") {
                Some(_) => Duration::ZERO,
                None => env_number("RINGWORK_BENCH_KEEP_COMPLETED_S")
                    .map(Duration::from_secs)
                    .unwrap_or(MaintenanceConfig::default().keep_completed),
            },
            keep_failed: match std::env::var_os("RINGWORK_BENCH_NO_ARCHIVE") {
                Some(_) => Duration::ZERO,
                None => MaintenanceConfig::default().keep_failed,
            },
            ..MaintenanceConfig::default()
        })
        // RINGWORK_BENCH_COMPLETION_DELAY_MS=N: the completion flush pace (`max_delay`), to compare
        // paces
        .completion(CompletionConfig {
            max_delay: env_number("RINGWORK_BENCH_COMPLETION_DELAY_MS")
                .map(Duration::from_millis)
                .unwrap_or(CompletionConfig::default().max_delay),
            ..CompletionConfig::default()
        })
        .register(move |_ctx: JobContext, job: BenchJob| {
            let recorder = Arc::clone(&recorder);
            let handler_clock = Arc::clone(&handler_clock);
            async move {
                let started = std::time::Instant::now();
                let ms = (now_us() - job.enq_us) as f64 / 1000.0;
                if !job.held {
                    if let Ok(mut samples) = recorder.lock() {
                        samples.push(ms);
                    }
                }
                if job_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(job_ms)).await;
                }
                // Written before the handler returns, hence before its completion can commit: a
                // SIGKILL can lose a completion (the job is rescued and re-run) but never the
                // line of a committed one.
                println!("{{\"handled\":{}}}", job.n);
                handler_clock.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await?;
    let metrics = client.metrics();
    let running = client.start().await?;
    let reported = AtomicU64::new(0);
    let report_line = || {
        let now = metrics.completed();
        let samples = pickups
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        let delta = now - reported.swap(now, Ordering::Relaxed);
        println!(
            "{}",
            serde_json::json!({
                "completed": delta,
                "pickup_ms": samples,
                "handler_us": handler_us.swap(0, Ordering::Relaxed),
            })
        );
    };
    report_until_signal(&report_line).await?;
    if let Some(producing) = producing {
        // the runner stopped it (SIGUSR2) before it stopped this process; if not, it ends here
        producing.abort();
        let _ = producing.await;
    }
    running.shutdown(Duration::from_secs(30)).await;
    // completions flushed during shutdown
    report_line();
    Ok(())
}

/// `RINGWORK_BENCH_TELEMETRY=1` (inherited by the bench's children): workers and producer pay for
/// observability as a production deployment would: every metric recorded into a Prometheus
/// registry (rendered every 10 s), and info-level spans (`ringwork.process`, the producer's
/// `bench.produce`, whose traceparent every job carries) exported through tracing-opentelemetry and
/// a batch span processor to an exporter that drops them. Unset: neither (the baseline).
/// `metrics` or `traces` turns on only that half (to tell their costs apart).
pub(crate) fn telemetry_part(part: &str) -> bool {
    match std::env::var("RINGWORK_BENCH_TELEMETRY") {
        Ok(value) => value != "metrics" && value != "traces" || value == part,
        Err(_) => false,
    }
}

/// Drops exported spans: the cost measured is recording and batching, not a collector's network.
#[derive(Debug)]
pub(crate) struct DiscardSpans;

impl opentelemetry_sdk::trace::SpanExporter for DiscardSpans {
    async fn export(
        &self,
        _batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// The OpenTelemetry span layer of a bench child when telemetry is requested (see
/// `telemetry_requested`); None otherwise.
pub fn telemetry_trace_layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    if !telemetry_part("traces") {
        return None;
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(DiscardSpans)
        .build();
    let tracer = provider.tracer("ringwork-bench");
    // the provider lives as long as the process: its batch processor thread exports the spans
    std::mem::forget(provider);
    // The layer as docs/operations.md recommends for workers: tracing-opentelemetry's defaults also
    // time every poll of every span (busy/idle), and attach thread and source-location attributes
    // to every span; RINGWORK_BENCH_OTEL_DEFAULTS=1 keeps those defaults (to measure them).
    let lean = std::env::var_os("RINGWORK_BENCH_OTEL_DEFAULTS").is_none();
    Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(!lean)
            .with_threads(!lean)
            .with_location(!lean)
            .with_target(!lean)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
    )
}

/// A number from the environment the bench process passes on to its children (baselines).
pub(crate) fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// A worker process's own producer (`run --producer-in-worker`), from SIGUSR1 to SIGUSR2: the
/// producer's mode, absent in a worker that does not produce.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProduceInWorker {
    /// `rate` (with `--rate`) or `depth` (with `--depth`)
    #[arg(long)]
    mode: Option<String>,
    #[arg(long)]
    rate: Option<u64>,
    #[arg(long)]
    depth: Option<u64>,
}

impl ProduceInWorker {
    pub(crate) fn mode(&self) -> Result<Option<ProduceMode>> {
        self.mode
            .as_deref()
            .map(|mode| ProduceMode::parse(mode, self.rate, self.depth))
            .transpose()
    }
}

/// What a producer process does: insert at a fixed rate, or keep a depth of available jobs.
#[derive(Clone, Copy)]
pub(crate) enum ProduceMode {
    Rate(u64),
    Depth(u64),
}

impl ProduceMode {
    /// `--mode rate --rate R` or `--mode depth --depth N`, both > 0.
    pub(crate) fn parse(mode: &str, rate: Option<u64>, depth: Option<u64>) -> Result<Self> {
        match (mode, rate, depth) {
            ("rate", Some(r), _) if r > 0 => Ok(Self::Rate(r)),
            ("depth", _, Some(d)) if d > 0 => Ok(Self::Depth(d)),
            _ => Err(Error::Config(
                "--mode rate --rate R, or --mode depth --depth N (both > 0)".into(),
            )),
        }
    }
}

/// A producer process's loop, for every system: `send(first, count)` inserts `count` jobs
/// numbered from `first` and returns how many committed; `available()` is the queue's depth.
/// Reports each committed range (`{"committed"}`, the runner accounts for exactly these numbers)
/// and `{"enqueued"}` once a second, until SIGTERM.
pub(crate) async fn produce<A, AF, S, SF>(mode: ProduceMode, available: A, send: S) -> Result<()>
where
    A: Fn() -> AF + Send + 'static,
    AF: std::future::Future<Output = Result<i64>> + Send,
    S: Fn(u64, u64) -> SF + Send + 'static,
    SF: std::future::Future<Output = Result<u64>> + Send,
{
    produce_until(mode, available, send, wait_for_signal()).await
}

/// Produce inside a worker process (`run --producer-in-worker`, as a service's own request
/// handlers enqueue beside its workers): from SIGUSR1 to SIGUSR2, through `send`, which uses the
/// process's own pool. The handlers are installed before this returns, so a signal that comes
/// once the process has reported is never the default action (which ends the process).
pub(crate) fn produce_on_signal<A, AF, S, SF>(
    mode: ProduceMode,
    available: A,
    send: S,
) -> Result<tokio::task::JoinHandle<Result<()>>>
where
    A: Fn() -> AF + Send + Sync + 'static,
    AF: std::future::Future<Output = Result<i64>> + Send,
    S: Fn(u64, u64) -> SF + Send + Sync + 'static,
    SF: std::future::Future<Output = Result<u64>> + Send,
{
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind: SignalKind| {
        signal(kind).map_err(|e| Error::Config(format!("cannot install a SIGUSR handler: {e}")))
    };
    let mut start = handler(SignalKind::user_defined1())?;
    let mut stop = handler(SignalKind::user_defined2())?;
    Ok(tokio::spawn(async move {
        start.recv().await;
        let stopped = async move {
            stop.recv().await;
            Ok(())
        };
        produce_until(mode, available, send, stopped).await
    }))
}

/// The producer loop until `until` resolves: the insert in flight then is finished and counted.
async fn produce_until<A, AF, S, SF, U>(
    mode: ProduceMode,
    available: A,
    send: S,
    until: U,
) -> Result<()>
where
    A: Fn() -> AF + Send + 'static,
    AF: std::future::Future<Output = Result<i64>> + Send,
    S: Fn(u64, u64) -> SF + Send + 'static,
    SF: std::future::Future<Output = Result<u64>> + Send,
    U: std::future::Future<Output = Result<()>>,
{
    let enqueued = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&enqueued);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    // A task of its own, stopped by a flag between inserts: an insert in flight at SIGTERM is
    // finished and counted, never abandoned between commit and count.
    let producing = tokio::spawn(async move {
        let started = Instant::now();
        // committed jobs (for the rate schedule) and the next unused sequence number: every
        // attempt takes fresh numbers, so a batch whose commit reply was lost (it may have
        // committed) never shares numbers with its retry
        let mut sent: u64 = 0;
        let mut next_n: u64 = 0;
        while !stopping.load(Ordering::Relaxed) {
            let want = match mode {
                ProduceMode::Rate(rate) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                    due.saturating_sub(sent).min(10_000)
                }
                ProduceMode::Depth(depth) => {
                    // every 100 ms: the exact count is not free (one probe per shard), and the
                    // harness should not spend the cores it measures; at 10k jobs/s, 5,000 ready
                    // jobs last 500 ms
                    // (RINGWORK_BENCH_DEPTH_PROBE_MS: the baseline of this interval, 20 before)
                    tokio::time::sleep(Duration::from_millis(
                        env_number("RINGWORK_BENCH_DEPTH_PROBE_MS").unwrap_or(100),
                    ))
                    .await;
                    match available().await {
                        Ok(available) => (depth as i64 - available).clamp(0, 5_000) as u64,
                        Err(_) => 0,
                    }
                }
            };
            if want == 0 {
                continue;
            }
            let first = next_n;
            next_n += want;
            match send(first, want).await {
                Ok(committed) => {
                    sent += committed;
                    counter.fetch_add(committed, Ordering::Relaxed);
                    println!(
                        "{}",
                        serde_json::json!({ "committed": [first, first + committed] })
                    );
                }
                // a lost connection (pg-restart): the batch was not committed, or its commit is
                // unknown; count only what is known committed and try again with new numbers
                Err(e) => {
                    eprintln!("producer: insert failed: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    let reported = AtomicU64::new(0);
    let report_line = || {
        let now = enqueued.load(Ordering::Relaxed);
        let delta = now - reported.swap(now, Ordering::Relaxed);
        println!("{}", serde_json::json!({ "enqueued": delta }));
    };
    let report = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            report_line();
        }
    };
    tokio::select! {
        _ = report => {}
        result = until => result?,
    }
    stop.store(true, Ordering::Relaxed);
    let _ = producing.await;
    // the last partial second
    report_line();
    Ok(())
}

/// `ringwork-bench produce`: insert bench jobs at a fixed rate, or keep `depth` available.
pub async fn producer_process(url: &str, schema: &str, mode: ProduceMode) -> Result<()> {
    let (pool, session) = connect(url, 2).await?;
    let (available, send) = bench_inserts(pool, schema, session)?;
    produce(mode, available, send).await
}

/// The producer's two calls on `pool`: the available count (depth mode) and a batch insert; with
/// `session` (behind a transaction pooler), each batch in a transaction of its own.
#[allow(clippy::type_complexity)]
fn bench_inserts(
    pool: PgPool,
    schema: &str,
    session: Option<PgPool>,
) -> Result<(
    impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<i64>> + Send>>
        + Send
        + Sync
        + 'static,
    impl Fn(u64, u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64>> + Send>>
        + Send
        + Sync
        + 'static,
)> {
    let pooler = session.is_some();
    let storage = Storage::new(pool.clone(), SchemaName::new(schema)?);
    let storage = if pooler {
        storage.behind_transaction_pooler(session)
    } else {
        storage
    };
    let depth_probe = storage.clone();
    let available = move || {
        let storage = depth_probe.clone();
        Box::pin(async move { storage.available_count(BENCH_QUEUE).await })
            as std::pin::Pin<Box<dyn std::future::Future<Output = Result<i64>> + Send>>
    };
    let args_bytes = env_number(ARGS_BYTES_ENV).unwrap_or(0) as usize;
    let send = move |first: u64, count: u64| {
        let (pool, storage) = (pool.clone(), storage.clone());
        Box::pin(async move {
            let enq_us = now_us();
            let jobs: Vec<NewJob> = (first..first + count)
                .filter_map(|n| {
                    NewJob::new(&BenchJob {
                        enq_us,
                        n,
                        held: false,
                        pad: args_padding(args_bytes, n),
                    })
                    .ok()
                    .map(|j| j.queue(BENCH_QUEUE))
                })
                .collect();
            // a span per batch: with telemetry on, every job carries its traceparent
            let span = tracing::info_span!("bench.produce", jobs = jobs.len());
            let ids = if pooler {
                // behind a transaction pooler the batch needs a transaction around it
                insert_in_transaction(&pool, &storage, &jobs)
                    .instrument(span)
                    .await?
            } else {
                let mut conn = pool.acquire().await?;
                storage
                    .insert_many(&mut conn, &jobs)
                    .instrument(span)
                    .await?
            };
            Ok(ids.len() as u64)
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64>> + Send>>
    };
    Ok((available, send))
}

async fn insert_in_transaction(
    pool: &PgPool,
    storage: &Storage,
    jobs: &[NewJob],
) -> Result<Vec<i64>> {
    let mut tx = pool.begin().await?;
    let ids = storage.insert_many(&mut tx, jobs).await?;
    tx.commit().await?;
    Ok(ids)
}

/// A pool on `url` and, with `RINGWORK_BENCH_TRANSACTION_POOLER=1` (the failover scenario through
/// PgBouncer in transaction mode), a session pool beside it: PgBouncer's `session` database, for
/// LISTEN and the leader's lock; statements then go unnamed (no statement cache).
async fn connect(url: &str, max: u32) -> Result<(PgPool, Option<PgPool>)> {
    let options: PgConnectOptions = url.parse()?;
    let pooler = env_number("RINGWORK_BENCH_TRANSACTION_POOLER") == Some(1);
    let open = |options: PgConnectOptions, max: u32| {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(if pooler {
                options.statement_cache_capacity(0)
            } else {
                options
            })
    };
    let pool = open(options.clone(), max).await?;
    let session = match pooler {
        true => Some(open(options.database("session"), 2).await?),
        false => None,
    };
    Ok((pool, session))
}
