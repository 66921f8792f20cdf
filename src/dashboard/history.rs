//! The overview's last hour: per-queue counts sampled in memory by the process serving the pages.
//! Nothing is written to the database for it; a restarted server starts a fresh hour (the page
//! says since when it has samples).

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Shared;
use crate::storage::QueueCounts;

/// One sample: every queue's exact counts at one moment, in byte order of their names (for a
/// binary search: an overview of 24 cards over an hour of samples of 1,000 queues looks up 8,640
/// counts).
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

    /// The newest sample.
    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    pub fn first_at(&self) -> Option<DateTime<Utc>> {
        self.samples.front().map(|s| s.at)
    }

    /// One queue's series over the samples: (when, per-minute completions, per-minute failures
    /// (failed and dead-lettered), available depth). Rates come from the durable totals of two
    /// consecutive samples, so a prune between them changes nothing.
    pub fn series(&self, queue: &str) -> Vec<(DateTime<Utc>, f64, f64, i64)> {
        let find = |s: &Sample| {
            s.queues
                .binary_search_by(|q| q.queue.as_str().cmp(queue))
                .ok()
                .map(|i| s.queues[i].clone())
        };
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

/// How many times as long as a sample took the sampler waits at least before the next: counting
/// every queue reads each one's shards (about 3 ms a queue), so with many queues the sampler
/// stretches its period rather than keep a database core busy (at 1,000 queues a sample takes
/// some 3 s: one every 30 s, a tenth of a core).
const SAMPLE_DUTY: u32 = 10;

/// Sample every `every` (or `SAMPLE_DUTY` times as long as the last sample took, when longer)
/// until the dashboard is dropped.
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
            let started = std::time::Instant::now();
            match shared.reads.queue_counts(None).await {
                Ok(mut queues) => {
                    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
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
            tokio::time::sleep(every.max(started.elapsed() * SAMPLE_DUTY)).await;
        }
    });
}
