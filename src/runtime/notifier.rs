//! LISTEN/NOTIFY: enqueue notifications wake the queue's dispatcher; cancel notifications signal a
//! running attempt's handler; maintenance notifications (a deferred job due sooner, a moved engine
//! clock) reach the maintenance loop.
//!
//! Every process of a fleet hears every enqueue NOTIFY. Had each claimed at once, each enqueue
//! would cost a claim per process, all but one of them empty (8x4 at 400 jobs/s: about eight
//! claims per enqueue, 60 % of the database's time). So one process per queue is its **first
//! responder**: it holds a session advisory lock keyed by the queue on its LISTEN session, and
//! wakes its dispatcher at once. The others wake theirs `FOLLOWER_WAKE_DELAY` later, once for all
//! the notifications of that interval: a responder that is busy, frozen or gone costs a job that
//! much pickup latency, never its pickup. A responder that dies ends its session and so frees the
//! lock; the others try it every `RESPONDER_RETRY`. No row is written for any of this.
//!
//! A follower whose delayed claims keep finding nothing (the responder keeps up) waits longer for
//! the next: the delay doubles at each empty claim in a row, up to `FOLLOWER_WAKE_DELAY_MAX`, and
//! falls back to `FOLLOWER_WAKE_DELAY` at the first claim that takes a job. So a follower costs a
//! few claims a second however fast jobs arrive, and one whose responder stopped claiming picks
//! up the next job within the longest delay, the ones after within the shortest.
//!
//! A responder that is **full** when a notification arrives (its dispatcher waits for room: every
//! worker busy with jobs too long to claim ahead of, or as many jobs claimed ahead as it may hold)
//! cannot take the new work, so it passes the notification on, on the schema's overflow channel,
//! and every follower wakes its dispatcher at once: a fleet whose responder is busy picks up
//! without the follower's delay (decision 019). It costs one NOTIFY, and a claim by each follower
//! with room, only while the responder is full; a responder with room passes nothing on.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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

/// How long after an enqueue NOTIFY a process that is not the queue's first responder wakes its
/// dispatcher (the module's comment): long enough that most notifications of a steady stream share
/// one wake-up (at 400 jobs/s a producer notifies every 10 to 15 ms), short enough to be the pickup
/// latency a fleet pays while its responder cannot claim.
pub const FOLLOWER_WAKE_DELAY: Duration = Duration::from_millis(50);

/// The longest a follower waits after a NOTIFY (the module's comment): `FOLLOWER_WAKE_DELAY`
/// doubled at each of its last empty claims, at most three times.
pub const FOLLOWER_WAKE_DELAY_MAX: Duration = Duration::from_millis(400);

/// How a queue's dispatcher is woken for new work: shared by the listener and the dispatcher.
#[derive(Default)]
pub(super) struct QueueWake {
    /// Wakes the dispatcher.
    pub(super) notify: Notify,
    /// A follower's delayed wake-up is already due.
    pending: AtomicBool,
    /// The dispatcher's claims in a row that found no work at all.
    empty_claims: AtomicU32,
    /// The dispatcher is waiting for room to claim into: a notification now is passed on to the
    /// followers (the module's comment).
    full: AtomicBool,
}

impl QueueWake {
    /// After each claim of the dispatcher: whether it took a job, or found no work at all.
    /// A claim that found work held by other claimers is neither, and changes nothing.
    pub(super) fn claimed(&self, took: bool) {
        if took {
            self.empty_claims.store(0, Ordering::Relaxed);
        } else {
            let _ = self
                .empty_claims
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(1))
                });
        }
    }

    /// The dispatcher waits for room (true) or has some (false).
    pub(super) fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::Relaxed);
    }

    /// How long after a NOTIFY a follower wakes its dispatcher now.
    fn follower_delay(&self) -> Duration {
        let doublings = self.empty_claims.load(Ordering::Relaxed).min(8);
        (FOLLOWER_WAKE_DELAY * (1 << doublings)).min(FOLLOWER_WAKE_DELAY_MAX)
    }
}

/// How often a process tries the first-responder locks of its queues that another process holds.
const RESPONDER_RETRY: Duration = Duration::from_secs(5);

/// Take the first-responder lock of each of `queues` that no other session holds, on the LISTEN
/// session: the queues taken. A session lock, so it lasts as long as the session.
async fn take_responders(
    conn: &mut PgListener,
    schema: &crate::schema::SchemaName,
    queues: &[String],
) -> sqlx::Result<Vec<String>> {
    if queues.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_scalar(&format!(
        "SELECT q FROM unnest($1::text[]) q \
         WHERE pg_try_advisory_lock({schema}.lock_ns('responder'), hashtext(q))"
    ))
    .bind(queues)
    .fetch_all(conn)
    .await
}

/// Give up the first-responder locks of `queues` before the LISTEN session goes back to the pool
/// (a pooled session holding them would keep every process of the fleet a follower). A session
/// that is gone has released them already.
async fn release_responders(
    conn: &mut PgListener,
    schema: &crate::schema::SchemaName,
    queues: &HashSet<String>,
) {
    if queues.is_empty() {
        return;
    }
    let queues: Vec<&String> = queues.iter().collect();
    let _ = sqlx::query(&format!(
        "SELECT pg_advisory_unlock({schema}.lock_ns('responder'), hashtext(q)) FROM unnest($1::text[]) q"
    ))
    .bind(queues)
    .execute(conn)
    .await;
}

/// Pass a notification of `queue` on to the followers (a full responder: the module's comment).
/// Without waiting for its commit to be flushed (a NOTIFY takes a transaction id, so its commit
/// would wait for the WAL flush: here a notification lost to a crash costs only a follower's
/// delay). A failure is left to the listener's next statement to find: the followers' delayed
/// wake-up still runs the work.
async fn pass_on(conn: &mut PgListener, overflow_channel: &str, queue: &str) {
    if let Err(e) =
        sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
            .bind(overflow_channel)
            .bind(queue)
            .execute(conn)
            .await
    {
        debug!(error = %e, "could not pass a notification on to the followers");
    }
}

/// Wake a queue's dispatcher a follower's delay from now, unless a wake-up is already due then.
fn wake_later(wake: &Arc<QueueWake>) {
    if wake.pending.swap(true, Ordering::AcqRel) {
        return;
    }
    let wake = Arc::clone(wake);
    tokio::spawn(async move {
        tokio::time::sleep(wake.follower_delay()).await;
        // before the wake: a NOTIFY that arrives after it schedules the next one
        wake.pending.store(false, Ordering::Release);
        wake.notify.notify_one();
    });
}

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
    wakers: Arc<HashMap<String, Arc<QueueWake>>>,
    listening: Arc<AtomicBool>,
    maintenance: Arc<Signals>,
    mut stop: watch::Receiver<bool>,
) {
    let wake_all = || {
        for w in wakers.values() {
            w.notify.notify_one();
        }
    };
    let storage = &inner.engine;
    // LISTEN needs a session of its own: none behind a transaction pooler without a direct pool
    let Some(session) = storage.session_pool() else {
        debug!("no session pool for LISTEN; dispatchers poll");
        return;
    };
    let schema = storage.schema();
    let queues: Vec<String> = wakers.keys().cloned().collect();
    let channel = schema.notify_channel();
    let cancel_channel = schema.cancel_channel();
    let maintenance_channel = schema.maintenance_channel();
    let overflow_channel = schema.overflow_channel();
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
        // the queues this session answers first; before the LISTEN, like the name (a follower's
        // tries every RESPONDER_RETRY replace its LISTEN as the session's last statement)
        let mut responding: HashSet<String> = take_responders(&mut listener, schema, &queues)
            .await
            .unwrap_or_else(|e| {
                debug!(error = %e, "could not try the first-responder locks");
                Vec::new()
            })
            .into_iter()
            .collect();
        if let Err(e) = listener
            .listen_all([
                channel.as_str(),
                cancel_channel.as_str(),
                maintenance_channel.as_str(),
                overflow_channel.as_str(),
            ])
            .await
        {
            debug!(error = %e, "LISTEN failed; polling only for now");
            release_responders(&mut listener, schema, &responding).await;
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
        let mut retry = tokio::time::interval(RESPONDER_RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        retry.reset();
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
                    // a full responder passed a notification on: a follower wakes at once
                    Ok(Some(n)) if n.channel() == overflow_channel => {
                        let queue = n.payload();
                        if let Some(w) = wakers.get(queue) {
                            if !responding.contains(queue) {
                                w.notify.notify_one();
                            }
                        }
                    }
                    Ok(Some(n)) => {
                        let queue = n.payload();
                        if let Some(w) = wakers.get(queue) {
                            if responding.contains(queue) {
                                w.notify.notify_one();
                                if w.full.load(Ordering::Relaxed) {
                                    pass_on(&mut listener, &overflow_channel, queue).await;
                                }
                            } else {
                                wake_later(w);
                            }
                        }
                    }
                    // connection lost: back to polling, and wake everyone (notifications may
                    // have been missed); reconnect
                    Ok(None) => {
                        listening.store(false, Ordering::Relaxed);
                        wake_all();
                        break;
                    }
                    // an error need not have ended the session, which goes back to the pool
                    Err(_) => {
                        listening.store(false, Ordering::Relaxed);
                        wake_all();
                        release_responders(&mut listener, schema, &responding).await;
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
                // an interval, not a sleep made anew each turn: NOTIFYs every few milliseconds
                // would put a sleep off for ever
                _ = retry.tick(), if responding.len() < queues.len() => {
                    let others: Vec<String> = queues
                        .iter()
                        .filter(|q| !responding.contains(*q))
                        .cloned()
                        .collect();
                    // the try is the follower's ping too: the 30-s sleep above never completes
                    // beside a 5-s interval
                    match take_responders(&mut listener, schema, &others).await {
                        Ok(taken) => responding.extend(taken),
                        Err(_) => {
                            listening.store(false, Ordering::Relaxed);
                            wake_all();
                            release_responders(&mut listener, schema, &responding).await;
                            break;
                        }
                    }
                }
                _ = stop.changed() => {
                    listening.store(false, Ordering::Relaxed);
                    release_responders(&mut listener, schema, &responding).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `wake` holds a wake-up now (taking it).
    async fn woken(wake: &QueueWake) -> bool {
        tokio::time::timeout(Duration::ZERO, wake.notify.notified())
            .await
            .is_ok()
    }

    /// A follower's notifications within one delay share one wake-up, `FOLLOWER_WAKE_DELAY` after
    /// the first; one after that wake-up schedules the next.
    #[tokio::test(start_paused = true)]
    async fn a_followers_notifications_within_the_delay_share_one_wake_up() {
        let wake = Arc::new(QueueWake::default());
        for _ in 0..10 {
            wake_later(&wake);
        }
        tokio::time::sleep(FOLLOWER_WAKE_DELAY - Duration::from_millis(1)).await;
        assert!(!woken(&wake).await, "woken before the delay");
        wake_later(&wake);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(woken(&wake).await, "not woken after the delay");
        tokio::time::sleep(FOLLOWER_WAKE_DELAY * 2).await;
        assert!(
            !woken(&wake).await,
            "woken twice for one delay's notifications"
        );
        wake_later(&wake);
        tokio::time::sleep(FOLLOWER_WAKE_DELAY + Duration::from_millis(1)).await;
        assert!(woken(&wake).await, "a later notification was not woken for");
    }

    /// Whether a wake-up scheduled now comes after `delay`, and not before.
    async fn wakes_after(wake: &Arc<QueueWake>, delay: Duration) -> bool {
        wake_later(wake);
        tokio::time::sleep(delay - Duration::from_millis(1)).await;
        let early = woken(wake).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        !early && woken(wake).await
    }

    /// Each empty claim doubles a follower's delay, up to `FOLLOWER_WAKE_DELAY_MAX`; a claim that
    /// found work held by others changes nothing; one that took a job brings back the shortest.
    #[tokio::test(start_paused = true)]
    async fn a_followers_delay_grows_with_its_empty_claims_and_resets_when_it_takes_a_job() {
        let wake = Arc::new(QueueWake::default());
        assert!(wakes_after(&wake, FOLLOWER_WAKE_DELAY).await);
        wake.claimed(false);
        assert!(wakes_after(&wake, FOLLOWER_WAKE_DELAY * 2).await);
        wake.claimed(false);
        assert!(wakes_after(&wake, FOLLOWER_WAKE_DELAY * 4).await);
        for _ in 0..20 {
            wake.claimed(false);
        }
        assert!(wakes_after(&wake, FOLLOWER_WAKE_DELAY_MAX).await);
        wake.claimed(true);
        assert!(wakes_after(&wake, FOLLOWER_WAKE_DELAY).await);
    }
}
