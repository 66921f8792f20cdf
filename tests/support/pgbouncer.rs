//! A real PgBouncer in front of the test server (`ringwork::embedded::PgBouncer`), for
//! `tests/pgbouncer.rs`, `tests/failover.rs` and the test binaries that `.ci/run` runs through
//! one (`RINGWORK_TEST_PGBOUNCER=1`, see `TestDb`), with pools set up as a service behind it would.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::embedded::{self, BouncerTarget};

/// A pgbouncer process in front of a server; killed on drop.
pub struct PgBouncer {
    bouncer: embedded::PgBouncer,
    user: String,
    pub url: String,
}

impl PgBouncer {
    /// Start one in transaction mode with `server_connections` server connections per database.
    pub fn start(server_url: &str, server_connections: u32) -> Self {
        Self::start_in(server_url, server_connections, "transaction")
    }

    /// Start one with `pool_mode` (`session` or `transaction`) for every database but `session`
    /// (see `embedded::PgBouncer`). `url` names the server URL's database.
    pub fn start_in(server_url: &str, server_connections: u32, pool_mode: &str) -> Self {
        let server: PgConnectOptions = server_url.parse().expect("DATABASE_URL");
        let bouncer = embedded::PgBouncer::start(&target(&server), pool_mode, server_connections)
            .unwrap_or_else(|e| panic!("these tests need pgbouncer: {e}"));
        let user = server.get_username().to_string();
        let url = bouncer.url(&user, server.get_database().unwrap_or("postgres"));
        Self { bouncer, user, url }
    }

    /// Send every database to another server and reload; clients keep their connections to
    /// pgbouncer.
    pub fn repoint(&self, server_url: &str) {
        let server: PgConnectOptions = server_url.parse().expect("server url");
        self.bouncer
            .repoint(&target(&server))
            .expect("re-point pgbouncer");
    }

    /// A pool through pgbouncer, as a service behind it would configure one: sqlx's statement
    /// cache off (its own statements then go unnamed when they ask for `persistent(false)`).
    pub async fn pool(&self, max: u32) -> PgPool {
        let options: PgConnectOptions = self.url.parse().expect("pgbouncer url");
        Self::connect(options, max).await
    }

    /// `pool`, to another database of the server (pgbouncer forwards every database name).
    pub async fn pool_for(&self, database: &str, max: u32) -> PgPool {
        let options: PgConnectOptions = self
            .bouncer
            .url(&self.user, database)
            .parse()
            .expect("pgbouncer url");
        Self::connect(options, max).await
    }

    async fn connect(options: PgConnectOptions, max: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.statement_cache_capacity(0))
            .await
            .expect("connect through pgbouncer")
    }
}

fn target(server: &PgConnectOptions) -> BouncerTarget {
    BouncerTarget {
        host: server.get_host().to_string(),
        port: server.get_port(),
        user: server.get_username().to_string(),
    }
}

/// Whether pgbouncer is installed; a test that needs one returns at once when it is not (see
/// `tool_or_skip`).
pub fn installed(test: &str) -> bool {
    super::tool_or_skip(
        test,
        "pgbouncer",
        embedded::PgBouncer::installed().then_some(()),
    )
    .is_some()
}
