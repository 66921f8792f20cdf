//! Unique jobs: expiry of the keys of jobs that ended (`sql/functions/unique.sql`). Ordinary row
//! vacuum, off the hot path.

use std::time::Duration;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    unique_keys_expire: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            unique_keys_expire: format!(
                "SELECT {s}.unique_keys_expire(make_interval(secs => $1), $2)"
            ),
        }
    }
}

impl Storage {
    /// Forget up to `limit` unique keys older than `older` whose job is no longer pending.
    pub async fn unique_keys_expire(&self, older: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.unique.unique_keys_expire)
            .bind(older.as_secs_f64())
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }
}
