//! Fleet-wide queue limits: a concurrency limit and a rate limit that hold
//! across processes, counted from what claims write anyway (no per-job counter row).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringwork::{
    Client, CompletionConfig, Error, JobArgs, JobContext, JobError, JobStatus, KeyLimit, NewJob,
    QueueConfig, QueueLimits, RunningClient,
};
use serde::{Deserialize, Serialize};
use support::{complete_one, TestDb};

#[derive(Serialize, Deserialize)]
struct Work {
    ms: u64,
}

impl JobArgs for Work {
    const KIND: &'static str = "work";
}

/// What the handlers see, across every "process" of the test.
#[derive(Default)]
struct Seen {
    running: AtomicUsize,
    peak: AtomicUsize,
    done: AtomicUsize,
}

/// `processes` clients on one schema, each its own pool and dispatchers, like separate processes.
async fn fleet(db: &TestDb, processes: usize, seen: &Arc<Seen>) -> Vec<RunningClient> {
    let mut running = Vec::new();
    for _ in 0..processes {
        let pool = TestDb::connect(&db.url, 4).await;
        let seen = Arc::clone(seen);
        let client = Client::builder(pool)
            .schema(db.schema.as_str())
            .maintenance(support::fast_maintenance())
            .queue(
                "limited",
                QueueConfig {
                    max_workers: 8,
                    poll_interval: Duration::from_millis(50),
                    ..QueueConfig::default()
                },
            )
            .register(move |_ctx: JobContext, job: Work| {
                let seen = Arc::clone(&seen);
                async move {
                    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(job.ms)).await;
                    seen.running.fetch_sub(1, Ordering::SeqCst);
                    seen.done.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), JobError>(())
                }
            })
            .build()
            .await
            .unwrap();
        running.push(client.start().await.unwrap());
    }
    running
}

/// A fleet-wide concurrency limit of `max_running` on the queue "limited", alone.
async fn limit_running(db: &TestDb, max_running: u32) {
    let limits = QueueLimits {
        max_running: Some(max_running),
        rate: None,
        per_key: None,
    };
    assert!(db
        .storage()
        .set_queue_limits("limited", limits)
        .await
        .unwrap());
}

async fn enqueue(db: &TestDb, n: usize, ms: u64) {
    let client = db.client().build().await.unwrap();
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob::new(&Work { ms }).unwrap().queue("limited"))
        .collect();
    client.insert_many(&jobs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_of_5_is_never_exceeded_across_4_processes() {
    let db = TestDb::new().await;
    limit_running(&db, 5).await;
    enqueue(&db, 300, 20).await;
    let seen = Arc::new(Seen::default());
    let started = Instant::now();
    let running = fleet(&db, 4, &seen).await;
    while seen.done.load(Ordering::SeqCst) < 300 && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for client in running {
        client.shutdown(Duration::from_secs(5)).await;
    }
    let peak = seen.peak.load(Ordering::SeqCst);
    assert_eq!(seen.done.load(Ordering::SeqCst), 300, "every job ran");
    // 32 workers in all, held to 5 running at once by the handlers' own count
    assert!(peak <= 5, "peak {peak} running handlers");
    assert!(peak >= 3, "the limit, not a stall, bounds it: peak {peak}");
    eprintln!(
        "300 jobs of 20 ms under a limit of 5 across 4 processes: {:?}, peak {peak}",
        started.elapsed()
    );
    db.cleanup().await;
}

/// Once every claimed job of `queue` is closed (the handlers' completions flushed), how many jobs
/// the handlers have run. A test moves the engine clock only then: a claim still open when the
/// clock jumps an hour would look stale and be rescued.
async fn settled(db: &TestDb, queue: &str, done: impl Fn() -> usize, at_least: usize) -> usize {
    let storage = db.storage();
    assert!(
        support::eventually(Duration::from_secs(30), || async {
            done() >= at_least && storage.queue_counts(Some(queue)).await.unwrap()[0].running == 0
        })
        .await,
        "{queue}: {} of {at_least} jobs ran",
        done()
    );
    done()
}

/// A rate limit of 100 claims per sliding hour across 4 processes (32 workers, 450 waiting jobs).
/// The engine clock moves an hour at a time, so each hour's window holds exactly what the limit
/// admits: 100, not one more (a claim let through late shows up in the next hour's count), and not
/// fewer (the limit does not stall the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_admits_exactly_its_rate_per_window_across_4_processes() {
    let db = TestDb::new().await;
    let hour = Duration::from_secs(3600);
    db.storage()
        .set_queue_limits(
            "limited",
            QueueLimits {
                max_running: None,
                rate: Some((100, hour)),
                per_key: None,
            },
        )
        .await
        .unwrap();
    enqueue(&db, 450, 0).await;
    let seen = Arc::new(Seen::default());
    let running = fleet(&db, 4, &seen).await;
    let done = || seen.done.load(Ordering::SeqCst);
    let mut per_hour = Vec::new();
    let mut before = 0;
    for hour_no in 1..=4 {
        if hour_no > 1 {
            db.advance_clock(hour).await;
        }
        let now = settled(&db, "limited", done, 100 * hour_no).await;
        per_hour.push(now - before);
        before = now;
    }
    db.advance_clock(hour).await;
    let now = settled(&db, "limited", done, 450).await;
    per_hour.push(now - before);
    for client in running {
        client.shutdown(Duration::from_secs(5)).await;
    }
    assert_eq!(per_hour, [100, 100, 100, 100, 50], "jobs run per hour");
    db.cleanup().await;
}

/// A claim of a rate-limited queue that waits for the queue's limit lock while the engine clock
/// moves an hour is decided on the clock it finds once it holds the lock: it counts the new hour's
/// window (empty, so it gets its room) and its deadline lies ahead of the new now. Decided on the
/// clock it read before the wait, it would count the old hour against the new one and record its
/// claims in the old hour, where the next claim no longer counts them: the new window admits more
/// than its rate (the fleet test above saw 108 of 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_the_limit_lock_across_a_clock_move_is_decided_on_the_new_clock() {
    let db = TestDb::new().await;
    let hour = Duration::from_secs(3600);
    let deadline = Some(Duration::from_secs(600));
    let storage = db.storage();
    storage
        .set_queue_limits(
            "limited",
            QueueLimits {
                max_running: None,
                rate: Some((10, hour)),
                per_key: None,
            },
        )
        .await
        .unwrap();
    enqueue(&db, 30, 0).await;
    assert_eq!(
        storage.claim("limited", 20, deadline).await.unwrap().len(),
        10
    );
    // the next claim reads the clock, then waits for the queue's limit lock held here
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT pg_advisory_xact_lock({s}.lock_ns('queue_limit'), hashtext('limited'))",
        s = db.schema
    ))
    .execute(&mut *holder)
    .await
    .unwrap();
    let waiting = tokio::spawn({
        let storage = storage.clone();
        async move { storage.claim("limited", 20, deadline).await }
    });
    assert!(support::one_waits_for_a_lock(&db).await, "the claim waits");
    db.advance_clock(hour).await;
    holder.commit().await.unwrap();
    let claimed = waiting.await.unwrap().unwrap();
    assert_eq!(claimed.len(), 10, "the new hour's window is empty");
    let now: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar(&format!("SELECT {}.engine_now()", db.schema))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    for job in &claimed {
        let left = job.deadline_at.expect("a deadline") - now;
        assert!(
            left > chrono::Duration::seconds(500),
            "the deadline is ten minutes after the decision, {left} from now"
        );
    }
    // and the window counts the claims it recorded: full for the rest of the hour
    assert_eq!(
        storage.claim("limited", 20, deadline).await.unwrap().len(),
        0
    );
    db.cleanup().await;
}

#[tokio::test]
async fn limits_are_validated_and_can_be_removed() {
    let db = TestDb::new().await;
    let storage = db.storage();
    for (limits, word) in [
        (
            QueueLimits {
                max_running: Some(0),
                rate: None,
                per_key: None,
            },
            "max_running",
        ),
        (
            QueueLimits {
                max_running: None,
                rate: Some((10, Duration::ZERO)),
                per_key: None,
            },
            "period",
        ),
        (
            QueueLimits {
                max_running: None,
                rate: Some((0, Duration::from_secs(1))),
                per_key: None,
            },
            "count",
        ),
    ] {
        match storage.set_queue_limits("q", limits).await {
            Err(Error::Config(msg)) => assert!(msg.contains(word), "{msg}"),
            other => panic!("{word}: expected a config error, got {other:?}"),
        }
    }
    let one = QueueLimits {
        max_running: Some(1),
        rate: None,
        per_key: None,
    };
    assert!(storage.set_queue_limits("q", one.clone()).await.unwrap());
    assert!(
        !storage.set_queue_limits("q", one).await.unwrap(),
        "unchanged"
    );
    // with one running, a second claim gets nothing; removing the limit lets it through
    let client = db.client().build().await.unwrap();
    let jobs: Vec<NewJob> = (0..2)
        .map(|_| NewJob::new(&Work { ms: 0 }).unwrap().queue("q"))
        .collect();
    client.insert_many(&jobs).await.unwrap();
    assert_eq!(storage.claim("q", 10, None).await.unwrap().len(), 1);
    assert_eq!(storage.claim("q", 10, None).await.unwrap().len(), 0);
    assert!(storage
        .set_queue_limits("q", QueueLimits::default())
        .await
        .unwrap());
    assert_eq!(storage.claim("q", 10, None).await.unwrap().len(), 1);
    db.cleanup().await;
}

/// The running count starts at the queue's running mark (migration 0010), the oldest claim still
/// open. An attempt claimed long before many closed ones pins the mark and is still counted; a
/// row-local claim (a job with its own timeout) is counted; once the old attempts close, the mark
/// moves past them.
#[tokio::test]
async fn the_running_count_keeps_an_old_open_claim_behind_many_closed_ones() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let limit = QueueLimits {
        max_running: Some(3),
        rate: None,
        per_key: None,
    };
    storage.set_queue_limits("marked", limit).await.unwrap();
    let client = db.client().build().await.unwrap();
    let job = || NewJob::new(&Work { ms: 0 }).unwrap().queue("marked");
    client.insert_many(&[job()]).await.unwrap();
    let old = storage.claim("marked", 10, None).await.unwrap();
    assert_eq!(old.len(), 1);
    // a job with its own timeout is claimed as a row-local lease_claims row
    client
        .insert_many(&[job().timeout(Duration::from_secs(600))])
        .await
        .unwrap();
    let own_timeout = storage.claim("marked", 10, None).await.unwrap();
    assert_eq!(own_timeout.len(), 1);
    let mark = || async {
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT pg_sequence_last_value(running_mark_seq) FROM {}.queues WHERE queue = 'marked'",
            db.schema
        ))
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .unwrap_or(0)
    };
    // many claims come and go after them: each claim moves nothing past the old one
    for _ in 0..20 {
        client.insert_many(&[job()]).await.unwrap();
        let claimed = storage.claim("marked", 10, None).await.unwrap();
        assert_eq!(claimed.len(), 1, "two of three running: one more fits");
        let refs: Vec<_> = claimed.iter().map(|c| c.attempt_ref()).collect();
        storage.complete_batch(&refs).await.unwrap();
    }
    let pinned = mark().await;
    assert_eq!(
        pinned,
        old[0].receipt_id / 4096,
        "the oldest open claim pins the mark"
    );
    client.insert_many(&[job(), job()]).await.unwrap();
    assert_eq!(storage.claim("marked", 10, None).await.unwrap().len(), 1);
    assert_eq!(storage.claim("marked", 10, None).await.unwrap().len(), 0);
    // the old attempt ends by cancel, the row-local one by completion: the mark moves on
    storage.cancel_job(old[0].job_id, "test").await.unwrap();
    storage
        .complete_batch(&[own_timeout[0].attempt_ref()])
        .await
        .unwrap();
    let more = storage.claim("marked", 10, None).await.unwrap();
    assert_eq!(more.len(), 1, "two freed, one waiting");
    assert!(
        mark().await > pinned,
        "the mark moved past the closed claims"
    );
    assert_eq!(storage.count_in_flight(Some("marked")).await.unwrap(), 2);
    db.cleanup().await;
}

#[derive(Serialize, Deserialize)]
struct TenantWork {
    tenant: String,
    ms: u64,
}

impl JobArgs for TenantWork {
    const KIND: &'static str = "tenant_work";
}

fn tenant_job(tenant: &str, ms: u64) -> NewJob {
    NewJob::new(&TenantWork {
        tenant: tenant.into(),
        ms,
    })
    .unwrap()
    .queue("tenants")
}

fn per_tenant(max: u32) -> QueueLimits {
    QueueLimits {
        per_key: Some(KeyLimit::arg("tenant").max_running(max)),
        ..QueueLimits::default()
    }
}

/// One tenant's handlers: running now, the peak, and when each job finished.
type TenantRuns = (usize, usize, Vec<Instant>);

/// What each tenant's handlers saw.
#[derive(Default)]
struct TenantSeen {
    by_tenant: Mutex<std::collections::HashMap<String, TenantRuns>>,
    done: AtomicUsize,
}

/// A per-key limit of 2 across 4 processes (32 workers): a hot tenant enqueued first never runs
/// more than 2 at once, and the tenants behind it are not starved: they finish while most of the
/// hot tenant's jobs still wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_held_to_its_limit_and_does_not_starve_the_other_keys() {
    let db = TestDb::new().await;
    db.storage()
        .set_queue_limits("tenants", per_tenant(2))
        .await
        .unwrap();
    let producer = db.client().build().await.unwrap();
    let mut jobs: Vec<NewJob> = (0..120).map(|_| tenant_job("hot", 40)).collect();
    for tenant in ["a", "b", "c"] {
        jobs.extend((0..10).map(|_| tenant_job(tenant, 40)));
    }
    producer.insert_many(&jobs).await.unwrap();

    let seen = Arc::new(TenantSeen::default());
    let mut fleet = Vec::new();
    for _ in 0..4 {
        let pool = TestDb::connect(&db.url, 4).await;
        let seen = Arc::clone(&seen);
        let client = Client::builder(pool)
            .schema(db.schema.as_str())
            .maintenance(support::fast_maintenance())
            .queue(
                "tenants",
                QueueConfig {
                    max_workers: 8,
                    poll_interval: Duration::from_millis(50),
                    ..QueueConfig::default()
                },
            )
            .register(move |_ctx: JobContext, job: TenantWork| {
                let seen = Arc::clone(&seen);
                async move {
                    {
                        let mut map = seen.by_tenant.lock().unwrap();
                        let entry = map.entry(job.tenant.clone()).or_default();
                        entry.0 += 1;
                        entry.1 = entry.1.max(entry.0);
                    }
                    tokio::time::sleep(Duration::from_millis(job.ms)).await;
                    {
                        let mut map = seen.by_tenant.lock().unwrap();
                        let entry = map.entry(job.tenant.clone()).or_default();
                        entry.0 -= 1;
                        entry.2.push(Instant::now());
                    }
                    seen.done.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), JobError>(())
                }
            })
            .build()
            .await
            .unwrap();
        fleet.push(client.start().await.unwrap());
    }
    let started = Instant::now();
    while seen.done.load(Ordering::SeqCst) < 150 && started.elapsed() < Duration::from_secs(90) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for client in fleet {
        client.shutdown(Duration::from_secs(5)).await;
    }
    assert_eq!(seen.done.load(Ordering::SeqCst), 150, "every job ran");
    let map = seen.by_tenant.lock().unwrap().clone();
    for (tenant, (_, peak, _)) in map.iter() {
        assert!(*peak <= 2, "tenant {tenant} peaked at {peak} running");
    }
    assert_eq!(map["hot"].1, 2, "the hot tenant used its limit");
    let others_done = ["a", "b", "c"]
        .iter()
        .map(|t| *map[*t].2.iter().max().unwrap())
        .max()
        .unwrap();
    let hot_done_by_then = map["hot"].2.iter().filter(|t| **t <= others_done).count();
    eprintln!(
        "per-key limit 2: 150 jobs in {:?}; the other tenants were done when the hot one had done {hot_done_by_then} of 120",
        started.elapsed()
    );
    assert!(
        hot_done_by_then <= 60,
        "the other tenants waited behind the hot one: it had done {hot_done_by_then} of 120"
    );
    let counts = db.storage().queue_counts(Some("tenants")).await.unwrap()[0].clone();
    assert_eq!(
        (counts.available, counts.running, counts.completed),
        (0, 0, 150)
    );
    let held = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM {}.deferred_jobs WHERE held_key IS NOT NULL",
            db.schema
        ))
        .await;
    assert_eq!(held, 0, "nothing left held");
    // how often jobs moved out of the ring and back: once each, plus those a released job found
    // at its limit again (another claim took the room first); statistics lag up to a second of
    // real time (each backend flushes its counters on its own timer), hence the wait
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let moves = db
        .scalar_i64(&format!(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE schemaname = '{}' AND relname = 'deferred_jobs'",
            db.schema
        ))
        .await;
    eprintln!("held moves: {moves} for 120 hot jobs");
    assert!(
        moves <= 3 * 150,
        "{moves} moves: jobs bounce between the ring and the hold"
    );
    db.cleanup().await;
}

/// Held jobs are counted as available, are cancelled like any waiting job, come back when their
/// key has room, and come back at once when the key limit is removed.
#[tokio::test]
async fn held_jobs_count_as_available_cancel_and_come_back_with_room_or_without_the_limit() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage
        .set_queue_limits("tenants", per_tenant(1))
        .await
        .unwrap();
    let producer = db.client().build().await.unwrap();
    let ids = producer
        .insert_many(&[
            tenant_job("x", 0),
            tenant_job("x", 0),
            tenant_job("x", 0),
            tenant_job("y", 0),
        ])
        .await
        .unwrap();
    let claimed = storage.claim("tenants", 10, None).await.unwrap();
    let got: Vec<i64> = claimed.iter().map(|c| c.job_id).collect();
    assert_eq!(got, vec![ids[0], ids[3]], "one of x, and y");
    let counts = storage.queue_counts(Some("tenants")).await.unwrap()[0].clone();
    assert_eq!(
        (counts.available, counts.scheduled, counts.running),
        (2, 0, 2)
    );
    let held = storage.job_state(ids[1]).await.unwrap().unwrap();
    assert_eq!(held.state, JobStatus::Available);
    assert_eq!(held.detail.as_deref(), Some("held: key at its limit"));
    // nothing more for x while its one runs
    assert!(storage.claim("tenants", 10, None).await.unwrap().is_empty());
    assert_eq!(
        storage.cancel_job(ids[2], "test").await.unwrap(),
        ringwork::CancelOutcome::Cancelled
    );
    // x's running job completes: the next claim brings the held one back and takes it
    let x = claimed.iter().find(|c| c.job_id == ids[0]).unwrap();
    storage.complete_batch(&[x.attempt_ref()]).await.unwrap();
    let next = storage.claim("tenants", 10, None).await.unwrap();
    assert_eq!(
        next.iter().map(|c| c.job_id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    assert!(next[0].run_lease > claimed[0].run_lease, "a new lease");
    // held again behind it, then the limit goes: due at once, promoted, claimed
    let late = producer.insert_many(&[tenant_job("x", 0)]).await.unwrap()[0];
    assert!(storage.claim("tenants", 10, None).await.unwrap().is_empty());
    assert_eq!(
        storage.job_state(late).await.unwrap().unwrap().state,
        JobStatus::Available
    );
    storage
        .set_queue_limits("tenants", QueueLimits::default())
        .await
        .unwrap();
    storage.promote_due(100).await.unwrap();
    let freed = storage.claim("tenants", 10, None).await.unwrap();
    assert_eq!(
        freed.iter().map(|c| c.job_id).collect::<Vec<_>>(),
        vec![late]
    );
    // every job settled exactly once
    for c in next
        .iter()
        .chain(&freed)
        .chain(claimed.iter().filter(|c| c.job_id == ids[3]))
    {
        assert_eq!(complete_one(&storage, c).await, ringwork::Outcome::Applied);
    }
    let counts = storage.queue_counts(Some("tenants")).await.unwrap()[0].clone();
    assert_eq!(
        (
            counts.available,
            counts.running,
            counts.completed,
            counts.cancelled
        ),
        (0, 0, 4, 1)
    );
    // refused
    let bad = QueueLimits {
        per_key: Some(KeyLimit::path(&[]).max_running(1)),
        ..QueueLimits::default()
    };
    assert!(matches!(
        storage.set_queue_limits("tenants", bad).await,
        Err(Error::Config(m)) if m.contains("key path")
    ));
    db.cleanup().await;
}

/// A rate per key: the hot tenant is held to 10 claims per sliding hour across 4 processes, while
/// the other tenants' jobs run at once. The engine clock moves an hour at a time; the other tenants
/// finish before it first moves, so nothing of theirs waited behind the hot one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_per_key_holds_the_hot_key_and_lets_the_others_through() {
    let db = TestDb::new().await;
    let hour = Duration::from_secs(3600);
    db.storage()
        .set_queue_limits(
            "tenants",
            QueueLimits {
                per_key: Some(KeyLimit::arg("tenant").rate(10, hour)),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    let producer = db.client().build().await.unwrap();
    let mut jobs: Vec<NewJob> = (0..25).map(|_| tenant_job("hot", 0)).collect();
    for tenant in ["a", "b", "c", "d", "e"] {
        jobs.extend((0..4).map(|_| tenant_job(tenant, 0)));
    }
    producer.insert_many(&jobs).await.unwrap();
    let seen = Arc::new(TenantSeen::default());
    let mut fleet = Vec::new();
    for _ in 0..4 {
        let pool = TestDb::connect(&db.url, 4).await;
        let seen = Arc::clone(&seen);
        let client = Client::builder(pool)
            .schema(db.schema.as_str())
            .maintenance(support::fast_maintenance())
            .queue(
                "tenants",
                QueueConfig {
                    poll_interval: Duration::from_millis(50),
                    ..QueueConfig::default()
                },
            )
            .register(move |_ctx: JobContext, job: TenantWork| {
                let seen = Arc::clone(&seen);
                async move {
                    let mut map = seen.by_tenant.lock().unwrap();
                    map.entry(job.tenant.clone())
                        .or_default()
                        .2
                        .push(Instant::now());
                    seen.done.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), JobError>(())
                }
            })
            .build()
            .await
            .unwrap();
        fleet.push(client.start().await.unwrap());
    }
    let ran = |tenant: &str| {
        seen.by_tenant
            .lock()
            .unwrap()
            .get(tenant)
            .map_or(0, |runs| runs.2.len())
    };
    let done = || seen.done.load(Ordering::SeqCst);
    // the first hour: every other tenant's 4 jobs, and 10 of the hot one's
    settled(&db, "tenants", done, 20 + 10).await;
    for tenant in ["a", "b", "c", "d", "e"] {
        assert_eq!(
            ran(tenant),
            4,
            "tenant {tenant} ran all its jobs in the first hour"
        );
    }
    let mut hot_per_hour = vec![ran("hot")];
    for hour_no in 2..=3 {
        db.advance_clock(hour).await;
        settled(&db, "tenants", done, 20 + (10 * hour_no).min(25)).await;
        hot_per_hour.push(ran("hot") - hot_per_hour.iter().sum::<usize>());
    }
    for client in fleet {
        client.shutdown(Duration::from_secs(5)).await;
    }
    assert_eq!(hot_per_hour, [10, 10, 5], "hot jobs run per hour");
    db.cleanup().await;
}

/// A limit well above what runs is settled by the cheap bound (every job claimed since the mark)
/// until the bound nears it; then the exact count decides, and the mark moves. The limit holds
/// across the switch.
#[tokio::test]
async fn a_limit_far_above_what_runs_is_settled_by_the_bound_and_still_holds() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage
        .set_queue_limits(
            "bounded",
            QueueLimits {
                max_running: Some(50),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    let client = db.client().build().await.unwrap();
    let jobs: Vec<NewJob> = (0..100)
        .map(|_| NewJob::new(&Work { ms: 0 }).unwrap().queue("bounded"))
        .collect();
    client.insert_many(&jobs).await.unwrap();
    let mut running = Vec::new();
    for _ in 0..5 {
        let got = storage.claim("bounded", 10, None).await.unwrap();
        assert_eq!(got.len(), 10);
        running.extend(got);
    }
    assert!(
        storage.claim("bounded", 10, None).await.unwrap().is_empty(),
        "50 running: at the limit"
    );
    let done: Vec<_> = running.drain(..20).map(|c| c.attempt_ref()).collect();
    storage.complete_batch(&done).await.unwrap();
    let mut more = 0;
    loop {
        let got = storage.claim("bounded", 10, None).await.unwrap();
        if got.is_empty() {
            break;
        }
        more += got.len();
    }
    assert_eq!(more, 20, "the 20 freed places, no more");
    assert_eq!(storage.count_in_flight(Some("bounded")).await.unwrap(), 50);
    db.cleanup().await;
}

/// How many times each counting function ran inside `claims` limited claims of `queue`, two jobs
/// each, in one transaction with function tracking on for every language (`'all'`: the count does
/// not depend on whether the functions are SQL or PL/pgSQL). `pg_stat_get_xact_function_calls`
/// reads the backend's counts not yet flushed to the statistics, with no delay: this transaction's
/// calls, plus any from the connection's last second (none here: nothing else on this pool claims).
/// Setting `track_functions` needs a superuser, as the test database's `postgres` is.
async fn counting_calls(db: &TestDb, queue: &str, claims: usize) -> (i64, i64) {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'all'")
        .execute(&mut *tx)
        .await
        .unwrap();
    for _ in 0..claims {
        let claimed: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.claim($1, 2)",
            db.schema.as_str()
        ))
        .bind(queue)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(
            claimed, 2,
            "far below every limit: each claim gets its jobs"
        );
    }
    let calls = |function: &str| {
        format!(
            "SELECT coalesce(pg_stat_get_xact_function_calls('{}.{function}'::regprocedure), 0)",
            db.schema.as_str()
        )
    };
    let bound: i64 = sqlx::query_scalar(&calls("claimed_since(text, bigint)"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let exact: i64 = sqlx::query_scalar(&calls("count_running_from(text, bigint)"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    (bound, exact)
}

/// What a limited claim pays when its limits are far from binding: a rate-limited queue never
/// counts its running attempts (that walk once cost a rate-limited claim a quarter of a plain
/// claim's time, for a result it threw away), and a concurrency limit well above what runs is
/// settled by the cheap bound, with no exact count.
#[tokio::test]
async fn limits_far_from_binding_skip_the_running_count() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage
        .set_queue_limits(
            "rated",
            QueueLimits {
                rate: Some((1_000_000, Duration::from_secs(1))),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    storage
        .set_queue_limits(
            "capped",
            QueueLimits {
                max_running: Some(1_000),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    let client = db.client().build().await.unwrap();
    for queue in ["rated", "capped"] {
        let jobs: Vec<NewJob> = (0..10)
            .map(|_| NewJob::new(&Work { ms: 0 }).unwrap().queue(queue))
            .collect();
        client.insert_many(&jobs).await.unwrap();
    }
    assert_eq!(
        counting_calls(&db, "rated", 5).await,
        (0, 0),
        "a rate limit alone never counts running attempts"
    );
    assert_eq!(
        counting_calls(&db, "capped", 5).await,
        (5, 0),
        "one bound per claim, no exact count"
    );
    db.cleanup().await;
}

/// A fleet `max_running` counts an attempt as running until its completion commits, so completions
/// held for a flush would hold the limit's room: a claim that comes back short (the limit cut it)
/// makes the completion batcher flush at once. With a 30-s flush pace and a limit of 1, 12 jobs of
/// 5 ms must not take a pace each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_limit_does_not_wait_for_the_completion_pace() {
    let db = TestDb::new().await;
    limit_running(&db, 1).await;
    enqueue(&db, 12, 5).await;
    let seen = Arc::new(Seen::default());
    let pool = TestDb::connect(&db.url, 4).await;
    let handler_seen = Arc::clone(&seen);
    let client = Client::builder(pool)
        .schema(db.schema.as_str())
        .maintenance(support::fast_maintenance())
        .completion(CompletionConfig {
            max_delay: Duration::from_secs(30),
            ..CompletionConfig::default()
        })
        .queue(
            "limited",
            QueueConfig {
                max_workers: 4,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |_ctx: JobContext, job: Work| {
            let seen = Arc::clone(&handler_seen);
            async move {
                tokio::time::sleep(Duration::from_millis(job.ms)).await;
                seen.done.fetch_add(1, Ordering::SeqCst);
                Ok::<(), JobError>(())
            }
        })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let started = Instant::now();
    let finished = support::eventually(Duration::from_secs(20), || {
        let storage = db.storage();
        async move {
            let counts = storage.queue_counts(Some("limited")).await.unwrap();
            counts.first().map(|c| c.completed) == Some(12)
        }
    })
    .await;
    let took = started.elapsed();
    running.shutdown(Duration::from_secs(5)).await;
    assert!(
        finished,
        "12 jobs under a limit of 1 were not all completed within 20 s (ran {}; pace 30 s)",
        seen.done.load(Ordering::SeqCst)
    );
    eprintln!("12 jobs of 5 ms under a limit of 1 with a 30-s flush pace: {took:?}");
    db.cleanup().await;
}
