//! Rescue: stale and deadline rescue over the claim ring's per-slot cursors
//! (`sql/functions/rescue.sql`). Rescue is the gating step for prune: an open claim blocks its slot.

use std::time::Duration;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    rescue: String,
    rescue_and_callbacks_waiting: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            rescue: format!("SELECT {s}.rescue(make_interval(secs => $1), $2)"),
            rescue_and_callbacks_waiting: format!(
                "SELECT {s}.rescue(make_interval(secs => $1), $2), {s}.callbacks_waiting()"
            ),
        }
    }
}

impl Storage {
    /// One rescue pass (deadline, then stale) over every claim slot. Returns attempts closed.
    pub async fn rescue(&self, stale_after: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.rescue.rescue)
            .bind(stale_after.as_secs_f64())
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }

    /// [`Storage::rescue`], and whether any attempt waits for a callback (else
    /// [`Storage::rescue_callbacks`] has nothing to look at), in one statement.
    pub async fn rescue_and_callbacks_waiting(
        &self,
        stale_after: Duration,
        limit: i32,
    ) -> Result<(i32, bool)> {
        Ok(
            sqlx::query_as(&self.sql.rescue.rescue_and_callbacks_waiting)
                .bind(stale_after.as_secs_f64())
                .bind(limit)
                .fetch_one(self.db())
                .await?,
        )
    }
}
