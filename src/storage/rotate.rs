//! Rotation of both rings: moving the write slot on once it is old enough and in use
//! (`sql/functions/rotate.sql`).

use std::time::Duration;

use super::Storage;
use crate::error::Result;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    rotate_queue_ring: String,
    rotate_claim_ring: String,
    rotation_due: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            rotate_queue_ring: format!("SELECT {s}.rotate_queue_ring(make_interval(secs => $1))"),
            rotate_claim_ring: format!("SELECT {s}.rotate_claim_ring(make_interval(secs => $1))"),
            rotation_due: format!(
                "SELECT extract(epoch FROM {s}.rotation_due(make_interval(secs => $1)))::float8"
            ),
        }
    }
}

impl Storage {
    /// Rotate the queue ring if its current slot is older than `min_age` and in use.
    pub async fn rotate_queue_ring(&self, min_age: Duration) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.rotate.rotate_queue_ring)
            .bind(min_age.as_secs_f64())
            .fetch_one(self.db())
            .await?)
    }

    /// Rotate the claim ring if its current slot is older than `min_age` and in use.
    pub async fn rotate_claim_ring(&self, min_age: Duration) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.rotate.rotate_claim_ring)
            .bind(min_age.as_secs_f64())
            .fetch_one(self.db())
            .await?)
    }

    /// How long until a ring (queue, claim or lease) could rotate with `min_age`: zero when one
    /// could now, `None` while no ring's current slot was written.
    pub async fn rotation_due(&self, min_age: Duration) -> Result<Option<Duration>> {
        let due: Option<f64> = sqlx::query_scalar(&self.sql.rotate.rotation_due)
            .bind(min_age.as_secs_f64())
            .fetch_one(self.db())
            .await?;
        Ok(due.map(super::deferred::seconds))
    }
}
