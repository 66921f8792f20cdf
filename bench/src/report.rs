//! What a run measured (the JSON and Markdown results) and how it is written out.

use std::collections::BTreeMap;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use ringwork::{Error, Result};

use crate::scenario::BenchConfig;

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
    /// The whole server's WAL bytes and commits per second over the phase: what an idle fleet
    /// costs, where per-job figures divide by nothing.
    #[serde(default)]
    pub wal_bytes_per_s: f64,
    #[serde(default)]
    pub commits_per_s: f64,
    /// CPU ms the PostgreSQL server spent per 1,000 completed jobs (its backends and background
    /// processes, read from /proc), and the cores that is; None when the server is not on this host.
    #[serde(default)]
    pub server_cpu_ms_per_1k_jobs: Option<f64>,
    #[serde(default)]
    pub server_cores: Option<f64>,
    /// CPU ms the worker and producer processes spent per 1,000 completed jobs.
    #[serde(default)]
    pub client_cpu_ms_per_1k_jobs: Option<f64>,
    /// The host's busy share over the phase, all processes, percent of all cores.
    #[serde(default)]
    pub host_busy_pct: Option<f64>,
    /// The workers' share of the phase spent inside their handlers, percent: under a backlog, what
    /// is missing from 100 is each job's hand-off to a free worker (the handler's own time is the
    /// same in every system).
    #[serde(default)]
    pub handlers_busy_pct: Option<f64>,
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
    /// The statements that took the most execution time in the phase (`pg_stat_statements`, when
    /// the server has it loaded).
    #[serde(default)]
    pub top_statements: Vec<crate::statements::StatementCost>,
    /// paused-queue phase: what became of the paused queue's jobs.
    #[serde(default)]
    pub paused_queue: Option<PausedQueueResult>,
    /// A phase of 20 minutes or more: its first and last 10 minutes, memory from 10 minutes in.
    #[serde(default)]
    pub drift: Option<Drift>,
}

/// Whether a long phase drifted: completions per second in its first and last 10 minutes, and
/// the clients' resident and the server's private memory 10 minutes in, at the end and at their
/// peak since.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Drift {
    pub first_completed_per_s: f64,
    pub last_completed_per_s: f64,
    pub client_rss_kb_settled: Option<u64>,
    pub client_rss_kb_end: Option<u64>,
    pub client_rss_kb_peak: Option<u64>,
    pub server_private_kb_settled: Option<u64>,
    pub server_private_kb_end: Option<u64>,
    pub server_private_kb_peak: Option<u64>,
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
    /// Jobs completed since the run started.
    #[serde(default)]
    pub completed: u64,
    /// The most dead tuples of any ring table, and the schema's dead tuples.
    #[serde(default)]
    pub ring_dead: i64,
    #[serde(default)]
    pub schema_dead: i64,
    #[serde(default)]
    pub client_rss_kb: Option<u64>,
    #[serde(default)]
    pub server_private_kb: Option<u64>,
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

pub(crate) fn print_run(r: &RunResult) {
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

pub(crate) fn write_outputs(config: &BenchConfig, results: &[RunResult]) -> Result<()> {
    let base = config.out_dir.join(&config.label);
    let json = serde_json::to_string_pretty(results)
        .map_err(|e| Error::Config(format!("cannot encode results: {e}")))?;
    std::fs::write(base.with_extension("json"), json)
        .map_err(|e| Error::Config(format!("cannot write results: {e}")))?;
    std::fs::write(base.with_extension("md"), markdown(config, results))
        .map_err(|e| Error::Config(format!("cannot write results: {e}")))?;
    Ok(())
}

pub(crate) fn fmt_opt(v: Option<i64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "–".into())
}

/// The per-run tables, then (when more than one system ran) the side-by-side comparison.
/// The ring over time (at most about 16 rows) of a scenario that disturbs it, and for the
/// paused-queue scenario the paused queue's fate.
pub(crate) fn ring_over_time_markdown(r: &RunResult) -> String {
    let mut out = format!(
        "\n## {} ({} {}): the ring over time\n\n\
         | phase | t (s) | completed | ring tables (MB) | archive (MB) | jobs parked | sealed slots (both rings) | ring dead (most of a table) | schema dead | clients' memory (MB) | server's private memory (MB) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
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
            let mb = |kb: Option<u64>| {
                kb.map_or_else(|| "–".into(), |kb| format!("{:.0}", kb as f64 / 1e3))
            };
            out.push_str(&format!(
                "| {phase} | {:.0} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |\n",
                x.at,
                x.completed,
                x.ring_bytes as f64 / 1e6,
                x.archive_bytes as f64 / 1e6,
                x.parked_rows,
                x.sealed,
                x.ring_dead,
                x.schema_dead,
                mb(x.client_rss_kb),
                mb(x.server_private_kb),
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
        "# ringwork-bench run: {}\n\nGenerated {} by `ringwork-bench run` (phase {} s, job {} ms, depth target {}, fixed rate {}/s, arguments {}, producer {}).\n\n",
        config.label,
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        config.phase.as_secs(),
        config.job_ms,
        config.depth,
        config.rate,
        match config.args_bytes {
            0 => "bare, about 35 bytes".to_string(),
            n => format!("padded to about {n} bytes"),
        },
        match config.producer_in_worker {
            true => "inside worker process 0",
            false => "a process of its own",
        }
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
        "| system | profile | scenario | phase | completed/s median (peak) | enqueued/s median | depth median | pickup p50 / p95 / p99 ms | WAL B/job | commits/job | commits/s, WAL kB/s | PostgreSQL CPU ms / 1k jobs (cores) | client CPU ms / 1k jobs | host busy % | handlers busy % | ring dead peak | schema dead end (peak) | rotations / prunes | recovery s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        for p in &r.phases {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} ({:.0}) | {:.0} | {:.0} | {:.1} / {:.1} / {:.1} | {:.0} | {:.3} | {:.1}, {:.1} | {} | {} | {} | {} | {} | {} ({}) | {} / {} | {} |\n",
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
                p.commits_per_s,
                p.wal_bytes_per_s / 1000.0,
                match (p.server_cpu_ms_per_1k_jobs, p.server_cores) {
                    (Some(ms), Some(cores)) => format!("{ms:.0} ({cores:.2})"),
                    (None, Some(cores)) => format!("– ({cores:.3})"),
                    _ => "–".into(),
                },
                p.client_cpu_ms_per_1k_jobs
                    .map_or_else(|| "–".into(), |ms| format!("{ms:.0}")),
                p.host_busy_pct
                    .map_or_else(|| "–".into(), |pct| format!("{pct:.0}")),
                p.handlers_busy_pct
                    .map_or_else(|| "–".into(), |pct| format!("{pct:.0}")),
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
    for r in results {
        for p in r.phases.iter().filter(|p| !p.top_statements.is_empty()) {
            out.push_str(&format!(
                "\n### Statements by execution time: {} {} {}, phase {}\n\n| top level | calls | ms | ms per 1,000 jobs | WAL bytes | statement |\n|---|---|---|---|---|---|\n",
                r.system, r.profile, r.scenario, p.name
            ));
            for s in &p.top_statements {
                out.push_str(&format!(
                    "| {} | {} | {:.0} | {:.1} | {} | `{}` |\n",
                    if s.toplevel { "yes" } else { "no" },
                    s.calls,
                    s.total_ms,
                    s.ms_per_1k_jobs,
                    s.wal_bytes,
                    s.query.replace('|', "\\|").replace('`', "'")
                ));
            }
        }
    }
    for r in results.iter().filter(|r| {
        ["paused-queue", "pg-dump", "held-reader", "long-run"].contains(&r.scenario.as_str())
    }) {
        out.push_str(&ring_over_time_markdown(r));
    }
    let long: Vec<_> = results
        .iter()
        .flat_map(|r| r.phases.iter().map(move |p| (r, p)))
        .filter_map(|(r, p)| p.drift.as_ref().map(|d| (r, p, d)))
        .collect();
    if !long.is_empty() {
        out.push_str("\n## Long phases: the first and last 10 minutes\n\n| system | profile | scenario | phase | completed/s first / last 10 min (ratio) | clients' memory MB 10 min in / end / peak since | server's private memory MB 10 min in / end / peak since | ring dead peak | schema dead peak |\n|---|---|---|---|---|---|---|---|---|\n");
        let mb =
            |kb: Option<u64>| kb.map_or_else(|| "–".into(), |kb| format!("{:.0}", kb as f64 / 1e3));
        for (r, p, d) in long {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} / {:.0} ({:.3}) | {} / {} / {} | {} / {} / {} | {} | {} |\n",
                r.system,
                r.profile,
                r.scenario,
                p.name,
                d.first_completed_per_s,
                d.last_completed_per_s,
                d.last_completed_per_s / d.first_completed_per_s.max(1e-9),
                mb(d.client_rss_kb_settled),
                mb(d.client_rss_kb_end),
                mb(d.client_rss_kb_peak),
                mb(d.server_private_kb_settled),
                mb(d.server_private_kb_end),
                mb(d.server_private_kb_peak),
                fmt_opt(p.ring_dead_peak),
                p.schema_dead_peak,
            ));
        }
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
