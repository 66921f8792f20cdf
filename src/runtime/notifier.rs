//! LISTEN/NOTIFY: enqueue notifications wake the queue's dispatcher; cancel notifications signal a
//! running attempt's handler; maintenance notifications (a deferred job due sooner, a moved engine
//! clock) reach the maintenance loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{watch, Notify};
use tracing::debug;

use super::Inner;
use crate::maintenance::Signals;

/// `cancel_job` notifies "job_id:run_lease" of a running attempt it closed; tell its handler.
pub(super) fn signal_cancel(inner: &Inner, payload: &str) {
    let parsed = payload
        .split_once(':')
        .and_then(|(job, lease)| Some((job.parse::<i64>().ok()?, lease.parse::<i64>().ok()?)));
    if let (Some(key), Ok(running)) = (parsed, inner.running.lock()) {
        if let Some(r) = running.get(&key) {
            r.cancel.set();
        }
    }
}

/// How often the listener's connection is checked with a statement while it waits.
const LISTENER_PING: Duration = Duration::from_secs(30);

/// Name the session (application_name) unless the application's pool named it: one row when
/// it did.
pub(crate) const NAME_IF_UNNAMED: &str = "SELECT set_config('application_name', $1, false) \
     WHERE current_setting('application_name') = ''";

/// LISTEN for enqueue notifications and wake the matching dispatcher. Reconnects on failure; the
/// dispatchers' poll interval covers the gap (and PgBouncer transaction pooling, where LISTEN
/// does not work at all). `listening` is true while the LISTEN is in place: idle dispatchers then
/// wait longer between claims (`IDLE_POLL_MAX`).
pub(super) async fn listen(
    inner: Arc<Inner>,
    wakers: Arc<HashMap<String, Arc<Notify>>>,
    listening: Arc<AtomicBool>,
    maintenance: Arc<Signals>,
    mut stop: watch::Receiver<bool>,
) {
    let wake_all = || {
        for w in wakers.values() {
            w.notify_one();
        }
    };
    let storage = &inner.engine;
    // LISTEN needs a session of its own: none behind a transaction pooler without a direct pool
    let Some(session) = storage.session_pool() else {
        debug!("no session pool for LISTEN; dispatchers poll");
        return;
    };
    let channel = storage.schema().notify_channel();
    let cancel_channel = format!("{channel}_cancel");
    let maintenance_channel = format!("{channel}_maintenance");
    loop {
        let mut listener = match PgListener::connect_with(session).await {
            Ok(l) => l,
            Err(e) => {
                debug!(error = %e, "listener connect failed; polling only for now");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        // The session names this process, so that operators (and the dashboard's processes
        // page) see who works the schema in pg_stat_activity; a name the pool's own settings
        // gave it is the application's, and stays. Before the LISTEN, so that the session's last
        // statement in pg_stat_activity stays its LISTEN.
        let named = match sqlx::query_scalar::<_, String>(NAME_IF_UNNAMED)
            .bind(storage.schema().session_name(None))
            .fetch_optional(&mut listener)
            .await
        {
            Ok(named) => named.is_some(),
            Err(e) => {
                debug!(error = %e, "could not name the LISTEN session");
                false
            }
        };
        if let Err(e) = listener
            .listen_all([
                channel.as_str(),
                cancel_channel.as_str(),
                maintenance_channel.as_str(),
            ])
            .await
        {
            debug!(error = %e, "LISTEN failed; polling only for now");
            // the session may go back to the pool: it does not stand for this process there
            if named {
                let _ = sqlx::query("RESET application_name")
                    .execute(&mut listener)
                    .await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                _ = stop.changed() => return,
            }
        }
        // Work enqueued before the LISTEN took effect sent its NOTIFY to nobody: every dispatcher
        // claims once now, before it may wait long.
        listening.store(true, Ordering::Relaxed);
        wake_all();
        maintenance.missed();
        loop {
            tokio::select! {
                message = listener.try_recv() => match message {
                    Ok(Some(n)) if n.channel() == cancel_channel => signal_cancel(&inner, n.payload()),
                    Ok(Some(n)) if n.channel() == maintenance_channel => {
                        let signal = match n.payload() {
                            "clock" => &maintenance.clock,
                            _ => &maintenance.deferred,
                        };
                        signal.store(true, Ordering::Relaxed);
                    }
                    Ok(Some(n)) => {
                        if let Some(w) = wakers.get(n.payload()) {
                            w.notify_one();
                        }
                    }
                    // connection lost: back to polling, and wake everyone (notifications may
                    // have been missed); reconnect
                    Ok(None) | Err(_) => {
                        listening.store(false, Ordering::Relaxed);
                        wake_all();
                        break;
                    }
                },
                // a connection a middlebox dropped silently never errors while it only listens:
                // idle dispatchers would wait IDLE_POLL_MAX for every job until it did
                _ = tokio::time::sleep(LISTENER_PING) => {
                    if sqlx::query("SELECT 1").execute(&mut listener).await.is_err() {
                        listening.store(false, Ordering::Relaxed);
                        wake_all();
                        break;
                    }
                }
                _ = stop.changed() => {
                    listening.store(false, Ordering::Relaxed);
                    // the session goes back to the pool: it no longer stands for this process
                    if named {
                        let _ = sqlx::query("RESET application_name").execute(&mut listener).await;
                    }
                    return;
                }
            }
        }
    }
}
