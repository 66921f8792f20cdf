//! `ringwork bench`: the validation and benchmark runner.
//!
//! One run = one system (ringwork, or awa through its adapter program) × one profile (R worker
//! processes × W workers each) × one scenario (a named sequence of phases). The runner starts the
//! worker processes and one producer process, all speaking the same line protocol on stdout:
//!
//! - worker: one JSON line per second, `{"completed": n, "pickup_ms": [..]}` (jobs completed and
//!   handler-start latencies measured from the `enq_us` the producer put in the job's args);
//! - producer: one JSON line per second, `{"enqueued": n}`.
//!
//! It samples the database itself every few seconds (WAL position, commits, dead and live tuples
//! and size per table of the system's schema, queue depth, ring rotations) and summarises each
//! phase: median and peak rates, pickup percentiles, WAL bytes and commits per completed job, dead
//! tuples, and at the end jobs lost (enqueued − completed − still pending, after a drain).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::embedded::EmbeddedPostgres;
use ringwork::schema::churn_class;
use ringwork::SchemaName;
use ringwork::Storage;
use ringwork::{Client, CompletionConfig, JobContext, JobError, MaintenanceConfig, QueueConfig};
use ringwork::{Error, Result};
use ringwork::{JobArgs, NewJob};
use tracing::Instrument;

/// The queue every benchmark job goes to.
pub const BENCH_QUEUE: &str = "default";
/// The ringwork schema benchmarks run in (dropped and recreated per run).
pub const BENCH_SCHEMA: &str = "ringwork_bench";

/// The benchmark job: `enq_us` is the producer's wall clock at insert (microseconds since the
/// epoch), from which the worker measures pickup latency; `n` is the producer's sequence number of
/// the job (0, 1, 2, … over committed inserts), which the worker reports when the handler is done
/// so the runner can account for every job. The worker's `--job-ms` is the work.
#[derive(Serialize, Deserialize)]
pub struct BenchJob {
    pub enq_us: i64,
    pub n: u64,
    /// Enqueued by a transaction the runner held open (open-producer-tx): its wait is the hold,
    /// not dispatch, so it is left out of the pickup-latency samples.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

impl JobArgs for BenchJob {
    const KIND: &'static str = "bench_noop";
}

/// A system under test.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum System {
    Ringwork,
    /// awa through the adapter program at this path (bench/awa-adapter).
    Awa {
        adapter: PathBuf,
        schema: String,
    },
}

impl System {
    pub fn name(&self) -> &'static str {
        match self {
            System::Ringwork => "ringwork",
            System::Awa { .. } => "awa",
        }
    }

    fn schema(&self) -> &str {
        match self {
            System::Ringwork => BENCH_SCHEMA,
            System::Awa { schema, .. } => schema,
        }
    }
}

/// Named phase sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    Saturation,
    FixedRate,
    IdleInTx,
    ActiveReaders,
    CrashUnderLoad,
    PgRestart,
    Soak,
    OpenProducerTx,
    PausedQueue,
    LongHold,
    PgDump,
    HeldReader,
}

impl Scenario {
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "saturation" => Self::Saturation,
            "fixed-rate" => Self::FixedRate,
            "idle-in-tx" => Self::IdleInTx,
            "active-readers" => Self::ActiveReaders,
            "crash-under-load" => Self::CrashUnderLoad,
            "pg-restart" => Self::PgRestart,
            "soak" => Self::Soak,
            "open-producer-tx" => Self::OpenProducerTx,
            "paused-queue" => Self::PausedQueue,
            "long-hold" => Self::LongHold,
            "pg-dump" => Self::PgDump,
            "held-reader" => Self::HeldReader,
            other => {
                return Err(Error::Config(format!(
                    "unknown scenario {other:?}: saturation, fixed-rate, idle-in-tx, \
                     active-readers, crash-under-load, pg-restart, soak, open-producer-tx, \
                     paused-queue, long-hold, pg-dump, held-reader"
                )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Saturation => "saturation",
            Self::FixedRate => "fixed-rate",
            Self::IdleInTx => "idle-in-tx",
            Self::ActiveReaders => "active-readers",
            Self::CrashUnderLoad => "crash-under-load",
            Self::PgRestart => "pg-restart",
            Self::Soak => "soak",
            Self::OpenProducerTx => "open-producer-tx",
            Self::PausedQueue => "paused-queue",
            Self::LongHold => "long-hold",
            Self::PgDump => "pg-dump",
            Self::HeldReader => "held-reader",
        }
    }

    /// The phases, in order. The producer mode is fixed per scenario: fixed-rate produces at
    /// `rate`, every other scenario keeps `depth` jobs ready (saturation).
    fn phases(self, config: &BenchConfig) -> Vec<Phase> {
        let p = config.phase;
        let phase = |name: &'static str, disturbance| Phase {
            name,
            duration: p,
            disturbance,
        };
        // an undisturbed phase of at most a minute, beside a long disturbed one: a reference rate,
        // or the time in which the system must recover
        let short = |name: &'static str| Phase {
            name,
            duration: p.min(Duration::from_secs(60)),
            disturbance: Disturbance::None,
        };
        match self {
            Self::Saturation => vec![phase("saturation", Disturbance::None)],
            Self::FixedRate => vec![phase("fixed-rate", Disturbance::None)],
            Self::IdleInTx => vec![
                phase("clean", Disturbance::None),
                phase("held-horizon", Disturbance::HoldHorizon),
            ],
            // the issue-11 shape: a transaction pins the horizon for the whole (long) phase while
            // jobs flow at `rate`; the clean phase is only the reference rate
            Self::LongHold => vec![
                short("clean"),
                phase("held-horizon", Disturbance::HoldHorizon),
            ],
            // dumps back to back for the phase, then a clean phase in which prune must catch up
            Self::PgDump => vec![
                short("clean"),
                phase("pg-dump", Disturbance::PgDump),
                short("after"),
            ],
            // pg_dump's locks and snapshot without its work: what the ring pays for the reader
            // alone, apart from the cores a reader's own scans take
            Self::HeldReader => vec![
                short("clean"),
                phase("held-reader", Disturbance::HeldReader),
                short("after"),
            ],
            Self::ActiveReaders => vec![
                phase("clean", Disturbance::None),
                phase("readers", Disturbance::Readers),
            ],
            Self::CrashUnderLoad => vec![
                phase("clean", Disturbance::None),
                phase("crash", Disturbance::KillWorker),
            ],
            Self::PgRestart => vec![
                phase("clean", Disturbance::None),
                phase("pg-restart", Disturbance::RestartPostgres),
            ],
            Self::OpenProducerTx => vec![
                phase("clean", Disturbance::None),
                phase("open-tx", Disturbance::OpenProducerTxs),
            ],
            // a short clean phase: the paused one is the measurement, and it should be long
            Self::PausedQueue => vec![short("clean"), phase("paused", Disturbance::PausedQueue)],
            Self::Soak => vec![Phase {
                name: "soak",
                duration: config.soak,
                disturbance: Disturbance::None,
            }],
        }
    }

    fn fixed_rate(self) -> bool {
        matches!(
            self,
            Self::FixedRate | Self::OpenProducerTx | Self::PausedQueue | Self::LongHold
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disturbance {
    None,
    /// A session sits in `BEGIN; SELECT txid_current()` for the phase (pins the MVCC horizon).
    HoldHorizon,
    /// Sessions loop REPEATABLE READ transactions that scan every table of the schema.
    Readers,
    /// `pg_dump` of the whole benchmark database to /dev/null, back to back.
    PgDump,
    /// One REPEATABLE READ transaction reads a row of every table of the schema (ACCESS SHARE on
    /// each, ring children included, and a snapshot), then sits idle for the phase: a report left
    /// open, or pg_dump's locks without its work.
    HeldReader,
    /// SIGKILL one worker process a few seconds in; restart it a few seconds later.
    KillWorker,
    /// Restart PostgreSQL a few seconds in.
    RestartPostgres,
    /// `held_txs` producer transactions, each enqueuing one job into the benchmark queue and
    /// holding its transaction open `hold` before committing, over and over (ringwork only).
    OpenProducerTxs,
    /// `paused_jobs` jobs wait in a paused queue (`bench_paused`) for the whole phase, and more
    /// trickle in (10 a second), while the benchmark queue runs; then the queue is resumed and
    /// drained by the harness (ringwork only).
    PausedQueue,
}

/// The paused queue of the paused-queue scenario.
const PAUSED_QUEUE: &str = "bench_paused";

struct Phase {
    name: &'static str,
    duration: Duration,
    disturbance: Disturbance,
}

/// Everything a `ringwork bench` invocation asks for.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub database_url: Option<String>,
    pub systems: Vec<System>,
    /// (worker processes, workers per process)
    pub profiles: Vec<(usize, usize)>,
    pub scenarios: Vec<Scenario>,
    pub phase: Duration,
    pub soak: Duration,
    pub job_ms: u64,
    pub rate: u64,
    pub depth: u64,
    pub sample_every: Duration,
    pub readers: usize,
    /// open-producer-tx: producer transactions held open at once, and how long each stays open.
    pub held_txs: usize,
    pub hold: Duration,
    /// paused-queue: jobs enqueued into the paused queue (`bench_paused`) when its phase starts.
    pub paused_jobs: u64,
    /// Shell command that restarts the server at `database_url` (pg-restart scenario); the
    /// embedded cluster restarts itself.
    pub pg_restart_cmd: Option<String>,
    /// Autovacuum on the throwaway cluster (default on, as on any production server). Ignored
    /// for DATABASE_URL, whose own setting is reported.
    pub autovacuum: bool,
    /// Run ANALYZE on every table of the system's schema this often during the phases, so plans
    /// meet fresh statistics (the planner-drift check).
    pub analyze_every: Option<Duration>,
    pub out_dir: PathBuf,
    pub label: String,
}

/// Parse "1x32,4x8" into profiles.
pub fn parse_profiles(text: &str) -> Result<Vec<(usize, usize)>> {
    text.split(',')
        .map(|p| {
            let (r, w) = p
                .trim()
                .split_once('x')
                .ok_or_else(|| Error::Config(format!("profile {p:?} is not RxW, e.g. 4x8")))?;
            let parse = |v: &str| {
                v.parse::<usize>()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .ok_or_else(|| Error::Config(format!("profile {p:?}: {v:?} is not 1..=256")))
            };
            Ok((parse(r)?, parse(w)?))
        })
        .collect()
}

// ------------------------------------------------------------------------------------------------
// Results
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub peak: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TableStat {
    pub live: i64,
    pub dead: i64,
    pub bytes: i64,
    /// ringwork's churn class, when the table is ringwork's.
    pub class: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseResult {
    pub name: String,
    pub seconds: f64,
    pub completed_per_s: Spread,
    pub enqueued_per_s: Spread,
    pub depth: Spread,
    pub completed: u64,
    pub pickup_ms_p50: f64,
    pub pickup_ms_p95: f64,
    pub pickup_ms_p99: f64,
    pub wal_bytes_per_job: f64,
    pub commits_per_job: f64,
    /// Highest dead-tuple count of any ring table seen in any sample (ringwork only).
    pub ring_dead_peak: Option<i64>,
    /// Dead tuples of the whole schema at the end of the phase, and the peak over its samples.
    pub schema_dead_end: i64,
    pub schema_dead_peak: i64,
    pub tables_end: BTreeMap<String, TableStat>,
    /// ringwork only: ring rotations and slot prunes during the phase, sealed slots at its end.
    pub rotations: Option<i64>,
    pub prunes: Option<i64>,
    pub sealed_at_end: Option<i64>,
    /// For crash / restart phases: seconds from the disturbance's end until a sample was back at
    /// 90 % of the previous phase's median rate (None: never within the phase).
    pub recovery_s: Option<f64>,
    /// ringwork only: the ring over the phase, one point per sample.
    #[serde(default)]
    pub ring_over_time: Vec<RingPoint>,
    /// paused-queue phase: what became of the paused queue's jobs.
    #[serde(default)]
    pub paused_queue: Option<PausedQueueResult>,
}

/// The ring at one sample: bytes of the ring tables (all children; the archive apart), jobs parked,
/// sealed slots.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RingPoint {
    pub at: f64,
    pub ring_bytes: i64,
    /// The archive's tables (terminal history kept for its keep; grows with it by design).
    #[serde(default)]
    pub archive_bytes: i64,
    pub parked_rows: i64,
    pub sealed: i64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PausedQueueResult {
    pub enqueued: u64,
    /// Distinct jobs claimed (and completed) by the drain after resume.
    pub drained: u64,
    /// Jobs claimed more than once by the drain.
    pub duplicates: u64,
    /// Enqueued jobs the drain never got (must be 0).
    pub lost: u64,
    pub drain_s: f64,
    /// Jobs of the paused queue waiting parked, just before resume.
    pub parked_before_resume: i64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    pub system: String,
    pub profile: String,
    pub scenario: String,
    pub job_ms: u64,
    pub phases: Vec<PhaseResult>,
    pub enqueued: u64,
    pub completed: u64,
    pub pending_after_drain: i64,
    /// Jobs the producer committed whose handler never reported finishing, less those still
    /// pending after the drain (must be 0). Counted by producer sequence number, so a SIGKILLed
    /// process's unreported completion counts (its handled line is written before the completion
    /// can commit) and a crash re-run is not double counted.
    pub lost: i64,
    /// Handler runs beyond one per job: at-least-once re-runs after a crash or a lost completion.
    pub extra_completions: i64,
    /// The server the run measured: version, autovacuum, and the ANALYZE cadence if any.
    pub server: String,
}

// ------------------------------------------------------------------------------------------------
// Child processes
// ------------------------------------------------------------------------------------------------

#[derive(Default)]
struct Counters {
    completed: AtomicU64,
    enqueued: AtomicU64,
    pickup_ms: Mutex<Vec<f64>>,
    /// Producer sequence numbers whose handler finished, in any process (a re-run after a crash
    /// reports its job again; the set keeps it once).
    handled: Mutex<std::collections::HashSet<u64>>,
    /// Every handled line, re-runs included.
    handled_lines: AtomicU64,
    /// Sequence-number ranges of committed producer batches.
    committed: Mutex<Vec<(u64, u64)>>,
}

#[derive(Deserialize)]
struct ChildLine {
    #[serde(default)]
    completed: Option<u64>,
    #[serde(default)]
    enqueued: Option<u64>,
    #[serde(default)]
    pickup_ms: Vec<f64>,
    #[serde(default)]
    handled: Option<u64>,
    /// A committed producer batch: sequence numbers [from, to).
    #[serde(default)]
    committed: Option<(u64, u64)>,
}

fn spawn_child(program: &PathBuf, args: &[String], counters: Arc<Counters>) -> Result<Child> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Config(format!("cannot start {}: {e}", program.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Config("child stdout not piped".into()))?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(parsed) = serde_json::from_str::<ChildLine>(&line) else {
                continue; // "ready" and other chatter
            };
            if let Some(n) = parsed.completed {
                counters.completed.fetch_add(n, Ordering::Relaxed);
            }
            if let Some(n) = parsed.enqueued {
                counters.enqueued.fetch_add(n, Ordering::Relaxed);
            }
            if let Some(range) = parsed.committed {
                if let Ok(mut committed) = counters.committed.lock() {
                    committed.push(range);
                }
            }
            if let Some(n) = parsed.handled {
                counters.handled_lines.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut handled) = counters.handled.lock() {
                    handled.insert(n);
                }
            }
            if !parsed.pickup_ms.is_empty() {
                if let Ok(mut samples) = counters.pickup_ms.lock() {
                    samples.extend(parsed.pickup_ms);
                }
            }
        }
    });
    Ok(child)
}

async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
    }
    if tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

struct Processes {
    system: System,
    url: String,
    workers_per_process: usize,
    job_ms: u64,
    counters: Arc<Counters>,
    workers: Vec<Child>,
    producer: Option<Child>,
}

impl Processes {
    fn program(&self) -> Result<PathBuf> {
        match &self.system {
            System::Ringwork => std::env::current_exe()
                .map_err(|e| Error::Config(format!("cannot find this binary: {e}"))),
            System::Awa { adapter, .. } => Ok(adapter.clone()),
        }
    }

    fn common(&self) -> Vec<String> {
        let mut args = vec!["--database-url".to_string(), self.url.clone()];
        if self.system == System::Ringwork {
            args.extend(["--schema".to_string(), BENCH_SCHEMA.to_string()]);
        }
        args
    }

    fn spawn_worker(&mut self) -> Result<()> {
        let verb = match self.system {
            System::Ringwork => "bench-worker",
            System::Awa { .. } => "work",
        };
        let mut args = vec![verb.to_string()];
        args.extend(self.common());
        args.extend([
            "--workers".to_string(),
            self.workers_per_process.to_string(),
            "--job-ms".to_string(),
            self.job_ms.to_string(),
        ]);
        let child = spawn_child(&self.program()?, &args, Arc::clone(&self.counters))?;
        self.workers.push(child);
        Ok(())
    }

    fn spawn_producer(&mut self, fixed_rate: Option<u64>, depth: u64) -> Result<()> {
        let verb = match self.system {
            System::Ringwork => "bench-produce",
            System::Awa { .. } => "produce",
        };
        let mut args = vec![verb.to_string()];
        args.extend(self.common());
        match fixed_rate {
            Some(rate) => args.extend([
                "--mode".to_string(),
                "rate".to_string(),
                "--rate".to_string(),
                rate.to_string(),
            ]),
            None => args.extend([
                "--mode".to_string(),
                "depth".to_string(),
                "--depth".to_string(),
                depth.to_string(),
            ]),
        }
        self.producer = Some(spawn_child(
            &self.program()?,
            &args,
            Arc::clone(&self.counters),
        )?);
        Ok(())
    }

    /// One `depth` line of the adapter: the exact counts, or (`fast`) only a cheap `available`.
    async fn adapter_counts(&self, fast: bool) -> Result<serde_json::Value> {
        let mut args = vec!["depth".to_string()];
        if fast {
            args.push("--fast".to_string());
        }
        args.extend(self.common());
        let output = Command::new(self.program()?)
            .args(&args)
            .output()
            .await
            .map_err(|e| Error::Config(format!("adapter depth: {e}")))?;
        serde_json::from_slice(&output.stdout)
            .map_err(|e| Error::Config(format!("adapter depth output: {e}")))
    }

    /// Pending jobs (available + scheduled + retryable + running).
    async fn pending(&self, storage: Option<&Storage>) -> Result<i64> {
        match (&self.system, storage) {
            (System::Ringwork, Some(storage)) => {
                let counts = storage.queue_counts(Some(BENCH_QUEUE)).await?;
                Ok(counts
                    .iter()
                    .map(|c| c.available + c.scheduled + c.retryable + c.running)
                    .sum())
            }
            _ => {
                let v = self.adapter_counts(false).await?;
                Ok(["available", "scheduled", "retryable", "running"]
                    .iter()
                    .map(|k| v.get(k).and_then(|x| x.as_i64()).unwrap_or(0))
                    .sum())
            }
        }
    }

    /// Available jobs only (queue depth). For awa, the adapter's cheap probe: its exact count
    /// costs seconds per call at tens of thousands of stored jobs.
    async fn depth(&self, storage: Option<&Storage>) -> Result<i64> {
        match (&self.system, storage) {
            (System::Ringwork, Some(storage)) => storage.available_count(BENCH_QUEUE).await,
            _ => {
                let v = self.adapter_counts(true).await?;
                Ok(v.get("available").and_then(|x| x.as_i64()).unwrap_or(0))
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Sampling
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Sample {
    at: f64,
    completed: u64,
    enqueued: u64,
    wal_lsn: i64,
    commits: i64,
    depth: i64,
    tables: BTreeMap<String, TableStat>,
    rotations: i64,
    sealed: i64,
}

async fn sample(
    admin: &PgPool,
    processes: &Processes,
    storage: Option<&Storage>,
    started: Instant,
) -> Result<Sample> {
    let (wal_lsn, commits): (i64, i64) = sqlx::query_as(
        "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8,
                (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())",
    )
    .fetch_one(admin)
    .await?;
    let schema = processes.system.schema().to_string();
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_live_tup, n_dead_tup, pg_total_relation_size(relid)
         FROM pg_stat_user_tables WHERE schemaname = $1",
    )
    .bind(&schema)
    .fetch_all(admin)
    .await?;
    let tables = rows
        .into_iter()
        .map(|(name, live, dead, bytes)| {
            let class = match processes.system {
                System::Ringwork => churn_class(&name).map(|c| format!("{c:?}").to_lowercase()),
                System::Awa { .. } => None,
            };
            (
                name,
                TableStat {
                    live,
                    dead,
                    bytes,
                    class,
                },
            )
        })
        .collect();
    let (rotations, sealed) = match processes.system {
        System::Ringwork => sqlx::query_as::<_, (i64, i64)>(&format!(
            "SELECT (SELECT max(generation) FROM {schema}.queue_ring_slots)
                    + (SELECT max(generation) FROM {schema}.claim_ring_slots),
                    (SELECT count(*) FROM {schema}.queue_ring_slots WHERE state = 'sealed')
                    + (SELECT count(*) FROM {schema}.claim_ring_slots WHERE state = 'sealed')"
        ))
        .fetch_one(admin)
        .await
        .unwrap_or((0, 0)),
        System::Awa { .. } => (0, 0),
    };
    Ok(Sample {
        at: started.elapsed().as_secs_f64(),
        completed: processes.counters.completed.load(Ordering::Relaxed),
        enqueued: processes.counters.enqueued.load(Ordering::Relaxed),
        wal_lsn,
        commits,
        depth: processes.depth(storage).await.unwrap_or(-1),
        tables,
        rotations,
        sealed,
    })
}

fn spread(values: &[f64]) -> Spread {
    if values.is_empty() {
        return Spread::default();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Spread {
        median: sorted[sorted.len() / 2],
        peak: sorted[sorted.len() - 1],
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summarise(
    name: &str,
    samples: &[Sample],
    mut pickups: Vec<f64>,
    recovery_s: Option<f64>,
    ringwork: bool,
) -> PhaseResult {
    let first = samples.first().cloned().unwrap_or_default();
    let last = samples.last().cloned().unwrap_or_default();
    let rate = |f: fn(&Sample) -> u64| -> Vec<f64> {
        samples
            .windows(2)
            .map(|w| (f(&w[1]) - f(&w[0])) as f64 / (w[1].at - w[0].at).max(1e-3))
            .collect()
    };
    let completed = last.completed - first.completed;
    let per_job = |delta: i64| {
        if completed == 0 {
            0.0
        } else {
            delta as f64 / completed as f64
        }
    };
    pickups.sort_by(|a, b| a.total_cmp(b));
    let schema_dead = |s: &Sample| s.tables.values().map(|t| t.dead).sum::<i64>();
    let ring_dead = |s: &Sample| {
        s.tables
            .values()
            .filter(|t| t.class.as_deref() == Some("ring"))
            .map(|t| t.dead)
            .max()
            .unwrap_or(0)
    };
    let rotations = last.rotations - first.rotations;
    PhaseResult {
        name: name.to_string(),
        seconds: last.at - first.at,
        completed_per_s: spread(&rate(|s| s.completed)),
        enqueued_per_s: spread(&rate(|s| s.enqueued)),
        depth: spread(
            &samples
                .iter()
                .filter(|s| s.depth >= 0)
                .map(|s| s.depth as f64)
                .collect::<Vec<_>>(),
        ),
        completed,
        pickup_ms_p50: percentile(&pickups, 0.50),
        pickup_ms_p95: percentile(&pickups, 0.95),
        pickup_ms_p99: percentile(&pickups, 0.99),
        wal_bytes_per_job: per_job(last.wal_lsn - first.wal_lsn),
        commits_per_job: per_job(last.commits - first.commits),
        ring_dead_peak: ringwork.then(|| samples.iter().map(ring_dead).max().unwrap_or(0)),
        schema_dead_end: schema_dead(&last),
        schema_dead_peak: samples.iter().map(schema_dead).max().unwrap_or(0),
        tables_end: last.tables.clone(),
        rotations: ringwork.then_some(rotations),
        // every rotation seals a slot; a prune frees one
        prunes: ringwork.then_some(rotations - (last.sealed - first.sealed)),
        sealed_at_end: ringwork.then_some(last.sealed),
        recovery_s,
        ring_over_time: if ringwork {
            samples.iter().map(ring_point).collect()
        } else {
            Vec::new()
        },
        paused_queue: None,
    }
}

fn ring_point(s: &Sample) -> RingPoint {
    RingPoint {
        at: s.at,
        ring_bytes: s
            .tables
            .iter()
            .filter(|(name, t)| {
                t.class.as_deref() == Some("ring") && !name.starts_with("archived_")
            })
            .map(|(_, t)| t.bytes)
            .sum(),
        archive_bytes: s
            .tables
            .iter()
            .filter(|(name, _)| name.starts_with("archived_"))
            .map(|(_, t)| t.bytes)
            .sum(),
        parked_rows: s.tables.get("parked_entries").map_or(0, |t| t.live),
        sealed: s.sealed,
    }
}

// ------------------------------------------------------------------------------------------------
// The runner
// ------------------------------------------------------------------------------------------------

/// Where the database is, and how to restart it.
struct Server {
    url: String,
    embedded: Option<EmbeddedPostgres>,
    restart_cmd: Option<String>,
}

/// "PostgreSQL 15.x, autovacuum on" for the report: a figure measured with autovacuum off is the
/// favourable case (no statistics, so no plan drift; no vacuum competing for the disk).
async fn describe_server(admin: &PgPool, config: &BenchConfig) -> Result<String> {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(admin)
        .await?;
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(admin)
        .await?;
    let mut text = format!("PostgreSQL {version}, autovacuum {autovacuum}");
    if let Some(every) = config.analyze_every {
        text.push_str(&format!(", ANALYZE every {} s", every.as_secs()));
    }
    Ok(text)
}

/// ANALYZE every table of `schema` every `every` (a partitioned parent's ANALYZE covers its
/// partitions), until the task is aborted; adds the time each
/// round took to `spent_us` (ANALYZE competes with the run for CPU, so the report shows its cost).
async fn analyze_loop(url: String, schema: String, every: Duration, spent_us: Arc<AtomicU64>) {
    let Ok(pool) = PgPoolOptions::new().max_connections(1).connect(&url).await else {
        eprintln!("\n   cannot connect for ANALYZE; the run goes on without it");
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND (c.relkind = 'p' OR (c.relkind = 'r' AND NOT c.relispartition))",
        )
        .bind(&schema)
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
        if !tables.is_empty() {
            let round = Instant::now();
            if let Err(e) = sqlx::raw_sql(&format!("ANALYZE {}", tables.join(", ")))
                .execute(&pool)
                .await
            {
                eprintln!("\n   ANALYZE failed: {e}");
            }
            spent_us.fetch_add(round.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
    }
}

impl Server {
    async fn restart(&self) -> Result<()> {
        if let Some(pg) = &self.embedded {
            return pg.restart().map_err(|e| Error::Config(e.to_string()));
        }
        let Some(cmd) = &self.restart_cmd else {
            return Err(Error::Config(
                "pg-restart needs --pg-restart-cmd when DATABASE_URL names an external server"
                    .into(),
            ));
        };
        let status = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .status()
            .await
            .map_err(|e| Error::Config(format!("pg restart command: {e}")))?;
        if !status.success() {
            return Err(Error::Config(format!("pg restart command exited {status}")));
        }
        Ok(())
    }
}

pub async fn run(config: BenchConfig) -> Result<Vec<RunResult>> {
    if config.scenarios.contains(&Scenario::PgRestart)
        && config.database_url.is_some()
        && config.pg_restart_cmd.is_none()
    {
        return Err(Error::Config(
            "the pg-restart scenario needs --pg-restart-cmd with DATABASE_URL (or no DATABASE_URL, \
             so the runner starts and restarts its own cluster)"
                .into(),
        ));
    }
    let server = match &config.database_url {
        Some(url) => Server {
            url: url.clone(),
            embedded: None,
            restart_cmd: config.pg_restart_cmd.clone(),
        },
        None => {
            eprintln!("no DATABASE_URL: starting a throwaway PostgreSQL cluster…");
            let autovacuum = if config.autovacuum { "on" } else { "off" };
            let pg = EmbeddedPostgres::start_with(&[("autovacuum", autovacuum)])
                .map_err(|e| Error::Config(e.to_string()))?;
            Server {
                url: pg.url(),
                embedded: Some(pg),
                restart_cmd: None,
            }
        }
    };
    std::fs::create_dir_all(&config.out_dir)
        .map_err(|e| Error::Config(format!("cannot create {:?}: {e}", config.out_dir)))?;
    let mut results = Vec::new();
    for scenario in &config.scenarios {
        for profile in &config.profiles {
            for system in &config.systems {
                let result = run_one(&config, &server, system, *profile, *scenario).await?;
                print_run(&result);
                results.push(result);
                write_outputs(&config, &results)?;
            }
        }
    }
    Ok(results)
}

async fn connect_admin(url: &str) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?)
}

async fn run_one(
    config: &BenchConfig,
    server: &Server,
    system: &System,
    (processes_n, workers): (usize, usize),
    scenario: Scenario,
) -> Result<RunResult> {
    let profile = format!("{processes_n}x{workers}");
    eprintln!(
        "== {} {profile} {} (job {} ms)",
        system.name(),
        scenario.name(),
        config.job_ms
    );
    let admin = connect_admin(&server.url).await?;
    // fresh schema per run
    let schema = system.schema().to_string();
    SchemaName::new(&schema).map_err(|_| Error::Config(format!("bad schema name {schema:?}")))?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&admin)
        .await?;
    let storage = match system {
        System::Ringwork => {
            // RINGWORK_BENCH_QUEUE_SLOTS / RINGWORK_BENCH_CLAIM_SLOTS: ring sizes other than the
            // defaults (what the partition count costs the hot path)
            let defaults = ringwork::RingSizes::default();
            let client = Client::builder(admin.clone())
                .schema(BENCH_SCHEMA)
                .rings(ringwork::RingSizes {
                    queue_slots: env_number("RINGWORK_BENCH_QUEUE_SLOTS")
                        .map_or(defaults.queue_slots, |n| n as u32),
                    claim_slots: env_number("RINGWORK_BENCH_CLAIM_SLOTS")
                        .map_or(defaults.claim_slots, |n| n as u32),
                })
                .build()
                .await?;
            // RINGWORK_BENCH_MAX_RUNNING=N, RINGWORK_BENCH_RATE_LIMIT=N (per second),
            // RINGWORK_BENCH_KEY_MAX_RUNNING=N (per value of the job's `n`, unique per job: the
            // per-key machinery runs on every claim and never binds): fleet-wide limits on the
            // bench queue, to measure what a limited queue's claims cost
            let limits = ringwork::QueueLimits {
                max_running: env_number("RINGWORK_BENCH_MAX_RUNNING").map(|n| n as u32),
                rate: env_number("RINGWORK_BENCH_RATE_LIMIT")
                    .map(|n| (n as u32, Duration::from_secs(1))),
                per_key: env_number("RINGWORK_BENCH_KEY_MAX_RUNNING")
                    .map(|n| ringwork::KeyLimit::arg("n").max_running(n as u32)),
            };
            if limits != ringwork::QueueLimits::default() {
                client
                    .storage()
                    .set_queue_limits(BENCH_QUEUE, limits.clone())
                    .await?;
                println!("bench queue limits: {limits:?}");
            }
            Some(client.storage().clone())
        }
        System::Awa { adapter, .. } => {
            let status = Command::new(adapter)
                .args(["migrate", "--database-url", &server.url])
                .status()
                .await
                .map_err(|e| Error::Config(format!("awa adapter migrate: {e}")))?;
            if !status.success() {
                return Err(Error::Config(format!(
                    "awa adapter migrate exited {status}"
                )));
            }
            None
        }
    };
    let mut processes = Processes {
        system: system.clone(),
        url: server.url.clone(),
        workers_per_process: workers,
        job_ms: config.job_ms,
        counters: Arc::default(),
        workers: Vec::new(),
        producer: None,
    };
    for _ in 0..processes_n {
        processes.spawn_worker()?;
    }
    let fixed_rate = scenario.fixed_rate().then_some(config.rate);
    processes.spawn_producer(fixed_rate, config.depth)?;

    let server_note = describe_server(&admin, config).await?;
    let analyze_us = Arc::new(AtomicU64::new(0));
    let analyzer = config.analyze_every.map(|every| {
        tokio::spawn(analyze_loop(
            server.url.clone(),
            schema.clone(),
            every,
            Arc::clone(&analyze_us),
        ))
    });
    let started = Instant::now();
    let mut phases = Vec::new();
    let mut previous_median: Option<f64> = None;
    for phase in scenario.phases(config) {
        let result = run_phase(
            config,
            server,
            &admin,
            &mut processes,
            storage.as_ref(),
            &phase,
            started,
            previous_median,
        )
        .await?;
        previous_median = Some(result.completed_per_s.median);
        phases.push(result);
    }

    if let Some(analyzer) = &analyzer {
        analyzer.abort();
    }
    // stop producing, let the queue drain, stop the workers, account for every job
    if let Some(mut producer) = processes.producer.take() {
        stop_child(&mut producer).await;
    }
    let drain_until = Instant::now() + Duration::from_secs(90);
    let mut pending = processes.pending(storage.as_ref()).await.unwrap_or(-1);
    while pending != 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        pending = processes.pending(storage.as_ref()).await.unwrap_or(-1);
        eprint!("\r   draining: {pending} pending   ");
    }
    eprintln!();
    for worker in &mut processes.workers {
        stop_child(worker).await;
    }
    // the stdout readers have seen the last lines once the children are gone
    tokio::time::sleep(Duration::from_millis(200)).await;
    let enqueued = processes.counters.enqueued.load(Ordering::Relaxed);
    let completed = processes.counters.completed.load(Ordering::Relaxed);
    let committed = processes
        .counters
        .committed
        .lock()
        .map(|c| c.clone())
        .unwrap_or_default();
    let (missing, handled_distinct) = processes
        .counters
        .handled
        .lock()
        .map(|h| {
            let missing = committed
                .iter()
                .flat_map(|&(from, to)| from..to)
                .filter(|n| !h.contains(n))
                .count() as i64;
            (missing, h.len() as i64)
        })
        .unwrap_or((enqueued as i64, 0));
    admin.close().await;
    Ok(RunResult {
        system: system.name().to_string(),
        profile,
        scenario: scenario.name().to_string(),
        job_ms: config.job_ms,
        phases,
        enqueued,
        completed,
        pending_after_drain: pending,
        lost: (missing - pending.max(0)).max(0),
        server: match analyzer {
            Some(_) => format!(
                "{server_note} ({:.1} s spent in ANALYZE)",
                analyze_us.load(Ordering::Relaxed) as f64 / 1e6
            ),
            None => server_note,
        },
        extra_completions: (processes.counters.handled_lines.load(Ordering::Relaxed) as i64
            - handled_distinct)
            .max(0),
    })
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    config: &BenchConfig,
    server: &Server,
    admin: &PgPool,
    processes: &mut Processes,
    storage: Option<&Storage>,
    phase: &Phase,
    started: Instant,
    previous_median: Option<f64>,
) -> Result<PhaseResult> {
    let ringwork = processes.system == System::Ringwork;
    if let Ok(mut samples) = processes.counters.pickup_ms.lock() {
        samples.clear();
    }
    // disturbances that last the whole phase
    let mut horizon = None;
    let stop_readers = Arc::new(tokio::sync::Notify::new());
    let mut readers = Vec::new();
    let stop_holders = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut holders = Vec::new();
    let mut held_child: Option<Child> = None;
    let mut trickle = None;
    match phase.disturbance {
        Disturbance::HoldHorizon => {
            let mut tx = admin.begin().await?;
            sqlx::query("SELECT txid_current()")
                .execute(&mut *tx)
                .await?;
            horizon = Some(tx);
        }
        Disturbance::HeldReader => {
            let mut tx = admin.begin().await?;
            let tables = repeatable_read_tables(&mut tx, processes.system.schema()).await?;
            for table in &tables {
                sqlx::query(&format!("SELECT 1 FROM {table} LIMIT 1"))
                    .execute(&mut *tx)
                    .await?;
            }
            eprintln!(
                "   held-reader: ACCESS SHARE held on {} tables of the schema",
                tables.len()
            );
            horizon = Some(tx);
        }
        Disturbance::Readers => {
            for _ in 0..config.readers {
                readers.push(tokio::spawn(reader_loop(
                    server.url.clone(),
                    processes.system.schema().to_string(),
                    Arc::clone(&stop_readers),
                )));
            }
        }
        Disturbance::PgDump => {
            readers.push(tokio::spawn(pg_dump_loop(
                server.url.clone(),
                Arc::clone(&stop_readers),
            )));
        }
        Disturbance::PausedQueue => match storage {
            Some(storage) => {
                fill_paused_queue(storage, config.paused_jobs).await?;
                trickle = Some(tokio::spawn(trickle_into_paused_queue(
                    storage.clone(),
                    Arc::clone(&stop_holders),
                )));
            }
            None => eprintln!("   paused-queue runs for ringwork only; this phase is clean"),
        },
        Disturbance::OpenProducerTxs => match storage {
            Some(storage) => {
                let pool = PgPoolOptions::new()
                    .max_connections(config.held_txs as u32 + 1)
                    .connect(&server.url)
                    .await?;
                let held = Storage::new(pool, storage.schema().clone());
                for i in 0..config.held_txs {
                    // staggered, so transactions open and commit all through the hold
                    let start_after = config.hold.mul_f64(i as f64 / config.held_txs as f64);
                    holders.push(tokio::spawn(hold_loop(
                        held.clone(),
                        config.hold,
                        start_after,
                        Arc::clone(&processes.counters),
                        Arc::clone(&stop_holders),
                    )));
                }
            }
            // awa: the adapter holds the transactions, with awa's own transactional insert
            None => {
                let mut args = vec!["hold".to_string()];
                args.extend(processes.common());
                args.extend([
                    "--txs".to_string(),
                    config.held_txs.to_string(),
                    "--hold-secs".to_string(),
                    config.hold.as_secs().max(1).to_string(),
                ]);
                held_child = Some(spawn_child(
                    &processes.program()?,
                    &args,
                    Arc::clone(&processes.counters),
                )?);
            }
        },
        _ => {}
    }
    let phase_start = Instant::now();
    let disturb_at = Duration::from_secs(3).min(phase.duration / 4);
    let mut disturbed = false;
    let mut disturbance_over: Option<f64> = None;
    let mut recovery_s = None;
    let mut samples = vec![sample(admin, processes, storage, started).await?];
    let mut killed_at: Option<Instant> = None;
    while phase_start.elapsed() < phase.duration {
        tokio::time::sleep(config.sample_every).await;
        // one-off disturbances
        if !disturbed && phase_start.elapsed() >= disturb_at {
            match phase.disturbance {
                Disturbance::KillWorker => {
                    disturbed = true;
                    if let Some(worker) = processes.workers.first_mut() {
                        eprintln!("\n   SIGKILL worker process {:?}", worker.id());
                        let _ = worker.start_kill();
                        let _ = worker.wait().await;
                        processes.workers.remove(0);
                        killed_at = Some(Instant::now());
                    }
                }
                Disturbance::RestartPostgres => {
                    disturbed = true;
                    eprintln!("\n   restarting PostgreSQL");
                    server.restart().await?;
                    disturbance_over = Some(started.elapsed().as_secs_f64());
                }
                _ => {}
            }
        }
        if let Some(at) = killed_at {
            if at.elapsed() >= Duration::from_secs(3) {
                eprintln!("\n   restarting the killed worker process");
                processes.spawn_worker()?;
                killed_at = None;
                disturbance_over = Some(started.elapsed().as_secs_f64());
            }
        }
        let s = match sample(admin, processes, storage, started).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("\n   sample failed ({e}); retrying next tick");
                continue;
            }
        };
        let last = samples.last().cloned().unwrap_or_default();
        let dt = (s.at - last.at).max(1e-3);
        let rate = (s.completed - last.completed) as f64 / dt;
        if let (Some(over), None, Some(target)) = (disturbance_over, recovery_s, previous_median) {
            if s.at > over && rate >= 0.9 * target {
                recovery_s = Some(s.at - over);
            }
        }
        let ring_dead: i64 = s
            .tables
            .values()
            .filter(|t| t.class.as_deref() == Some("ring"))
            .map(|t| t.dead)
            .sum();
        eprint!(
            "\r   [{} {:>4.0}s/{:.0}s] completed {:>7.0}/s  enqueued {:>7.0}/s  depth {:>7}  dead {}{}   ",
            phase.name,
            phase_start.elapsed().as_secs_f64(),
            phase.duration.as_secs_f64(),
            rate,
            (s.enqueued - last.enqueued) as f64 / dt,
            s.depth,
            s.tables.values().map(|t| t.dead).sum::<i64>(),
            if ringwork {
                format!(" (ring {ring_dead})")
            } else {
                String::new()
            }
        );
        samples.push(s);
    }
    eprintln!();
    if let Some(tx) = horizon {
        tx.rollback().await?;
    }
    stop_readers.notify_waiters();
    for mut reader in readers {
        // a reader or dump loop that saw the notice ends by itself (the dump loop then reports
        // its count); one that does not within 2 s is aborted
        if tokio::time::timeout(Duration::from_secs(2), &mut reader)
            .await
            .is_err()
        {
            reader.abort();
        }
    }
    // held transactions commit what they hold as soon as they are told to stop
    stop_holders.store(true, Ordering::Relaxed);
    for holder in holders {
        let _ = holder.await;
    }
    if let Some(mut child) = held_child {
        stop_child(&mut child).await;
    }
    let pickups = processes
        .counters
        .pickup_ms
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    let mut result = summarise(phase.name, &samples, pickups, recovery_s, ringwork);
    if let (Some(trickle), Some(storage)) = (trickle, storage) {
        // stop_holders was set above; the trickle has stopped enqueuing
        let trickled = trickle
            .await
            .map_err(|e| Error::Config(format!("trickle task: {e}")))??;
        result.paused_queue =
            Some(resume_and_drain(storage, admin, config.paused_jobs + trickled).await?);
    }
    Ok(result)
}

/// paused-queue: pause `bench_paused` and enqueue `jobs` into it (its own lanes; no worker
/// process works that queue).
async fn fill_paused_queue(storage: &Storage, jobs: u64) -> Result<()> {
    storage.set_queue_paused(PAUSED_QUEUE, true).await?;
    eprintln!("   paused {PAUSED_QUEUE:?}; enqueuing {jobs} jobs into it");
    let mut conn = storage.pool().acquire().await?;
    let mut n = 0;
    while n < jobs {
        let chunk: Vec<NewJob> = (n..(n + 10_000).min(jobs))
            .map(|i| {
                NewJob::from_parts("bench_paused", serde_json::json!({ "n": i }))
                    .map(|job| job.queue(PAUSED_QUEUE))
            })
            .collect::<Result<_>>()?;
        storage.insert_many(&mut conn, &chunk).await?;
        n += chunk.len() as u64;
    }
    Ok(())
}

/// paused-queue: 10 more jobs a second into the paused queue, so that without parking every
/// rotation pins one more slot. Returns how many it enqueued.
async fn trickle_into_paused_queue(
    storage: Storage,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Result<u64> {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut conn = storage.pool().acquire().await?;
        let job = NewJob::from_parts("bench_paused", serde_json::json!({ "trickle": n }))?
            .queue(PAUSED_QUEUE);
        storage.insert_many(&mut conn, &[job]).await?;
        n += 1;
        drop(conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(n)
}

/// paused-queue: resume `bench_paused` and drain it from here (claim and complete in batches),
/// checking that every job comes back exactly once.
async fn resume_and_drain(
    storage: &Storage,
    admin: &PgPool,
    jobs: u64,
) -> Result<PausedQueueResult> {
    let parked_before_resume: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.parked_entries WHERE queue = $1",
        storage.schema()
    ))
    .bind(PAUSED_QUEUE)
    .fetch_one(admin)
    .await?;
    let started = Instant::now();
    storage.set_queue_paused(PAUSED_QUEUE, false).await?;
    let mut seen = std::collections::HashSet::new();
    let mut claims = 0u64;
    loop {
        let batch = storage.claim(PAUSED_QUEUE, 1000, None).await?;
        if batch.is_empty() {
            break;
        }
        let refs: Vec<_> = batch.iter().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&refs).await?;
        claims += batch.len() as u64;
        seen.extend(batch.iter().map(|j| j.job_id));
    }
    let drained = seen.len() as u64;
    let result = PausedQueueResult {
        enqueued: jobs,
        drained,
        duplicates: claims - drained,
        lost: jobs.saturating_sub(drained),
        drain_s: started.elapsed().as_secs_f64(),
        parked_before_resume,
    };
    eprintln!(
        "   resumed {PAUSED_QUEUE:?}: {} parked before resume, {} drained in {:.1} s, {} lost, {} twice",
        result.parked_before_resume, result.drained, result.drain_s, result.lost, result.duplicates
    );
    Ok(result)
}

/// Make `tx` REPEATABLE READ (a reader's snapshot, as a report or pg_dump takes) and list every
/// table of `schema`, partitions included, as quoted names.
async fn repeatable_read_tables(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    schema: &str,
) -> std::result::Result<Vec<String>, sqlx::Error> {
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut **tx)
        .await?;
    sqlx::query_scalar(
        "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables
         WHERE schemaname = $1",
    )
    .bind(schema)
    .fetch_all(&mut **tx)
    .await
}

/// A REPEATABLE READ scanner: each transaction counts every table of the schema, then holds its
/// snapshot for half a second, the way a reporting query does.
async fn reader_loop(url: String, schema: String, stop: Arc<tokio::sync::Notify>) {
    let Ok(pool) = PgPoolOptions::new().max_connections(1).connect(&url).await else {
        return;
    };
    loop {
        let scan = async {
            let mut tx = pool.begin().await?;
            let tables = repeatable_read_tables(&mut tx, &schema).await?;
            for table in tables {
                sqlx::query(&format!("SELECT count(*) FROM {table}"))
                    .execute(&mut *tx)
                    .await?;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.commit().await?;
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            result = scan => if result.is_err() { tokio::time::sleep(Duration::from_millis(200)).await },
            _ = stop.notified() => return,
        }
    }
}

/// `pg_dump` of the benchmark database, over and over: each dump holds AccessShare on every table
/// (ring children included) for its whole run, which is what keeps prune's ACCESS EXCLUSIVE out.
async fn pg_dump_loop(url: String, stop: Arc<tokio::sync::Notify>) {
    let pg_dump = match crate::embedded::find_bindir() {
        Ok(dir) => dir.join("pg_dump"),
        Err(_) => PathBuf::from("pg_dump"),
    };
    let (mut dumps, mut failed, mut busy) = (0u32, 0u32, Duration::ZERO);
    loop {
        let started = Instant::now();
        let dump = Command::new(&pg_dump)
            .args(["--dbname", &url, "--file", "/dev/null"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .status();
        tokio::select! {
            status = dump => {
                busy += started.elapsed();
                match status {
                    Ok(s) if s.success() => dumps += 1,
                    _ => {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            _ = stop.notified() => break,
        }
    }
    eprintln!(
        "   pg-dump: {dumps} dumps completed ({failed} failed), {:.1} s each on average",
        busy.as_secs_f64() / f64::from(dumps.max(1))
    );
}

// ------------------------------------------------------------------------------------------------
// Output
// ------------------------------------------------------------------------------------------------

fn print_run(r: &RunResult) {
    eprintln!(
        "   {} {} {}: enqueued {} completed {} pending {} lost {} extra {}",
        r.system,
        r.profile,
        r.scenario,
        r.enqueued,
        r.completed,
        r.pending_after_drain,
        r.lost,
        r.extra_completions
    );
}

fn write_outputs(config: &BenchConfig, results: &[RunResult]) -> Result<()> {
    let base = config.out_dir.join(&config.label);
    let json = serde_json::to_string_pretty(results)
        .map_err(|e| Error::Config(format!("cannot encode results: {e}")))?;
    std::fs::write(base.with_extension("json"), json)
        .map_err(|e| Error::Config(format!("cannot write results: {e}")))?;
    std::fs::write(base.with_extension("md"), markdown(config, results))
        .map_err(|e| Error::Config(format!("cannot write results: {e}")))?;
    Ok(())
}

fn fmt_opt(v: Option<i64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "–".into())
}

/// The per-run tables, then (when more than one system ran) the side-by-side comparison.
/// The ring over time (at most about 16 rows) of a scenario that disturbs it, and for the
/// paused-queue scenario the paused queue's fate.
fn ring_over_time_markdown(r: &RunResult) -> String {
    let mut out = format!(
        "\n## {} ({} {}): the ring over time\n\n\
         | phase | t (s) | ring tables (MB) | archive (MB) | jobs parked | sealed slots (both rings) |\n|---|---|---|---|---|---|\n",
        r.scenario, r.system, r.profile
    );
    let points: Vec<(&str, &RingPoint)> = r
        .phases
        .iter()
        .flat_map(|p| p.ring_over_time.iter().map(move |x| (p.name.as_str(), x)))
        .collect();
    let step = points.len().div_ceil(16).max(1);
    for (i, (phase, x)) in points.iter().enumerate() {
        if i % step == 0 || i + 1 == points.len() {
            out.push_str(&format!(
                "| {phase} | {:.0} | {:.1} | {:.1} | {} | {} |\n",
                x.at,
                x.ring_bytes as f64 / 1e6,
                x.archive_bytes as f64 / 1e6,
                x.parked_rows,
                x.sealed
            ));
        }
    }
    for q in r.phases.iter().filter_map(|p| p.paused_queue.as_ref()) {
        out.push_str(&format!(
            "\nPaused queue: {} jobs enqueued, {} parked just before resume; resume and drain took \
             {:.1} s, {} drained, **{} lost**, {} claimed twice.\n",
            q.enqueued, q.parked_before_resume, q.drain_s, q.drained, q.lost, q.duplicates
        ));
    }
    out
}

pub fn markdown(config: &BenchConfig, results: &[RunResult]) -> String {
    let mut out = format!(
        "# ringwork bench: {}\n\nGenerated {} by `ringwork bench` (phase {} s, job {} ms, depth target {}, fixed rate {}/s).\n\n",
        config.label,
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        config.phase.as_secs(),
        config.job_ms,
        config.depth,
        config.rate
    );
    let mut servers: Vec<&str> = results.iter().map(|r| r.server.as_str()).collect();
    servers.dedup();
    for server in servers {
        out.push_str(&format!("Server: {server}.\n"));
        if server.contains("autovacuum off") {
            out.push_str(
                "**Autovacuum is off on this server**: no statistics appear and no vacuum runs, \
                 the favourable case; production servers run with it on.\n",
            );
        }
    }
    out.push('\n');
    out.push_str(
        "| system | profile | scenario | phase | completed/s median (peak) | enqueued/s median | depth median | pickup p50 / p95 / p99 ms | WAL B/job | commits/job | ring dead peak | schema dead end (peak) | rotations / prunes | recovery s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        for p in &r.phases {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} ({:.0}) | {:.0} | {:.0} | {:.1} / {:.1} / {:.1} | {:.0} | {:.3} | {} | {} ({}) | {} / {} | {} |\n",
                r.system,
                r.profile,
                r.scenario,
                p.name,
                p.completed_per_s.median,
                p.completed_per_s.peak,
                p.enqueued_per_s.median,
                p.depth.median,
                p.pickup_ms_p50,
                p.pickup_ms_p95,
                p.pickup_ms_p99,
                p.wal_bytes_per_job,
                p.commits_per_job,
                fmt_opt(p.ring_dead_peak),
                p.schema_dead_end,
                p.schema_dead_peak,
                fmt_opt(p.rotations),
                fmt_opt(p.prunes),
                p.recovery_s
                    .map(|s| format!("{s:.1}"))
                    .unwrap_or_else(|| "–".into()),
            ));
        }
    }
    out.push_str("\n| system | profile | scenario | enqueued | completed | pending after drain | **lost** | extra completions |\n|---|---|---|---|---|---|---|---|\n");
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | **{}** | {} |\n",
            r.system,
            r.profile,
            r.scenario,
            r.enqueued,
            r.completed,
            r.pending_after_drain,
            r.lost,
            r.extra_completions
        ));
    }
    for r in results
        .iter()
        .filter(|r| ["paused-queue", "pg-dump", "held-reader"].contains(&r.scenario.as_str()))
    {
        out.push_str(&ring_over_time_markdown(r));
    }
    // side by side: ringwork / awa for each (profile, scenario, phase)
    let pairs: Vec<_> = results
        .iter()
        .filter(|r| r.system == "ringwork")
        .filter_map(|rw| {
            results
                .iter()
                .find(|a| a.system == "awa" && a.profile == rw.profile && a.scenario == rw.scenario)
                .map(|awa| (rw, awa))
        })
        .collect();
    if !pairs.is_empty() {
        out.push_str("\n## ringwork vs awa (same run, same server)\n\n| profile | scenario | phase | completed/s ringwork / awa (ratio) | WAL B/job ringwork / awa (ratio) | pickup p50 ms ringwork / awa | pickup p99 ms ringwork / awa | schema dead end ringwork / awa |\n|---|---|---|---|---|---|---|---|\n");
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}×", a / b)
            } else {
                "–".into()
            }
        };
        for (rw, awa) in pairs {
            for (p, q) in rw.phases.iter().zip(&awa.phases) {
                out.push_str(&format!(
                    "| {} | {} | {} | {:.0} / {:.0} ({}) | {:.0} / {:.0} ({}) | {:.1} / {:.1} | {:.1} / {:.1} | {} / {} |\n",
                    rw.profile,
                    rw.scenario,
                    p.name,
                    p.completed_per_s.median,
                    q.completed_per_s.median,
                    ratio(p.completed_per_s.median, q.completed_per_s.median),
                    p.wal_bytes_per_job,
                    q.wal_bytes_per_job,
                    ratio(p.wal_bytes_per_job, q.wal_bytes_per_job),
                    p.pickup_ms_p50,
                    q.pickup_ms_p50,
                    p.pickup_ms_p99,
                    q.pickup_ms_p99,
                    p.schema_dead_end,
                    q.schema_dead_end,
                ));
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// The ringwork side of the line protocol: worker and producer processes
// ------------------------------------------------------------------------------------------------

/// Sequence numbers of jobs enqueued by held transactions: far above the producer's.
static HELD_SEQ: AtomicU64 = AtomicU64::new(1 << 40);

/// One held producer transaction, over and over: BEGIN, enqueue one job, wait `hold` (or until
/// told to stop), COMMIT. Committed jobs join the runner's accounting like the producer's.
async fn hold_loop(
    storage: Storage,
    hold: Duration,
    start_after: Duration,
    counters: Arc<Counters>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    tokio::time::sleep(start_after).await;
    while !stop.load(Ordering::Relaxed) {
        let n = HELD_SEQ.fetch_add(1, Ordering::Relaxed);
        let job = BenchJob {
            enq_us: now_us(),
            n,
            held: true,
        };
        let Ok(job) = NewJob::new(&job).map(|j| j.queue(BENCH_QUEUE)) else {
            return;
        };
        let Ok(mut tx) = storage.pool().begin().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if storage.insert(&mut tx, &job).await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let opened = Instant::now();
        while opened.elapsed() < hold && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if tx.commit().await.is_ok() {
            counters.enqueued.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut committed) = counters.committed.lock() {
                committed.push((n, n + 1));
            }
        }
    }
}

fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

/// Print `report_line` once a second until SIGINT or SIGTERM.
async fn report_until_signal(report_line: &dyn Fn()) -> Result<()> {
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

async fn wait_for_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::Config(format!("cannot install SIGTERM handler: {e}")))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// `ringwork bench-worker`: W workers on the bench queue; one JSON line per second.
pub async fn worker_process(url: &str, schema: &str, workers: usize, job_ms: u64) -> Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?;
    let pickups: Arc<Mutex<Vec<f64>>> = Arc::default();
    let recorder = Arc::clone(&pickups);
    let mut builder = Client::builder(pool);
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
    let client = builder
        .schema(schema)
        .migrate(false)
        .queue(
            BENCH_QUEUE,
            QueueConfig {
                max_workers: workers,
                poll_interval: Duration::from_millis(50),
                // RINGWORK_BENCH_CLAIM_AHEAD=N: the claim-ahead baseline (0 claims only for free
                // workers, as before claim ahead existed)
                claim_ahead: env_number("RINGWORK_BENCH_CLAIM_AHEAD")
                    .unwrap_or(QueueConfig::default().claim_ahead as u64)
                    as usize,
                ..QueueConfig::default()
            },
        )
        // A crashed worker's claims are rescued after 10 s (heartbeats every 2.5 s keep live
        // ones), so crash scenarios recover within a phase. Baselines, through the environment
        // inherited from the bench process: RINGWORK_BENCH_NO_PARK turns parking off (the
        // paused-queue baseline), RINGWORK_BENCH_NO_ARCHIVE the archive (the WAL cost of history).
        .maintenance(MaintenanceConfig {
            stale_after: Duration::from_secs(10),
            park_idle: match std::env::var_os("RINGWORK_BENCH_NO_PARK") {
                Some(_) => None,
                None => MaintenanceConfig::default().park_idle,
            },
            keep_completed: match std::env::var_os("RINGWORK_BENCH_NO_ARCHIVE") {
                Some(_) => Duration::ZERO,
                None => MaintenanceConfig::default().keep_completed,
            },
            keep_failed: match std::env::var_os("RINGWORK_BENCH_NO_ARCHIVE") {
                Some(_) => Duration::ZERO,
                None => MaintenanceConfig::default().keep_failed,
            },
            ..MaintenanceConfig::default()
        })
        // RINGWORK_BENCH_COMPLETION_DELAY_MS=N: the completion flush pace (`max_delay`), for
        // comparing paces (docs/bench/2026-12-01-completion-pace.md)
        .completion(CompletionConfig {
            max_delay: env_number("RINGWORK_BENCH_COMPLETION_DELAY_MS")
                .map(Duration::from_millis)
                .unwrap_or(CompletionConfig::default().max_delay),
            ..CompletionConfig::default()
        })
        .register(move |_ctx: JobContext, job: BenchJob| {
            let recorder = Arc::clone(&recorder);
            async move {
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
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await?;
    let metrics = client.metrics();
    let running = client.start().await?;
    let reported = AtomicU64::new(0);
    let report_line = || {
        let now = metrics.completed.load(Ordering::Relaxed);
        let samples = pickups
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        let delta = now - reported.swap(now, Ordering::Relaxed);
        println!(
            "{}",
            serde_json::json!({"completed": delta, "pickup_ms": samples})
        );
    };
    report_until_signal(&report_line).await?;
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
fn telemetry_part(part: &str) -> bool {
    match std::env::var("RINGWORK_BENCH_TELEMETRY") {
        Ok(value) => value != "metrics" && value != "traces" || value == part,
        Err(_) => false,
    }
}

/// Drops exported spans: the cost measured is recording and batching, not a collector's network.
#[derive(Debug)]
struct DiscardSpans;

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
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// `ringwork bench-produce`: insert bench jobs at a fixed rate, or keep `depth` available.
pub async fn producer_process(
    url: &str,
    schema: &str,
    rate: Option<u64>,
    depth: Option<u64>,
) -> Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?;
    let storage = Storage::new(pool.clone(), SchemaName::new(schema)?);
    let enqueued = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&enqueued);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    // A task of its own, stopped by a flag between inserts: an insert in flight at SIGTERM is
    // finished and counted, never abandoned between commit and count.
    let produce = tokio::spawn(async move {
        let started = Instant::now();
        // committed jobs (for the rate schedule) and the next unused sequence number: every
        // attempt takes fresh numbers, so a batch whose commit reply was lost (it may have
        // committed) never shares numbers with its retry
        let mut sent: u64 = 0;
        let mut next_n: u64 = 0;
        while !stopping.load(Ordering::Relaxed) {
            let want = match (rate, depth) {
                (Some(rate), _) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                    due.saturating_sub(sent).min(10_000)
                }
                (None, Some(depth)) => {
                    // every 100 ms: the exact count is not free (one probe per shard), and the
                    // harness should not spend the cores it measures; at 10k jobs/s, 5,000 ready
                    // jobs last 500 ms
                    // (RINGWORK_BENCH_DEPTH_PROBE_MS: the baseline of this interval, 20 before)
                    tokio::time::sleep(Duration::from_millis(
                        env_number("RINGWORK_BENCH_DEPTH_PROBE_MS").unwrap_or(100),
                    ))
                    .await;
                    match storage.available_count(BENCH_QUEUE).await {
                        Ok(available) => (depth as i64 - available).clamp(0, 5_000) as u64,
                        Err(_) => 0,
                    }
                }
                (None, None) => return,
            };
            if want == 0 {
                continue;
            }
            let enq_us = now_us();
            let first = next_n;
            next_n += want;
            let jobs: Vec<NewJob> = (0..want)
                .filter_map(|i| {
                    NewJob::new(&BenchJob {
                        enq_us,
                        n: first + i,
                        held: false,
                    })
                    .ok()
                    .map(|j| j.queue(BENCH_QUEUE))
                })
                .collect();
            let mut conn = match pool.acquire().await {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // a span per batch: with telemetry on, every job carries its traceparent
            let span = tracing::info_span!("bench.produce", jobs = jobs.len());
            match storage.insert_many(&mut conn, &jobs).instrument(span).await {
                Ok(ids) => {
                    sent += ids.len() as u64;
                    counter.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    // the runner accounts for exactly these numbers
                    println!(
                        "{}",
                        serde_json::json!({ "committed": [first, first + ids.len() as u64] })
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
    report_until_signal(&report_line).await?;
    stop.store(true, Ordering::Relaxed);
    let _ = produce.await;
    // the last partial second
    report_line();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_scenarios_parse_or_are_refused_clearly() {
        assert_eq!(parse_profiles("1x32, 4x8").unwrap(), vec![(1, 32), (4, 8)]);
        for bad in ["", "4", "0x8", "4x", "x8", "4x999", "a x b"] {
            assert!(parse_profiles(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Scenario::parse("idle-in-tx").unwrap(), Scenario::IdleInTx);
        assert!(Scenario::parse("idle").is_err());
    }

    #[test]
    fn a_phase_summary_turns_counter_samples_into_rates_and_per_job_costs() {
        let at = |t: f64, completed: u64, wal: i64| Sample {
            at: t,
            completed,
            wal_lsn: wal,
            commits: completed as i64 / 10,
            ..Sample::default()
        };
        let samples = vec![
            at(0.0, 0, 0),
            at(2.0, 2000, 600_000),
            at(4.0, 6000, 1_800_000),
        ];
        let p = summarise("x", &samples, vec![3.0, 1.0, 2.0], None, true);
        assert_eq!(p.completed, 6000);
        assert_eq!(p.completed_per_s.peak, 2000.0);
        assert_eq!(p.wal_bytes_per_job, 300.0);
        assert_eq!(p.pickup_ms_p50, 2.0);
        assert_eq!(p.prunes, Some(0));
    }
}
