//! A held lease's lifecycle (DESIGN §5 "Handoff", "Abandon", "Forget", G3), as a plain state
//! machine: which step moves which state where, and whether new work is admitted. No I/O, no
//! clock, no locks: `replica.rs` applies the answers under the handle's gate, and the unit tests
//! below check every state against every step.
//!
//! ```text
//!            Drain              Forget
//!  Serving ─────────▶ Draining ────────▶ Forgotten
//!     ▲   ◀───────────   │
//!     │      Resume      │ HandOff, Abandon
//!     │ Release, Abandon ▼
//!     └────────────▶ Released          Lose: Serving | Draining ──▶ Lost
//! ```

use crate::lease::HandleState;

/// What a protocol does to a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Stop taking new work while the work in flight finishes (a handoff, a forget).
    Drain,
    /// A drain that failed (timed out, or the control plane refused): serve again.
    Resume,
    /// Give the lease back after waiting for the work however long (release).
    Release,
    /// Give a drained lease back (the end of a handoff).
    HandOff,
    /// Give the lease back without waiting, from serving or draining (abandon, close).
    Abandon,
    /// The control plane moved the drained tenant's schema to the trash.
    Forget,
    /// The lease is gone without a release: fenced, taken over, the incarnation lost.
    Lose,
}

/// Where `step` moves a lease in `state`; None when it does not apply there (another protocol
/// got there first), and the caller does nothing.
pub(crate) fn next(state: HandleState, step: Step) -> Option<HandleState> {
    use HandleState::*;
    match (state, step) {
        (Serving, Step::Drain) => Some(Draining),
        (Draining, Step::Resume) => Some(Serving),
        (Serving, Step::Release) => Some(Released),
        (Draining, Step::HandOff) => Some(Released),
        (Serving | Draining, Step::Abandon) => Some(Released),
        (Draining, Step::Forget) => Some(Forgotten),
        (Serving | Draining, Step::Lose) => Some(Lost),
        _ => None,
    }
}

/// Why new work was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAdmitted {
    /// Draining: the caller may retry once the tenant is served again, here or elsewhere.
    Draining,
    /// The tenure is over (`released`, `lost`, `forgotten`).
    Ended(&'static str),
    /// The replica's incarnation that took the lease is gone: the lease is lost.
    IncarnationGone,
    /// The local deadline passed: the lease may have expired in the database.
    Expired,
}

/// Whether a new unit of work may start on a lease in `state`: the tenure is on, the
/// incarnation that holds it still current, and its local deadline not passed.
pub(crate) fn admission(
    state: HandleState,
    incarnation_current: bool,
    within_deadline: bool,
) -> Result<(), NotAdmitted> {
    match state {
        HandleState::Serving => {}
        HandleState::Draining => return Err(NotAdmitted::Draining),
        ended => return Err(NotAdmitted::Ended(ended_reason(ended))),
    }
    if !incarnation_current {
        return Err(NotAdmitted::IncarnationGone);
    }
    if !within_deadline {
        return Err(NotAdmitted::Expired);
    }
    Ok(())
}

/// Whether work already admitted may go on (after it registered its backend): a drain lets it
/// finish, an ended tenure does not.
pub(crate) fn still_admitted(state: HandleState) -> Result<(), &'static str> {
    match state {
        HandleState::Serving | HandleState::Draining => Ok(()),
        ended => Err(ended_reason(ended)),
    }
}

/// The word an error uses for how a tenure ended.
fn ended_reason(state: HandleState) -> &'static str {
    match state {
        HandleState::Released => "released",
        HandleState::Lost => "lost",
        HandleState::Forgotten => "forgotten",
        HandleState::Serving | HandleState::Draining => "not ended",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HandleState::*;

    const STATES: [HandleState; 5] = [Serving, Draining, Released, Lost, Forgotten];
    const STEPS: [Step; 7] = [
        Step::Drain,
        Step::Resume,
        Step::Release,
        Step::HandOff,
        Step::Abandon,
        Step::Forget,
        Step::Lose,
    ];

    #[test]
    fn an_ended_tenure_never_moves_again() {
        for state in STATES.into_iter().filter(|s| s.is_ended()) {
            for step in STEPS {
                assert_eq!(next(state, step), None, "{state:?} + {step:?}");
            }
        }
    }

    #[test]
    fn every_step_from_serving() {
        let moved: Vec<_> = STEPS.iter().map(|step| next(Serving, *step)).collect();
        assert_eq!(
            moved,
            [
                Some(Draining),
                None, // nothing to resume
                Some(Released),
                None, // a handoff drains first
                Some(Released),
                None, // a forget drains first
                Some(Lost),
            ]
        );
    }

    #[test]
    fn every_step_from_draining() {
        let moved: Vec<_> = STEPS.iter().map(|step| next(Draining, *step)).collect();
        assert_eq!(
            moved,
            [
                None, // one drain at a time: a second handoff or forget is refused
                Some(Serving),
                None, // a release does not take a lease another protocol is draining
                Some(Released),
                Some(Released),
                Some(Forgotten),
                Some(Lost),
            ]
        );
    }

    #[test]
    fn only_serving_admits_work() {
        for state in STATES {
            let admitted = admission(state, true, true);
            assert_eq!(
                admitted.is_ok(),
                state == Serving,
                "{state:?}: {admitted:?}"
            );
        }
        assert_eq!(admission(Draining, true, true), Err(NotAdmitted::Draining));
        assert_eq!(
            admission(Released, true, true),
            Err(NotAdmitted::Ended("released"))
        );
        assert_eq!(admission(Lost, true, true), Err(NotAdmitted::Ended("lost")));
        assert_eq!(
            admission(Forgotten, true, true),
            Err(NotAdmitted::Ended("forgotten"))
        );
    }

    #[test]
    fn a_serving_lease_refuses_work_once_its_incarnation_or_deadline_is_gone() {
        assert_eq!(
            admission(Serving, false, true),
            Err(NotAdmitted::IncarnationGone)
        );
        assert_eq!(admission(Serving, true, false), Err(NotAdmitted::Expired));
        // The incarnation first: a lost incarnation ends the lease, a passed deadline may not.
        assert_eq!(
            admission(Serving, false, false),
            Err(NotAdmitted::IncarnationGone)
        );
        // The state first: a draining or ended lease says so whatever the liveness.
        assert_eq!(
            admission(Draining, false, false),
            Err(NotAdmitted::Draining)
        );
    }

    #[test]
    fn admitted_work_finishes_through_a_drain_but_not_past_the_end() {
        assert_eq!(still_admitted(Serving), Ok(()));
        assert_eq!(still_admitted(Draining), Ok(()));
        assert_eq!(still_admitted(Released), Err("released"));
        assert_eq!(still_admitted(Lost), Err("lost"));
        assert_eq!(still_admitted(Forgotten), Err("forgotten"));
    }
}
