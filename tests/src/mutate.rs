//! Mutants of the Redis scripts, for a mutation score of the tests that run them.
//!
//! `cargo-mutants` mutates Rust, not the Lua the runtime sends to Redis, so this module does
//! the same for the scripts by hand: each [`Mutant`] changes one operator or drops one
//! `redis.call` statement at one place in one script (the classic operators: relational
//! boundary and negation, arithmetic, logical, `math.min`/`math.max`, `math.floor`/`math.ceil`,
//! returned 0/1, statement deletion). A test runs its store with the mutant applied through
//! `Builder::script_transform` (see [`Mutant::apply`]) and counts the mutants it catches.

/// A script's source as the runtime loads it (`lua!` in `store/redis/lua.rs`): the file,
/// after its prelude when it has one.
macro_rules! script {
    ($name:literal) => {
        include_str!(concat!(
            "../../runtime/src/store/redis/scripts/",
            $name,
            ".lua"
        ))
    };
    ($name:literal after $($prelude:literal),+) => {
        concat!($(script!($prelude),)+ script!($name))
    };
}

/// Every script the runtime ships, by file name, with its source as the runtime sends it.
pub const SCRIPTS: &[(&str, &str)] = &[
    ("fair_acquire", script!("fair_acquire" after "fence")),
    ("fair_release", script!("fair_release" after "fence")),
    ("idem_abandon", script!("idem_abandon")),
    ("idem_begin", script!("idem_begin")),
    ("idem_finish", script!("idem_finish")),
    ("idem_renew", script!("idem_renew")),
    ("idem_resolve", script!("idem_resolve")),
    ("lock_acquire", script!("lock_acquire" after "fence")),
    ("lock_release", script!("lock_release")),
    ("lock_renew", script!("lock_renew")),
    (
        "rate_check",
        script!("rate_check" after "expiry", "quota", "deny", "rescale"),
    ),
    (
        "rate_gcra",
        script!("rate_gcra" after "expiry", "quota", "deny"),
    ),
    ("rw_acquire", script!("rw_acquire" after "fence")),
    ("rw_release_read", script!("rw_release_read")),
    ("sem_acquire", script!("sem_acquire" after "fence")),
    ("sem_release", script!("sem_release")),
    ("sem_renew", script!("sem_renew")),
    ("token_consume", script!("token_consume")),
    ("token_restore", script!("token_restore")),
];

/// How many times a mutant replaced a script the runtime sent: a mutant that never does
/// is of a source the runtime no longer sends (a prelude added to it, say), and would count
/// as missed without ever running.
static APPLIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`APPLIED`]'s count so far.
pub fn applied() -> usize {
    APPLIED.load(std::sync::atomic::Ordering::Relaxed)
}

/// One change at one place in one script.
#[derive(Debug, Clone)]
pub struct Mutant {
    /// The script's file name, without `.lua`.
    pub script: &'static str,
    /// 1-based line of the change.
    pub line: usize,
    /// The operator, e.g. `>= → >` or `delete statement`.
    pub operator: String,
    /// The script's whole source with the change.
    pub mutated: String,
    original: &'static str,
}

impl Mutant {
    /// `source` with this mutant applied when it is this mutant's script, else unchanged.
    pub fn apply(&self, source: &str) -> String {
        if source == self.original {
            APPLIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.mutated.clone()
        } else {
            source.to_owned()
        }
    }

    /// The changed line, before and after.
    pub fn diff(&self) -> (String, String) {
        let before = self.original.lines().nth(self.line - 1).unwrap_or_default();
        let after = self.mutated.lines().nth(self.line - 1).unwrap_or_default();
        (before.trim().to_owned(), after.trim().to_owned())
    }
}

/// Token replacements: (operator as written, replacement). Relational operators are matched
/// as whole operators (`>` never inside `>=`), words on word boundaries.
const REPLACEMENTS: &[(&str, &str)] = &[
    (">=", ">"),
    ("<=", "<"),
    (">", ">="),
    ("<", "<="),
    ("==", "~="),
    ("~=", "=="),
    (" + ", " - "),
    (" - ", " + "),
    (" * ", " / "),
    (" / ", " * "),
    (" and ", " or "),
    (" or ", " and "),
    ("not ", ""),
    ("math.max", "math.min"),
    ("math.min", "math.max"),
    ("math.floor", "math.ceil"),
    ("math.ceil", "math.floor"),
    ("return 1", "return 0"),
    ("return 0", "return 1"),
];

/// Every mutant of every script in [`SCRIPTS`].
pub fn all() -> Vec<Mutant> {
    SCRIPTS
        .iter()
        .flat_map(|&(name, source)| of(name, source))
        .collect()
}

/// Every mutant of one script.
pub fn of(script: &'static str, source: &'static str) -> Vec<Mutant> {
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let mut mutants = Vec::new();
    let mut push = |index: usize, operator: String, line: String| {
        let mut mutated = String::with_capacity(source.len());
        for (i, l) in lines.iter().enumerate() {
            mutated.push_str(if i == index { &line } else { l });
        }
        mutants.push(Mutant {
            script,
            line: index + 1,
            operator,
            mutated,
            original: source,
        });
    };
    for (index, line) in lines.iter().enumerate() {
        // Only code: a comment (to the end of the line) is not mutated.
        let code_len = line.find("--").unwrap_or(line.len());
        let code = &line[..code_len];
        if code.trim().is_empty() {
            continue;
        }
        // A whole statement on one line (a call spread over lines would not parse without it).
        if code.trim_start().starts_with("redis.call(") && code.trim_end().ends_with(')') {
            let indent = &line[..line.len() - line.trim_start().len()];
            push(
                index,
                "delete statement".to_owned(),
                format!("{indent}-- deleted\n"),
            );
        }
        for &(from, to) in REPLACEMENTS {
            for at in occurrences(code, from) {
                let mut changed = String::with_capacity(line.len());
                changed.push_str(&line[..at]);
                changed.push_str(to);
                changed.push_str(&line[at + from.len()..]);
                push(
                    index,
                    format!("`{}` → `{}`", from.trim(), to.trim()),
                    changed,
                );
            }
        }
    }
    mutants
}

/// Byte offsets of `op` in `code`, as a whole operator or word.
fn occurrences(code: &str, op: &str) -> Vec<usize> {
    let bytes = code.as_bytes();
    let word = |i: usize| {
        bytes
            .get(i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    };
    let before_is_word = |at: usize| at > 0 && word(at - 1);
    code.match_indices(op)
        .map(|(at, _)| at)
        .filter(|&at| {
            let end = at + op.len();
            match op {
                // `>` alone, not the first half of `>=` nor part of `->`/`=>` (not Lua, but
                // cheap); `<` likewise.
                ">" | "<" => bytes.get(end) != Some(&b'=') && (at == 0 || bytes[at - 1] != b'~'),
                "not " | "return 1" | "return 0" | "math.max" | "math.min" | "math.floor"
                | "math.ceil" => !before_is_word(at) && !word(end),
                _ => true,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_are_matched_whole() {
        let source: &'static str =
            "if a >= b and c > d then -- x > y\n  redis.call('DEL', k)\nend\n";
        let ops: Vec<String> = of("t", source).iter().map(|m| m.operator.clone()).collect();
        assert_eq!(
            ops,
            [
                "`>=` → `>`",
                "`>` → `>=`",
                "`and` → `or`",
                "delete statement",
            ]
        );
        let deleted = &of("t", source)[3];
        assert_eq!(deleted.line, 2);
        assert_eq!(
            deleted.apply(source),
            "if a >= b and c > d then -- x > y\n  -- deleted\nend\n"
        );
        assert_eq!(deleted.apply("other"), "other");
    }

    #[test]
    fn every_script_has_mutants() {
        for &(name, source) in SCRIPTS {
            assert!(!of(name, source).is_empty(), "{name} has no mutants");
        }
    }
}
