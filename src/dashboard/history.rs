//! The overview's last hour: per-queue counts sampled in memory by the process serving the pages.
//! Nothing is written to the database for it; a restarted server starts a fresh hour (the page
//! says since when it has samples).

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Shared;
use crate::storage::QueueCounts;

/// One sample: every queue's exact counts at one moment.
pub(crate) struct Sample {
    pub at: DateTime<Utc>,
    pub queues: Vec<QueueCounts>,
}

pub(crate) struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
}

impl History {
    pub fn new(every: Duration, span: Duration) -> Self {
        let capacity = (span.as_secs_f64() / every.as_secs_f64()).ceil().max(2.0) as usize + 1;
        Self {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    pub fn push(&mut self, sample: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn first_at(&self) -> Option<DateTime<Utc>> {
        self.samples.front().map(|s| s.at)
    }

    /// One queue's series over the samples: (when, per-minute completions, per-minute failures
    /// (failed and dead-lettered), available depth). Rates come from the durable totals of two
    /// consecutive samples, so a prune between them changes nothing.
    pub fn series(&self, queue: &str) -> Vec<(DateTime<Utc>, f64, f64, i64)> {
        let find = |s: &Sample| s.queues.iter().find(|q| q.queue == queue).cloned();
        let mut out = Vec::new();
        let mut previous: Option<(DateTime<Utc>, QueueCounts)> = None;
        for sample in &self.samples {
            let Some(counts) = find(sample) else {
                continue;
            };
            if let Some((at, before)) = &previous {
                let minutes = (sample.at - *at).num_milliseconds() as f64 / 60_000.0;
                if minutes > 0.0 {
                    let rate = |now: i64, then: i64| (now - then).max(0) as f64 / minutes;
                    out.push((
                        sample.at,
                        rate(counts.completed, before.completed),
                        rate(
                            counts.failed + counts.dead_lettered,
                            before.failed + before.dead_lettered,
                        ),
                        counts.available,
                    ));
                }
            }
            previous = Some((sample.at, counts));
        }
        out
    }
}

/// Sample every `every` until the dashboard is dropped.
pub(crate) fn spawn_sampler(shared: Weak<Shared>, every: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("dashboard: no Tokio runtime; the overview will have no history");
        return;
    };
    runtime.spawn(async move {
        loop {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            match shared.reads.queue_counts(None).await {
                Ok(queues) => {
                    if let Ok(mut history) = shared.history.lock() {
                        history.push(Sample {
                            at: Utc::now(),
                            queues,
                        });
                    }
                }
                Err(e) => tracing::warn!(error = %e, "dashboard: sampling the counts failed"),
            }
            drop(shared);
            tokio::time::sleep(every).await;
        }
    });
}
