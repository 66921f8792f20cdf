//! `ringwork serve`: `/metrics` (Prometheus), `/healthz` and `/readyz` over HTTP, an
//! optional OTLP metrics export, and, unless told not to, a seat in the maintenance election (so a
//! fleet whose workers are all down still rotates, rescues and prunes).

use std::sync::Arc;
use std::time::Duration;

use axum::response::Redirect;
use axum::routing::get;
use opentelemetry_otlp::{MetricExporter, WithExportConfig};
use opentelemetry_sdk::metrics::PeriodicReader;
use ringwork::dashboard::Dashboard;
use ringwork::http::{callbacks_router, router, Endpoints, PrometheusExporter};
use ringwork::{Client, MaintenanceConfig};

use super::duration;
use tracing::{info, warn};

/// Connections of the pool the dashboard's pages and `/metrics` read through.
const READ_CONNECTIONS: u32 = 3;
/// How long one of their statements may run.
const READ_STATEMENT_TIMEOUT: &str = "10s";

struct ServeOptions {
    pub listen: String,
    pub otlp_endpoint: Option<String>,
    pub otlp_interval: Duration,
    pub maintenance: bool,
    pub horizon_min_age: Duration,
    pub schema: String,
    /// Serve the dashboard at /dashboard with these actions; `None`: no dashboard.
    pub dashboard: Option<ringwork::dashboard::Actions>,
    pub dashboard_sample: Duration,
    /// How often open pages update themselves; `None`: never.
    pub dashboard_live: Option<Duration>,
    /// Host names the dashboard answers for, beside loopback and the listen address.
    pub dashboard_hosts: Vec<String>,
    /// Where the dashboard's pages read (a hot standby); `None`: the primary's read pool.
    pub dashboard_reads: Option<ringwork::Admin>,
}

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on (port 0: any free port, printed on start).
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: String,
    /// Also push metrics to this OTLP/HTTP endpoint (e.g. http://collector:4318/v1/metrics).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Time between OTLP pushes (seconds, or 10s, 1m).
    #[arg(long, default_value = "10", value_parser = duration, allow_hyphen_values = true)]
    otlp_interval_secs: Duration,
    /// Do not run maintenance from this process, even when elected.
    #[arg(long)]
    no_maintenance: bool,
    /// Count horizon holders whose transaction has been open at least this long (seconds, or 30s).
    #[arg(long, default_value = "10", value_parser = duration, allow_hyphen_values = true)]
    horizon_min_secs: Duration,
    /// Serve the web dashboard at /dashboard (read-only unless a token or
    /// --dashboard-behind-proxy turns its actions on; a token also puts its pages behind
    /// sign-in). Implied by --dashboard-token and --dashboard-behind-proxy.
    #[arg(long)]
    dashboard: bool,
    /// Turn the dashboard's actions (pause, retry, cancel, purge) on for browsers that sign in
    /// with this token; without it (or --dashboard-behind-proxy) the dashboard is read-only.
    #[arg(
        long,
        env = "RINGWORK_DASHBOARD_TOKEN",
        conflicts_with = "dashboard_behind_proxy"
    )]
    dashboard_token: Option<String>,
    /// Turn the dashboard's actions on for every visitor: an authenticating proxy in front of
    /// this server decides who gets in.
    #[arg(long)]
    dashboard_behind_proxy: bool,
    /// Time between the samples of the dashboard's overview, which keeps an hour of them
    /// (seconds, or 10s, 1m; at least 1 s).
    #[arg(long, default_value = "10", value_parser = duration, allow_hyphen_values = true)]
    dashboard_sample_secs: Duration,
    /// How often an open dashboard page reads itself again and updates in place, with a pause
    /// button (seconds, or 10s, 1m; 0: pages stay as they were read).
    #[arg(long, default_value = "5", value_parser = duration, allow_hyphen_values = true)]
    dashboard_live_secs: Duration,
    /// A host name (or address) the dashboard is reached by, beside localhost, 127.0.0.1,
    /// [::1] and the --listen address; repeat for several. A request naming another host in
    /// its Host header is refused (421), which stops DNS-rebinding pages.
    #[arg(long = "dashboard-host", value_name = "NAME")]
    dashboard_hosts: Vec<String>,
    /// Read the dashboard's pages from this server, a hot standby of --database-url's, with the
    /// same schema; each page then says how stale it may be. Actions, callbacks, /metrics,
    /// /readyz and maintenance stay on --database-url (the leader and the horizon are the
    /// primary's, and alerts should not lag).
    #[arg(long, env = "RINGWORK_READ_DATABASE_URL", value_name = "URL")]
    read_database_url: Option<String>,
    #[command(flatten)]
    db: super::Db,
}

pub async fn run(args: Args) -> super::Result<()> {
    let dashboard = match (
        args.dashboard,
        args.dashboard_token,
        args.dashboard_behind_proxy,
    ) {
        (_, Some(token), _) => Some(ringwork::dashboard::Actions::Token(token)),
        (_, None, true) => Some(ringwork::dashboard::Actions::BehindProxy),
        (true, None, false) => Some(ringwork::dashboard::Actions::ReadOnly),
        (false, None, false) => None,
    };
    // refuses a schema that is not installed, or newer than this binary
    let admin = super::open_admin_with(&args.db.database_url, &args.db.schema, 4).await?;
    let dashboard_reads = match &args.read_database_url {
        Some(url) if dashboard.is_some() => Some(bounded_reads(
            &super::open_admin_with(url, &args.db.schema, 1).await?,
        )?),
        Some(_) => {
            return Err(ringwork::Error::Config(
                "--read-database-url is where the dashboard reads: add --dashboard".into(),
            )
            .into())
        }
        None => None,
    };
    serve(
        admin.pool().clone(),
        ServeOptions {
            listen: args.listen,
            otlp_endpoint: args.otlp_endpoint,
            otlp_interval: args.otlp_interval_secs,
            maintenance: !args.no_maintenance,
            horizon_min_age: args.horizon_min_secs,
            schema: args.db.schema,
            dashboard,
            dashboard_sample: args.dashboard_sample_secs.max(Duration::from_secs(1)),
            dashboard_live: Some(args.dashboard_live_secs).filter(|d| !d.is_zero()),
            dashboard_hosts: args.dashboard_hosts,
            dashboard_reads,
        },
    )
    .await?;
    Ok(())
}

/// A pool of its own on `admin`'s server for pages and scrapes, each statement bounded: a slow
/// page or a burst of scrapes never takes the connections maintenance and callbacks need.
fn bounded_reads(admin: &ringwork::Admin) -> ringwork::Result<ringwork::Admin> {
    ringwork::Admin::new(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(
                admin
                    .pool()
                    .connect_options()
                    .as_ref()
                    .clone()
                    .options([("statement_timeout", READ_STATEMENT_TIMEOUT)]),
            ),
        admin.schema().as_str(),
    )
}

async fn serve(pool: sqlx::PgPool, options: ServeOptions) -> super::Result<()> {
    if options.otlp_interval < Duration::from_secs(1) {
        return Err(ringwork::Error::Config(
            "--otlp-interval-secs must be at least 1 second".into(),
        )
        .into());
    }
    let otlp = match &options.otlp_endpoint {
        None => None,
        Some(endpoint) => Some(
            MetricExporter::builder()
                .with_http()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| {
                    ringwork::Error::Config(format!("cannot start the OTLP exporter: {e}"))
                })?,
        ),
    };
    let interval = options.otlp_interval;
    let exporter = Arc::new(PrometheusExporter::new(move |provider| match otlp {
        Some(otlp) => provider.with_reader(
            PeriodicReader::builder(otlp)
                .with_interval(interval)
                .build(),
        ),
        None => provider,
    })?);
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .map_err(|e| {
            super::CliError::Runtime(format!("cannot listen on {}: {e}", options.listen))
        })?;
    // the health functions this binary calls must be installed: refuse early, with the fix
    let mut conn = pool.acquire().await?;
    let schema = ringwork::SchemaName::new(&options.schema)?;
    let installed = ringwork::schema::installed_functions_checksum(&mut conn, &schema).await?;
    drop(conn);
    if installed.as_deref() != Some(ringwork::schema::functions_checksum().as_str()) {
        return Err(ringwork::Error::Config(format!(
            "schema {schema}'s SQL functions are not this binary's; run `ringwork migrate` first"
        ))
        .into());
    }
    let client = Client::builder(pool)
        .schema(&options.schema)
        .migrate(false)
        .telemetry(exporter.telemetry())
        .maintenance(MaintenanceConfig {
            enabled: options.maintenance,
            ..MaintenanceConfig::default()
        })
        .build()
        .await?;
    let running = client.start().await?;
    // OTLP pushes on its own clock: refresh the state gauges on that clock too (a Prometheus
    // scrape refreshes them itself)
    let refresher = options.otlp_endpoint.as_ref().map(|_| {
        let telemetry = exporter.telemetry();
        let admin = client.admin();
        let min_age = options.horizon_min_age;
        tokio::spawn(async move {
            loop {
                if let Err(e) = telemetry.record_state(&admin, min_age).await {
                    warn!(error = %e, "metrics: reading ringwork's state from the database failed");
                }
                tokio::time::sleep(interval / 2).await;
            }
        })
    });
    let reads = bounded_reads(&client.admin())?;
    let mut app = router(
        Endpoints::new(reads.clone())
            .prometheus(Arc::clone(&exporter))
            .liveness(running.liveness())
            .horizon_min_age(options.horizon_min_age)
            // an operator's endpoint: unready when no process leads maintenance
            .require_leader(true),
    );
    // external callbacks for jobs that wait in the lease ring (the signed id is the capability)
    app = app.merge(callbacks_router(client.admin()));
    if let Some(actions) = options.dashboard {
        app = app
            .nest(
                "/dashboard",
                Dashboard::new(reads.clone())
                    .read_from(options.dashboard_reads.unwrap_or_else(|| reads.clone()))
                    .max_concurrent_requests(READ_CONNECTIONS as usize)
                    .base_path("/dashboard")
                    .allowed_hosts(&dashboard_hosts(&options.dashboard_hosts, &listener))
                    .actions(actions)?
                    .horizon_min_age(options.horizon_min_age)
                    .sample_every(options.dashboard_sample)
                    .live_every(options.dashboard_live)
                    .router(),
            )
            .route("/", get(|| async { Redirect::to("/dashboard") }));
    }
    let local = listener
        .local_addr()
        .map_err(|e| super::CliError::Runtime(format!("listener has no address: {e}")))?;
    info!(%local, "serving /metrics, /healthz, /readyz, /callbacks and /dashboard");
    // the bound address on stdout, for scripts and tests that pass port 0
    println!("listening on http://{local}");
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| super::CliError::Runtime(format!("cannot handle SIGTERM: {e}")))?;
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            // SIGTERM is how containers and systemd stop a process; Ctrl-C at a terminal
            tokio::select! {
                _ = terminate.recv() => {}
                result = tokio::signal::ctrl_c() => {
                    if let Err(e) = result {
                        warn!(error = %e, "cannot wait for Ctrl-C; stop with SIGTERM");
                        std::future::pending::<()>().await;
                    }
                }
            }
            info!("stopping");
        })
        .await;
    if let Some(refresher) = refresher {
        refresher.abort();
    }
    running.shutdown(Duration::from_secs(5)).await;
    if let Err(e) = exporter.provider().shutdown() {
        warn!(error = %e, "metrics provider shutdown");
    }
    served.map_err(|e| super::CliError::Runtime(format!("HTTP server failed: {e}")))
}

/// The dashboard's hosts: those asked for, and the listen address when it is one address (an
/// unspecified one, 0.0.0.0 or [::], names no host a browser would use).
fn dashboard_hosts(asked: &[String], listener: &tokio::net::TcpListener) -> Vec<String> {
    let mut hosts = asked.to_vec();
    if let Ok(local) = listener.local_addr() {
        if !local.ip().is_unspecified() {
            hosts.push(local.ip().to_string());
        }
    }
    if hosts.is_empty() {
        info!("the dashboard answers for localhost, 127.0.0.1 and [::1] only; add --dashboard-host <name> for the name you reach it by");
    }
    hosts
}
