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
use crate::scenario::{BenchJob, BENCH_QUEUE};
use crate::worker::now_us;

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
/// (ring children included) for its whole run, which is what keeps prune's ACCESS EXCLUSIVE out.
pub(crate) async fn pg_dump_loop(url: String, stop: Arc<tokio::sync::Notify>) {
    let pg_dump = match ringwork::embedded::find_bindir() {
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
