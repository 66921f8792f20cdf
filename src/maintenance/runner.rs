//! Leader election and the maintenance loop. Leadership is a session advisory lock held on a
//! dedicated connection, kept out of the pool while this process leads; if that connection dies the
//! lock dies with it and another process takes over on its next tick.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{tick, MaintenanceConfig};
use crate::storage::Storage;

fn leader_key(storage: &Storage) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in format!("ringwork-leader:{}", storage.schema()).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

pub(crate) async fn run(
    storage: Storage,
    config: MaintenanceConfig,
    mut stop: watch::Receiver<bool>,
) {
    let key = leader_key(&storage);
    let mut leader: Option<PoolConnection<Postgres>> = None;
    loop {
        if leader.is_none() {
            leader = try_lead(&storage, key).await;
        } else if let Some(conn) = leader.as_mut() {
            // still ours? (a dead connection means the lock is gone)
            if sqlx::query("SELECT 1").execute(&mut **conn).await.is_err() {
                warn!("maintenance leader connection lost; re-electing");
                leader = None;
            }
        }
        if leader.is_some() {
            if let Err(e) = tick(&storage, &config).await {
                warn!(error = %e, "maintenance tick failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.tick) => {}
            _ = stop.changed() => break,
        }
    }
    if let Some(mut conn) = leader {
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await;
    }
}

async fn try_lead(storage: &Storage, key: i64) -> Option<PoolConnection<Postgres>> {
    let mut conn = storage.pool().acquire().await.ok()?;
    let won: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .ok()?;
    if won {
        debug!("elected maintenance leader");
        // keep this connection out of the pool for as long as we lead
        Some(conn)
    } else {
        None
    }
}
