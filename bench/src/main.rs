//! `ringwork-bench`: the validation and benchmark runner, apart from the product.
//!
//! One run = one system (ringwork, or awa through its adapter program) × one profile (R worker
//! processes × W workers each) × one scenario (a named sequence of phases). The runner starts the
//! worker processes and one producer process, all speaking the same line protocol on stdout:
//!
//! - worker: one JSON line per second, `{"completed": n, "pickup_ms": [..], "handler_us": n}` (jobs
//!   completed, handler-start latencies measured from the `enq_us` the producer put in the job's
//!   args, and the microseconds spent inside handlers, all workers together);
//! - producer: one JSON line per second, `{"enqueued": n}`.
//!
//! It samples the database itself every few seconds (WAL position, commits, dead and live tuples
//! and size per table of the system's schema, queue depth, ring rotations) and summarises each
//! phase: median and peak rates, pickup percentiles, WAL bytes and commits per completed job, dead
//! tuples, and at the end jobs lost (enqueued − completed − still pending, after a drain).

mod check;
mod counts;
mod cpu;
mod disturbances;
mod pgque;
mod processes;
mod report;
mod runner;
mod sampler;
mod scenario;
mod statements;
mod worker;
mod workflows;

use std::time::Duration;

use clap::{Parser, Subcommand};
use ringwork::SchemaName;

use crate::report::markdown;
use crate::runner::run;
use crate::scenario::{parse_profiles, BenchConfig, Scenario, System};
use crate::worker::{
    producer_process, telemetry_trace_layer, worker_process, ProduceInWorker, ProduceMode,
};

#[derive(Parser)]
#[command(
    name = "ringwork-bench",
    version,
    about = "Benchmark and validation runner for ringwork (drops and re-creates its own schemas: never point it at a production database)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// A short sitting (the machine's ceiling around ringwork at saturation, on one server)
    /// compared with bench/baseline.json as a ratio, so a slower machine does not fail it, and
    /// 1x64 with no-op jobs at saturation as a ratio of the same ceiling: exits 1 when either
    /// ratio falls below the baseline's by more than its tolerance (or a cost count rises above).
    ///
    /// Example: ringwork-bench check --database-url postgres://postgres@127.0.0.1/test
    Check {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// The baseline file.
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/baseline.json"))]
        baseline: std::path::PathBuf,
        /// Record this sitting as the new baseline (keeps the file's tolerance and lengths).
        #[arg(long)]
        write: bool,
        /// Seconds per measurement instead of the baseline's (a quicker, noisier look).
        #[arg(long)]
        phase_secs: Option<u64>,
        /// Rounds of ceiling, ringwork, ceiling; the best round's ratio counts (noise only
        /// ever slows a round, a regression slows them all).
        #[arg(long, default_value_t = 2)]
        rounds: u32,
    },
    /// What an exact count costs: `queue_counts` for all queues with many jobs waiting and many
    /// completions kept, before and after the ring is pruned (Markdown on stdout).
    Counts {
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
    /// What a workflow costs against the same number of plain jobs, in one process: a 1 → width →
    /// 1 fan-out / fan-in, and many 10-step workflows (Markdown on stdout).
    Workflows {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        width: usize,
        #[arg(long, default_value_t = 1_000)]
        workflows: usize,
        #[arg(long, default_value_t = 1_000)]
        keys: usize,
        #[arg(long, default_value_t = 32)]
        workers: usize,
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        /// Jobs a second of the shapes inserted at a rate (one insert each).
        #[arg(long, default_value_t = 400)]
        rate: u64,
        /// Seconds of each shape inserted at a rate.
        #[arg(long, default_value_t = 10)]
        rate_secs: u64,
        /// Jobs waiting in the one hot key beside the keyed jobs at a rate.
        #[arg(long, default_value_t = 100_000)]
        hot_key: usize,
    },
    /// Run benchmark scenarios (see docs/benchmarks.md): R worker processes x W workers, one
    /// producer, metrics sampled from the database; JSON and Markdown results under --out.
    Run {
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        /// Comma-separated RxW profiles.
        #[arg(long, default_value = "1x32,4x8")]
        profiles: String,
        /// Comma-separated: saturation, fixed-rate, idle-in-tx, active-readers, crash-under-load,
        /// pg-restart, soak, long-run (the soak's length at the fixed rate; a phase of 20 minutes or
        /// more reports its first and last 10 minutes and memory), open-producer-tx, paused-queue,
        /// long-hold (fixed rate, horizon held),
        /// pg-dump (saturation, pg_dump in a loop, then a clean phase), held-reader (saturation, one
        /// idle REPEATABLE READ transaction holding ACCESS SHARE on every table, then a clean phase),
        /// idle (one job a second, then none: what the processes cost with nothing to do),
        /// standby-readers (saturation while a hot standby of the throwaway cluster serves pg_dump
        /// in a loop and a 60-s report; RINGWORK_BENCH_STANDBY_SETTINGS, RINGWORK_BENCH_DUMP_ARGS),
        /// failover (alone: through PgBouncer, the primary killed and its standby promoted).
        #[arg(long, default_value = "saturation")]
        scenarios: String,
        /// Seconds per phase.
        #[arg(long, default_value_t = 30)]
        phase_secs: u64,
        /// Length of the soak and long-run phases, seconds.
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
        /// Pad each job's arguments to about this many bytes of JSON (0: the bare arguments,
        /// about 35 bytes). ringwork and PgQue; awa's adapter builds its own arguments.
        #[arg(long, default_value_t = 0)]
        args_bytes: usize,
        /// Also run awa 0.6.9 through this adapter binary (bench/awa-adapter), same profiles.
        #[arg(long)]
        awa_adapter: Option<std::path::PathBuf>,
        /// The schema the awa adapter installs into.
        #[arg(long, default_value = "awa")]
        awa_schema: String,
        /// Also run PgQue, installed from this file (`sql/pgque.sql` of a checkout of
        /// github.com/NikolayS/PgQue), same profiles; its tick period is
        /// RINGWORK_BENCH_PGQUE_TICK_MS (default 100).
        #[arg(long)]
        pgque_sql: Option<std::path::PathBuf>,
        /// Skip ringwork (only with --awa-adapter or --pgque-sql).
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
        /// Produce inside worker process 0, on its own pool (as a service's request handlers
        /// enqueue beside its workers), instead of in a process of its own. Not with the awa
        /// adapter, nor the crash scenario (its SIGKILL would end the producer too).
        #[arg(long)]
        producer_in_worker: bool,
    },
    /// A benchmark worker process (line protocol of `ringwork-bench run`).
    #[command(hide = true)]
    Worker {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, default_value = "ringwork_bench")]
        schema: String,
        #[arg(long, default_value_t = 32)]
        workers: usize,
        #[arg(long, default_value_t = 0)]
        job_ms: u64,
        #[command(flatten)]
        produce: ProduceInWorker,
    },
    /// PgQue's processes for `run --pgque-sql` (the adapter protocol, pgque.rs).
    #[command(hide = true)]
    Pgque {
        #[command(subcommand)]
        command: pgque::PgqueCommand,
    },
    /// A benchmark producer process (line protocol of `ringwork-bench run`).
    #[command(hide = true)]
    Produce {
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
}

#[tokio::main]
async fn main() {
    use tracing_subscriber::prelude::*;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // migrations are slow statements by design; sqlx would print each one whole
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        );
    tracing_subscriber::registry()
        .with(log)
        .with(telemetry_trace_layer())
        .init();
    if let Err(e) = run_command(Cli::parse()).await {
        eprintln!("ringwork-bench: {e}");
        std::process::exit(1);
    }
}

async fn run_command(cli: Cli) -> ringwork::Result<()> {
    match cli.command {
        Command::Check {
            database_url,
            baseline,
            write,
            phase_secs,
            rounds,
        } => {
            check::check(check::CheckOptions {
                database_url,
                baseline,
                write,
                phase_secs,
                rounds,
            })
            .await?;
        }
        Command::Workflows {
            database_url,
            width,
            workflows,
            keys,
            workers,
            rounds,
            rate,
            rate_secs,
            hot_key,
        } => {
            let report = workflows::run(workflows::WorkflowsConfig {
                database_url,
                width,
                workflows,
                keys,
                workers,
                rounds: rounds.max(1),
                rate: rate.max(2),
                rate_secs: rate_secs.max(1),
                hot_key,
            })
            .await?;
            print!("{report}");
        }
        Command::Counts {
            database_url,
            waiting,
            completed,
            samples,
            keep_schema,
        } => {
            let report = counts::run(counts::CountsConfig {
                database_url,
                waiting,
                completed,
                samples: samples.max(1),
                keep_schema,
            })
            .await?;
            print!("{report}");
        }
        Command::Run {
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
            args_bytes,
            awa_adapter,
            awa_schema,
            pgque_sql,
            no_ringwork,
            pg_restart_cmd,
            autovacuum,
            analyze_every,
            out,
            label,
            producer_in_worker,
        } => {
            let mut systems = Vec::new();
            if !no_ringwork {
                systems.push(System::Ringwork);
            }
            if let Some(adapter) = awa_adapter {
                systems.push(System::Awa {
                    adapter,
                    schema: SchemaName::new(&awa_schema)?.to_string(),
                });
            }
            if let Some(sql) = pgque_sql {
                systems.push(System::Pgque { sql });
            }
            if producer_in_worker && scenarios.split(',').any(|s| s.trim() == "crash-under-load") {
                return Err(ringwork::Error::Config(
                    "--producer-in-worker: crash-under-load kills worker process 0, the producer's"
                        .into(),
                ));
            }
            if producer_in_worker && systems.iter().any(|s| matches!(s, System::Awa { .. })) {
                return Err(ringwork::Error::Config(
                    "--producer-in-worker: the awa adapter has no producer in its worker".into(),
                ));
            }
            if systems.is_empty() {
                return Err(ringwork::Error::Config(
                    "nothing to run: --no-ringwork without --awa-adapter or --pgque-sql".into(),
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
            let config = BenchConfig {
                database_url,
                systems,
                profiles: parse_profiles(&profiles)?,
                scenarios: scenarios
                    .split(',')
                    .map(|s| Scenario::parse(s.trim()))
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
                args_bytes,
                pg_restart_cmd,
                autovacuum: autovacuum == "on",
                analyze_every: analyze_every.filter(|s| *s > 0).map(Duration::from_secs),
                out_dir: out,
                label,
                producer_in_worker,
            };
            // the producer processes (and the runner's own held jobs) read it from the environment
            std::env::set_var(scenario::ARGS_BYTES_ENV, args_bytes.to_string());
            let results = run(config.clone()).await?;
            println!("{}", markdown(&config, &results));
        }
        Command::Pgque { command } => pgque::run(command).await?,
        Command::Worker {
            database_url,
            schema,
            workers,
            job_ms,
            produce,
        } => {
            worker_process(&database_url, &schema, workers, job_ms, produce.mode()?).await?;
        }
        Command::Produce {
            database_url,
            schema,
            mode,
            rate,
            depth,
        } => {
            producer_process(
                &database_url,
                &schema,
                ProduceMode::parse(&mode, rate, depth)?,
            )
            .await?;
        }
    }
    Ok(())
}
