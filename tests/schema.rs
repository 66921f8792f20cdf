//! The schema's promises: frozen, checksummed migrations, each version applied once however many
//! processes migrate at once; a build older than the schema refused; functions installed from their
//! plane files, idempotently; no installed function mutates a ring table; a cancelled migrate holds
//! no lock.

mod support;

use std::time::Duration;

use ringwork::schema::{churn_class, ChurnClass, SCHEMA_VERSION, TABLE_CLASSES};
use ringwork::{Error, SchemaName};
use support::{eventually, TestDb};

async fn function_count(db: &TestDb, schema: &SchemaName) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace")
        .bind(schema.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn installing_twice_is_idempotent() {
    let db = TestDb::new().await;
    let functions = function_count(&db, &db.schema).await;
    assert!(functions >= 40, "only {functions} functions installed");

    let again = ringwork::schema::migrate(&db.pool, &db.schema, Default::default())
        .await
        .unwrap();
    assert!(again.applied.is_empty(), "{again:?}");
    assert!(!again.functions_reloaded, "{again:?}");

    // A recorded hash that differs from the binary's (an older binary installed them) reloads the
    // functions; reloading over the same definitions changes nothing.
    db.exec("INSERT INTO {s}.schema_functions (checksum) VALUES ('an older build')")
        .await;
    let reload = ringwork::schema::migrate(&db.pool, &db.schema, Default::default())
        .await
        .unwrap();
    assert!(reload.applied.is_empty());
    assert!(reload.functions_reloaded);
    assert_eq!(function_count(&db, &db.schema).await, functions);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.schema_functions")
            .await,
        3
    );

    // and the engine works on the reloaded functions
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let job = ringwork::NewJob::from_parts("k", serde_json::json!({})).unwrap();
    let id = storage.insert(&mut conn, &job).await.unwrap();
    drop(conn);
    let claimed = storage.claim("default", 10, None).await.unwrap();
    assert_eq!(claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(), [id]);
    db.cleanup().await;
}

#[tokio::test]
async fn a_changed_migration_checksum_is_refused() {
    let db = TestDb::new().await;
    db.exec("UPDATE {s}.schema_migrations SET checksum = 'edited in place' WHERE version = 1")
        .await;
    match ringwork::schema::migrate(&db.pool, &db.schema, Default::default()).await {
        Err(Error::SchemaMismatch { reason, .. }) => {
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
    // a client refuses to start on it too
    assert!(matches!(
        db.client().build().await,
        Err(Error::SchemaMismatch { .. })
    ));
    db.cleanup().await;
}

#[tokio::test]
async fn a_newer_schema_is_refused_by_migrate() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "INSERT INTO {{s}}.schema_migrations (version, name, checksum) VALUES ({}, 'next', 'x')",
        SCHEMA_VERSION + 1
    ))
    .await;
    let before = function_count(&db, &db.schema).await;
    match ringwork::schema::migrate(&db.pool, &db.schema, Default::default()).await {
        Err(Error::SchemaTooNew {
            database, binary, ..
        }) => assert_eq!((database, binary), (SCHEMA_VERSION + 1, SCHEMA_VERSION)),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    // refused before anything was written: no functions replaced, no install recorded
    assert_eq!(function_count(&db, &db.schema).await, before);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM {s}.schema_functions")
            .await,
        1
    );
    db.cleanup().await;
}

/// Word-boundary match of `UPDATE [ONLY] <schema>.<table>` / `DELETE FROM [ONLY] <schema>.<table>`
/// for a ring table or one of its children. (Dynamic SQL built with `format('%I.%I', ...)` is not
/// seen; no function builds an UPDATE or DELETE that way.)
fn mutates_ring_table(body: &str, schema: &str) -> Option<String> {
    let ring: Vec<&str> = TABLE_CLASSES
        .iter()
        .filter(|(_, class)| *class == ChurnClass::Ring)
        .map(|(name, _)| *name)
        .collect();
    let lower = body.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter(|w| !w.is_empty() && *w != "only")
        .collect();
    for pair in words.windows(3) {
        let target = match pair {
            ["update", t, _] => *t,
            ["delete", "from", t] => *t,
            _ => continue,
        };
        let table = target.strip_prefix(&format!("{schema}.")).unwrap_or(target);
        if ring.contains(&table) || churn_class(table) == Some(ChurnClass::Ring) {
            return Some(target.to_string());
        }
    }
    None
}

#[tokio::test]
async fn no_installed_function_updates_or_deletes_a_ring_table() {
    // The check itself can fail: these strings are the checker's test input (bad function
    // bodies it must catch), never SQL that runs against a ring table.
    assert!(mutates_ring_table("BEGIN DELETE FROM s.ready_entries_3 WHERE x; END", "s").is_some());
    assert!(mutates_ring_table("update s.lease_claims set", "s").is_some());
    assert!(mutates_ring_table("DELETE FROM ONLY s.done_entries WHERE", "s").is_some());
    assert!(mutates_ring_table("UPDATE s.queues SET", "s").is_none());

    let db = TestDb::new().await;
    let bodies: Vec<(String, String)> = sqlx::query_as(
        "SELECT proname::text, prosrc FROM pg_proc WHERE pronamespace = $1::regnamespace",
    )
    .bind(db.schema.as_str())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(bodies.len() >= 40);
    for (name, body) in &bodies {
        if let Some(table) = mutates_ring_table(body, db.schema.as_str()) {
            panic!("function {name} mutates ring table {table}");
        }
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_cancelled_migrate_leaves_no_lock_behind() {
    let db = TestDb::new().await;
    let fresh = SchemaName::new(&format!("{}_c", db.schema)).unwrap();
    // A blocker creates the schema in an open transaction, so a migrate of it gets its advisory
    // lock and then waits on the blocker's uncommitted catalog row.
    let mut blocker = db.pool.acquire().await.unwrap();
    sqlx::raw_sql(&format!("BEGIN; CREATE SCHEMA {fresh}"))
        .execute(&mut *blocker)
        .await
        .unwrap();
    let pool = db.pool.clone();
    let migrating = {
        let fresh = fresh.clone();
        tokio::spawn(
            async move { ringwork::schema::migrate(&pool, &fresh, Default::default()).await },
        )
    };
    // wait until the migrate holds its advisory lock and is blocked behind the blocker
    let waiting = eventually(Duration::from_secs(10), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
                            WHERE l.locktype = 'advisory' AND l.granted AND a.wait_event_type = 'Lock'
                              AND a.query = 'CREATE SCHEMA ' || $1)",
        )
        .bind(fresh.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap()
    })
    .await;
    assert!(
        waiting,
        "migrate never got blocked behind the open CREATE SCHEMA"
    );
    migrating.abort(); // the future is dropped mid-statement
    let _ = migrating.await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *blocker)
        .await
        .unwrap();
    drop(blocker);

    // A second migrate, on a pool of its own (a session lock left on one of db.pool's connections
    // would be re-entrant for that same session), must not wait on anything the dropped one left.
    let other = TestDb::connect(&db.url, 1).await;
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        ringwork::schema::migrate(&other, &fresh, Default::default()),
    )
    .await
    .expect("a later migrate waited on a lock left by the cancelled one")
    .unwrap();
    assert_eq!(report.applied, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    other.close().await;
    sqlx::query(&format!("DROP SCHEMA {fresh} CASCADE"))
        .execute(&db.pool)
        .await
        .unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn a_newer_schema_version_is_refused() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "INSERT INTO {{s}}.schema_migrations (version, name, checksum) VALUES ({}, 'from the future', 'x')",
        SCHEMA_VERSION + 1
    ))
    .await;
    for migrate in [true, false] {
        match db.client().migrate(migrate).build().await {
            Err(Error::SchemaTooNew {
                database, binary, ..
            }) => {
                assert_eq!((database, binary), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("expected SchemaTooNew, got {:?}", other.err()),
        }
    }
    db.cleanup().await;
}

#[tokio::test]
async fn concurrent_migrations_apply_each_version_once() {
    let db = TestDb::new().await;
    let fresh = ringwork::SchemaName::new(&format!("{}_m", db.schema)).unwrap();
    let runs = (0..4).map(|_| {
        let pool = db.pool.clone();
        let fresh = fresh.clone();
        tokio::spawn(
            async move { ringwork::schema::migrate(&pool, &fresh, Default::default()).await },
        )
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().unwrap().applied);
    }
    applied.sort();
    assert_eq!(applied, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    sqlx::query(&format!("DROP SCHEMA {fresh} CASCADE"))
        .execute(&db.pool)
        .await
        .unwrap();
    db.cleanup().await;
}

/// A claim of 128 jobs writes rows whose arrays PostgreSQL compresses: with lz4 where the server
/// has it (a tenth of the server's work of the jobs' cycle went to pglz), on every partition of the
/// batch tables, the ones the migration made before it included (SET COMPRESSION does not recurse).
#[tokio::test]
async fn batch_rows_compress_their_arrays_with_lz4_where_the_server_has_it() {
    let db = TestDb::new().await;
    let lz4: bool = sqlx::query_scalar(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let expected = if lz4 { "l" } else { "" };
    // every array column of the three tables and of each of their partitions
    let settings: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT c.relname::text, a.attname::text, a.attcompression::text
           FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
          WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
            AND (c.relname IN ('lease_claim_batches', 'receipt_completion_batches',
                               'archived_completion_batches')
                 OR c.relname ~ '^(lease_claim_batches|receipt_completion_batches|archived_completion_batches)_[0-9]+$')
            AND a.attnum > 0 AND NOT a.attisdropped
            AND EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = a.atttypid AND t.typcategory = 'A')",
    )
    .bind(db.schema.as_str())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // every family's partitions, each with its arrays (six, two and seven of them)
    for (family, arrays) in [
        ("lease_claim_batches_", 6),
        ("receipt_completion_batches_", 2),
        ("archived_completion_batches_", 7),
    ] {
        let found = settings
            .iter()
            .filter(|(rel, _, _)| rel.starts_with(family))
            .count();
        assert!(found >= arrays * 3, "{family}: {settings:?}");
    }
    let other: Vec<_> = settings.iter().filter(|(_, _, c)| c != expected).collect();
    assert!(other.is_empty(), "not {expected:?}: {other:?}");

    let storage = db.storage();
    let jobs: Vec<ringwork::NewJob> = (0..128)
        .map(|n| ringwork::NewJob::from_parts("k", serde_json::json!({ "n": n })).unwrap())
        .collect();
    let mut conn = db.pool.acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let claimed = storage.claim("default", 128, None).await.unwrap();
    assert_eq!(claimed.len(), 128);
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    let stored = if lz4 { "lz4" } else { "pglz" };
    for table in ["lease_claim_batches", "receipt_completion_batches"] {
        let methods: Vec<Option<String>> = sqlx::query_scalar(&format!(
            "SELECT pg_column_compression(job_ids) FROM {}.{table}",
            db.schema
        ))
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(methods, [Some(stored.to_string())], "{table}");
    }
    db.cleanup().await;
}
