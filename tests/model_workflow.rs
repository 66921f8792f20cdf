//! Exhaustive model check of a workflow step's release, with the `stateright` crate.
//!
//! Two dependencies and one step that waits for both (a fan-in, or a batch's callback, whose edges
//! come with the seal). Each dependency ends in a transaction of its own, as
//! `sql/functions/workflows.sql` does it under READ COMMITTED: take the workflow's lock, append the
//! result, number the arrival after the highest committed one (a statement's snapshot sees only
//! committed rows), release the step when the number reaches its dependency count, commit. A
//! dependency can be rescued before it ends (not final: the step waits for the re-run). In batch
//! mode the step's edges are written by a seal, in its own transaction under the same lock, which
//! counts the members already final. One transaction may also end both dependencies (a
//! completion batch holding both): it counts the edges that arrive in it with one arrival row,
//! numbered by their count. In retry mode the step's policy is `run`: a dependency that failed
//! (final for the step, which runs anyway) may be retried from the dead-letter queue and end again,
//! and its edge must not arrive twice.
//!
//! | action | real code |
//! |---|---|
//! | `Lock(i)` | `lock_workflows_of` at the top of `complete_batch` / `close_batch` |
//! | `Settle(i)` | `workflow_settle_many`: result, arrival numbered `max(seen) + 1`, release at the count |
//! | `Commit(i)` | the completion's commit (the lock goes with it) |
//! | `Rescue(i)` | stale rescue of the dependency's attempt: it runs again, not final |
//! | `LockBoth`, `SettleBoth`, `CommitBoth` | one `complete_batch` ending both: one arrival row counting both edges |
//! | `Retry(i)` | `dlq_retry` of a dependency that failed: it runs again and ends a second time |
//! | `SealLock`, `Seal`, `SealCommit` | `seal_batch` → `workflow_add_steps`: edges, arrivals of final members |
//!
//! A rescue changes nothing of the release (it writes no result): the model checks that a release
//! still comes after one, not the rescue's own race with a completion (`tests/model.rs`).
//!
//! Safety, in every reachable state: the step is released at most once, never before both
//! dependencies are final (committed), and once everything has committed it has been released.
//! Each broken variant must produce a counterexample: releasing early, checking after the commit
//! (a callback fired twice), numbering without the lock, sealing without the lock, and (retry mode)
//! counting every end of a dependency instead of its edge once.

use stateright::{Checker, Model, Property};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Its attempt runs (rescued at most once, then it runs again).
    Running { rescued: bool },
    /// Its completion transaction holds the workflow lock.
    Locked,
    /// It wrote its result and arrival (not yet visible to others).
    Settled {
        arrived: bool,
        seen: u8,
        release: bool,
    },
    /// Committed.
    Done,
    /// Broken variant: committed, and then checked in a transaction of its own.
    Checked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SealPhase {
    Open,
    Locked,
    /// The seal's statement saw these members final (its snapshot): they arrive with its commit.
    Wrote {
        seen_final: [bool; 2],
        release: bool,
    },
    Sealed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct State {
    deps: [Phase; 2],
    /// Committed results.
    final_: [bool; 2],
    /// Committed arrivals (each edge arrives once).
    arrived: [bool; 2],
    /// The highest committed arrival number: the count of edges arrived, as the settle reads it.
    seen: u8,
    /// Retry mode: the dependency was retried after its first end.
    retried: [bool; 2],
    /// Committed edges of the step (a fan-in has them from the start; a batch's come with its seal).
    edges: bool,
    seal: SealPhase,
    /// Who holds the workflow's lock: 0 and 1 the dependencies, 2 the seal, 3 one transaction
    /// ending both.
    lock: Option<u8>,
    /// Committed releases of the step (counted up to 2).
    released: u8,
    /// A dependency was rescued and ran again.
    rescued: bool,
    /// The step was released by one transaction ending both dependencies.
    released_by_both: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    release_early: bool,
    check_after_commit: bool,
    number_without_lock: bool,
    seal_without_lock: bool,
    count_every_end: bool,
}

struct ReleaseModel {
    batch: bool,
    /// The step's policy is `run`, and a dependency may be retried after it ended.
    retry: bool,
    faults: Faults,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Lock(u8),
    Settle(u8),
    Commit(u8),
    Check(u8),
    Rescue(u8),
    LockBoth,
    SettleBoth,
    CommitBoth,
    Retry(u8),
    SealLock,
    Seal,
    SealCommit,
}

impl ReleaseModel {
    fn uses_lock(&self) -> bool {
        !self.faults.number_without_lock && !self.faults.check_after_commit
    }

    /// Whether dependency `i`'s end arrives at the step now: its edge exists and (under `run`,
    /// where every end of a dependency arrives) has not arrived before.
    fn arrives(&self, s: &State, i: usize) -> bool {
        s.edges && (!s.arrived[i] || self.faults.count_every_end)
    }
}

impl Model for ReleaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            deps: [Phase::Running { rescued: false }; 2],
            final_: [false; 2],
            arrived: [false; 2],
            seen: 0,
            retried: [false; 2],
            edges: !self.batch,
            seal: if self.batch {
                SealPhase::Open
            } else {
                SealPhase::Sealed
            },
            lock: None,
            released: 0,
            rescued: false,
            released_by_both: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for i in 0..2u8 {
            match s.deps[i as usize] {
                Phase::Running { rescued } => {
                    if !rescued {
                        actions.push(Action::Rescue(i));
                    }
                    if !self.uses_lock() {
                        actions.push(Action::Settle(i));
                    } else if s.lock.is_none() {
                        actions.push(Action::Lock(i));
                    }
                }
                Phase::Locked if s.lock == Some(3) => {}
                Phase::Locked => actions.push(Action::Settle(i)),
                Phase::Settled { .. } if s.lock == Some(3) => {}
                Phase::Settled { .. } => actions.push(Action::Commit(i)),
                Phase::Done if self.faults.check_after_commit => actions.push(Action::Check(i)),
                Phase::Done if self.retry && !s.retried[i as usize] => {
                    actions.push(Action::Retry(i))
                }
                Phase::Done | Phase::Checked => {}
            }
        }
        // one completion batch ending both (its lock taken for both at once)
        if self.uses_lock() && s.lock.is_none() {
            if matches!(s.deps, [Phase::Running { .. }, Phase::Running { .. }]) {
                actions.push(Action::LockBoth);
            }
        } else if s.lock == Some(3) {
            match s.deps[0] {
                Phase::Locked => actions.push(Action::SettleBoth),
                Phase::Settled { .. } => actions.push(Action::CommitBoth),
                _ => {}
            }
        }
        match s.seal {
            SealPhase::Open if self.faults.seal_without_lock => actions.push(Action::Seal),
            SealPhase::Open if s.lock.is_none() => actions.push(Action::SealLock),
            SealPhase::Locked => actions.push(Action::Seal),
            SealPhase::Wrote { .. } => actions.push(Action::SealCommit),
            _ => {}
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = *s;
        match action {
            Action::Rescue(i) => {
                n.deps[i as usize] = Phase::Running { rescued: true };
                n.rescued = true;
            }
            Action::Lock(i) => {
                n.lock = Some(i);
                n.deps[i as usize] = Phase::Locked;
            }
            Action::Settle(i) => {
                // the statement's snapshot: committed rows only
                let (arrived, seen) =
                    if self.arrives(s, i as usize) && !self.faults.check_after_commit {
                        (true, s.seen + 1)
                    } else {
                        (false, 0)
                    };
                let release = arrived && (seen == 2 || (self.faults.release_early && seen >= 1));
                n.deps[i as usize] = Phase::Settled {
                    arrived,
                    seen,
                    release,
                };
            }
            Action::Commit(i) => {
                if let Phase::Settled {
                    arrived,
                    seen,
                    release,
                } = s.deps[i as usize]
                {
                    n.final_[i as usize] = true;
                    if arrived {
                        n.arrived[i as usize] = true;
                        n.seen = n.seen.max(seen);
                    }
                    if release {
                        n.released = (n.released + 1).min(2);
                    }
                }
                n.deps[i as usize] = Phase::Done;
                if s.lock == Some(i) {
                    n.lock = None;
                }
            }
            Action::LockBoth => {
                n.lock = Some(3);
                n.deps = [Phase::Locked; 2];
            }
            Action::SettleBoth => {
                // one statement: the edges arriving now are one row, numbered by their count;
                // the release rides on the first dependency's phase
                let arriving = [self.arrives(s, 0), self.arrives(s, 1)];
                let seen = s.seen + arriving.iter().filter(|a| **a).count() as u8;
                let release = seen > s.seen && seen == 2;
                for (i, arrived) in arriving.into_iter().enumerate() {
                    n.deps[i] = Phase::Settled {
                        arrived,
                        seen,
                        release: release && i == 0,
                    };
                }
            }
            Action::CommitBoth => {
                for i in 0..2 {
                    if let Phase::Settled {
                        arrived,
                        seen,
                        release,
                    } = s.deps[i]
                    {
                        n.final_[i] = true;
                        if arrived {
                            n.arrived[i] = true;
                            n.seen = n.seen.max(seen);
                        }
                        if release {
                            n.released = (n.released + 1).min(2);
                            n.released_by_both = true;
                        }
                    }
                    n.deps[i] = Phase::Done;
                }
                n.lock = None;
            }
            Action::Retry(i) => {
                n.deps[i as usize] = Phase::Running { rescued: true };
                n.retried[i as usize] = true;
            }
            Action::Check(i) => {
                // broken: after its commit, a dependency looks whether all are final and releases
                if s.edges && s.final_.iter().all(|f| *f) {
                    n.released = (n.released + 1).min(2);
                }
                n.deps[i as usize] = Phase::Checked;
            }
            Action::SealLock => {
                n.lock = Some(2);
                n.seal = SealPhase::Locked;
            }
            Action::Seal => {
                // edges written now; the members already final (committed) arrive at once
                n.seal = SealPhase::Wrote {
                    seen_final: s.final_,
                    release: s.final_.iter().all(|f| *f),
                };
            }
            Action::SealCommit => {
                if let SealPhase::Wrote {
                    seen_final,
                    release,
                } = s.seal
                {
                    n.edges = true;
                    // what its statement saw, not what committed since (that is the race)
                    for (arrived, seen) in n.arrived.iter_mut().zip(seen_final) {
                        *arrived |= seen;
                    }
                    n.seen = n.seen.max(n.arrived.iter().filter(|a| **a).count() as u8);
                    if release {
                        n.released = (n.released + 1).min(2);
                    }
                }
                n.seal = SealPhase::Sealed;
                if s.lock == Some(2) {
                    n.lock = None;
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("ReleasedAtMostOnce", |_, s: &State| s.released <= 1),
            Property::always("NotBeforeBothFinal", |_, s: &State| {
                s.released == 0 || s.final_.iter().all(|f| *f)
            }),
            Property::always("NoLostRelease", |m: &ReleaseModel, s: &State| {
                // once nothing is in flight any more, the step was released
                let last = if m.faults.check_after_commit {
                    Phase::Checked
                } else {
                    Phase::Done
                };
                let quiet = s.deps.iter().all(|d| *d == last) && s.seal == SealPhase::Sealed;
                !quiet || s.released >= 1
            }),
            Property::sometimes("Released", |_, s: &State| s.released == 1),
            Property::sometimes("RescuedThenReleased", |_, s: &State| {
                s.released == 1 && s.rescued
            }),
            Property::sometimes("ReleasedByOneBatch", |_, s: &State| {
                s.released == 1 && s.released_by_both
            }),
            Property::sometimes("RetriedAfterItsEnd", |_, s: &State| {
                s.retried.iter().all(|r| *r) && s.deps.iter().all(|d| *d == Phase::Done)
            }),
        ]
    }
}

fn run(batch: bool, retry: bool, faults: Faults) -> Vec<&'static str> {
    let checker = ReleaseModel {
        batch,
        retry,
        faults,
    }
    .checker()
    .spawn_bfs()
    .join();
    let mut violated: Vec<&'static str> = checker
        .discoveries()
        .into_keys()
        .filter(|name| {
            ![
                "Released",
                "RescuedThenReleased",
                "ReleasedByOneBatch",
                "RetriedAfterItsEnd",
            ]
            .contains(name)
        })
        .collect();
    violated.sort();
    if !(faults.release_early
        || faults.check_after_commit
        || faults.number_without_lock
        || faults.seal_without_lock
        || faults.count_every_end)
    {
        let mut examples = vec!["Released", "RescuedThenReleased", "ReleasedByOneBatch"];
        if retry {
            examples.push("RetriedAfterItsEnd");
        }
        for example in examples {
            assert!(
                checker.discoveries().contains_key(example),
                "the model reaches {example}, so it explores what it claims"
            );
        }
    }
    violated
}

#[test]
fn a_fan_in_and_a_batch_callback_are_released_exactly_once_after_both() {
    for (batch, retry) in [(false, false), (true, false), (false, true), (true, true)] {
        assert_eq!(
            run(batch, retry, Faults::default()),
            Vec::<&str>::new(),
            "batch {batch}, retry {retry}"
        );
    }
}

#[test]
fn each_broken_variant_of_the_release_is_caught() {
    let early = run(
        false,
        false,
        Faults {
            release_early: true,
            ..Faults::default()
        },
    );
    assert!(early.contains(&"NotBeforeBothFinal"), "{early:?}");
    let twice = run(
        true,
        false,
        Faults {
            check_after_commit: true,
            ..Faults::default()
        },
    );
    assert!(twice.contains(&"ReleasedAtMostOnce"), "{twice:?}");
    let unlocked = run(
        false,
        false,
        Faults {
            number_without_lock: true,
            ..Faults::default()
        },
    );
    assert!(unlocked.contains(&"NoLostRelease"), "{unlocked:?}");
    let seal = run(
        true,
        false,
        Faults {
            seal_without_lock: true,
            ..Faults::default()
        },
    );
    assert!(seal.contains(&"NoLostRelease"), "{seal:?}");
    let every_end = run(
        false,
        true,
        Faults {
            count_every_end: true,
            ..Faults::default()
        },
    );
    assert!(every_end.contains(&"NotBeforeBothFinal"), "{every_end:?}");
}
