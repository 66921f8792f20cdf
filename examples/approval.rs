//! An approval flow with an external callback (the lease ring): the handler asks a human (here: a
//! task standing in for the approval UI) and hands the job to the outside world
//! (`JobError::WaitForCallback`), so no worker waits. The approver answers with the callback id:
//! `resume` runs the handler again with the decision (`JobContext::callback_payload`), without
//! using an attempt. From outside the process the same answer is
//! `ringwork callback resume <id> --payload '{"approved":true}'` or
//! `POST /callbacks/<id>/resume` on `ringwork serve`.
//!
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run --example approval`

use std::time::Duration;

use ringwork::{
    BoxError, CallbackAction, Client, JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Serialize, Deserialize)]
struct ApproveRefund {
    refund_id: i64,
    amount_cents: i64,
}

impl JobArgs for ApproveRefund {
    const KIND: &'static str = "approve_refund";
}

#[derive(Serialize, Deserialize, Debug)]
struct Decision {
    approved: bool,
    by: String,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    // the approval UI: receives (refund, callback id), shows them to a human
    let (inbox, mut requests) = mpsc::unbounded_channel::<(i64, String)>();
    let (done_tx, mut done) = mpsc::unbounded_channel::<String>();
    let client = Client::builder(pool)
        .schema("ringwork_example_approval")
        .queue("refunds", QueueConfig::default())
        .register(move |ctx: JobContext, job: ApproveRefund| {
            let inbox = inbox.clone();
            let done_tx = done_tx.clone();
            async move {
                match ctx
                    .callback_payload::<Decision>()
                    .await
                    .map_err(JobError::retry)?
                {
                    // first run: ask, then wait without holding a worker (at most a day)
                    None => {
                        let id = ctx
                            .register_callback(Duration::from_secs(24 * 3600))
                            .await
                            .map_err(JobError::retry)?;
                        inbox.send((job.refund_id, id)).map_err(JobError::retry)?;
                        Err(JobError::WaitForCallback)
                    }
                    // resumed with the human's decision
                    Some(decision) if decision.approved => {
                        let line = format!(
                            "refund {} of {} cents approved by {}",
                            job.refund_id, job.amount_cents, decision.by
                        );
                        println!("{line}");
                        done_tx.send(line).map_err(JobError::retry)?;
                        Ok(())
                    }
                    Some(decision) => Err(JobError::terminal(format!(
                        "refund {} declined by {}",
                        job.refund_id, decision.by
                    ))),
                }
            }
        })
        .build()
        .await?;
    let running = client.start().await?;
    let id = client
        .insert(
            NewJob::new(&ApproveRefund {
                refund_id: 42,
                amount_cents: 1999,
            })?
            .queue("refunds"),
        )
        .await?;

    let (refund, callback) = tokio::time::timeout(Duration::from_secs(20), requests.recv())
        .await?
        .ok_or("the handler never asked")?;
    // the handler asked before it returned: the job waits once its return has been recorded
    // (the completer writes returns in batches, so on a busy machine that can take a while)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut waiting = None;
    while tokio::time::Instant::now() < deadline {
        waiting = client.admin().job_state(id).await?.map(|s| s.state);
        if waiting == Some(JobStatus::Waiting) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("refund {refund} waits for approval (job {id}: {waiting:?}); callback {callback}");
    // the human clicks "approve"
    client
        .admin()
        .resolve_callback(
            &callback,
            CallbackAction::Resume {
                payload: serde_json::json!({ "approved": true, "by": "dana" }),
            },
        )
        .await?;
    tokio::time::timeout(Duration::from_secs(20), done.recv())
        .await?
        .ok_or("the handler never ran again")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut state = None;
    while tokio::time::Instant::now() < deadline {
        state = client.admin().job_state(id).await?.map(|s| s.state);
        if state == Some(JobStatus::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown(Duration::from_secs(5)).await;
    if waiting != Some(JobStatus::Waiting) || state != Some(JobStatus::Completed) {
        return Err(format!("expected waiting, then completed; saw {waiting:?}, {state:?}").into());
    }
    // the same id again: the wait is over, so it is refused and changes nothing
    let late = client
        .admin()
        .resolve_callback(&callback, CallbackAction::Complete)
        .await;
    println!(
        "a late answer: {}",
        late.as_ref().map(|o| o.as_str()).unwrap_or("refused")
    );
    if late.is_ok() {
        return Err("a late callback was accepted".into());
    }
    Ok(())
}
