//! Mounting ringwork's `/metrics`, `/healthz` and `/readyz` in your own axum server, beside your
//! routes, with the client's events and the database's state on the same Prometheus registry.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p ringwork-cli --example metrics_server`
//! then `curl 127.0.0.1:9464/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use ringwork::http::{router, Endpoints, PrometheusExporter};
use ringwork::{Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Ping {
    n: u32,
}

impl JobArgs for Ping {
    const KIND: &'static str = "ping";
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    let prometheus = Arc::new(PrometheusExporter::new(|provider| provider)?);
    let client = Client::builder(pool)
        .schema("ringwork_example_metrics")
        .telemetry(prometheus.telemetry())
        .queue("pings", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Ping| async { Ok::<(), JobError>(()) })
        .build()
        .await?;
    for n in 0..100 {
        client
            .insert(NewJob::new(&Ping { n })?.queue("pings"))
            .await?;
    }
    let running = client.start().await?;
    let app = axum::Router::new()
        .route("/", get(|| async { "your service\n" }))
        .merge(router(
            Endpoints::new(client.admin())
                .prometheus(prometheus)
                .liveness(running.liveness()),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
    println!("serving on http://127.0.0.1:9464 (/metrics, /healthz, /readyz) for 30 s");
    let server = axum::serve(listener, app);
    let _ = tokio::time::timeout(Duration::from_secs(30), server).await;
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
