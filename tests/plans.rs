//! Plans that do not drift with statistics: the hot functions run their statements with generic
//! plans, and the generic plan of claim's ready-row walk stays the ordered index walk it was
//! designed for once the ring tables have real statistics.

mod support;

use std::time::Duration;

use ringwork::NewJob;
use serde_json::json;
use support::TestDb;

/// The functions on the enqueue / claim / complete / rescue paths. Each pins its plans with
/// `SET plan_cache_mode = force_generic_plan` (nested calls inherit it).
const GENERIC_PLAN_FUNCTIONS: &[&str] = &[
    "claim",
    "complete_batch",
    "close_batch",
    "heartbeat_batch",
    "enqueue_segment",
    "enqueue_jobs",
    "lane_cursor",
    "lane_available",
    "promote_due_next",
    "rescue",
    "rescue_close",
    "rescue_stale_slot",
    "rescue_deadline_slot",
];

/// The settings each function of the schema with this name (each overload) runs with (its `SET`
/// clauses, as `name=value`).
async fn settings_of(db: &TestDb, function: &str) -> Vec<Vec<String>> {
    let configs: Vec<Option<Vec<String>>> = sqlx::query_scalar(
        "SELECT proconfig FROM pg_proc WHERE pronamespace = $1::regnamespace AND proname = $2",
    )
    .bind(db.schema.as_str())
    .bind(function)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(!configs.is_empty(), "no function {function}");
    configs.into_iter().map(Option::unwrap_or_default).collect()
}

#[tokio::test]
async fn hot_functions_pin_generic_plans() {
    let db = TestDb::new().await;
    for name in GENERIC_PLAN_FUNCTIONS {
        for config in settings_of(&db, name).await {
            assert!(
                config.contains(&"plan_cache_mode=force_generic_plan".to_string()),
                "{name}: {config:?}"
            );
            // claim never JIT-compiles: a generic estimate of a key limit's walk can pass
            // jit_above_cost, and JIT would then compile the plan on every claim (over a second each)
            if *name == "claim" {
                assert!(config.contains(&"jit=off".to_string()), "{config:?}");
            }
        }
    }
    db.cleanup().await;
}

/// The functions that add workflow steps group and deduplicate with sorts: a nested JSON array is
/// estimated at 10,000 elements and more, and a hashed DISTINCT or GROUP BY allocated its table
/// for that many at every call (40 % of the instructions of a call of five small workflows).
#[tokio::test]
async fn functions_adding_steps_never_size_a_hash_table_by_estimate() {
    let db = TestDb::new().await;
    for name in ["enqueue_workflows", "workflow_write_steps"] {
        for config in settings_of(&db, name).await {
            assert!(config.contains(&"enable_hashagg=off".to_string()), "{name}");
        }
    }
    db.cleanup().await;
}

/// Cut the ready-row walks out of the installed `claim()` (the two over the slots the lane's
/// segments are in, without and with the tombstone probe, then the one over every slot) and turn
/// their PL/pgSQL variables into parameters, so the test explains the very statements claim runs.
fn claim_walk_statements(claim_source: &str) -> Vec<String> {
    let mut walks: Vec<&str> = claim_source
        .split("OPEN v_walk FOR")
        .skip(1)
        .map(|rest| &rest[..rest.find(';').expect("the walk ends with ;")])
        .collect();
    assert_eq!(walks.len(), 3, "claim() has three row-by-row walks");
    // and the walk in one statement: the rows its aggregate reads
    let (_, one) = claim_source
        .split_once("FROM (SELECT e.lane_pos, e.run_at")
        .expect("claim() has a walk in one statement");
    let one = &one[..one.find(") w;").expect("the walk's rows end with ) w;")];
    let one = format!("SELECT e.lane_pos, e.run_at{one}");
    walks.push(&one);
    walks
        .into_iter()
        .map(|walk| {
            let mut statement = walk.to_string();
            for (variable, parameter) in [
                ("v_lane.lane_id", "$1"),
                ("v_cursor", "$2"),
                ("v_limit", "$3"),
                ("p_max - v_n + 1", "$3"),
                ("v_slot_a", "$4"),
                ("v_slot_b", "$5"),
                ("v_slot_c", "$6"),
            ] {
                statement = statement.replace(variable, parameter);
            }
            for parameter in ["$1", "$2", "$3"] {
                assert!(
                    statement.contains(parameter),
                    "the walk no longer uses {parameter}: update this test with claim()\n{walk}"
                );
            }
            let unbound = statement
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .find(|word| word.starts_with("v_") || word.starts_with("p_"));
            assert!(
                unbound.is_none(),
                "the walk uses {unbound:?}, a variable this test does not bind:\n{statement}"
            );
            statement
        })
        .collect()
}

#[tokio::test]
async fn the_claim_walk_keeps_its_ordered_index_plan_after_analyze() {
    let db = TestDb::new().await;
    let storage = db.storage();
    // A lane spread over twelve queue slots of 2,000 jobs each, 12,000 of them claimed (the older
    // slots drained, the newer ones waiting): the shape the ring has under load, with real row
    // counts for ANALYZE to see.
    let mut conn = db.pool.acquire().await.unwrap();
    for round in 0..12 {
        let jobs: Vec<_> = (0..2000)
            .map(|i| NewJob::from_parts("k", json!({ "n": round * 2000 + i })).unwrap())
            .collect();
        storage.insert_many(&mut conn, &jobs).await.unwrap();
        storage.claim("default", 1000, None).await.unwrap();
        assert!(storage.rotate_queue_ring(Duration::ZERO).await.unwrap());
        storage.rotate_claim_ring(Duration::ZERO).await.unwrap();
    }
    sqlx::raw_sql(&format!(
        "ANALYZE {s}.ready_entries, {s}.ready_tombstones, {s}.ready_segments, \
         {s}.ready_claim_attempt_batches, {s}.queue_lanes",
        s = db.schema
    ))
    .execute(&mut *conn)
    .await
    .unwrap();

    let source: String = sqlx::query_scalar(
        "SELECT prosrc FROM pg_proc WHERE pronamespace = $1::regnamespace AND proname = 'claim' \
         AND pronargs = 6",
    )
    .bind(db.schema.as_str())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let walks = claim_walk_statements(&source);
    let (lane, cursor): (i32, i64) = sqlx::query_as(&format!(
        "SELECT lane_id, {s}.lane_cursor(lane_id) FROM {s}.queue_lanes WHERE queue = 'default' \
         AND priority = 2 ORDER BY pg_sequence_last_value(segment_seq) DESC NULLS LAST LIMIT 1",
        s = db.schema
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    // the slots of the lane's first three segments past its cursor, as a claim would name them
    let slots: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT g.ready_slot FROM {s}.ready_segments g WHERE g.lane_id = $1 AND g.segment_no >= $2 >> 20 \
         ORDER BY g.segment_no LIMIT 3",
        s = db.schema
    ))
    .bind(lane)
    .bind(cursor)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        slots.len(),
        3,
        "the lane's waiting jobs span three slots or more"
    );
    for (i, walk) in walks.iter().enumerate() {
        sqlx::raw_sql(&format!(
            "PREPARE walk(int, bigint, int, int, int, int) AS {walk}; SET plan_cache_mode = force_generic_plan"
        ))
        .execute(&mut *conn)
        .await
        .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, TIMING OFF) EXECUTE walk({lane}, {cursor}, 192, {}, {}, {})",
            slots[0], slots[1], slots[2]
        ))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let plan = plan.join("\n");
        // An ordered merge of the children's (lane_id, lane_pos) index scans that stops after the
        // batch: no sort of the whole lane, no sequential scan of ready rows.
        assert!(plan.contains("Merge Append"), "{plan}");
        assert!(plan.contains("lane_id_lane_pos_idx"), "{plan}");
        assert!(!plan.contains("Seq Scan on ready_entries"), "{plan}");
        assert!(!plan.contains("Sort  ("), "{plan}");
        assert!(
            plan.contains("actual rows=192"),
            "the walk returned a batch\n{plan}"
        );
        if i != 2 {
            // the walks over named slots open only their partitions, the ready rows' and (when
            // the slots hold tombstones) the tombstones' alike, when the executor starts
            assert_eq!(
                plan.matches("Subplans Removed: 13").count(),
                if i == 1 { 2 } else { 1 },
                "the walk over three named slots prunes the other thirteen\n{plan}"
            );
            assert_eq!(plan.contains("ready_tombstones"), i == 1, "{plan}");
        }
        // leave the pooled connection as it was found
        sqlx::raw_sql("DEALLOCATE walk; RESET plan_cache_mode")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    drop(conn);
    db.cleanup().await;
}

/// The backlog check a dispatcher makes after an empty claim finds the lane's first row past its
/// cursor through the (lane_id, lane_pos) index however the statistics look. With an EXISTS, the
/// generic plan after ANALYZE was a sequential scan that stops at its first match; the rows past
/// the cursor are the newest, at the end of the heap, so it read the whole current slot (2 s a
/// check at 2 GB, behind a reader that kept the ring from being pruned).
#[tokio::test]
async fn the_backlog_check_never_scans_ready_rows_sequentially_after_analyze() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    // one lane, one slot: 8,000 jobs of which all but 10 are claimed, so the rows past the cursor
    // are the last ones written
    let jobs: Vec<_> = (0..8000)
        .map(|i| NewJob::from_parts("k", json!({ "n": i })).unwrap())
        .collect();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    let mut claimed = 0;
    while claimed < 7990 {
        claimed += storage
            .claim("default", (7990 - claimed).min(1000), None)
            .await
            .unwrap()
            .len();
    }
    sqlx::raw_sql(&format!(
        "ANALYZE {s}.ready_entries, {s}.queue_lanes",
        s = db.schema
    ))
    .execute(&mut *conn)
    .await
    .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    let has_backlog: bool = sqlx::query_scalar(&format!(
        "SELECT {}.queue_has_backlog('default')",
        db.schema
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(has_backlog);
    // this transaction's own scan counts, before they are flushed to the cumulative view
    let (seq_scans, idx_scans): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(seq_scan), 0)::int8, coalesce(sum(idx_scan), 0)::int8 \
         FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE 'ready\\_entries\\_%'",
    )
    .bind(db.schema.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        seq_scans, 0,
        "the backlog check read ready rows sequentially"
    );
    assert!(
        idx_scans > 0,
        "the backlog check used no index on ready rows"
    );
    tx.rollback().await.unwrap();
    drop(conn);
    db.cleanup().await;
}

/// The order of claim's shard walk is a SQL function so that it reads as one named step; it must
/// stay one the planner inlines into claim's loop statement (cached with claim's generic plan). A
/// SQL function that is not inlined (declared VOLATILE, given a SET clause, grown a second
/// statement) is planned again at every call: a fixed cost on every claim.
#[tokio::test]
async fn the_shard_order_is_inlined_into_the_claim() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    db.storage()
        .insert(&mut conn, &NewJob::from_parts("k", json!({})).unwrap())
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "SET plan_cache_mode = force_generic_plan; \
         PREPARE lane_order(int[], regclass[], smallint[], bigint[], timestamptz, interval) AS \
         SELECT o.lane_id, o.cursor_seq, o.next_head FROM {s}.claim_lane_order($1, $2, $3, $4, $5, $6) o",
        s = db.schema
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN EXECUTE lane_order('{1,2}', '{}', '{2,2}', '{0,0}', now(), NULL)",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("Function Scan on claim_lane_order"),
        "{plan}"
    );
    assert!(plan.contains("WindowAgg"), "{plan}");
    sqlx::raw_sql("DEALLOCATE lane_order; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    db.cleanup().await;
}

/// Functions the hot paths call once or more per statement whose SQL body the planner cannot
/// inline (a subquery, several statements): as LANGUAGE sql they were parsed and planned at every
/// call (clock_offset cost a claim about 60 us that way), so they are PL/pgSQL, which keeps its
/// plans for the session.
#[tokio::test]
async fn per_call_helpers_keep_their_plans_for_the_session() {
    let db = TestDb::new().await;
    for name in [
        "clock_offset",
        "setting",
        "lane_cursor",
        "current_claim_slot",
        "queue_has_backlog",
        "count_running_from",
        "claimed_since",
        "multirange_size",
        "workflow_steps_plain",
    ] {
        let language: String = sqlx::query_scalar(
            "SELECT l.lanname::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang \
             WHERE p.pronamespace = $1::regnamespace AND p.proname = $2",
        )
        .bind(db.schema.as_str())
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(language, "plpgsql", "{name}");
    }
    db.cleanup().await;
}

/// A completion batch's evidence lookup opens only the claim slots the batch names. Keyed only by
/// each input row's slot, the probes were pruned row by row after every partition of the claim
/// ring and its indexes had been opened, at every call: about a quarter of a completion's time.
#[tokio::test]
async fn the_open_attempts_lookup_opens_only_the_claim_slots_it_names() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    storage
        .insert(&mut conn, &NewJob::from_parts("k", json!({})).unwrap())
        .await
        .unwrap();
    let job = storage.claim("default", 1, None).await.unwrap().remove(0);
    sqlx::raw_sql(&format!(
        "SET plan_cache_mode = force_generic_plan; \
         PREPARE open_attempts(int[], bigint[], bigint[], bigint[], int, int) AS \
         SELECT * FROM {s}.open_attempts($1, $2, $3, $4, $5, $6)",
        s = db.schema
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) EXECUTE open_attempts(\
         ARRAY[{slot}], ARRAY[{receipt}]::bigint[], ARRAY[{job}]::bigint[], ARRAY[{lease}]::bigint[], {slot}, {slot})",
        slot = job.claim_slot,
        receipt = job.receipt_id,
        job = job.job_id,
        lease = job.run_lease,
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("actual rows=1 "),
        "the attempt is open\n{plan}"
    );
    let claim_slots: i64 = db
        .scalar_i64("SELECT slot_count::int8 FROM {s}.claim_ring_state")
        .await;
    for table in [
        "lease_claim_batches",
        "lease_claim_closure_batches",
        "lease_claims",
        "lease_claim_closures",
    ] {
        assert!(
            plan.contains(&format!("{table}_{}", job.claim_slot)),
            "{table} is read in the batch's slot\n{plan}"
        );
        for slot in (0..claim_slots).filter(|s| *s != i64::from(job.claim_slot)) {
            assert!(
                !plan.contains(&format!("{table}_{slot} ")),
                "{table}_{slot} is opened\n{plan}"
            );
        }
    }
    sqlx::raw_sql("DEALLOCATE open_attempts; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    db.cleanup().await;
}
