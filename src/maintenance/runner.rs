//! Leader election and the maintenance loop.
//!
//! Leadership is a session advisory lock held on a dedicated connection, kept out of the pool while
//! this process leads. The leader touches that connection (`SELECT 1`) every eighth of `stale_after`
//! (at most once a tick), so its backend's `state_change` in `pg_stat_activity` moves that often
//! while it is alive.
//!
//! A leader that stops making progress (a stopped process, a paused VM, a host that vanished
//! without closing its socket) would otherwise keep the lock, and with it rescue, promotion,
//! rotation and prune, for as long as the server keeps its session. So a process that finds the
//! lock taken looks at the holder's backend: idle for longer than the takeover bound
//! (2 × `stale_after`) means it has not ticked for that long, and the process fences it with
//! `pg_terminate_backend`, which ends the session and releases the lock; then it takes the lock
//! itself. No row is written for any of this (nothing for a held horizon to turn into dead tuples).
//!
//! The fenced leader finds out at its next touch: its `SELECT 1` fails on the terminated connection
//! and it steps down. A tick it was in the middle of when it froze, and those before that touch,
//! may overlap the new leader's: that is safe, because every maintenance step proves what it
//! needs under its own locks (rotation and prune lock the ring state row, rescue the attempt's
//! advisory lock, promotion deletes the deferred row it moves) — a second runner costs work, not
//! correctness.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{pass, MaintenanceConfig, Services, Signals, TickReport};
use crate::storage::Storage;
use crate::telemetry::Telemetry;

/// How often the leader looks for horizon holders to warn about.
const HORIZON_CHECK_EVERY: Duration = Duration::from_secs(30);

/// The longest a leader waits between promotions while its process LISTENs, when no deferred job
/// is due sooner: every statement that makes a deferred job due sooner notifies
/// (`wake_promotion()` in deferred.sql), so this only bounds what a missed notification costs.
/// Without a LISTEN the leader promotes at every tick.
const PROMOTE_AT_LEAST_EVERY: Duration = Duration::from_secs(5);

/// Followers try the leader's lock at most this often (and at most once a tick): a leader that
/// exits or dies is replaced within about a second, for one statement a second per follower.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Retention (dead letters, unique keys, finished workflows, archive buckets, totals folds) acts on
/// the configured retentions: a pass every sixth of the shortest (an archive's keep counted as its
/// bucket, a thirtieth of it) keeps each within a sixth of its bound, between every 10 s and every
/// minute (with the defaults, every minute).
fn retention_every(config: &MaintenanceConfig) -> Duration {
    [
        Some(config.dlq_retention),
        Some(config.unique_key_retention),
        Some(config.keep_completed / 30).filter(|d| !d.is_zero()),
        Some(config.keep_failed / 30).filter(|d| !d.is_zero()),
    ]
    .into_iter()
    .flatten()
    .min()
    .map_or(Duration::from_secs(60), |d| d / 6)
    .clamp(Duration::from_secs(10), Duration::from_secs(60))
}

/// When each service is next due on the leader. Each waits for its work to be able to appear, so
/// an idle leader makes about one statement a second (each of them every tick was most of an idle
/// process's load once):
/// - promotion, when the earliest deferred job is due, or at the next tick after a notification
///   that one is due sooner (`wake_promotion()`), or `PROMOTE_AT_LEAST_EVERY`; every tick without
///   a LISTEN. A scheduled job is late by at most a tick;
/// - rotation, when `rotation_due` says a ring could move (a slot `rotate_interval` old that holds
///   something), looked at again every fifth of the interval after a try; while no ring's slot
///   was written, once an interval (a slot written since rotates at most an interval late);
/// - rescue closes attempts `stale_after` without a heartbeat: a look every twentieth of it (at
///   most 5 s) adds at most that to a dead worker's jobs' wait;
/// - prune has work only while sealed slots wait: after a rotation sealed one, and while the last
///   prune left some (each tick then, as before: a prune gets in between a reader's transactions);
/// - retention, `retention_every`.
///
/// A service whose pass filled its batch, or whose lock was busy, is due again at the next tick;
/// a moved engine clock (`advance_clock`) makes every service due.
struct Pacing {
    promote_at: Instant,
    rotate_at: Instant,
    rescue_at: Instant,
    retention_at: Instant,
    prune: bool,
}

impl Pacing {
    /// Everything due now: a new leader knows nothing of what its predecessor left.
    fn new(now: Instant) -> Self {
        Self {
            promote_at: now,
            rotate_at: now,
            rescue_at: now,
            retention_at: now,
            prune: true,
        }
    }

    fn due(&self, now: Instant) -> Services {
        Services {
            promote: now >= self.promote_at,
            rotate: now >= self.rotate_at,
            rescue: now >= self.rescue_at,
            prune: self.prune,
            retention: now >= self.retention_at,
        }
    }

    /// `listening`: this process's LISTEN is in place, so `wake_promotion()` reaches it.
    fn after(
        &mut self,
        now: Instant,
        ran: Services,
        report: &TickReport,
        config: &MaintenanceConfig,
        listening: bool,
    ) {
        let next = |every: Duration, again: bool| {
            now + if again {
                Duration::ZERO
            } else {
                every.max(config.tick)
            }
        };
        if ran.promote {
            let idle = if listening {
                PROMOTE_AT_LEAST_EVERY
            } else {
                config.tick
            };
            let wait = report.next_promotion_in.map_or(idle, |due| due.min(idle));
            // a job due before the next tick is promoted at that tick
            self.promote_at = now + wait;
        }
        if ran.rotate {
            self.rotate_at = match report.rotation_due_in {
                _ if report.lease_ring == "busy" => now,
                // tried: a ring that could not move (no free slot) is looked at again soon
                Some(due) if due.is_zero() => next(config.rotate_interval / 5, false),
                Some(due) => next(due, false),
                None => next(config.rotate_interval, false),
            };
        }
        if ran.rescue {
            let full = report.rescued >= config.rescue_batch
                || report.callbacks_timed_out >= config.rescue_batch;
            self.rescue_at = next((config.stale_after / 20).min(Duration::from_secs(5)), full);
        }
        if ran.retention {
            let full = report.dlq_expired >= config.promote_batch
                || report.unique_keys_expired >= config.promote_batch
                || report.workflows_expired >= config.promote_batch;
            self.retention_at = next(retention_every(config), full);
        }
        if ran.prune || report.rotated_queue || report.rotated_claim {
            self.prune = !report.prune_skips.is_empty();
        }
    }
}

fn leader_key(storage: &Storage) -> i64 {
    crate::schema::leader_lock_key(storage.schema())
}

/// How long a leader's connection may sit idle (no tick) before another process fences it.
pub(crate) fn takeover_after(config: &MaintenanceConfig) -> Duration {
    config.stale_after * 2
}

/// `listening` is the process's LISTEN in place (runtime/notifier.rs), which also sets `signals`.
pub(crate) async fn run(
    storage: Storage,
    config: MaintenanceConfig,
    telemetry: Telemetry,
    listening: Arc<AtomicBool>,
    signals: Arc<Signals>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(session) = storage.session_pool().cloned() else {
        warn!(
            schema = %storage.schema(),
            "this process reaches PostgreSQL only through a transaction pooler and has no direct \
             session pool: it never leads maintenance (rescue, promotion, rotation, prune); run \
             at least one process with a session pool"
        );
        return;
    };
    let key = leader_key(&storage);
    let mut leader: Option<PoolConnection<Postgres>> = None;
    // non-leaders look at the holder's liveness at most this often (a pg_locks scan)
    let check_every = (config.stale_after / 4).max(config.tick);
    let mut last_check: Option<Instant> = None;
    let mut last_try: Option<Instant> = None;
    let mut last_touch = Instant::now();
    // the lock connection is touched this often while leading (see below)
    let touch_every = (config.stale_after / 8).max(config.tick);
    let mut last_horizon_check: Option<Instant> = None;
    let mut pacing = Pacing::new(Instant::now());
    loop {
        match leader.as_mut() {
            None if last_try.is_some_and(|at| at.elapsed() < FOLLOW_EVERY) => {}
            None => {
                last_try = Some(Instant::now());
                let check_holder = last_check.is_none_or(|at| at.elapsed() >= check_every);
                if check_holder {
                    last_check = Some(Instant::now());
                }
                leader = try_lead(&session, &config, key, check_holder).await;
                if let Some(conn) = leader.as_mut() {
                    // operators see which process leads in pg_stat_activity, unless the pool
                    // names its sessions itself (the session is closed when it steps down)
                    let _ = sqlx::query_scalar::<_, String>(crate::runtime::NAME_IF_UNNAMED)
                        .bind(storage.schema().session_name(Some("leader")))
                        .fetch_optional(&mut **conn)
                        .await;
                }
                if leader.is_some() {
                    last_touch = Instant::now();
                    pacing = Pacing::new(Instant::now());
                }
            }
            // Still ours? A dead connection, or one terminated by a process that found this
            // leader frozen, means the lock is gone: step down before acting. Looked at every
            // eighth of `stale_after`, not every tick: the takeover bound is twice `stale_after`
            // of idleness, and a fenced leader's passes overlapping its successor's for that long
            // cost work, not correctness (see the module's comment).
            Some(conn) if last_touch.elapsed() >= touch_every => {
                last_touch = Instant::now();
                if sqlx::query("SELECT 1").execute(&mut **conn).await.is_err() {
                    warn!(
                        "maintenance leader connection lost (or fenced as frozen); stepping down"
                    );
                    step_down(leader.take()).await;
                }
            }
            Some(_) => {}
        }
        // taken whether or not this process leads: a new leader starts with everything due anyway
        let clock_moved = signals.clock.swap(false, Ordering::Relaxed);
        let deferred_sooner = signals.deferred.swap(false, Ordering::Relaxed);
        if clock_moved {
            pacing = Pacing::new(Instant::now());
        } else if deferred_sooner {
            pacing.promote_at = Instant::now();
        } else if !listening.load(Ordering::Relaxed) {
            // no LISTEN (lost, or not yet in place): nothing would tell of a deferred job
            pacing.promote_at = pacing.promote_at.min(Instant::now() + config.tick);
        }
        if let Some(conn) = leader.as_mut() {
            // Touch the lock connection while the tick runs (every stale_after / 2), so that a
            // long tick (a deep promotion backlog, prune lock waits, a slow pool) never looks like
            // a frozen leader to the other processes; a failed touch means this leader was fenced.
            let services = pacing.due(Instant::now());
            let ticking = pass(&storage, &config, services);
            tokio::pin!(ticking);
            let outcome = loop {
                tokio::select! {
                    result = &mut ticking => break Some(result),
                    _ = tokio::time::sleep(config.stale_after / 2) => {
                        if sqlx::query("SELECT 1").execute(&mut **conn).await.is_err() {
                            break None;
                        }
                    }
                }
            };
            match outcome {
                Some(Ok(report)) => {
                    let listens = listening.load(Ordering::Relaxed);
                    pacing.after(Instant::now(), services, &report, &config, listens);
                    report.record(&telemetry);
                }
                Some(Err(e)) => {
                    // what the pass did before it failed is unknown (a rotation may have sealed a
                    // slot): prune looks at the next tick; the other services stay due
                    pacing.prune = true;
                    warn!(error = %e, "maintenance tick failed");
                }
                None => {
                    warn!("maintenance leader fenced during a tick; stepping down");
                    step_down(leader.take()).await;
                }
            }
        }
        if let (Some(_), Some(warn_after)) = (leader.as_ref(), config.horizon_warn_after) {
            if last_horizon_check.is_none_or(|at| at.elapsed() >= HORIZON_CHECK_EVERY) {
                last_horizon_check = Some(Instant::now());
                warn_horizon_holders(&storage, warn_after).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.tick) => {}
            _ = stop.changed() => break,
        }
    }
    step_down(leader).await;
}

/// The horizon canary's log line: one warning per holder past the threshold.
async fn warn_horizon_holders(storage: &Storage, warn_after: Duration) {
    match storage.horizon_holders(warn_after).await {
        Ok(holders) => {
            // an active replication slot always holds a catalog_xmin: only an inactive one (its
            // consumer is gone) is news
            for h in holders.into_iter().filter(|h| {
                h.kind != "replication_slot" || h.backend_state.as_deref() == Some("inactive")
            }) {
                let held_s = h
                    .held_since
                    .map(|since| (chrono::Utc::now() - since).num_seconds());
                warn!(
                    kind = %h.kind,
                    holder = %h.holder,
                    pid = ?h.pid,
                    user = ?h.usename,
                    application = ?h.application,
                    client = ?h.client,
                    state = ?h.backend_state,
                    held_s = ?held_s,
                    xmin_age = ?h.xmin_age,
                    query = ?h.query,
                    "the MVCC horizon is held back: vacuum cannot reclaim rows deleted since; \
                     ringwork's rings do not bloat, the rest of the database does"
                );
            }
        }
        Err(e) => debug!(error = %e, "horizon check failed"),
    }
}

/// Leave leadership by ending the lock's session: the connection is detached from the pool and
/// closed, never handed back with the session lock still on it (a pooled connection that kept the
/// lock could lead to a re-entrant second hold and a lock nobody releases).
async fn step_down(leader: Option<PoolConnection<Postgres>>) {
    if let Some(conn) = leader {
        let _ = conn.detach().close().await;
    }
}

/// Boxed (as `schema::migrate` is): rustc cannot otherwise prove `Send` for a future that
/// reborrows a pooled connection across awaits (rust-lang/rust#102211).
fn try_lead<'a>(
    session: &'a PgPool,
    config: &'a MaintenanceConfig,
    key: i64,
    check_holder: bool,
) -> BoxFuture<'a, Option<PoolConnection<Postgres>>> {
    Box::pin(try_lead_inner(session, config, key, check_holder))
}

/// The leader's lock is a session lock, so it is taken on `session`, a pool whose connections are
/// server sessions (never a transaction pooler's).
async fn try_lead_inner(
    session: &PgPool,
    config: &MaintenanceConfig,
    key: i64,
    check_holder: bool,
) -> Option<PoolConnection<Postgres>> {
    let mut conn = session.acquire().await.ok()?;
    if take_lock(&mut conn, key).await {
        return Some(conn);
    }
    if !check_holder {
        return None;
    }
    let bound = takeover_after(config);
    // The holder of this schema's leader lock, if its backend has been idle past the bound. A
    // bigint advisory key shows in pg_locks as classid = high 32 bits, objid = low 32 bits.
    let frozen: Option<(i32, f64)> = sqlx::query_as(
        "SELECT a.pid, extract(epoch FROM now() - a.state_change)::float8
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND l.classid::bigint = ($1 >> 32) & 4294967295 AND l.objid::bigint = $1 & 4294967295
           AND a.state = 'idle' AND a.state_change < now() - make_interval(secs => $2)",
    )
    .bind(key)
    .bind(bound.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await
    .ok()
    .flatten();
    let (pid, idle_s) = frozen?;
    warn!(
        pid,
        idle_s, "maintenance leader made no progress past the takeover bound; fencing it"
    );
    // waits up to 5 s for the backend to exit (and so release the lock)
    let fenced: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or(false);
    if !fenced {
        warn!(pid, "could not fence the frozen maintenance leader");
        return None;
    }
    if take_lock(&mut conn, key).await {
        info!(pid, "took over maintenance from a frozen leader");
        return Some(conn);
    }
    None
}

/// Try the leader lock on `conn`; on success, make a vanished host's session die in minutes rather
/// than hours (server-side TCP keepalives on this session: 60 s idle, then 6 probes 10 s apart).
async fn take_lock(conn: &mut PgConnection, key: i64) -> bool {
    let won: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or(false);
    if won {
        debug!("elected maintenance leader");
        let _ = sqlx::query(
            "SELECT set_config('tcp_keepalives_idle', '60', false), \
                    set_config('tcp_keepalives_interval', '10', false), \
                    set_config('tcp_keepalives_count', '6', false)",
        )
        .execute(&mut *conn)
        .await;
    }
    won
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> TickReport {
        TickReport::default()
    }

    const NONE: Services = Services {
        promote: false,
        rotate: false,
        rescue: false,
        prune: false,
        retention: false,
    };

    #[test]
    fn a_quiet_leader_runs_each_service_only_when_its_work_can_have_appeared() {
        let config = MaintenanceConfig::default(); // tick 500 ms, rotate 5 s, stale 60 s
        let t0 = Instant::now();
        let mut pacing = Pacing::new(t0);
        // a new leader runs everything at once
        assert_eq!(pacing.due(t0), Services::ALL);
        // nothing deferred, no ring written, nothing sealed
        pacing.after(t0, Services::ALL, &quiet(), &config, true);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(pacing.due(at(500)), NONE);
        assert_eq!(pacing.due(at(2_500)), NONE);
        assert_eq!(
            pacing.due(at(3_000)),
            Services {
                rescue: true,
                ..NONE
            }
        );
        assert_eq!(
            pacing.due(at(5_000)),
            Services {
                promote: true,
                rotate: true,
                rescue: true,
                ..NONE
            }
        );
        assert!(!pacing.due(at(59_000)).retention);
        assert!(
            pacing.due(at(60_000)).retention,
            "a minute with the defaults"
        );
        // without a LISTEN, nothing tells the leader of a deferred job: it promotes every tick
        let mut polling = Pacing::new(t0);
        polling.after(t0, Services::ALL, &quiet(), &config, false);
        assert!(polling.due(at(500)).promote);
    }

    #[test]
    fn promotion_waits_for_the_earliest_deferred_job_and_at_most_its_idle_bound() {
        let config = MaintenanceConfig::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut pacing = Pacing::new(t0);
        let soon = TickReport {
            next_promotion_in: Some(Duration::from_millis(1_200)),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &soon, &config, true);
        assert!(!pacing.due(at(1_000)).promote);
        assert!(pacing.due(at(1_200)).promote);
        // one due in an hour: the idle bound still looks every 5 s
        let later = TickReport {
            next_promotion_in: Some(Duration::from_secs(3600)),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &later, &config, true);
        assert!(!pacing.due(at(4_500)).promote);
        assert!(pacing.due(at(5_000)).promote);
        // some were due already (another promotion held them): the next tick
        let overdue = TickReport {
            next_promotion_in: Some(Duration::ZERO),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &overdue, &config, true);
        assert!(pacing.due(at(0)).promote);
    }

    #[test]
    fn rotation_is_looked_at_when_a_written_ring_comes_of_age() {
        let config = MaintenanceConfig::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut pacing = Pacing::new(t0);
        // a written slot 3.5 s old: due in 1.5 s
        let young = TickReport {
            rotation_due_in: Some(Duration::from_millis(1_500)),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &young, &config, true);
        assert!(!pacing.due(at(1_000)).rotate);
        assert!(pacing.due(at(1_500)).rotate);
        // tried (due was zero): looked at again a fifth of the interval later
        let tried = TickReport {
            rotation_due_in: Some(Duration::ZERO),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &tried, &config, true);
        assert!(!pacing.due(at(900)).rotate);
        assert!(pacing.due(at(1_000)).rotate);
        // a busy lease ring: the next tick
        let busy = TickReport {
            rotation_due_in: Some(Duration::ZERO),
            lease_ring: "busy".into(),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &busy, &config, true);
        assert!(pacing.due(at(0)).rotate);
    }

    #[test]
    fn a_tick_longer_than_every_pace_runs_every_service_but_retention_each_tick() {
        let config = MaintenanceConfig {
            tick: Duration::from_secs(30),
            ..MaintenanceConfig::default()
        };
        let t0 = Instant::now();
        let mut pacing = Pacing::new(t0);
        pacing.after(t0, Services::ALL, &quiet(), &config, false);
        let next = pacing.due(t0 + config.tick);
        assert!(next.promote && next.rotate && next.rescue && !next.prune);
        assert!(pacing.due(t0 + 2 * config.tick).retention);
    }

    #[test]
    fn retention_runs_every_sixth_of_the_shortest_retention_within_its_bounds() {
        let defaults = MaintenanceConfig::default();
        assert_eq!(retention_every(&defaults), Duration::from_secs(60));
        let short = MaintenanceConfig {
            dlq_retention: Duration::from_secs(120),
            ..MaintenanceConfig::default()
        };
        assert_eq!(retention_every(&short), Duration::from_secs(20));
        let shortest = MaintenanceConfig {
            keep_completed: Duration::from_secs(60),
            ..MaintenanceConfig::default()
        };
        assert_eq!(retention_every(&shortest), Duration::from_secs(10));
    }

    #[test]
    fn a_rotation_a_slot_left_sealed_or_a_full_batch_is_due_again_next_tick() {
        let config = MaintenanceConfig::default();
        let t0 = Instant::now();
        let mut pacing = Pacing::new(t0);
        let written = TickReport {
            rotation_due_in: Some(Duration::from_secs(1)),
            ..quiet()
        };
        pacing.after(t0, Services::ALL, &written, &config, true);
        let t1 = t0 + Duration::from_secs(1);
        let ran = pacing.due(t1);
        assert!(ran.rotate && !ran.prune);
        // the rotation sealed a slot, prune (run in the same pass) could not take it yet
        let sealed = TickReport {
            rotated_queue: true,
            rotation_due_in: Some(Duration::ZERO),
            prune_skips: vec![("queue", "claims_open".into())],
            ..TickReport::default()
        };
        pacing.after(t1, ran, &sealed, &config, true);
        let t2 = t1 + config.tick;
        assert!(
            pacing.due(t2).prune,
            "a sealed slot waits: prune every tick"
        );
        // that prune took it: back to waiting for a rotation
        pacing.after(
            t2,
            pacing.due(t2),
            &TickReport {
                pruned_queue_slots: vec![3],
                ..TickReport::default()
            },
            &config,
            true,
        );
        assert!(!pacing.due(t2 + config.tick).prune);
        // a rescue that filled its batch runs again at the next tick, not in 3 s
        let t3 = t0 + Duration::from_secs(3);
        let ran = pacing.due(t3);
        assert!(ran.rescue);
        let full = TickReport {
            rescued: config.rescue_batch,
            ..TickReport::default()
        };
        pacing.after(t3, ran, &full, &config, true);
        assert!(pacing.due(t3 + config.tick).rescue);
    }
}
