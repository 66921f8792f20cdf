//! Health: the database around ringwork, for operators (`sql/functions/health.sql`).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    horizon_holders: String,
    table_health: String,
    maintenance_leader: String,
    processes: String,
    archive_spans: String,
    replica_status: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            horizon_holders: format!(
                "SELECT kind, holder, pid, usename, application, client, backend_state, held_since, \
                 xmin_age, query FROM {s}.horizon_holders(make_interval(secs => $1))"
            ),
            table_health: format!(
                "SELECT table_name, live_tuples, dead_tuples, total_bytes FROM {s}.table_health()"
            ),
            maintenance_leader: format!("SELECT {s}.maintenance_leader($1)"),
            archive_spans: format!(
                "SELECT bucket, oldest, newest, batches_estimate, rows_estimate, total_bytes \
                 FROM {s}.archive_bucket_spans()"
            ),
            processes: format!(
                "SELECT pid, application, client, connected_at, state, state_since, leader \
                 FROM {s}.processes($1)"
            ),
            // PostgreSQL's own recovery functions: nothing of the schema, so it answers the same
            // on any server and needs no migration
            replica_status: "SELECT pg_is_in_recovery(), pg_last_xact_replay_timestamp(), \
                 extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8, \
                 pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::int8, \
                 CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END"
                .to_string(),
        }
    }
}

/// Something that holds back the database's MVCC horizon, so that vacuum cannot reclaim dead rows
/// anywhere in the cluster's databases (ringwork's own tables excepted: they do not depend on it).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct HorizonHolder {
    /// `session` (a transaction or snapshot held open), `replication_slot` or
    /// `prepared_transaction`.
    pub kind: String,
    /// The pid (session), slot name or prepared transaction's gid.
    pub holder: String,
    /// The backend: the session's, or the slot's active walsender.
    pub pid: Option<i32>,
    /// The role of the session, or the prepared transaction's owner; `None` for a slot.
    pub usename: Option<String>,
    /// `application_name` (session), or the slot's output plugin.
    pub application: Option<String>,
    /// Client address (session), or the database of a slot or prepared transaction.
    pub client: Option<String>,
    /// `pg_stat_activity.state` (`idle in transaction`, ...), `active`/`inactive` for a slot,
    /// `prepared`.
    pub backend_state: Option<String>,
    /// When its transaction started (or was prepared); `None` for a slot.
    pub held_since: Option<DateTime<Utc>>,
    /// How many transactions old the xmin it holds is (`age()`).
    pub xmin_age: Option<i32>,
    /// The start of the session's current or last statement.
    pub query: Option<String>,
}

/// One archive bucket that holds history (`Storage::archive_spans`).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct ArchiveSpan {
    /// The bucket (a partition of each archive table).
    pub bucket: i32,
    /// Its oldest finalize time.
    pub oldest: chrono::DateTime<chrono::Utc>,
    /// Its newest.
    pub newest: chrono::DateTime<chrono::Utc>,
    /// Completion batches in it, as the statistics estimate them (0 before the first ANALYZE).
    pub batches_estimate: i64,
    /// Failed and cancelled job rows in it, estimated the same way.
    pub rows_estimate: i64,
    /// Bytes on disk, indexes and TOAST included.
    pub total_bytes: i64,
}

/// A process working the schema, as the server sees it (`Storage::processes`).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct ProcessSession {
    /// The backend's pid on the server.
    pub pid: i32,
    /// Its application_name: `ringwork:<schema> pid <pid> <host>` for a process's LISTEN session.
    pub application: String,
    /// The client's address (`local` over a Unix socket).
    pub client: String,
    /// When the session connected.
    pub connected_at: Option<chrono::DateTime<chrono::Utc>>,
    /// `idle`, `active`, ...
    pub state: Option<String>,
    /// Since when it is in that state.
    pub state_since: Option<chrono::DateTime<chrono::Utc>>,
    /// This backend holds the maintenance leader's lock.
    pub leader: bool,
}

/// One of ringwork's tables (a partitioned table summed over its partitions).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct TableHealth {
    /// The table's name (for a partitioned table, the parent's).
    pub table_name: String,
    /// The statistics collector's estimates (`pg_stat_user_tables`).
    pub live_tuples: i64,
    /// Dead tuples (the same estimates).
    pub dead_tuples: i64,
    /// Bytes on disk, indexes and TOAST included (`pg_total_relation_size`).
    pub total_bytes: i64,
}

/// How stale reads from a hot standby may be (`Admin::replica_status`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReplicaStatus {
    /// When the last transaction the standby replayed committed on the primary; `None` before the
    /// first one since the standby started.
    pub last_replay_at: Option<DateTime<Utc>>,
    /// Seconds from that commit to now. While the primary writes, what the standby shows is at
    /// most this old; while the primary is idle it grows although nothing is missing.
    pub replay_age_secs: Option<f64>,
    /// WAL received from the primary and not yet replayed, in bytes (replay waits on a conflict
    /// with a query, or is slower than the primary); `None` when none was received by streaming.
    pub unreplayed_bytes: Option<i64>,
    /// Replay was paused (`pg_wal_replay_pause()`): the standby shows a fixed past state.
    pub replay_paused: bool,
}

impl ReplicaStatus {
    /// One line for an operator, e.g. "read from a hot standby: last replayed commit 0.4 s old,
    /// 0 bytes received and not yet replayed".
    pub fn describe(&self) -> String {
        let age = match self.replay_age_secs {
            Some(age) => format!("last replayed commit {age:.1} s old"),
            None => "no commit replayed since it started".to_string(),
        };
        let backlog = match self.unreplayed_bytes {
            Some(bytes) => format!(", {bytes} bytes received and not yet replayed"),
            None => String::new(),
        };
        let paused = if self.replay_paused {
            "; replay is PAUSED"
        } else {
            ""
        };
        format!("read from a hot standby: {age}{backlog}{paused}")
    }
}

/// What `/readyz` reports: can this process do its work against this database?
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// A connection was acquired and answered.
    pub connected: bool,
    /// The schema's installed version is the one this binary was built for.
    pub migrated: bool,
    /// The installed SQL functions are this binary's (`ringwork migrate` installs them).
    pub functions_current: bool,
    /// The schema version installed; `None` when the schema has no migrations table.
    pub installed_version: Option<i32>,
    /// The schema version this binary was built for.
    pub expected_version: i32,
    /// The backend of the process leading maintenance (rotation, rescue, prune), if any.
    pub leader_pid: Option<i32>,
    /// Why a check failed, when one did.
    pub error: Option<String>,
}

impl Readiness {
    /// Connected, migrated to this binary's version with its functions installed, and, when
    /// `require_leader`, some process leads maintenance. A service's own pods should not require
    /// the leader: during a takeover (up to 2 x `stale_after`) every one of them would turn
    /// unready at once; an operator's `ringwork serve` does, to be told nothing rescues or prunes.
    pub fn ready(&self, require_leader: bool) -> bool {
        self.connected
            && self.migrated
            && self.functions_current
            && (!require_leader || self.leader_pid.is_some())
    }
}

impl Storage {
    /// Readiness checks, each a cheap statement; never an error (a failed check says why).
    pub async fn readiness(&self) -> Readiness {
        let mut readiness = Readiness {
            connected: false,
            migrated: false,
            functions_current: false,
            installed_version: None,
            expected_version: crate::schema::SCHEMA_VERSION,
            leader_pid: None,
            error: None,
        };
        // a transaction, so the checks also run behind a transaction pooler; it writes nothing
        let mut conn = match self.pool.begin().await {
            Ok(conn) => conn,
            Err(e) => {
                readiness.error = Some(format!("no connection: {e}"));
                return readiness;
            }
        };
        readiness.connected = true;
        match crate::schema::installed_version(&mut conn, &self.schema).await {
            Ok(version) => {
                readiness.installed_version = version;
                readiness.migrated = version == Some(crate::schema::SCHEMA_VERSION);
                if !readiness.migrated {
                    readiness.error = Some(format!(
                        "schema {} is at version {version:?}, this binary needs {}",
                        self.schema,
                        crate::schema::SCHEMA_VERSION
                    ));
                    return readiness;
                }
            }
            Err(e) => {
                readiness.error = Some(format!("cannot read the schema version: {e}"));
                return readiness;
            }
        }
        match crate::schema::installed_functions_checksum(&mut conn, &self.schema).await {
            Ok(installed) => {
                readiness.functions_current =
                    installed.as_deref() == Some(crate::schema::functions_checksum().as_str());
                if !readiness.functions_current {
                    readiness.error = Some(format!(
                        "schema {}'s SQL functions are not this binary's; run `ringwork migrate`",
                        self.schema
                    ));
                    return readiness;
                }
            }
            Err(e) => {
                readiness.error = Some(format!("cannot read the functions' checksum: {e}"));
                return readiness;
            }
        }
        match sqlx::query_scalar::<_, Option<i32>>(&self.sql.health.maintenance_leader)
            .bind(crate::schema::leader_lock_key(&self.schema))
            .fetch_one(self.on(&mut conn))
            .await
        {
            Ok(Some(pid)) => readiness.leader_pid = Some(pid),
            Ok(None) => {
                readiness.error = Some("no process leads maintenance for this schema".into())
            }
            Err(e) => readiness.error = Some(format!("cannot look up the leader: {e}")),
        }
        readiness
    }

    /// The archive's buckets that hold history, oldest first: how far back history goes and what
    /// it costs on disk (two index probes per bucket and table; never a scan).
    pub async fn archive_spans(&self) -> Result<Vec<ArchiveSpan>> {
        Ok(sqlx::query_as(&self.sql.health.archive_spans)
            .fetch_all(self.db())
            .await?)
    }

    /// The processes working the schema: the LISTEN session each keeps (named by the process
    /// with its host and pid) and the backend holding the maintenance leader's lock. Read from
    /// `pg_stat_activity`; nothing is written for it.
    pub async fn processes(&self) -> Result<Vec<ProcessSession>> {
        Ok(sqlx::query_as(&self.sql.health.processes)
            .bind(crate::schema::leader_lock_key(&self.schema))
            .fetch_all(self.db())
            .await?)
    }

    /// Live and dead tuples and size of every table of the schema, partitions summed into their
    /// parent. Dead tuples in a ring or backlog table are a defect of the storage contract.
    pub async fn table_health(&self) -> Result<Vec<TableHealth>> {
        Ok(sqlx::query_as(&self.sql.health.table_health)
            .fetch_all(self.db())
            .await?)
    }

    /// The horizon canary: every session whose transaction has been open at least `min_age` and
    /// holds an xmin or xid, every replication slot holding an xmin, every prepared transaction
    /// older than `min_age`; oldest xmin first. Reads only `pg_stat_activity`,
    /// `pg_replication_slots` and `pg_prepared_xacts`.
    pub async fn horizon_holders(&self, min_age: Duration) -> Result<Vec<HorizonHolder>> {
        Ok(sqlx::query_as(&self.sql.health.horizon_holders)
            .bind(min_age.as_secs_f64())
            .fetch_all(self.db())
            .await?)
    }

    /// `None` on a primary; on a hot standby, how far behind the primary its reads may be.
    pub async fn replica_status(&self) -> Result<Option<ReplicaStatus>> {
        let (in_recovery, last_replay_at, replay_age_secs, unreplayed_bytes, replay_paused): (
            bool,
            Option<DateTime<Utc>>,
            Option<f64>,
            Option<i64>,
            bool,
        ) = sqlx::query_as(&self.sql.health.replica_status)
            .fetch_one(self.db())
            .await?;
        Ok(in_recovery.then_some(ReplicaStatus {
            last_replay_at,
            replay_age_secs,
            unreplayed_bytes,
            replay_paused,
        }))
    }
}
