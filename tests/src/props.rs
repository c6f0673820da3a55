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
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let config = contextualize_config(Config {
        cases,
        // Each shrinking step replays a case against real servers.
        max_shrink_iters: 1024,
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
            Ok(()) => {}
            Err(TestError::Abort(why)) => panic!("{backend:?}: aborted: {why}"),
            Err(TestError::Fail(why, (initial, transitions, _))) => {
                let steps: Vec<String> = transitions
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("  {:>2}. {t:?}", i + 1))
                    .collect();
                panic!(
                    "{backend:?}: a shrunk sequence the model and the store disagree on \
                     (PROPTEST_RNG_SEED={seed} runs it again):\n  initial: {initial:?}\n{}\n{why}",
                    steps.join("\n")
                );
            }
        }
    });
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
