//! What a run is: the systems compared, the scenarios and their phases, the run's configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use ringwork::JobArgs;
use ringwork::{Error, Result};

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
    /// Letters and digits that make the arguments about `--args-bytes` of JSON (`args_padding`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pad: String,
}

/// The environment variable through which `run --args-bytes` reaches the producer processes.
pub(crate) const ARGS_BYTES_ENV: &str = "RINGWORK_BENCH_ARGS_BYTES";

/// The padding that makes job `n`'s arguments about `bytes` of JSON (empty below the bare
/// arguments' 48 or so). Pseudo-random letters and digits, different for every job: a padding of
/// one repeated letter would compress to nothing in the archive's rows of 256 jobs, where real
/// arguments do not.
pub(crate) fn args_padding(bytes: usize, n: u64) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut state = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes.saturating_sub(48))
        .map(|_| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            CHARS[(state % CHARS.len() as u64) as usize] as char
        })
        .collect()
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
    /// PgQue through this binary's `pgque` commands (pgque.rs), installed from this SQL file.
    Pgque {
        sql: PathBuf,
    },
}

impl System {
    pub fn name(&self) -> &'static str {
        match self {
            System::Ringwork => "ringwork",
            System::Awa { .. } => "awa",
            System::Pgque { .. } => "pgque",
        }
    }

    pub(crate) fn schema(&self) -> &str {
        match self {
            System::Ringwork => BENCH_SCHEMA,
            System::Awa { schema, .. } => schema,
            System::Pgque { .. } => "pgque",
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
    LongRun,
    OpenProducerTx,
    PausedQueue,
    LongHold,
    PgDump,
    StandbyReaders,
    Failover,
    HeldReader,
    Idle,
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
            "long-run" => Self::LongRun,
            "open-producer-tx" => Self::OpenProducerTx,
            "paused-queue" => Self::PausedQueue,
            "long-hold" => Self::LongHold,
            "pg-dump" => Self::PgDump,
            "standby-readers" => Self::StandbyReaders,
            "failover" => Self::Failover,
            "held-reader" => Self::HeldReader,
            "idle" => Self::Idle,
            other => {
                return Err(Error::Config(format!(
                    "unknown scenario {other:?}: saturation, fixed-rate, idle-in-tx, \
                     active-readers, crash-under-load, pg-restart, soak, long-run, \
                     open-producer-tx, paused-queue, long-hold, pg-dump, held-reader, idle"
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
            Self::LongRun => "long-run",
            Self::OpenProducerTx => "open-producer-tx",
            Self::PausedQueue => "paused-queue",
            Self::LongHold => "long-hold",
            Self::PgDump => "pg-dump",
            Self::StandbyReaders => "standby-readers",
            Self::Failover => "failover",
            Self::HeldReader => "held-reader",
            Self::Idle => "idle",
        }
    }

    /// The phases, in order. The producer mode is fixed per scenario: fixed-rate produces at
    /// `rate`, every other scenario keeps `depth` jobs ready (saturation).
    pub(crate) fn phases(self, config: &BenchConfig) -> Vec<Phase> {
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
            // a long-held horizon: a transaction pins it for the whole (long) phase while
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
            // a streaming standby serving dumps and a long report for the phase (the clean phase,
            // before the standby exists, is the rate without one), then the standby is gone
            Self::StandbyReaders => vec![
                short("clean"),
                phase("standby-readers", Disturbance::StandbyReaders),
                short("after"),
            ],
            // the primary is killed a few seconds into the second phase, its standby promoted and
            // the pooler re-pointed; recovery is the time back to 90 % of the clean rate
            Self::Failover => vec![
                phase("clean", Disturbance::None),
                phase("failover", Disturbance::Failover),
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
            // one job a second (each arrives at an idle fleet: its pickup is a first job's), then
            // no jobs at all: what the processes cost with nothing to do
            Self::Idle => vec![
                phase("sparse", Disturbance::None),
                phase("idle", Disturbance::NoJobs),
            ],
            Self::Soak => vec![Phase {
                name: "soak",
                duration: config.soak,
                disturbance: Disturbance::None,
            }],
            // the soak's length at a fixed rate: whether anything drifts over hours (throughput,
            // dead tuples, memory) at a load the fleet keeps up with
            Self::LongRun => vec![Phase {
                name: "long-run",
                duration: config.soak,
                disturbance: Disturbance::None,
            }],
        }
    }

    pub(crate) fn fixed_rate(self) -> bool {
        matches!(
            self,
            Self::FixedRate
                | Self::LongRun
                | Self::OpenProducerTx
                | Self::PausedQueue
                | Self::LongHold
                | Self::Idle
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disturbance {
    None,
    /// The producer stops as the phase starts (the idle scenario).
    NoJobs,
    /// A session sits in `BEGIN; SELECT txid_current()` for the phase (pins the MVCC horizon).
    HoldHorizon,
    /// Sessions loop REPEATABLE READ transactions that scan every table of the schema.
    Readers,
    /// `pg_dump` of the whole benchmark database to /dev/null, back to back.
    PgDump,
    /// A hot standby of the throwaway cluster (`RINGWORK_BENCH_STANDBY_SETTINGS`), made as the
    /// phase starts; on it `pg_dump` back to back (with `RINGWORK_BENCH_DUMP_ARGS`) and a
    /// 60-s REPEATABLE READ report on the ring; replay lag sampled on the primary.
    StandbyReaders,
    /// One REPEATABLE READ transaction reads a row of every table of the schema (ACCESS SHARE on
    /// each, ring children included, and a snapshot), then sits idle for the phase: a report left
    /// open, or pg_dump's locks without its work.
    HeldReader,
    /// SIGKILL one worker process a few seconds in; restart it a few seconds later.
    KillWorker,
    /// Restart PostgreSQL a few seconds in.
    RestartPostgres,
    /// Kill the primary a few seconds in (`pg_ctl stop -m immediate`), promote its streaming
    /// standby and re-point the PgBouncer every process connects through.
    Failover,
    /// `held_txs` producer transactions, each enqueuing one job into the benchmark queue and
    /// holding its transaction open `hold` before committing, over and over (ringwork only).
    OpenProducerTxs,
    /// `paused_jobs` jobs wait in a paused queue (`bench_paused`) for the whole phase, and more
    /// trickle in (10 a second), while the benchmark queue runs; then the queue is resumed and
    /// drained by the harness (ringwork only).
    PausedQueue,
}

/// The paused queue of the paused-queue scenario.
pub(crate) const PAUSED_QUEUE: &str = "bench_paused";

pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) duration: Duration,
    pub(crate) disturbance: Disturbance,
}

/// Everything a `ringwork-bench run` invocation asks for.
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
    /// Each job's arguments padded to about this many bytes of JSON (0: the bare arguments).
    pub args_bytes: usize,
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
    /// The producer runs inside worker process 0, on that process's own pool, as a service's
    /// request handlers enqueue beside its workers (the other harness style: a process of its own).
    pub producer_in_worker: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_arguments_are_about_the_bytes_asked_and_differ_between_jobs() {
        for bytes in [256, 1024] {
            let job = |n| BenchJob {
                enq_us: 1_765_432_123_456_789,
                n,
                held: false,
                pad: args_padding(bytes, n),
            };
            let json = serde_json::to_string(&job(123_456)).unwrap();
            assert!(
                json.len().abs_diff(bytes) <= 8,
                "{} bytes: {json}",
                json.len()
            );
            assert_ne!(job(1).pad, job(2).pad);
            assert!(job(7).pad.bytes().all(|b| b.is_ascii_alphanumeric()));
        }
        // below the bare arguments, and by default, nothing is added
        assert_eq!(args_padding(0, 5), "");
        assert_eq!(args_padding(30, 5), "");
        let bare = BenchJob {
            enq_us: 1,
            n: 1,
            held: false,
            pad: String::new(),
        };
        assert!(!serde_json::to_string(&bare).unwrap().contains("pad"));
    }

    #[test]
    fn profiles_and_scenarios_parse_or_are_refused_clearly() {
        assert_eq!(parse_profiles("1x32, 4x8").unwrap(), vec![(1, 32), (4, 8)]);
        for bad in ["", "4", "0x8", "4x", "x8", "4x999", "a x b"] {
            assert!(parse_profiles(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Scenario::parse("idle-in-tx").unwrap(), Scenario::IdleInTx);
        assert_eq!(Scenario::parse("idle").unwrap(), Scenario::Idle);
        assert_eq!(
            Scenario::parse("standby-readers").unwrap(),
            Scenario::StandbyReaders
        );
        assert_eq!(Scenario::parse("failover").unwrap(), Scenario::Failover);
        assert!(Scenario::parse("idle-in").is_err());
    }
}
