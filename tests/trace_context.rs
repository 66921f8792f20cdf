//! Traces linked to the producer: the W3C traceparent of the span that enqueued
//! a job is stored with it, and every execution's `ringwork.process` span is that span's child,
//! on the first attempt and after a retry. The test exports spans through tracing-opentelemetry
//! into OpenTelemetry's in-memory exporter, installed as the global subscriber (the client's tasks
//! run on threads of their own).

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use ringwork::{Error, JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, fast_maintenance, TestDb};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

#[derive(Serialize, Deserialize)]
struct Flaky {
    tag: u32,
}
impl JobArgs for Flaky {
    const KIND: &'static str = "flaky";
}

fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static INSTALLED: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ringwork-test"));
        tracing_subscriber::registry()
            .with(layer)
            .try_init()
            .expect("the only subscriber of this test binary");
        (exporter, provider)
    })
}

fn finished_spans() -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    let _ = provider.force_flush();
    exporter.get_finished_spans().expect("in-memory exporter")
}

/// The `process default` spans of one job (by its `messaging.message.id`).
fn executions(spans: &[SpanData], job_id: i64) -> Vec<SpanData> {
    spans
        .iter()
        .filter(|s| s.name == "process default")
        .filter(|s| {
            s.attributes.iter().any(|kv| {
                kv.key.as_str() == "messaging.message.id"
                    && kv.value.to_string() == job_id.to_string()
            })
        })
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_are_children_of_the_producer_span_also_after_a_retry() {
    exporter();
    let db = TestDb::new().await;
    let storage = db.storage();
    let attempts = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&attempts);
    let client = db
        .client()
        .maintenance(fast_maintenance())
        .queue(
            "default",
            QueueConfig {
                max_workers: 4,
                poll_interval: Duration::from_millis(50),
                ..QueueConfig::default()
            },
        )
        .register(move |ctx: JobContext, _args: Flaky| {
            let attempts = Arc::clone(&counted);
            async move {
                attempts.fetch_add(1, Ordering::SeqCst);
                if ctx.attempt == 1 {
                    return Err(JobError::RetryAfter(
                        Duration::from_millis(10),
                        "first attempt fails".into(),
                    ));
                }
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();

    // 1. enqueued inside a producer span: the trace is taken from it
    let producer = tracing::info_span!("produce");
    let traced = async {
        let mut conn = db.pool.acquire().await.unwrap();
        storage
            .insert(&mut conn, &NewJob::new(&Flaky { tag: 1 }).unwrap())
            .await
            .unwrap()
    }
    .instrument(producer.clone())
    .await;
    drop(producer);
    // 2. enqueued from SQL with an explicit traceparent (another language's producer)
    let remote_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let remote_span = "00f067aa0ba902b7";
    let from_sql = db
        .scalar_i64(&format!(
            "SELECT {}.enqueue('default', 'flaky', '{{\"tag\": 2}}', 2, 25, NULL, '00-{remote_trace}-{remote_span}-01')",
            db.schema.as_str()
        ))
        .await;
    // 3. enqueued outside any span: no parent
    let untraced = {
        let mut conn = db.pool.acquire().await.unwrap();
        storage
            .insert(&mut conn, &NewJob::new(&Flaky { tag: 3 }).unwrap())
            .await
            .unwrap()
    };

    assert!(
        eventually(Duration::from_secs(30), || {
            let attempts = Arc::clone(&attempts);
            async move { attempts.load(Ordering::SeqCst) == 6 }
        })
        .await,
        "three jobs, two attempts each"
    );
    running.shutdown(Duration::from_secs(10)).await;
    let spans = finished_spans();

    let producer = spans
        .iter()
        .find(|s| s.name == "produce")
        .expect("the producer span was exported");
    let runs = executions(&spans, traced);
    assert_eq!(runs.len(), 2, "one span per attempt of the traced job");
    for run in &runs {
        assert_eq!(
            run.span_context.trace_id(),
            producer.span_context.trace_id(),
            "an execution left the producer's trace"
        );
        assert_eq!(run.parent_span_id, producer.span_context.span_id());
    }

    let runs = executions(&spans, from_sql);
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(run.span_context.trace_id().to_string(), remote_trace);
        assert_eq!(run.parent_span_id.to_string(), remote_span);
    }

    let runs = executions(&spans, untraced);
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(
            run.parent_span_id,
            SpanId::INVALID,
            "an untraced job got a parent"
        );
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_malformed_traceparent_is_refused_before_anything_is_written() {
    let db = TestDb::new().await;
    let storage = db.storage();
    let mut conn = db.pool.acquire().await.unwrap();
    let job = NewJob::new(&Flaky { tag: 0 })
        .unwrap()
        .traceparent("00-not-a-trace-01");
    match storage.insert(&mut conn, &job).await {
        Err(Error::Config(message)) => assert!(message.contains("traceparent"), "{message}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    let refused = sqlx::query(&format!(
        "SELECT {}.enqueue('default', 'flaky', '{{}}', 2, 25, NULL, 'garbage')",
        db.schema.as_str()
    ))
    .execute(&db.pool)
    .await;
    match refused {
        Err(sqlx::Error::Database(e)) => {
            assert_eq!(e.code().as_deref(), Some("22023"));
            assert!(e.message().contains("traceparent"), "{}", e.message());
        }
        other => panic!("expected SQLSTATE 22023, got {other:?}"),
    }
    let stored = db
        .scalar_i64(&format!(
            "SELECT (SELECT count(*) FROM {s}.ready_entries) + (SELECT count(*) FROM {s}.deferred_jobs)",
            s = db.schema.as_str()
        ))
        .await;
    assert_eq!(stored, 0);
    db.cleanup().await;
}

/// A bulk insert (over 64 jobs of one lane: written with COPY) stores its producer's traceparent in
/// every row as 25 bytes, and a claim hands each job the same traceparent back as text. A row
/// holding other bytes (what a process of the build before schema 17 writes with COPY) is claimed
/// without a parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_insert_stores_its_producers_trace_in_25_bytes_and_a_claim_returns_it() {
    exporter();
    let db = TestDb::new().await;
    let storage = db.storage();
    let jobs: Vec<NewJob> = (0..100)
        .map(|tag| NewJob::new(&Flaky { tag }).unwrap())
        .collect();
    let producer = tracing::info_span!("bulk produce");
    let ids = async {
        let mut conn = db.pool.acquire().await.unwrap();
        storage.insert_many(&mut conn, &jobs).await.unwrap()
    }
    .instrument(producer.clone())
    .await;
    drop(producer);
    assert_eq!(ids.len(), 100);
    let producer = finished_spans()
        .into_iter()
        .find(|s| s.name == "bulk produce")
        .expect("the producer span was exported");
    let expected = format!(
        "00-{}-{}-01",
        producer.span_context.trace_id(),
        producer.span_context.span_id()
    );

    let s = db.schema.as_str();
    let stored_as_bytes = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM {s}.ready_entries WHERE octet_length(traceparent) = 25
                AND {s}.traceparent_text(traceparent) = '{expected}'"
        ))
        .await;
    assert_eq!(
        stored_as_bytes, 100,
        "every row stores the trace in 25 bytes"
    );

    // one row as an older build's COPY writes it: the text's own 55 bytes (a test-only UPDATE to
    // put a row in that form; the engine never updates ring rows)
    db.exec(&format!(
        "UPDATE {s}.ready_entries SET traceparent = convert_to('{expected}', 'UTF8') WHERE job_id = {}",
        ids[0]
    ))
    .await;

    let claimed = storage.claim("default", 100, None).await.unwrap();
    assert_eq!(claimed.len(), 100);
    for job in &claimed {
        let want = (job.job_id != ids[0]).then_some(expected.as_str());
        assert_eq!(job.traceparent.as_deref(), want, "job {}", job.job_id);
    }
    db.cleanup().await;
}
