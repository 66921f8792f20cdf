//! One module per command group: each owns its clap arguments and its `run`.

pub mod archive;
pub mod bulk;
pub mod callback;
pub mod counts;
pub mod cron;
pub mod demo;
pub mod dlq;
pub mod grant;
pub mod job;
pub mod maintain;
pub mod migrate;
pub mod queue;
pub mod ring;
pub mod serve;
pub mod status;
pub mod work;
pub mod workflow;

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use ringwork::{schema, Admin, SchemaName};
use sqlx::postgres::PgPoolOptions;

/// Why a command failed; each maps to an exit code (see `exit_code`).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Ringwork(#[from] ringwork::Error),
    /// The job, queue or schedule named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The command would do something the operator has to ask for explicitly.
    #[error("{0}")]
    Refused(String),
    /// Something outside the database failed while the command ran (a port already in use, a
    /// signal handler, a cluster that would not start): not a configuration mistake.
    #[error("{0}")]
    Runtime(String),
}

impl From<sqlx::Error> for CliError {
    fn from(e: sqlx::Error) -> Self {
        Self::Ringwork(e.into())
    }
}

impl CliError {
    /// What to print: the error, and for a write refused as read-only (a hot standby) what to do
    /// instead.
    pub fn message(&self) -> String {
        match self {
            Self::Ringwork(ringwork::Error::Database(sqlx::Error::Database(e)))
                if e.code().as_deref() == Some(READ_ONLY_SQL_TRANSACTION) =>
            {
                format!(
                    "{self}: this server refuses writes (a hot standby, or a read-only session); \
                     run actions against the primary"
                )
            }
            _ => self.to_string(),
        }
    }

    /// 1 for a failure, 3 when the thing named does not exist (clap's usage errors are 2), so a
    /// script can tell "no such job" from "the database is down".
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::NotFound(_) => 3,
            Self::Ringwork(_) | Self::Refused(_) | Self::Runtime(_) => 1,
        }
    }
}

pub type Result<T> = std::result::Result<T, CliError>;

/// SQLSTATE of a write in a read-only transaction, which is what a hot standby answers.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

fn config(message: impl Into<String>) -> CliError {
    CliError::Ringwork(ringwork::Error::Config(message.into()))
}

/// The form `--database-url` takes, for the error that refuses another.
const DATABASE_URL_FORM: &str = "postgres://user[:password]@host[:port]/database[?sslmode=...]";

/// `--database-url` as connection options: a PostgreSQL URL, or a clear error that shows the form
/// expected and never the URL itself (it may hold a password). Statements are not logged, even
/// slow ones: a command's statements are ringwork's own, and sqlx would print them whole.
pub fn database_options(url: &str) -> ringwork::Result<sqlx::postgres::PgConnectOptions> {
    use sqlx::ConnectOptions;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        let scheme = match url.split_once("://") {
            Some((scheme, _)) => format!("a {scheme}:// URL"),
            None => "no URL scheme".to_string(),
        };
        return Err(ringwork::Error::Config(format!(
            "--database-url (or DATABASE_URL) must be a PostgreSQL URL, {DATABASE_URL_FORM}; got {scheme}"
        )));
    }
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| {
        ringwork::Error::Config(format!(
            "--database-url (or DATABASE_URL) is not a valid PostgreSQL URL ({e}); expected {DATABASE_URL_FORM}"
        ))
    })?;
    Ok(options.disable_statement_logging())
}

/// A small pool on `url` that fails within seconds, naming the cause, when the server is refused,
/// unreachable or unknown (a pool alone would retry for its whole acquire timeout).
pub async fn connect(url: &str, max: u32) -> ringwork::Result<sqlx::PgPool> {
    let options = database_options(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    ringwork::check_reachable(&pool).await?;
    Ok(pool)
}

/// `--schema` as a schema name. `public` is refused: ringwork owns every table and function in its
/// schema, and `public` is where an application's own tables live.
pub fn schema_name(name: &str) -> Result<SchemaName> {
    if name == "public" {
        return Err(CliError::Refused(
            "--schema public is refused: ringwork's tables and functions need a schema of their own \
             (the default is ringwork)"
                .into(),
        ));
    }
    Ok(SchemaName::new(name)?)
}

/// Where ringwork lives: the server and the schema.
#[derive(clap::Args)]
pub struct Db {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// The schema ringwork lives in.
    #[arg(long, default_value = "ringwork")]
    pub schema: String,
}

impl Db {
    /// The operator API on the installed schema, on a pool of two connections.
    pub async fn open(&self) -> Result<Admin> {
        open_admin(&self.database_url, &self.schema).await
    }
}

/// `Db` for a command group: the options may stand anywhere on the line, and the URL is only
/// demanded by the subcommands that connect.
#[derive(clap::Args)]
pub struct GroupDb {
    #[arg(long, env = "DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// The schema ringwork lives in.
    #[arg(long, default_value = "ringwork", global = true)]
    pub schema: String,
}

impl GroupDb {
    /// The operator API on the installed schema, on a pool of two connections.
    pub async fn open(&self) -> Result<Admin> {
        open_admin_from(self.database_url.clone(), &self.schema).await
    }
}

/// A command group: its subcommand, and where ringwork lives.
#[derive(clap::Args)]
pub struct Group<A: clap::Subcommand> {
    #[command(subcommand)]
    pub action: A,
    #[command(flatten)]
    pub db: GroupDb,
}

/// The operator API on an installed schema this binary can run against.
pub async fn open_admin(url: &str, schema: &str) -> Result<Admin> {
    open_admin_with(url, schema, 2).await
}

/// `open_admin` for a command whose `--database-url` is optional on the command line (a global
/// option of its subcommands) but needed.
pub async fn open_admin_from(url: Option<String>, schema: &str) -> Result<Admin> {
    let url = url.ok_or_else(|| config("set --database-url or DATABASE_URL"))?;
    open_admin(&url, schema).await
}

/// `open_admin` with a pool of `max` connections.
pub async fn open_admin_with(url: &str, schema: &str, max: u32) -> Result<Admin> {
    let schema = schema_name(schema)?;
    let pool = connect(url, max).await?;
    let mut conn = pool.acquire().await?;
    let version = schema::installed_version(&mut conn, &schema).await?;
    schema::check_not_newer(&schema, version)?;
    if version.is_none() {
        return Err(config(format!(
            "schema {schema} is not installed; run `ringwork migrate` first"
        )));
    }
    drop(conn);
    let admin = Admin::new(pool, schema.as_str())?;
    // a read URL may be a hot standby: say how stale what follows may be (stderr, so the
    // output a script parses stays the same)
    if let Some(replica) = admin.replica_status().await? {
        eprintln!("ringwork: {}", replica.describe());
    }
    Ok(admin)
}

/// A time flag: seconds (`30`, `0.5`) or a duration (`30s`, `5m`, `7d`, `1h 30m`).
pub fn duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("{text} is negative; a duration is zero or more"));
    }
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{text}: {e}"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text}: {e}; expected seconds (30, 0.5) or a duration (30s, 5m, 7d)"))
}

/// Ask before something that cannot be undone, unless `--yes`. Without a terminal to ask on, the
/// answer is no: a script has to say `--yes`.
pub fn confirm(yes: bool, what: &str) -> Result<()> {
    if yes {
        return Ok(());
    }
    let refused = || {
        CliError::Refused(format!(
            "{what}: not confirmed (pass --yes to skip the question)"
        ))
    };
    if !std::io::stdin().is_terminal() {
        return Err(refused());
    }
    eprint!("{what}. Continue? [y/N] ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).ok();
    match answer.trim() {
        "y" | "Y" | "yes" => Ok(()),
        _ => Err(refused()),
    }
}
