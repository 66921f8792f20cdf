//! HTTP endpoints for operators (feature `http`): `/metrics` (Prometheus text), `/healthz` and
//! `/readyz`, as an axum `Router` a service mounts in its own server; `ringwork serve` runs the same
//! router on its own.
//!
//! ```no_run
//! # async fn demo(client: ringwork::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use ringwork::http::{router, Endpoints, PrometheusExporter};
//! let prometheus = Arc::new(PrometheusExporter::new(|provider| provider)?);
//! // build the client with `.telemetry(prometheus.telemetry())` so its events reach /metrics
//! let running = client.start().await?;
//! let app = router(
//!     Endpoints::new(client.admin())
//!         .prometheus(prometheus)
//!         .liveness(running.liveness()),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::{MeterProviderBuilder, SdkMeterProvider};
use tracing::warn;

use crate::error::{Error, Result};
use crate::runtime::Liveness;
use crate::storage::Storage;
use crate::telemetry::Telemetry;

/// How long a scrape waits for the state gauges before it serves what it has (Prometheus's default
/// scrape timeout is 10 s).
const STATE_READ_BUDGET: Duration = Duration::from_secs(4);

/// An OpenTelemetry SDK meter provider whose metrics a Prometheus registry renders, with
/// ringwork's instruments made on it.
pub struct PrometheusExporter {
    registry: prometheus::Registry,
    provider: SdkMeterProvider,
    telemetry: Telemetry,
}

impl PrometheusExporter {
    /// `configure` may add readers to the provider (an OTLP periodic reader, say) before it is
    /// built; pass `|provider| provider` for Prometheus only.
    pub fn new(
        configure: impl FnOnce(MeterProviderBuilder) -> MeterProviderBuilder,
    ) -> Result<Self> {
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .build()
            .map_err(|e| Error::Config(format!("cannot start the Prometheus exporter: {e}")))?;
        let provider = configure(SdkMeterProvider::builder().with_reader(exporter)).build();
        let telemetry = Telemetry::new(&provider.meter("ringwork"));
        Ok(Self {
            registry,
            provider,
            telemetry,
        })
    }

    /// The instruments to give `ClientBuilder::telemetry`.
    pub fn telemetry(&self) -> Telemetry {
        self.telemetry.clone()
    }

    /// The SDK meter provider the exporter reads (to make more meters on it, or to shut it down).
    pub fn provider(&self) -> &SdkMeterProvider {
        &self.provider
    }

    /// Everything recorded so far, in the Prometheus text format.
    pub fn render(&self) -> Result<String> {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .map_err(|e| Error::Config(format!("cannot encode metrics: {e}")))
    }
}

/// What the router serves.
#[derive(Clone)]
pub struct Endpoints {
    storage: Storage,
    prometheus: Option<Arc<PrometheusExporter>>,
    liveness: Option<Liveness>,
    horizon_min_age: Duration,
    require_leader: bool,
}

impl Endpoints {
    /// Endpoints over `admin`'s pool and schema: no exporter (`/metrics` answers 404), no liveness
    /// check, no leader required by `/readyz`, horizon holders counted from 10 s.
    pub fn new(admin: crate::Admin) -> Self {
        Self {
            storage: admin.storage().clone(),
            prometheus: None,
            liveness: None,
            horizon_min_age: Duration::from_secs(10),
            require_leader: false,
        }
    }

    /// Serve `/metrics` from this exporter; each scrape first reads the state gauges from the
    /// database (`Telemetry::record_state`).
    pub fn prometheus(mut self, exporter: Arc<PrometheusExporter>) -> Self {
        self.prometheus = Some(exporter);
        self
    }

    /// `/healthz` answers 503 when this client's dispatchers stopped; without it, `/healthz`
    /// says only that the process serves HTTP.
    pub fn liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// `/readyz` also requires some process to hold the maintenance leader lock (default off: see
    /// `Readiness::ready`).
    pub fn require_leader(mut self, require: bool) -> Self {
        self.require_leader = require;
        self
    }

    /// Horizon holders younger than this are not counted in the metrics (default 10 s).
    pub fn horizon_min_age(mut self, min_age: Duration) -> Self {
        self.horizon_min_age = min_age;
        self
    }
}

/// `/metrics`, `/healthz`, `/readyz`.
pub fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Arc::new(endpoints))
}

async fn metrics(State(e): State<Arc<Endpoints>>) -> Response {
    let Some(prometheus) = &e.prometheus else {
        return (StatusCode::NOT_FOUND, "no metrics exporter configured\n").into_response();
    };
    // A failed or slow database read still serves the process's own counters within a scrape
    // timeout (and says so: ringwork_state_read_ok 0, and the log): the scrape that fails outright
    // is the one that hides why.
    match tokio::time::timeout(
        STATE_READ_BUDGET,
        prometheus
            .telemetry
            .record_state_of(&e.storage, e.horizon_min_age),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            warn!(error = %err, "metrics: reading ringwork's state from the database failed")
        }
        Err(_) => {
            prometheus.telemetry.state_read_failed();
            warn!("metrics: reading ringwork's state from the database took over {STATE_READ_BUDGET:?}; serving the last values");
        }
    }
    match prometheus.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

async fn healthz(State(e): State<Arc<Endpoints>>) -> Response {
    match e.liveness.as_ref().map(Liveness::check) {
        None | Some(Ok(())) => (StatusCode::OK, "ok\n").into_response(),
        Some(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(e): State<Arc<Endpoints>>) -> Response {
    let readiness = e.storage.readiness().await;
    let status = if readiness.ready(e.require_leader) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
}

/// `POST /callbacks/{id}/{action}`: external callbacks (`complete`, `fail`, `retry`, `resume`,
/// `heartbeat`) for jobs that wait in the lease ring. The id is the capability: 64 hex characters,
/// signed with the schema's callback key, unguessable. Optional JSON body: `{"payload": ...}`
/// (resume), `{"error": "..."}` (fail, retry), `{"extend_secs": N}` (heartbeat, default 300).
/// Answers `200 {"outcome": "applied" | "recorded" | "extended"}`; `404` for an id this schema did
/// not give out or whose wait is over; `409` when an earlier answer was recorded while its handler
/// ran and waits to be applied; `400` for a malformed id, action or body.
pub fn callbacks_router(admin: crate::Admin) -> Router {
    Router::new()
        .route("/callbacks/{id}/{action}", axum::routing::post(callback))
        .with_state(admin.storage().clone())
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CallbackBody {
    payload: Option<serde_json::Value>,
    error: Option<String>,
    extend_secs: Option<f64>,
}

async fn callback(
    State(storage): State<Storage>,
    axum::extract::Path((id, action)): axum::extract::Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let body: CallbackBody =
        if body.iter().all(u8::is_ascii_whitespace) {
            CallbackBody::default()
        } else {
            match serde_json::from_slice(&body) {
                Ok(body) => body,
                Err(e) => return (
                    StatusCode::BAD_REQUEST,
                    Json(
                        serde_json::json!({ "error": format!("the body is not a callback: {e}") }),
                    ),
                )
                    .into_response(),
            }
        };
    let action = match crate::storage::CallbackAction::from_parts(
        &action,
        body.payload,
        body.error,
        body.extend_secs,
    ) {
        Ok(action) => action,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({ "error": e.to_string() })),
            )
                .into_response()
        }
    };
    match storage.resolve_callback(&id, action).await {
        Ok(outcome) => Json(serde_json::json!({ "outcome": outcome.as_str() })).into_response(),
        Err(e) => {
            let status = match &e {
                Error::Callback { reason, .. } if reason.contains("already answered") => {
                    StatusCode::CONFLICT
                }
                Error::Callback { reason, .. } if reason.contains("not a callback id") => {
                    StatusCode::BAD_REQUEST
                }
                Error::Callback { .. } => StatusCode::NOT_FOUND,
                Error::Config(_) => StatusCode::BAD_REQUEST,
                _ => {
                    warn!(error = %e, "callback: a database call failed");
                    return (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        Json(serde_json::json!({ "error": "internal error; try again" })),
                    )
                        .into_response();
                }
            };
            (status, Json(serde_json::json!({ "error": e.to_string() }))).into_response()
        }
    }
}
