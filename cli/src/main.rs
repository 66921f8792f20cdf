//! `ringwork` command line: apply migrations, run the demo and the benchmark, drive maintenance
//! and operator actions by hand.

mod bench;
mod bench_counts;
mod demo;
mod embedded;
mod serve;
mod status;

use std::time::Duration;

use clap::{Parser, Subcommand};
use demo::DemoOptions;
use ringwork::{schema, MaintenanceConfig, NewJob, RingSizes, SchemaName, Storage, Unique};
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(
    name = "ringwork",
    version,
    about = "Postgres-native job queue with ring-partitioned storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum CronAction {
    /// Every schedule that fired in about the last week, or is paused.
    List,
    /// Stop a schedule firing (in every process) until it is resumed.
    Pause { schedule: String },
    /// Let a paused schedule fire again.
    Resume { schedule: String },
    /// Fire a schedule once now, beside its own fire times (a process that declares it inserts
    /// the job on its next evaluation pass, once across the fleet; paused or not).
    Trigger { schedule: String },
}

/// Which jobs a bulk operation touches: every option narrows the set.
#[derive(clap::Args)]
struct BulkFilter {
    #[arg(long)]
    queue: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    /// A state to include (repeat for several): available, scheduled, retryable, running (cancel);
    /// scheduled, retryable, dead_lettered (retry); dead_lettered (delete).
    #[arg(long = "state", required = true)]
    states: Vec<String>,
    /// Only jobs at least this many seconds old (created, or for history and dead letters:
    /// finished).
    #[arg(long, value_name = "SECS")]
    older_than: Option<u64>,
}

impl BulkFilter {
    fn into_filter(self) -> ringwork::Result<ringwork::JobFilter> {
        let states = self
            .states
            .iter()
            .map(|s| {
                s.parse::<ringwork::JobStatus>()
                    .map_err(|_| ringwork::Error::Config(format!("unknown state {s:?}")))
            })
            .collect::<ringwork::Result<Vec<_>>>()?;
        Ok(ringwork::JobFilter {
            queue: self.queue,
            kind: self.kind,
            states,
            older_than: self.older_than.map(Duration::from_secs),
        })
    }
}

#[derive(Subcommand)]
enum BulkAction {
    /// Cancel the matching waiting and running jobs (as `ringwork cancel` does, one by one).
    Cancel {
        #[command(flatten)]
        filter: BulkFilter,
        #[arg(long, default_value = "cancelled by operator (bulk)")]
        reason: String,
    },
    /// Make matching scheduled and retryable jobs due now; run matching dead-lettered jobs again.
    Retry {
        #[command(flatten)]
        filter: BulkFilter,
    },
    /// Delete matching dead-lettered jobs (terminal history is reclaimed by retention only).
    Delete {
        #[command(flatten)]
        filter: BulkFilter,
    },
}

#[derive(Subcommand)]
enum DlqAction {
    /// List dead-lettered jobs, oldest failure first.
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Run a dead-lettered job again (fresh attempts, higher run_lease).
    Retry { job_id: i64 },
    /// Delete dead-lettered jobs: one by id, a whole queue's, or (with --all) every one.
    Purge {
        job_id: Option<i64>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Apply the schema migrations (idempotent; safe to run from several processes).
    Migrate {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Grant a role what a worker, producer or reader needs in the schema, and nothing more (no
    /// CREATE). Run as the schema's owner, after `migrate`; idempotent (docs/operations.md, "Roles").
    Grant {
        /// The role to grant to (it must exist).
        role: String,
        /// worker (claims, completes, maintenance), producer (inserts jobs), reader (status, a
        /// read-only dashboard).
        #[arg(long)]
        access: ringwork::roles::Access,
        /// Print the statements instead of running them.
        #[arg(long)]
        print: bool,
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Enqueue N no-op jobs and run them; prints throughput, pickup latency, dead tuples and WAL/job.
    /// Without DATABASE_URL it runs on a throwaway PostgreSQL cluster that is removed on exit.
    Demo {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork_demo")]
        schema: String,
        #[arg(long, default_value_t = 100_000)]
        jobs: u64,
        #[arg(long, default_value_t = 32)]
        workers: usize,
        /// Hold the MVCC horizon for the whole run (a session sits in `BEGIN; SELECT
        /// txid_current()`), the condition under which row-mutating queues bloat.
        #[arg(long)]
        hold_horizon: bool,
    },
    /// Pause a queue (nothing is claimed from it; enqueue still works).
    Pause {
        queue: String,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Set a queue's fleet-wide limits (every process's claims hold them); with neither option,
    /// remove them.
    Limit {
        queue: String,
        /// At most this many of the queue's jobs running (claimed) at once, across the fleet.
        #[arg(long)]
        max_running: Option<u32>,
        /// At most this many claims per `--per` seconds, across the fleet.
        #[arg(long)]
        rate: Option<u32>,
        #[arg(long, default_value_t = 1.0)]
        per: f64,
        /// Limits per value of this arg field (dotted for nested: `customer.id`), across the
        /// fleet: `--key-max-running`, `--key-rate` per `--key-per` seconds, or both.
        #[arg(long)]
        key_arg: Option<String>,
        #[arg(long, requires = "key_arg")]
        key_max_running: Option<u32>,
        #[arg(long, requires = "key_arg")]
        key_rate: Option<u32>,
        #[arg(long, default_value_t = 1.0)]
        key_per: f64,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Resume a paused queue.
    Resume {
        queue: String,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Cancel a job by id (available, scheduled or running).
    Cancel {
        job_id: i64,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Cancel the job holding a unique key: the same kind, args and options the producer used.
    CancelUnique {
        #[arg(long)]
        kind: String,
        /// The job's arguments as JSON (compared canonically: key order does not matter).
        #[arg(long)]
        args: String,
        /// The job's queue; with --by-queue it is part of the key.
        #[arg(long, default_value = "default")]
        queue: String,
        #[arg(long)]
        by_queue: bool,
        /// The unique period in seconds, if the producer used one (the current bucket is cancelled).
        #[arg(long)]
        period: Option<u64>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Exact per-queue counts: available, scheduled, retryable, running, completed, failed,
    /// cancelled, dead-lettered.
    Counts {
        /// One queue (default: all).
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Periodic schedules: list their fires, pause or resume one. Schedules are declared in code
    /// (`ClientBuilder::periodic`); the maintenance leader fires them.
    Cron {
        #[command(subcommand)]
        action: CronAction,
        #[arg(long, env = "DATABASE_URL", global = true)]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork", global = true)]
        schema: String,
    },
    /// Cancel, retry or delete many jobs by filter (queue, kind, state, age), in short bounded
    /// transactions of at most 500 jobs; jobs that arrive while it runs are not touched.
    Bulk {
        #[command(subcommand)]
        action: BulkAction,
        #[arg(long, env = "DATABASE_URL", global = true)]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork", global = true)]
        schema: String,
    },
    /// Answer a job that waits for an external callback: complete, fail, retry, resume (its
    /// handler runs again and reads --payload), or heartbeat (extend its timeout).
    Callback {
        /// complete, fail, retry, resume or heartbeat.
        action: String,
        /// The callback id the handler registered (64 hex characters).
        id: String,
        /// JSON for resume (what JobContext::callback_payload reads).
        #[arg(long)]
        payload: Option<String>,
        /// The error recorded by fail or retry.
        #[arg(long)]
        error: Option<String>,
        /// Heartbeat: the new timeout, in seconds from now (default 300).
        #[arg(long)]
        extend_secs: Option<f64>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Inspect and act on the dead-letter queue.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
        #[arg(long, env = "DATABASE_URL", global = true)]
        database_url: Option<String>,
        #[arg(long, default_value = "ringwork", global = true)]
        schema: String,
    },
    /// One screen for an operator: exact counts per queue, both rings and why a sealed slot is
    /// not pruned, the backends whose locks make prune give up, and whoever holds back the
    /// database's MVCC horizon (long transactions, replication slots, prepared transactions).
    Status {
        /// Print it again every this many seconds (clearing the screen).
        #[arg(long, value_name = "SECS")]
        watch: Option<u64>,
        /// One JSON object per refresh, for scripts.
        #[arg(long)]
        json: bool,
        /// List sessions whose transaction has been open at least this many seconds.
        #[arg(long, default_value_t = 10)]
        horizon_min_secs: u64,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Serve /metrics (Prometheus text), /healthz and /readyz over HTTP, optionally push the same
    /// metrics over OTLP, and take part in the maintenance election.
    Serve {
        /// Address to listen on (port 0: any free port, printed on start).
        #[arg(long, default_value = "127.0.0.1:9464")]
        listen: String,
        /// Also push metrics to this OTLP/HTTP endpoint (e.g. http://collector:4318/v1/metrics).
        #[arg(long, env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")]
        otlp_endpoint: Option<String>,
        /// Seconds between OTLP pushes.
        #[arg(long, default_value_t = 10)]
        otlp_interval_secs: u64,
        /// Do not run maintenance from this process, even when elected.
        #[arg(long)]
        no_maintenance: bool,
        /// Count horizon holders whose transaction has been open at least this many seconds.
        #[arg(long, default_value_t = 10)]
        horizon_min_secs: u64,
        /// Serve the web dashboard at /dashboard (read-only unless a token or
        /// --dashboard-behind-proxy turns its actions on; a token also puts its pages behind
        /// sign-in). Implied by --dashboard-token and --dashboard-behind-proxy.
        #[arg(long)]
        dashboard: bool,
        /// Turn the dashboard's actions (pause, retry, cancel, purge) on for browsers that sign in
        /// with this token; without it (or --dashboard-behind-proxy) the dashboard is read-only.
        #[arg(
            long,
            env = "RINGWORK_DASHBOARD_TOKEN",
            conflicts_with = "dashboard_behind_proxy"
        )]
        dashboard_token: Option<String>,
        /// Turn the dashboard's actions on for every visitor: an authenticating proxy in front of
        /// this server decides who gets in.
        #[arg(long)]
        dashboard_behind_proxy: bool,
        /// Seconds between the samples of the dashboard's overview (it keeps an hour of them).
        #[arg(long, default_value_t = 10)]
        dashboard_sample_secs: u64,
        /// A host name (or address) the dashboard is reached by, beside localhost, 127.0.0.1,
        /// [::1] and the --listen address; repeat for several. A request naming another host in
        /// its Host header is refused (421), which stops DNS-rebinding pages.
        #[arg(long = "dashboard-host", value_name = "NAME")]
        dashboard_hosts: Vec<String>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Show both rings' slots, why a sealed slot is not pruned yet, and which backends hold
    /// locks that make prune give up (pid, application, how long).
    Ring {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// Show where a job is now.
    Job {
        job_id: i64,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
    },
    /// What an exact count costs: `queue_counts` for all queues with many jobs waiting and many
    /// completions kept, before and after the ring is pruned (Markdown on stdout).
    BenchCounts {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value_t = 1_000_000)]
        waiting: usize,
        #[arg(long, default_value_t = 100_000)]
        completed: usize,
        #[arg(long, default_value_t = 50)]
        samples: usize,
        /// Leave the benchmark's schema in place afterwards (with DATABASE_URL), to inspect it.
        #[arg(long)]
        keep_schema: bool,
    },
    /// Run benchmark scenarios (see docs/bench/README.md): R worker processes x W workers, one
    /// producer, metrics sampled from the database; JSON and Markdown results under --out.
    Bench {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// Comma-separated RxW profiles.
        #[arg(long, default_value = "1x32,4x8")]
        profiles: String,
        /// Comma-separated: saturation, fixed-rate, idle-in-tx, active-readers, crash-under-load,
        /// pg-restart, soak, open-producer-tx, paused-queue, long-hold (fixed rate, horizon held),
        /// pg-dump (saturation, pg_dump in a loop, then a clean phase), held-reader (saturation, one
        /// idle REPEATABLE READ transaction holding ACCESS SHARE on every table, then a clean phase).
        #[arg(long, default_value = "saturation")]
        scenarios: String,
        /// Seconds per phase.
        #[arg(long, default_value_t = 30)]
        phase_secs: u64,
        /// Length of the soak phase, seconds.
        #[arg(long, default_value_t = 600)]
        soak_secs: u64,
        /// Work per job: sleep this many ms (0 = no-op).
        #[arg(long, default_value_t = 1)]
        job_ms: u64,
        /// Producer rate for fixed-rate, jobs/s.
        #[arg(long, default_value_t = 200)]
        rate: u64,
        /// Ready jobs the producer keeps for every other scenario.
        #[arg(long, default_value_t = 5_000)]
        depth: u64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 2)]
        sample_secs: u64,
        /// REPEATABLE READ scanner sessions in the active-readers scenario.
        #[arg(long, default_value_t = 2)]
        readers: usize,
        /// open-producer-tx: producer transactions held open at once.
        #[arg(long, default_value_t = 64)]
        held_txs: usize,
        /// open-producer-tx: seconds each held transaction stays open.
        #[arg(long, default_value_t = 10)]
        hold_secs: u64,
        /// paused-queue: jobs enqueued into the paused queue when its phase starts.
        #[arg(long, default_value_t = 100_000)]
        paused_jobs: u64,
        /// Also run awa 0.6.9 through this adapter binary (bench/awa-adapter), same profiles.
        #[arg(long)]
        awa_adapter: Option<std::path::PathBuf>,
        /// The schema the awa adapter installs into.
        #[arg(long, default_value = "awa")]
        awa_schema: String,
        /// Skip ringwork (only with --awa-adapter).
        #[arg(long)]
        no_ringwork: bool,
        /// Shell command restarting the DATABASE_URL server (pg-restart scenario).
        #[arg(long)]
        pg_restart_cmd: Option<String>,
        /// Autovacuum on the throwaway cluster: on (PostgreSQL's default, as in production) or
        /// off. With DATABASE_URL the server's own setting is used and reported.
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        autovacuum: String,
        /// Run ANALYZE on the schema's tables every this many seconds during the phases.
        #[arg(long)]
        analyze_every: Option<u64>,
        #[arg(long, default_value = "target/bench")]
        out: std::path::PathBuf,
        /// File name (without extension) of the JSON and Markdown results.
        #[arg(long, default_value = "bench")]
        label: String,
    },
    /// A benchmark worker process (line protocol of `ringwork bench`).
    #[command(hide = true)]
    BenchWorker {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork_bench")]
        schema: String,
        #[arg(long, default_value_t = 32)]
        workers: usize,
        #[arg(long, default_value_t = 0)]
        job_ms: u64,
    },
    /// A benchmark producer process (line protocol of `ringwork bench`).
    #[command(hide = true)]
    BenchProduce {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork_bench")]
        schema: String,
        /// rate or depth
        #[arg(long)]
        mode: String,
        #[arg(long)]
        rate: Option<u64>,
        #[arg(long)]
        depth: Option<u64>,
    },
    /// Run a worker process for the `sleep` job kind until interrupted (used by the crash tests and
    /// the benchmarks). Prints "ready" once started and "completed N" every second.
    #[command(hide = true)]
    Work {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
        #[arg(long, default_value = "default")]
        queue: String,
        #[arg(long, default_value_t = 16)]
        workers: usize,
        /// Seconds without heartbeat or completion before a claim is rescued.
        #[arg(long, default_value_t = 60.0)]
        stale_after: f64,
        /// Seconds between ring rotations.
        #[arg(long, default_value_t = 1.0)]
        rotate_every: f64,
    },
    /// Run one maintenance pass (rotate, rescue, prune, promote, DLQ retention) and print what it did.
    Maintain {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork")]
        schema: String,
        /// Seconds without heartbeat or completion before a claim is rescued; use the same value
        /// as your workers, or this pass may rescue their live long jobs.
        #[arg(long, default_value_t = 60.0)]
        stale_after: f64,
    },
}

/// The form `--database-url` takes, for the error that refuses another.
const DATABASE_URL_FORM: &str = "postgres://user[:password]@host[:port]/database[?sslmode=...]";

/// `--database-url` as connection options: a PostgreSQL URL, or a clear error that shows the form
/// expected and never the URL itself (it may hold a password). Statements are not logged, even
/// slow ones: a command's statements are ringwork's own, and sqlx would print them whole.
pub(crate) fn database_options(url: &str) -> ringwork::Result<sqlx::postgres::PgConnectOptions> {
    use sqlx::ConnectOptions;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        let scheme = match url.split_once("://") {
            Some((scheme, _)) => format!("a {scheme}:// URL"),
            None => "no URL scheme".to_string(),
        };
        return Err(ringwork::Error::Config(format!(
            "--database-url (or DATABASE_URL) must be a PostgreSQL URL, {DATABASE_URL_FORM}; got {scheme}"
        )));
    }
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| {
        ringwork::Error::Config(format!(
            "--database-url (or DATABASE_URL) is not a valid PostgreSQL URL ({e}); expected {DATABASE_URL_FORM}"
        ))
    })?;
    Ok(options.disable_statement_logging())
}

/// A small pool on `url` that fails within seconds, naming the cause, when the server is refused,
/// unreachable or unknown (a pool alone would retry for its whole acquire timeout).
pub(crate) async fn connect(url: &str, max: u32) -> ringwork::Result<sqlx::PgPool> {
    let options = database_options(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    ringwork::check_reachable(&pool).await?;
    Ok(pool)
}

/// A storage handle on an installed schema this binary can run against.
async fn open_storage(url: &str, schema: &str) -> ringwork::Result<Storage> {
    open_storage_with(url, schema, 2).await
}

/// `open_storage` for a command whose `--database-url` is optional on the command line (a global
/// option of its subcommands) but needed.
async fn open_storage_from(url: Option<String>, schema: &str) -> ringwork::Result<Storage> {
    let url =
        url.ok_or_else(|| ringwork::Error::Config("set --database-url or DATABASE_URL".into()))?;
    open_storage(&url, schema).await
}

/// `open_storage` with a pool of `max` connections.
async fn open_storage_with(url: &str, schema: &str, max: u32) -> ringwork::Result<Storage> {
    let schema = SchemaName::new(schema)?;
    let pool = connect(url, max).await?;
    let mut conn = pool.acquire().await?;
    let version = schema::installed_version(&mut conn, &schema).await?;
    schema::check_not_newer(&schema, version)?;
    if version.is_none() {
        return Err(ringwork::Error::Config(format!(
            "schema {schema} is not installed; run `ringwork migrate` first"
        )));
    }
    drop(conn);
    Ok(Storage::new(pool, schema))
}

#[tokio::main]
async fn main() {
    use tracing_subscriber::prelude::*;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // colour for a person at a terminal, never into a pipe or a file
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    tracing_subscriber::registry()
        .with(log)
        .with(bench::telemetry_trace_layer())
        .init();
    if let Err(e) = run(Cli::parse()).await {
        eprintln!("ringwork: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> ringwork::Result<()> {
    match cli.command {
        Command::Migrate {
            database_url,
            schema: name,
        } => {
            let schema = SchemaName::new(&name)?;
            let pool = connect(&database_url, 2).await?;
            let report = schema::migrate(&pool, &schema, RingSizes::default()).await?;
            if report.applied.is_empty() {
                println!(
                    "schema {schema}: tables up to date (version {}, checksums verified)",
                    schema::SCHEMA_VERSION
                );
            } else {
                println!("schema {schema}: applied migrations {:?}", report.applied);
            }
            if report.functions_reloaded {
                println!(
                    "schema {schema}: installed functions {}",
                    report.functions_checksum
                );
            } else {
                println!(
                    "schema {schema}: functions up to date ({})",
                    report.functions_checksum
                );
            }
        }
        Command::Grant {
            role,
            access,
            print,
            database_url,
            schema,
        } => {
            let name = SchemaName::new(&schema)?;
            let statements = ringwork::roles::grant_statements(&name, &role, access)?;
            if print {
                for statement in &statements {
                    println!("{statement};");
                }
                return Ok(());
            }
            let storage = open_storage_from(database_url, &schema).await?;
            let mut tx = storage.pool().begin().await?;
            for statement in &statements {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            println!(
                "granted {role} {} access to schema {name} ({} statements)",
                access.as_str(),
                statements.len()
            );
        }
        Command::Demo {
            database_url,
            schema,
            jobs,
            workers,
            hold_horizon,
        } => {
            demo::run(DemoOptions {
                database_url,
                schema,
                jobs,
                workers,
                hold_horizon,
            })
            .await?;
        }
        Command::BenchCounts {
            database_url,
            waiting,
            completed,
            samples,
            keep_schema,
        } => {
            let report = bench_counts::run(bench_counts::CountsConfig {
                database_url,
                waiting,
                completed,
                samples: samples.max(1),
                keep_schema,
            })
            .await?;
            print!("{report}");
        }
        Command::Bench {
            database_url,
            profiles,
            scenarios,
            phase_secs,
            soak_secs,
            job_ms,
            rate,
            depth,
            sample_secs,
            readers,
            held_txs,
            hold_secs,
            paused_jobs,
            awa_adapter,
            awa_schema,
            no_ringwork,
            pg_restart_cmd,
            autovacuum,
            analyze_every,
            out,
            label,
        } => {
            let mut systems = Vec::new();
            if !no_ringwork {
                systems.push(bench::System::Ringwork);
            }
            if let Some(adapter) = awa_adapter {
                systems.push(bench::System::Awa {
                    adapter,
                    schema: SchemaName::new(&awa_schema)?.to_string(),
                });
            }
            if systems.is_empty() {
                return Err(ringwork::Error::Config(
                    "nothing to run: --no-ringwork without --awa-adapter".into(),
                ));
            }
            if !(1..=150).contains(&held_txs) || hold_secs == 0 {
                return Err(ringwork::Error::Config(
                    "--held-txs must be 1..=150 and --hold-secs > 0".into(),
                ));
            }
            if phase_secs < 4 || sample_secs == 0 || rate == 0 || depth == 0 {
                return Err(ringwork::Error::Config(
                    "--phase-secs must be >= 4; --sample-secs, --rate and --depth > 0".into(),
                ));
            }
            let config = bench::BenchConfig {
                database_url,
                systems,
                profiles: bench::parse_profiles(&profiles)?,
                scenarios: scenarios
                    .split(',')
                    .map(|s| bench::Scenario::parse(s.trim()))
                    .collect::<ringwork::Result<_>>()?,
                phase: Duration::from_secs(phase_secs),
                soak: Duration::from_secs(soak_secs),
                job_ms,
                rate,
                depth,
                sample_every: Duration::from_secs(sample_secs),
                readers,
                held_txs,
                hold: Duration::from_secs(hold_secs),
                paused_jobs,
                pg_restart_cmd,
                autovacuum: autovacuum == "on",
                analyze_every: analyze_every.filter(|s| *s > 0).map(Duration::from_secs),
                out_dir: out,
                label,
            };
            let results = bench::run(config.clone()).await?;
            println!("{}", bench::markdown(&config, &results));
        }
        Command::BenchWorker {
            database_url,
            schema,
            workers,
            job_ms,
        } => {
            bench::worker_process(&database_url, &schema, workers, job_ms).await?;
        }
        Command::BenchProduce {
            database_url,
            schema,
            mode,
            rate,
            depth,
        } => {
            let (rate, depth) = match (mode.as_str(), rate, depth) {
                ("rate", Some(r), _) if r > 0 => (Some(r), None),
                ("depth", _, Some(d)) if d > 0 => (None, Some(d)),
                _ => {
                    return Err(ringwork::Error::Config(
                        "--mode rate --rate R, or --mode depth --depth N (both > 0)".into(),
                    ))
                }
            };
            bench::producer_process(&database_url, &schema, rate, depth).await?;
        }
        Command::Work {
            database_url,
            schema,
            queue,
            workers,
            stale_after,
            rotate_every,
        } => {
            let seconds = |value: f64, flag: &str| {
                Duration::try_from_secs_f64(value)
                    .map_err(|e| ringwork::Error::Config(format!("{flag}: {e}")))
            };
            let maintenance = MaintenanceConfig {
                tick: Duration::from_millis(100),
                stale_after: seconds(stale_after, "--stale-after")?,
                rotate_interval: seconds(rotate_every, "--rotate-every")?,
                ..MaintenanceConfig::default()
            };
            demo::work(&database_url, &schema, &queue, workers, maintenance).await?;
        }
        Command::Pause {
            queue,
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            let changed = storage.set_queue_paused(&queue, true).await?;
            println!(
                "queue {queue:?} paused{}",
                if changed { "" } else { " (already)" }
            );
        }
        Command::Limit {
            queue,
            max_running,
            rate,
            per,
            key_arg,
            key_max_running,
            key_rate,
            key_per,
            database_url,
            schema,
        } => {
            for (name, secs) in [("--per", per), ("--key-per", key_per)] {
                if !(secs.is_finite() && secs > 0.0) {
                    return Err(ringwork::Error::Config(format!(
                        "{name} must be a positive number of seconds, got {secs}"
                    )));
                }
            }
            let limits = ringwork::QueueLimits {
                max_running,
                rate: rate.map(|n| (n, Duration::from_secs_f64(per.min(86_400.0)))),
                per_key: key_arg.map(|path| ringwork::KeyLimit {
                    path: path.split('.').map(str::to_string).collect(),
                    max_running: key_max_running,
                    rate: key_rate.map(|n| (n, Duration::from_secs_f64(key_per.min(86_400.0)))),
                }),
            };
            let storage = open_storage(&database_url, &schema).await?;
            let changed = storage.set_queue_limits(&queue, limits.clone()).await?;
            println!(
                "queue {queue:?}: {limits:?}{}",
                if changed { "" } else { " (unchanged)" }
            );
        }
        Command::Resume {
            queue,
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            let changed = storage.set_queue_paused(&queue, false).await?;
            println!(
                "queue {queue:?} resumed{}",
                if changed { "" } else { " (was not paused)" }
            );
        }
        Command::Cancel {
            job_id,
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            println!(
                "job {job_id}: {:?}",
                storage.cancel_job(job_id, "cancelled by operator").await?
            );
        }
        Command::CancelUnique {
            kind,
            args,
            queue,
            by_queue,
            period,
            database_url,
            schema,
        } => {
            let args: serde_json::Value = serde_json::from_str(&args)
                .map_err(|e| ringwork::Error::Config(format!("--args is not JSON: {e}")))?;
            let mut unique = Unique::default();
            if by_queue {
                unique = unique.by_queue();
            }
            if let Some(secs) = period {
                unique = unique.by_period(Duration::from_secs(secs));
            }
            let job = NewJob::from_parts(&kind, args)?
                .queue(&queue)
                .unique(unique);
            let storage = open_storage(&database_url, &schema).await?;
            println!(
                "{:?}",
                storage.cancel_unique(&job, "cancelled by operator").await?
            );
        }
        Command::Counts {
            queue,
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            let counts = storage.queue_counts(queue.as_deref()).await?;
            print!("{}", status::counts_table(&counts, ""));
        }
        Command::Cron {
            action,
            database_url,
            schema,
        } => {
            let storage = open_storage_from(database_url, &schema).await?;
            match action {
                CronAction::List => {
                    println!("schedule\tpaused\tlast fire\tlast job\tfires kept");
                    for s in storage.schedules().await? {
                        println!(
                            "{}\t{}\t{}\t{}\t{}",
                            s.schedule,
                            s.paused,
                            s.last_fire_at
                                .map(|t| t.to_rfc3339())
                                .unwrap_or_else(|| "-".into()),
                            s.last_job_id
                                .map(|id| id.to_string())
                                .unwrap_or_else(|| "-".into()),
                            s.fires
                        );
                    }
                }
                CronAction::Pause { schedule } => {
                    let changed = storage.set_schedule_paused(&schedule, true).await?;
                    println!(
                        "schedule {schedule:?} {}",
                        if changed {
                            "paused"
                        } else {
                            "was paused already"
                        }
                    );
                }
                CronAction::Resume { schedule } => {
                    let changed = storage.set_schedule_paused(&schedule, false).await?;
                    println!(
                        "schedule {schedule:?} {}",
                        if changed {
                            "resumed (missed fires follow its policy)"
                        } else {
                            "was not paused"
                        }
                    );
                }
                CronAction::Trigger { schedule } => {
                    let requested = storage.trigger_schedule(&schedule).await?;
                    let known = storage
                        .schedules()
                        .await?
                        .iter()
                        .any(|s| s.schedule == schedule);
                    println!(
                        "schedule {schedule:?}: {}",
                        if requested {
                            "triggered; a process that declares it fires it on its next pass"
                        } else {
                            "a trigger is pending already"
                        }
                    );
                    if !known {
                        eprintln!(
                            "note: {schedule:?} has not fired in the last week; the trigger waits for a process that declares it"
                        );
                    }
                }
            }
        }
        Command::Bulk {
            action,
            database_url,
            schema,
        } => {
            let storage = open_storage_from(database_url, &schema).await?;
            let (verb, outcome) = match action {
                BulkAction::Cancel { filter, reason } => (
                    "cancelled",
                    storage.bulk_cancel(&filter.into_filter()?, &reason).await?,
                ),
                BulkAction::Retry { filter } => {
                    ("retried", storage.bulk_retry(&filter.into_filter()?).await?)
                }
                BulkAction::Delete { filter } => (
                    "deleted",
                    storage.bulk_delete(&filter.into_filter()?).await?,
                ),
            };
            println!(
                "{verb} {} of {} matching jobs in {} steps",
                outcome.changed, outcome.matched, outcome.steps
            );
        }
        Command::Callback {
            action,
            id,
            payload,
            error,
            extend_secs,
            database_url,
            schema,
        } => {
            let payload = payload
                .map(|text| {
                    serde_json::from_str(&text)
                        .map_err(|e| ringwork::Error::Config(format!("--payload is not JSON: {e}")))
                })
                .transpose()?;
            let action =
                ringwork::CallbackAction::from_parts(&action, payload, error, extend_secs)?;
            let storage = open_storage_from(database_url, &schema).await?;
            let outcome = storage.resolve_callback(&id, action).await?;
            println!("{}", outcome.as_str());
        }
        Command::Dlq {
            action,
            database_url,
            schema,
        } => {
            let storage = open_storage_from(database_url, &schema).await?;
            match action {
                DlqAction::List { queue, limit } => {
                    for dead in storage.dlq_list(queue.as_deref(), limit).await? {
                        println!(
                            "{}\t{}\t{}\tattempt {}\t{}\t{}",
                            dead.job_id,
                            dead.queue,
                            dead.kind,
                            dead.attempt,
                            dead.failed_at,
                            dead.error.unwrap_or_default()
                        );
                    }
                }
                DlqAction::Retry { job_id } => {
                    if storage.dlq_retry(job_id).await? {
                        println!("job {job_id} scheduled to run again");
                    } else {
                        println!("job {job_id} is not in the dead-letter queue");
                    }
                }
                DlqAction::Purge { job_id, queue, all } => {
                    if job_id.is_none() && queue.is_none() && !all {
                        return Err(ringwork::Error::Config(
                            "name a job id, --queue, or --all".into(),
                        ));
                    }
                    let n = storage.dlq_purge(queue.as_deref(), job_id).await?;
                    println!("purged {n} dead-lettered job(s)");
                }
            }
        }
        Command::Status {
            watch,
            json,
            horizon_min_secs,
            database_url,
            schema,
        } => {
            if watch == Some(0) {
                return Err(ringwork::Error::Config(
                    "--watch must be at least 1 second".into(),
                ));
            }
            let storage = open_storage(&database_url, &schema).await?;
            status::run(
                &storage,
                json,
                watch.map(Duration::from_secs),
                Duration::from_secs(horizon_min_secs),
            )
            .await?;
        }
        Command::Serve {
            listen,
            otlp_endpoint,
            otlp_interval_secs,
            no_maintenance,
            horizon_min_secs,
            dashboard,
            dashboard_token,
            dashboard_behind_proxy,
            dashboard_sample_secs,
            dashboard_hosts,
            database_url,
            schema,
        } => {
            let dashboard = match (dashboard, dashboard_token, dashboard_behind_proxy) {
                (_, Some(token), _) => Some(ringwork::dashboard::Actions::Token(token)),
                (_, None, true) => Some(ringwork::dashboard::Actions::BehindProxy),
                (true, None, false) => Some(ringwork::dashboard::Actions::ReadOnly),
                (false, None, false) => None,
            };
            // refuses a schema that is not installed, or newer than this binary
            let storage = open_storage_with(&database_url, &schema, 4).await?;
            serve::run(
                storage.pool().clone(),
                serve::ServeOptions {
                    listen,
                    otlp_endpoint,
                    otlp_interval: Duration::from_secs(otlp_interval_secs),
                    maintenance: !no_maintenance,
                    horizon_min_age: Duration::from_secs(horizon_min_secs),
                    schema,
                    dashboard,
                    dashboard_sample: Duration::from_secs(dashboard_sample_secs.max(1)),
                    dashboard_hosts,
                },
            )
            .await?;
        }
        Command::Ring {
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            println!(
                "{:<6} {:>4} {:>10} {:<8} {:<25} blocker",
                "ring", "slot", "generation", "state", "since"
            );
            for s in storage.ring_slots().await? {
                println!(
                    "{:<6} {:>4} {:>10} {:<8} {:<25} {}",
                    s.ring,
                    s.slot,
                    s.generation,
                    s.state,
                    s.state_since
                        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
                        .unwrap_or_else(|| "-".into()),
                    s.blocker.unwrap_or_default()
                );
            }
            let blockers = storage.prune_blockers().await?;
            if blockers.is_empty() {
                println!("\nno backend holds a lock on a sealed slot or an archive bucket");
            } else {
                println!("\nlocks that make prune (or archive retention) give up:");
                for b in blockers {
                    println!(
                        "  {} slot {:>2}: pid {} ({}) {}, transaction open {:.1} s, {}: {}",
                        b.ring,
                        b.slot,
                        b.pid,
                        b.application.unwrap_or_default(),
                        b.backend_state.unwrap_or_default(),
                        b.xact_age_secs.unwrap_or(0.0),
                        b.lock_modes,
                        b.query.unwrap_or_default().replace('\n', " ")
                    );
                }
            }
        }
        Command::Job {
            job_id,
            database_url,
            schema,
        } => {
            let storage = open_storage(&database_url, &schema).await?;
            match storage.load_job(job_id).await? {
                Some(record) => {
                    let s = &record.state;
                    println!(
                        "job {}: {} (queue {}, kind {}, attempt {}, run_lease {}){}",
                        s.job_id,
                        s.state,
                        s.queue,
                        s.kind,
                        s.attempt,
                        s.run_lease,
                        s.detail
                            .as_deref()
                            .map(|d| format!(": {d}"))
                            .unwrap_or_default()
                    );
                    if let Some(p) = &record.progress {
                        println!(
                            "  progress {:.1} % (run_lease {}, {}): {}{}",
                            p.progress.percent,
                            p.run_lease,
                            p.recorded_at.to_rfc3339(),
                            p.progress.message,
                            p.progress
                                .checkpoint
                                .as_ref()
                                .map(|c| format!("  checkpoint {c}"))
                                .unwrap_or_default()
                        );
                    }
                    for step in record.history {
                        println!(
                            "  run_lease {:>3}  {:<13} {}  {}",
                            step.run_lease,
                            step.state,
                            step.at.to_rfc3339(),
                            step.error.unwrap_or_default()
                        );
                    }
                }
                None => {
                    println!("job {job_id}: not found (never existed, or its history aged out)")
                }
            }
        }
        Command::Maintain {
            database_url,
            schema: name,
            stale_after,
        } => {
            let schema = SchemaName::new(&name)?;
            let pool = connect(&database_url, 2).await?;
            let mut conn = pool.acquire().await?;
            let version = schema::installed_version(&mut conn, &schema).await?;
            schema::check_not_newer(&schema, version)?;
            drop(conn);
            let storage = Storage::new(pool, schema);
            let config = MaintenanceConfig {
                rotate_interval: Duration::ZERO,
                stale_after: Duration::try_from_secs_f64(stale_after)
                    .map_err(|e| ringwork::Error::Config(format!("--stale-after: {e}")))?,
                ..MaintenanceConfig::default()
            };
            let report = ringwork::maintenance::tick(&storage, &config).await?;
            println!("{report:?}");
        }
    }
    Ok(())
}
