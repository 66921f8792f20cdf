//! What a job is: a serde type with a stable kind, and the row a producer asks ringwork to insert.

use chrono::{DateTime, Utc};
use serde::{de::DeserializeOwned, Serialize};

use crate::error::{Error, Result};

/// Default number of attempts before a job is failed for good.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 25;
/// Default priority (1 runs first, 4 last).
pub const DEFAULT_PRIORITY: i16 = 2;
/// Default queue name.
pub const DEFAULT_QUEUE: &str = "default";

/// A job's arguments. `KIND` is the stable name stored with the job and used to find its handler.
/// The other constants are the kind's insert defaults, declared where the type is, so that
/// [`NewJob::new`] puts a job where its handler works without every producer repeating it; a
/// producer still overrides each one on the [`NewJob`].
///
/// ```
/// use ringwork::JobArgs;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendEmail { to: String }
///
/// impl JobArgs for SendEmail {
///     const KIND: &'static str = "send_email";
///     const QUEUE: &'static str = "mail"; // the queue the mail workers work
///     const MAX_ATTEMPTS: i32 = 5;
///     const TIMEOUT: Option<std::time::Duration> = Some(std::time::Duration::from_secs(30));
/// }
///
/// let job = ringwork::NewJob::new(&SendEmail { to: "a@example.com".into() })?; // into "mail"
/// # Ok::<(), ringwork::Error>(())
/// ```
pub trait JobArgs: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The job kind: stored with every job of this type and used to find its handler, so it must
    /// stay the same across renames of the type.
    const KIND: &'static str;
    /// The queue a job of this kind is inserted into unless the producer names another
    /// ([`NewJob::queue`]). Default: [`DEFAULT_QUEUE`].
    const QUEUE: &'static str = DEFAULT_QUEUE;
    /// Its priority, 1 (first) ..= 4 (last), unless the producer sets one ([`NewJob::priority`]).
    /// Default: [`DEFAULT_PRIORITY`].
    const PRIORITY: i16 = DEFAULT_PRIORITY;
    /// Attempts before it fails for good, unless the producer sets them
    /// ([`NewJob::max_attempts`]). Default: [`DEFAULT_MAX_ATTEMPTS`].
    const MAX_ATTEMPTS: i32 = DEFAULT_MAX_ATTEMPTS;
    /// Each attempt's time limit, unless the producer sets one ([`NewJob::timeout`]). Default:
    /// none (the queue's deadline, if it has one).
    const TIMEOUT: Option<std::time::Duration> = None;
}

/// A job ready to be inserted.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub(crate) kind: String,
    pub(crate) args: serde_json::Value,
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) max_attempts: i32,
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) timeout: Option<std::time::Duration>,
    pub(crate) unique: Option<Unique>,
    pub(crate) traceparent: Option<String>,
    pub(crate) sequence: Option<(String, crate::DependencyFailure)>,
}

/// Where a job is: the states `job_state`, history entries, counts and unique keys speak of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobStatus {
    /// A workflow step waiting for the steps it depends on (see [`crate::Workflow`]): not in the
    /// queue ring yet.
    Pending,
    /// Ready to be claimed: an unclaimed row in the queue ring.
    Available,
    /// Waiting in `deferred_jobs` for its first attempt (a future `run_at`, a snoozed first
    /// attempt, or a dead-letter retry).
    Scheduled,
    /// Waiting in `deferred_jobs` to run again after an attempt (a retry, a snooze of a later
    /// attempt, or a rescue).
    Retryable,
    /// Claimed by a worker, its claim not yet closed.
    Running,
    /// Its handler registered a callback and returned `JobError::WaitForCallback`: it holds no
    /// worker and waits in the lease ring for the callback or its timeout.
    Waiting,
    /// Its handler returned `Ok(())`.
    Completed,
    /// Failed for good (a terminal error, or its attempts used up) in a queue without a
    /// dead-letter queue.
    Failed,
    /// Cancelled (`Client::cancel`, `ringwork cancel`) before it finished.
    Cancelled,
    /// Failed for good in a queue with a dead-letter queue: held in `dlq_entries`.
    DeadLettered,
}

/// A job state a unique key can be held in (see [`Unique::states`]): the same states.
pub type UniqueState = JobStatus;

impl JobStatus {
    /// Every state, in the order of a job's life.
    pub const ALL: [JobStatus; 10] = [
        Self::Pending,
        Self::Available,
        Self::Scheduled,
        Self::Retryable,
        Self::Running,
        Self::Waiting,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::DeadLettered,
    ];

    /// The name the database and the command line use (`dead_lettered`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Available => "available",
            Self::Scheduled => "scheduled",
            Self::Retryable => "retryable",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::DeadLettered => "dead_lettered",
        }
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // pad, so a width in a format string lines up tables
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for JobStatus {
    type Err = crate::Error;

    /// A state name as the database writes it; an unknown one (a newer schema's) is an error.
    fn from_str(name: &str) -> crate::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| crate::Error::SchemaMismatch {
                schema: String::new(),
                reason: format!("unknown job state {name:?} (a newer ringwork wrote it?)"),
            })
    }
}

impl PartialEq<str> for JobStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for JobStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for JobStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Insert-time deduplication. Two jobs are duplicates when they have the same kind and the same
/// arguments (compared as canonical JSON: object keys sorted), and, when asked, the same queue and
/// the same period bucket (insert time divided by `by_period`). A duplicate insert returns the id of
/// the job already holding the key, as long as that job is in one of `states`; otherwise the key is
/// released and the new job takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unique {
    /// Also compare the queue (default false).
    pub by_queue: bool,
    /// Also compare the insert time's bucket of this length (whole seconds, at least one);
    /// `None`: no period.
    pub by_period: Option<std::time::Duration>,
    /// The holder's states in which a new insert is a duplicate; in any other state the key is
    /// released.
    pub states: Vec<UniqueState>,
}

impl Default for Unique {
    /// Kind + args, any queue, no period, while the holder is still pending or running.
    fn default() -> Self {
        Self {
            by_queue: false,
            by_period: None,
            states: vec![
                UniqueState::Available,
                UniqueState::Scheduled,
                UniqueState::Retryable,
                UniqueState::Running,
                UniqueState::Waiting,
            ],
        }
    }
}

impl Unique {
    /// Also compare the queue.
    pub fn by_queue(mut self) -> Self {
        self.by_queue = true;
        self
    }

    /// Also compare the period bucket of the insert time (e.g. one job per hour).
    pub fn by_period(mut self, period: std::time::Duration) -> Self {
        self.by_period = Some(period);
        self
    }

    /// The holder's states in which a new insert is a duplicate.
    pub fn states(mut self, states: &[UniqueState]) -> Self {
        self.states = states.to_vec();
        self
    }
}

impl NewJob {
    /// A job of kind `A::KIND` with the kind's defaults: its queue, priority, attempts and timeout
    /// as [`JobArgs`] declares them (the library's defaults where it declares none). The values are
    /// checked on insert, like those set on the `NewJob`.
    pub fn new<A: JobArgs>(args: &A) -> Result<Self> {
        let value = serde_json::to_value(args).map_err(|e| Error::InvalidArgs {
            kind: A::KIND.to_string(),
            reason: e.to_string(),
        })?;
        let mut job = Self::from_parts(A::KIND, value)?
            .queue(A::QUEUE)
            .priority(A::PRIORITY)
            .max_attempts(A::MAX_ATTEMPTS);
        job.timeout = A::TIMEOUT;
        Ok(job)
    }

    /// A job from an explicit kind and JSON arguments (for producers that do not link the handler type).
    pub fn from_parts(kind: &str, args: serde_json::Value) -> Result<Self> {
        validate_new_name("job kind", kind)?;
        Ok(Self {
            kind: kind.to_string(),
            args,
            queue: DEFAULT_QUEUE.to_string(),
            priority: DEFAULT_PRIORITY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            run_at: None,
            timeout: None,
            unique: None,
            traceparent: None,
            sequence: None,
        })
    }

    /// Run this job one at a time with the other jobs of `key`, in insert order: it starts when the
    /// job inserted before it with the same key is final. `on_failure` is what it does when that
    /// job failed for good or was cancelled: run anyway (`Run`, continue the sequence), wait until
    /// the failed job is retried from the dead-letter queue and completes (`Hold`), or be
    /// cancelled with the rest of the jobs waiting behind it (`Cancel`). Keys run in parallel; a
    /// key with a long backlog is never in another's way. A job in a sequence cannot be unique or
    /// have a `run_at`.
    pub fn sequence(mut self, key: &str, on_failure: crate::DependencyFailure) -> Self {
        self.sequence = Some((key.to_string(), on_failure));
        self
    }

    /// Deduplicate this job at insert time (see [`Unique`]).
    pub fn unique(mut self, unique: Unique) -> Self {
        self.unique = Some(unique);
        self
    }

    /// The unique key text for an insert at `now`: kind, canonical args, and the queue and period
    /// bucket when the options ask for them. The database stores its SHA-256.
    pub(crate) fn unique_key(&self, unique: &Unique, now: DateTime<Utc>) -> Result<String> {
        // serde_json's Map is ordered by key (no preserve_order feature), so this is canonical.
        let args = serde_json::to_string(&self.args).map_err(|e| Error::InvalidArgs {
            kind: self.kind.clone(),
            reason: e.to_string(),
        })?;
        let queue = if unique.by_queue {
            self.queue.as_str()
        } else {
            ""
        };
        let bucket = match unique.by_period {
            Some(period) => {
                let secs = period.as_secs();
                if secs == 0 {
                    return Err(Error::Config(
                        "unique by_period must be at least one second".into(),
                    ));
                }
                (now.timestamp().max(0) as u64 / secs).to_string()
            }
            None => String::new(),
        };
        Ok(format!(
            "v1\u{1f}{}\u{1f}{args}\u{1f}{queue}\u{1f}{bucket}",
            self.kind
        ))
    }

    /// The queue to insert into (default `default`; 1..=128 bytes, no control or invisible
    /// format characters; checked on insert).
    pub fn queue(mut self, queue: &str) -> Self {
        self.queue = queue.to_string();
        self
    }

    /// 1 (first) ..= 4 (last).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Attempts the job may use before it fails for good (1..=1,000,000, default 25; checked on
    /// insert).
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Run no earlier than `at`; a time in the future parks the job in `deferred_jobs`.
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self
    }

    /// This job's own time limit. A claim of it gets a row-local claim with its own deadline; past
    /// the deadline the handler is stopped and deadline rescue closes the attempt.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The W3C `traceparent` of the producer's span (`00-<trace id>-<span id>-<flags>`), so each
    /// execution's `ringwork.process` span is its child. Without it, an insert made inside a
    /// `tracing` span that an OpenTelemetry layer (tracing-opentelemetry) exports, or inside an
    /// active OpenTelemetry span, takes that span's. Checked on insert.
    pub fn traceparent(mut self, traceparent: &str) -> Self {
        self.traceparent = Some(traceparent.to_string());
        self
    }

    pub(crate) fn timeout_ms(&self) -> Option<i32> {
        self.timeout
            .map(|t| t.as_millis().min(i32::MAX as u128) as i32)
    }

    /// Check everything that would otherwise fail inside the database, so a bad job is refused with
    /// a clear error before any row is written.
    pub(crate) fn validate(&self) -> Result<String> {
        validate_new_name("queue name", &self.queue)?;
        validate_new_name("job kind", &self.kind)?;
        validate_priority(self.priority)?;
        if !(1..=1_000_000).contains(&self.max_attempts) {
            return Err(Error::Config(format!(
                "max_attempts must be 1..=1000000, got {}",
                self.max_attempts
            )));
        }
        if let Some(at) = self.run_at {
            validate_run_at(at)?;
        }
        if let Some(t) = self.timeout {
            if t < std::time::Duration::from_millis(1)
                || t > std::time::Duration::from_secs(7 * 24 * 3600)
            {
                return Err(Error::Config(format!(
                    "timeout must be 1 ms..=7 days, got {t:?}"
                )));
            }
        }
        if let Some(traceparent) = &self.traceparent {
            if !crate::trace_context::is_valid(traceparent) {
                return Err(Error::Config(format!(
                    "traceparent {traceparent:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zero)"
                )));
            }
        }
        if let Some(unique) = &self.unique {
            if unique.states.is_empty() {
                return Err(Error::Config(
                    "unique states must name at least one state".into(),
                ));
            }
            if unique
                .by_period
                .is_some_and(|p| p < std::time::Duration::from_secs(1))
            {
                return Err(Error::Config(
                    "unique by_period must be at least one second".into(),
                ));
            }
        }
        if let Some((key, _)) = &self.sequence {
            validate_new_name("sequence key", key)?;
            if self.unique.is_some() || self.run_at.is_some() {
                return Err(Error::Config(
                    "a job in a sequence cannot be unique or have a run_at (it runs when the job before it is final)"
                        .into(),
                ));
            }
        }
        if json_depth(&self.args) > MAX_ARGS_DEPTH {
            return Err(Error::InvalidArgs {
                kind: self.kind.clone(),
                reason: format!(
                    "arguments nest arrays and objects deeper than {MAX_ARGS_DEPTH} levels, which no worker can decode"
                ),
            });
        }
        let text = serde_json::to_string(&self.args).map_err(|e| Error::InvalidArgs {
            kind: self.kind.clone(),
            reason: e.to_string(),
        })?;
        // PostgreSQL text and jsonb cannot hold U+0000; serde_json writes it as \u0000.
        if text.contains("\\u0000") {
            return Err(Error::InvalidArgs {
                kind: self.kind.clone(),
                reason: "arguments contain a NUL character, which PostgreSQL cannot store"
                    .to_string(),
            });
        }
        Ok(text)
    }

    pub(crate) fn is_future(&self, now: DateTime<Utc>) -> bool {
        self.run_at.is_some_and(|at| at > now)
    }
}

/// The deepest nesting of arrays and objects a job's arguments may have: serde_json refuses to
/// decode deeper documents (its recursion limit), so a deeper job could never run. The SQL API
/// refuses the same (`validate_args`).
pub const MAX_ARGS_DEPTH: usize = 127;

/// The latest `run_at` accepted: every client and the database can represent years up to 9999.
pub(crate) fn validate_run_at(at: DateTime<Utc>) -> Result<()> {
    use chrono::Datelike;
    if at.year() > 9999 || at.year() < 1 {
        return Err(Error::Config(format!(
            "run_at must be in years 1..=9999, got {at}"
        )));
    }
    Ok(())
}

/// How deeply arrays and objects nest in `value` (a scalar: 0), without recursion.
pub(crate) fn json_depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// Unicode format characters (general category Cf: bidirectional controls, zero-width spaces and
/// joiners, the byte-order mark, tags). In a name they make two names look alike or one look like
/// another ("invoices\u{202E}txt.exe"). The SQL API refuses the same ranges (`validate_enqueue`).
pub(crate) const FORMAT_CHARACTERS: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

fn is_format_character(c: char) -> bool {
    FORMAT_CHARACTERS
        .iter()
        .any(|&(low, high)| (low..=high).contains(&c))
}

/// Free text stored by the database (an error message): PostgreSQL text cannot hold U+0000.
pub(crate) fn validate_text(what: &'static str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::Config(format!(
            "{what} contains a NUL character, which PostgreSQL cannot store"
        )));
    }
    Ok(())
}

/// A JSON value stored as jsonb, which cannot hold U+0000 (serde_json writes it as \u0000).
pub(crate) fn validate_json(what: &'static str, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string(value)
        .map_err(|e| Error::Config(format!("{what} is not representable as JSON: {e}")))?;
    if text.contains("\\u0000") {
        return Err(Error::Config(format!(
            "{what} contains a NUL character, which PostgreSQL cannot store"
        )));
    }
    Ok(())
}

/// A job's priority, 1 (first) ..= 4 (last).
pub(crate) fn validate_priority(priority: i16) -> Result<()> {
    if (1..=4).contains(&priority) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "priority must be 1..=4, got {priority}"
        )))
    }
}

/// Queue names and kinds are bound as values, never spliced into SQL; they are still checked so
/// that operators see printable names and a NUL byte fails here, clearly.
pub(crate) fn validate_name(what: &'static str, value: &str) -> Result<()> {
    let invalid = |reason| Error::InvalidName {
        what,
        value: value.to_string(),
        reason,
    };
    if value.is_empty() || value.len() > 128 {
        return Err(invalid("must be 1..=128 bytes"));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(invalid(
            "must not contain control characters (NUL included)",
        ));
    }
    Ok(())
}

/// A name a new job brings: `validate_name`, and no invisible format characters either. Only new
/// jobs are held to it, so a queue named before the rule existed can still be read, paused and
/// drained.
pub(crate) fn validate_new_name(what: &'static str, value: &str) -> Result<()> {
    validate_name(what, value)?;
    if value.chars().any(is_format_character) {
        return Err(Error::InvalidName {
            what,
            value: value.to_string(),
            reason: "must not contain invisible format characters (bidirectional controls, zero-width spaces, U+FEFF)",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_bytes_and_bad_names_are_refused() {
        let job = NewJob::from_parts("k", serde_json::json!({"s": "a\u{0}b"})).unwrap();
        assert!(matches!(job.validate(), Err(Error::InvalidArgs { .. })));
        assert!(NewJob::from_parts("bad\0kind", serde_json::json!({})).is_err());
        let job = NewJob::from_parts("k", serde_json::json!({}))
            .unwrap()
            .priority(5);
        assert!(job.validate().is_err());
        let job = NewJob::from_parts("k", serde_json::json!({}))
            .unwrap()
            .queue("");
        assert!(job.validate().is_err());
    }
}

#[cfg(test)]
mod hostile_input_tests {
    use super::*;

    fn nested(depth: usize) -> serde_json::Value {
        let mut value = serde_json::json!(1);
        for _ in 0..depth {
            value = serde_json::Value::Array(vec![value]);
        }
        value
    }

    #[test]
    fn the_depth_limit_is_what_serde_json_decodes() {
        let ok = serde_json::to_string(&nested(MAX_ARGS_DEPTH)).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&ok).is_ok());
        let deep = serde_json::to_string(&nested(MAX_ARGS_DEPTH + 1)).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        let job = NewJob::from_parts("k", nested(MAX_ARGS_DEPTH)).unwrap();
        assert!(job.validate().is_ok());
        let job = NewJob::from_parts("k", nested(MAX_ARGS_DEPTH + 1)).unwrap();
        let err = job.validate().unwrap_err().to_string();
        assert!(err.contains("deeper than 127"), "{err}");
    }

    #[test]
    fn run_at_past_year_9999_is_refused() {
        let far = DateTime::<Utc>::from_timestamp(300_000_000_000, 0).unwrap();
        let job = NewJob::from_parts("k", serde_json::json!({}))
            .unwrap()
            .run_at(far);
        assert!(job.validate().unwrap_err().to_string().contains("9999"));
        let fine = DateTime::<Utc>::from_timestamp(253_402_300_799, 0).unwrap();
        let job = NewJob::from_parts("k", serde_json::json!({}))
            .unwrap()
            .run_at(fine);
        assert!(job.validate().is_ok());
    }

    #[test]
    fn names_with_invisible_format_characters_are_refused() {
        for bad in [
            "invoices\u{202E}txt.exe",
            "mail\u{200B}",
            "\u{FEFF}q",
            "a\u{E0041}",
        ] {
            assert!(
                validate_new_name("queue name", bad).is_err(),
                "{bad:?} accepted"
            );
            // a queue named before the rule can still be looked up, paused and drained
            assert!(validate_name("queue name", bad).is_ok(), "{bad:?}");
        }
        assert!(validate_new_name("queue name", "envoi-é-日本").is_ok());
    }
}

#[cfg(test)]
mod status_tests {
    use super::JobStatus;

    #[test]
    fn every_state_round_trips_through_its_database_name() {
        for state in JobStatus::ALL {
            let parsed: JobStatus = state.as_str().parse().unwrap();
            assert_eq!(parsed, state);
            assert_eq!(state, state.as_str());
            assert_eq!(format!("{state:<14}|"), format!("{:<14}|", state.as_str()));
        }
        assert!("exploded".parse::<JobStatus>().is_err());
    }
}
