//! `ringwork` command line: apply migrations, run the demo, drive maintenance and operator actions
//! by hand, serve metrics and the dashboard. Each command lives in `commands/`.

mod commands;

use clap::{Parser, Subcommand};
use commands::{
    archive, bulk, callback, counts, cron, demo, dlq, grant, job, maintain, migrate, queue, ring,
    serve, status, work, workflow, Group, Result,
};

#[derive(Parser)]
#[command(
    name = "ringwork",
    version,
    about = "Postgres-native job queue with ring-partitioned storage",
    after_help = "Exit status: 0 on success, 1 on an error, 2 on a usage error, 3 when the job, \
                  queue or schedule named does not exist."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the schema migrations (idempotent; safe to run from several processes).
    ///
    /// Example: ringwork migrate --database-url postgres://postgres@127.0.0.1/app
    Migrate(migrate::Args),
    /// Grant a role what a worker, producer or reader needs in the schema, and nothing more (no
    /// CREATE). Run as the schema's owner, after `migrate`; idempotent (docs/operations.md, "Roles").
    ///
    /// Example: ringwork grant app_worker --access worker
    Grant(grant::Args),
    /// Enqueue N no-op jobs and run them; prints throughput, pickup latency, dead tuples and WAL/job.
    /// Without DATABASE_URL it runs on a throwaway PostgreSQL cluster that is removed on exit.
    ///
    /// Example: ringwork demo --jobs 10000
    Demo(demo::Args),
    /// Pause a queue (nothing is claimed from it; enqueue still works).
    ///
    /// Example: ringwork pause mail
    Pause(queue::PauseArgs),
    /// Resume a paused queue.
    ///
    /// Example: ringwork resume mail
    Resume(queue::PauseArgs),
    /// Set a queue's fleet-wide limits (every process's claims hold them); with neither option,
    /// remove them.
    ///
    /// Example: ringwork limit mail --max-running 8 --rate 100 --per 1m
    Limit(queue::LimitArgs),
    /// Cancel a job by id (available, scheduled or running).
    ///
    /// Example: ringwork cancel 42
    Cancel(job::CancelArgs),
    /// Cancel the job holding a unique key: the same kind, args and options the producer used.
    ///
    /// Example: ringwork cancel-unique --kind send_email --args '{"to":"a@example.com"}'
    CancelUnique(job::CancelUniqueArgs),
    /// Exact per-queue counts: available, scheduled, retryable, running, waiting, completed,
    /// failed, cancelled, dead-lettered.
    ///
    /// Example: ringwork counts --queue mail
    Counts(counts::Args),
    /// Periodic schedules: list their fires, pause, resume or trigger one. Schedules are declared
    /// in code (`ClientBuilder::periodic`); every process that declares one evaluates it.
    ///
    /// Example: ringwork cron pause nightly_report
    Cron(Group<cron::Action>),
    /// Cancel, retry or delete many jobs by filter (queue, kind, state, age), in short bounded
    /// transactions of at most 500 jobs; jobs that arrive while it runs are not touched.
    ///
    /// Example: ringwork bulk retry --queue mail --state retryable
    Bulk(Group<bulk::Action>),
    /// Answer a job that waits for an external callback: complete, fail, retry, resume (its
    /// handler runs again and reads --payload), or heartbeat (extend its timeout).
    ///
    /// Example: ringwork callback resume <id> --payload '{"approved":true}'
    Callback(callback::Args),
    /// Inspect and act on the dead-letter queue.
    ///
    /// Example: ringwork dlq list --queue mail
    Dlq(Group<dlq::Action>),
    /// One screen for an operator: exact counts per queue, both rings and why a sealed slot is
    /// not pruned, the backends whose locks make prune give up, and whoever holds back the
    /// database's MVCC horizon (long transactions, replication slots, prepared transactions).
    ///
    /// Example: ringwork status --watch 5s
    Status(status::Args),
    /// Serve /metrics (Prometheus text), /healthz and /readyz over HTTP, optionally the
    /// dashboard and an OTLP push of the same metrics, and take part in the maintenance election.
    ///
    /// Example: ringwork serve --listen 0.0.0.0:9464 --dashboard
    Serve(serve::Args),
    /// Show both rings' slots, why a sealed slot is not pruned yet, and which backends hold
    /// locks that make prune give up (pid, application, how long).
    ///
    /// Example: ringwork ring
    Ring(ring::Args),
    /// Show where a job is now, its progress and its history.
    ///
    /// Example: ringwork job 42 --json
    Job(job::ShowArgs),
    /// Search the archive by what finished jobs' arguments contain; turn archive search on or
    /// off.
    ///
    /// Example: ringwork archive search '{"customer": 42}' --state failed
    Archive(Group<archive::Action>),
    /// Show a workflow's steps and state, or cancel it.
    ///
    /// Example: ringwork workflow show 7
    Workflow(Group<workflow::Action>),
    /// Run a worker process for the `sleep` job kind until interrupted (used by the crash tests).
    /// Prints "ready" once started and "completed N" every second.
    #[command(hide = true)]
    Work(work::Args),
    /// Run one maintenance pass (rotate, rescue, prune, promote, retention) and print what it did.
    ///
    /// Example: ringwork maintain --stale-after 60s
    Maintain(maintain::Args),
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Migrate(args) => migrate::run(args).await,
        Command::Grant(args) => grant::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Pause(args) => queue::pause(args).await,
        Command::Resume(args) => queue::resume(args).await,
        Command::Limit(args) => queue::limit(args).await,
        Command::Cancel(args) => job::cancel(args).await,
        Command::CancelUnique(args) => job::cancel_unique(args).await,
        Command::Counts(args) => counts::run(args).await,
        Command::Cron(args) => cron::run(args).await,
        Command::Bulk(args) => bulk::run(args).await,
        Command::Callback(args) => callback::run(args).await,
        Command::Dlq(args) => dlq::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Ring(args) => ring::run(args).await,
        Command::Job(args) => job::show(args).await,
        Command::Archive(args) => archive::run(args).await,
        Command::Workflow(args) => workflow::run(args).await,
        Command::Work(args) => work::run(args).await,
        Command::Maintain(args) => maintain::run(args).await,
    }
}

#[tokio::main]
async fn main() {
    use tracing_subscriber::prelude::*;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // colour for a person at a terminal, never into a pipe or a file
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    tracing_subscriber::registry().with(log).init();
    if let Err(e) = run(Cli::parse().command).await {
        eprintln!("ringwork: {}", e.message());
        std::process::exit(e.exit_code());
    }
}
