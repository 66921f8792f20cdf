//! `ringwork-bench check`: a short sitting compared with the checked-in baseline.
//!
//! One sitting measures the machine's ceiling for a ring-shaped job path (`ceiling/run.sh`: bare
//! statements through pgbench, no queue logic) and then ringwork's saturation throughput on the
//! same server. The figure kept and compared is their ratio, so a slower or busier machine moves
//! both and does not fail the check; a change that makes ringwork's own path heavier does. Each
//! round also runs `fixed-rate` and `idle`, whose commits and WAL (per job at a fixed rate, per
//! second with nothing to do) are held to the baseline as they are: counts, not times. And each
//! round runs `NOOP_PROFILE` with no-op jobs at saturation, held to the baseline as a ratio of the
//! same ceiling: the engine's own overhead per job, which 1-ms handlers hide.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringwork::embedded::EmbeddedPostgres;
use ringwork::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::runner::run;
use crate::scenario::{BenchConfig, Scenario, System};

/// `bench/baseline.json`: the ratio a sitting is held to.
#[derive(Debug, Serialize, Deserialize)]
pub struct Baseline {
    /// ringwork's median saturation throughput over the ceiling's full-cycle rate.
    pub ratio: f64,
    /// The fraction of `ratio` a sitting may fall short by and still pass.
    pub tolerance: f64,
    /// The profile measured, `RxW`.
    pub profile: String,
    pub phase_secs: u64,
    pub ceiling_secs: u64,
    /// Where the baseline was measured: commit, machine, server settings.
    pub commit: String,
    pub machine: String,
    pub server: String,
    /// The two rates behind `ratio`, jobs/s, for the reader.
    pub ringwork_jobs_per_s: f64,
    pub ceiling_jobs_per_s: f64,
    /// What a job costs at a modest rate, and a process with nothing to do: counts of commits
    /// and WAL, which a busier machine does not move as it moves throughput and CPU time. A
    /// sitting fails when its best round costs more than these by more than `tolerance`.
    #[serde(default)]
    pub costs: Option<Costs>,
    /// `NOOP_PROFILE` saturation with no-op jobs over the ceiling's rate, and that rate (jobs/s);
    /// absent from a baseline written before the no-op shape was measured.
    #[serde(default)]
    pub noop_ratio: Option<f64>,
    #[serde(default)]
    pub noop_jobs_per_s: Option<f64>,
}

/// The cost figures `check` holds a sitting to (best round: the lowest of each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// `fixed-rate` at `FIXED_RATE` jobs/s.
    pub fixed_rate_commits_per_job: f64,
    pub fixed_rate_wal_bytes_per_job: f64,
    /// `idle`'s phase without jobs: the whole server's commits and WAL per second.
    pub idle_commits_per_s: f64,
    pub idle_wal_bytes_per_s: f64,
}

/// The fixed rate the cost figures are measured at, jobs/s.
const FIXED_RATE: u64 = 400;

/// The profile of the no-op saturation run: enough workers that handlers never bound it.
const NOOP_PROFILE: &str = "1x64";

impl Costs {
    /// The lower of each figure.
    fn best(self, other: Costs) -> Costs {
        Costs {
            fixed_rate_commits_per_job: self
                .fixed_rate_commits_per_job
                .min(other.fixed_rate_commits_per_job),
            fixed_rate_wal_bytes_per_job: self
                .fixed_rate_wal_bytes_per_job
                .min(other.fixed_rate_wal_bytes_per_job),
            idle_commits_per_s: self.idle_commits_per_s.min(other.idle_commits_per_s),
            idle_wal_bytes_per_s: self.idle_wal_bytes_per_s.min(other.idle_wal_bytes_per_s),
        }
    }

    /// Each figure of `self` above `baseline`'s by more than `tolerance`, named.
    fn over(&self, baseline: &Costs, tolerance: f64) -> Vec<String> {
        [
            (
                "fixed-rate commits per job",
                self.fixed_rate_commits_per_job,
                baseline.fixed_rate_commits_per_job,
            ),
            (
                "fixed-rate WAL bytes per job",
                self.fixed_rate_wal_bytes_per_job,
                baseline.fixed_rate_wal_bytes_per_job,
            ),
            (
                "idle commits per second",
                self.idle_commits_per_s,
                baseline.idle_commits_per_s,
            ),
            (
                "idle WAL bytes per second",
                self.idle_wal_bytes_per_s,
                baseline.idle_wal_bytes_per_s,
            ),
        ]
        .into_iter()
        .filter(|(_, now, was)| *now > was * (1.0 + tolerance))
        .map(|(name, now, was)| format!("{name} {now:.3} against {was:.3}"))
        .collect()
    }
}

/// What `check` asks for.
pub struct CheckOptions {
    pub database_url: Option<String>,
    pub baseline: PathBuf,
    /// Write this sitting as the new baseline instead of comparing with it.
    pub write: bool,
    /// Override the baseline's phase and ceiling lengths (seconds), for a quicker look.
    pub phase_secs: Option<u64>,
    /// Rounds to run; the best round's ratio is the sitting's.
    pub rounds: u32,
}

/// One round: the ceiling, ringwork, the ceiling again.
struct Round {
    rate: f64,
    /// `NOOP_PROFILE` with no-op jobs at saturation, jobs/s.
    noop_rate: f64,
    /// None when the server is not on this host.
    server_cpu_ms_per_1k_jobs: Option<f64>,
    ceiling_before: f64,
    ceiling_after: f64,
    server: String,
    costs: Costs,
}

/// A checkpoint first, so that no measurement pays for the previous one's dirty pages.
async fn checkpoint(url: &str) -> Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    sqlx::query("CHECKPOINT").execute(&pool).await?;
    pool.close().await;
    Ok(())
}

/// The ceiling is measured on both sides of ringwork's phase, so that a slow spell of the
/// machine during one of them does not decide the round.
async fn measure_round(
    url: &str,
    profile: &str,
    phase_secs: u64,
    ceiling_secs: u64,
) -> Result<Round> {
    checkpoint(url).await?;
    let ceiling_before = ceiling(url, ceiling_secs)?;
    checkpoint(url).await?;
    let config = |profile: &str, scenarios: Vec<Scenario>, job_ms: u64| -> Result<BenchConfig> {
        Ok(BenchConfig {
            database_url: Some(url.to_string()),
            systems: vec![System::Ringwork],
            profiles: crate::scenario::parse_profiles(profile)?,
            scenarios,
            phase: Duration::from_secs(phase_secs),
            soak: Duration::from_secs(600),
            job_ms,
            rate: FIXED_RATE,
            depth: 5_000,
            sample_every: Duration::from_secs(2),
            readers: 2,
            held_txs: 64,
            hold: Duration::from_secs(10),
            paused_jobs: 100_000,
            args_bytes: 0,
            pg_restart_cmd: None,
            autovacuum: true,
            analyze_every: None,
            out_dir: PathBuf::from("target/bench"),
            label: if job_ms == 0 { "check-noop" } else { "check" }.into(),
            producer_in_worker: false,
        })
    };
    let results = run(config(
        profile,
        vec![Scenario::Saturation, Scenario::FixedRate, Scenario::Idle],
        1,
    )?)
    .await?;
    checkpoint(url).await?;
    let noop = run(config(NOOP_PROFILE, vec![Scenario::Saturation], 0)?).await?;
    let noop_rate = noop
        .iter()
        .flat_map(|r| &r.phases)
        .find(|p| p.name == "saturation")
        .map(|p| p.completed_per_s.median)
        .ok_or_else(|| Error::Config("the no-op run has no saturation phase".into()))?;
    if let Some(lossy) = results.iter().chain(&noop).find(|r| r.lost != 0) {
        return Err(Error::Config(format!(
            "the round's {} run lost {} jobs",
            lossy.scenario, lossy.lost
        )));
    }
    let phase_of = |name: &str| {
        results
            .iter()
            .flat_map(|r| &r.phases)
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Config(format!("the round has no {name} phase")))
    };
    let run_result = results
        .first()
        .ok_or_else(|| Error::Config("the round produced no result".into()))?;
    let phase = phase_of("saturation")?;
    let fixed = phase_of("fixed-rate")?;
    let idle = phase_of("idle")?;
    let costs = Costs {
        fixed_rate_commits_per_job: fixed.commits_per_job,
        fixed_rate_wal_bytes_per_job: fixed.wal_bytes_per_job,
        idle_commits_per_s: idle.commits_per_s,
        idle_wal_bytes_per_s: idle.wal_bytes_per_s,
    };
    let rate = phase.completed_per_s.median;
    let server_cpu_ms_per_1k_jobs = phase.server_cpu_ms_per_1k_jobs;
    checkpoint(url).await?;
    let ceiling_after = ceiling(url, ceiling_secs)?;
    Ok(Round {
        rate,
        noop_rate,
        server_cpu_ms_per_1k_jobs,
        ceiling_before,
        ceiling_after,
        server: run_result.server.clone(),
        costs,
    })
}

/// The ceiling script's summary line: "... full cycle on shared CPU ~N jobs/s, ...".
fn parse_ceiling(output: &str) -> Option<f64> {
    let rest = output.split("full cycle on shared CPU ~").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn ceiling(url: &str, seconds: u64) -> Result<f64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ceiling/run.sh");
    // pgbench and psql from the server's own binaries when they are not on PATH
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if let Ok(bindir) = ringwork::embedded::find_bindir() {
        let mut dirs = vec![bindir];
        dirs.extend(std::env::split_paths(&path));
        path = std::env::join_paths(dirs).map_err(|e| Error::Config(e.to_string()))?;
    }
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg(url)
        .arg(seconds.to_string())
        .env("PATH", path)
        .output()
        .map_err(|e| Error::Config(format!("cannot run {}: {e}", script.display())))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(Error::Config(format!(
            "{} failed ({}): {}{}",
            script.display(),
            output.status,
            text,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    eprintln!("ceiling: {}", text.trim());
    parse_ceiling(&text).ok_or_else(|| {
        Error::Config(format!(
            "{} printed no full-cycle rate: {text}",
            script.display()
        ))
    })
}

fn read_baseline(path: &Path) -> Result<Baseline> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{} is not a baseline: {e}", path.display())))
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Run the sitting; `Err` when it falls short of the baseline beyond the tolerance.
pub async fn check(options: CheckOptions) -> Result<()> {
    let existing = read_baseline(&options.baseline);
    let (profile, phase_secs, ceiling_secs, tolerance) = match (&existing, options.write) {
        (Ok(b), _) => (b.profile.clone(), b.phase_secs, b.ceiling_secs, b.tolerance),
        (Err(_), true) => ("1x32".to_string(), 30, 15, 0.15),
        (Err(e), false) => return Err(Error::Config(e.to_string())),
    };
    let phase_secs = options.phase_secs.unwrap_or(phase_secs).max(4);
    let ceiling_secs = options.phase_secs.unwrap_or(ceiling_secs).max(2);
    crate::scenario::parse_profiles(&profile)?;
    let rounds = options.rounds;
    if rounds == 0 {
        return Err(Error::Config("--rounds must be at least 1".into()));
    }

    // one server for both measurements: the given one, or a throwaway cluster with production's
    // autovacuum setting
    let embedded;
    let url = match &options.database_url {
        Some(url) => url.clone(),
        None => {
            eprintln!("no DATABASE_URL: starting a throwaway PostgreSQL cluster…");
            embedded = EmbeddedPostgres::start_with(&[("autovacuum", "on")])
                .map_err(|e| Error::Config(e.to_string()))?;
            embedded.url()
        }
    };
    // Noise on a shared machine only ever slows a measurement, so the sitting keeps the best
    // of each figure across its rounds; a regression lowers every ringwork round.
    let mut rate: f64 = 0.0;
    let mut noop_rate: f64 = 0.0;
    let mut ceiling_rate: f64 = 0.0;
    let mut server = String::new();
    let mut costs: Option<Costs> = None;
    for round in 1..=rounds {
        let r = measure_round(&url, &profile, phase_secs, ceiling_secs).await?;
        println!(
            "\nround {round}/{rounds}: ringwork {profile} saturation {:.0} jobs/s ({}); ceiling {:.0} before, {:.0} after",
            r.rate,
            r.server_cpu_ms_per_1k_jobs.map_or_else(
                || "PostgreSQL CPU not readable: the server is not on this host".into(),
                |ms| format!("PostgreSQL CPU {ms:.1} ms per 1,000 jobs")
            ),
            r.ceiling_before,
            r.ceiling_after
        );
        println!(
            "  fixed {FIXED_RATE} jobs/s: {:.3} commits and {:.0} B of WAL per job; idle: {:.1} commits/s, {:.0} B/s of WAL",
            r.costs.fixed_rate_commits_per_job,
            r.costs.fixed_rate_wal_bytes_per_job,
            r.costs.idle_commits_per_s,
            r.costs.idle_wal_bytes_per_s
        );
        println!(
            "  {NOOP_PROFILE} no-op saturation: {:.0} jobs/s",
            r.noop_rate
        );
        costs = Some(costs.map_or(r.costs, |c| c.best(r.costs)));
        rate = rate.max(r.rate);
        noop_rate = noop_rate.max(r.noop_rate);
        ceiling_rate = ceiling_rate.max(r.ceiling_before).max(r.ceiling_after);
        server = r.server;
    }
    let ratio = rate / ceiling_rate;
    let noop_ratio = noop_rate / ceiling_rate;
    println!(
        "best of {rounds}: ringwork {rate:.0} jobs/s; ceiling {ceiling_rate:.0} jobs/s; ratio {ratio:.3}; \
         {NOOP_PROFILE} no-op {noop_rate:.0} jobs/s, ratio {noop_ratio:.3}"
    );
    if options.write {
        let baseline = Baseline {
            ratio,
            tolerance,
            profile,
            phase_secs,
            ceiling_secs,
            commit: git_commit(),
            machine: format!(
                "{} cores",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
            server,
            ringwork_jobs_per_s: rate,
            ceiling_jobs_per_s: ceiling_rate,
            costs,
            noop_ratio: Some(noop_ratio),
            noop_jobs_per_s: Some(noop_rate),
        };
        let text =
            serde_json::to_string_pretty(&baseline).map_err(|e| Error::Config(e.to_string()))?;
        std::fs::write(&options.baseline, text + "\n").map_err(|e| {
            Error::Config(format!("cannot write {}: {e}", options.baseline.display()))
        })?;
        println!("wrote {}", options.baseline.display());
        return Ok(());
    }
    let baseline = existing.map_err(|e| Error::Config(e.to_string()))?;
    let floor = baseline.ratio * (1.0 - baseline.tolerance);
    println!(
        "baseline ratio {:.3} at {} (floor {floor:.3}, tolerance {:.0} %)",
        baseline.ratio,
        baseline.commit,
        baseline.tolerance * 100.0
    );
    let mut regressions = Vec::new();
    if ratio < floor {
        regressions.push(format!(
            "ratio {ratio:.3} is below the baseline's floor {floor:.3}"
        ));
    }
    match baseline.noop_ratio {
        Some(was) => regressions.extend(noop_below(noop_ratio, was, baseline.tolerance)),
        None => println!("the baseline has no no-op figure: write one to hold it"),
    }
    match (costs, baseline.costs) {
        (Some(now), Some(was)) => regressions.extend(now.over(&was, baseline.tolerance)),
        _ => println!("the baseline has no cost figures: write one to hold them"),
    }
    if !regressions.is_empty() {
        return Err(Error::Config(format!(
            "regression: {}",
            regressions.join("; ")
        )));
    }
    println!("ok");
    Ok(())
}

/// The no-op ratio's regression, if it fell below the baseline's by more than `tolerance`.
fn noop_below(now: f64, was: f64, tolerance: f64) -> Option<String> {
    let floor = was * (1.0 - tolerance);
    (now < floor).then(|| {
        format!("{NOOP_PROFILE} no-op ratio {now:.3} is below the baseline's floor {floor:.3}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_no_op_ratio_below_the_baseline_by_more_than_the_tolerance_is_named() {
        assert_eq!(noop_below(0.30, 0.32, 0.15), None);
        let below = noop_below(0.25, 0.32, 0.15).expect("a regression");
        assert!(below.contains("no-op ratio 0.250"), "{below}");
    }

    #[test]
    fn a_cost_above_the_baseline_by_more_than_the_tolerance_is_named() {
        let was = Costs {
            fixed_rate_commits_per_job: 0.65,
            fixed_rate_wal_bytes_per_job: 980.0,
            idle_commits_per_s: 10.0,
            idle_wal_bytes_per_s: 200.0,
        };
        let within = Costs {
            fixed_rate_commits_per_job: 0.74,
            idle_commits_per_s: 11.0,
            ..was
        };
        assert!(within.over(&was, 0.15).is_empty());
        let worse = Costs {
            fixed_rate_commits_per_job: 1.03,
            idle_commits_per_s: 33.0,
            ..was
        };
        let over = worse.over(&was, 0.15);
        assert_eq!(over.len(), 2, "{over:?}");
        assert!(over[0].starts_with("fixed-rate commits per job"));
        assert!(over[1].starts_with("idle commits per second"));
        // a sitting keeps each figure's best round
        assert_eq!(worse.best(within), within);
    }

    #[test]
    fn the_ceiling_rate_is_read_from_the_scripts_summary() {
        let line = "ingest 40000 jobs/s (520 B WAL/job); drain 90000 jobs/s (80 B WAL/job); full cycle on shared CPU ~27692 jobs/s, ~600 B WAL/job";
        assert_eq!(parse_ceiling(line), Some(27692.0));
        assert_eq!(parse_ceiling("pgbench: error"), None);
    }
}
