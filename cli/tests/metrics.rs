//! Metrics and health against a real server: a client's events and the
//! database's state reach the Prometheus endpoint of the library's router; `/healthz` follows the
//! client's dispatchers; `/readyz` names the maintenance leader; `ringwork serve` answers the same
//! endpoints and pushes OTLP to a test receiver.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::http::{router, Endpoints, PrometheusExporter};
use ringwork::testing::{eventually, TestDatabase};
use ringwork::{JobArgs, JobContext, JobError, MaintenanceConfig, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Serialize, Deserialize)]
struct Outcome {
    fail: bool,
}

impl JobArgs for Outcome {
    const KIND: &'static str = "metrics_outcome";
}

/// A workflow step that, when `spawn`, adds a step behind itself to its workflow while it runs.
#[derive(Serialize, Deserialize)]
struct Fan {
    spawn: bool,
}

impl JobArgs for Fan {
    const KIND: &'static str = "metrics_fan";
}

/// One HTTP/1.1 GET: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of the first sample of `name` carrying every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(head, _)| {
            head.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| head.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, value)| value.parse().expect("a number"))
}

#[tokio::test]
async fn events_and_database_state_reach_the_prometheus_endpoint_and_health_follows_the_client() {
    let db = TestDatabase::new().await.unwrap();
    let exporter = Arc::new(PrometheusExporter::new(|provider| provider).unwrap());
    // maintenance leads (for /readyz) but does not rotate here, so the ring keeps the terminal
    // rows that `completed` counts; the next test counts rotations and prunes
    let client = db
        .client()
        .maintenance(MaintenanceConfig {
            // longer than the test template (whose slots these are) may have been kept
            rotate_interval: Duration::from_secs(10 * 365 * 24 * 3600),
            ..ringwork::testing::fast_maintenance()
        })
        .telemetry(exporter.telemetry())
        .queue(
            "metrics_q",
            QueueConfig {
                max_workers: 4,
                ..QueueConfig::default()
            },
        )
        .register(|_ctx: JobContext, job: Outcome| async move {
            if job.fail {
                Err(JobError::Terminal("asked to fail".into()))
            } else {
                Ok(())
            }
        })
        .queue("metrics_fan", QueueConfig::default())
        .register({
            let pool = db.pool().clone();
            move |ctx: JobContext, job: Fan| {
                let pool = pool.clone();
                async move {
                    if job.spawn {
                        let child = NewJob::new(&Fan { spawn: false })
                            .unwrap()
                            .queue("metrics_fan");
                        let mut conn = pool
                            .acquire()
                            .await
                            .map_err(|e| JobError::Retry(e.to_string()))?;
                        ctx.add_workflow_steps(
                            &mut conn,
                            ringwork::Workflow::new()
                                .step(ringwork::Step::new("child", child).after(&["fan"])),
                        )
                        .await
                        .map_err(|e| JobError::Retry(e.to_string()))?;
                    }
                    Ok::<(), JobError>(())
                }
            }
        })
        .build()
        .await
        .unwrap();
    for fail in [false, false, false, true] {
        client
            .insert(NewJob::new(&Outcome { fail }).unwrap().queue("metrics_q"))
            .await
            .unwrap();
    }
    // a workflow waiting in a queue nobody works, and a batch cancelled, for the workflow gauges
    let idle = || {
        NewJob::new(&Outcome { fail: false })
            .unwrap()
            .queue("metrics_idle")
    };
    client
        .insert_workflow(
            ringwork::Workflow::new()
                .step(ringwork::Step::new("first", idle()))
                .step(ringwork::Step::new("second", idle()).after(&["first"])),
        )
        .await
        .unwrap();
    // a step that adds a step behind itself while it runs
    client
        .insert_workflow(
            ringwork::Workflow::new().step(ringwork::Step::new(
                "fan",
                NewJob::new(&Fan { spawn: true })
                    .unwrap()
                    .queue("metrics_fan"),
            )),
        )
        .await
        .unwrap();
    let batch = client
        .insert_batch(ringwork::Batch::new().member(idle()).callback(idle()))
        .await
        .unwrap();
    assert_eq!(
        client
            .admin()
            .cancel_workflow(batch.batch_id)
            .await
            .unwrap(),
        Some(2)
    );
    // a session pinning the horizon, for the canary's gauges
    let mut holder = db.pool().acquire().await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT txid_current();")
        .execute(&mut *holder)
        .await
        .unwrap();
    // older than the endpoint's horizon_min_age (100 ms) by the time of the scrape (real time:
    // pg_stat_activity's age, which the engine clock does not move)
    tokio::time::sleep(Duration::from_millis(300)).await;

    let running = client.start().await.unwrap();
    let storage = db.storage();
    assert!(
        eventually(Duration::from_secs(20), || async {
            let counts = storage.queue_counts(Some("metrics_q")).await.unwrap();
            let fan = storage.queue_counts(Some("metrics_fan")).await.unwrap();
            counts
                .first()
                .is_some_and(|c| c.completed == 3 && c.failed == 1 && c.running == 0)
                && fan.first().is_some_and(|c| c.completed == 2)
        })
        .await,
        "the four jobs did not finish"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(
        Endpoints::new(storage.clone().into())
            .prometheus(Arc::clone(&exporter))
            .liveness(running.liveness())
            .horizon_min_age(Duration::from_millis(100)),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // A scrape serves what its database reads finished within the endpoint's budget (a loaded
    // machine can miss it once); scrape until all of them have been read.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        if sample(&text, "ringwork_state_read_ok", &[]) == Some(1.0) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no scrape read every database gauge: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let q = ("queue", "metrics_q");
    let kind = ("kind", "metrics_outcome");
    assert_eq!(
        sample(&text, "ringwork_jobs_enqueued_total", &[q]),
        Some(4.0),
        "{text}"
    );
    // a workflow's steps (those a running step adds too) and a batch's members and callback
    // count as enqueued; a step waiting for the one before it counts as pending
    assert_eq!(
        sample(
            &text,
            "ringwork_jobs_enqueued_total",
            &[("queue", "metrics_fan")]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_queue_jobs",
            &[("queue", "metrics_idle"), ("state", "pending")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_jobs_enqueued_total",
            &[("queue", "metrics_idle")]
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ringwork_jobs_claimed_total", &[q]),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_jobs_finished_total",
            &[q, kind, ("outcome", "completed")]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_jobs_finished_total",
            &[q, kind, ("outcome", "failed")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_job_duration_seconds_count",
            &[q, kind, ("outcome", "completed")]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ringwork_job_pickup_latency_seconds_count", &[q]),
        Some(4.0),
        "{text}"
    );
    // state read from the database at scrape time
    assert_eq!(
        sample(&text, "ringwork_queue_jobs", &[q, ("state", "completed")]),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "ringwork_queue_jobs", &[q, ("state", "failed")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "ringwork_queue_jobs", &[q, ("state", "available")]),
        Some(0.0)
    );
    assert_eq!(sample(&text, "ringwork_queue_paused", &[q]), Some(0.0));
    assert_eq!(
        sample(
            &text,
            "ringwork_workflows",
            &[("kind", "workflow"), ("state", "running")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_workflows",
            &[("kind", "batch"), ("state", "cancelled")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_workflows",
            &[("kind", "sequence"), ("state", "running")]
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "ringwork_queue_oldest_wait_seconds", &[q]),
        Some(0.0),
        "nothing is waiting"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_ring_slots",
            &[("ring", "queue"), ("state", "current")]
        ),
        Some(1.0)
    );
    assert!(
        sample(&text, "ringwork_horizon_holders", &[("kind", "session")]).unwrap_or(0.0) >= 1.0,
        "the held transaction is a horizon holder: {text}"
    );
    assert!(
        sample(
            &text,
            "ringwork_horizon_oldest_age_seconds",
            &[("kind", "session")]
        )
        .unwrap_or(0.0)
            > 0.0
    );
    assert!(
        sample(
            &text,
            "ringwork_table_dead_tuples",
            &[("table", "ready_entries")]
        )
        .is_some(),
        "dead tuples of ringwork's own tables are exported: {text}"
    );

    let (status, body) = get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let readiness: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(readiness["migrated"], true);
    assert_eq!(readiness["functions_current"], true);
    assert!(
        eventually(Duration::from_secs(5), || async {
            let (_, body) = get(addr, "/readyz").await;
            serde_json::from_str::<serde_json::Value>(&body).unwrap()["leader_pid"]
                .as_i64()
                .is_some()
        })
        .await,
        "the client's maintenance leads"
    );

    // the client stops: liveness fails; a service's readiness does not hang on the leader
    running.shutdown(Duration::from_secs(5)).await;
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (503, "shutting down\n"));
    assert!(
        eventually(Duration::from_secs(5), || async {
            let (status, body) = get(addr, "/readyz").await;
            status == 200
                && serde_json::from_str::<serde_json::Value>(&body).unwrap()["leader_pid"].is_null()
        })
        .await,
        "without require_leader, readyz stays ready when no process leads"
    );

    server.abort();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);
    db.drop().await.unwrap();
}

/// `ringwork_queue_unworked` names a queue whose jobs wait while nobody claims from it, and only
/// such a queue: one with a job running is worked, a paused one is waiting on purpose, and fresh
/// jobs are not a sign of anything.
#[tokio::test]
async fn a_scrape_names_the_queues_whose_jobs_nobody_works() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    for queue in ["mail", "mail", "busy", "busy", "held"] {
        let job = NewJob::from_parts("k", serde_json::json!({})).unwrap();
        storage.insert(&mut conn, &job.queue(queue)).await.unwrap();
    }
    drop(conn);
    assert!(db.admin().set_queue_paused("held", true).await.unwrap());
    assert_eq!(storage.claim("busy", 1, None).await.unwrap().len(), 1);

    let exporter = Arc::new(PrometheusExporter::new(|provider| provider).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(Endpoints::new(db.admin()).prometheus(Arc::clone(&exporter)));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let unworked =
        |text: &str, queue: &str| sample(text, "ringwork_queue_unworked", &[("queue", queue)]);

    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        sample(&text, "ringwork_state_read_ok", &[]),
        Some(1.0),
        "{text}"
    );
    for queue in ["mail", "busy", "held"] {
        assert_eq!(
            unworked(&text, queue),
            Some(0.0),
            "{queue}: fresh jobs\n{text}"
        );
    }
    // longer than UNWORKED_AFTER: nobody claimed from "mail" meanwhile
    db.advance_clock(ringwork::telemetry::UNWORKED_AFTER * 2)
        .await
        .unwrap();
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(
        sample(&text, "ringwork_state_read_ok", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(unworked(&text, "mail"), Some(1.0), "{text}");
    assert_eq!(unworked(&text, "busy"), Some(0.0), "a job runs\n{text}");
    assert_eq!(unworked(&text, "held"), Some(0.0), "paused\n{text}");
    // a process claims one of its two jobs: worked again, though one still waits
    assert_eq!(storage.claim("mail", 1, None).await.unwrap().len(), 1);
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(unworked(&text, "mail"), Some(0.0), "{text}");
    server.abort();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn the_maintenance_leader_counts_its_rotations_and_prunes() {
    let db = TestDatabase::new().await.unwrap();
    let exporter = PrometheusExporter::new(|provider| provider).unwrap();
    let client = db
        .client()
        .telemetry(exporter.telemetry())
        .queue("metrics_m", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Outcome| async move { Ok::<(), JobError>(()) })
        .build()
        .await
        .unwrap();
    client
        .insert(
            NewJob::new(&Outcome { fail: false })
                .unwrap()
                .queue("metrics_m"),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    // fast maintenance: rotate after 200 ms once a slot holds something, prune when provable
    let counted = |name: &'static str, ring: &'static str| {
        let text = exporter.render().unwrap();
        sample(&text, name, &[("ring", ring)]).unwrap_or(0.0)
    };
    assert!(
        eventually(Duration::from_secs(20), || async {
            counted("ringwork_ring_rotations_total", "queue") >= 1.0
                && counted("ringwork_ring_rotations_total", "claim") >= 1.0
                && counted("ringwork_ring_prunes_total", "queue") >= 1.0
                && counted("ringwork_ring_prunes_total", "claim") >= 1.0
        })
        .await,
        "rotations and prunes were not counted: {}",
        exporter.render().unwrap()
    );
    running.shutdown(Duration::from_secs(5)).await;
    db.drop().await.unwrap();
}

/// A minimal OTLP/HTTP receiver: records (path, content type, body) of every POST and answers 200.
async fn otlp_receiver() -> (SocketAddr, Arc<Mutex<Vec<(String, String, Vec<u8>)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                // keep-alive: one connection may carry several exports
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                    let (mut length, mut content_type) = (0usize, String::new());
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':') {
                            match name.to_ascii_lowercase().as_str() {
                                "content-length" => length = value.trim().parse().unwrap_or(0),
                                "content-type" => content_type = value.trim().to_string(),
                                _ => {}
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    sink.lock().unwrap().push((path, content_type, body));
                    let _ = reader
                        .get_mut()
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
            });
        }
    });
    (addr, received)
}

#[tokio::test]
async fn serve_answers_metrics_health_and_readiness_and_pushes_otlp() {
    let db = TestDatabase::new().await.unwrap();
    db.storage().ensure_queue("served_q").await.unwrap();
    let (otlp, received) = otlp_receiver().await;
    let otlp_endpoint = format!("http://{otlp}/v1/metrics");
    let (mut serve, addr) = common::spawn_serve(&[
        "--otlp-interval-secs",
        "1",
        "--otlp-endpoint",
        &otlp_endpoint,
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await;

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_string()));
    // serve takes part in the election: alone on this schema, it leads
    assert!(
        eventually(Duration::from_secs(10), || async {
            get(addr, "/readyz").await.0 == 200
        })
        .await,
        "serve never became ready"
    );
    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        sample(
            &text,
            "ringwork_queue_jobs",
            &[("queue", "served_q"), ("state", "available")]
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ringwork_ring_slots",
            &[("ring", "claim"), ("state", "current")]
        ),
        Some(1.0),
        "{text}"
    );

    // OTLP: at least one export with the state gauges in it
    assert!(
        eventually(Duration::from_secs(15), || async {
            received
                .lock()
                .unwrap()
                .iter()
                .any(|(path, content_type, body)| {
                    path == "/v1/metrics"
                        && content_type == "application/x-protobuf"
                        && contains(body, b"ringwork.queue.jobs")
                        && contains(body, b"served_q")
                })
        })
        .await,
        "no OTLP export with ringwork.queue.jobs reached the receiver ({} requests)",
        received.lock().unwrap().len()
    );

    // SIGTERM (how containers stop a process): a clean exit
    let pid = serve.id().expect("running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let exit = tokio::time::timeout(Duration::from_secs(15), serve.wait())
        .await
        .expect("serve stops on SIGTERM")
        .unwrap();
    assert!(exit.success(), "serve exited with {exit}");
    db.drop().await.unwrap();
}

#[tokio::test]
async fn a_scrape_with_the_database_unreachable_answers_in_time_and_marks_the_state_stale() {
    // a pool on a port nothing listens on, with an acquire timeout longer than a scrape's
    let options: sqlx::postgres::PgConnectOptions =
        "postgres://postgres@127.0.0.1:1/none".parse().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(30))
        .connect_lazy_with(options);
    let storage = ringwork::Storage::new(pool, ringwork::SchemaName::new("ringwork").unwrap());
    let exporter = Arc::new(PrometheusExporter::new(|provider| provider).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(Endpoints::new(storage.into()).prometheus(Arc::clone(&exporter)));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let started = std::time::Instant::now();
    let (status, text) = get(addr, "/metrics").await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{text}");
    assert!(took < Duration::from_secs(8), "the scrape took {took:?}");
    assert_eq!(
        sample(&text, "ringwork_state_read_ok", &[]),
        Some(0.0),
        "{text}"
    );
    server.abort();
}

#[tokio::test]
async fn serve_refuses_a_schema_that_is_not_installed() {
    let db = TestDatabase::new().await.unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            db.url(),
        ])
        .args(["--schema", "rw_never_installed"])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not installed"), "{stderr}");
    db.drop().await.unwrap();
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
