//! Exhaustive model check of the lease ring, with the `stateright` crate.
//!
//! One job whose handler registers a callback and returns `WaitForCallback`, answered by up to two
//! callbacks of any kind from outside, racing its timeout, heartbeats, a cancel, a crash of its
//! handler with the claim rescue that follows, and the ring's rotation over two slots. Every action
//! is one call of the real code, atomic because each takes the ring's shared lock and the job's
//! attempt lock (rotation: the ring's exclusive lock), as in `sql/functions/callbacks.sql`:
//!
//! | action | real code |
//! |---|---|
//! | `Register` | `register_callback` (attempt open, one per attempt) |
//! | `ReturnWait` | `await_callback`: close the claim, wait, or apply a recorded answer |
//! | `Crash`, `RescueClaim` | the handler's process dies; stale rescue closes the claim |
//! | `Answer(a)` | `resolve_callback` (complete, resume, fail, heartbeat) |
//! | `TimePasses`, `Timeout` | the clock passes `timeout_at`; `rescue_callbacks` |
//! | `Cancel` | `cancel_job`'s waiting branch |
//! | `Rotate` | `rotate_lease_ring`: the next slot becomes current, keeping its live leases |
//!
//! Safety, in every reachable state: the job is never lost (while its wait is not over it is in
//! the lease ring, its claim, or its rescue's retry), its wait ends at most once and is resumed at
//! most once, and an answer that comes after the wait ended changes nothing. Each broken variant
//! must produce a counterexample.

use stateright::{Checker, Model, Property};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    Complete,
    Resume,
    Fail,
    Heartbeat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LeaseState {
    Registered,
    Resolved(Answer),
    Waiting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    state: LeaseState,
    slot: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Handler {
    Running { registered: bool },
    Returned,
    Crashed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    claim_open: bool,
    handler: Handler,
    lease: Option<Lease>,
    /// Rows the end of the wait wrote (done, dlq or deferred): at most one, ever (counted up to 2,
    /// so a broken variant's state space stays finite).
    ends: u8,
    resumes: u8,
    /// The claim was closed by rescue: the job runs again from the start (a deferred row).
    rescued: bool,
    /// The claim was closed by `await_callback`: from here the job lives in the lease or its end.
    waited: bool,
    timeout_passed: bool,
    answers_left: u8,
    current_slot: u8,
    /// Ghost: an answer that came after the wait ended changed something.
    late_answer_changed: bool,
    /// Ghost: an orphaned lease (its attempt died before waiting) was dropped by rotation.
    orphan_dropped: bool,
    /// Ghost: an answer recorded while the handler ran was applied when it returned.
    recorded_applied: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Register,
    ReturnWait,
    Crash,
    RescueClaim,
    Answer(Answer),
    TimePasses,
    Timeout,
    Cancel,
    Rotate,
}

/// Broken variants, each expected to fail a property.
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// Rotation truncates its slot without keeping the live leases.
    rotation_drops_live: bool,
    /// An answer to a lease already resolved is applied again.
    answer_twice: bool,
    /// Timeout rescue does not re-check the lease under the attempt lock (ends a wait that an
    /// answer ended just before).
    timeout_without_recheck: bool,
}

const SLOTS: u8 = 2;

struct LeaseModel {
    faults: Faults,
}

impl LeaseModel {
    /// `end_wait`: the lease goes, one row is written.
    fn end(s: &mut State, answer: Answer) {
        s.lease = None;
        s.ends = (s.ends + 1).min(2);
        if answer == Answer::Resume {
            s.resumes = (s.resumes + 1).min(2);
        }
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            claim_open: true,
            handler: Handler::Running { registered: false },
            lease: None,
            ends: 0,
            resumes: 0,
            rescued: false,
            waited: false,
            timeout_passed: false,
            answers_left: 2,
            current_slot: 0,
            late_answer_changed: false,
            orphan_dropped: false,
            recorded_applied: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if let Handler::Running { registered } = s.handler {
            if !registered {
                actions.push(Action::Register);
            }
            actions.push(Action::ReturnWait);
            actions.push(Action::Crash);
        }
        if s.claim_open && s.handler == Handler::Crashed {
            actions.push(Action::RescueClaim);
        }
        if s.answers_left > 0 {
            for a in [
                Answer::Complete,
                Answer::Resume,
                Answer::Fail,
                Answer::Heartbeat,
            ] {
                actions.push(Action::Answer(a));
            }
        }
        if s.lease.is_some() && !s.timeout_passed {
            actions.push(Action::TimePasses);
        }
        if s.timeout_passed || self.faults.timeout_without_recheck {
            actions.push(Action::Timeout);
        }
        actions.push(Action::Cancel);
        actions.push(Action::Rotate);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let ended_before = last.ends > 0 || last.rescued;
        match action {
            Action::Register => {
                if s.claim_open && s.lease.is_none() {
                    s.lease = Some(Lease {
                        state: LeaseState::Registered,
                        slot: s.current_slot,
                    });
                }
                s.handler = Handler::Running { registered: true };
            }
            Action::ReturnWait => {
                s.handler = Handler::Returned;
                if !s.claim_open {
                    return Some(s); // stale: the attempt was closed already
                }
                match s.lease {
                    // no callback registered: the attempt is closed as failed
                    None => {
                        s.claim_open = false;
                        s.ends = (s.ends + 1).min(2);
                    }
                    Some(lease) => {
                        s.claim_open = false;
                        s.waited = true;
                        match lease.state {
                            LeaseState::Resolved(answer) => {
                                Self::end(&mut s, answer);
                                s.recorded_applied = true;
                            }
                            _ => {
                                s.lease = Some(Lease {
                                    state: LeaseState::Waiting,
                                    ..lease
                                })
                            }
                        }
                    }
                }
            }
            Action::Crash => s.handler = Handler::Crashed,
            Action::RescueClaim => {
                s.claim_open = false;
                s.rescued = true;
            }
            Action::Answer(answer) => {
                s.answers_left -= 1;
                let before = s.clone();
                match s.lease {
                    None => {}
                    Some(lease) => match lease.state {
                        LeaseState::Registered if !s.claim_open => s.lease = None,
                        LeaseState::Registered => {
                            if answer == Answer::Heartbeat {
                                s.timeout_passed = false;
                            } else {
                                s.lease = Some(Lease {
                                    state: LeaseState::Resolved(answer),
                                    ..lease
                                });
                            }
                        }
                        LeaseState::Resolved(_) => {
                            if self.faults.answer_twice && answer != Answer::Heartbeat {
                                s.ends = (s.ends + 1).min(2);
                                if answer == Answer::Resume {
                                    s.resumes = (s.resumes + 1).min(2);
                                }
                            }
                        }
                        LeaseState::Waiting => {
                            if answer == Answer::Heartbeat {
                                s.timeout_passed = false;
                            } else {
                                Self::end(&mut s, answer);
                            }
                        }
                    },
                }
                // an answer after the wait ended (or after the job was re-queued) may only be
                // refused; dropping an orphaned lease is bookkeeping, not a change to the job
                if ended_before
                    && (s.ends != before.ends
                        || s.resumes != before.resumes
                        || s.claim_open != before.claim_open)
                {
                    s.late_answer_changed = true;
                }
            }
            Action::TimePasses => s.timeout_passed = true,
            Action::Timeout => match s.lease {
                Some(Lease {
                    state: LeaseState::Waiting,
                    ..
                }) if s.timeout_passed => Self::end(&mut s, Answer::Fail),
                // the fault: ends the job again from a stale read of the lease
                _ if self.faults.timeout_without_recheck && s.waited => {
                    s.ends = (s.ends + 1).min(2)
                }
                _ => return None,
            },
            Action::Cancel => match s.lease {
                Some(Lease {
                    state: LeaseState::Waiting,
                    ..
                }) => Self::end(&mut s, Answer::Fail),
                _ => return None,
            },
            Action::Rotate => {
                s.current_slot = (s.current_slot + 1) % SLOTS;
                if let Some(lease) = s.lease {
                    if lease.slot == s.current_slot {
                        let live = lease.state == LeaseState::Waiting || s.claim_open;
                        if !live {
                            s.lease = None;
                            s.orphan_dropped = true;
                        } else if self.faults.rotation_drops_live {
                            s.lease = None;
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("NeverLost", |_, s: &State| {
                // once the job waits, it is in the lease ring or its wait ended with one row
                !s.waited
                    || s.ends == 1
                    || matches!(
                        s.lease,
                        Some(Lease {
                            state: LeaseState::Waiting,
                            ..
                        })
                    )
            }),
            Property::always("EndsAtMostOnce", |_, s: &State| s.ends <= 1),
            Property::always("ResumedAtMostOnce", |_, s: &State| s.resumes <= 1),
            Property::always("LateAnswerChangesNothing", |_, s: &State| {
                !s.late_answer_changed
            }),
            Property::sometimes("WaitedAndResumed", |_, s: &State| {
                s.waited && s.resumes == 1
            }),
            Property::sometimes("RecordedAnswerApplied", |_, s: &State| s.recorded_applied),
            Property::sometimes("OrphanDropped", |_, s: &State| s.orphan_dropped),
        ]
    }
}

fn run(faults: Faults) -> Vec<&'static str> {
    const EXAMPLES: [&str; 3] = ["WaitedAndResumed", "RecordedAnswerApplied", "OrphanDropped"];
    let checker = LeaseModel { faults }.checker().spawn_bfs().join();
    let found: Vec<&'static str> = checker.discoveries().into_keys().collect();
    let mut violated: Vec<&'static str> = found
        .iter()
        .copied()
        .filter(|name| !EXAMPLES.contains(name))
        .collect();
    violated.sort();
    let broken =
        faults.rotation_drops_live || faults.answer_twice || faults.timeout_without_recheck;
    if !broken {
        let reached: Vec<_> = found.iter().filter(|n| EXAMPLES.contains(n)).collect();
        assert_eq!(
            reached.len(),
            EXAMPLES.len(),
            "every 'sometimes' property is reached, so the model explores what it claims: {reached:?}"
        );
    }
    violated
}

#[test]
fn the_lease_ring_protocol_holds_exhaustively() {
    assert_eq!(run(Faults::default()), Vec::<&str>::new());
}

#[test]
fn each_broken_variant_of_the_lease_ring_is_caught() {
    assert!(run(Faults {
        rotation_drops_live: true,
        ..Faults::default()
    })
    .contains(&"NeverLost"));
    let twice = run(Faults {
        answer_twice: true,
        ..Faults::default()
    });
    assert!(
        twice.contains(&"EndsAtMostOnce") || twice.contains(&"ResumedAtMostOnce"),
        "{twice:?}"
    );
    assert!(run(Faults {
        timeout_without_recheck: true,
        ..Faults::default()
    })
    .contains(&"EndsAtMostOnce"));
}
