//! The web dashboard (feature `dashboard`): overview, queues, jobs, a job's page, the dead-letter
//! queue and storage health, server-rendered as an axum `Router` a service mounts under a path of
//! its own; `ringwork serve` mounts it at `/dashboard`.
//!
//! ```no_run
//! # async fn demo(client: ringwork::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use ringwork::dashboard::{Actions, Dashboard};
//! let app = axum::Router::new().nest(
//!     "/ops/jobs",
//!     Dashboard::new(client.admin())
//!         .base_path("/ops/jobs")
//!         .actions(Actions::Token("a long random secret".into()))?
//!         .router(),
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! Safe by default:
//! - read-only unless built with [`Actions::Token`] or [`Actions::BehindProxy`];
//! - every action is a POST carrying a CSRF token (a form field derived from a secret the page
//!   never reveals otherwise), refused when the browser says the request came from another site
//!   (`Origin`, `Sec-Fetch-Site`);
//! - every request must name, in `Host`, a host the dashboard is served as: loopback names, and
//!   those given to [`Dashboard::allowed_hosts`] (a page rebound to 127.0.0.1 gets 421);
//! - with a token, every page needs it: the browser signs in once (`/login`, throttled after five
//!   wrong tokens a minute) and keeps an HttpOnly, SameSite=Strict session cookie that expires
//!   after 12 hours and dies at sign-out or restart (`Secure` behind a TLS proxy); scripts may send
//!   `Authorization: Bearer <token>` instead;
//! - every value from the database is escaped by the templates (maud), and a Content-Security-Policy
//!   allows no script but the dashboard's own file (`live.js`: open pages update themselves; no
//!   inline script, no eval; every page works without it).
//!
//! Read-only and behind-proxy dashboards need no sign-in to read: the pages show job arguments
//! (user data) and other sessions' queries, so listen on a private address, or behind the
//! operator's own authenticating proxy, or set a token (docs/dashboard.md).

mod access;
mod history;
mod pages;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};

use crate::bytes::{constant_time_eq as same, hex};
use crate::storage::Storage;
use crate::JobStatus;

use access::{Hosts, Sessions};
use history::History;

const STYLE: &str = include_str!("style.css");
const LIVE: &str = include_str!("live.js");
const SESSION_COOKIE: &str = "ringwork_dashboard";

/// What the dashboard lets its visitors see and change.
#[derive(Clone, Default)]
pub enum Actions {
    /// Pages only; every POST is refused (the default).
    #[default]
    ReadOnly,
    /// Every page and action for a browser that signed in with this token (or a request carrying
    /// it as a bearer token); nothing for anyone else. At least 16 characters: use a long random
    /// value, it is the dashboard's only credential.
    Token(String),
    /// Actions for every visitor: the operator's proxy in front authenticates them. CSRF
    /// protection still applies.
    BehindProxy,
}

impl std::fmt::Debug for Actions {
    // never the token itself (configs get logged)
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ReadOnly => f.write_str("ReadOnly"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::BehindProxy => f.write_str("BehindProxy"),
        }
    }
}

/// The dashboard's configuration; [`Dashboard::router`] builds the pages.
pub struct Dashboard {
    storage: Storage,
    reads: Option<Storage>,
    base: String,
    hosts: Vec<String>,
    max_requests: usize,
    actions: Actions,
    horizon_min_age: Duration,
    sample_every: Duration,
    live_every: Option<Duration>,
}

impl Dashboard {
    /// A read-only dashboard over `admin`'s pool and schema, served at the root to loopback hosts
    /// only: at most 8 requests at once, horizon holders from 60 s, counts sampled every 10 s.
    pub fn new(admin: crate::Admin) -> Self {
        Self {
            storage: admin.storage().clone(),
            reads: None,
            base: String::new(),
            hosts: Vec::new(),
            max_requests: 8,
            actions: Actions::ReadOnly,
            horizon_min_age: Duration::from_secs(60),
            sample_every: Duration::from_secs(10),
            live_every: Some(Duration::from_secs(5)),
        }
    }

    /// Read the pages from `reads` (a hot standby's URL, say) while actions still go to the
    /// `Admin` given to `new`. Every page then says how stale it may be (`Admin::replica_status`).
    /// Both must name the same schema.
    pub fn read_from(mut self, reads: crate::Admin) -> Self {
        self.reads = Some(reads.storage().clone());
        self
    }

    /// The path the router is nested under (`/dashboard`), for the links and forms of the pages.
    pub fn base_path(mut self, path: &str) -> Self {
        self.base = path.trim_end_matches('/').to_string();
        self
    }

    /// The host names (or addresses) the dashboard is served as, beside the loopback names it
    /// always answers for: the name in the browser's address bar, which a proxy in front passes on
    /// in `Host`. A request naming any other host is refused (421), and so is an action whose
    /// `Origin` names another host.
    pub fn allowed_hosts<S: AsRef<str>>(mut self, hosts: &[S]) -> Self {
        self.hosts = hosts.iter().map(|h| h.as_ref().to_string()).collect();
        self
    }

    /// How many requests are served at once (default 8): each holds a database connection while it
    /// reads, and the pool is shared with the process's other work. A request waits up to
    /// 5 s for its turn, then gets 503; one that takes longer than 15 s gets 503 too. Bound the
    /// statements themselves with a `statement_timeout` on the dashboard's pool (`ringwork serve`
    /// sets 10 s).
    pub fn max_concurrent_requests(mut self, max: usize) -> Self {
        self.max_requests = max.max(1);
        self
    }

    /// Turn actions on (and, with a token, put every page behind sign-in). A token shorter than
    /// 16 characters is refused.
    pub fn actions(mut self, actions: Actions) -> crate::Result<Self> {
        if let Actions::Token(token) = &actions {
            if token.chars().count() < 16 {
                return Err(crate::Error::Config(
                    "the dashboard token must be at least 16 characters: it is the dashboard's only credential"
                        .into(),
                ));
            }
        }
        self.actions = actions;
        Ok(self)
    }

    /// Sessions whose transaction or snapshot is at least this old are listed as horizon holders
    /// on the storage page (default 60 s).
    pub fn horizon_min_age(mut self, min_age: Duration) -> Self {
        self.horizon_min_age = min_age;
        self
    }

    /// How often the overview samples the per-queue counts (default 10 s; at least ten times as
    /// long as the last sample took); it keeps an hour's worth of samples at this period.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every.max(Duration::from_secs(1));
        self
    }

    /// How often an open page reads itself again and updates in place (default 5 s, at least
    /// 1 s); `None`: pages stay as they were read. Each update is one page read, like a reload.
    pub fn live_every(mut self, every: Option<Duration>) -> Self {
        self.live_every = every.map(|e| e.max(Duration::from_secs(1)));
        self
    }

    /// The pages as a router. Call it inside a Tokio runtime: it starts the overview's sampler,
    /// which stops when the router is dropped.
    pub fn router(self) -> Router {
        let secret: [u8; 32] = match &self.actions {
            Actions::Token(token) => digest(&[b"ringwork-dashboard-secret", token.as_bytes()]),
            // nothing to derive it from: a fresh one per process (forms of an older process
            // are refused after a restart; a reload fixes that)
            _ => rand::random(),
        };
        let shared = Arc::new(Shared {
            reads: self.reads.unwrap_or_else(|| self.storage.clone()),
            storage: self.storage,
            base: self.base,
            hosts: Hosts::new(&self.hosts),
            csrf: hex(&digest(&[&secret, b"csrf"])),
            sessions: Sessions::default(),
            token_hash: match &self.actions {
                Actions::Token(token) => Some(digest(&[token.as_bytes()])),
                _ => None,
            },
            actions: self.actions,
            horizon_min_age: self.horizon_min_age,
            live_every: self.live_every,
            turns: tokio::sync::Semaphore::new(self.max_requests),
            history: Mutex::new(History::new(self.sample_every, Duration::from_secs(3600))),
            serving: history::Serving::new(history::QUIET_AFTER_A_PAGE),
        });
        history::spawn_sampler(Arc::downgrade(&shared), self.sample_every);
        Router::new()
            .route("/", get(pages::overview))
            .route("/queues", get(pages::queues))
            .route("/queues/{action}", post(set_queue_paused))
            .route("/jobs", get(pages::jobs))
            .route("/jobs/find", get(pages::find_job))
            .route("/jobs/bulk", get(pages::bulk_confirm).post(bulk_action))
            .route("/jobs/{id}", get(pages::job))
            .route("/jobs/{id}/{action}", post(job_action))
            .route("/workflows/{id}", get(pages::workflow))
            .route("/sequences", get(pages::sequence))
            .route("/workflows/{id}/cancel", post(workflow_cancel))
            .route("/callbacks", get(pages::callbacks))
            .route("/schedules", get(pages::schedules))
            .route("/schedules/{action}", post(schedule_action))
            .route("/limits", get(pages::limits))
            .route("/processes", get(pages::processes))
            .route("/dlq", get(pages::dead_letters))
            .route("/dlq/{action}", post(dead_letter_action))
            .route("/archive", get(pages::archive))
            .route("/storage", get(pages::storage))
            .route("/login", get(pages::login).post(login))
            .route("/logout", post(logout))
            .route("/assets/style.css", get(style))
            .route("/assets/live.js", get(live_script))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&shared),
                require_sign_in,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&shared),
                bounded,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&shared),
                in_layout,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&shared),
                require_allowed_host,
            ))
            .layer(axum::middleware::map_response(security_headers))
            .with_state(shared)
    }
}

/// What every handler shares.
pub(crate) struct Shared {
    /// Actions, and what must be read where they are written.
    storage: Storage,
    /// Pages and the overview's samples (`Dashboard::read_from`; else `storage`).
    reads: Storage,
    base: String,
    hosts: Hosts,
    actions: Actions,
    /// The CSRF form field every action carries.
    csrf: String,
    /// Signed-in browsers (token mode).
    sessions: Sessions,
    token_hash: Option<[u8; 32]>,
    horizon_min_age: Duration,
    /// How often open pages update themselves (`Dashboard::live_every`).
    live_every: Option<Duration>,
    /// One permit per request being served (`Dashboard::max_concurrent_requests`).
    turns: tokio::sync::Semaphore,
    history: Mutex<History>,
    /// The pages being served now: the sampler counts between them.
    serving: history::Serving,
}

/// How long a request waits for its turn before it gets 503.
const REQUEST_WAIT: Duration = Duration::from_secs(5);
/// How long a request may take; past it, 503.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

impl Shared {
    /// A link to a page of the dashboard.
    fn href(&self, path: &str) -> String {
        // the overview is the mount point itself: a nested router's "/" does not answer "/base/"
        if path == "/" && !self.base.is_empty() {
            return self.base.clone();
        }
        format!("{}{}", self.base, path)
    }

    /// May this request change things? (Pages show the forms only when it may.)
    fn may_act(&self, headers: &HeaderMap) -> bool {
        match &self.actions {
            Actions::ReadOnly => false,
            Actions::BehindProxy => true,
            Actions::Token(_) => self.signed_in(headers) || self.bearer(headers),
        }
    }

    fn signed_in(&self, headers: &HeaderMap) -> bool {
        let now = Instant::now();
        session_ids(headers).any(|id| self.sessions.is_live(id, now))
    }

    fn bearer(&self, headers: &HeaderMap) -> bool {
        let (Some(expected), Some(given)) = (
            &self.token_hash,
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ")),
        ) else {
            return false;
        };
        same(&digest(&[given.as_bytes()]), expected)
    }

    /// Refuse an action unless actions are on, the caller may act, the request did not come from
    /// another site, and it carries the CSRF field (a bearer token needs none: a browser never
    /// sends one on its own).
    fn check_action(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<(), Refusal> {
        if matches!(self.actions, Actions::ReadOnly) {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                "the dashboard is read-only: start it with actions enabled (docs/dashboard.md)",
            ));
        }
        if self.bearer(headers) {
            return Ok(());
        }
        if !self.may_act(headers) {
            return Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "sign in with the dashboard's token first",
            ));
        }
        if cross_site(headers, &self.hosts) {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                "refused: the request came from another site",
            ));
        }
        match csrf {
            Some(given) if same(given.as_bytes(), self.csrf.as_bytes()) => Ok(()),
            _ => Err(Refusal(
                StatusCode::FORBIDDEN,
                "refused: the form's CSRF token is missing or stale; reload the page",
            )),
        }
    }
}

/// The session ids a request's cookies carry.
fn session_ids(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

/// Did the browser say this request came from another site? `Sec-Fetch-Site` when sent (every
/// current browser), and an `Origin` that names neither the request's `Host` nor one of the hosts
/// the dashboard is served as. (`Host` itself was checked against those hosts before.)
fn cross_site(headers: &HeaderMap, hosts: &Hosts) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return true;
        }
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        // "null" (a sandboxed or file page) or another scheme
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    host != Some(authority) && !hosts.allows(authority)
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

pub(crate) fn refuse(status: StatusCode, message: &str) -> Response {
    (status, pages::message_page("Refused", message)).into_response()
}

/// Why an action is refused: its status and a message for the page.
struct Refusal(StatusCode, &'static str);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        refuse(self.0, self.1)
    }
}

/// A failed read or write: bad input is the caller's (400), anything else the server's (500).
fn failure(error: crate::Error) -> Response {
    let status = match &error {
        crate::Error::InvalidName { .. } | crate::Error::Config(_) => StatusCode::BAD_REQUEST,
        crate::Error::Database(sqlx::Error::Database(db))
            if db.code().as_deref() == Some("22023") =>
        {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::warn!(error = %error, "dashboard: a database call failed");
    }
    (status, pages::message_page("Error", &error.to_string())).into_response()
}

/// Serve at most `max_concurrent_requests` at once, each page within `REQUEST_TIMEOUT`: a burst of
/// page loads (or a slow page over many queues) must not take every connection of the pool the
/// process works with.
async fn bounded(
    State(shared): AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let busy = |message: &str| {
        let mut response = (
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message_page("Busy", message),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        response
    };
    let Ok(Ok(_turn)) = tokio::time::timeout(REQUEST_WAIT, shared.turns.acquire()).await else {
        return busy(
            "the dashboard is serving as many requests as it may at once; try again shortly",
        );
    };
    let _serving = shared.serving.enter();
    // an action (a bulk retry or purge of a large dead-letter queue) runs in bounded steps until
    // it is done: cutting it off would leave it half done and say it failed
    if request.method() != axum::http::Method::GET {
        return next.run(request).await;
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => busy("this page took too long to read from the database"),
    }
}

/// Show refusals and errors inside the layout. Not for a request refused for its Host: a page
/// that may be another site's gets the bare message.
async fn in_layout(
    State(shared): AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers().clone();
    let response = next.run(request).await;
    let Some(message) = response.extensions().get::<pages::Message>().cloned() else {
        return response;
    };
    let (mut parts, _) = response.into_parts();
    let (_, body) = pages::message_in_layout(&shared, &headers, &message).into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, body)
}

/// Refuse a request whose `Host` is not one the dashboard is served as (see `access`).
async fn require_allowed_host(
    State(shared): AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if host.is_some_and(|host| shared.hosts.allows(host)) {
        return next.run(request).await;
    }
    let message = format!(
        "this dashboard answers only for the hosts {}; serve it with the name you use added \
         (`ringwork serve --dashboard-host <name>`, Dashboard::allowed_hosts)",
        shared.hosts.names().join(", ")
    );
    (
        StatusCode::MISDIRECTED_REQUEST,
        pages::message_page("Refused", &message),
    )
        .into_response()
}

/// With a token, every page but the sign-in page and the stylesheet needs a signed-in browser (or
/// the bearer token): a GET is sent to sign in and back to the page it asked for, anything else is
/// refused.
async fn require_sign_in(
    State(shared): AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // the router's own paths (a nested router sees them without the mount point), exactly
    let open = matches!(
        request.uri().path(),
        "/login" | "/assets/style.css" | "/assets/live.js"
    );
    if !matches!(shared.actions, Actions::Token(_)) || open || shared.may_act(request.headers()) {
        return next.run(request).await;
    }
    if request.method() == axum::http::Method::GET {
        let asked = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        see_other(shared.href(&format!("/login?{}", pages::query(&[("next", asked)]))))
    } else {
        refuse(
            StatusCode::UNAUTHORIZED,
            "sign in with the dashboard's token first",
        )
    }
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn style() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLE,
    )
        .into_response()
}

async fn live_script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        LIVE,
    )
        .into_response()
}

/// The fields of an action's form.
#[derive(serde::Deserialize)]
struct ActionForm {
    csrf: Option<String>,
    queue: Option<String>,
}

type AppState = State<Arc<Shared>>;

pub(crate) fn see_other(to: String) -> Response {
    Redirect::to(&to).into_response()
}

/// Pause or resume the form's queue (`/queues/pause`, `/queues/resume`).
async fn set_queue_paused(
    State(shared): AppState,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return refuse(StatusCode::NOT_FOUND, "no such queue action"),
    };
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let Some(queue) = form.queue.filter(|q| !q.is_empty()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "which queue? (the form has no queue)",
        );
    };
    // the Rust API may pause a queue before its first job; a form names one that exists (a typo,
    // or a forged form, must not create queues)
    match shared.storage.queue_counts(Some(&queue)).await {
        Ok(counts) if counts.is_empty() => {
            return refuse(StatusCode::NOT_FOUND, "no such queue");
        }
        Ok(_) => {}
        Err(e) => return failure(e),
    }
    match shared.storage.set_queue_paused(&queue, paused).await {
        Ok(_) => see_other(shared.href("/queues")),
        Err(e) => failure(e),
    }
}

#[derive(serde::Deserialize)]
struct ScheduleForm {
    csrf: Option<String>,
    schedule: Option<String>,
}

/// Pause, resume or fire a schedule (`/schedules/pause`, `/schedules/resume`,
/// `/schedules/trigger`). Only a schedule the page lists: a typo or a forged form must not leave
/// a paused or triggered name behind.
async fn schedule_action(
    State(shared): AppState,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(form): Form<ScheduleForm>,
) -> Response {
    if !matches!(action.as_str(), "pause" | "resume" | "trigger") {
        return refuse(StatusCode::NOT_FOUND, "no such schedule action");
    }
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let Some(schedule) = form.schedule.filter(|s| !s.is_empty()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "which schedule? (the form has no schedule)",
        );
    };
    match shared.storage.schedules().await {
        Ok(known) if !known.iter().any(|s| s.schedule == schedule) => {
            return refuse(StatusCode::NOT_FOUND, "no such schedule");
        }
        Ok(_) => {}
        Err(e) => return failure(e),
    }
    let done = match action.as_str() {
        "trigger" => shared.storage.trigger_schedule(&schedule).await,
        paused => {
            shared
                .storage
                .set_schedule_paused(&schedule, paused == "pause")
                .await
        }
    };
    match done {
        Ok(_) => see_other(shared.href("/schedules")),
        Err(e) => failure(e),
    }
}

#[derive(serde::Deserialize)]
struct BulkForm {
    csrf: Option<String>,
    action: Option<String>,
    state: Option<String>,
    queue: Option<String>,
    kind: Option<String>,
    /// When the confirmation was shown (ms since the epoch): only older jobs are touched.
    shown_at: Option<String>,
}

/// Cancel or retry every job a filter selects (`POST /jobs/bulk`, from the confirmation page), in
/// the bulk API's bounded steps, and say what it did.
async fn bulk_action(
    State(shared): AppState,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> Response {
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let Some(action) = form.action.as_deref().and_then(pages::BulkAction::parse) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "which bulk action? (cancel or retry)",
        );
    };
    let Some(state) = form
        .state
        .as_deref()
        .and_then(|s| s.parse::<JobStatus>().ok())
        .filter(|s| action.applies_to(*s))
    else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the form names no state this action applies to",
        );
    };
    // a bulk action always has its cutoff: a form without one must not widen to what arrives later
    let Some(shown) = form.shown_at.as_deref().and_then(|v| v.parse::<i64>().ok()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the form has no shown_at: confirm from the dashboard's page",
        );
    };
    let age = chrono::Utc::now().timestamp_millis().saturating_sub(shown);
    let queue = form.queue.filter(|q| !q.is_empty());
    let kind = form.kind.filter(|k| !k.is_empty());
    let filter = crate::JobFilter {
        queue: queue.clone(),
        kind: kind.clone(),
        states: vec![state],
        older_than: Some(Duration::from_millis(age.max(0) as u64)),
    };
    let outcome = match action {
        pages::BulkAction::Cancel => {
            shared
                .storage
                .bulk_cancel(&filter, "cancelled from the dashboard")
                .await
        }
        pages::BulkAction::Retry => shared.storage.bulk_retry(&filter).await,
    };
    let pairs = pages::list_pairs(state, queue.as_deref(), kind.as_deref());
    let back = shared.href(&format!("/jobs?{}", pages::query(&pairs)));
    match outcome {
        Ok(outcome) => pages::bulk_done(&shared, &headers, action, state, back, outcome).await,
        Err(e) => failure(e),
    }
}

/// Retry or cancel one job (`/jobs/{id}/retry`, `/jobs/{id}/cancel`).
async fn job_action(
    State(shared): AppState,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if action != "retry" && action != "cancel" {
        return refuse(StatusCode::NOT_FOUND, "no such job action");
    }
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    let done = if action == "retry" {
        shared.storage.retry_job(id).await
    } else {
        // a job that finished meanwhile stays finished: its page shows it
        shared
            .storage
            .cancel_job(id, "cancelled from the dashboard")
            .await
            .map(|_| true)
    };
    match done {
        Ok(true) => see_other(shared.href(&format!("/jobs/{id}"))),
        Ok(false) => refuse(
            StatusCode::CONFLICT,
            "not retried: only scheduled, retryable and dead-lettered jobs can be retried",
        ),
        Err(e) => failure(e),
    }
}

async fn workflow_cancel(
    State(shared): AppState,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    match shared.storage.cancel_workflow(id).await {
        Ok(Some(_)) => see_other(shared.href(&format!("/workflows/{id}"))),
        Ok(None) => refuse(StatusCode::NOT_FOUND, "no such workflow"),
        Err(e) => failure(e),
    }
}

/// A dead-letter form (its CSRF field is checked first): its scope (`selected`: the `job` fields;
/// `all`: every dead-lettered job of `queue`, or of every queue), and a queue.
struct DlqForm {
    queue: Option<String>,
    jobs: Vec<i64>,
    all: bool,
    /// For `all`: only jobs dead-lettered at least this long ago (before the page was shown).
    older_than: Option<Duration>,
}

fn dlq_form(pairs: &[(String, String)]) -> Result<DlqForm, Refusal> {
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let jobs = pairs
        .iter()
        .filter(|(k, _)| k == "job")
        .map(|(_, v)| {
            v.parse::<i64>()
                .map_err(|_| Refusal(StatusCode::BAD_REQUEST, "a selected job id is not a number"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // the scope is explicit: an empty selection must never widen into "everything"
    let all = match field("scope").as_deref() {
        Some("all") => true,
        Some("selected") if !jobs.is_empty() => false,
        Some("selected") => {
            return Err(Refusal(
                StatusCode::BAD_REQUEST,
                "nothing selected: tick the jobs to act on",
            ))
        }
        _ => return Err(Refusal(StatusCode::BAD_REQUEST, "the form has no scope")),
    };
    // an "all" form from before the cutoff field existed acts on what is there now
    let older_than = match field("shown_at") {
        None => None,
        Some(millis) => {
            let shown = millis.parse::<i64>().map_err(|_| {
                Refusal(StatusCode::BAD_REQUEST, "the form's shown_at is not a time")
            })?;
            let age = chrono::Utc::now().timestamp_millis().saturating_sub(shown);
            Some(Duration::from_millis(age.max(0) as u64))
        }
    };
    Ok(DlqForm {
        queue: field("queue"),
        jobs: if all { Vec::new() } else { jobs },
        all,
        older_than,
    })
}

fn dlq_page(shared: &Shared, queue: Option<&str>) -> String {
    match queue {
        Some(queue) => shared.href(&format!("/dlq?{}", pages::query(&[("queue", queue)]))),
        None => shared.href("/dlq"),
    }
}

/// Retry or purge dead-lettered jobs (`/dlq/retry`, `/dlq/purge`): the selected ones (scope
/// `selected`), or every one of the form's queue, or of every queue (scope `all`).
async fn dead_letter_action(
    State(shared): AppState,
    headers: HeaderMap,
    Path(action): Path<String>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let retry = match action.as_str() {
        "retry" => true,
        "purge" => false,
        _ => return refuse(StatusCode::NOT_FOUND, "no such dead-letter action"),
    };
    // read-only, signed out, cross-site and CSRF first, whatever the form holds
    let csrf = pairs
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str());
    if let Err(refused) = shared.check_action(&headers, csrf) {
        return refused.into_response();
    }
    let DlqForm {
        queue,
        jobs,
        all,
        older_than,
    } = match dlq_form(&pairs) {
        Ok(form) => form,
        Err(refused) => return refused.into_response(),
    };
    let storage = &shared.storage;
    let all_filter = crate::JobFilter {
        queue: queue.clone(),
        kind: None,
        states: vec![JobStatus::DeadLettered],
        older_than,
    };
    let result = async {
        match (retry, all) {
            (true, true) => {
                storage.bulk_retry(&all_filter).await?;
            }
            (false, true) => {
                // bounded steps, like every bulk operation: never one DELETE of a whole queue
                storage.bulk_delete(&all_filter).await?;
            }
            (true, false) => {
                for id in &jobs {
                    storage.retry_job(*id).await?;
                }
            }
            (false, false) => {
                for id in &jobs {
                    storage.dlq_purge(None, Some(*id)).await?;
                }
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => see_other(dlq_page(&shared, queue.as_deref())),
        Err(e) => failure(e),
    }
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: Option<String>,
    /// The dashboard page to go back to (a path of this router).
    next: Option<String>,
}

/// Where to go after sign-in: `next` if it is a path of this router, else the overview. Never
/// another site (`//host`, a scheme) and never the sign-in page again.
fn after_sign_in(shared: &Shared, next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.starts_with("/login")
                && !path.contains('\\')
                && path.chars().all(|c| c.is_ascii_graphic()) =>
        {
            shared.href(path)
        }
        _ => shared.href("/"),
    }
}

/// Did the request reach us through a TLS-terminating proxy? Then the session cookie is `Secure`.
/// A client that sends the header itself only makes its own cookie stricter.
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

fn cookie_path(shared: &Shared) -> &str {
    if shared.base.is_empty() {
        "/"
    } else {
        &shared.base
    }
}

async fn login(
    State(shared): AppState,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let Some(expected) = shared.token_hash else {
        return refuse(
            StatusCode::NOT_FOUND,
            "this dashboard has no token to sign in with",
        );
    };
    if cross_site(&headers, &shared.hosts) {
        return refuse(
            StatusCode::FORBIDDEN,
            "refused: the request came from another site",
        );
    }
    let now = Instant::now();
    if let Some(wait) = shared.sessions.throttled(now) {
        let message = format!(
            "too many wrong tokens: try again in {} s",
            wait.as_secs().max(1)
        );
        return (
            StatusCode::TOO_MANY_REQUESTS,
            pages::message_page("Refused", &message),
        )
            .into_response();
    }
    let given = form.token.unwrap_or_default();
    if given.is_empty() || !same(&digest(&[given.as_bytes()]), &expected) {
        shared.sessions.failed(now);
        return refuse(StatusCode::UNAUTHORIZED, "wrong token");
    }
    // a new session for every sign-in: an id planted before it is worth nothing after
    for old in session_ids(&headers) {
        shared.sessions.close(old);
    }
    let cookie = format!(
        "{SESSION_COOKIE}={}; Path={}; Max-Age={}; HttpOnly; SameSite=Strict{}",
        shared.sessions.open(now),
        cookie_path(&shared),
        access::SESSION_TTL.as_secs(),
        if over_tls(&headers) { "; Secure" } else { "" }
    );
    let mut response = see_other(after_sign_in(&shared, form.next.as_deref()));
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(_) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot set the session cookie",
        ),
    }
}

async fn logout(
    State(shared): AppState,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = shared.check_action(&headers, form.csrf.as_deref()) {
        return refused.into_response();
    }
    for id in session_ids(&headers) {
        shared.sessions.close(id);
    }
    let mut response = see_other(shared.href("/"));
    if let Ok(value) = HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
        cookie_path(&shared)
    )) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// Query parameters of the listing pages; empty fields mean "any".
#[derive(serde::Deserialize, Default)]
pub(crate) struct ListQuery {
    state: Option<String>,
    queue: Option<String>,
    kind: Option<String>,
    after: Option<String>,
    /// Finished (or dead-lettered) before this time (`YYYY-MM-DDTHH:MM[:SS]`, UTC).
    before: Option<String>,
    /// Finished (or dead-lettered) at or after this time.
    since: Option<String>,
    /// Arguments whose text holds this (the jobs page); JSON they contain (the archive page).
    args: Option<String>,
}

impl ListQuery {
    fn get(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|v| !v.is_empty())
    }
}
