//! A real PgBouncer in transaction mode in front of the test server (Debian's `pgbouncer`, found on
//! PATH, in /usr/sbin, or at `$RINGWORK_PGBOUNCER`), for `tests/pgbouncer.rs` and for the test
//! binaries that `.ci/run` runs through one (`RINGWORK_TEST_PGBOUNCER=1`, see `TestDb`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::embedded;

/// A pgbouncer process in front of a server; killed on drop.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
    pool_mode: &'static str,
    server_connections: u32,
    pub url: String,
}

impl PgBouncer {
    /// Start one in transaction mode with `server_connections` server connections per database.
    pub fn start(server_url: &str, server_connections: u32) -> Self {
        Self::start_in(server_url, server_connections, "transaction")
    }

    /// Start one with `pool_mode` (`session` or `transaction`) for every database. The database
    /// `session` is always in session mode and leads to the server's `postgres` database: the
    /// session pool a client behind a transaction pooler needs (`ClientBuilder::transaction_pooler`).
    pub fn start_in(server_url: &str, server_connections: u32, pool_mode: &'static str) -> Self {
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
        let url = format!(
            "postgres://{}@127.0.0.1:{port}/{database}",
            server.get_username()
        );
        let ini = dir.join("pgbouncer.ini");
        let mut command = Command::new(&binary);
        if embedded::is_root() {
            command.args(["-u", "postgres"]);
        }
        write_ini(&ini, port, pool_mode, server_connections, &server, &dir);
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
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {port} within 10 s (log: {})",
                dir.join("pgbouncer.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            dir,
            port,
            pool_mode,
            server_connections,
            url,
        }
    }

    /// Point every database at another server and reload (SIGHUP, as `RELOAD` on the admin
    /// console would): new server connections go there; clients keep their connections to
    /// pgbouncer. A failed server login is retried after `server_login_retry = 1` s (pgbouncer's
    /// default, 15 s, would stall every client that long after a failover).
    pub fn repoint(&self, server_url: &str) {
        let server: PgConnectOptions = server_url.parse().expect("server url");
        write_ini(
            &self.dir.join("pgbouncer.ini"),
            self.port,
            self.pool_mode,
            self.server_connections,
            &server,
            &self.dir,
        );
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("signal pgbouncer");
        assert!(status.success(), "SIGHUP pgbouncer");
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

fn write_ini(
    ini: &std::path::Path,
    port: u16,
    pool_mode: &str,
    server_connections: u32,
    server: &PgConnectOptions,
    dir: &std::path::Path,
) {
    let target = format!(
        "host={} port={} user={}",
        server.get_host(),
        server.get_port(),
        server.get_username()
    );
    std::fs::write(
        ini,
        format!(
            "[databases]\n\
             session = {target} dbname=postgres pool_mode=session\n\
             * = {target}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = {pool_mode}\n\
             default_pool_size = {server_connections}\n\
             max_client_conn = 500\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_login_retry = 1\n\
             logfile = {log}\n",
            log = dir.join("pgbouncer.log").display(),
        ),
    )
    .expect("pgbouncer.ini");
    set_mode(ini, 0o644);
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
