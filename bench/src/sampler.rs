//! Sampling the database during a phase, and a phase's samples summarised.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sqlx::PgPool;

use ringwork::schema::churn_class;
use ringwork::Result;
use ringwork::Storage;

use crate::cpu;
use crate::processes::Processes;
use crate::report::{Drift, PhaseResult, RingPoint, Spread, TableStat};
use crate::scenario::System;

#[derive(Clone, Default)]
pub(crate) struct Sample {
    pub(crate) at: f64,
    pub(crate) completed: u64,
    pub(crate) enqueued: u64,
    /// Microseconds spent inside handlers so far, and the workers of the fleet then.
    pub(crate) handler_us: u64,
    pub(crate) workers: usize,
    pub(crate) wal_lsn: i64,
    pub(crate) commits: i64,
    pub(crate) depth: i64,
    pub(crate) tables: BTreeMap<String, TableStat>,
    pub(crate) rotations: i64,
    pub(crate) sealed: i64,
    /// The server's postmaster and its CPU ms so far, when the server runs on this host.
    pub(crate) server_cpu: Option<(u32, f64)>,
    /// CPU ms the worker and producer processes have used so far.
    pub(crate) client_cpu_ms: Option<f64>,
    /// Resident memory (kB) of the worker and producer processes.
    pub(crate) client_rss_kb: Option<u64>,
    /// Private resident memory (kB) of the server's processes, when it runs on this host.
    pub(crate) server_private_kb: Option<u64>,
    /// The host's (busy, total) clock ticks.
    pub(crate) host_ticks: Option<(u64, u64)>,
    /// Commits this sample made itself (its statements, the counters' read among them): left
    /// out of the phase's commits, which an idle fleet's few would otherwise drown in.
    pub(crate) own_commits: i64,
    /// CPU ms the server spent on this sample's own statements after it read the server's CPU
    /// (the table statistics read most of all: about 40 ms over ringwork's partitions), left out
    /// of the phase's server CPU like its commits.
    pub(crate) own_server_cpu_ms: f64,
}

pub(crate) async fn sample(
    admin: &PgPool,
    processes: &Processes,
    storage: Option<&Storage>,
    started: Instant,
) -> Result<Sample> {
    // one session for the sample's statements, so their server CPU is that backend's
    let mut conn = admin.acquire().await?;
    let (wal_lsn, commits, backend): (i64, i64, i32) = sqlx::query_as(
        "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8,
                (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                pg_backend_pid()",
    )
    .fetch_one(&mut *conn)
    .await?;
    let backend = u32::try_from(backend).ok();
    let server_cpu = backend
        .and_then(cpu::postmaster_of)
        .and_then(|postmaster| Some((postmaster, cpu::server_ms(postmaster)?)));
    let own_cpu_from = backend.and_then(|pid| cpu::processes_ms([pid]));
    let clients: Vec<u32> = processes
        .workers
        .iter()
        .chain(processes.producer.as_ref())
        .filter_map(|child| child.id())
        .collect();
    let client_cpu_ms = cpu::processes_ms(clients.iter().copied());
    let client_rss_kb = cpu::processes_rss_kb(clients);
    let server_private_kb =
        server_cpu.and_then(|(postmaster, _)| cpu::server_private_kb(postmaster));
    let schema = processes.system.schema().to_string();
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_live_tup, n_dead_tup, pg_total_relation_size(relid)
         FROM pg_stat_user_tables WHERE schemaname = $1",
    )
    .bind(&schema)
    .fetch_all(&mut *conn)
    .await?;
    let tables = rows
        .into_iter()
        .map(|(name, live, dead, bytes)| {
            let class = match processes.system {
                System::Ringwork => churn_class(&name).map(|c| format!("{c:?}").to_lowercase()),
                System::Awa { .. } | System::Pgque { .. } => None,
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
        .fetch_one(&mut *conn)
        .await
        .unwrap_or((0, 0)),
        System::Awa { .. } | System::Pgque { .. } => (0, 0),
    };
    let own_server_cpu_ms = match (
        own_cpu_from,
        backend.and_then(|pid| cpu::processes_ms([pid])),
    ) {
        (Some(from), Some(to)) if to >= from => to - from,
        _ => 0.0,
    };
    drop(conn);
    Ok(Sample {
        at: started.elapsed().as_secs_f64(),
        completed: processes.counters.completed.load(Ordering::Relaxed),
        enqueued: processes.counters.enqueued.load(Ordering::Relaxed),
        handler_us: processes.counters.handler_us.load(Ordering::Relaxed),
        workers: processes.workers.len() * processes.workers_per_process,
        wal_lsn,
        commits,
        depth: processes.depth(storage).await.unwrap_or(-1),
        tables,
        rotations,
        sealed,
        server_cpu,
        client_cpu_ms,
        client_rss_kb,
        server_private_kb,
        host_ticks: cpu::host_ticks(),
        // the counters, the tables, and for ringwork the ring's generations and the depth (one
        // statement each); an adapter's depth, in a process of its own, is counted with awa's
        own_commits: match processes.system {
            System::Ringwork => 4,
            System::Awa { .. } | System::Pgque { .. } => 2,
        },
        own_server_cpu_ms,
    })
}

pub(crate) fn spread(values: &[f64]) -> Spread {
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

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub(crate) fn summarise(
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
    let seconds = last.at - first.at;
    // every sample but the last committed its statements after its read of the counter
    let own_commits: i64 = samples
        .iter()
        .take(samples.len().saturating_sub(1))
        .map(|s| s.own_commits)
        .sum();
    let per_s = |delta: f64| if seconds > 0.0 { delta / seconds } else { 0.0 };
    // per 1,000 completed jobs; the server's only while one postmaster ran the whole phase (a
    // restart resets its counters)
    let per_1k_jobs = |ms: f64| (completed > 0).then(|| ms * 1000.0 / completed as f64);
    // less what the samples' own statements cost the server (each after its CPU reading, so the
    // last sample's falls outside the phase)
    let own_server_cpu_ms: f64 = samples
        .iter()
        .take(samples.len().saturating_sub(1))
        .map(|s| s.own_server_cpu_ms)
        .sum();
    let server_cpu_ms = match (first.server_cpu, last.server_cpu) {
        (Some((a, from)), Some((b, to))) if a == b => {
            Some((to - from - own_server_cpu_ms).max(0.0))
        }
        _ => None,
    };
    let client_cpu_ms = match (first.client_cpu_ms, last.client_cpu_ms) {
        (Some(from), Some(to)) if to >= from => Some(to - from),
        _ => None,
    };
    let host_busy_pct = match (first.host_ticks, last.host_ticks) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
            Some((b1 - b0) as f64 * 100.0 / (t1 - t0) as f64)
        }
        _ => None,
    };
    // the workers' time inside handlers, from their once-a-second reports (so to within a second's
    // reports at each end of the phase); None where the workers report none (awa's adapter)
    let handlers_busy_pct = (last.handler_us > 0 && seconds > 0.0 && last.workers > 0).then(|| {
        last.handler_us.saturating_sub(first.handler_us) as f64 * 100.0
            / (seconds * 1e6 * last.workers as f64)
    });
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
        commits_per_job: per_job(last.commits - first.commits - own_commits),
        wal_bytes_per_s: per_s((last.wal_lsn - first.wal_lsn) as f64),
        commits_per_s: per_s((last.commits - first.commits - own_commits) as f64),
        server_cpu_ms_per_1k_jobs: server_cpu_ms.and_then(per_1k_jobs),
        server_cores: server_cpu_ms
            .filter(|_| seconds > 0.0)
            .map(|ms| ms / 1000.0 / seconds),
        client_cpu_ms_per_1k_jobs: client_cpu_ms.and_then(per_1k_jobs),
        host_busy_pct,
        handlers_busy_pct,
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
        top_statements: Vec::new(),
        paused_queue: None,
        drift: drift(samples),
    }
}

/// A phase of 20 minutes or more: its first and last 10 minutes' rates, and memory 10 minutes in
/// against the end (what the first minutes fill, caches and pools, is not growth).
pub(crate) fn drift(samples: &[Sample]) -> Option<Drift> {
    const WINDOW: f64 = 600.0;
    let (first, last) = (samples.first()?, samples.last()?);
    if last.at - first.at < 2.0 * WINDOW {
        return None;
    }
    let settled = samples.iter().find(|s| s.at - first.at >= WINDOW)?;
    let before_end = samples.iter().rev().find(|s| last.at - s.at >= WINDOW)?;
    let per_s = |a: &Sample, b: &Sample| (b.completed - a.completed) as f64 / (b.at - a.at);
    let peak = |f: fn(&Sample) -> Option<u64>| {
        samples
            .iter()
            .filter(|s| s.at >= settled.at)
            .filter_map(f)
            .max()
    };
    Some(Drift {
        first_completed_per_s: per_s(first, settled),
        last_completed_per_s: per_s(before_end, last),
        client_rss_kb_settled: settled.client_rss_kb,
        client_rss_kb_end: last.client_rss_kb,
        client_rss_kb_peak: peak(|s| s.client_rss_kb),
        server_private_kb_settled: settled.server_private_kb,
        server_private_kb_end: last.server_private_kb,
        server_private_kb_peak: peak(|s| s.server_private_kb),
    })
}

pub(crate) fn ring_point(s: &Sample) -> RingPoint {
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
        completed: s.completed,
        ring_dead: s
            .tables
            .values()
            .filter(|t| t.class.as_deref() == Some("ring"))
            .map(|t| t.dead)
            .max()
            .unwrap_or(0),
        schema_dead: s.tables.values().map(|t| t.dead).sum(),
        client_rss_kb: s.client_rss_kb,
        server_private_kb: s.server_private_kb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_summary_turns_counter_samples_into_rates_and_per_job_costs() {
        let at = |t: f64, completed: u64, wal: i64| Sample {
            at: t,
            completed,
            wal_lsn: wal,
            commits: completed as i64 / 10 + (t as i64) * 2,
            own_commits: 4,
            // 600 ms of server CPU per 2 s, 40 of them the sampler's own statements
            server_cpu: Some((1, t * 300.0)),
            own_server_cpu_ms: 40.0,
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
        assert_eq!(p.wal_bytes_per_s, 450_000.0);
        // the 4 extra commits of every 2 s were the sampler's own
        assert_eq!(p.commits_per_job, 0.1);
        assert_eq!(p.commits_per_s, 150.0);
        assert_eq!(p.pickup_ms_p50, 2.0);
        assert_eq!(p.prunes, Some(0));
        // 1,200 ms of server CPU less the two samples' own 80, for 6,000 jobs
        assert_eq!(p.server_cpu_ms_per_1k_jobs, Some(1120.0 / 6.0));
        assert!(p.drift.is_none(), "a phase under 20 minutes has no drift");
    }

    #[test]
    fn a_long_phase_compares_its_first_and_last_ten_minutes_and_memory_from_ten_minutes_in() {
        // a sample a minute for 30 minutes: 100 jobs/s for the first 10, then 90; the client's
        // memory fills to 200 MB in the first minutes, then grows 1 MB a minute
        let samples: Vec<Sample> = (0..=30u64)
            .map(|minute| Sample {
                at: minute as f64 * 60.0,
                completed: 6_000 * minute.min(10) + 5_400 * minute.saturating_sub(10),
                client_rss_kb: Some(if minute < 10 {
                    20_000 * minute
                } else {
                    200_000 + 1_000 * (minute - 10)
                }),
                server_private_kb: Some(50_000),
                ..Sample::default()
            })
            .collect();
        let d = drift(&samples).expect("a 30-minute phase");
        assert_eq!(d.first_completed_per_s, 100.0);
        assert_eq!(d.last_completed_per_s, 90.0);
        assert_eq!(d.client_rss_kb_settled, Some(200_000));
        assert_eq!(d.client_rss_kb_end, Some(220_000));
        assert_eq!(d.client_rss_kb_peak, Some(220_000));
        assert_eq!(d.server_private_kb_end, Some(50_000));
        assert!(drift(&samples[..20]).is_none(), "19 minutes are too short");
    }
}
