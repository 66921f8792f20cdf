//! Exhaustive model check of a workflow step's release, with the `stateright` crate.
//!
//! Two dependencies and one step that waits for both (a fan-in, or a batch's callback, whose edges
//! come with the seal). Each dependency ends in a transaction of its own, as
//! `sql/functions/workflows.sql` does it under READ COMMITTED: take the workflow's lock, append the
//! result, number the arrival after the highest committed one (a statement's snapshot sees only
//! committed rows), release the step when the number reaches its dependency count, commit. A
//! dependency can be rescued before it ends (not final: the step waits for the re-run). In batch
//! mode the step's edges are written by a seal, in its own transaction under the same lock, which
//! counts the members already final.
//!
//! | action | real code |
//! |---|---|
//! | `Lock(i)` | `lock_workflows_of` at the top of `complete_batch` / `close_batch` |
//! | `Settle(i)` | `workflow_settle_many`: result, arrival numbered `max(seen) + 1`, release at the count |
//! | `Commit(i)` | the completion's commit (the lock goes with it) |
//! | `Rescue(i)` | stale rescue of the dependency's attempt: it runs again, not final |
//! | `SealLock`, `Seal`, `SealCommit` | `seal_batch` → `workflow_add_steps`: edges, arrivals of final members |
//!
//! A rescue changes nothing of the release (it writes no result): the model checks that a release
//! still comes after one, not the rescue's own race with a completion (`tests/model.rs`).
//!
//! Safety, in every reachable state: the step is released at most once, never before both
//! dependencies are final (committed), and once everything has committed it has been released.
//! Each broken variant must produce a counterexample: releasing early, checking after the commit
//! (a callback fired twice), numbering without the lock, and sealing without the lock.

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
    /// Committed edges of the step (a fan-in has them from the start; a batch's come with its seal).
    edges: bool,
    seal: SealPhase,
    /// Who holds the workflow's lock: 0 and 1 the dependencies, 2 the seal.
    lock: Option<u8>,
    /// Committed releases of the step (counted up to 2).
    released: u8,
    /// A dependency was rescued and ran again.
    rescued: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    release_early: bool,
    check_after_commit: bool,
    number_without_lock: bool,
    seal_without_lock: bool,
}

struct ReleaseModel {
    batch: bool,
    faults: Faults,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Lock(u8),
    Settle(u8),
    Commit(u8),
    Check(u8),
    Rescue(u8),
    SealLock,
    Seal,
    SealCommit,
}

impl ReleaseModel {
    fn uses_lock(&self) -> bool {
        !self.faults.number_without_lock && !self.faults.check_after_commit
    }

    fn committed_arrivals(s: &State) -> u8 {
        s.arrived.iter().filter(|a| **a).count() as u8
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
            edges: !self.batch,
            seal: if self.batch {
                SealPhase::Open
            } else {
                SealPhase::Sealed
            },
            lock: None,
            released: 0,
            rescued: false,
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
                Phase::Locked => actions.push(Action::Settle(i)),
                Phase::Settled { .. } => actions.push(Action::Commit(i)),
                Phase::Done if self.faults.check_after_commit => actions.push(Action::Check(i)),
                Phase::Done | Phase::Checked => {}
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
                let (arrived, seen) = if s.edges && !self.faults.check_after_commit {
                    (true, Self::committed_arrivals(s) + 1)
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
                    arrived, release, ..
                } = s.deps[i as usize]
                {
                    n.final_[i as usize] = true;
                    if arrived {
                        n.arrived[i as usize] = true;
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
        ]
    }
}

fn run(batch: bool, faults: Faults) -> Vec<&'static str> {
    let checker = ReleaseModel { batch, faults }.checker().spawn_bfs().join();
    let mut violated: Vec<&'static str> = checker
        .discoveries()
        .into_keys()
        .filter(|name| !["Released", "RescuedThenReleased"].contains(name))
        .collect();
    violated.sort();
    if !(faults.release_early
        || faults.check_after_commit
        || faults.number_without_lock
        || faults.seal_without_lock)
    {
        for example in ["Released", "RescuedThenReleased"] {
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
    assert_eq!(run(false, Faults::default()), Vec::<&str>::new());
    assert_eq!(run(true, Faults::default()), Vec::<&str>::new());
}

#[test]
fn each_broken_variant_of_the_release_is_caught() {
    let early = run(
        false,
        Faults {
            release_early: true,
            ..Faults::default()
        },
    );
    assert!(early.contains(&"NotBeforeBothFinal"), "{early:?}");
    let twice = run(
        true,
        Faults {
            check_after_commit: true,
            ..Faults::default()
        },
    );
    assert!(twice.contains(&"ReleasedAtMostOnce"), "{twice:?}");
    let unlocked = run(
        false,
        Faults {
            number_without_lock: true,
            ..Faults::default()
        },
    );
    assert!(unlocked.contains(&"NoLostRelease"), "{unlocked:?}");
    let seal = run(
        true,
        Faults {
            seal_without_lock: true,
            ..Faults::default()
        },
    );
    assert!(seal.contains(&"NoLostRelease"), "{seal:?}");
}
