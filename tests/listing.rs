//! Job listings (the dashboard's jobs and dead-letter pages) on a real server: every job
//! is listed once, in its state, across pages, whether its rows are in the ring or the archive;
//! `retry_job` runs a dead-lettered job again and refuses a finished one.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use ringwork::{CloseOutcome, JobStatus, ListedJob, NewJob, Storage};
use serde_json::json;
use support::TestDb;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn job(n: i64) -> NewJob {
    NewJob::from_parts("listed", json!({ "n": n })).unwrap()
}

/// Every page of a listing, `size` rows at a time.
async fn all_pages(
    storage: &Storage,
    state: JobStatus,
    queue: Option<&str>,
    size: usize,
) -> Vec<ListedJob> {
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = storage
            .list_jobs(state, queue, None, after.as_deref(), size)
            .await
            .unwrap();
        assert!(page.jobs.len() <= size);
        if page.next.is_some() {
            assert_eq!(page.jobs.len(), size, "only the last page is short");
        }
        rows.extend(page.jobs);
        match page.next {
            Some(next) => after = Some(next),
            None => return rows,
        }
    }
}

fn ids(rows: &[ListedJob]) -> Vec<i64> {
    rows.iter().map(|r| r.job_id).collect()
}

fn assert_once(rows: &[ListedJob], expected: &[i64], what: &str) {
    let listed = ids(rows);
    let unique: HashSet<_> = listed.iter().collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "{what}: a job listed twice: {listed:?}"
    );
    let mut sorted = listed.clone();
    sorted.sort();
    let mut want = expected.to_vec();
    want.sort();
    assert_eq!(sorted, want, "{what}: listed {listed:?}");
}

#[tokio::test]
async fn every_job_is_listed_once_in_its_state_across_pages_in_the_ring_and_the_archive() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();

    // 16 jobs finished in several batches (some failed, one cancelled), then moved to the archive
    let early = storage
        .insert_many(&mut conn, &(0..16).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(
        storage.cancel_job(early[15], "not needed").await.unwrap(),
        ringwork::CancelOutcome::Cancelled
    );
    let mut completed = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..3 {
        let claimed = storage.claim("default", 5, None).await.unwrap();
        assert_eq!(claimed.len(), 5);
        let refs: Vec<_> = claimed[..4].iter().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&refs).await.unwrap();
        completed.extend(claimed[..4].iter().map(|j| j.job_id));
        storage
            .close_batch(&[(
                claimed[4].attempt_ref(),
                CloseOutcome::Failed {
                    error: "boom".into(),
                },
            )])
            .await
            .unwrap();
        failed.push(claimed[4].job_id);
    }
    support::rotate_and_prune(&storage, DAY).await;
    assert!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_completion_batches")
            .await
            > 0,
        "the completions are archived"
    );
    // 24 more over two priorities (two lanes): some finish (history still in the ring), one runs,
    // the rest wait
    let jobs: Vec<NewJob> = (16..40)
        .map(|n| job(n).priority(if n % 2 == 0 { 1 } else { 3 }))
        .collect();
    let first = storage.insert_many(&mut conn, &jobs).await.unwrap();
    let claimed = storage.claim("default", 6, None).await.unwrap();
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs[..5]).await.unwrap();
    completed.extend(claimed[..5].iter().map(|j| j.job_id));
    let running = vec![claimed[5].job_id];
    // scheduled for later, in another queue
    let later = storage
        .insert_many(
            &mut conn,
            &[
                job(100)
                    .queue("later_q")
                    .run_at(Utc::now() + chrono::Duration::hours(1)),
                job(101)
                    .queue("later_q")
                    .run_at(Utc::now() + chrono::Duration::hours(2)),
            ],
        )
        .await
        .unwrap();

    let finished: HashSet<i64> = completed
        .iter()
        .chain(&failed)
        .chain(&running)
        .copied()
        .collect();
    let waiting: Vec<i64> = first
        .iter()
        .copied()
        .filter(|id| !finished.contains(id))
        .collect();

    for size in [1, 3, 7, 100] {
        let rows = all_pages(&storage, JobStatus::Completed, Some("default"), size).await;
        assert_once(&rows, &completed, "completed");
        assert!(
            rows.windows(2)
                .all(|w| (w[0].at, w[0].job_id) > (w[1].at, w[1].job_id)),
            "finished jobs come newest first"
        );
        assert!(rows
            .iter()
            .all(|r| r.kind == "listed" && n_of(&r.args).is_some()));
        assert_once(
            &all_pages(&storage, JobStatus::Failed, None, size).await,
            &failed,
            "failed",
        );
        let available = all_pages(&storage, JobStatus::Available, Some("default"), size).await;
        assert_once(&available, &waiting, "available");
        // pickup order: the priority-1 lane first, then the priority-3 lane
        let priorities: Vec<bool> = available
            .iter()
            .map(|r| n_of(&r.args).unwrap() % 2 == 0)
            .collect();
        assert!(
            priorities.windows(2).all(|w| w[0] >= w[1]),
            "one lane after the other: {priorities:?}"
        );
        assert_once(
            &all_pages(&storage, JobStatus::Running, None, size).await,
            &running,
            "running",
        );
        assert_once(
            &all_pages(&storage, JobStatus::Scheduled, Some("later_q"), size).await,
            &later,
            "scheduled",
        );
    }
    let cancelled = all_pages(&storage, JobStatus::Cancelled, None, 10).await;
    assert_once(&cancelled, &[early[15]], "cancelled");
    assert!(
        all_pages(&storage, JobStatus::Scheduled, Some("default"), 10)
            .await
            .is_empty()
    );
    // a kind filter
    let page = storage
        .list_jobs(JobStatus::Completed, None, Some("other_kind"), None, 10)
        .await
        .unwrap();
    assert!(page.jobs.is_empty() && page.next.is_none());

    // args from wherever the job is: archived, in the ring, waiting
    for id in [
        completed[0],
        *completed.last().unwrap(),
        waiting[0],
        later[0],
    ] {
        let args = storage.job_args(id, 1000).await.unwrap().expect("args");
        assert!(n_of(&args.text).is_some(), "job {id}: {args:?}");
    }
    assert_eq!(storage.job_args(i64::MAX, 1000).await.unwrap(), None);

    // a malformed page key is a clear error, not a wrong page
    for bad in [
        "Lx:1",
        "T99:zz",
        "Jnope",
        "T1e999:1",
        "J5",
        "T1 day 2:5",
        "T1:2:3",
    ] {
        let err = storage
            .list_jobs(JobStatus::Completed, None, None, Some(bad), 10)
            .await
            .expect_err(bad);
        assert!(
            err.to_string().contains("malformed page key"),
            "{bad}: {err}"
        );
    }
    let err = storage
        .list_jobs(JobStatus::Available, None, None, Some("L1\0"), 10)
        .await
        .expect_err("NUL");
    assert!(err.to_string().contains("page key"), "{err}");
    db.cleanup().await;
}

/// The archive gathers a queue's completions of one second into rows of up to 256 jobs, each job
/// keeping its own finalization time; a listing reads them in (time, id) order, exactly, however
/// its pages cut the rows.
#[tokio::test]
async fn archived_completions_share_rows_of_a_second_and_keep_their_own_times() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &(0..320).map(job).collect::<Vec<_>>())
        .await
        .unwrap();
    // ten completions of two jobs, a quarter of a second apart on the engine's clock, then one of 300
    for _ in 0..10 {
        let claimed = storage.claim("default", 2, None).await.unwrap();
        let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
        storage.complete_batch(&refs).await.unwrap();
        db.advance_clock(Duration::from_millis(250)).await;
    }
    let claimed = storage.claim("default", 300, None).await.unwrap();
    assert_eq!(claimed.len(), 300);
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();

    // what the ring says, before the prune: each job's time, and the rows its seconds make
    let times: std::collections::HashMap<i64, chrono::DateTime<Utc>> = sqlx::query_as(&format!(
        "SELECT u.job_id, b.finalized_at FROM {s}.receipt_completion_batches b, unnest(b.job_ids) u(job_id)",
        s = db.schema
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(times.len(), 320);
    let batches = db
        .scalar_i64("SELECT count(*) FROM {s}.receipt_completion_batches")
        .await;
    let rows = db
        .scalar_i64(
            "SELECT sum(ceil(n / 256.0))::bigint FROM (
                 SELECT count(*) AS n FROM {s}.receipt_completion_batches b, unnest(b.job_ids) u
                 GROUP BY b.queue, {s}.archive_bucket(b.finalized_at, interval '1 day'),
                          date_trunc('second', b.finalized_at)) g",
        )
        .await;
    assert_eq!(batches, 11);
    support::rotate_and_prune(&storage, DAY).await;
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.receipt_completion_batches")
            .await,
        0,
        "the slot is pruned: the listing reads the archive alone"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.archived_completion_batches")
            .await,
        rows,
        "a row per queue, second and 256 jobs"
    );
    assert!(
        rows < batches,
        "{rows} rows for {batches} completion batches"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT max(cardinality(job_ids))::bigint FROM {s}.archived_completion_batches"
        )
        .await,
        256
    );

    let mut expected: Vec<(chrono::DateTime<Utc>, i64)> =
        times.iter().map(|(id, at)| (*at, *id)).collect();
    expected.sort_by(|a, b| b.cmp(a));
    for size in [1, 7, 100, 500] {
        let listed = all_pages(&storage, JobStatus::Completed, Some("default"), size).await;
        let got: Vec<(chrono::DateTime<Utc>, i64)> =
            listed.iter().map(|r| (r.at, r.job_id)).collect();
        assert_eq!(
            got, expected,
            "pages of {size}: every job once, at its own time, newest first"
        );
    }
    for (at, id) in [expected[0], expected[319]] {
        let archived: chrono::DateTime<Utc> = sqlx::query_scalar(&format!(
            "SELECT finalized_at FROM {s}.archived_job($1)",
            s = db.schema
        ))
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(archived, at, "job {id}");
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_dead_lettered_job_is_listed_and_retried_and_a_finished_job_is_not() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert_many(&mut conn, &[job(0).queue("dlq_q").max_attempts(1)])
        .await
        .unwrap();
    storage.set_queue_dead_letter("dlq_q", true).await.unwrap();
    let claimed = storage.claim("dlq_q", 1, None).await.unwrap();
    storage
        .close_batch(&[(
            claimed[0].attempt_ref(),
            CloseOutcome::Failed {
                error: "<b>bad</b>".into(),
            },
        )])
        .await
        .unwrap();
    let id = claimed[0].job_id;
    let dead = all_pages(&storage, JobStatus::DeadLettered, Some("dlq_q"), 5).await;
    assert_once(&dead, &[id], "dead-lettered");
    assert_eq!(dead[0].detail.as_deref(), Some("<b>bad</b>"));

    assert!(storage.retry_job(id).await.unwrap());
    assert!(all_pages(&storage, JobStatus::DeadLettered, None, 5)
        .await
        .is_empty());
    // a fresh attempt, due now: promotion brings it to the ring; retrying it again before that
    // is harmless (it is due already)
    assert_eq!(
        storage.job_state(id).await.unwrap().unwrap().state,
        JobStatus::Scheduled
    );
    assert!(storage.retry_job(id).await.unwrap());
    storage.promote_due(100).await.unwrap();
    assert_eq!(
        storage.job_state(id).await.unwrap().unwrap().state,
        JobStatus::Available
    );
    // a retry of a waiting job, and of a job that completed, change nothing
    assert!(!storage.retry_job(id).await.unwrap());
    let again = storage.claim("dlq_q", 1, None).await.unwrap();
    storage
        .complete_batch(&[again[0].attempt_ref()])
        .await
        .unwrap();
    assert!(!storage.retry_job(id).await.unwrap());
    assert!(!storage.retry_job(i64::MAX).await.unwrap());
    db.cleanup().await;
}

/// The `n` of a listed job's argument text.
fn n_of(args: &str) -> Option<i64> {
    serde_json::from_str::<serde_json::Value>(args).ok()?["n"].as_i64()
}

/// Counts and listings over more queues than one statement could lock the shards of: each queue
/// has 32 shards of two sequences each, a statement holds a lock on every sequence it reads until
/// it ends, and the server's lock table holds about max_locks_per_transaction x max_connections.
/// Counting every queue in one statement failed with "out of shared memory" between 150 and 250
/// queues on a server with the default settings, as did the available listing across queues.
#[tokio::test]
async fn counts_and_listings_over_more_queues_than_one_statement_can_lock() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let lock_table: i64 = sqlx::query_scalar(
        "SELECT current_setting('max_locks_per_transaction')::int8 \
         * current_setting('max_connections')::int8",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let queues = (lock_table / 25).clamp(260, 1000) as usize;
    let names: Vec<String> = (0..queues).map(|i| format!("many_{i:04}")).collect();
    let mut conn = db.pool.acquire().await.unwrap();
    for name in &names {
        // a shard with a segment per queue: more than one listing call reads (256 shards each)
        storage
            .insert(&mut conn, &job(1).queue(name))
            .await
            .unwrap();
    }
    drop(conn);

    let counts = storage.queue_counts(None).await.unwrap();
    assert_eq!(counts.len(), queues);
    assert!(
        counts.iter().all(|c| c.available == 1),
        "{:?}",
        &counts[..3]
    );
    let (page, next) = storage
        .queue_counts_page(None, Some("many_"), 50)
        .await
        .unwrap();
    assert_eq!(page.len(), 50);
    assert_eq!(next.as_deref(), Some("many_0049"));
    // counted several statements at once, shown in name order, each queue once
    let shown: Vec<&str> = page.iter().map(|q| q.queue.as_str()).collect();
    let expected: Vec<&str> = names[..50].iter().map(String::as_str).collect();
    assert_eq!(shown, expected);
    assert!(page.iter().all(|q| q.available == 1));
    let (second, _) = storage
        .queue_counts_page(next.as_deref(), Some("many_"), 50)
        .await
        .unwrap();
    assert_eq!(second.first().map(|q| q.queue.as_str()), Some("many_0050"));
    // the last page says so; a filter that matches nothing gives an empty last page
    let last_from = names[queues - 4].as_str();
    let (last, next) = storage
        .queue_counts_page(Some(last_from), None, 50)
        .await
        .unwrap();
    assert_eq!((last.len(), next), (3, None));
    assert_eq!(
        storage
            .queue_counts_page(None, Some("nothing_like_it"), 50)
            .await
            .unwrap(),
        (Vec::new(), None)
    );

    let listed = all_pages(&storage, JobStatus::Available, None, 50).await;
    assert_eq!(listed.len(), queues);
    let ids: HashSet<i64> = listed.iter().map(|j| j.job_id).collect();
    assert_eq!(ids.len(), queues, "each job once");
    // one page of everything: the walk goes on across its bounded calls
    let page = storage
        .list_jobs(JobStatus::Available, None, None, None, 1000)
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), queues.min(1000));
    db.cleanup().await;
}
