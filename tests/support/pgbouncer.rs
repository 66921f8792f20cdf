//! A real PgBouncer in transaction mode in front of the test server (Debian's `pgbouncer`, found on
//! PATH, in /usr/sbin, or at `$RINGWORK_PGBOUNCER`), for `tests/pgbouncer.rs` and for the test
//! binaries that `.ci/run` runs through one (`RINGWORK_TEST_PGBOUNCER=1`, see `TestDb`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::embedded;

/// A pgbouncer process in transaction mode in front of the test server; killed on drop.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    pub url: String,
}

impl PgBouncer {
    /// Start one with `server_connections` server connections for the test database.
    pub fn start(server_url: &str, server_connections: u32) -> Self {
        let binary = pgbouncer_binary().expect(
            "these tests need pgbouncer: `apt-get install pgbouncer`, or set RINGWORK_PGBOUNCER",
        );
        let server: PgConnectOptions = server_url.parse().expect("DATABASE_URL");
        let database = server.get_database().unwrap_or("postgres").to_string();
        let port = embedded::free_port().expect("a free port");
        let dir = std::env::temp_dir().join(format!(
            "ringwork-pgbouncer-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("pgbouncer dir");
        // pgbouncer refuses to run as root: it runs as `postgres` then, and writes its log here
        set_mode(&dir, 0o777);
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={host} port={server_port} user={user}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = transaction\n\
                 default_pool_size = {server_connections}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n",
                host = server.get_host(),
                server_port = server.get_port(),
                user = server.get_username(),
                log = dir.join("pgbouncer.log").display(),
            ),
        )
        .expect("pgbouncer.ini");
        set_mode(&ini, 0o644);
        let mut command = Command::new(&binary);
        if embedded::is_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&ini)
            // it logs to its logfile; an inherited stderr would outlive the test binary
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        // a watchdog stops it when the test binary exits (a static one is never dropped)
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill {} 2>/dev/null; rm -rf '{}'",
                std::process::id(),
                child.id(),
                dir.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let url = format!(
            "postgres://{}@127.0.0.1:{port}/{database}",
            server.get_username()
        );
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {port} within 10 s (log: {})",
                dir.join("pgbouncer.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, dir, url }
    }

    /// A pool through pgbouncer, as a service behind it would configure one: sqlx's statement
    /// cache off (its own statements then go unnamed when they ask for `persistent(false)`).
    pub async fn pool(&self, max: u32) -> PgPool {
        let options: PgConnectOptions = self.url.parse().expect("pgbouncer url");
        Self::connect(options, max).await
    }

    /// `pool`, to another database of the server (pgbouncer forwards every database name).
    pub async fn pool_for(&self, database: &str, max: u32) -> PgPool {
        let options: PgConnectOptions = self.url.parse().expect("pgbouncer url");
        Self::connect(options.database(database), max).await
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

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether pgbouncer is installed; a test that needs one returns at once when it is not (see
/// `tool_or_skip`).
pub fn installed(test: &str) -> bool {
    super::tool_or_skip(test, "pgbouncer", pgbouncer_binary()).is_some()
}

fn pgbouncer_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("RINGWORK_PGBOUNCER") {
        return Some(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
