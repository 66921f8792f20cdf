//! Schema names, versioned migrations and the churn class of every table.
//!
//! The schema is two things kept apart:
//! - **tables, indexes and views** in frozen, forward-only migrations (`migrations/`), each applied
//!   once, recorded in `<schema>.schema_migrations` with its SHA-256, and verified on every start;
//! - **functions** in one file per plane (`sql/functions/`), installed with `CREATE OR REPLACE` and
//!   reloaded whenever their combined hash differs from the one recorded in
//!   `<schema>.schema_functions`.
//!
//! Both happen in one transaction under a transaction-level advisory lock, so any number of
//! processes may start at once. A database whose recorded version is newer than the binary, or
//! whose recorded checksum differs from the binary's migration, is refused before anything runs.

use sqlx::{PgConnection, PgPool};

use crate::error::{Error, Result};

/// The frozen migrations this binary knows, in order. Version = position + 1. A released file is
/// never edited: its SHA-256 is recorded when it is applied, and `migrate` refuses a database whose
/// recorded checksum differs (two databases at one version must hold the same schema).
const MIGRATIONS: &[(&str, &str)] = &[
    ("baseline", include_str!("../migrations/0001_baseline.sql")),
    (
        "lane_shards",
        include_str!("../migrations/0002_lane_shards.sql"),
    ),
    (
        "parked_lanes",
        include_str!("../migrations/0003_parked_lanes.sql"),
    ),
    ("archive", include_str!("../migrations/0004_archive.sql")),
    (
        "rotation_ledger",
        include_str!("../migrations/0005_rotation_ledger.sql"),
    ),
    (
        "terminal_totals",
        include_str!("../migrations/0006_terminal_totals.sql"),
    ),
    (
        "trace_context",
        include_str!("../migrations/0007_trace_context.sql"),
    ),
    ("periodic", include_str!("../migrations/0008_periodic.sql")),
    (
        "queue_limits",
        include_str!("../migrations/0009_queue_limits.sql"),
    ),
    (
        "running_mark",
        include_str!("../migrations/0010_running_mark.sql"),
    ),
    (
        "periodic_triggers",
        include_str!("../migrations/0011_periodic_triggers.sql"),
    ),
    (
        "key_limits",
        include_str!("../migrations/0012_key_limits.sql"),
    ),
    (
        "key_rate_limits",
        include_str!("../migrations/0013_key_rate_limits.sql"),
    ),
    (
        "listing_indexes",
        include_str!("../migrations/0014_listing_indexes.sql"),
    ),
    (
        "lease_ring",
        include_str!("../migrations/0015_lease_ring.sql"),
    ),
    (
        "archive_ahead",
        include_str!("../migrations/0016_archive_ahead.sql"),
    ),
    (
        "traceparent_bytes",
        include_str!("../migrations/0017_traceparent_bytes.sql"),
    ),
    (
        "proven_segments",
        include_str!("../migrations/0018_proven_segments.sql"),
    ),
    ("settings", include_str!("../migrations/0019_settings.sql")),
    (
        "clock_offset",
        include_str!("../migrations/0020_clock_offset.sql"),
    ),
    (
        "workflows",
        include_str!("../migrations/0021_workflows.sql"),
    ),
    ("batches", include_str!("../migrations/0022_batches.sql")),
    (
        "sequences",
        include_str!("../migrations/0023_sequences.sql"),
    ),
    (
        "periodic_definitions",
        include_str!("../migrations/0024_periodic_definitions.sql"),
    ),
    (
        "pending_counts",
        include_str!("../migrations/0025_pending_counts.sql"),
    ),
    (
        "archive_search",
        include_str!("../migrations/0026_archive_search.sql"),
    ),
    (
        "archive_search_doc",
        include_str!("../migrations/0027_archive_search_doc.sql"),
    ),
    (
        "archive_finalized_ats",
        include_str!("../migrations/0028_archive_finalized_ats.sql"),
    ),
    (
        "batch_arrays_lz4",
        include_str!("../migrations/0029_batch_arrays_lz4.sql"),
    ),
];

/// The engine's functions, one file per plane, installed in this order (a LANGUAGE sql function is
/// checked against the functions it calls, so callees come first). `dropped` runs first and drops
/// by name what an earlier install had and this one no longer defines.
const FUNCTION_FILES: &[(&str, &str)] = &[
    ("dropped", include_str!("../sql/functions/dropped.sql")),
    ("clock", include_str!("../sql/functions/clock.sql")),
    ("locks", include_str!("../sql/functions/locks.sql")),
    (
        "queue_ring",
        include_str!("../sql/functions/queue_ring.sql"),
    ),
    ("parking", include_str!("../sql/functions/parking.sql")),
    ("archive", include_str!("../sql/functions/archive.sql")),
    ("claim", include_str!("../sql/functions/claim.sql")),
    ("complete", include_str!("../sql/functions/complete.sql")),
    ("rescue", include_str!("../sql/functions/rescue.sql")),
    ("rotate", include_str!("../sql/functions/rotate.sql")),
    ("prune", include_str!("../sql/functions/prune.sql")),
    ("callbacks", include_str!("../sql/functions/callbacks.sql")),
    ("read", include_str!("../sql/functions/read.sql")),
    ("deferred", include_str!("../sql/functions/deferred.sql")),
    ("unique", include_str!("../sql/functions/unique.sql")),
    (
        "dead_letter",
        include_str!("../sql/functions/dead_letter.sql"),
    ),
    ("control", include_str!("../sql/functions/control.sql")),
    ("health", include_str!("../sql/functions/health.sql")),
    ("periodic", include_str!("../sql/functions/periodic.sql")),
    ("workflows", include_str!("../sql/functions/workflows.sql")),
];

/// Highest schema version this binary can run against.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// A validated PostgreSQL schema identifier (lower-case ASCII letters, digits and `_`, starting with
/// a letter or `_`, at most 40 characters). Validation, not quoting, is what keeps it safe to splice
/// into SQL text: the name also appears inside generated identifiers and NOTIFY channels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SchemaName(String);

/// PostgreSQL's key words that cannot name a schema unquoted everywhere ringwork writes one (as a
/// table's qualifier, and as a type's in `RETURNS <schema>.queue_lanes`): PostgreSQL 15,
/// `pg_get_keywords()` of category R, T or C, sorted.
const RESERVED_WORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "between",
    "bigint",
    "binary",
    "bit",
    "boolean",
    "both",
    "case",
    "cast",
    "char",
    "character",
    "check",
    "coalesce",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "dec",
    "decimal",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "exists",
    "extract",
    "false",
    "fetch",
    "float",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "greatest",
    "group",
    "grouping",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "inout",
    "int",
    "integer",
    "intersect",
    "interval",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "least",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "national",
    "natural",
    "nchar",
    "none",
    "normalize",
    "not",
    "notnull",
    "null",
    "nullif",
    "numeric",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "out",
    "outer",
    "overlaps",
    "overlay",
    "placing",
    "position",
    "precision",
    "primary",
    "real",
    "references",
    "returning",
    "right",
    "row",
    "select",
    "session_user",
    "setof",
    "similar",
    "smallint",
    "some",
    "substring",
    "symmetric",
    "table",
    "tablesample",
    "then",
    "time",
    "timestamp",
    "to",
    "trailing",
    "treat",
    "trim",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "values",
    "varchar",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
    "xmlattributes",
    "xmlconcat",
    "xmlelement",
    "xmlexists",
    "xmlforest",
    "xmlnamespaces",
    "xmlparse",
    "xmlpi",
    "xmlroot",
    "xmlserialize",
    "xmltable",
];

impl SchemaName {
    /// Validate `name`: 1..=40 lower-case ASCII letters, digits and `_`, starting with a letter or
    /// `_`, not starting with `pg_` and not a reserved word (else `Error::InvalidName`).
    pub fn new(name: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidName {
            what: "schema name",
            value: name.to_string(),
            reason,
        };
        if name.is_empty() || name.len() > 40 {
            return Err(invalid("must be 1..=40 characters"));
        }
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        if !first_ok
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(invalid(
                "use lower-case ASCII letters, digits and '_', starting with a letter or '_'",
            ));
        }
        if name.starts_with("pg_") {
            return Err(invalid(
                "names starting with pg_ are reserved by PostgreSQL",
            ));
        }
        // the name is spliced into statements unquoted, where a reserved word is a syntax error
        if RESERVED_WORDS.binary_search(&name).is_ok() {
            return Err(invalid(
                "is a reserved word in PostgreSQL's SQL (pick another, e.g. with a prefix)",
            ));
        }
        Ok(Self(name.to_string()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// NOTIFY channel that enqueue signals for this schema (payload: the queue).
    pub fn notify_channel(&self) -> String {
        format!("ringwork_{}", self.0)
    }

    /// NOTIFY channel that tells every process a running attempt was cancelled (payload:
    /// `job_id:run_lease`; sent by `cancel_job` in sql/functions/control.sql).
    pub fn cancel_channel(&self) -> String {
        self.signal_channel("cancel")
    }

    /// NOTIFY channel that wakes the maintenance leader (payload: `deferred` or `clock`; sent by
    /// sql/functions/deferred.sql and clock.sql).
    pub fn maintenance_channel(&self) -> String {
        self.signal_channel("maintenance")
    }

    /// NOTIFY channel on which a queue's first responder, when it has no room for the work it
    /// was notified of, passes the notification on to the other processes (payload: the queue).
    pub fn overflow_channel(&self) -> String {
        self.signal_channel("overflow")
    }

    /// A signal's channel: the enqueue channel, a dot, the signal. A schema name holds no dot, so
    /// no schema's channel is another's (decision 020): with `_cancel` appended, schema
    /// `foo_cancel`'s enqueue channel was `foo`'s cancel channel, and an enqueue into its queue
    /// named `42:1` cancelled `foo`'s running job 42.
    fn signal_channel(&self, signal: &str) -> String {
        format!("{}.{signal}", self.notify_channel())
    }

    /// The application_name a process gives the sessions that stand for it: its LISTEN session
    /// (`ringwork:<schema> pid <pid> <host>`) and, as `role` `leader`, the maintenance leader's
    /// lock session (`ringwork:<schema> leader pid <pid> <host>`); cut to the 63 bytes PostgreSQL
    /// keeps. The dashboard's processes page and `Admin::processes` find them by the prefix.
    pub fn session_name(&self, role: Option<&str>) -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "?".into());
        let role = role.map(|r| format!("{r} ")).unwrap_or_default();
        let mut name = format!(
            "ringwork:{} {role}pid {} {host}",
            self.0,
            std::process::id()
        );
        while name.len() > 63 {
            name.pop();
        }
        name
    }
}

impl Default for SchemaName {
    fn default() -> Self {
        Self("ringwork".to_string())
    }
}

impl std::fmt::Display for SchemaName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ring sizes, fixed when the schema is first created.
#[derive(Clone, Copy, Debug)]
pub struct RingSizes {
    /// Slots of the queue ring (4..=64, default 16).
    pub queue_slots: u32,
    /// Slots of the claim ring (3..=64, default 8).
    pub claim_slots: u32,
}

impl Default for RingSizes {
    fn default() -> Self {
        Self {
            queue_slots: 16,
            claim_slots: 8,
        }
    }
}

impl RingSizes {
    fn validate(&self) -> Result<()> {
        if !(4..=64).contains(&self.queue_slots) {
            return Err(Error::Config(format!(
                "queue_slots must be 4..=64, got {}",
                self.queue_slots
            )));
        }
        if !(3..=64).contains(&self.claim_slots) {
            return Err(Error::Config(format!(
                "claim_slots must be 3..=64, got {}",
                self.claim_slots
            )));
        }
        Ok(())
    }
}

/// How a table reclaims space (ARCHITECTURE §7). Declared here for every table and held by a test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChurnClass {
    /// Append-only, reclaimed by TRUNCATE of a ring slot: zero dead tuples from the hot path.
    Ring,
    /// Bounded by in-flight attempts or by the number of lanes/slots; small, independent of volume.
    Warm,
    /// Backlog and hold tables: ordinary row vacuum, off the hot path.
    Backlog,
}

/// Every table of the schema (partition parents; children inherit their parent's class).
pub const TABLE_CLASSES: &[(&str, ChurnClass)] = &[
    ("ready_entries", ChurnClass::Ring),
    ("ready_segments", ChurnClass::Ring),
    ("ready_tombstones", ChurnClass::Ring),
    ("ready_claim_attempt_batches", ChurnClass::Ring),
    ("done_entries", ChurnClass::Ring),
    ("receipt_completion_batches", ChurnClass::Ring),
    ("lease_claim_batches", ChurnClass::Ring),
    ("lease_claims", ChurnClass::Ring),
    ("lease_claim_closures", ChurnClass::Ring),
    ("lease_claim_closure_batches", ChurnClass::Ring),
    // lock targets only, never updated
    ("queue_ring_state", ChurnClass::Warm),
    ("claim_ring_state", ChurnClass::Warm),
    // the rotation ledger and the rescue cursors live in the slot they describe and go with it
    // (migration 0005); queue_ring_slots and claim_ring_slots are views over them
    ("queue_ring_ledger", ChurnClass::Ring),
    ("claim_ring_ledger", ChurnClass::Ring),
    ("claim_rescue_cursors", ChurnClass::Ring),
    // how far a sealed slot's generation has been archived ahead of its prune (migration 0016)
    ("queue_slot_archive_marks", ChurnClass::Ring),
    ("queues", ChurnClass::Warm),
    ("queue_lanes", ChurnClass::Warm),
    ("attempt_state", ChurnClass::Warm),
    // the lease ring (migration 0015): rows only for attempts that wait for a callback, updated and
    // deleted, their dead versions truncated with their slot at every ring cycle; its ledger is
    // one row per slot, truncated with it; the callback key is one row, written once
    ("leases", ChurnClass::Warm),
    ("lease_ring_ledger", ChurnClass::Warm),
    ("callback_keys", ChurnClass::Warm),
    // bookkeeping: one row per migration applied and per function reload
    ("schema_migrations", ChurnClass::Warm),
    ("schema_functions", ChurnClass::Warm),
    ("deferred_jobs", ChurnClass::Backlog),
    ("dlq_entries", ChurnClass::Backlog),
    // written only by unique inserts (INSERT, or UPDATE when a released key is re-taken) and
    // expired by maintenance in bounded batches
    ("unique_keys", ChurnClass::Backlog),
    // cold work moved out of the queue ring by prune and back by the lane's next claim, in bulk
    ("parked_lanes", ChurnClass::Backlog),
    ("parked_segments", ChurnClass::Backlog),
    ("parked_entries", ChurnClass::Backlog),
    // terminal history: INSERT-only rings of time buckets, reclaimed by TRUNCATE of a whole bucket
    ("archived_completion_batches", ChurnClass::Ring),
    ("archived_jobs", ChurnClass::Ring),
    // archive search (migrations 0026, 0027): one row per archived job while the setting is on
    ("archived_job_args", ChurnClass::Ring),
    // durable terminal totals: appended at prune, folded and truncated a time bucket at a time
    ("terminal_totals", ChurnClass::Ring),
    // one INSERT per fire of a schedule; a schedule's fires older than a week deleted with a newer one
    ("periodic_fires", ChurnClass::Backlog),
    // one row per paused schedule
    ("periodic_paused", ChurnClass::Warm),
    // one row per declared schedule, rewritten only when its definition changes (migration 0024)
    ("periodic_definitions", ChurnClass::Warm),
    // one row per claim call of a rate-limited queue, deleted once out of its window
    ("rate_limit_claims", ChurnClass::Backlog),
    ("periodic_triggers", ChurnClass::Backlog),
    // one row per limit an operator changed from its default (migration 0019)
    ("settings", ChurnClass::Warm),
    // the engine's clock offset: no row in production, one row a test clock updates (0020)
    ("clock_offset", ChurnClass::Warm),
    // workflows (migration 0021): steps, edges and the evidence that releases them, appended while
    // a workflow runs and deleted a finished workflow at a time in bounded batches (workflow_expire);
    // an output is upserted by its step's handler
    ("workflows", ChurnClass::Backlog),
    ("workflow_steps", ChurnClass::Backlog),
    ("workflow_edges", ChurnClass::Backlog),
    ("workflow_results", ChurnClass::Backlog),
    ("workflow_arrivals", ChurnClass::Backlog),
    ("workflow_released", ChurnClass::Backlog),
    ("workflow_outputs", ChurnClass::Backlog),
    ("workflow_cancels", ChurnClass::Backlog),
    // which workflows are batches (migration 0022), deleted with them
    ("workflow_batches", ChurnClass::Backlog),
    // which workflow holds a sequence key's jobs (migration 0023), deleted with it
    ("workflow_sequences", ChurnClass::Backlog),
];

/// The churn class of a table or of one of its ring children (`ready_entries_3` → Ring).
pub fn churn_class(table: &str) -> Option<ChurnClass> {
    let parent = match table.rsplit_once('_') {
        Some((head, tail)) if tail.chars().all(|c| c.is_ascii_digit()) && !tail.is_empty() => head,
        _ => table,
    };
    TABLE_CLASSES
        .iter()
        .find(|(name, _)| *name == table || *name == parent)
        .map(|(_, class)| *class)
}

fn render(sql: &str, schema: &SchemaName, rings: RingSizes) -> String {
    sql.replace("__S__", schema.as_str())
        .replace("__QUEUE_SLOTS__", &rings.queue_slots.to_string())
        .replace("__CLAIM_SLOTS__", &rings.claim_slots.to_string())
}

/// Key of the transaction advisory lock that serialises migrators of one schema.
fn migration_lock_key(schema: &SchemaName) -> i64 {
    // FNV-1a: stable across processes and releases (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("ringwork-migrate:{schema}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

fn sha256_hex(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        // a separator, so that moving text from one file to the next changes the hash
        hasher.update([0u8]);
    }
    crate::bytes::hex(&hasher.finalize())
}

/// The checksum recorded for migration `version` (1-based).
fn migration_checksum(sql: &str) -> String {
    sha256_hex(&[sql])
}

/// The combined hash of every function file (names and texts, in install order).
pub fn functions_checksum() -> String {
    let parts: Vec<&str> = FUNCTION_FILES
        .iter()
        .flat_map(|(name, sql)| [*name, *sql])
        .collect();
    sha256_hex(&parts)
}

/// The combined hash of every migration and function file: two schemas migrated by binaries with
/// the same schema checksum hold the same tables and functions (the test kit keys its template
/// database on it).
pub fn schema_checksum() -> String {
    let parts: Vec<&str> = MIGRATIONS
        .iter()
        .chain(FUNCTION_FILES.iter())
        .flat_map(|(name, sql)| [*name, *sql])
        .collect();
    sha256_hex(&parts)
}

// Every statement here is sent unnamed (`persistent(false)`): they run at start-up, or once per
// readiness check, and a named statement would not survive a transaction-mode pooler.

/// The schema version recorded in the database, or `None` when the schema is not installed.
/// Behind a transaction-mode pooler, `conn` must be in a transaction.
pub async fn installed_version(
    conn: &mut PgConnection,
    schema: &SchemaName,
) -> Result<Option<i32>> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')",
    )
    .bind(schema.as_str())
    .persistent(false)
    .fetch_one(&mut *conn)
    .await?;
    if !exists {
        return Ok(None);
    }
    let version: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM {schema}.schema_migrations"
    ))
    .persistent(false)
    .fetch_one(&mut *conn)
    .await?;
    Ok(version)
}

/// The checksum of the function files last installed in the schema (see `functions_checksum`), or
/// `None` when none were. Equal to this binary's `functions_checksum()` when its functions are the
/// ones installed.
pub async fn installed_functions_checksum(
    conn: &mut PgConnection,
    schema: &SchemaName,
) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT checksum FROM {schema}.schema_functions ORDER BY install_id DESC LIMIT 1"
    ))
    .persistent(false)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Refuse a schema written by a newer binary.
pub fn check_not_newer(schema: &SchemaName, database: Option<i32>) -> Result<()> {
    match database {
        Some(v) if v > SCHEMA_VERSION => Err(Error::SchemaTooNew {
            schema: schema.to_string(),
            database: v,
            binary: SCHEMA_VERSION,
        }),
        _ => Ok(()),
    }
}

/// What one `migrate` call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateReport {
    /// Migration versions this call applied (empty when the schema was up to date).
    pub applied: Vec<i32>,
    /// The combined hash of the function files the schema now runs.
    pub functions_checksum: String,
    /// Whether this call (re)installed the functions: on a fresh schema, or because the binary's
    /// function files differ from the ones the schema ran.
    pub functions_reloaded: bool,
}

/// Bring a schema to this binary's version: apply the migrations it does not have yet, verify the
/// checksums of the ones it has, and (re)install the functions when their hash changed. Safe to
/// call from many processes at once: everything runs in one transaction under a transaction-level
/// advisory lock, so a cancelled call (its future dropped) leaves nothing behind and holds nothing
/// once its connection rolls back.
///
/// Returns a boxed `Send` future: callers spawn it, and rustc cannot otherwise prove `Send` for a
/// future that reborrows a connection across awaits (rust-lang/rust#102211).
pub fn migrate<'a>(
    pool: &'a PgPool,
    schema: &'a SchemaName,
    rings: RingSizes,
) -> futures::future::BoxFuture<'a, Result<MigrateReport>> {
    Box::pin(migrate_inner(pool, schema, rings))
}

/// Drop a schema and everything in it (ringwork's tables and functions, and any others in it).
pub async fn drop_schema(pool: &PgPool, schema: &SchemaName) -> Result<()> {
    sqlx::Executor::execute(
        pool,
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE").as_str(),
    )
    .await?;
    Ok(())
}

async fn migrate_inner(
    pool: &PgPool,
    schema: &SchemaName,
    rings: RingSizes,
) -> Result<MigrateReport> {
    rings.validate()?;
    let mut tx = pool.begin().await?;
    // READ COMMITTED whatever the role's default: a migrator that waited for the lock must see
    // what the previous holder committed (a snapshot taken before the wait would not).
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    // A transaction-level lock: released by commit, rollback, or the connection's end. A session
    // lock would stay with a pooled connection whose migrate future was dropped mid-way.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(migration_lock_key(schema))
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let report = migrate_locked(&mut tx, schema, rings).await?;
    tx.commit().await?;
    Ok(report)
}

async fn migrate_locked(
    conn: &mut PgConnection,
    schema: &SchemaName,
    rings: RingSizes,
) -> Result<MigrateReport> {
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema exists: a
    // migrator given a schema made for it (`CREATE SCHEMA ... AUTHORIZATION`) has only that
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema.as_str())
            .persistent(false)
            .fetch_one(&mut *conn)
            .await?;
    if !exists {
        sqlx::Executor::execute(&mut *conn, format!("CREATE SCHEMA {schema}").as_str()).await?;
    }
    sqlx::Executor::execute(
        &mut *conn,
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
                 version    int PRIMARY KEY,
                 name       text NOT NULL,
                 checksum   text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS {schema}.schema_functions (
                 install_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 checksum     text NOT NULL,
                 installed_at timestamptz NOT NULL DEFAULT now());"
        )
        .as_str(),
    )
    .await?;
    let has_checksums: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                        WHERE table_schema = $1 AND table_name = 'schema_migrations' AND column_name = 'checksum')",
    )
    .bind(schema.as_str())
    .persistent(false)
    .fetch_one(&mut *conn)
    .await?;
    if !has_checksums {
        return Err(Error::SchemaMismatch {
            schema: schema.to_string(),
            reason: "it was created by a development build from before the baseline migration \
                     (schema_migrations has no checksum column); drop the schema and migrate again"
                .to_string(),
        });
    }
    let recorded: Vec<(i32, String, String)> = sqlx::query_as(&format!(
        "SELECT version, name, checksum FROM {schema}.schema_migrations ORDER BY version"
    ))
    .persistent(false)
    .fetch_all(&mut *conn)
    .await?;
    check_not_newer(schema, recorded.last().map(|(version, _, _)| *version))?;
    for (version, name, checksum) in &recorded {
        let Some((known_name, sql)) = usize::try_from(*version - 1)
            .ok()
            .and_then(|index| MIGRATIONS.get(index))
        else {
            return Err(Error::SchemaMismatch {
                schema: schema.to_string(),
                reason: format!("schema_migrations records an unknown version {version} ({name})"),
            });
        };
        let expected = migration_checksum(sql);
        if *checksum != expected {
            return Err(Error::SchemaMismatch {
                schema: schema.to_string(),
                reason: format!(
                    "migration {version} ({name}) was recorded with checksum {checksum}, but this \
                     binary's migration {version} ({known_name}) has checksum {expected}: the database \
                     was migrated by a binary with a different schema at the same version"
                ),
            });
        }
    }
    let mut applied = Vec::new();
    for (index, (name, sql)) in MIGRATIONS.iter().enumerate() {
        let version = index as i32 + 1;
        if recorded.iter().any(|(v, _, _)| *v == version) {
            continue;
        }
        sqlx::Executor::execute(&mut *conn, render(sql, schema, rings).as_str()).await?;
        sqlx::query(&format!(
            "INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
        ))
        .bind(version)
        .bind(*name)
        .bind(migration_checksum(sql))
        .persistent(false)
        .execute(&mut *conn)
        .await?;
        applied.push(version);
    }

    let functions_checksum = functions_checksum();
    let installed = installed_functions_checksum(&mut *conn, schema).await?;
    let functions_reloaded = installed.as_deref() != Some(functions_checksum.as_str());
    if functions_reloaded {
        for (_, sql) in FUNCTION_FILES {
            sqlx::Executor::execute(&mut *conn, render(sql, schema, rings).as_str()).await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {schema}.schema_functions (checksum) VALUES ($1)"
        ))
        .bind(&functions_checksum)
        .persistent(false)
        .execute(&mut *conn)
        .await?;
    }
    Ok(MigrateReport {
        applied,
        functions_checksum,
        functions_reloaded,
    })
}

/// The session advisory lock key the maintenance leader of `schema` holds. In `pg_locks` it shows
/// as `locktype = 'advisory'`, `classid` = its high 32 bits, `objid` = its low 32 bits,
/// `objsubid = 1`: the session holding it is the leader.
pub fn leader_lock_key(schema: &SchemaName) -> i64 {
    // FNV-1a: stable across processes and releases (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("ringwork-leader:{schema}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_validated() {
        assert!(SchemaName::new("ringwork").is_ok());
        assert!(SchemaName::new("_t1").is_ok());
        for bad in [
            "",
            "Ring",
            "a-b",
            "a;drop",
            "pg_x",
            "1abc",
            "a\0b",
            &"x".repeat(41),
            "user",
            "select",
            "table",
            "time",
            "int",
        ] {
            assert!(SchemaName::new(bad).is_err(), "{bad:?} accepted");
        }
        // unreserved key words are fine unquoted
        assert!(SchemaName::new("jobs").is_ok());
        assert!(SchemaName::new("queue").is_ok());
        assert!(RESERVED_WORDS.windows(2).all(|w| w[0] < w[1]), "sorted");
    }

    /// Every function is defined in exactly one plane file (its overloads beside it), each
    /// signature once; no migration defines one.
    #[test]
    fn every_function_has_exactly_one_home() {
        let mut home = std::collections::HashMap::new();
        let mut signatures = std::collections::HashSet::new();
        for (file, sql) in FUNCTION_FILES {
            for (at, _) in sql.match_indices("CREATE OR REPLACE FUNCTION __S__.") {
                let rest = &sql[at + "CREATE OR REPLACE FUNCTION __S__.".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if let Some(other) = home.insert(name.clone(), *file) {
                    assert_eq!(other, *file, "{name} is defined in {other} and in {file}");
                }
                // the name and its arguments, up to RETURNS, in words
                let signature: Vec<&str> = rest[..rest.find("RETURNS").unwrap_or(rest.len())]
                    .split_whitespace()
                    .collect();
                assert!(
                    signatures.insert(signature.join(" ")),
                    "{file} defines {name} twice with the same arguments"
                );
            }
            assert!(
                !sql.contains("CREATE FUNCTION"),
                "{file}: use CREATE OR REPLACE"
            );
        }
        for name in [
            "claim",
            "complete_batch",
            "close_batch",
            "rescue",
            "prune_queue_slot",
        ] {
            assert!(home.contains_key(name), "{name} has no home");
        }
        for (name, sql) in MIGRATIONS {
            assert!(
                !sql.to_uppercase().contains(" FUNCTION "),
                "migration {name} defines or alters a function"
            );
        }
    }

    #[test]
    fn ring_children_inherit_their_parent_class() {
        assert_eq!(churn_class("ready_entries_12"), Some(ChurnClass::Ring));
        assert_eq!(
            churn_class("lease_claim_closure_batches_0"),
            Some(ChurnClass::Ring)
        );
        assert_eq!(churn_class("deferred_jobs"), Some(ChurnClass::Backlog));
        assert_eq!(churn_class("nope"), None);
    }
}
