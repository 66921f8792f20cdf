//! Exhaustive model check of the ring protocol, with the `stateright` crate.
//!
//! One queue with one (queue, priority) lane split into shards (each shard has its own
//! positions, cursor sequence and attempt ledger), a queue ring and a claim ring, a handful of jobs
//! and workers. Every action below is one transaction (or the in-memory step of a worker) of the
//! real code; the mapping to the Rust and SQL functions is in `docs/model.md`. Where the real code
//! is two statements with something able to commit in between, the model has two actions:
//!
//! - `claim()` reads the current claim slot first and inserts its claim batch at the end, with no
//!   lock on the slot row in between (`ClaimBegin` / `ClaimCommit`);
//! - `enqueue_segment()` try-locks a shard no open enqueue holds and reads the current queue slot
//!   without a lock before its rows commit (`EnqueueBegin` / `EnqueueCommit`); the shard stays
//!   held until the transaction ends, and claims step over any gap they see, with no gap check;
//! - completion takes the per-attempt advisory lock before its validating statement
//!   (`LockAttempt` / `Close`);
//! - prune proves, then takes ACCESS EXCLUSIVE, then re-proves and truncates (`*PruneProve`,
//!   `*PruneLock`, `*PruneFinish`, or `*PruneSkip` for `busy`).
//!
//! The safety properties are checked in every reachable state by breadth-first search (the
//! whole state space at the main bounds; every state within 18 steps for three jobs). Each broken
//! variant (flags on [`Faults`]) must produce a counterexample for the invariant it breaks.
//! Liveness ("every claimed job is eventually closed once crashes stop") is checked by a graph
//! walk of our own, not by `Property::eventually`: see `docs/model.md` for why, and for the
//! state-space reductions (canonical slot and shard labels, sorted workers, forgotten history).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Property};

// ------------------------------------------------------------------------------------------------
// State
// ------------------------------------------------------------------------------------------------

/// A vector of at most `N` items stored inline, so a state is `Copy` and cloning it allocates
/// nothing (the checker clones and hashes millions). Unused items stay `T::default()`, so the
/// derived equality, order and hash see only the contents.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Small<T, const N: usize> {
    len: u8,
    items: [T; N],
}

impl<T: Copy + Default, const N: usize> Small<T, N> {
    fn filled(value: T, len: u8) -> Self {
        assert!(usize::from(len) <= N, "bound above capacity {N}");
        let mut items = [T::default(); N];
        items[..usize::from(len)].fill(value);
        Small { len, items }
    }

    fn push(&mut self, value: T) {
        assert!(usize::from(self.len) < N, "capacity {N} exceeded");
        self.items[usize::from(self.len)] = value;
        self.len += 1;
    }

    fn remove(&mut self, index: usize) {
        let len = usize::from(self.len);
        self.items.copy_within(index + 1..len, index);
        self.items[len - 1] = T::default();
        self.len -= 1;
    }

    fn retain(&mut self, keep: impl Fn(&T) -> bool) {
        let mut i = 0;
        while i < usize::from(self.len) {
            if keep(&self.items[i]) {
                i += 1;
            } else {
                self.remove(i);
            }
        }
    }
}

impl<T: Copy + Default, const N: usize> Default for Small<T, N> {
    fn default() -> Self {
        Small {
            len: 0,
            items: [T::default(); N],
        }
    }
}

impl<T, const N: usize> Deref for Small<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..usize::from(self.len)]
    }
}

impl<T, const N: usize> DerefMut for Small<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..usize::from(self.len)]
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a Small<T, N> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.deref().iter()
    }
}

impl<'a, T, const N: usize> IntoIterator for &'a mut Small<T, N> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.deref_mut().iter_mut()
    }
}

impl<T: std::fmt::Debug, const N: usize> std::fmt::Debug for Small<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Capacities. The bounds of a run may be smaller.
const MAX_JOBS: usize = 3;
const MAX_WORKERS: usize = 2;
const MAX_SLOTS: usize = 3;
const MAX_SHARDS: usize = 2;
/// Open claims are at most one per job; closed ones are kept only by the lock-free variant.
const MAX_CLAIMS: usize = 8;

/// `queue_ring_slots.state` / `claim_ring_slots.state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum SlotState {
    #[default]
    Free,
    Current,
    Sealed,
}

/// One ring's control rows. `generation` is kept as a dense rank (only the order matters to the
/// code: rotation takes the free slot with the lowest `(generation, slot)`), so the state space
/// stays finite however often the ring turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Ring {
    state: Small<SlotState, MAX_SLOTS>,
    generation: Small<u8, MAX_SLOTS>,
}

impl Ring {
    /// As `0001_rings.sql` seeds it: slot 0 current with generation 1, the others free with 0.
    fn new(slots: u8) -> Self {
        let mut state = Small::filled(SlotState::Free, slots);
        let mut generation = Small::filled(0, slots);
        state[0] = SlotState::Current;
        generation[0] = 1;
        Ring { state, generation }
    }

    fn current(&self) -> u8 {
        self.state
            .iter()
            .position(|s| *s == SlotState::Current)
            .expect("one current slot") as u8
    }

    fn is(&self, slot: u8, state: SlotState) -> bool {
        self.state[usize::from(slot)] == state
    }

    /// `SELECT slot ... WHERE state = 'free' ORDER BY generation, slot LIMIT 1`.
    fn oldest_free(&self) -> Option<u8> {
        (0..self.state.len())
            .filter(|&s| self.state[s] == SlotState::Free)
            .min_by_key(|&s| (self.generation[s], s))
            .map(|s| s as u8)
    }

    /// Current -> sealed, `next` -> current with generation max + 1.
    fn rotate_to(&mut self, next: u8) {
        let cur = usize::from(self.current());
        let next = usize::from(next);
        self.state[cur] = SlotState::Sealed;
        self.state[next] = SlotState::Current;
        self.generation[next] = self.generation.iter().copied().max().unwrap_or(0) + 1;
        // dense ranks: a generation's rank is the number of distinct smaller ones
        let before = self.generation;
        for g in self.generation.iter_mut() {
            let mut distinct_smaller = 0;
            for (k, &h) in before.iter().enumerate() {
                if h < *g && !before[..k].contains(&h) {
                    distinct_smaller += 1;
                }
            }
            *g = distinct_smaller;
        }
    }
}

/// Where a job's enqueue transaction is (a ghost: the database only sees committed rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Enqueue {
    #[default]
    NotYet,
    /// `enqueue_segment` holds the shard's producer lock, has taken the shard's next position
    /// and read the current queue slot.
    InFlight {
        slot: u8,
        shard: u8,
        pos: u8,
    },
    Committed,
    RolledBack,
}

/// The job's latest `ready_entries` row. Older rows of the same job are behind the cursor with
/// their attempt closed, so no proof or statement in the model reads them any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Row {
    slot: u8,
    /// The shard (`lane_id`) of the row; `pos` is its position in that shard. A taken row keeps
    /// neither (both 0): nothing reads them again.
    shard: u8,
    pos: u8,
    /// `run_lease` of the row; the attempt claimed from it has `run_lease + 1`.
    lease: u8,
    /// Ghost: a committed claim handed this row out.
    taken: bool,
    /// In `parked_entries`: moved out of its slot by a parking prune, with its shard and
    /// position; in no slot (`slot` is 0 and means nothing) until an unpark puts it back.
    parked: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Job {
    enqueue: Enqueue,
    ready: Option<Row>,
    /// `deferred_jobs` row, by the `run_lease` it carries.
    deferred: Option<u8>,
    /// Ghost: completed or failed (the history rows themselves are truncated with their slot).
    terminal: bool,
    /// Ghost: highest `run_lease` a committed claim issued for the job.
    lease: u8,
    /// `pg_advisory_xact_lock(lock_ns('attempt'), job_id)` is held.
    locked: bool,
    /// Ghost: a prune parked the job's row once.
    was_parked: bool,
}

/// One claim: a compact `lease_claim_batches` member (or a row-local `lease_claims` row; both
/// shapes behave the same in every proof the model makes). `closed` is its closure evidence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Claim {
    slot: u8,
    job: u8,
    lease: u8,
    /// `ready_slots[i]`: where the attempt's ready row lives (close_batch joins it).
    ready_slot: u8,
    closed: bool,
    /// An `attempt_state` row with a fresh `heartbeat_at` (stale rescue passes over it). Time is
    /// otherwise abstract: any claim may already be older than `stale_after` or past its
    /// deadline, since enough time can always pass before a rescue sweep.
    heartbeat: bool,
}

/// What a worker names when it writes on behalf of an attempt: `(job_id, run_lease)` plus the
/// claim slot (and, in the code, the receipt id, which is unique per claim).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Att {
    job: u8,
    lease: u8,
    slot: u8,
}

/// A worker process with one handler slot. Everything here is in memory and lost by a crash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Worker {
    #[default]
    Idle,
    /// `claim()` is running: it has read the current claim slot, nothing has committed.
    Claiming { slot: u8 },
    /// The handler runs (`Inner::running`, heartbeated), or has returned and its result waits
    /// in the completion batcher: the same to the database, and lost alike by a crash.
    Running(Att),
    /// `complete_batch`/`close_batch` holds the per-attempt lock (with `complete_without_lock`:
    /// has validated the claim open without it) and has not yet written.
    Closing(Att, bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum PrunePhase {
    /// Ring state and slot row locked FOR UPDATE, first proof passed.
    Proved,
    /// ACCESS EXCLUSIVE on the slot's children held.
    Locked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Prune {
    slot: u8,
    phase: PrunePhase,
    /// The first proof failed only on pending rows, and the prune parks them (`park_blocker`).
    park: bool,
    /// The jobs with a row in the slot when the first proof ran (a bit per job): prune_queue_slot
    /// counts the slot's `ready_segments` before its proof and re-proves under its locks only if
    /// that count grew (a row can enter a sealed slot only with an enqueue that commits late).
    rows_at_proof: u8,
}

/// One shard of the lane: a `queue_lanes` row with its own segment and cursor sequences, and its
/// own `ready_claim_attempt_batches` rows (keyed by `lane_id`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Shard {
    /// The shard's next position (`segment_seq`; one job per segment here).
    next_pos: u8,
    /// `pg_sequence_last_value(cursor_seq)`: the shard's persisted claim cursor.
    cursor_seq: u8,
    /// Per queue slot: `max(upper(lane_range)) - 1` over the shard's `ready_claim_attempt_batches`
    /// rows in that slot (0 = none) — the shard's attempt ledger.
    ledger: Small<u8, MAX_SLOTS>,
    /// A `parked_lanes` row: some of the shard's rows are parked.
    parked: bool,
}

/// Ghost flags, set by the transition that breaks a promise, so `always` can see it afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Ghost {
    /// A TRUNCATE removed a claim that had no closure evidence.
    truncated_open_claim: bool,
    /// A write naming an attempt that was no longer open (or not the latest lease) took effect.
    stale_write: bool,
    /// A second closure of one attempt took effect.
    second_winner: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct State {
    jobs: Small<Job, MAX_JOBS>,
    /// Sorted: the claim ring's contents, whatever order they were written in.
    claims: Small<Claim, MAX_CLAIMS>,
    /// Sorted: workers are interchangeable (symmetry reduction by canonical form).
    workers: Small<Worker, MAX_WORKERS>,
    queue_ring: Ring,
    claim_ring: Ring,
    /// The lane's shards. Canonical labels: shards are interchangeable, so of the states that
    /// differ only by a renaming of shards the least is kept (`canonical_shards`).
    shards: Small<Shard, MAX_SHARDS>,
    /// Per queue slot: a child of the slot holds rows (rotate_queue_ring's "in use" test).
    queue_used: Small<bool, MAX_SLOTS>,
    /// Per claim slot: it holds claims, open or closed (rotate_claim_ring's test).
    claim_used: Small<bool, MAX_SLOTS>,
    queue_prune: Option<Prune>,
    claim_prune: Option<Prune>,
    ghost: Ghost,
}

impl State {
    /// `lane_cursor(lane_id)` of a shard: greatest(sequence, max ledger upper - 1).
    fn lane_cursor(&self, shard: u8) -> u8 {
        let sh = &self.shards[usize::from(shard)];
        sh.ledger
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(sh.cursor_seq)
    }

    /// An open enqueue transaction holds the shard's producer lock.
    fn shard_held(&self, shard: u8) -> bool {
        self.jobs
            .iter()
            .any(|j| matches!(j.enqueue, Enqueue::InFlight { shard: h, .. } if h == shard))
    }

    fn lock_free(&self, job: u8) -> bool {
        !self.jobs[usize::from(job)].locked
    }

    /// `open_claim(slot, receipt, job, lease)`: the claim exists in its slot with no closure.
    fn open_claim(&self, att: Att) -> Option<usize> {
        self.claims.iter().position(|c| {
            c.slot == att.slot && c.job == att.job && c.lease == att.lease && !c.closed
        })
    }

    /// close_batch's `JOIN ready_entries e ON e.ready_slot = o.ready_slot AND e.job_id = ...
    /// AND e.run_lease = i.run_lease - 1`: a non-success close needs the attempt's ready row.
    fn ready_row_of(&self, claim: &Claim) -> bool {
        matches!(self.jobs[usize::from(claim.job)].ready,
                 Some(r) if r.slot == claim.ready_slot && r.lease + 1 == claim.lease)
    }

    /// The row the claim walk of a shard hands out next, if any: the shard's lowest visible
    /// (committed) position above its cursor. There is no gap check: the walk steps over any
    /// position it does not see, in flight or rolled back (the producer lock makes an in-flight one
    /// impossible below a visible one). `gap_check` is the code before shards: the walk stops
    /// below a position an open enqueue holds.
    fn next_claimable(&self, shard: u8, gap_check: bool) -> Option<usize> {
        let cursor = self.lane_cursor(shard);
        let (j, row) = self
            .jobs
            .iter()
            .enumerate()
            .filter_map(|(j, job)| job.ready.map(|r| (j, r)))
            .filter(|(_, r)| !r.taken && !r.parked && r.shard == shard && r.pos > cursor)
            .min_by_key(|(_, r)| r.pos)?;
        let gap_open = gap_check
            && self.jobs.iter().any(|job| {
                matches!(job.enqueue, Enqueue::InFlight { shard: h, pos, .. }
                         if h == shard && pos < row.pos)
            });
        (!gap_open).then_some(j)
    }

    /// A row pending in its shard: not handed out and above its shard's cursor.
    fn pending(&self, row: &Row) -> bool {
        !row.taken && row.pos > self.lane_cursor(row.shard)
    }

    /// `queue_slot_blocker(slot)`: a ready row at or ahead of its shard's cursor, or an open claim
    /// (in any claim slot, free ones included) whose ready row lives here.
    fn queue_slot_blocked(&self, slot: u8) -> bool {
        self.slot_has_pending(slot) || self.open_claims_on(slot)
    }

    /// The jobs whose row sits in the slot (not parked), a bit per job: what the slot's
    /// `ready_segments` count stands for (one job per segment here).
    fn slot_rows(&self, slot: u8) -> u8 {
        self.jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| matches!(j.ready, Some(r) if !r.parked && r.slot == slot))
            .fold(0, |mask, (i, _)| mask | (1 << i))
    }

    /// `queue_slot_blocker` = 'pending_ready': an unparked row of the slot ahead of its cursor.
    fn slot_has_pending(&self, slot: u8) -> bool {
        self.jobs
            .iter()
            .any(|j| matches!(j.ready, Some(r) if !r.parked && r.slot == slot && self.pending(&r)))
    }

    /// `open_claims_on_ready_slot(slot) > 0`.
    fn open_claims_on(&self, slot: u8) -> bool {
        self.claims
            .iter()
            .any(|c| !c.closed && c.ready_slot == slot)
    }

    /// `park_blocker(slot, park_idle)` is NULL: the slot's only blocker is pending rows, and every
    /// shard holding one is cold. Coldness is time (no claim for `park_idle`, or a paused queue),
    /// which the model leaves free: any shard may be cold at any moment.
    fn slot_parkable(&self, slot: u8) -> bool {
        self.slot_has_pending(slot) && !self.open_claims_on(slot)
    }

    /// `unpark_lane(shard)`: its parked rows go back into the current slot with their positions.
    fn unpark(&mut self, shard: u8) {
        if !self.shards[usize::from(shard)].parked {
            return;
        }
        let current = self.queue_ring.current();
        for job in &mut self.jobs {
            if let Some(r) = job.ready.as_mut().filter(|r| r.parked && r.shard == shard) {
                r.parked = false;
                r.slot = current;
                self.queue_used[usize::from(current)] = true;
            }
        }
        self.shards[usize::from(shard)].parked = false;
    }

    /// `claim_slot_blocker(slot)`: a claim in the slot without closure evidence.
    fn claim_slot_blocked(&self, slot: u8) -> bool {
        self.claims.iter().any(|c| c.slot == slot && !c.closed)
    }

    /// Append the closure and route the job, as complete_batch / close_batch do.
    ///
    /// A closed claim only matters to the proofs as "its slot is in use", which `claim_used`
    /// records, and its ready row is read by nothing once the attempt is closed; so both are
    /// dropped from the state (merging states that differ only in dead history) unless
    /// `keep_closed` — the lock-free completion variant, which must see a second closure.
    fn close(&mut self, idx: usize, success: bool, max_attempts: u8, keep_closed: bool) {
        let claim = self.claims[idx];
        if claim.closed {
            self.ghost.second_winner = true;
        }
        if self.ready_row_of(&claim) {
            self.jobs[usize::from(claim.job)].ready = None;
        }
        if keep_closed {
            self.claims[idx].closed = true;
            self.claims[idx].heartbeat = false;
        } else {
            self.claims.remove(idx);
        }
        let job = &mut self.jobs[usize::from(claim.job)];
        if success || claim.lease >= max_attempts {
            // receipt_completion_batches, or a failed done_entries row (attempts exhausted)
            job.terminal = true;
        } else {
            // deferred_jobs, with the closed attempt's run_lease
            job.deferred = Some(claim.lease);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Model
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Bounds {
    jobs: u8,
    workers: u8,
    claim_slots: u8,
    queue_slots: u8,
    /// Shards of the lane. The model does not create shards: with every shard held by an open
    /// enqueue, a producer waits (the code would create one more).
    shards: u8,
    /// `max_attempts` of every job; the run_lease of an attempt equals its attempt number here.
    max_attempts: u8,
    /// The queue has a deadline (deadline rescue is on).
    deadlines: bool,
    /// An enqueue transaction may roll back after taking its lane position.
    rollbacks: bool,
    /// Workers heartbeat running attempts (the `attempt_state` freshness bit is tracked).
    heartbeats: bool,
    /// Prune parks the pending rows of a slot held only by them, and unparks run.
    parking: bool,
}

impl Bounds {
    /// The bounds of the main check: 2 jobs, 2 workers, 3 claim slots, 2 queue slots, 2 shards.
    fn main() -> Self {
        Bounds {
            jobs: 2,
            workers: 2,
            claim_slots: 3,
            queue_slots: 2,
            shards: 2,
            max_attempts: 2,
            deadlines: true,
            rollbacks: true,
            heartbeats: false,
            parking: false,
        }
    }
}

/// Deliberate departures from the real code. All false = the code as it is.
#[derive(Clone, Debug, Default)]
struct Faults {
    /// Prune truncates after taking its locks without proving the slot dead again.
    prune_without_reproof: bool,
    /// complete_batch / close_batch skip `lock_attempt`: validate, then (later) write.
    complete_without_lock: bool,
    /// Drop the per-child `EXCLUDE USING gist (receipt_ranges WITH &&)` / `UNIQUE (receipt_id)`
    /// on the closure tables, so a second closure of one receipt does not fail.
    no_closure_constraint: bool,
    /// claim() advances the cursor sequence to its new position before it commits (setval is
    /// not transactional), and can then abort.
    cursor_before_commit: bool,
    /// rescue() sweeps only `claim_ring_slots WHERE state <> 'free'` — the code before rescue
    /// swept free slots too, which this model's liveness check showed can strand a claim.
    rescue_skips_free_slots: bool,
    /// Producers do not take the shard's producer lock: `enqueue_segment` may write a shard that
    /// another open enqueue transaction holds. Claims have no gap check, so a claim can step the
    /// shard's cursor over the open transaction's position.
    shared_shards: bool,
    /// Claims keep the gap check of the code before lane shards (`lane_gap_resolved`, which read
    /// pg_locks): a shard's walk stops below a position that an open enqueue holds. With
    /// `shared_shards` and one shard this is that code: one lane, written by every producer.
    lane_gap_check: bool,
    /// A claim does not re-check `parked_lanes` for its shard after locking it: only its first
    /// look (`unpark_queue` at its start) unparks — the code before the per-lane re-check, which
    /// the race test in tests/parking.rs failed without.
    claim_skips_parked_recheck: bool,
}

#[derive(Clone)]
struct RingModel {
    bounds: Bounds,
    faults: Faults,
}

impl RingModel {
    /// The `&'static` name of a property.
    fn name(&self, name: &str) -> &'static str {
        self.properties()
            .into_iter()
            .map(|p| p.name)
            .find(|n| *n == name)
            .unwrap_or_else(|| panic!("no property {name}"))
    }

    fn new(bounds: Bounds, faults: Faults) -> Self {
        RingModel { bounds, faults }
    }

    fn rescuable(&self, state: &State, claim: &Claim) -> bool {
        // rescue() loops over every claim slot, free ones included
        !self.faults.rescue_skips_free_slots || !state.claim_ring.is(claim.slot, SlotState::Free)
    }

    /// `next_claimable` of the model's claim walk.
    fn next_claimable(&self, state: &State, shard: u8) -> Option<usize> {
        state.next_claimable(shard, self.faults.lane_gap_check)
    }

    /// `enqueue_segment` may write the shard: its try-lock of the shard's producer lock succeeds,
    /// that is, no open enqueue holds it (with `shared_shards`, always).
    fn may_write(&self, state: &State, shard: u8) -> bool {
        self.faults.shared_shards || !state.shard_held(shard)
    }
}

impl RingModel {
    /// prune_queue_slot after `LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`: persist what the slot's
    /// ledger rows prove into the lane cursor before they go.
    fn queue_prune_lock(&self, s: &mut State) {
        let Some(p) = s.queue_prune.as_mut() else {
            return;
        };
        p.phase = PrunePhase::Locked;
        let slot = usize::from(p.slot);
        // per shard (`lane_id`) with ledger rows in the slot
        for k in 0..s.shards.len() {
            if s.shards[k].ledger[slot] > 0 {
                s.shards[k].cursor_seq = s.lane_cursor(k as u8);
            }
        }
    }

    /// Re-check sealed and re-prove under the locks, then TRUNCATE and free the slot.
    fn queue_prune_finish(&self, s: &mut State) {
        let Some(Prune {
            slot,
            park,
            rows_at_proof,
            ..
        }) = s.queue_prune.take()
        else {
            return;
        };
        // the re-proof runs when parking, or when a row entered the slot since the first proof
        let reprove = park || s.slot_rows(slot) & !rows_at_proof != 0;
        let park = park && s.slot_parkable(slot);
        if !self.faults.prune_without_reproof
            && (!s.queue_ring.is(slot, SlotState::Sealed)
                || (reprove && s.queue_slot_blocked(slot) && !park))
        {
            return;
        }
        if park {
            // park_lane_rows: the rows of each pending shard above its cursor, under the shard's
            // row lock (a claim holding it makes the prune busy: claims are atomic here)
            let cursors: Vec<u8> = (0..s.shards.len() as u8)
                .map(|k| s.lane_cursor(k))
                .collect();
            for job in &mut s.jobs {
                if let Some(r) = job.ready.as_mut().filter(|r| {
                    !r.parked && !r.taken && r.slot == slot && r.pos > cursors[usize::from(r.shard)]
                }) {
                    r.parked = true;
                    r.slot = 0;
                    s.shards[usize::from(r.shard)].parked = true;
                    job.was_parked = true;
                }
            }
        }
        for job in &mut s.jobs {
            if matches!(job.ready, Some(r) if !r.parked && r.slot == slot) {
                job.ready = None;
            }
        }
        for shard in &mut s.shards {
            shard.ledger[usize::from(slot)] = 0;
        }
        s.queue_used[usize::from(slot)] = false;
        s.queue_ring.state[usize::from(slot)] = SlotState::Free;
    }

    /// prune_claim_slot under its locks: re-check, re-prove, reset cursors, TRUNCATE.
    fn claim_prune_finish(&self, s: &mut State) {
        let Some(Prune { slot, .. }) = s.claim_prune.take() else {
            return;
        };
        if !self.faults.prune_without_reproof
            && (!s.claim_ring.is(slot, SlotState::Sealed) || s.claim_slot_blocked(slot))
        {
            return;
        }
        if s.claim_slot_blocked(slot) {
            s.ghost.truncated_open_claim = true;
        }
        s.claims.retain(|c| c.slot != slot);
        s.claim_used[usize::from(slot)] = false;
        s.claim_ring.state[usize::from(slot)] = SlotState::Free;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// (job, shard)
    EnqueueBegin(u8, u8),
    EnqueueCommit(u8),
    EnqueueRollback(u8),
    ClaimBegin(u8),
    /// (worker, shard): the claim takes the shard's next visible row, if any
    ClaimCommit(u8, u8),
    ClaimAbort(u8),
    /// (shard)
    AdvanceCursor(u8),
    LockAttempt(u8, bool),
    Close(u8),
    Heartbeat(u8),
    Age(u8),
    RescueStale(u8),
    RescueDeadline(u8),
    Crash(u8),
    /// (job, shard)
    Promote(u8, u8),
    /// (shard): `unpark_lane` from a queue's resume or another claimer's first look
    Unpark(u8),
    RotateQueue,
    RotateClaim,
    QueuePruneProve(u8),
    QueuePruneLock,
    QueuePruneFinish,
    QueuePruneSkip,
    ClaimPruneProve(u8),
    ClaimPruneLock,
    ClaimPruneFinish,
    ClaimPruneSkip,
}

impl Model for RingModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        let mut init = State {
            jobs: Small::filled(Job::default(), b.jobs),
            claims: Small::default(),
            workers: Small::filled(Worker::Idle, b.workers),
            queue_ring: Ring::new(b.queue_slots),
            claim_ring: Ring::new(b.claim_slots),
            shards: Small::filled(
                Shard {
                    next_pos: 1,
                    cursor_seq: 0,
                    ledger: Small::filled(0, b.queue_slots),
                    parked: false,
                },
                b.shards,
            ),
            queue_used: Small::filled(false, b.queue_slots),
            claim_used: Small::filled(false, b.claim_slots),
            queue_prune: None,
            claim_prune: None,
            ghost: Ghost::default(),
        };
        canonical_slots(&mut init);
        vec![init]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        let queue_locked = |slot: u8| matches!(s.queue_prune, Some(p) if p.slot == slot && p.phase == PrunePhase::Locked);
        let claim_locked = |slot: u8| matches!(s.claim_prune, Some(p) if p.slot == slot && p.phase == PrunePhase::Locked);
        let any_queue_locked = matches!(s.queue_prune, Some(p) if p.phase == PrunePhase::Locked);

        // Producers. Jobs are interchangeable until enqueued, so they are enqueued in index order
        // (a job with a higher index began its enqueue later). A producer takes any shard its
        // try-lock gets; with every shard held it would create one, which the model does not do.
        for (j, job) in s.jobs.iter().enumerate() {
            let j8 = j as u8;
            match job.enqueue {
                Enqueue::NotYet => {
                    for k in 0..b.shards {
                        if self.may_write(s, k) {
                            actions.push(Action::EnqueueBegin(j8, k));
                        }
                    }
                    break;
                }
                Enqueue::InFlight { slot, .. } => {
                    // its INSERT waits while a prune holds ACCESS EXCLUSIVE on that slot
                    if !queue_locked(slot) {
                        actions.push(Action::EnqueueCommit(j8));
                    }
                    if b.rollbacks {
                        actions.push(Action::EnqueueRollback(j8));
                    }
                }
                Enqueue::Committed | Enqueue::RolledBack => {}
            }
        }

        // Workers. Identical worker states have identical futures: offer each once.
        let mut seen: Vec<Worker> = Vec::new();
        for (w, worker) in s.workers.iter().enumerate() {
            if seen.contains(worker) {
                continue;
            }
            seen.push(*worker);
            let w8 = w as u8;
            match *worker {
                Worker::Idle => actions.push(Action::ClaimBegin(w8)),
                Worker::Claiming { slot } => {
                    // claim() reads every ready_entries child through the parent (generic plan):
                    // it waits for any queue prune holding ACCESS EXCLUSIVE, and its claim-batch
                    // INSERT waits for a claim prune of its slot. It locks shards SKIP LOCKED in
                    // an order of its own, so it may take its job from any shard with one. With
                    // none, it only catches up the sequence of a shard it locked. (A claim that
                    // comes back empty although a shard has work, because another claimer holds
                    // that shard, is `AdvanceCursor` + `ClaimAbort`: the same states.)
                    if !any_queue_locked && !claim_locked(slot) {
                        let with_work =
                            (0..b.shards).filter(|&k| self.next_claimable(s, k).is_some());
                        let before = actions.len();
                        actions.extend(with_work.map(|k| Action::ClaimCommit(w8, k)));
                        if actions.len() == before {
                            actions.extend((0..b.shards).map(|k| Action::ClaimCommit(w8, k)));
                        }
                    }
                    actions.push(Action::ClaimAbort(w8));
                    actions.push(Action::Crash(w8));
                }
                Worker::Running(att) => {
                    // the handler's result (success / retry) reaches the flush, which takes the
                    // per-attempt lock (blocking: enabled once it is free)
                    if self.faults.complete_without_lock || s.lock_free(att.job) {
                        actions.push(Action::LockAttempt(w8, true));
                        actions.push(Action::LockAttempt(w8, false));
                    }
                    let beat = s.open_claim(att).is_some_and(|i| !s.claims[i].heartbeat);
                    if self.bounds.heartbeats && beat && s.lock_free(att.job) {
                        actions.push(Action::Heartbeat(w8));
                    }
                    actions.push(Action::Crash(w8));
                }
                Worker::Closing(..) => {
                    actions.push(Action::Close(w8));
                    actions.push(Action::Crash(w8));
                }
            }
        }
        // the post-commit cursor advance, whenever a shard's ledger is ahead of its sequence;
        // "lost" is this action never running (the code never runs it: claim() catches up lazily)
        for k in 0..b.shards {
            if s.lane_cursor(k) > s.shards[usize::from(k)].cursor_seq {
                actions.push(Action::AdvanceCursor(k));
            }
        }

        // Time, and the rescue sweeps.
        for (i, c) in s.claims.iter().enumerate() {
            if c.closed {
                continue;
            }
            let i8 = i as u8;
            if c.heartbeat {
                actions.push(Action::Age(i8));
            }
            // pg_try_advisory_xact_lock: a held lock makes the sweep stop, not wait
            if self.rescuable(s, c) && s.lock_free(c.job) {
                if !c.heartbeat {
                    actions.push(Action::RescueStale(i8));
                }
                if b.deadlines {
                    actions.push(Action::RescueDeadline(i8));
                }
            }
        }

        // Maintenance.
        for (j, job) in s.jobs.iter().enumerate() {
            if job.deferred.is_some() {
                // promote_due writes through enqueue_segment: a shard its try-lock gets
                for k in 0..b.shards {
                    if self.may_write(s, k) {
                        actions.push(Action::Promote(j as u8, k));
                    }
                }
            }
        }
        if b.parking {
            for k in 0..b.shards {
                if s.shards[usize::from(k)].parked {
                    actions.push(Action::Unpark(k));
                }
            }
        }
        match s.queue_prune {
            None => {
                // rotate_queue_ring: an unused current slot gains nothing from rotation
                let cur = usize::from(s.queue_ring.current());
                if s.queue_used[cur] && s.queue_ring.oldest_free().is_some() {
                    actions.push(Action::RotateQueue);
                }
                for slot in 0..b.queue_slots {
                    if s.queue_ring.is(slot, SlotState::Sealed)
                        && (!s.queue_slot_blocked(slot) || (b.parking && s.slot_parkable(slot)))
                    {
                        actions.push(Action::QueuePruneProve(slot));
                    }
                }
            }
            Some(p) => {
                match p.phase {
                    PrunePhase::Proved => actions.push(Action::QueuePruneLock),
                    PrunePhase::Locked => actions.push(Action::QueuePruneFinish),
                }
                actions.push(Action::QueuePruneSkip);
            }
        }
        match s.claim_prune {
            None => {
                let cur = s.claim_ring.current();
                // rotate_claim_ring: only a current slot that holds claims is rotated
                if s.claim_used[usize::from(cur)] && s.claim_ring.oldest_free().is_some() {
                    actions.push(Action::RotateClaim);
                }
                for slot in 0..b.claim_slots {
                    if s.claim_ring.is(slot, SlotState::Sealed) && !s.claim_slot_blocked(slot) {
                        actions.push(Action::ClaimPruneProve(slot));
                    }
                }
            }
            Some(p) => {
                match p.phase {
                    PrunePhase::Proved => actions.push(Action::ClaimPruneLock),
                    PrunePhase::Locked => actions.push(Action::ClaimPruneFinish),
                }
                actions.push(Action::ClaimPruneSkip);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let b = &self.bounds;
        let f = &self.faults;
        let mut s = *last;
        match action {
            Action::EnqueueBegin(j, k) => {
                // enqueue_segment: pg_try_advisory_xact_lock on the shard (held until the
                // transaction ends), nextval(segment_seq), then the current slot, read unlocked
                let shard = &mut s.shards[usize::from(k)];
                s.jobs[usize::from(j)].enqueue = Enqueue::InFlight {
                    slot: s.queue_ring.current(),
                    shard: k,
                    pos: shard.next_pos,
                };
                shard.next_pos += 1;
            }
            Action::EnqueueCommit(j) => {
                // the rows become visible, then the shard's producer lock is released
                let job = &mut s.jobs[usize::from(j)];
                let Enqueue::InFlight { slot, shard, pos } = job.enqueue else {
                    return None;
                };
                job.enqueue = Enqueue::Committed;
                s.queue_used[usize::from(slot)] = true;
                job.ready = Some(Row {
                    slot,
                    shard,
                    pos,
                    lease: 0,
                    taken: false,
                    parked: false,
                });
            }
            Action::EnqueueRollback(j) => s.jobs[usize::from(j)].enqueue = Enqueue::RolledBack,
            Action::ClaimBegin(w) => {
                s.workers[usize::from(w)] = Worker::Claiming {
                    slot: s.claim_ring.current(),
                };
                // the first look: a parked lane of the queue is unparked (unpark_queue)
                for k in 0..s.shards.len() as u8 {
                    s.unpark(k);
                }
            }
            Action::ClaimCommit(w, k) => {
                let Worker::Claiming { slot } = s.workers[usize::from(w)] else {
                    return None;
                };
                // the shard's lock, tried (lock_lane), then, in a statement that starts after the
                // lock, the cursor and the shard's parked_lanes row: parked rows come back first
                if !f.claim_skips_parked_recheck {
                    s.unpark(k);
                }
                // the lazy advance: setval(cursor_seq, lane_cursor()) under the shard's lock
                s.shards[usize::from(k)].cursor_seq = s.lane_cursor(k);
                s.workers[usize::from(w)] = Worker::Idle;
                if let Some(j) = self.next_claimable(&s, k) {
                    let job = &mut s.jobs[j];
                    let row = job.ready.as_mut().expect("claimable row");
                    let taken = *row;
                    // its position is behind the cursor from now on and read by nothing
                    row.taken = true;
                    row.shard = 0;
                    row.pos = 0;
                    let row = taken;
                    let lease = row.lease + 1;
                    job.lease = job.lease.max(lease);
                    // the shard's ready_claim_attempt_batches row in the ready row's slot ...
                    let ledger = &mut s.shards[usize::from(k)].ledger[usize::from(row.slot)];
                    *ledger = (*ledger).max(row.pos);
                    // ... and the claim in the slot read at the start, whatever it is now
                    s.claims.push(Claim {
                        slot,
                        job: j as u8,
                        lease,
                        ready_slot: row.slot,
                        closed: false,
                        heartbeat: false,
                    });
                    s.queue_used[usize::from(row.slot)] = true;
                    s.claim_used[usize::from(slot)] = true;
                    s.workers[usize::from(w)] = Worker::Running(Att {
                        job: j as u8,
                        lease,
                        slot,
                    });
                }
            }
            Action::ClaimAbort(w) => {
                if f.cursor_before_commit {
                    // the non-transactional setval of the first shard with a claimable row to
                    // the claim's new position survives the rollback
                    let found =
                        (0..b.shards).find_map(|k| self.next_claimable(&s, k).map(|j| (k, j)));
                    if let Some((k, j)) = found {
                        let pos = s.jobs[j].ready.expect("claimable row").pos;
                        let shard = &mut s.shards[usize::from(k)];
                        shard.cursor_seq = shard.cursor_seq.max(pos);
                    }
                }
                s.workers[usize::from(w)] = Worker::Idle;
            }
            Action::AdvanceCursor(k) => s.shards[usize::from(k)].cursor_seq = s.lane_cursor(k),
            Action::LockAttempt(w, ok) => {
                let Worker::Running(att) = s.workers[usize::from(w)] else {
                    return None;
                };
                if f.complete_without_lock {
                    // the check half of check-then-act: validate the claim open, no lock
                    let valid = s
                        .open_claim(att)
                        .is_some_and(|i| ok || s.ready_row_of(&s.claims[i]));
                    s.workers[usize::from(w)] = if valid {
                        Worker::Closing(att, ok)
                    } else {
                        Worker::Idle // Outcome::Stale
                    };
                } else {
                    s.jobs[usize::from(att.job)].locked = true;
                    s.workers[usize::from(w)] = Worker::Closing(att, ok);
                }
            }
            Action::Close(w) => {
                let Worker::Closing(att, ok) = s.workers[usize::from(w)] else {
                    return None;
                };
                s.workers[usize::from(w)] = Worker::Idle;
                if f.complete_without_lock {
                    // the act half: append the closure on the strength of the earlier check
                    let Some(i) = s.claims.iter().position(|c| {
                        c.slot == att.slot && c.job == att.job && c.lease == att.lease
                    }) else {
                        return Some(s);
                    };
                    if s.claims[i].closed && !f.no_closure_constraint {
                        // exclusion / unique violation: the whole statement fails, nothing
                        // changes; the batcher's retry re-validates and reports Stale
                        return Some(s);
                    }
                    if s.claims[i].closed || att.lease < s.jobs[usize::from(att.job)].lease {
                        s.ghost.stale_write = true;
                    }
                    s.close(i, ok, b.max_attempts, f.complete_without_lock);
                } else {
                    s.jobs[usize::from(att.job)].locked = false;
                    // under the lock, in a fresh snapshot: still open? (and, for a non-success
                    // close, its ready row is there to join)
                    if let Some(i) = s.open_claim(att) {
                        if ok || s.ready_row_of(&s.claims[i]) {
                            if att.lease < s.jobs[usize::from(att.job)].lease {
                                s.ghost.stale_write = true;
                            }
                            s.close(i, ok, b.max_attempts, f.complete_without_lock);
                        }
                    }
                }
            }
            Action::Heartbeat(w) => {
                let Worker::Running(att) = s.workers[usize::from(w)] else {
                    return None;
                };
                // heartbeat_batch: lock, still open?, upsert attempt_state
                let i = s.open_claim(att)?;
                if att.lease < s.jobs[usize::from(att.job)].lease {
                    s.ghost.stale_write = true;
                }
                s.claims[i].heartbeat = true;
            }
            // stale_after passes without another heartbeat
            Action::Age(i) => s.claims[usize::from(i)].heartbeat = false,
            Action::RescueStale(i) | Action::RescueDeadline(i) => {
                // rescue_close -> close_batch: re-validated under the lock in a fresh snapshot
                let i = usize::from(i);
                let c = s.claims[i];
                if c.closed || !s.ready_row_of(&c) {
                    return None;
                }
                // rescue_retry_at is NULL when attempts are exhausted: the job fails
                s.close(i, false, b.max_attempts, f.complete_without_lock);
            }
            Action::Crash(w) => {
                if let Worker::Closing(att, _) = s.workers[usize::from(w)] {
                    if !f.complete_without_lock {
                        // the transaction dies and its xact lock with it
                        s.jobs[usize::from(att.job)].locked = false;
                    }
                }
                s.workers[usize::from(w)] = Worker::Idle;
            }
            Action::Promote(j, k) => {
                // promote_due: delete from deferred_jobs, enqueue_segment into a shard it can
                // lock, append at that shard's next position; one transaction
                let slot = s.queue_ring.current();
                let pos = s.shards[usize::from(k)].next_pos;
                let job = &mut s.jobs[usize::from(j)];
                let lease = job.deferred.take()?;
                job.ready = Some(Row {
                    slot,
                    shard: k,
                    pos,
                    lease,
                    taken: false,
                    parked: false,
                });
                s.queue_used[usize::from(slot)] = true;
                s.shards[usize::from(k)].next_pos += 1;
            }
            Action::RotateQueue => {
                let next = s.queue_ring.oldest_free()?;
                s.queue_ring.rotate_to(next);
            }
            Action::RotateClaim => {
                let next = s.claim_ring.oldest_free()?;
                s.claim_ring.rotate_to(next);
            }
            Action::Unpark(k) => s.unpark(k),
            Action::QueuePruneProve(slot) => {
                s.queue_prune = Some(Prune {
                    slot,
                    phase: PrunePhase::Proved,
                    park: s.queue_slot_blocked(slot),
                    rows_at_proof: s.slot_rows(slot),
                });
                // Only a transaction that read the slot as current before it was sealed can
                // still write into it. With none in flight, nothing another action does can make
                // the proof false, and the prune's steps commute with everything else: they are
                // taken as one step (a sound partial-order reduction).
                let writer = s
                    .jobs
                    .iter()
                    .any(|j| matches!(j.enqueue, Enqueue::InFlight { slot: t, .. } if t == slot));
                if !writer {
                    self.queue_prune_lock(&mut s);
                    self.queue_prune_finish(&mut s);
                }
            }
            Action::QueuePruneLock => self.queue_prune_lock(&mut s),
            Action::QueuePruneFinish => self.queue_prune_finish(&mut s),
            Action::QueuePruneSkip => s.queue_prune = None,
            Action::ClaimPruneProve(slot) => {
                s.claim_prune = Some(Prune {
                    slot,
                    phase: PrunePhase::Proved,
                    park: false,
                    rows_at_proof: 0,
                });
                let writer = s.workers.contains(&Worker::Claiming { slot });
                if !writer {
                    self.claim_prune_finish(&mut s);
                }
            }
            Action::ClaimPruneLock => s.claim_prune.as_mut()?.phase = PrunePhase::Locked,
            Action::ClaimPruneFinish => self.claim_prune_finish(&mut s),
            Action::ClaimPruneSkip => s.claim_prune = None,
        }
        // canonical form: ledger rows at or behind the shard's sequence prove nothing it does not
        for shard in &mut s.shards {
            let seq = shard.cursor_seq;
            for l in &mut shard.ledger {
                if *l <= seq {
                    *l = 0;
                }
            }
        }
        canonical_slots(&mut s);
        if !f.complete_without_lock {
            canonical_history(&mut s);
        }
        s.claims.sort();
        s.workers.sort();
        canonical_positions(&mut s);
        canonical_shards(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("NoLostJob", |_, s: &State| no_lost_job(s)),
            Property::always("NoTruncateOfOpenClaim", |_, s: &State| {
                !s.ghost.truncated_open_claim
                    && s.claims.iter().all(|c| c.closed || s.ready_row_of(c))
            }),
            Property::always("StaleWriterRejected", |_, s: &State| !s.ghost.stale_write),
            Property::always("CursorNeverSkipsRunnable", |_, s: &State| {
                s.jobs.iter().all(|j| {
                    let row_ok = j.ready.is_none_or(|r| r.taken || s.pending(&r));
                    let in_flight_ok = !matches!(j.enqueue,
                        Enqueue::InFlight { shard, pos, .. } if pos <= s.lane_cursor(shard));
                    row_ok && in_flight_ok
                })
            }),
            Property::always("AtMostOneWinner", |_, s: &State| !s.ghost.second_winner),
            Property::always("OneOpenAttemptPerJob", |_, s: &State| {
                (0..s.jobs.len()).all(|j| {
                    s.claims
                        .iter()
                        .filter(|c| !c.closed && usize::from(c.job) == j)
                        .count()
                        <= 1
                })
            }),
            // reachability checks, so the invariants are not vacuous
            Property::sometimes("AllJobsFinished", |_, s: &State| {
                s.jobs.iter().all(|j| j.terminal)
            }),
            Property::sometimes("SecondAttemptRuns", |_, s: &State| {
                s.workers
                    .iter()
                    .any(|w| matches!(w, Worker::Running(a) if a.lease == 2))
            }),
            // a free slot with a generation above the never-used ones was current once: pruned
            Property::sometimes("ClaimSlotPruned", |_, s: &State| {
                (0..s.claim_ring.state.len()).any(|i| {
                    s.claim_ring.state[i] == SlotState::Free && s.claim_ring.generation[i] > 0
                })
            }),
            Property::sometimes("ClaimCommittedIntoFreeSlot", |_, s: &State| {
                s.claims
                    .iter()
                    .any(|c| !c.closed && s.claim_ring.is(c.slot, SlotState::Free))
            }),
            // a parked job comes back and runs to the end (only with Bounds::parking)
            Property::sometimes("ParkedJobFinished", |_, s: &State| {
                s.jobs.iter().any(|j| j.was_parked && j.terminal)
            }),
            Property::sometimes("ReadyRowInFreeSlot", |_, s: &State| {
                s.jobs.iter().any(|j| {
                    matches!(j.ready, Some(r) if !r.taken && !r.parked
                             && s.queue_ring.is(r.slot, SlotState::Free))
                })
            }),
            // a job whose enqueue began after another's, and committed while that one is still
            // open, has been claimed: the open transaction held back only its own shard
            Property::sometimes("ClaimPastOpenEnqueue", |_, s: &State| {
                s.jobs.iter().enumerate().any(|(j, open)| {
                    matches!(open.enqueue, Enqueue::InFlight { .. })
                        && s.jobs[j + 1..]
                            .iter()
                            .any(|later| later.lease > 0 || later.terminal)
                })
            }),
        ]
    }
}

/// Slot numbers are labels: what the code does with a slot depends on its state, its generation
/// order and its contents, never on its number (`ORDER BY generation, slot` only breaks ties
/// between never-used free slots, which are all empty and alike). So both rings are relabelled
/// in generation order — the current slot always gets the highest number — and states that
/// differ only by a renaming of slots become one (symmetry reduction). Slot numbers in printed
/// traces are these labels.
fn canonical_slots(s: &mut State) {
    /// The new label of each old slot.
    fn order(ring: &Ring) -> [u8; MAX_SLOTS] {
        let n = ring.state.len();
        let mut old = [0_usize, 1, 2];
        old[..n].sort_by_key(|&i| (ring.generation[i], i));
        let mut label = [0_u8; MAX_SLOTS];
        for (new, &o) in old[..n].iter().enumerate() {
            label[o] = new as u8;
        }
        label
    }
    fn permute<T: Copy + Default>(v: &mut Small<T, MAX_SLOTS>, label: &[u8; MAX_SLOTS]) {
        let before = *v;
        for (o, x) in before.iter().enumerate() {
            v[usize::from(label[o])] = *x;
        }
    }
    let q = order(&s.queue_ring);
    let c = order(&s.claim_ring);
    let ql = |slot: u8| q[usize::from(slot)];
    let cl = |slot: u8| c[usize::from(slot)];
    permute(&mut s.queue_ring.state, &q);
    permute(&mut s.queue_ring.generation, &q);
    for shard in &mut s.shards {
        permute(&mut shard.ledger, &q);
    }
    permute(&mut s.queue_used, &q);
    permute(&mut s.claim_ring.state, &c);
    permute(&mut s.claim_ring.generation, &c);
    permute(&mut s.claim_used, &c);
    for job in &mut s.jobs {
        if let Some(r) = job.ready.as_mut().filter(|r| !r.parked) {
            r.slot = ql(r.slot);
        }
        if let Enqueue::InFlight { slot, .. } = &mut job.enqueue {
            *slot = ql(*slot);
        }
    }
    for claim in &mut s.claims {
        claim.slot = cl(claim.slot);
        claim.ready_slot = ql(claim.ready_slot);
    }
    for w in &mut s.workers {
        match w {
            Worker::Claiming { slot } => *slot = cl(*slot),
            Worker::Running(a) | Worker::Closing(a, _) => a.slot = cl(a.slot),
            Worker::Idle => {}
        }
    }
    if let Some(p) = s.queue_prune.as_mut() {
        p.slot = ql(p.slot);
    }
    if let Some(p) = s.claim_prune.as_mut() {
        p.slot = cl(p.slot);
    }
}

/// Positions are compared, never counted: every step reads them only by their order (against one
/// another and the shard's cursor), a ledger value only by that and by being 0 (none), and a new
/// position is the shard's next one, above all. So each shard's positions are renumbered densely
/// in order (the least to 0, the next position to one above the greatest), and states that differ
/// only in how far apart positions are become one. Ledger values at or below the sequence are
/// zeroed first, so a nonzero one stays nonzero.
fn canonical_positions(s: &mut State) {
    for k in 0..s.shards.len() {
        let k8 = k as u8;
        let mut used = [false; 256];
        let shard = &s.shards[k];
        used[usize::from(shard.cursor_seq)] = true;
        for &l in &shard.ledger {
            if l > 0 {
                used[usize::from(l)] = true;
            }
        }
        for job in &s.jobs {
            if let Some(r) = job.ready.filter(|r| !r.taken && r.shard == k8) {
                used[usize::from(r.pos)] = true;
            }
            if let Enqueue::InFlight { shard, pos, .. } = job.enqueue {
                if shard == k8 {
                    used[usize::from(pos)] = true;
                }
            }
        }
        let mut rank = [0_u8; 256];
        let mut next = 0_u8;
        for v in 0..usize::from(shard.next_pos) {
            if used[v] {
                rank[v] = next;
                next += 1;
            }
        }
        let shard = &mut s.shards[k];
        shard.next_pos = next;
        shard.cursor_seq = rank[usize::from(shard.cursor_seq)];
        for l in &mut shard.ledger {
            if *l > 0 {
                *l = rank[usize::from(*l)];
            }
        }
        for job in &mut s.jobs {
            if let Some(r) = job.ready.as_mut().filter(|r| !r.taken && r.shard == k8) {
                r.pos = rank[usize::from(r.pos)];
            }
            if let Enqueue::InFlight { shard, pos, .. } = &mut job.enqueue {
                if *shard == k8 {
                    *pos = rank[usize::from(*pos)];
                }
            }
        }
    }
}

/// Shard numbers are labels too: what the code does with a shard depends on its sequences, its
/// ledger and its rows, never on its number (a producer's and a claimer's choice of shard are
/// nondeterministic here). So of the states that differ only by a renaming of shards, the least
/// (in the derived order) is kept. Run after the other canonical steps, none of which looks at
/// shard numbers.
fn canonical_shards(s: &mut State) {
    fn relabel(s: &State, label: &[u8]) -> State {
        let mut t = *s;
        for (old, shard) in s.shards.iter().enumerate() {
            t.shards[usize::from(label[old])] = *shard;
        }
        for job in &mut t.jobs {
            if let Some(r) = job.ready.as_mut().filter(|r| !r.taken) {
                r.shard = label[usize::from(r.shard)];
            }
            if let Enqueue::InFlight { shard, .. } = &mut job.enqueue {
                *shard = label[usize::from(*shard)];
            }
        }
        t
    }
    const PERMUTATIONS: [[u8; MAX_SHARDS]; 1] = [[1, 0]];
    if s.shards.len() < 2 {
        return;
    }
    for label in PERMUTATIONS {
        let t = relabel(s, &label);
        if t < *s {
            *s = t;
        }
    }
}

/// Forget what no future step can read, so states that differ only in it are one state. Sound
/// while run leases only grow (a closed attempt is never claimed again), i.e. for every variant
/// but the lock-free completion one, whose second closures need the old identities.
fn canonical_history(s: &mut State) {
    // A worker whose attempt is closed can only take and drop its job's lock and be told Stale:
    // which attempt it names no longer matters.
    for w in 0..s.workers.len() {
        let (att, ok) = match s.workers[w] {
            Worker::Running(att) => (att, None),
            Worker::Closing(att, ok) => (att, Some(ok)),
            _ => continue,
        };
        if s.open_claim(att).is_some() {
            continue;
        }
        let stale = Att {
            job: att.job,
            lease: 0,
            slot: 0,
        };
        s.workers[w] = match ok {
            None => Worker::Running(stale),
            Some(_) => Worker::Closing(stale, true),
        };
    }
    // A finished job's last lease is read by nothing.
    for j in 0..s.jobs.len() {
        if s.jobs[j].terminal && !s.claims.iter().any(|c| usize::from(c.job) == j) {
            s.jobs[j].lease = 0;
        }
    }
}

/// Every enqueued job is somewhere the system will find it: pending in ready ahead of its shard's
/// cursor, claimed with an open claim still in the claim ring, deferred, or finished.
fn no_lost_job(s: &State) -> bool {
    s.jobs.iter().enumerate().all(|(j, job)| {
        job.enqueue != Enqueue::Committed
            || job.terminal
            || job.deferred.is_some()
            || s.claims
                .iter()
                .any(|c| usize::from(c.job) == j && !c.closed)
            || matches!(job.ready, Some(r) if s.pending(&r))
    })
}

// ------------------------------------------------------------------------------------------------
// Running the checker
// ------------------------------------------------------------------------------------------------

const SAFETY: [&str; 6] = [
    "NoLostJob",
    "NoTruncateOfOpenClaim",
    "StaleWriterRejected",
    "CursorNeverSkipsRunnable",
    "AtMostOneWinner",
    "OneOpenAttemptPerJob",
];

const REACHABLE: [&str; 6] = [
    "AllJobsFinished",
    "SecondAttemptRuns",
    "ClaimSlotPruned",
    "ClaimCommittedIntoFreeSlot",
    "ReadyRowInFreeSlot",
    "ClaimPastOpenEnqueue",
];

struct Run {
    model: RingModel,
    states: usize,
    discoveries: HashMap<&'static str, Vec<Action>>,
}

impl Run {
    /// The discovery's trace, cut at the first state that breaks the property. (The BFS checker
    /// keeps overwriting a discovery with later violating states of the same block, so the
    /// path it reports can run on past the violation.)
    fn trace(&self, name: &str) -> Option<Vec<Action>> {
        let actions = self.discoveries.get(name)?;
        let property = self.model.property(self.model.name(name));
        let mut state = self.model.init_states().remove(0);
        let mut trace = Vec::new();
        for a in actions {
            if !(property.condition)(&self.model, &state) {
                break;
            }
            trace.push(*a);
            state = self.model.next_state(&state, *a).unwrap_or(state);
        }
        Some(trace)
    }
}

/// Whether to check every model at its full bounds (`RINGWORK_MODEL_FULL=1`; `.ci/run` runs this
/// file so as a step of its own). Without it, the default `cargo test` checks the slowest models at
/// smaller bounds (one worker fewer, or fewer steps): the same properties over a state space that
/// takes seconds, not a minute and a half.
fn full_bounds() -> bool {
    std::env::var_os("RINGWORK_MODEL_FULL").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `full` under `RINGWORK_MODEL_FULL`, else `small`.
fn scaled<T>(full: T, small: T) -> T {
    if full_bounds() {
        full
    } else {
        small
    }
}

/// Breadth-first over every state reachable in fewer than `depth` steps (0 = no bound: the
/// whole state space), or until every property named in `stop_at` has a discovery.
fn check(label: &str, model: RingModel, depth: usize, stop_at: &[&'static str]) -> Run {
    let started = Instant::now();
    let mut builder = model.clone().checker();
    if depth > 0 {
        builder = builder.target_max_depth(depth);
    }
    if !stop_at.is_empty() {
        builder = builder.finish_when(HasDiscoveries::AllOf(stop_at.iter().copied().collect()));
    }
    let checker = builder.spawn_bfs().join();
    let run = Run {
        model,
        states: checker.unique_state_count(),
        discoveries: checker
            .discoveries()
            .into_iter()
            .map(|(name, path)| (name, path.into_actions()))
            .collect(),
    };
    println!(
        "{label}: {} unique states explored (max depth {}) in {:.2?}",
        run.states,
        checker.max_depth(),
        started.elapsed()
    );
    run
}

/// One line per state: claim ring, claims, queue ring, cursor, jobs, workers.
fn summary(s: &State) -> String {
    let ring = |r: &Ring| -> String {
        r.state
            .iter()
            .map(|st| match st {
                SlotState::Free => 'F',
                SlotState::Current => 'C',
                SlotState::Sealed => 'S',
            })
            .collect()
    };
    let claims: Vec<String> = s
        .claims
        .iter()
        .map(|c| {
            let open = if c.closed { "closed" } else { "open" };
            format!("j{}/l{}@c{} {open}", c.job, c.lease, c.slot)
        })
        .collect();
    let jobs: Vec<String> = s
        .jobs
        .iter()
        .enumerate()
        .map(|(j, job)| {
            let mut parts = Vec::new();
            match job.enqueue {
                Enqueue::NotYet => parts.push("-".to_string()),
                Enqueue::InFlight { slot, shard, pos } => {
                    parts.push(format!("enq@q{slot}s{shard}p{pos}"))
                }
                Enqueue::RolledBack => parts.push("rolled back".to_string()),
                Enqueue::Committed => {}
            }
            if let Some(r) = job.ready {
                if r.taken {
                    parts.push(format!("row@q{} taken", r.slot));
                } else if r.parked {
                    parts.push(format!("parked s{}p{}", r.shard, r.pos));
                } else {
                    parts.push(format!("row@q{}s{}p{}", r.slot, r.shard, r.pos));
                }
            }
            if job.deferred.is_some() {
                parts.push("deferred".to_string());
            }
            if job.terminal {
                parts.push("done".to_string());
            }
            format!("j{j}:{}", parts.join(","))
        })
        .collect();
    let workers: Vec<String> = s
        .workers
        .iter()
        .map(|w| match w {
            Worker::Idle => "idle".to_string(),
            Worker::Claiming { slot } => format!("claiming@c{slot}"),
            // lease 0: the attempt is closed and its identity forgotten (canonical_history)
            Worker::Running(a) if a.lease == 0 => format!("running stale j{}", a.job),
            Worker::Closing(a, _) if a.lease == 0 => format!("closing stale j{}", a.job),
            Worker::Running(a) => format!("running j{}/l{}@c{}", a.job, a.lease, a.slot),
            Worker::Closing(a, ok) => {
                format!("closing j{}/l{}@c{} ok={ok}", a.job, a.lease, a.slot)
            }
        })
        .collect();
    let cursors: Vec<String> = (0..s.shards.len())
        .map(|k| format!("s{k}:{}", s.lane_cursor(k as u8)))
        .collect();
    format!(
        "claim ring {} {:?} | queue ring {} cursors {} | {} | {}",
        ring(&s.claim_ring),
        claims,
        ring(&s.queue_ring),
        cursors.join(" "),
        jobs.join(" "),
        workers.join(", ")
    )
}

fn print_trace(model: &RingModel, name: &str, actions: &[Action]) {
    println!("counterexample for {name} ({} steps):", actions.len());
    let mut state = model.init_states().remove(0);
    println!("      {}", summary(&state));
    for (n, a) in actions.iter().enumerate() {
        state = model.next_state(&state, *a).unwrap_or(state);
        println!("  {:>2}. {a:?}\n      {}", n + 1, summary(&state));
    }
}

/// A shortest path to a state that breaks the property (BFS of our own: the checker's
/// discovery proves one exists, this finds the clearest one to print).
fn shortest_counterexample(model: &RingModel, name: &str) -> Option<Vec<Action>> {
    let property = model.property(model.name(name));
    let init = model.init_states().remove(0);
    let mut parent: HashMap<State, Option<(State, Action)>> = HashMap::from([(init, None)]);
    let mut queue = VecDeque::from([init]);
    let mut actions = Vec::new();
    while let Some(state) = queue.pop_front() {
        if !(property.condition)(model, &state) {
            let mut path = Vec::new();
            let mut at = state;
            while let Some(Some((p, a))) = parent.get(&at) {
                path.push(*a);
                at = *p;
            }
            path.reverse();
            return Some(path);
        }
        model.actions(&state, &mut actions);
        for a in actions.drain(..) {
            if let Some(next) = model.next_state(&state, a) {
                if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(next) {
                    e.insert(Some((state, a)));
                    queue.push_back(next);
                }
            }
        }
    }
    None
}

fn assert_safe(run: &Run) {
    assert!(run.states > 1);
    for name in SAFETY {
        if let Some(trace) = run.trace(name) {
            print_trace(&run.model, name, &trace);
            panic!("{name} violated");
        }
    }
}

/// Every reachability check but those named is reached.
fn assert_reached(run: &Run, except: &[&str]) {
    for name in REACHABLE.iter().filter(|n| !except.contains(n)) {
        assert!(run.discoveries.contains_key(name), "{name} is unreachable");
    }
}

fn assert_counterexample(run: &Run, name: &str) {
    assert!(
        run.discoveries.contains_key(name),
        "the checker found no counterexample for {name}"
    );
    let trace = shortest_counterexample(&run.model, name).expect("a violating state is reachable");
    print_trace(&run.model, name, &trace);
}

/// The code as it is, its whole state space at the main bounds over two shards, with two claim
/// slots instead of three to keep the run time (the next test runs the three-slot claim ring with
/// one shard). With two slots a pruned claim slot looks never used, so `ClaimSlotPruned` is left
/// to that test.
#[test]
fn ring_protocol_holds_exhaustively() {
    let workers = scaled(2, 1);
    let bounds = Bounds {
        claim_slots: 2,
        workers,
        ..Bounds::main()
    };
    let run = check(
        &format!("code as is, 2 jobs x {workers} workers, 2 shards, 2 claim slots"),
        RingModel::new(bounds, Faults::default()),
        0,
        &[],
    );
    assert_safe(&run);
    assert_reached(&run, &["ClaimSlotPruned"]);
}

/// The main bounds with their three claim slots and one shard. With one shard a producer waits
/// while another's enqueue is open (the model creates no shards), so no claim passes an open
/// enqueue here.
#[test]
fn ring_protocol_holds_with_three_claim_slots_and_one_shard() {
    let workers = scaled(2, 1);
    let bounds = Bounds {
        shards: 1,
        workers,
        ..Bounds::main()
    };
    let run = check(
        &format!("code as is, 2 jobs x {workers} workers, 1 shard, 3 claim slots"),
        RingModel::new(bounds, Faults::default()),
        0,
        &[],
    );
    assert_safe(&run);
    assert_reached(&run, &["ClaimPastOpenEnqueue"]);
}

/// Heartbeats on (the attempt_state freshness bit doubles the state space, so one worker). The bit
/// lives in the claim plane, which shards do not touch: one shard.
#[test]
fn ring_protocol_holds_with_heartbeats() {
    let bounds = Bounds {
        workers: 1,
        heartbeats: true,
        shards: 1,
        ..Bounds::main()
    };
    let run = check(
        "code as is, heartbeats, 2 jobs x 1 worker",
        RingModel::new(bounds, Faults::default()),
        0,
        &[],
    );
    assert_safe(&run);
}

/// Three jobs over two shards, so every shard can be held by an open enqueue while a third
/// producer waits: every state reachable in at most 18 actions (the checker's depth counts the
/// initial state as 1 and does not expand depth 20). One worker, to keep the run time.
#[test]
fn ring_protocol_holds_for_three_jobs_within_18_steps() {
    let bounds = Bounds {
        jobs: 3,
        workers: 1,
        ..Bounds::main()
    };
    let steps = scaled(18, 14);
    let run = check(
        &format!("code as is, 3 jobs x 1 worker, 2 shards, up to {steps} steps"),
        RingModel::new(bounds, Faults::default()),
        steps + 2,
        &[],
    );
    assert_safe(&run);
}

#[test]
fn broken_prune_without_after_lock_reproof_is_caught() {
    let faults = Faults {
        prune_without_reproof: true,
        ..Faults::default()
    };
    let run = check(
        "prune without after-lock re-proof",
        RingModel::new(Bounds::main(), faults),
        0,
        &["NoTruncateOfOpenClaim", "NoLostJob"],
    );
    assert_counterexample(&run, "NoTruncateOfOpenClaim");
    assert_counterexample(&run, "NoLostJob");
}

#[test]
fn broken_completion_without_attempt_lock_is_caught() {
    let faults = Faults {
        complete_without_lock: true,
        no_closure_constraint: true,
        ..Faults::default()
    };
    let run = check(
        "completion without the per-attempt lock",
        RingModel::new(Bounds::main(), faults),
        0,
        &["AtMostOneWinner", "StaleWriterRejected"],
    );
    assert_counterexample(&run, "AtMostOneWinner");
    assert_counterexample(&run, "StaleWriterRejected");
}

/// Without the lock, the closure tables' per-slot exclusion / unique constraints still turn the
/// losing write of the race into a failed statement: defence in depth (the failed statement takes
/// the rest of its batch down with it until the retry re-validates).
#[test]
fn completion_without_attempt_lock_is_still_held_by_closure_constraints() {
    let faults = Faults {
        complete_without_lock: true,
        ..Faults::default()
    };
    // the race is a worker against a rescue; a second worker adds the re-claim at a newer lease.
    // It is all in the claim plane, which shards do not touch: one shard.
    for (jobs, workers) in scaled(vec![(2, 1), (1, 2)], vec![(1, 2)]) {
        let bounds = Bounds {
            jobs,
            workers,
            shards: 1,
            ..Bounds::main()
        };
        let run = check(
            &format!(
                "completion without the lock, constraints kept, {jobs} jobs x {workers} workers"
            ),
            RingModel::new(bounds, faults.clone()),
            0,
            &[],
        );
        assert_safe(&run);
    }
}

#[test]
fn broken_cursor_advanced_before_commit_is_caught() {
    let faults = Faults {
        cursor_before_commit: true,
        ..Faults::default()
    };
    let run = check(
        "cursor advanced before commit",
        RingModel::new(Bounds::main(), faults),
        0,
        &["CursorNeverSkipsRunnable", "NoLostJob"],
    );
    assert_counterexample(&run, "CursorNeverSkipsRunnable");
    assert_counterexample(&run, "NoLostJob");
}

/// Producers that do not take the shard's producer lock: two open transactions write one shard.
/// Claims have no gap check, so a claim takes the later transaction's committed job and steps the
/// shard's cursor over the earlier one's open position; when that commits, its job sits behind the
/// cursor, never to be claimed.
#[test]
fn broken_shared_shard_without_producer_lock_is_caught() {
    let faults = Faults {
        shared_shards: true,
        ..Faults::default()
    };
    let run = check(
        "producers without the shard lock",
        RingModel::new(Bounds::main(), faults),
        0,
        &["CursorNeverSkipsRunnable", "NoLostJob"],
    );
    assert_counterexample(&run, "CursorNeverSkipsRunnable");
    assert_counterexample(&run, "NoLostJob");
}

/// Parking: a queue prune may park the pending rows of a slot held only by them, and
/// they come back (in place, by position) through a claim's first look, its per-shard re-check
/// after the shard lock, or a resume. A parked job is never lost or run twice by the parking, and
/// some parked job is claimed again and finishes.
#[test]
fn ring_protocol_holds_with_parking() {
    // one worker and two claim slots: with the main bounds (2 workers, 3 claim slots) parking
    // takes the space past 4 minutes of CI time
    let shards = scaled(2, 1);
    let bounds = Bounds {
        parking: true,
        workers: 1,
        claim_slots: 2,
        shards,
        ..Bounds::main()
    };
    let run = check(
        &format!("code as is, with parking, 2 jobs x 1 worker, {shards} shards, 2 claim slots"),
        RingModel::new(bounds, Faults::default()),
        0,
        &[],
    );
    assert_safe(&run);
    // with two claim slots a pruned claim slot looks never used (see the exhaustive test); with
    // one shard no claim passes an open enqueue (see the three-slot test)
    assert_reached(
        &run,
        scaled(
            &["ClaimSlotPruned"][..],
            &["ClaimSlotPruned", "ClaimPastOpenEnqueue"][..],
        ),
    );
    assert!(
        run.discoveries.contains_key("ParkedJobFinished"),
        "no parked job ever finished"
    );
}

/// Without the re-check after the shard lock, a park that commits between a claim's first look and
/// its shard lock lets the claim walk past the parked rows: the cursor steps over them, and once
/// unparked they are behind it.
#[test]
fn broken_claim_without_parked_lane_recheck_is_caught() {
    let faults = Faults {
        claim_skips_parked_recheck: true,
        ..Faults::default()
    };
    let bounds = Bounds {
        parking: true,
        ..Bounds::main()
    };
    let run = check(
        "claims without the per-shard parked re-check",
        RingModel::new(bounds, faults),
        0,
        &["CursorNeverSkipsRunnable", "NoLostJob"],
    );
    assert_counterexample(&run, "CursorNeverSkipsRunnable");
    assert_counterexample(&run, "NoLostJob");
}

// ------------------------------------------------------------------------------------------------
// Liveness: from every reachable state (crashes included), some crash-free continuation finishes
// every enqueued job — "AG EF done", decided on the explicit state graph. `Property::eventually`
// cannot say this soundly here; see docs/model.md. The same walk decides "an open enqueue holds
// back only its own jobs": some crash-free continuation in which no open enqueue ever commits or
// rolls back finishes every committed job.
// ------------------------------------------------------------------------------------------------

fn fingerprint(s: &State) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

fn done(s: &State) -> bool {
    s.jobs
        .iter()
        .all(|j| j.terminal || matches!(j.enqueue, Enqueue::NotYet | Enqueue::RolledBack))
}

/// Every committed job is finished (open enqueues aside).
fn committed_done(s: &State) -> bool {
    s.jobs
        .iter()
        .all(|j| j.terminal || j.enqueue != Enqueue::Committed)
}

/// Backwards from the target states over the edges kept: which states can reach a target. Ids are
/// in BFS order, so the first one that cannot has a shortest path.
fn can_reach(
    target: Vec<bool>,
    preds: &[Vec<(u32, bool)>],
    keep: impl Fn(bool) -> bool,
) -> Vec<bool> {
    let mut ok = target;
    let mut work: VecDeque<u32> = (0..ok.len() as u32).filter(|&n| ok[n as usize]).collect();
    while let Some(n) = work.pop_front() {
        for &(p, ends_enqueue) in &preds[n as usize] {
            if keep(ends_enqueue) && !ok[p as usize] {
                ok[p as usize] = true;
                work.push_back(p);
            }
        }
    }
    ok
}

/// The action's name, without its arguments.
fn action_kind(a: &Action) -> String {
    let text = format!("{a:?}");
    text.split('(').next().unwrap_or_default().to_string()
}

struct Liveness {
    states: usize,
    /// Shortest path to a state from which no crash-free path finishes every job.
    stranded: Option<Vec<Action>>,
    /// Shortest path to a state from which no crash-free path that leaves every enqueue open
    /// finishes every committed job: an open enqueue holds back a job that is not its own.
    held_back: Option<Vec<Action>>,
    /// Every action kind that changed some reachable state.
    fired: BTreeSet<String>,
}

fn check_liveness(label: &str, model: &RingModel) -> Liveness {
    let started = Instant::now();
    let init = model.init_states().remove(0);
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut parent: Vec<Option<(u32, Action)>> = vec![None];
    // crash-free edges into each state, and whether the edge ends an enqueue transaction
    let mut preds: Vec<Vec<(u32, bool)>> = vec![Vec::new()];
    let mut finished: Vec<bool> = vec![done(&init)];
    let mut committed_finished: Vec<bool> = vec![committed_done(&init)];
    let mut fired = BTreeSet::new();
    index.insert(fingerprint(&init), 0);
    let mut queue = VecDeque::from([(init, 0_u32)]);
    let mut actions = Vec::new();
    while let Some((state, id)) = queue.pop_front() {
        model.actions(&state, &mut actions);
        for action in actions.drain(..) {
            let Some(next) = model.next_state(&state, action) else {
                continue;
            };
            if next != state {
                fired.insert(action_kind(&action));
            }
            let fp = fingerprint(&next);
            let next_id = match index.get(&fp) {
                Some(&n) => n,
                None => {
                    let n = parent.len() as u32;
                    index.insert(fp, n);
                    parent.push(Some((id, action)));
                    preds.push(Vec::new());
                    finished.push(done(&next));
                    committed_finished.push(committed_done(&next));
                    queue.push_back((next, n));
                    n
                }
            };
            if !matches!(action, Action::Crash(_)) {
                let ends_enqueue = matches!(
                    action,
                    Action::EnqueueCommit(_) | Action::EnqueueRollback(_)
                );
                preds[next_id as usize].push((id, ends_enqueue));
            }
        }
    }
    let path_to = |mut n: usize| {
        let mut path = Vec::new();
        while let Some((p, a)) = parent[n] {
            path.push(a);
            n = p as usize;
        }
        path.reverse();
        path
    };
    // backwards from the finished states over crash-free edges
    let can_finish = can_reach(finished, &preds, |_| true);
    let stranded = can_finish.iter().position(|ok| !ok).map(path_to);
    // ... and from the states whose committed jobs are finished, leaving every enqueue open
    let can_finish_open = can_reach(committed_finished, &preds, |ends_enqueue| !ends_enqueue);
    let held_back = can_finish_open.iter().position(|ok| !ok).map(path_to);
    println!(
        "{label}: {} unique states explored in {:.2?}",
        parent.len(),
        started.elapsed()
    );
    Liveness {
        states: parent.len(),
        stranded,
        held_back,
        fired,
    }
}

fn liveness_bounds() -> Bounds {
    Bounds {
        workers: 1,
        rollbacks: false,
        ..Bounds::main()
    }
}

/// Every reachable state can still finish every job once crashes stop; every reachable state can
/// finish every committed job while every open enqueue stays open (an open transaction holds back
/// only its own shard); and every action of the model changes some reachable state (none is dead
/// code).
#[test]
fn liveness_every_claimed_job_can_still_finish() {
    let bounds = scaled(
        liveness_bounds(),
        Bounds {
            claim_slots: 2,
            ..liveness_bounds()
        },
    );
    let model = RingModel::new(bounds, Faults::default());
    let live = check_liveness("liveness, code as is", &model);
    assert!(live.states > 1);
    if let Some(trace) = &live.stranded {
        print_trace(&model, "every claimed job eventually closes", trace);
        panic!("a reachable state cannot finish its jobs");
    }
    if let Some(trace) = &live.held_back {
        print_trace(
            &model,
            "an open enqueue holds back only its own jobs",
            trace,
        );
        panic!("an open enqueue holds back a committed job");
    }
    let expected = [
        "EnqueueBegin",
        "EnqueueCommit",
        "ClaimBegin",
        "ClaimCommit",
        "ClaimAbort",
        "AdvanceCursor",
        "LockAttempt",
        "Close",
        "RescueStale",
        "RescueDeadline",
        "Crash",
        "Promote",
        "RotateQueue",
        "RotateClaim",
        "QueuePruneProve",
        "QueuePruneLock",
        "QueuePruneFinish",
        "QueuePruneSkip",
        "ClaimPruneProve",
        "ClaimPruneLock",
        "ClaimPruneFinish",
        "ClaimPruneSkip",
    ];
    for kind in expected {
        assert!(live.fired.contains(kind), "{kind} never fires");
    }
    println!("actions that fire: {:?}", live.fired);
}

/// Why lane shards exist, kept as a regression check of the "held back" half of the
/// liveness walk: in the code before shards, every producer wrote the one lane and a claim's walk
/// stopped below a position an open enqueue held, so one open transaction held back every job
/// committed after it. The model of that code keeps every safety property and plain liveness, but
/// not "an open enqueue holds back only its own jobs".
#[test]
fn pre_shard_gap_check_lets_an_open_enqueue_hold_back_other_jobs() {
    let faults = Faults {
        shared_shards: true,
        lane_gap_check: true,
        ..Faults::default()
    };
    let bounds = Bounds {
        shards: 1,
        ..liveness_bounds()
    };
    let model = RingModel::new(bounds, faults);
    let live = check_liveness("liveness, one lane with the old gap check", &model);
    if let Some(trace) = &live.stranded {
        print_trace(&model, "every claimed job eventually closes", trace);
        panic!("a reachable state cannot finish its jobs");
    }
    let trace = live
        .held_back
        .expect("an open enqueue holds back a committed job");
    print_trace(
        &model,
        "an open enqueue holds back only its own jobs",
        &trace,
    );
}

/// The finding, kept as a regression check. claim() reads the current claim slot without a lock
/// and inserts its batch last. If maintenance seals and prunes that slot in between (every claim
/// in it closed), the claim commits into a *free* slot. With rescue sweeping only non-free slots
/// (as rescue once did), if that worker dies the attempt is not rescued until the ring
/// rotates onto the slot again — and rotation needs new claims in the current slot: on a queue
/// that has gone quiet, never.
///
/// All in the claim plane: one shard.
#[test]
fn broken_rescue_skipping_free_slots_strands_a_claim() {
    let faults = Faults {
        rescue_skips_free_slots: true,
        ..Faults::default()
    };
    let bounds = Bounds {
        shards: 1,
        ..liveness_bounds()
    };
    let model = RingModel::new(bounds, faults);
    let live = check_liveness("liveness, rescue skips free slots", &model);
    let trace = live.stranded.expect("a stranded state is reachable");
    print_trace(&model, "every claimed job eventually closes", &trace);
    // the stranded claim is open in a free slot
    let mut s = model.init_states().remove(0);
    for a in &trace {
        s = model.next_state(&s, *a).expect("trace replays");
    }
    assert!(s
        .claims
        .iter()
        .any(|c| !c.closed && s.claim_ring.is(c.slot, SlotState::Free)));
}
