//! The worker and producer processes the runner starts and reads (one JSON line a second each).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use ringwork::Storage;
use ringwork::{Error, Result};

use crate::scenario::{System, BENCH_QUEUE, BENCH_SCHEMA};

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) completed: AtomicU64,
    pub(crate) enqueued: AtomicU64,
    pub(crate) pickup_ms: Mutex<Vec<f64>>,
    /// Microseconds the workers of every process spent inside their handlers.
    pub(crate) handler_us: AtomicU64,
    /// Producer sequence numbers whose handler finished, in any process (a re-run after a crash
    /// reports its job again; the set keeps it once).
    pub(crate) handled: Mutex<std::collections::HashSet<u64>>,
    /// Every handled line, re-runs included.
    pub(crate) handled_lines: AtomicU64,
    /// Sequence-number ranges of committed producer batches.
    pub(crate) committed: Mutex<Vec<(u64, u64)>>,
    /// Children that printed their first once-a-second report: a worker process has started its
    /// client (connected, claimed once) by then.
    pub(crate) reporting: AtomicU64,
}

#[derive(Deserialize)]
pub(crate) struct ChildLine {
    #[serde(default)]
    pub(crate) completed: Option<u64>,
    #[serde(default)]
    pub(crate) enqueued: Option<u64>,
    #[serde(default)]
    pub(crate) pickup_ms: Vec<f64>,
    #[serde(default)]
    pub(crate) handler_us: Option<u64>,
    #[serde(default)]
    pub(crate) handled: Option<u64>,
    /// A committed producer batch: sequence numbers [from, to).
    #[serde(default)]
    pub(crate) committed: Option<(u64, u64)>,
}

pub(crate) fn spawn_child(
    program: &PathBuf,
    args: &[String],
    counters: Arc<Counters>,
) -> Result<Child> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Config(format!("cannot start {}: {e}", program.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Config("child stdout not piped".into()))?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut reported = false;
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(parsed) = serde_json::from_str::<ChildLine>(&line) else {
                continue; // "ready" and other chatter
            };
            if let Some(n) = parsed.completed {
                counters.completed.fetch_add(n, Ordering::Relaxed);
                if !reported {
                    reported = true;
                    counters.reporting.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(us) = parsed.handler_us {
                counters.handler_us.fetch_add(us, Ordering::Relaxed);
            }
            if let Some(n) = parsed.enqueued {
                counters.enqueued.fetch_add(n, Ordering::Relaxed);
            }
            if let Some(range) = parsed.committed {
                if let Ok(mut committed) = counters.committed.lock() {
                    committed.push(range);
                }
            }
            if let Some(n) = parsed.handled {
                counters.handled_lines.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut handled) = counters.handled.lock() {
                    handled.insert(n);
                }
            }
            if !parsed.pickup_ms.is_empty() {
                if let Ok(mut samples) = counters.pickup_ms.lock() {
                    samples.extend(parsed.pickup_ms);
                }
            }
        }
    });
    Ok(child)
}

fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status();
}

pub(crate) async fn stop_child(child: &mut Child) {
    if let Some(pid) = child.id() {
        signal(pid, "-TERM");
    }
    if tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

pub(crate) struct Processes {
    pub(crate) system: System,
    pub(crate) url: String,
    pub(crate) workers_per_process: usize,
    pub(crate) job_ms: u64,
    pub(crate) counters: Arc<Counters>,
    pub(crate) workers: Vec<Child>,
    pub(crate) producer: Option<Child>,
    /// Producing inside the first worker process: its producer arguments (set before it is
    /// spawned), and whether it was told to start.
    pub(crate) produce_in_worker: Option<Vec<String>>,
    pub(crate) producing_in_worker: bool,
}

impl Processes {
    pub(crate) fn program(&self) -> Result<PathBuf> {
        match &self.system {
            System::Ringwork | System::Pgque { .. } => std::env::current_exe()
                .map_err(|e| Error::Config(format!("cannot find this binary: {e}"))),
            System::Awa { adapter, .. } => Ok(adapter.clone()),
        }
    }

    /// The arguments of one of the system's process commands: the verb (the adapter protocol's
    /// name; ringwork's worker is `worker`), then the database and, for ringwork, the schema.
    pub(crate) fn command(&self, verb: &str) -> Vec<String> {
        let mut args = match (&self.system, verb) {
            (System::Ringwork, "work") => vec!["worker".to_string()],
            (System::Pgque { .. }, _) => vec!["pgque".to_string(), verb.to_string()],
            _ => vec![verb.to_string()],
        };
        args.extend(["--database-url".to_string(), self.url.clone()]);
        if self.system == System::Ringwork {
            args.extend(["--schema".to_string(), BENCH_SCHEMA.to_string()]);
        }
        args
    }

    pub(crate) fn spawn_worker(&mut self) -> Result<()> {
        let mut args = self.command("work");
        args.extend([
            "--workers".to_string(),
            self.workers_per_process.to_string(),
            "--job-ms".to_string(),
            self.job_ms.to_string(),
        ]);
        if let (Some(produce), true) = (&self.produce_in_worker, self.workers.is_empty()) {
            args.extend(produce.iter().cloned());
        }
        let child = spawn_child(&self.program()?, &args, Arc::clone(&self.counters))?;
        self.workers.push(child);
        Ok(())
    }

    /// Wait until every worker process reports (it has started), at most `limit`: jobs produced
    /// while processes still connect and prepare their statements would measure the start-up
    /// (8x4 at 400 jobs/s: the first 130 jobs waited 40 to 160 ms, a 20-s phase's pickup p99).
    pub(crate) async fn workers_started(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        while (self.counters.reporting.load(Ordering::Relaxed) as usize) < self.workers.len()
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The producer's mode arguments: a fixed rate, or a depth of available jobs to keep.
    pub(crate) fn produce_args(fixed_rate: Option<u64>, depth: u64) -> Vec<String> {
        match fixed_rate {
            Some(rate) => vec![
                "--mode".to_string(),
                "rate".to_string(),
                "--rate".to_string(),
                rate.to_string(),
            ],
            None => vec![
                "--mode".to_string(),
                "depth".to_string(),
                "--depth".to_string(),
                depth.to_string(),
            ],
        }
    }

    /// Start producing: a producer process, or (`produce_in_worker`) SIGUSR1 to worker 0.
    pub(crate) fn spawn_producer(&mut self, fixed_rate: Option<u64>, depth: u64) -> Result<()> {
        if self.produce_in_worker.is_some() {
            if let Some(pid) = self.workers.first().and_then(|w| w.id()) {
                signal(pid, "-USR1");
                self.producing_in_worker = true;
            }
            return Ok(());
        }
        let mut args = self.command("produce");
        args.extend(Self::produce_args(fixed_rate, depth));
        self.producer = Some(spawn_child(
            &self.program()?,
            &args,
            Arc::clone(&self.counters),
        )?);
        Ok(())
    }

    /// Stop producing: the producer process, or SIGUSR2 to worker 0 (its insert in flight is
    /// finished and reported within the second this waits).
    pub(crate) async fn stop_producer(&mut self) {
        if let Some(mut producer) = self.producer.take() {
            stop_child(&mut producer).await;
        }
        if self.producing_in_worker {
            self.producing_in_worker = false;
            if let Some(pid) = self.workers.first().and_then(|w| w.id()) {
                signal(pid, "-USR2");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// One `depth` line of the adapter: the exact counts, or (`fast`) only a cheap `available`.
    pub(crate) async fn adapter_counts(&self, fast: bool) -> Result<serde_json::Value> {
        let mut args = self.command("depth");
        if fast {
            args.push("--fast".to_string());
        }
        let output = Command::new(self.program()?)
            .args(&args)
            .output()
            .await
            .map_err(|e| Error::Config(format!("adapter depth: {e}")))?;
        serde_json::from_slice(&output.stdout)
            .map_err(|e| Error::Config(format!("adapter depth output: {e}")))
    }

    /// Pending jobs (available + scheduled + retryable + running).
    pub(crate) async fn pending(&self, storage: Option<&Storage>) -> Result<i64> {
        match (&self.system, storage) {
            (System::Ringwork, Some(storage)) => {
                let counts = storage.queue_counts(Some(BENCH_QUEUE)).await?;
                Ok(counts
                    .iter()
                    .map(|c| c.available + c.scheduled + c.retryable + c.running)
                    .sum())
            }
            _ => {
                let v = self.adapter_counts(false).await?;
                Ok(["available", "scheduled", "retryable", "running"]
                    .iter()
                    .map(|k| v.get(k).and_then(|x| x.as_i64()).unwrap_or(0))
                    .sum())
            }
        }
    }

    /// Available jobs only (queue depth). For an adapter, its cheap probe (awa's exact count
    /// costs seconds per call at tens of thousands of stored jobs).
    pub(crate) async fn depth(&self, storage: Option<&Storage>) -> Result<i64> {
        match (&self.system, storage) {
            (System::Ringwork, Some(storage)) => storage.available_count(BENCH_QUEUE).await,
            _ => {
                let v = self.adapter_counts(true).await?;
                Ok(v.get("available").and_then(|x| x.as_i64()).unwrap_or(0))
            }
        }
    }
}
