//! A throwaway PostgreSQL cluster for the demo, the benchmark and machines without a running
//! server: initdb and pg_ctl from the installed server binaries, in a temporary directory removed
//! on drop. Also a hot standby of one, and a PgBouncer in front of either (tests and bench). PostgreSQL refuses to run as root, so as root the cluster is run as the `postgres`
//! system user.
//!
//! Standard library only (feature `embedded`): the CLI's demo, the benchmark runner and the test
//! suite start one when no server answers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Why the throwaway cluster could not be started or driven.
#[derive(Debug)]
pub struct EmbeddedError(String);

impl std::fmt::Display for EmbeddedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "throwaway PostgreSQL cluster: {}", self.0)
    }
}

impl std::error::Error for EmbeddedError {}

type Result<T> = std::result::Result<T, EmbeddedError>;

/// A directory under the system temporary directory, removed on drop.
struct ClusterDir(PathBuf);

impl ClusterDir {
    fn create() -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("ringwork-pg-{}-{nanos:09}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| {
            EmbeddedError(format!(
                "cannot create the directory {}: {e}",
                path.display()
            ))
        })?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ClusterDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running throwaway cluster on a free localhost port, its data in a temporary directory;
/// dropping it stops the server (`pg_ctl stop -m immediate`) and removes the directory.
pub struct EmbeddedPostgres {
    dir: ClusterDir,
    bindir: PathBuf,
    port: u16,
    run_as: Option<String>,
}

impl EmbeddedPostgres {
    /// initdb + start a cluster on a free localhost port, with PostgreSQL's defaults (autovacuum
    /// on). Blocks until it accepts connections.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// `start`, with extra server settings (`-c name=value`), e.g. `("autovacuum", "off")`.
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self> {
        let embedded = Self::create()?;
        let data = embedded.data_dir();
        embedded.run(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        embedded.launch(settings)?;
        Ok(embedded)
    }

    /// A hot standby of this cluster on its own free port: a base backup (`pg_basebackup -R`,
    /// which writes `primary_conninfo` and `standby.signal`) started with `settings`. It streams
    /// from this cluster and answers read-only queries; `promote` makes it a primary. Its walreceiver
    /// reports the application name `standby`, for `synchronous_standby_names`.
    pub fn start_standby(&self, settings: &[(&str, &str)]) -> Result<Self> {
        let standby = Self::create()?;
        let data = standby.data_dir();
        let primary = format!(
            "host=127.0.0.1 port={} user=postgres application_name=standby",
            self.port
        );
        standby.run(
            "pg_basebackup",
            &[
                "-d",
                &primary,
                "-D",
                path_str(&data)?,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        )?;
        let mut settings = settings.to_vec();
        settings.push(("hot_standby", "on"));
        standby.launch(&settings)?;
        Ok(standby)
    }

    /// Promote a standby to a primary (`pg_ctl promote`), waiting until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &["-D", path_str(&data)?, "-w", "-t", "60", "promote"],
        )
    }

    /// Stop the server as a crash would (`pg_ctl stop -m immediate`: no checkpoint, sessions cut),
    /// and leave it stopped; dropping `self` then removes its directory (its stop finds nothing
    /// to stop).
    pub fn stop_immediately(&self) -> Result<()> {
        let data = self.data_dir();
        self.run(
            "pg_ctl",
            &["-D", path_str(&data)?, "-m", "immediate", "-w", "stop"],
        )
    }

    /// The localhost port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A directory, its owner and a free port, with no cluster in it yet.
    fn create() -> Result<Self> {
        let bindir = find_bindir()?;
        let dir = ClusterDir::create()?;
        let run_as = if is_root() {
            Some("postgres".to_string())
        } else {
            None
        };
        if let Some(user) = &run_as {
            check(
                Command::new("chown")
                    .arg("-R")
                    .arg(user)
                    .arg(dir.path())
                    .output(),
                "chown the cluster directory to postgres",
            )?;
        }
        let port = free_port()?;
        Ok(Self {
            dir,
            bindir,
            port,
            run_as,
        })
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Start the server on the cluster in `data`, blocking until it accepts connections.
    fn launch(&self, settings: &[(&str, &str)]) -> Result<()> {
        let data = self.data_dir();
        let log = self.dir.path().join("postgres.log");
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200",
            self.port,
            path_str(self.dir.path())?
        );
        for (name, value) in settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-o",
                &options,
                "-l",
                path_str(&log)?,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Leave the cluster running after `self` is dropped, but stop it and remove its directory
    /// once process `pid` exits (for test binaries, whose statics are never dropped).
    #[allow(dead_code)] // used by the library's test support, which compiles this file too
    pub fn stop_when_process_exits(self, pid: u32) -> Result<String> {
        let url = self.url();
        let dir = self.dir.path().to_path_buf();
        let pg_ctl = self.bindir.join("pg_ctl");
        let stop = match &self.run_as {
            Some(user) => format!(
                "runuser -u {user} -- {} -D {}/data -m immediate stop",
                pg_ctl.display(),
                dir.display()
            ),
            None => format!(
                "{} -D {}/data -m immediate stop",
                pg_ctl.display(),
                dir.display()
            ),
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf {}",
            dir.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| EmbeddedError(format!("cannot start the cluster watchdog: {e}")))?;
        // the watchdog owns the directory and the server from now on: skip our Drop (and the directory's)
        std::mem::forget(self);
        Ok(url)
    }

    /// Crash-restart the server: immediate shutdown (no checkpoint, sessions cut, asynchronously
    /// committed transactions not yet flushed are lost), then crash recovery on start, as after a
    /// power cut. `pg_ctl restart` reuses the options the server was started with.
    pub fn restart(&self) -> Result<()> {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("postgres.log");
        // -l: without a log file the new server would inherit (and hold open) our output pipe
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&data)?,
                "-l",
                path_str(&log)?,
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
                "restart",
            ],
        )
    }

    /// Connection URL of the throwaway cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let binary = self.bindir.join(program);
        let output = match &self.run_as {
            Some(user) => Command::new("runuser")
                .arg("-u")
                .arg(user)
                .arg("--")
                .arg(&binary)
                .args(args)
                .current_dir(self.dir.path())
                .output(),
            None => Command::new(&binary).args(args).output(),
        };
        check(output, program)
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        if let Some(data) = data.to_str() {
            let _ = self.run("pg_ctl", &["-D", data, "-m", "immediate", "-w", "stop"]);
        }
    }
}

fn check(output: std::io::Result<Output>, what: &str) -> Result<()> {
    let output = output.map_err(|e| EmbeddedError(format!("{what}: {e}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(EmbeddedError(format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| EmbeddedError(format!("path {path:?} is not UTF-8")))
}

/// Whether this process runs as root (`id -u` prints 0); false when `id` cannot be run.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A localhost TCP port that was free when asked (the OS picks it; another process may take
/// it before it is used).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| EmbeddedError(format!("no free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| EmbeddedError(format!("no free port: {e}")))
}

/// The server binaries: `pg_config --bindir` when it names a directory with initdb, else the
/// newest `/usr/lib/postgresql/<version>/bin`.
pub fn find_bindir() -> Result<PathBuf> {
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates.pop().ok_or_else(|| {
        EmbeddedError(
            "no PostgreSQL server binaries found (initdb); install the postgresql server package \
             or set DATABASE_URL"
                .into(),
        )
    })
}

/// Where a [`PgBouncer`] sends its server connections.
#[derive(Clone, Debug)]
pub struct BouncerTarget {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// The role every server connection logs in as.
    pub user: String,
}

/// A PgBouncer process (Debian's `pgbouncer`, found on PATH, in /usr/sbin, or at
/// `$RINGWORK_PGBOUNCER`) on a free localhost port, in front of one server: every database name is
/// forwarded to the server's database of that name, and the database `session` always pools by
/// session and leads to `postgres` (the session pool a client behind a transaction pooler needs).
/// A failed server login is retried after 1 s (`server_login_retry`; PgBouncer's default, 15 s,
/// would stall every client that long after a failover). Killed on drop, or when the process that
/// started it exits.
pub struct PgBouncer {
    child: std::process::Child,
    dir: ClusterDir,
    port: u16,
    pool_mode: String,
    pool_size: u32,
}

impl PgBouncer {
    /// Start one with `pool_mode` (`session` or `transaction`) and `pool_size` server connections
    /// per database and role. Blocks until it listens.
    pub fn start(target: &BouncerTarget, pool_mode: &str, pool_size: u32) -> Result<Self> {
        let binary = pgbouncer_binary().ok_or_else(|| {
            EmbeddedError(
                "pgbouncer is not installed: `apt-get install pgbouncer`, or set RINGWORK_PGBOUNCER"
                    .into(),
            )
        })?;
        let dir = ClusterDir::create()?;
        // pgbouncer refuses to run as root: it runs as `postgres` then, and writes its log here
        set_mode(dir.path(), 0o777)?;
        let port = free_port()?;
        let bouncer_ini = dir.path().join("pgbouncer.ini");
        write_bouncer_ini(&bouncer_ini, port, pool_mode, pool_size, target, dir.path())?;
        let mut command = Command::new(&binary);
        if is_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(&bouncer_ini)
            // it logs to its logfile; an inherited stderr would outlive the process
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| EmbeddedError(format!("start {}: {e}", binary.display())))?;
        // a watchdog stops it and removes its directory when this process exits (a static one is
        // never dropped); it ends by itself once pgbouncer is gone, so it never signals a pid
        // reused long after
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "while kill -0 {parent} 2>/dev/null && kill -0 {child} 2>/dev/null; do sleep 1; done; \
                 kill -0 {child} 2>/dev/null && kill {child}; rm -rf '{dir}'",
                parent = std::process::id(),
                child = child.id(),
                dir = dir.path().display()
            ))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let bouncer = Self {
            child,
            dir,
            port,
            pool_mode: pool_mode.to_string(),
            pool_size,
        };
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > std::time::Duration::from_secs(10) {
                return Err(EmbeddedError(format!(
                    "pgbouncer did not listen on {port} within 10 s (log: {})",
                    bouncer.dir.path().join("pgbouncer.log").display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(bouncer)
    }

    /// Send every database to another server and reload (SIGHUP, as `RELOAD` on the admin console
    /// would): new server connections go there; clients keep their connections to PgBouncer.
    pub fn repoint(&self, target: &BouncerTarget) -> Result<()> {
        write_bouncer_ini(
            &self.dir.path().join("pgbouncer.ini"),
            self.port,
            &self.pool_mode,
            self.pool_size,
            target,
            self.dir.path(),
        )?;
        check(
            Command::new("kill")
                .args(["-HUP", &self.child.id().to_string()])
                .output(),
            "signal pgbouncer to reload",
        )
    }

    /// The URL of `database` through PgBouncer, as role `user`.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// Whether the pgbouncer binary is installed.
    pub fn installed() -> bool {
        pgbouncer_binary().is_some()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

fn write_bouncer_ini(
    ini: &Path,
    port: u16,
    pool_mode: &str,
    pool_size: u32,
    target: &BouncerTarget,
    dir: &Path,
) -> Result<()> {
    let server = format!(
        "host={} port={} user={}",
        target.host, target.port, target.user
    );
    std::fs::write(
        ini,
        format!(
            "[databases]\n\
             session = {server} dbname=postgres pool_mode=session\n\
             * = {server}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = {pool_mode}\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             server_login_retry = 1\n\
             logfile = {log}\n",
            log = dir.join("pgbouncer.log").display(),
        ),
    )
    .map_err(|e| EmbeddedError(format!("cannot write {}: {e}", ini.display())))?;
    set_mode(ini, 0o644)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| EmbeddedError(format!("chmod {}: {e}", path.display())))
}
