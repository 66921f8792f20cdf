//! The overview's last hour: per-queue counts sampled in memory by the process serving the pages.
//! Nothing is written to the database for it; a restarted server starts a fresh hour (the page
//! says since when it has samples).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

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

/// How much of its time the sampler spends counting: after each statement it rests
/// `SAMPLE_DUTY - 1` times as long as the statement took. Counting every queue reads each one's
/// shards (about 3 ms a queue), so with many queues a sample is spread over a longer period rather
/// than keep a database core busy (at 1,000 queues some 3 s of counting: one sample every 30 s or
/// more, a tenth of a core), and a page rarely meets one of its statements.
const SAMPLE_DUTY: u32 = 10;

/// Queues a sample statement counts: a page that starts while one runs shares the server with it
/// for a few milliseconds, not the tens a page's own statements of `COUNTED_PER_STATEMENT` take.
const SAMPLED_PER_STATEMENT: usize = 2;

/// From how many queues a sample waits for quiet moments between pages: below it, a whole sample
/// costs about what one page of queue counts (50) costs, and waiting would only thin the samples of
/// a dashboard someone is using.
const YIELD_ABOVE_QUEUES: usize = 50;

/// How long the sampler holds back one statement of its count for pages being served: past it,
/// it counts anyway, so a dashboard that is never quiet still gets its samples (slower ones).
const YIELD_AT_MOST: Duration = Duration::from_secs(2);

/// How long after the last page the sampler waits before its next statement: an operator's
/// browser loads a page's stylesheet and script right after it, and a page's live refresh or the
/// next click follows within moments; a sample statement started in between makes them wait.
pub(crate) const QUIET_AFTER_A_PAGE: Duration = Duration::from_millis(250);

/// The pages being served now and when the last one ended, so the sampler counts between them:
/// a sample of 1,000 queues is seconds of server work, and a page loaded during it waited behind
/// it on a 2-core server.
pub(crate) struct Serving {
    now: AtomicUsize,
    last_ended: Mutex<Option<tokio::time::Instant>>,
    idle: Notify,
    quiet: Duration,
}

/// A page being served, until dropped.
pub(crate) struct ServingGuard<'a>(&'a Serving);

impl Serving {
    pub fn new(quiet: Duration) -> Self {
        Self {
            now: AtomicUsize::new(0),
            last_ended: Mutex::new(None),
            idle: Notify::new(),
            quiet,
        }
    }

    pub fn enter(&self) -> ServingGuard<'_> {
        self.now.fetch_add(1, Ordering::SeqCst);
        ServingGuard(self)
    }

    /// Wait until no page has been served for the quiet period, or `at_most` passed.
    pub async fn until_quiet(&self, at_most: Duration) {
        let deadline = tokio::time::Instant::now() + at_most;
        while tokio::time::Instant::now() < deadline {
            // registered before the check, so a page that ends between the two still wakes it
            let idle = self.idle.notified();
            if self.now.load(Ordering::SeqCst) > 0 {
                let _ = tokio::time::timeout_at(deadline, idle).await;
                continue;
            }
            let last_ended = self.last_ended.lock().ok().and_then(|at| *at);
            match last_ended.map(|at| at + self.quiet) {
                // a page may start and end meanwhile: look again then
                Some(quiet_from) if quiet_from > tokio::time::Instant::now() => {
                    tokio::time::sleep_until(quiet_from.min(deadline)).await;
                }
                _ => return,
            }
        }
    }
}

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut at) = self.0.last_ended.lock() {
            *at = Some(tokio::time::Instant::now());
        }
        if self.0.now.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Sample every `every` (or as often as `SAMPLE_DUTY` lets the sample's statements follow each
/// other, when that is longer) until the dashboard is dropped. A sample counts the queues one
/// short statement at a time, each after the pages being served are done (`Serving`), so pages
/// keep their connections and the server's cores.
pub(crate) fn spawn_sampler(shared: Weak<Shared>, every: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("dashboard: no Tokio runtime; the overview will have no history");
        return;
    };
    runtime.spawn(async move {
        loop {
            let started = std::time::Instant::now();
            match sample(&shared).await {
                // the dashboard was dropped
                None => return,
                Some(Ok(queues)) => {
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    if let Ok(mut history) = shared.history.lock() {
                        history.push(Sample {
                            at: Utc::now(),
                            queues,
                        });
                    };
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "dashboard: sampling the counts failed")
                }
            }
            tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
        }
    });
}

/// Every queue's counts, in name order, one statement at a time between pages; `None` once the
/// dashboard is dropped. A sample of many queues is spread over minutes, so it holds the dashboard
/// (and its connections) only while a statement runs, not while it rests.
async fn sample(shared: &Weak<Shared>) -> Option<crate::Result<Vec<QueueCounts>>> {
    let names = match shared.upgrade()?.reads.queue_names().await {
        Ok(names) => names,
        Err(e) => return Some(Err(e)),
    };
    let mut queues = Vec::with_capacity(names.len());
    // a sample of a few queues costs less than a page: only a large one waits for quiet moments
    let between_pages = names.len() > YIELD_ABOVE_QUEUES;
    for chunk in names.chunks(SAMPLED_PER_STATEMENT) {
        let started = {
            let shared = shared.upgrade()?;
            if between_pages {
                shared.serving.until_quiet(YIELD_AT_MOST).await;
            }
            let started = std::time::Instant::now();
            match shared.reads.queue_counts_of(chunk).await {
                Ok(counted) => queues.extend(counted),
                Err(e) => return Some(Err(e)),
            }
            started
        };
        tokio::time::sleep(started.elapsed() * (SAMPLE_DUTY - 1)).await;
    }
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    Some(Ok(queues))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::{pin, Pin};
    use std::task::{Context, Poll, Waker};

    fn poll_once(future: Pin<&mut impl Future<Output = ()>>) -> Poll<()> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn the_sampler_waits_for_the_pages_being_served() {
        let serving = Serving::new(Duration::ZERO);
        // nothing served yet: no wait
        assert!(poll_once(pin!(serving.until_quiet(HOUR))).is_ready());
        let first = serving.enter();
        let second = serving.enter();
        let mut waiting = pin!(serving.until_quiet(HOUR));
        assert!(poll_once(waiting.as_mut()).is_pending());
        drop(first);
        assert!(
            poll_once(waiting.as_mut()).is_pending(),
            "one page is still served"
        );
        drop(second);
        assert!(poll_once(waiting.as_mut()).is_ready(), "no page is served");
    }

    #[tokio::test]
    async fn the_sampler_waits_for_a_quiet_moment_after_a_page() {
        let serving = Serving::new(HOUR);
        drop(serving.enter());
        // the page ended just now: its quiet hour has not passed
        assert!(poll_once(pin!(serving.until_quiet(HOUR * 2))).is_pending());
    }

    #[tokio::test]
    async fn a_dashboard_that_is_never_quiet_still_gets_its_samples() {
        let serving = Serving::new(HOUR);
        drop(serving.enter());
        let _page = serving.enter();
        // with no time left the wait ends at once, although a page is served and another just
        // ended (the outer bound only keeps a broken wait from hanging the suite)
        tokio::time::timeout(Duration::from_secs(10), serving.until_quiet(Duration::ZERO))
            .await
            .expect("the sampler's wait is bounded");
    }
}
