//! The dead-tuple contract (docs/storage.md): every table declares its churn class, the ring
//! tables gain no dead tuples from enqueue, claim and complete, and rotation, prune and rescue
//! rewrite no row while a transaction holds the MVCC horizon.

mod support;

use ringwork::schema::{churn_class, ChurnClass};
use ringwork::{JobContext, JobError, NewJob, PruneResult};
use std::sync::Arc;
use std::time::Duration;
use support::{eventually, job, no_maintenance, queue, Count, TestDb};

#[tokio::test]
async fn every_table_declares_its_churn_class() {
    let db = TestDb::new().await;
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
            .bind(db.schema.as_str())
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(tables.len() > 100, "ring children exist");
    for table in tables {
        assert!(
            churn_class(&table).is_some(),
            "{table} has no churn class in schema::TABLE_CLASSES"
        );
    }
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_tables_gain_no_dead_tuples_from_enqueue_claim_complete() {
    let db = TestDb::new().await;
    // Maintenance off: no TRUNCATE may reset the counters and hide an UPDATE or DELETE.
    let client = db
        .client()
        .maintenance(no_maintenance())
        .queue("default", queue(32))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    for chunk in 0..40 {
        let jobs: Vec<_> = (0..500)
            .map(|i| NewJob::new(&Count { n: chunk * 500 + i }).unwrap())
            .collect();
        client.insert_many(&jobs).await.unwrap();
    }
    for i in 0..100 {
        client
            .insert(NewJob::new(&Count { n: i }).unwrap())
            .await
            .unwrap();
    }
    let all_done = eventually(Duration::from_secs(120), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == 20_100 }
    })
    .await;
    running.shutdown(Duration::from_secs(10)).await;
    assert!(all_done, "completed {}", metrics.completed());

    let (pool, schema, rows) = flushed_table_stats(db, "ready_entries%", 20_100).await;
    let mut ring_inserts = 0;
    for (table, dead, updated, deleted, inserted) in &rows {
        let class = churn_class(table)
            .unwrap_or_else(|| panic!("table {table} has no declared churn class"));
        if class == ChurnClass::Ring {
            assert_eq!(
                (*dead, *updated, *deleted),
                (0, 0, 0),
                "ring table {table}: dead/upd/del"
            );
            ring_inserts += inserted;
        }
    }
    assert!(
        ring_inserts > 20_100,
        "ring tables saw the traffic ({ring_inserts} inserts)"
    );
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

/// Every table's dead tuples, updates, deletes and inserts, once the statistics show at least
/// `at_least` inserts into the tables named like `tables`. Closing every connection of the test's
/// pool makes each backend flush its statistics on exit; returns a fresh pool and the schema.
async fn flushed_table_stats(
    db: TestDb,
    tables: &str,
    at_least: i64,
) -> (
    sqlx::PgPool,
    ringwork::SchemaName,
    Vec<(String, i64, i64, i64, i64)>,
) {
    let url = db.url.clone();
    let schema = db.schema.clone();
    db.pool.close().await;
    let pool = TestDb::connect(&url, 2).await;
    let flushed = eventually(Duration::from_secs(30), || {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            let inserted: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
                 WHERE schemaname = $1 AND relname LIKE $2",
            )
            .bind(schema.as_str())
            .bind(tables)
            .fetch_one(&pool)
            .await
            .unwrap();
            inserted >= at_least
        }
    })
    .await;
    assert!(flushed, "statistics never caught up");
    let rows = sqlx::query_as(
        "SELECT relname::text, n_dead_tup, n_tup_upd, n_tup_del, n_tup_ins FROM pg_stat_user_tables
         WHERE schemaname = $1",
    )
    .bind(schema.as_str())
    .fetch_all(&pool)
    .await
    .unwrap();
    (pool, schema, rows)
}

const NO_WAIT: Duration = Duration::from_millis(25);

const KEEP: Duration = Duration::ZERO;

/// Zero growth under a held horizon: rotation, prune and rescue-cursor moves append to
/// ledgers inside the slots they describe (migration 0005) and rewrite nothing. With a transaction
/// pinning the MVCC horizon for the whole run (so no page pruning or vacuum could reclaim a dead
/// version), 30 turns of both rings, each with a prune and a cursor move, leave no updated or
/// deleted row anywhere in the schema.
#[tokio::test]
async fn rotation_prune_and_rescue_cursors_rewrite_no_row_under_a_held_horizon() {
    let db = TestDb::new().await;
    let storage = db.storage();
    storage.ensure_queue("default").await.unwrap();
    // REPEATABLE READ: its snapshot is the one a long report or pg_dump would hold
    let mut horizon = db.pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *horizon)
        .await
        .unwrap();
    sqlx::query("SELECT txid_current()")
        .execute(&mut *horizon)
        .await
        .unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let (mut rotations, mut queue_prunes, mut claim_prunes) = (0, 0, 0);
    for n in 0..30 {
        storage.insert(&mut conn, &job(n)).await.unwrap();
        for claimed in storage.claim("default", 1, None).await.unwrap() {
            storage
                .complete_batch(&[claimed.attempt_ref()])
                .await
                .unwrap();
        }
        // a sleep, not the engine clock: this test counts every row update in the schema, and the
        // test clock's own row would be one
        tokio::time::sleep(Duration::from_millis(5)).await;
        // every claim is closed and older than 1 ms: the stale cursor steps over them
        storage.rescue(Duration::from_millis(1), 100).await.unwrap();
        rotations += i32::from(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
        rotations += i32::from(storage.rotate_claim_ring(Duration::ZERO).await.unwrap());
        for slot in storage.sealed_queue_slots().await.unwrap() {
            queue_prunes += i32::from(
                storage.prune_queue_slot(slot, NO_WAIT, KEEP).await.unwrap() == PruneResult::Pruned,
            );
        }
        for slot in storage.sealed_claim_slots().await.unwrap() {
            claim_prunes += i32::from(
                storage.prune_claim_slot(slot, NO_WAIT).await.unwrap() == PruneResult::Pruned,
            );
        }
    }
    drop(conn);
    assert_eq!(rotations, 60, "both rings turned every time");
    assert!(
        queue_prunes >= 25 && claim_prunes >= 25,
        "{queue_prunes} / {claim_prunes} prunes"
    );
    // the ledger is what the slots say, and every slot is accounted for
    let slots = storage.ring_slots().await.unwrap();
    for ring in ["queue", "claim"] {
        let current: Vec<_> = slots
            .iter()
            .filter(|s| s.ring == ring && s.state == "current")
            .collect();
        assert_eq!(current.len(), 1, "{ring}: one current slot in {slots:?}");
        assert_eq!(
            current[0].generation, 31,
            "{ring}: 30 rotations after generation 1"
        );
    }
    // backends flush their table statistics within a second of a transaction, or after 10 s idle
    let flushed = support::eventually(Duration::from_secs(20), || async {
        let cursor_moves: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname LIKE 'claim_rescue_cursors%'",
        )
        .bind(db.schema.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let ledger_rows: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname ~ '^(queue|claim)_ring_ledger_'",
        )
        .bind(db.schema.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap();
        // 2 per rotation and 1 per prune
        cursor_moves >= 25 && ledger_rows >= i64::from(2 * rotations + queue_prunes + claim_prunes)
    })
    .await;
    assert!(
        flushed,
        "the rotations, prunes and cursor moves reached the statistics"
    );
    let rewritten: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_upd, n_tup_del, n_dead_tup FROM pg_stat_user_tables
         WHERE schemaname = $1 AND n_tup_upd + n_tup_del + n_dead_tup > 0 ORDER BY relname",
    )
    .bind(db.schema.as_str())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        rewritten.is_empty(),
        "rows updated or deleted: {rewritten:?}"
    );
    // TRUNCATE is not MVCC-safe: the old snapshot sees a pruned slot's ledger child empty, and not
    // the 'freed' row appended after it. The views still list every slot (as free), so a report or
    // a dump taken from such a snapshot never loses a slot of the ring.
    let listed: (i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT count(*) FROM {s}.queue_ring_slots), (SELECT count(*) FROM {s}.claim_ring_slots)",
        s = db.schema.as_str()
    ))
    .fetch_one(&mut *horizon)
    .await
    .unwrap();
    let slot_counts: (i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT slot_count FROM {s}.queue_ring_state)::int8,
                (SELECT slot_count FROM {s}.claim_ring_state)::int8",
        s = db.schema.as_str()
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        listed, slot_counts,
        "every slot is listed in the old snapshot"
    );
    horizon.rollback().await.unwrap();
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_batches_and_sequences_update_and_delete_nothing_while_they_run() {
    let db = TestDb::new().await;
    let client = db
        .client()
        .maintenance(no_maintenance())
        .queue("default", queue(16))
        .register(|_ctx: JobContext, _args: Count| async { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    let metrics = client.metrics();
    let running = client.start().await.unwrap();
    let count = |n: u64| NewJob::new(&Count { n }).unwrap();
    for w in 0..50 {
        client
            .insert_workflow(
                ringwork::Workflow::new()
                    .step(ringwork::Step::new("a", count(w)))
                    .step(ringwork::Step::new("b", count(w)).after(&["a"]))
                    .step(ringwork::Step::new("c", count(w)).after(&["a"]))
                    .step(ringwork::Step::new("d", count(w)).after(&["b", "c"])),
            )
            .await
            .unwrap();
    }
    for b in 0..20 {
        let mut batch = ringwork::Batch::new();
        for m in 0..5 {
            batch = batch.member(count(b * 10 + m));
        }
        client.insert_batch(batch.callback(count(b))).await.unwrap();
    }
    let sequenced: Vec<NewJob> = (0..100)
        .map(|n| count(n).sequence(&format!("key-{}", n % 10), ringwork::DependencyFailure::Run))
        .collect();
    client.insert_many(&sequenced).await.unwrap();
    let expected = 50 * 4 + 20 * 6 + 100;
    let all_done = eventually(Duration::from_secs(120), || {
        let metrics = Arc::clone(&metrics);
        async move { metrics.completed() == expected }
    })
    .await;
    running.shutdown(Duration::from_secs(10)).await;
    assert!(all_done, "completed {} of {expected}", metrics.completed());

    let (pool, schema, rows) = flushed_table_stats(db, "workflow_results", expected as i64).await;
    for (table, dead, updated, deleted, _) in &rows {
        let class = churn_class(table).unwrap_or_else(|| panic!("{table} has no churn class"));
        // the ring never; the workflow tables only append while workflows run (retention deletes
        // finished ones later, a handler's output is an upsert)
        if class == ChurnClass::Ring
            || (table.starts_with("workflow") && table != "workflow_outputs")
        {
            assert_eq!(
                (*dead, *updated, *deleted),
                (0, 0, 0),
                "{table}: dead/upd/del"
            );
        }
    }
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}
