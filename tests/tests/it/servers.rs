//! The compatibility matrix's promises (the guide's "Supported servers",
//! `runtime/docs/servers.md`): its table is the one `scripts/matrix` wrote, and the
//! undeclared-key check of the `conformance!` macro's `declared::` runs can fail.

use redguard_tests::RedisServer;
use redguard_tests::declared::{UNDECLARED, declared_keys_only};

/// The guide's "Supported servers" table is `tests/servers.md`, the matrix's last results.
#[test]
fn guide_table_is_the_matrix_results() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let results = std::fs::read_to_string(format!("{root}/tests/servers.md"))
        .expect("read tests/servers.md (written by scripts/matrix)");
    let guide = std::fs::read_to_string(format!("{root}/runtime/docs/servers.md"))
        .expect("read runtime/docs/servers.md");
    let (_, after) = guide
        .split_once("<!-- servers:begin (scripts/matrix writes tests/servers.md) -->\n")
        .expect("the guide has the servers:begin marker");
    let (table, _) = after
        .split_once("<!-- servers:end -->")
        .expect("the guide has the servers:end marker");
    assert_eq!(
        table, results,
        "runtime/docs/servers.md's table differs from tests/servers.md: copy the matrix's results \
         into the guide"
    );
    assert!(!results.contains("FAILED"), "the matrix failed on a server");
}

/// A script that touches a key outside `KEYS` is caught and recorded; one that keeps to its
/// keys runs as before.
#[test]
fn the_undeclared_key_check_catches_a_key_outside_keys() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let script = "redis.call('SET', KEYS[1], '1', 'PX', 1000)\n\
                  local t = redis.call('TIME')\n\
                  return redis.call('GET', KEYS[1] .. ':other')";
    let checked = declared_keys_only(script);
    let ok: redis::RedisResult<Option<String>> = redis::cmd("EVAL")
        .arg(declared_keys_only("return redis.call('GET', KEYS[1])"))
        .arg(1)
        .arg("a")
        .query(&mut conn);
    assert_eq!(ok.unwrap(), None);
    let refused: redis::RedisResult<Option<String>> = redis::cmd("EVAL")
        .arg(&checked)
        .arg(1)
        .arg("a")
        .query(&mut conn);
    let err = refused.expect_err("GET of an undeclared key");
    assert!(
        err.to_string().contains("UNDECLARED a:other (GET)"),
        "{err}"
    );
    let recorded: Vec<String> = redis::cmd("LRANGE")
        .arg(UNDECLARED)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    assert_eq!(recorded, ["GET a:other"]);
}

/// Statically, over every shipped script: the key of each Redis call is `KEYS[…]` or a name
/// that only ever holds one (a local assigned from `KEYS`, a function parameter every call
/// passes one, an entry of a list whose every entry leads with one). The run-time check
/// (`declared::`) covers the paths the conformance cases take; this one every path.
#[test]
fn every_key_a_script_touches_is_declared() {
    use redguard_tests::declared::undeclared_keys;
    // The check can fail: a literal key, one derived from KEYS, a parameter given a non-key.
    assert_eq!(
        undeclared_keys(
            "local k = KEYS[1]\nredis.call('GET', k)\nredis.call('SET', 'x', 1)\n\
             redis.pcall('DEL', KEYS[1] .. ':other')\nlocal function f(key)\n\
             return redis.call('TYPE', key)\nend\nf(KEYS[2])\nf(ARGV[1])\n\
             local t = redis.call('TIME')\n\
             local function g(c)\nreturn redis.call('GET', c)\nend\ng(c)\n\
             for _, k2 in ipairs(KEYS) do\nredis.call('GET', k2)\nend"
        ),
        ["SET 'x'", "TYPE key", "GET c", "DEL KEYS[1] .. ':other'"]
    );
    let admin = redguard_tests::declared::ADMIN_SCRIPTS;
    for (name, source) in redguard_tests::mutate::SCRIPTS.iter().chain(admin) {
        let code: String = source
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let undeclared = undeclared_keys(&code);
        assert!(
            undeclared.is_empty(),
            "{name}.lua: calls on keys not from KEYS: {undeclared:?}"
        );
    }
}
