//! `ringwork-bench counts`: what an exact count costs: `queue_counts` for all queues with
//! `--waiting` jobs available in one queue and `--completed` completions kept in the ring of
//! another (maintenance off, so no slot is pruned and every completion is still read from the ring),
//! then again after the ring is pruned and the completions are durable totals. Prints a Markdown
//! table; on a throwaway cluster with production defaults unless DATABASE_URL is given.

use std::time::{Duration, Instant};

use ringwork::{NewJob, QueueSlotPrune, Result, SchemaName, Storage};
use serde_json::json;

use ringwork::embedded::EmbeddedPostgres;

pub struct CountsConfig {
    pub database_url: Option<String>,
    pub waiting: usize,
    pub completed: usize,
    pub samples: usize,
    /// Leave the schema in place (to look at its plans afterwards).
    pub keep_schema: bool,
}

/// The server to measure: `database_url`, or else a throwaway cluster with production defaults,
/// kept running as long as the returned handle lives.
pub fn server(database_url: &Option<String>) -> Result<(Option<EmbeddedPostgres>, String)> {
    match database_url {
        Some(url) => Ok((None, url.clone())),
        None => {
            eprintln!("no DATABASE_URL: starting a throwaway PostgreSQL cluster (autovacuum on)…");
            let pg =
                EmbeddedPostgres::start().map_err(|e| ringwork::Error::Config(e.to_string()))?;
            let url = pg.url();
            Ok((Some(pg), url))
        }
    }
}

pub async fn run(config: CountsConfig) -> Result<String> {
    let (embedded, url) = server(&config.database_url)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await?;
    let schema = SchemaName::new(&format!("rw_counts_{}", std::process::id()))?;
    ringwork::schema::migrate(&pool, &schema, ringwork::RingSizes::default()).await?;
    let storage = Storage::new(pool.clone(), schema.clone());
    let server: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&pool)
        .await?;

    // completions first, so the waiting jobs are not in the way of the claims
    let started = Instant::now();
    let mut done = 0;
    while done < config.completed {
        let n = (config.completed - done).min(5_000);
        insert(&storage, "counted_done", done, n).await?;
        let mut left = n;
        while left > 0 {
            let claimed = storage.claim("counted_done", left.min(500), None).await?;
            if claimed.is_empty() {
                break;
            }
            left -= claimed.len();
            let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
            storage.complete_batch(&refs).await?;
        }
        done += n;
    }
    eprintln!(
        "{} completions kept in the ring in {:.1} s",
        config.completed,
        started.elapsed().as_secs_f64()
    );
    // the waiting jobs go to the next slot, so the completions' slot can be pruned below
    storage.rotate_queue_ring(Duration::ZERO).await?;
    storage.rotate_claim_ring(Duration::ZERO).await?;
    let started = Instant::now();
    let mut waiting = 0;
    while waiting < config.waiting {
        let n = (config.waiting - waiting).min(10_000);
        insert(&storage, "counted_waiting", waiting, n).await?;
        waiting += n;
    }
    eprintln!(
        "{} jobs waiting in {:.1} s",
        config.waiting,
        started.elapsed().as_secs_f64()
    );
    sqlx::query(&format!("ANALYZE {schema}.ready_entries"))
        .execute(&pool)
        .await?;

    let in_ring = time_counts(&storage, config.samples).await?;
    let counts = storage.queue_counts(None).await?;
    let mut wait_times = Vec::with_capacity(config.samples);
    let mut oldest = None;
    for _ in 0..config.samples {
        let started = Instant::now();
        oldest = storage.oldest_available_wait("counted_waiting").await?;
        wait_times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    wait_times.sort_by(f64::total_cmp);

    // prune everything that can go: the completions become durable totals
    storage.rotate_queue_ring(Duration::ZERO).await?;
    storage.rotate_claim_ring(Duration::ZERO).await?;
    for slot in storage.sealed_claim_slots().await? {
        storage
            .prune_claim_slot(slot, Duration::from_secs(5))
            .await?;
    }
    let options = QueueSlotPrune {
        lock_timeout: Duration::from_secs(5),
        keep_completed: Duration::from_secs(24 * 3600),
        keep_failed: Duration::from_secs(7 * 24 * 3600),
        park_idle: None,
    };
    let mut pruned = 0;
    for slot in storage.sealed_queue_slots().await? {
        if storage.prune_queue_slot_with(slot, &options).await? == ringwork::PruneResult::Pruned {
            pruned += 1;
        }
    }
    let as_totals = time_counts(&storage, config.samples).await?;
    let counts_after = storage.queue_counts(None).await?;

    if config.keep_schema {
        eprintln!("schema {schema} kept");
    } else {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await;
    }
    pool.close().await;
    drop(embedded);

    let mut out = format!(
        "# queue_counts cost\n\nServer: {server}. `queue_counts(NULL)` (all queues), {} samples each, \
         after one warm-up call.\n\n",
        config.samples
    );
    out.push_str("| state of the ring | waiting | completed | counts (queue: available / completed) | p50 ms | p95 ms | max ms |\n|---|---|---|---|---|---|---|\n");
    for (label, times, counts) in [
        ("completions in the ring (no prune)", &in_ring, &counts),
        (
            &*format!("after prune ({pruned} slots): completions as durable totals"),
            &as_totals,
            &counts_after,
        ),
    ] {
        let shown: Vec<String> = counts
            .iter()
            .map(|c| format!("{}: {} / {}", c.queue, c.available, c.completed))
            .collect();
        out.push_str(&format!(
            "| {label} | {} | {} | {} | {:.1} | {:.1} | {:.1} |\n",
            config.waiting,
            config.completed,
            shown.join(", "),
            percentile(times, 0.5),
            percentile(times, 0.95),
            percentile(times, 1.0)
        ));
    }
    out.push_str(&format!(
        "\n`oldest_available_wait('counted_waiting')` ({} waiting, answered {:.1} s): p50 {:.2} ms, \
         p95 {:.2} ms, max {:.2} ms.\n",
        config.waiting,
        oldest.map_or(0.0, |w| w.as_secs_f64()),
        percentile(&wait_times, 0.5),
        percentile(&wait_times, 0.95),
        percentile(&wait_times, 1.0)
    ));
    Ok(out)
}

async fn insert(storage: &Storage, queue: &str, from: usize, n: usize) -> Result<()> {
    let jobs: Vec<NewJob> = (from..from + n)
        .map(|i| NewJob::from_parts("counted", json!({ "i": i })).map(|j| j.queue(queue)))
        .collect::<Result<_>>()?;
    let mut tx = storage.pool().begin().await?;
    storage.insert_many(&mut tx, &jobs).await?;
    tx.commit().await?;
    Ok(())
}

async fn time_counts(storage: &Storage, samples: usize) -> Result<Vec<f64>> {
    storage.queue_counts(None).await?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        storage.queue_counts(None).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    eprintln!(
        "queue_counts samples, in order (ms): {}",
        times
            .iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    times.sort_by(f64::total_cmp);
    Ok(times)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
