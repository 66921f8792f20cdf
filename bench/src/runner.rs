//! The runner: where the server is, one run per system × profile × scenario, and each phase of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::process::{Child, Command};

use ringwork::embedded::{BouncerTarget, EmbeddedPostgres, PgBouncer};
use ringwork::Client;
use ringwork::NewJob;
use ringwork::SchemaName;
use ringwork::Storage;
use ringwork::{Error, Result};

use crate::disturbances::{
    hold_loop, pg_dump_loop, reader_loop, repeatable_read_tables, replay_lag_loop, report_loop,
};
use crate::processes::{spawn_child, stop_child, Processes};
use crate::report::{print_run, write_outputs, PausedQueueResult, PhaseResult, RunResult};
use crate::sampler::{sample, summarise};
use crate::scenario::{
    BenchConfig, Disturbance, Phase, Scenario, System, BENCH_QUEUE, BENCH_SCHEMA, PAUSED_QUEUE,
};
use crate::worker::env_number;

/// Where the database is, and how to restart it.
pub(crate) struct Server {
    /// What the worker and producer processes connect to.
    pub(crate) url: String,
    /// What the runner's own sessions (migration, sampling, disturbances) connect to: `url`,
    /// except behind PgBouncer in transaction mode, where it is PgBouncer's session database.
    pub(crate) admin_url: String,
    pub(crate) embedded: Option<EmbeddedPostgres>,
    pub(crate) restart_cmd: Option<String>,
    /// The failover scenario's standby and the PgBouncer in front (`url` is PgBouncer's).
    pub(crate) failover: Option<(EmbeddedPostgres, PgBouncer)>,
}

/// "PostgreSQL 15.x, autovacuum on" for the report: a figure measured with autovacuum off is the
/// favourable case (no statistics, so no plan drift; no vacuum competing for the disk).
pub(crate) async fn describe_server(admin: &PgPool, config: &BenchConfig) -> Result<String> {
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
pub(crate) async fn analyze_loop(
    url: String,
    schema: String,
    every: Duration,
    spent_us: Arc<AtomicU64>,
) {
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
    /// Kill the primary, promote the standby, re-point PgBouncer at it; prints how long each took.
    pub(crate) fn fail_over(&self) -> Result<()> {
        let (Some(primary), Some((standby, bouncer))) = (&self.embedded, &self.failover) else {
            return Err(Error::Config(
                "failover needs the scenario's standby".into(),
            ));
        };
        let config = |e: ringwork::embedded::EmbeddedError| Error::Config(e.to_string());
        let started = Instant::now();
        primary.stop_immediately().map_err(config)?;
        let killed = started.elapsed();
        standby.promote().map_err(config)?;
        let promoted = started.elapsed();
        bouncer
            .repoint(&local_target(standby.port()))
            .map_err(config)?;
        eprintln!(
            "\n   failover: primary killed in {:.2} s, standby promoted at {:.2} s, PgBouncer \
             re-pointed at {:.2} s",
            killed.as_secs_f64(),
            promoted.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    pub(crate) async fn restart(&self) -> Result<()> {
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
            admin_url: url.clone(),
            embedded: None,
            restart_cmd: config.pg_restart_cmd.clone(),
            failover: None,
        },
        None => {
            eprintln!("no DATABASE_URL: starting a throwaway PostgreSQL cluster…");
            let autovacuum = if config.autovacuum { "on" } else { "off" };
            let mut settings = vec![("autovacuum", autovacuum)];
            // what each statement costs per phase (its own CPU is part of what the phase measures)
            if crate::statements::library_installed() {
                settings.push(("shared_preload_libraries", "pg_stat_statements"));
                settings.push(("pg_stat_statements.track", "all"));
            }
            let pg = EmbeddedPostgres::start_with(&settings)
                .map_err(|e| Error::Config(e.to_string()))?;
            if config.scenarios.contains(&Scenario::Failover) {
                failover_server(&config, pg, &settings).await?
            } else {
                Server {
                    url: pg.url(),
                    admin_url: pg.url(),
                    embedded: Some(pg),
                    restart_cmd: None,
                    failover: None,
                }
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

/// The failover scenario's server: a streaming standby of `primary` (synchronous unless
/// `RINGWORK_BENCH_FAILOVER_ASYNC=1`), and a PgBouncer in session mode in front that every process
/// connects through. One run per cluster pair: the scenario consumes its primary.
async fn failover_server(
    config: &BenchConfig,
    primary: EmbeddedPostgres,
    settings: &[(&str, &str)],
) -> Result<Server> {
    if config.scenarios.len() != 1 || config.profiles.len() != 1 || config.systems.len() != 1 {
        return Err(Error::Config(
            "failover kills its primary: run it alone, with one profile and one system".into(),
        ));
    }
    let embedded = |e: ringwork::embedded::EmbeddedError| Error::Config(e.to_string());
    let standby = primary.start_standby(settings).map_err(embedded)?;
    let synchronous = env_number("RINGWORK_BENCH_FAILOVER_ASYNC") != Some(1);
    let admin = connect_admin(&primary.url()).await?;
    if synchronous {
        sqlx::query("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            .execute(&admin)
            .await?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&admin)
            .await?;
    }
    let wanted = if synchronous { "sync" } else { "async" };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let streaming: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_replication WHERE sync_state = $1")
                .bind(wanted)
                .fetch_one(&admin)
                .await?;
        if streaming == 1 {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::Config(format!(
                "the standby did not stream as {wanted} within 30 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    admin.close().await;
    // RINGWORK_BENCH_TRANSACTION_POOLER=1: PgBouncer in transaction mode, the processes as
    // clients behind a transaction pooler (bench/src/worker.rs), the runner on its session database
    let mode = match env_number("RINGWORK_BENCH_TRANSACTION_POOLER") {
        Some(1) => "transaction",
        _ => "session",
    };
    let bouncer = PgBouncer::start(&local_target(primary.port()), mode, 190).map_err(embedded)?;
    eprintln!("failover: a {wanted} standby, every process through PgBouncer in {mode} mode");
    let admin_url = match mode {
        "transaction" => bouncer.url("postgres", "session"),
        _ => bouncer.url("postgres", "postgres"),
    };
    Ok(Server {
        admin_url,
        url: bouncer.url("postgres", "postgres"),
        embedded: Some(primary),
        restart_cmd: None,
        failover: Some((standby, bouncer)),
    })
}

fn local_target(port: u16) -> BouncerTarget {
    BouncerTarget {
        host: "127.0.0.1".into(),
        port,
        user: "postgres".into(),
    }
}

pub(crate) async fn connect_admin(url: &str) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(60))
        .connect(url)
        .await?)
}

pub(crate) async fn run_one(
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
    let admin = connect_admin(&server.admin_url).await?;
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
        System::Pgque { sql } => {
            let program = std::env::current_exe()
                .map_err(|e| Error::Config(format!("cannot find this binary: {e}")))?;
            let status = Command::new(program)
                .args(["pgque", "migrate", "--database-url", &server.url, "--sql"])
                .arg(sql)
                .status()
                .await
                .map_err(|e| Error::Config(format!("pgque migrate: {e}")))?;
            if !status.success() {
                return Err(Error::Config(format!("pgque migrate exited {status}")));
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
        produce_in_worker: None,
        producing_in_worker: false,
    };
    // the idle scenario's jobs come one a second
    let rate = if scenario == Scenario::Idle {
        1
    } else {
        config.rate
    };
    let fixed_rate = scenario.fixed_rate().then_some(rate);
    if config.producer_in_worker {
        processes.produce_in_worker = Some(Processes::produce_args(fixed_rate, config.depth));
    }
    for _ in 0..processes_n {
        processes.spawn_worker()?;
    }
    processes.workers_started(Duration::from_secs(30)).await;
    processes.spawn_producer(fixed_rate, config.depth)?;

    let server_note = describe_server(&admin, config).await?;
    let analyze_us = Arc::new(AtomicU64::new(0));
    let analyzer = config.analyze_every.map(|every| {
        tokio::spawn(analyze_loop(
            server.admin_url.clone(),
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
    processes.stop_producer().await;
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
pub(crate) async fn run_phase(
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
    // the standby-readers phase's standby, stopped and removed when the phase ends
    let mut standby = None;
    match phase.disturbance {
        Disturbance::NoJobs => processes.stop_producer().await,
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
                    server.admin_url.clone(),
                    processes.system.schema().to_string(),
                    Arc::clone(&stop_readers),
                )));
            }
        }
        Disturbance::PgDump => {
            readers.push(tokio::spawn(pg_dump_loop(
                server.admin_url.clone(),
                Vec::new(),
                "pg-dump",
                Arc::clone(&stop_readers),
            )));
        }
        Disturbance::StandbyReaders => {
            let primary = server.embedded.as_ref().ok_or_else(|| {
                Error::Config(
                    "standby-readers makes a standby of the throwaway cluster: run it without \
                     DATABASE_URL"
                        .into(),
                )
            })?;
            let settings = standby_settings()?;
            let pairs: Vec<(&str, &str)> = settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            eprintln!("   standby-readers: a hot standby with {pairs:?}");
            let made = primary
                .start_standby(&pairs)
                .map_err(|e| Error::Config(e.to_string()))?;
            let dump_args: Vec<String> = std::env::var("RINGWORK_BENCH_DUMP_ARGS")
                .map(|a| a.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default();
            eprintln!("   standby-readers: pg_dump {dump_args:?}, and a 60-s report on the ring");
            readers.push(tokio::spawn(pg_dump_loop(
                made.url(),
                dump_args,
                "standby pg-dump",
                Arc::clone(&stop_readers),
            )));
            readers.push(tokio::spawn(report_loop(
                made.url(),
                processes.system.schema().to_string(),
                Duration::from_secs(60),
                Arc::clone(&stop_readers),
            )));
            readers.push(tokio::spawn(replay_lag_loop(
                server.admin_url.clone(),
                Arc::clone(&stop_readers),
            )));
            standby = Some(made);
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
                    .connect(&server.admin_url)
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
            // an adapter holds the transactions, with its system's own transactional insert
            None => {
                let mut args = processes.command("hold");
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
    let statements = crate::statements::reset(admin).await;
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
                Disturbance::Failover => {
                    disturbed = true;
                    server.fail_over()?;
                    disturbance_over = Some(started.elapsed().as_secs_f64());
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
    drop(standby);
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
    if statements {
        result.top_statements = crate::statements::top(admin, result.completed, 15).await;
    }
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
pub(crate) async fn fill_paused_queue(storage: &Storage, jobs: u64) -> Result<()> {
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
pub(crate) async fn trickle_into_paused_queue(
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
pub(crate) async fn resume_and_drain(
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

/// The standby-readers standby's settings: `RINGWORK_BENCH_STANDBY_SETTINGS`, comma-separated
/// `name=value` (e.g. `hot_standby_feedback=on,max_standby_streaming_delay=-1`); none means
/// PostgreSQL's defaults.
fn standby_settings() -> Result<Vec<(String, String)>> {
    let Ok(text) = std::env::var("RINGWORK_BENCH_STANDBY_SETTINGS") else {
        return Ok(Vec::new());
    };
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| match item.split_once('=') {
            Some((name, value)) => Ok((name.trim().to_string(), value.trim().to_string())),
            None => Err(Error::Config(format!(
                "RINGWORK_BENCH_STANDBY_SETTINGS: {item:?} is not name=value"
            ))),
        })
        .collect()
}
