//! Behind a real PgBouncer in transaction mode (`ClientBuilder::transaction_pooler`): the test starts
//! Debian's `pgbouncer` in front of the test server, with fewer server connections than the
//! client's pools hold, so consecutive transactions of one client connection land on different
//! server connections. A control test first shows that sqlx's defaults fail there, so the others
//! really run through a transaction pooler.
//!
//! Needs the `pgbouncer` binary (`apt-get install pgbouncer`; `.ci/run` installs it), found on
//! PATH, in /usr/sbin, or at `$RINGWORK_PGBOUNCER`.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use support::pgbouncer::PgBouncer;
use support::{eventually, fast_maintenance, TestDb};

#[derive(Serialize, Deserialize)]
struct Work {
    n: u32,
    /// The run that succeeds: earlier ones ask for a retry (or a snooze, when `snooze`).
    succeed_at: i32,
    #[serde(default)]
    snooze: bool,
}
impl JobArgs for Work {
    const KIND: &'static str = "work";
}

/// Handler runs per job id, and the attempts each ran at.
type Runs = Arc<Mutex<HashMap<i64, Vec<i32>>>>;

fn client_on(pool: PgPool, schema: &str, runs: &Runs) -> ringwork::ClientBuilder {
    let runs = Arc::clone(runs);
    Client::builder(pool)
        .schema(schema)
        .maintenance(fast_maintenance())
        .queue(
            "default",
            QueueConfig {
                max_workers: 8,
                poll_interval: Duration::from_millis(100),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, args: Work| {
            let runs = Arc::clone(&runs);
            async move {
                let run = {
                    let mut runs = runs.lock().unwrap();
                    let seen = runs.entry(ctx.job_id).or_default();
                    seen.push(ctx.attempt);
                    seen.len() as i32
                };
                tokio::time::sleep(Duration::from_millis(u64::from(args.n % 3))).await;
                if run < args.succeed_at {
                    return Err(if args.snooze {
                        JobError::Snooze(Duration::from_millis(100))
                    } else {
                        JobError::RetryAfter(Duration::from_millis(100), "not yet".into())
                    });
                }
                Ok::<(), JobError>(())
            }
        })
}

fn work(n: u32) -> NewJob {
    NewJob::new(&Work {
        n,
        succeed_at: 1,
        snooze: false,
    })
    .expect("job")
}

/// The control: sqlx's defaults (named, cached statements) fail behind the pooler once two client
/// connections share a server connection. If this passed silently, the other tests would prove
/// nothing about transaction pooling.
#[tokio::test]
async fn plain_sqlx_statements_break_behind_a_transaction_pooler() {
    if !support::pgbouncer::installed("plain_sqlx_statements_break_behind_a_transaction_pooler") {
        return;
    }
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&db.url, 1);
    let options: PgConnectOptions = bouncer.url.parse().unwrap();
    let plain = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("connect");
    let mut failures = 0;
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(plain.acquire().await.expect("acquire"));
    }
    for conn in &mut conns {
        if sqlx::query_scalar::<_, i32>("SELECT $1::int + 1")
            .bind(1)
            .fetch_one(&mut **conn)
            .await
            .is_err()
        {
            failures += 1;
        }
    }
    assert!(
        failures > 0,
        "four client connections over one server connection all prepared sqlx_s_1: pgbouncer \
         is not pooling by transaction, so these tests would not test it"
    );
    drop(conns);
    plain.close().await;
    db.cleanup().await;
}

/// Everything a service does, through the pooler: inserts (one, many by COPY, in the caller's
/// transaction, scheduled, unique), claims, completions, retries and snoozes (maintenance promotes
/// them: the leader holds its lock on the direct session pool), counts and readiness.
#[tokio::test]
async fn a_client_behind_pgbouncer_runs_every_job_once() {
    if !support::pgbouncer::installed("a_client_behind_pgbouncer_runs_every_job_once") {
        return;
    }
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&db.url, 2);
    let pool = bouncer.pool(12).await;
    let runs: Runs = Arc::default();
    let client = client_on(pool.clone(), db.schema.as_str(), &runs)
        .transaction_pooler(Some(db.pool.clone()))
        .build()
        .await
        .expect("build behind pgbouncer");
    let running = client.start().await.expect("start");

    let mut expected: HashMap<i64, usize> = HashMap::new();
    for n in 0..40 {
        expected.insert(client.insert(work(n)).await.expect("insert"), 1);
    }
    // above the COPY threshold: the COPY path in a transaction of its own
    let many: Vec<NewJob> = (100..300).map(work).collect();
    for id in client.insert_many(&many).await.expect("insert_many") {
        expected.insert(id, 1);
    }
    // in the caller's transaction, beside the caller's own (unnamed) statement
    let mut tx = pool.begin().await.expect("begin");
    let one: i32 = sqlx::query_scalar("SELECT $1::int")
        .bind(1)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .expect("own statement");
    assert_eq!(one, 1);
    let in_tx = client
        .insert_tx(&mut tx, work(500))
        .await
        .expect("insert_tx");
    let many_in_tx = client
        .insert_many_tx(&mut tx, &(600..700).map(work).collect::<Vec<_>>())
        .await
        .expect("insert_many_tx");
    tx.commit().await.expect("commit");
    expected.insert(in_tx, 1);
    for id in many_in_tx {
        expected.insert(id, 1);
    }
    let scheduled = client
        .insert(work(800).run_at(chrono::Utc::now() + chrono::Duration::milliseconds(300)))
        .await
        .expect("scheduled");
    expected.insert(scheduled, 1);
    let retried = client
        .insert(
            NewJob::new(&Work {
                n: 801,
                succeed_at: 3,
                snooze: false,
            })
            .unwrap(),
        )
        .await
        .expect("retried");
    expected.insert(retried, 3);
    let snoozed = client
        .insert(
            NewJob::new(&Work {
                n: 802,
                succeed_at: 2,
                snooze: true,
            })
            .unwrap(),
        )
        .await
        .expect("snoozed");
    expected.insert(snoozed, 2);
    let unique = ringwork::Unique::default();
    let first = client
        .insert(work(900).unique(unique.clone()))
        .await
        .expect("unique");
    let second = client
        .insert(work(900).unique(unique))
        .await
        .expect("unique duplicate");
    assert_eq!(first, second, "a duplicate unique job returns the holder");
    expected.insert(first, 1);

    let storage = client.storage().clone();
    let all_done = eventually(Duration::from_secs(60), || {
        let storage = storage.clone();
        let ids: Vec<i64> = expected.keys().copied().collect();
        async move {
            for id in ids {
                match storage.job_state(id).await {
                    Ok(Some(state)) if state.state == JobStatus::Completed => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await;
    let runs_now = runs.lock().unwrap().clone();
    if !all_done {
        let mut states = Vec::new();
        for id in expected.keys() {
            let state = storage.job_state(*id).await;
            if !matches!(&state, Ok(Some(s)) if s.state == JobStatus::Completed) {
                states.push((*id, state.map(|s| s.map(|s| s.state))));
            }
        }
        panic!(
            "not every job completed behind pgbouncer ({} of {} ran); not completed: {states:?}",
            runs_now.len(),
            expected.len()
        );
    }
    for (id, times) in &expected {
        let attempts = runs_now.get(id).cloned().unwrap_or_default();
        assert_eq!(
            attempts.len(),
            *times,
            "job {id} ran at attempts {attempts:?}, expected {times} runs"
        );
    }
    assert_eq!(runs_now[&retried], vec![1, 2, 3]);
    assert_eq!(runs_now[&snoozed], vec![1, 1], "a snooze uses no attempt");
    let counts = storage
        .queue_counts(Some("default"))
        .await
        .expect("counts behind pgbouncer");
    assert_eq!(counts[0].completed, expected.len() as i64);
    assert_eq!(counts[0].available + counts[0].running, 0);
    let readiness = storage.readiness().await;
    assert!(
        readiness.migrated && readiness.functions_current,
        "{readiness:?}"
    );
    assert!(
        readiness.leader_pid.is_some(),
        "the leader holds its lock on the session pool: {readiness:?}"
    );
    running.shutdown(Duration::from_secs(5)).await;
    pool.close().await;
    drop(bouncer);
    db.cleanup().await;
}

/// With no direct connection at all: the client migrates a new schema through the pooler, its
/// dispatchers poll (no LISTEN), and jobs run; this process never leads maintenance, so a
/// scheduled job waits until a process with a session pool promotes it.
#[tokio::test]
async fn without_a_session_pool_jobs_run_by_polling_and_maintenance_waits_for_a_session() {
    if !support::pgbouncer::installed(
        "without_a_session_pool_jobs_run_by_polling_and_maintenance_waits_for_a_session",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&db.url, 2);
    let pool = bouncer.pool(8).await;
    let fresh = format!("{}_pooled", db.schema.as_str());
    let runs: Runs = Arc::default();
    let client = client_on(pool.clone(), &fresh, &runs)
        .transaction_pooler(None)
        .build()
        .await
        .expect("build (and migrate) through pgbouncer alone");
    let running = client.start().await.expect("start");
    let ids = client
        .insert_many(&(0..100).map(work).collect::<Vec<_>>())
        .await
        .expect("insert_many");
    let scheduled = client
        .insert(work(1000).run_at(chrono::Utc::now() + chrono::Duration::milliseconds(200)))
        .await
        .expect("scheduled");
    let storage = client.storage().clone();
    assert!(
        eventually(Duration::from_secs(30), || {
            let runs = Arc::clone(&runs);
            async move { runs.lock().unwrap().len() >= 100 }
        })
        .await,
        "jobs did not run by polling behind pgbouncer"
    );
    for id in &ids {
        assert_eq!(runs.lock().unwrap()[id], vec![1], "job {id} ran once");
    }
    // past its time, the scheduled job waits: nobody leads maintenance (a wait for something not
    // to happen; every process would have promoted it many times over in 1.5 s)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!runs.lock().unwrap().contains_key(&scheduled));
    assert_eq!(storage.readiness().await.leader_pid, None);
    // a process with a session pool (here: the direct pool) leads, and the job is promoted and runs
    let direct_runs: Runs = Arc::default();
    let leader = client_on(pool.clone(), &fresh, &direct_runs)
        .transaction_pooler(Some(db.pool.clone()))
        .build()
        .await
        .expect("build the leader");
    let leading = leader.start().await.expect("start the leader");
    assert!(
        eventually(Duration::from_secs(20), || {
            let (a, b) = (Arc::clone(&runs), Arc::clone(&direct_runs));
            async move {
                a.lock().unwrap().contains_key(&scheduled)
                    || b.lock().unwrap().contains_key(&scheduled)
            }
        })
        .await,
        "the scheduled job never ran once a leader with a session pool joined"
    );
    leading.shutdown(Duration::from_secs(5)).await;
    running.shutdown(Duration::from_secs(5)).await;
    ringwork::schema::drop_schema(&db.pool, &ringwork::SchemaName::new(&fresh).unwrap())
        .await
        .expect("drop the pooled schema");
    pool.close().await;
    drop(bouncer);
    db.cleanup().await;
}
