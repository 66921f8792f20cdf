//! Who reaches the dashboard and who is signed in.
//!
//! - **Host allow-list.** A page on another site whose name is rebound to 127.0.0.1 (DNS rebinding)
//!   talks to the dashboard as its own origin: cookies, `Origin` and `Sec-Fetch-Site` all look
//!   same-site to the browser. Only the `Host` it sends gives it away, so every request must name
//!   a host the dashboard was told it is served as (loopback names always).
//! - **Sessions** live in this process: a random id per sign-in, expiring, dropped at sign-out. A
//!   cookie from before a restart or after sign-out opens nothing.
//! - **Sign-in throttling**: after a few wrong tokens in a minute, sign-in is refused until the
//!   minute has passed, whatever the token, so the token cannot be guessed at speed.
//!
//! Time is passed in (`now`), so the rules are tested without waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::bytes::hex;

/// How long a sign-in lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; the oldest goes first beyond it.
const MAX_SESSIONS: usize = 1024;
/// Wrong tokens accepted within `FAILURE_WINDOW` before sign-in is refused for the rest of it.
const FAILURES_ALLOWED: usize = 5;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// The host names the dashboard answers for.
#[derive(Clone, Debug)]
pub(crate) struct Hosts(Vec<String>);

impl Hosts {
    /// Loopback names, and `extra` (names or addresses, without a port).
    pub(crate) fn new(extra: &[String]) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|h| h.to_string())
            .collect();
        for host in extra {
            let host = host.trim().to_ascii_lowercase();
            let host = match host.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("[{host}]"),
                // a port given with the name is not part of it: requests are matched without theirs
                Err(_) => host_of(&host).to_string(),
            };
            if !host.is_empty() && !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        Self(hosts)
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.0
    }

    /// Does this `Host` (or `Origin` authority: `name[:port]`) name one of the hosts?
    pub(crate) fn allows(&self, authority: &str) -> bool {
        let host = host_of(authority).to_ascii_lowercase();
        self.0.contains(&host)
    }
}

/// The host of an authority, without its port (`[::1]:80` → `[::1]`, `a.b:8080` → `a.b`).
fn host_of(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// Signed-in sessions and recent failed sign-ins.
#[derive(Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<String, Instant>>,
    failures: Mutex<VecDeque<Instant>>,
}

impl Sessions {
    /// A new session, valid until `now + SESSION_TTL`: its id, for the cookie.
    pub(crate) fn open(&self, now: Instant) -> String {
        let id = hex(&rand::random::<[u8; 32]>());
        let mut live = lock(&self.live);
        live.retain(|_, expires| *expires > now);
        while live.len() >= MAX_SESSIONS {
            let Some(oldest) = live
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            live.remove(&oldest);
        }
        live.insert(id.clone(), now + SESSION_TTL);
        id
    }

    pub(crate) fn is_live(&self, id: &str, now: Instant) -> bool {
        // a constant-time comparison is not needed: the id is looked up by hash, and a miss
        // reveals nothing about the ids that exist
        lock(&self.live)
            .get(id)
            .is_some_and(|expires| *expires > now)
    }

    pub(crate) fn close(&self, id: &str) {
        lock(&self.live).remove(id);
    }

    /// While too many sign-ins failed recently: how long until the next one is tried.
    pub(crate) fn throttled(&self, now: Instant) -> Option<Duration> {
        let mut failures = lock(&self.failures);
        while failures
            .front()
            .is_some_and(|at| now.duration_since(*at) >= FAILURE_WINDOW)
        {
            failures.pop_front();
        }
        if failures.len() < FAILURES_ALLOWED {
            return None;
        }
        failures
            .front()
            .map(|first| FAILURE_WINDOW.saturating_sub(now.duration_since(*first)))
    }

    pub(crate) fn failed(&self, now: Instant) {
        let mut failures = lock(&self.failures);
        failures.push_back(now);
        while failures.len() > FAILURES_ALLOWED {
            failures.pop_front();
        }
    }
}

/// A poisoned lock only means a panic elsewhere while it was held; the data is still whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_allow_loopback_and_the_configured_names_only() {
        let hosts = Hosts::new(&[
            "Jobs.Example.com".into(),
            "::2".into(),
            "ops.example.com:8443".into(),
        ]);
        for ok in [
            "localhost",
            "127.0.0.1:9464",
            "[::1]:80",
            "jobs.example.com",
            "JOBS.example.com:443",
            "[::2]",
            "ops.example.com:8443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "127.0.0.2",
            "localhost.evil.example",
            "",
            "[::1",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
    }

    #[test]
    fn sessions_expire_and_close() {
        let sessions = Sessions::default();
        let start = Instant::now();
        let a = sessions.open(start);
        let b = sessions.open(start);
        assert_ne!(a, b, "every sign-in gets a new id");
        assert!(sessions.is_live(&a, start + Duration::from_secs(3600)));
        assert!(!sessions.is_live(&a, start + SESSION_TTL));
        sessions.close(&b);
        assert!(!sessions.is_live(&b, start));
        assert!(!sessions.is_live("not-a-session", start));
    }

    #[test]
    fn sign_in_is_throttled_after_repeated_failures_for_the_rest_of_the_window() {
        let sessions = Sessions::default();
        let start = Instant::now();
        for i in 0..FAILURES_ALLOWED {
            assert_eq!(sessions.throttled(start), None, "failure {i}");
            sessions.failed(start + Duration::from_secs(i as u64));
        }
        let wait = sessions.throttled(start + Duration::from_secs(10)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
        assert_eq!(sessions.throttled(start + FAILURE_WINDOW), None);
    }
}
