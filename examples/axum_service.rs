//! A web service with its worker in one process: an axum app shares its `PgPool` with a ringwork
//! client, enqueues inside the request's own transaction (the user row and its email job commit
//! together, or neither does), mounts `/metrics`, `/healthz` and `/readyz`, and on SIGTERM or
//! SIGINT stops taking requests, then drains the running jobs before it exits.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example axum_service -- --serve`
//! serves on 127.0.0.1:3000 until interrupted (`curl -XPOST localhost:3000/signup -d alice`).
//! Without `--serve` it drives itself: it signs two users up over HTTP (one rolled back), waits
//! for the email job, reads its own health and metrics, then sends itself SIGTERM and checks
//! that it shut down cleanly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use ringwork::http::{router, Endpoints, PrometheusExporter};
use ringwork::{Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SCHEMA: &str = "ringwork_example_axum";

#[derive(Serialize, Deserialize)]
struct WelcomeEmail {
    user_id: i64,
}

impl JobArgs for WelcomeEmail {
    const KIND: &'static str = "welcome_email";
}

#[derive(Clone)]
struct App {
    pool: sqlx::PgPool,
    jobs: Client,
}

/// `POST /signup` with a name as the body: the user row and its welcome email in one
/// transaction. A name starting with `rollback` is rolled back after the enqueue, to show that
/// its job never runs.
async fn signup(State(app): State<App>, name: String) -> Result<String, (StatusCode, String)> {
    let failed = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let mut tx = app.pool.begin().await.map_err(|e| failed(&e))?;
    let user_id: i64 = sqlx::query_scalar(&format!(
        "INSERT INTO {SCHEMA}_app.users (name) VALUES ($1) RETURNING id"
    ))
    .bind(name.trim())
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| failed(&e))?;
    let job = NewJob::new(&WelcomeEmail { user_id })
        .map_err(|e| failed(&e))?
        .queue("mail");
    let job_id = app
        .jobs
        .insert_tx(&mut tx, job)
        .await
        .map_err(|e| failed(&e))?;
    if name.starts_with("rollback") {
        tx.rollback().await.map_err(|e| failed(&e))?;
        return Ok(format!("rolled back user {user_id} and job {job_id}\n"));
    }
    tx.commit().await.map_err(|e| failed(&e))?;
    Ok(format!("{job_id}\n"))
}

/// Resolves on the first SIGTERM (what a container runtime sends) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("cannot listen for SIGTERM ({e}); Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let serve = std::env::args().any(|a| a == "--serve");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await?;
    // the application's own table, in a schema of its own
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {SCHEMA}_app"))
        .execute(&pool)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA}_app.users (id bigserial PRIMARY KEY, name text NOT NULL)"
    ))
    .execute(&pool)
    .await?;

    let exporter = Arc::new(PrometheusExporter::new(|provider| provider)?);
    let jobs = Client::builder(pool.clone())
        .schema(SCHEMA)
        .queue("mail", QueueConfig::default())
        .telemetry(exporter.telemetry())
        .register(|_ctx: JobContext, job: WelcomeEmail| async move {
            println!("sending the welcome email of user {}", job.user_id);
            Ok::<(), JobError>(())
        })
        .build()
        .await?;
    let running = jobs.start().await?;

    let app = Router::new()
        .route("/signup", post(signup))
        .with_state(App {
            pool: pool.clone(),
            jobs: jobs.clone(),
        })
        .merge(router(
            Endpoints::new(jobs.admin())
                .prometheus(Arc::clone(&exporter))
                .liveness(running.liveness()),
        ));
    let listener = tokio::net::TcpListener::bind(if serve {
        "127.0.0.1:3000"
    } else {
        "127.0.0.1:0"
    })
    .await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
    });

    if !serve {
        drive(addr, &jobs).await?;
        // what an orchestrator does to stop the service
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()?;
        if !status.success() {
            return Err("could not send SIGTERM to this process".into());
        }
    }
    // the server returns once the signal came and the requests in flight are answered...
    server.await??;
    // ...then the workers stop claiming, running jobs get up to 30 s, completions are flushed
    running.shutdown(Duration::from_secs(30)).await;
    println!("shut down cleanly");
    if !serve {
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {SCHEMA}_app CASCADE"))
            .execute(&pool)
            .await?;
    }
    Ok(())
}

/// The self-check: the committed signup's job completes, the rolled-back one never existed,
/// health is green and the metrics count the job.
async fn drive(
    addr: std::net::SocketAddr,
    jobs: &Client,
) -> Result<(), Box<dyn std::error::Error>> {
    let (status, body) = request(addr, "POST", "/signup", "alice").await?;
    if status != 200 {
        return Err(format!("signup answered {status}: {body}").into());
    }
    let job_id: i64 = body.trim().parse()?;
    let (status, body) = request(addr, "POST", "/signup", "rollback-bob").await?;
    if status != 200 {
        return Err(format!("signup answered {status}: {body}").into());
    }
    let rolled_back: i64 = body
        .split_whitespace()
        .last()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| format!("unexpected answer {body:?}"))?;

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = jobs.admin().job_state(job_id).await?.map(|s| s.state);
        if state == Some(JobStatus::Completed) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("job {job_id} is {state:?} after 20 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if jobs.admin().job_state(rolled_back).await?.is_some() {
        return Err(format!("the rolled-back job {rolled_back} exists").into());
    }
    let (status, body) = request(addr, "GET", "/healthz", "").await?;
    if status != 200 {
        return Err(format!("/healthz answered {status}: {body}").into());
    }
    let (status, body) = request(addr, "GET", "/metrics", "").await?;
    if status != 200 || !body.contains("ringwork_jobs_finished") {
        return Err(format!("/metrics answered {status} without ringwork_jobs_finished").into());
    }
    println!(
        "job {job_id} completed; job {rolled_back} was rolled back; /healthz and /metrics answer"
    );
    Ok(())
}

/// A one-shot HTTP/1.1 request (the example needs no HTTP client crate): the status and body.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
