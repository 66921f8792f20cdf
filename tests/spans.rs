//! Spans: one `ringwork.process` span per execution, attributed after
//! OpenTelemetry's messaging conventions, and spans for claim and completion batches. A layer of
//! its own records every span; the test binary installs it as the global subscriber, since the
//! client's tasks run on threads of their own.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringwork::{JobArgs, JobContext, JobError, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};
use support::{eventually, TestDb};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

type Fields = HashMap<String, String>;

/// Every span created: its name and its fields, including those recorded later.
#[derive(Clone, Default)]
struct Recorded {
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    /// span id -> index in `spans` (ids are reused once a span closes)
    live: Arc<Mutex<HashMap<u64, usize>>>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorded {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push((attrs.metadata().name().to_string(), fields));
        self.live
            .lock()
            .unwrap()
            .insert(id.into_u64(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let index = self.live.lock().unwrap().get(&id.into_u64()).copied();
        if let Some(index) = index {
            values.record(&mut Visitor(&mut self.spans.lock().unwrap()[index].1));
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Traced {
    fail: bool,
}

impl JobArgs for Traced {
    const KIND: &'static str = "traced";
}

#[tokio::test]
async fn each_execution_has_a_messaging_span_and_batches_have_theirs() {
    let recorded = Recorded::default();
    tracing_subscriber::registry()
        .with(recorded.clone())
        .try_init()
        .expect("the only subscriber of this test binary");

    let db = TestDb::new().await;
    let client = db
        .client()
        .queue("traced_q", QueueConfig::default())
        .register(|_ctx: JobContext, job: Traced| async move {
            // an event inside the handler belongs to the execution's span
            tracing::info!("handling");
            if job.fail {
                Err(JobError::Terminal("no".into()))
            } else {
                Ok(())
            }
        })
        .build()
        .await
        .unwrap();
    let ok = client
        .insert(
            NewJob::new(&Traced { fail: false })
                .unwrap()
                .queue("traced_q"),
        )
        .await
        .unwrap();
    let failing = client
        .insert(
            NewJob::new(&Traced { fail: true })
                .unwrap()
                .queue("traced_q"),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let storage = db.storage();
    assert!(
        eventually(Duration::from_secs(20), || async {
            let c = &storage.queue_counts(Some("traced_q")).await.unwrap()[0];
            c.completed == 1 && c.failed == 1
        })
        .await
    );
    running.shutdown(Duration::from_secs(5)).await;

    let spans = recorded.spans.lock().unwrap().clone();
    let process: Vec<&Fields> = spans
        .iter()
        .filter(|(name, _)| name == "ringwork.process")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(process.len(), 2, "one span per execution: {process:?}");
    for (job_id, outcome) in [(ok, "completed"), (failing, "failed")] {
        let span = process
            .iter()
            .find(|f| f.get("messaging.message.id") == Some(&job_id.to_string()))
            .unwrap_or_else(|| panic!("no span for job {job_id}: {process:?}"));
        assert_eq!(span["messaging.system"], "ringwork");
        assert_eq!(span["messaging.destination.name"], "traced_q");
        assert_eq!(span["messaging.operation.type"], "process");
        assert_eq!(span["otel.kind"], "consumer");
        assert_eq!(span["otel.name"], "process traced_q");
        assert_eq!(span["ringwork.job.kind"], "traced");
        assert_eq!(span["ringwork.outcome"], outcome);
    }
    assert_eq!(
        process
            .iter()
            .find(|f| f["ringwork.outcome"] == "failed")
            .unwrap()["error.type"],
        "failed"
    );
    let claimed: usize = spans
        .iter()
        .filter(|(name, f)| {
            name == "ringwork.claim"
                && f.get("messaging.destination.name").map(String::as_str) == Some("traced_q")
        })
        .filter_map(|(_, f)| {
            f.get("messaging.batch.message_count")?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(claimed, 2, "claim spans count the claimed jobs");
    let settled: usize = spans
        .iter()
        .filter(|(name, _)| name == "ringwork.complete")
        .filter_map(|(_, f)| {
            f.get("messaging.batch.message_count")?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(
        settled, 2,
        "completion-batch spans count the attempts they settle"
    );
    db.cleanup().await;
}
