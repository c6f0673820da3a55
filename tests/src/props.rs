//! Running the model-based state-machine tests (`tests/tests/models.rs`): a case count kept
//! small for CI, overridden by `PROPTEST_CASES`; a failure shrunk and printed as the
//! numbered sequence of operations that reproduces it, with the seed to run it again.

use std::fmt::Debug;

use proptest::test_runner::{Config, RngSeed, TestError, TestRunner, contextualize_config};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use crate::vclock::{Backend, with_backend};

/// Runs `T`'s state machine for `cases` cases (`PROPTEST_CASES` overrides) of 1 to `steps`
/// operations each on `backend`. A failure panics with the shrunk sequence.
pub fn run<T>(backend: Backend, cases: u32, steps: usize)
where
    T: StateMachineTest,
    <T::Reference as ReferenceStateMachine>::State: Debug + Clone,
    <T::Reference as ReferenceStateMachine>::Transition: Debug + Clone,
{
    let seed = seed();
    // Each shrinking step replays a case against real servers.
    if let Err(failure) = check::<T>(backend, cases, steps, seed, 1024) {
        panic!(
            "{backend:?}: a shrunk sequence the model and the store disagree on \
             (PROPTEST_RNG_SEED={seed} runs it again):\n{failure}"
        );
    }
}

/// Like [`run`], without shrinking: whether `cases` cases pass, or the first failing
/// sequence. For counting which mutants a machine catches.
pub fn passes<T>(backend: Backend, cases: u32, steps: usize) -> Result<(), String>
where
    T: StateMachineTest,
    <T::Reference as ReferenceStateMachine>::State: Debug + Clone,
    <T::Reference as ReferenceStateMachine>::Transition: Debug + Clone,
{
    // One shrink step: proptest-state-machine resets its step counter only while shrinking.
    check::<T>(backend, cases, steps, seed(), 1)
}

/// `PROPTEST_RNG_SEED`, or a random seed (printed with a failure).
fn seed() -> u64 {
    std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

fn check<T>(
    backend: Backend,
    cases: u32,
    steps: usize,
    seed: u64,
    max_shrink_iters: u32,
) -> Result<(), String>
where
    T: StateMachineTest,
    <T::Reference as ReferenceStateMachine>::State: Debug + Clone,
    <T::Reference as ReferenceStateMachine>::Transition: Debug + Clone,
{
    let config = contextualize_config(Config {
        cases,
        max_shrink_iters,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    });
    with_backend(backend, || {
        let mut runner = TestRunner::new(config.clone());
        let strategy = T::Reference::sequential_strategy(1..=steps);
        let outcome = runner.run(&strategy, |(initial, transitions, seen)| {
            T::test_sequential(config.clone(), initial, transitions, seen);
            Ok(())
        });
        match outcome {
            Ok(()) => Ok(()),
            Err(TestError::Abort(why)) => Err(format!("aborted: {why}")),
            Err(TestError::Fail(why, (initial, transitions, _))) => {
                let steps: Vec<String> = transitions
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("  {:>2}. {t:?}", i + 1))
                    .collect();
                Err(format!(
                    "  initial: {initial:?}\n{}\n{why}",
                    steps.join("\n")
                ))
            }
        }
    })
}

/// The first words of a failure: what went wrong at which step, with the steps before it.
pub fn disagreement(log: &[String], what: impl Debug) -> String {
    format!(
        "the store and the model disagree at step {}: {what:?}\nsteps run:\n{}",
        log.len(),
        log.iter()
            .enumerate()
            .map(|(i, line)| format!("  {:>2}. {line}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    )
}
