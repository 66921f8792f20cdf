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
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            horizon_holders: format!(
                "SELECT kind, holder, pid, usename, application, client, backend_state, held_since, \
                 xmin_age, query FROM {s}.horizon_holders(make_interval(secs => $1))"
            ),
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

impl Storage {
    /// The horizon canary: every session whose transaction has been open at least `min_age` and
    /// holds an xmin or xid, every replication slot holding an xmin, every prepared transaction
    /// older than `min_age`; oldest xmin first. Reads only `pg_stat_activity`,
    /// `pg_replication_slots` and `pg_prepared_xacts`.
    pub async fn horizon_holders(&self, min_age: Duration) -> Result<Vec<HorizonHolder>> {
        Ok(sqlx::query_as(&self.sql.health.horizon_holders)
            .bind(min_age.as_secs_f64())
            .fetch_all(&self.pool)
            .await?)
    }
}
