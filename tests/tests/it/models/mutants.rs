//! The mutation score of the model tests on the Redis scripts: every mutant of every script
//! ([`redguard_tests::mutate`]) is run through the machines that exercise that script, on a
//! single Redis, and counted caught (some case disagreed with the model) or missed.
//!
//! CI runs every 8th mutant (about 30 s); all of them take about 4 minutes on the 2-core VM:
//! `MUTANT_SAMPLE=1 cargo test -p redguard-tests --test it models::mutants -- --nocapture`
//! (`MUTANT_SCRIPT=lock_release` for one script, `MUTANT_CASES=n` cases per machine).

use std::cell::RefCell;
use std::collections::BTreeMap;

use redguard_tests::mutate::{self, Mutant};
use redguard_tests::props::passes;
use redguard_tests::vclock::Backend;

use super::STEPS;

thread_local! {
    static CURRENT: RefCell<Option<Mutant>> = const { RefCell::new(None) };
}

/// The mutant being tried on this thread.
pub(super) fn current() -> Option<Mutant> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Whether the machines that run `script` pass `cases` cases each: `Err` names the machine
/// that caught the difference.
fn machines_pass(script: &str, cases: u32) -> Result<(), String> {
    let run =
        |name: &str, result: Result<(), String>| result.map_err(|why| format!("{name}: {why}"));
    match script {
        "rate_check" | "rate_gcra" => run(
            "rate_limits",
            passes::<super::rate::Machine>(Backend::Redis, cases, STEPS),
        ),
        s if s.starts_with("idem_") || s.starts_with("token_") => {
            run(
                "records_and_tokens",
                passes::<super::idem::Machine>(Backend::Redis, cases, STEPS),
            )?;
            run(
                "idempotent_calls",
                passes::<super::calls::Machine>(Backend::Redis, cases, STEPS),
            )
        }
        s if s.starts_with("lock_") => {
            run(
                "locks",
                passes::<super::lock::Machine>(Backend::Redis, cases, STEPS),
            )?;
            run(
                "nested_levels",
                passes::<super::nested::Machine>(Backend::Redis, cases, STEPS),
            )
        }
        _ => run(
            "locks",
            passes::<super::lock::Machine>(Backend::Redis, cases, STEPS),
        ),
    }
}

#[test]
fn lua_mutation_score() {
    let cases = std::env::var("MUTANT_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(32);
    let sample: usize = std::env::var("MUTANT_SAMPLE")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(8)
        .max(1);
    let only = std::env::var("MUTANT_SCRIPT").ok();
    let mutants: Vec<Mutant> = mutate::all()
        .into_iter()
        .filter(|m| only.as_deref().is_none_or(|s| s == m.script))
        .step_by(sample)
        .collect();
    assert!(!mutants.is_empty(), "no script named {only:?}");

    // The shipped scripts pass, or a caught mutant would mean nothing.
    let mut scripts: Vec<&str> = mutants.iter().map(|m| m.script).collect();
    scripts.dedup();
    for script in &scripts {
        if let Err(why) = machines_pass(script, cases) {
            panic!("the unmutated {script} fails its machines:\n{why}");
        }
    }

    // A caught mutant panics inside a case; proptest catches it, and the hook would print
    // every one. Other tests' panics (this binary runs them in parallel) still print.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if current().is_none() {
            hook(info);
        }
    }));
    let mut score: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut missed = Vec::new();
    for mutant in &mutants {
        CURRENT.with(|c| *c.borrow_mut() = Some(mutant.clone()));
        let before = redguard_tests::mutate::applied();
        let outcome = std::panic::catch_unwind(|| machines_pass(mutant.script, cases));
        CURRENT.with(|c| *c.borrow_mut() = None);
        assert!(
            redguard_tests::mutate::applied() > before,
            "the mutant of {}.lua never replaced a script the runtime sent: its source in \
             `mutate::SCRIPTS` is not the runtime's (a prelude added in `lua!`?)",
            mutant.script
        );
        let caught = match outcome {
            Ok(result) => result.is_err(),
            // Outside a case (the harness itself): not the mutant's doing.
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                panic!("the harness failed on {mutant:?}: {why}");
            }
        };
        let entry = score.entry(mutant.script).or_default();
        entry.0 += 1;
        if caught {
            entry.1 += 1;
        } else {
            missed.push(mutant);
        }
    }
    println!("\n| script | mutants | caught | missed | score |\n|---|---|---|---|---|");
    let (mut total, mut caught) = (0, 0);
    for (script, (n, c)) in &score {
        println!(
            "| {script} | {n} | {c} | {} | {:.0}% |",
            n - c,
            100.0 * *c as f64 / *n as f64
        );
        total += n;
        caught += c;
    }
    println!(
        "| all | {total} | {caught} | {} | {:.0}% |",
        total - caught,
        100.0 * caught as f64 / total as f64
    );
    println!("\nmissed:");
    for m in &missed {
        let (before, after) = m.diff();
        println!(
            "  {}.lua:{} {}: `{before}` → `{after}`",
            m.script, m.line, m.operator
        );
    }
    assert!(
        caught * 100 >= total * FLOOR,
        "the score fell below {FLOOR}%: {caught} of {total} mutants caught"
    );
}

/// The lowest score (percent of mutants caught) accepted; the last full run is in TESTING.md.
const FLOOR: usize = 50;
