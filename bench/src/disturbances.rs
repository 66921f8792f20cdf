//! What a phase does to the server beside the load: readers, pg_dump, held producer transactions.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use tokio::process::Command;

use ringwork::NewJob;
use ringwork::Storage;

use crate::processes::Counters;
use crate::scenario::{args_padding, BenchJob, ARGS_BYTES_ENV, BENCH_QUEUE};
use crate::worker::{env_number, now_us};

/// Make `tx` REPEATABLE READ (a reader's snapshot, as a report or pg_dump takes) and list every
/// table of `schema`, partitions included, as quoted names.
pub(crate) async fn repeatable_read_tables(
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
pub(crate) async fn reader_loop(url: String, schema: String, stop: Arc<tokio::sync::Notify>) {
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
/// (ring children included) for its whole run, which is what keeps prune's ACCESS EXCLUSIVE out
/// (on a standby, what keeps the replay of a rotation's TRUNCATE waiting). `extra` goes to every
/// dump (`--exclude-schema=...`); `label` names the loop in its closing line.
pub(crate) async fn pg_dump_loop(
    url: String,
    extra: Vec<String>,
    label: &'static str,
    stop: Arc<tokio::sync::Notify>,
) {
    let pg_dump = match ringwork::embedded::find_bindir() {
        Ok(dir) => dir.join("pg_dump"),
        Err(_) => PathBuf::from("pg_dump"),
    };
    let (mut dumps, mut failed, mut busy) = (0u32, 0u32, Duration::ZERO);
    let mut longest = Duration::ZERO;
    let mut first_error = None;
    // registered once, so the runner's notify_waiters reaches it even between dumps
    let stopped = stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    loop {
        let started = Instant::now();
        let dump = Command::new(&pg_dump)
            .args(["--dbname", &url, "--file", "/dev/null"])
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        tokio::select! {
            output = dump => {
                let took = started.elapsed();
                busy += took;
                longest = longest.max(took);
                match output {
                    Ok(o) if o.status.success() => dumps += 1,
                    other => {
                        failed += 1;
                        if first_error.is_none() {
                            first_error = Some(match other {
                                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                                Err(e) => e.to_string(),
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            _ = &mut stopped => break,
        }
    }
    eprintln!(
        "   {label}: {dumps} dumps completed ({failed} failed), {:.1} s each on average, the \
         longest {:.1} s{}",
        busy.as_secs_f64() / f64::from(dumps.max(1)),
        longest.as_secs_f64(),
        first_error
            .map(|e| format!("; first failure: {e}"))
            .unwrap_or_default()
    );
}

/// A report on a standby, over and over: one REPEATABLE READ transaction counts the schema's
/// waiting jobs (every `ready_entries` child: ACCESS SHARE on each, and a snapshot), sits for
/// `hold` as a long report would, and counts again.
pub(crate) async fn report_loop(
    url: String,
    schema: String,
    hold: Duration,
    stop: Arc<tokio::sync::Notify>,
) {
    let Ok(pool) = PgPoolOptions::new().max_connections(1).connect(&url).await else {
        eprintln!("   standby report: cannot connect");
        return;
    };
    let (mut done, mut failed) = (0u32, 0u32);
    let mut first_error = None;
    let count = format!("SELECT count(*) FROM {schema}.ready_entries");
    let stopped = stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    loop {
        let report = async {
            let mut tx = pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await?;
            sqlx::query_scalar::<_, i64>(&count)
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_sleep($1)")
                .bind(hold.as_secs_f64())
                .execute(&mut *tx)
                .await?;
            sqlx::query_scalar::<_, i64>(&count)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await
        };
        tokio::select! {
            result = report => match result {
                Ok(()) => done += 1,
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
            _ = &mut stopped => break,
        }
    }
    eprintln!(
        "   standby report ({} s each): {done} completed, {failed} failed{}",
        hold.as_secs(),
        first_error
            .map(|e| format!("; first failure: {e}"))
            .unwrap_or_default()
    );
    pool.close().await;
}

/// The standby's distance behind the primary, from the primary's `pg_stat_replication` once a
/// second: WAL not yet replayed (bytes) and `replay_lag`; the peak and the last value.
pub(crate) async fn replay_lag_loop(primary_url: String, stop: Arc<tokio::sync::Notify>) {
    let Ok(pool) = PgPoolOptions::new()
        .max_connections(1)
        .connect(&primary_url)
        .await
    else {
        return;
    };
    let (mut peak_bytes, mut peak_secs, mut last) = (0i64, 0f64, (0i64, 0f64));
    let stopped = stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    loop {
        let row: Option<(Option<i64>, Option<f64>)> = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::int8, \
             extract(epoch FROM replay_lag)::float8 FROM pg_stat_replication LIMIT 1",
        )
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten();
        if let Some((bytes, secs)) = row {
            last = (bytes.unwrap_or(0), secs.unwrap_or(0.0));
            peak_bytes = peak_bytes.max(last.0);
            peak_secs = peak_secs.max(last.1);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = &mut stopped => break,
        }
    }
    eprintln!(
        "   standby replay: peak {:.1} MB ({peak_secs:.1} s) behind, at the end {:.1} MB ({:.1} s)",
        peak_bytes as f64 / 1e6,
        last.0 as f64 / 1e6,
        last.1
    );
    pool.close().await;
}

/// Sequence numbers of jobs enqueued by held transactions: far above the producer's.
pub(crate) static HELD_SEQ: AtomicU64 = AtomicU64::new(1 << 40);

/// One held producer transaction, over and over: BEGIN, enqueue one job, wait `hold` (or until
/// told to stop), COMMIT. Committed jobs join the runner's accounting like the producer's.
pub(crate) async fn hold_loop(
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
            pad: args_padding(env_number(ARGS_BYTES_ENV).unwrap_or(0) as usize, n),
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
