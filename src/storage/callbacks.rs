//! The lease ring (`sql/functions/callbacks.sql`): attempts that wait for an external callback.
//!
//! A callback id is 16 random bytes followed by their HMAC-SHA256 under the schema's callback key
//! (`callback_keys`, made once by the first process that needs it), truncated to 16 bytes, in hex:
//! 64 characters. A forged or mistyped id fails the signature check before any lease is read.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::complete::AttemptRef;
use super::Storage;
use crate::bytes::{constant_time_eq, hex, unhex};
use crate::error::{Error, Result};
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    key: String,
    make_key: String,
    register: String,
    await_callback: String,
    resolve: String,
    rescue: String,
    rotate: String,
    payload: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            key: format!("SELECT secret FROM {s}.callback_keys WHERE key_id = 1"),
            make_key: format!(
                "INSERT INTO {s}.callback_keys (key_id, secret) VALUES (1, $1) ON CONFLICT (key_id) DO NOTHING"
            ),
            register: format!("SELECT {s}.register_callback($1, $2, $3, $4, $5, make_interval(secs => $6))"),
            await_callback: format!("SELECT {s}.await_callback($1, $2, $3, $4)"),
            resolve: format!(
                "SELECT {s}.resolve_callback($1, $2, $3, $4, make_interval(secs => $5))"
            ),
            rescue: format!("SELECT {s}.rescue_callbacks($1)"),
            rotate: format!("SELECT {s}.rotate_lease_ring(make_interval(secs => $1), $2)"),
            payload: format!("SELECT {s}.callback_payload($1, $2)"),
        }
    }
}

/// What a callback does to the job that waits for it.
#[derive(Clone, Debug, PartialEq)]
pub enum CallbackAction {
    /// The job completed.
    Complete,
    /// The job failed for good (dead-lettered when its queue has a dead-letter queue).
    Fail {
        /// The error recorded for the failure.
        error: String,
    },
    /// The job runs again as its next attempt (failed for good when its attempts are used up).
    Retry {
        /// The error recorded for the attempt.
        error: String,
    },
    /// The handler runs again, without using an attempt, and reads `payload` with
    /// `JobContext::callback_payload`.
    Resume {
        /// What the handler reads back with `JobContext::callback_payload`.
        payload: serde_json::Value,
    },
    /// The wait goes on: its timeout becomes now + `extend`.
    Heartbeat {
        /// How long from now the wait's new timeout is.
        extend: Duration,
    },
}

impl CallbackAction {
    /// An action from its name (`complete`, `fail`, `retry`, `resume`, `heartbeat`) and the
    /// optional parts a caller sent with it (the command line, the HTTP endpoint).
    pub fn from_parts(
        name: &str,
        payload: Option<serde_json::Value>,
        error: Option<String>,
        extend_secs: Option<f64>,
    ) -> Result<Self> {
        let error = || {
            error
                .clone()
                .unwrap_or_else(|| format!("{name} by callback"))
        };
        Ok(match name {
            "complete" => Self::Complete,
            "fail" => Self::Fail { error: error() },
            "retry" => Self::Retry { error: error() },
            "resume" => Self::Resume {
                payload: payload.unwrap_or(serde_json::Value::Null),
            },
            "heartbeat" => {
                let secs = extend_secs.unwrap_or(300.0);
                if !(1.0..=365.0 * 24.0 * 3600.0).contains(&secs) {
                    return Err(Error::Config(format!(
                        "extend must be 1 s..=365 days, got {secs} s"
                    )));
                }
                Self::Heartbeat {
                    extend: Duration::from_secs_f64(secs),
                }
            }
            other => {
                return Err(Error::Config(format!(
                    "unknown callback action {other:?} (complete, fail, retry, resume, heartbeat)"
                )))
            }
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Fail { .. } => "fail",
            Self::Retry { .. } => "retry",
            Self::Resume { .. } => "resume",
            Self::Heartbeat { .. } => "heartbeat",
        }
    }
}

/// What a callback did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// The wait ended with the callback's action.
    Applied,
    /// The handler had not returned yet: the action is applied when it does.
    Recorded,
    /// The timeout moved (a heartbeat).
    Extended,
}

impl CallbackOutcome {
    /// The outcome's name: `applied`, `recorded` or `extended`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Recorded => "recorded",
            Self::Extended => "extended",
        }
    }
}

/// What the runtime does with an attempt whose handler returned `JobError::WaitForCallback`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AwaitOutcome {
    /// The claim is closed; the job waits in the lease ring.
    Waiting,
    /// A callback had arrived while the handler ran: it is applied, the wait is over.
    Applied,
    /// The attempt was not open any more (rescued, cancelled): nothing changed.
    Stale,
    /// The handler registered no callback: the caller fails the attempt.
    NoCallback,
}

const ID_BYTES: usize = 16;
const TAG_BYTES: usize = 16;

fn tag(secret: &[u8], id: &[u8]) -> Result<Vec<u8>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret)
        .map_err(|e| Error::Config(format!("callback key unusable: {e}")))?;
    mac.update(id);
    Ok(mac.finalize().into_bytes()[..TAG_BYTES].to_vec())
}

impl Storage {
    /// The schema's callback key, made on first use (32 bytes from the OS's random source).
    async fn callback_key(&self) -> Result<Vec<u8>> {
        // read once per Storage: a flood of forged ids costs no database round trip
        self.callback_key
            .get_or_try_init(|| self.load_callback_key())
            .await
            .cloned()
    }

    async fn load_callback_key(&self) -> Result<Vec<u8>> {
        let key: Option<Vec<u8>> = sqlx::query_scalar(&self.sql.callbacks.key)
            .fetch_optional(self.db())
            .await?;
        if let Some(key) = key {
            return Ok(key);
        }
        let fresh: [u8; 32] = rand::random();
        sqlx::query(&self.sql.callbacks.make_key)
            .bind(&fresh[..])
            .execute(self.db())
            .await?;
        // another process may have made it first: the stored key is the key
        sqlx::query_scalar(&self.sql.callbacks.key)
            .fetch_one(self.db())
            .await
            .map_err(Into::into)
    }

    /// The lease's bytes from a callback id, if the id is well formed and signed with this
    /// schema's key.
    async fn verify_callback_id(&self, id: &str) -> Result<Vec<u8>> {
        let invalid = |reason: &str| Error::Callback {
            id: id.chars().take(80).collect(),
            reason: reason.to_string(),
        };
        let bytes = unhex(id.trim())
            .filter(|b| b.len() == ID_BYTES + TAG_BYTES)
            .ok_or_else(|| invalid("not a callback id (64 hexadecimal characters expected)"))?;
        let (raw, given) = bytes.split_at(ID_BYTES);
        let expected = tag(&self.callback_key().await?, raw)?;
        if !constant_time_eq(&expected, given) {
            return Err(invalid(
                "signature does not match: this id was not given out by this schema",
            ));
        }
        Ok(raw.to_vec())
    }

    /// Register a callback for an open attempt: the id to hand to the outside world. The wait
    /// times out `timeout` after this registration (a heartbeat extends it).
    pub async fn register_callback(
        &self,
        attempt: &AttemptRef,
        timeout: Duration,
    ) -> Result<String> {
        let raw: [u8; ID_BYTES] = rand::random();
        let signed = tag(&self.callback_key().await?, &raw)?;
        let status: String = sqlx::query_scalar(&self.sql.callbacks.register)
            .bind(attempt.claim_slot)
            .bind(attempt.receipt_id)
            .bind(attempt.job_id)
            .bind(attempt.run_lease)
            .bind(&raw[..])
            .bind(timeout.as_secs_f64())
            .fetch_one(self.db())
            .await?;
        match status.as_str() {
            "registered" => Ok(format!("{}{}", hex(&raw), hex(&signed))),
            "already_registered" => Err(Error::Config(format!(
                "job {} attempt {}: a callback is already registered (one per attempt)",
                attempt.job_id, attempt.run_lease
            ))),
            _ => Err(Error::Stale {
                job_id: attempt.job_id,
                run_lease: attempt.run_lease,
            }),
        }
    }

    /// The handler returned `JobError::WaitForCallback`: close the attempt's claim and let the job
    /// wait for its callback (or apply one that already came).
    pub async fn await_callback(&self, attempt: &AttemptRef) -> Result<AwaitOutcome> {
        let status: String = sqlx::query_scalar(&self.sql.callbacks.await_callback)
            .bind(attempt.claim_slot)
            .bind(attempt.receipt_id)
            .bind(attempt.job_id)
            .bind(attempt.run_lease)
            .fetch_one(self.db())
            .await?;
        Ok(match status.as_str() {
            "waiting" => AwaitOutcome::Waiting,
            "applied" => AwaitOutcome::Applied,
            "no_callback" => AwaitOutcome::NoCallback,
            _ => AwaitOutcome::Stale,
        })
    }

    /// A callback from outside, by the id the handler registered. A malformed or forged id, or a
    /// wait that is already over (answered, timed out, its attempt gone), is an
    /// [`Error::Callback`] and changes nothing.
    pub async fn resolve_callback(
        &self,
        id: &str,
        action: CallbackAction,
    ) -> Result<CallbackOutcome> {
        let raw = self.verify_callback_id(id).await?;
        let (payload, error, extend) = match &action {
            CallbackAction::Complete => (None, None, 0.0),
            CallbackAction::Fail { error } | CallbackAction::Retry { error } => {
                crate::job::validate_text("callback error", error)?;
                (None, Some(error.as_str()), 0.0)
            }
            CallbackAction::Resume { payload } => {
                crate::job::validate_json("callback payload", payload)?;
                (Some(payload), None, 0.0)
            }
            CallbackAction::Heartbeat { extend } => (None, None, extend.as_secs_f64()),
        };
        let status: String = sqlx::query_scalar(&self.sql.callbacks.resolve)
            .bind(&raw)
            .bind(action.name())
            .bind(payload)
            .bind(error)
            .bind(extend)
            .fetch_one(self.db())
            .await?;
        let over = |reason: &str| Error::Callback {
            id: id.to_string(),
            reason: reason.to_string(),
        };
        match status.as_str() {
            "applied" => Ok(CallbackOutcome::Applied),
            "recorded" => Ok(CallbackOutcome::Recorded),
            "extended" => Ok(CallbackOutcome::Extended),
            "already_resolved" => Err(over(
                "already answered while its handler ran; that answer applies when the handler returns \
                 WaitForCallback (and is dropped if it returns otherwise)",
            )),
            _ => Err(over(
                "no such wait: it was answered or timed out already, or its attempt ended first",
            )),
        }
    }

    /// End the waits whose timeout passed (a retry, or a failure when the attempts are used up),
    /// at most `limit`; how many ended.
    pub async fn rescue_callbacks(&self, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.callbacks.rescue)
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }

    /// Rotate the lease ring when its current slot is at least `min_age` old and holds a lease:
    /// the next slot's live leases move into it anew and the rest of it is truncated. Returns
    /// `rotated`, `young`, `empty` or `busy`.
    pub async fn rotate_lease_ring(
        &self,
        min_age: Duration,
        lock_timeout: Duration,
    ) -> Result<String> {
        Ok(sqlx::query_scalar(&self.sql.callbacks.rotate)
            .bind(min_age.as_secs_f64())
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?)
    }

    /// The payload a `resume` callback gave this attempt, if any.
    pub async fn callback_payload(
        &self,
        job_id: i64,
        run_lease: i64,
    ) -> Result<Option<serde_json::Value>> {
        Ok(sqlx::query_scalar(&self.sql.callbacks.payload)
            .bind(job_id)
            .bind(run_lease)
            .fetch_one(self.db())
            .await?)
    }
}
