//! Schema names, versioned migrations and the churn class of every table.
//!
//! Migrations are SQL files embedded in the binary. They are applied under a session advisory lock
//! so that any number of processes may start at once; each version is applied exactly once and
//! recorded in `<schema>.schema_migrations`. A database whose recorded version is newer than the
//! binary is refused before anything runs against it.

use sqlx::{PgConnection, PgPool};

use crate::error::{Error, Result};

/// The migrations this binary knows, in order. Version = position + 1.
const MIGRATIONS: &[(&str, &str)] = &[
    ("rings", include_str!("../migrations/0001_rings.sql")),
    ("engine", include_str!("../migrations/0002_engine.sql")),
    (
        "receipt_plane",
        include_str!("../migrations/0003_receipt_plane.sql"),
    ),
    (
        "lifecycle",
        include_str!("../migrations/0004_lifecycle.sql"),
    ),
    (
        "dead_letter",
        include_str!("../migrations/0005_dead_letter.sql"),
    ),
    (
        "unique_and_counts",
        include_str!("../migrations/0006_unique_and_counts.sql"),
    ),
];

/// Highest schema version this binary can run against.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// A validated PostgreSQL schema identifier (lower-case ASCII letters, digits and `_`, starting with
/// a letter or `_`, at most 40 characters). Validation, not quoting, is what keeps it safe to splice
/// into SQL text: the name also appears inside generated identifiers and NOTIFY channels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SchemaName(String);

impl SchemaName {
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
        Ok(Self(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// NOTIFY channel that enqueue signals for this schema.
    pub fn notify_channel(&self) -> String {
        format!("ringwork_{}", self.0)
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
    pub queue_slots: u32,
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
    ("queue_ring_state", ChurnClass::Warm),
    ("queue_ring_slots", ChurnClass::Warm),
    ("claim_ring_state", ChurnClass::Warm),
    ("claim_ring_slots", ChurnClass::Warm),
    ("queues", ChurnClass::Warm),
    ("queue_lanes", ChurnClass::Warm),
    ("attempt_state", ChurnClass::Warm),
    ("schema_migrations", ChurnClass::Warm),
    ("deferred_jobs", ChurnClass::Backlog),
    ("dlq_entries", ChurnClass::Backlog),
    // written only by unique inserts (INSERT, or UPDATE when a released key is re-taken) and
    // expired by maintenance in bounded batches
    ("unique_keys", ChurnClass::Backlog),
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

/// Key of the session advisory lock that serialises migrators of one schema.
fn migration_lock_key(schema: &SchemaName) -> i64 {
    // FNV-1a: stable across processes and releases (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("ringwork-migrate:{schema}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// The schema version recorded in the database, or `None` when the schema is not installed.
pub async fn installed_version(
    conn: &mut PgConnection,
    schema: &SchemaName,
) -> Result<Option<i32>> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')",
    )
    .bind(schema.as_str())
    .fetch_one(&mut *conn)
    .await?;
    if !exists {
        return Ok(None);
    }
    let version: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT max(version) FROM {schema}.schema_migrations"
    ))
    .fetch_one(&mut *conn)
    .await?;
    Ok(version)
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

/// Apply every migration the database does not have yet. Safe to call from many processes at once;
/// returns the versions this call applied.
///
/// Returns a boxed `Send` future: callers spawn it, and rustc cannot otherwise prove `Send` for a
/// future that reborrows a connection across awaits (rust-lang/rust#102211).
pub fn migrate<'a>(
    pool: &'a PgPool,
    schema: &'a SchemaName,
    rings: RingSizes,
) -> futures::future::BoxFuture<'a, Result<Vec<i32>>> {
    Box::pin(migrate_inner(pool, schema, rings))
}

async fn migrate_inner(pool: &PgPool, schema: &SchemaName, rings: RingSizes) -> Result<Vec<i32>> {
    rings.validate()?;
    let mut conn = pool.acquire().await?;
    let key = migration_lock_key(schema);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await?;
    let outcome = migrate_locked(&mut conn, schema, rings).await;
    // Release even when migrating failed; a failed unlock on a broken connection is harmless
    // because the session lock dies with the session.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await;
    outcome
}

async fn migrate_locked(
    conn: &mut PgConnection,
    schema: &SchemaName,
    rings: RingSizes,
) -> Result<Vec<i32>> {
    let current = installed_version(conn, schema).await?;
    check_not_newer(schema, current)?;
    let current = current.unwrap_or(0);
    let mut applied = Vec::new();
    for (index, (name, sql)) in MIGRATIONS.iter().enumerate() {
        let version = index as i32 + 1;
        if version <= current {
            continue;
        }
        // One simple-query message: PostgreSQL runs it as a single implicit transaction, so a
        // version is either fully applied and recorded or not at all.
        let script = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
                 version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
             {}
             ;INSERT INTO {schema}.schema_migrations (version, name) VALUES ({version}, '{name}');",
            render(sql, schema, rings)
        );
        sqlx::Executor::execute(&mut *conn, script.as_str()).await?;
        applied.push(version);
    }
    Ok(applied)
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
        ] {
            assert!(SchemaName::new(bad).is_err(), "{bad:?} accepted");
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
