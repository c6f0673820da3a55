//! Every compile-time check of the macros, as a `.stderr` snapshot. Regenerate with
//! `TRYBUILD=overwrite cargo test -p redguard-ui-tests` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/fail/*.rs");
    t.pass("tests/pass/*.rs");
}
