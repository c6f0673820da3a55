//! The check that every key a script touches is one it declares in `KEYS`, which engines
//! that route or lock by declared keys (Dragonfly, Redis Cluster's strict mode) require.
//!
//! No server available to the tests enforces it (Redis 7 and Valkey only check, on a
//! Cluster, that keys hash to the node), so [`declared_keys_only`] makes the scripts check
//! themselves: every `redis.call`/`redis.pcall` is routed through a wrapper that looks its key
//! up in `KEYS` and, for one that is not there, records the command and key in the list
//! [`UNDECLARED`] (written without a TTL, so the conformance runs' TTL check fails on it too)
//! and raises an error saying `UNDECLARED`. The `conformance!` macro's `declared::<case>`
//! runs every case so.

/// Where a script that touched an undeclared key records it (a Redis list).
pub const UNDECLARED: &str = "redguard-tests:undeclared";

/// Commands whose first argument is not a key.
const UNKEYED: &[&str] = &["TIME", "PUBLISH"];

/// `source` with every Redis call checked against `KEYS` (see the module docs).
pub fn declared_keys_only(source: &str) -> String {
    let unkeyed: String = UNKEYED.iter().map(|c| format!("{c} = true, ")).collect();
    format!(
        "local __declared = {{}}\n\
         for _, k in ipairs(KEYS) do __declared[k] = true end\n\
         local __unkeyed = {{ {unkeyed}}}\n\
         local function __check(name, key)\n\
           if not __unkeyed[string.upper(name)] and not __declared[key] then\n\
             redis.call('RPUSH', '{UNDECLARED}', name .. ' ' .. tostring(key))\n\
             error('UNDECLARED ' .. tostring(key) .. ' (' .. name .. ')')\n\
           end\n\
         end\n\
         local function __call(name, ...)\n\
           __check(name, (...))\n\
           return redis.call(name, ...)\n\
         end\n\
         local function __pcall(name, ...)\n\
           __check(name, (...))\n\
           return redis.pcall(name, ...)\n\
         end\n{}",
        source
            .replace("redis.call(", "__call(")
            .replace("redis.pcall(", "__pcall(")
    )
}

/// Connects a handle with default settings to `server`, its scripts checking their keys.
pub async fn connect(server: &crate::RedisServer) -> redguard::Redguard {
    redguard::Redguard::redis(server.url())
        .script_transform(declared_keys_only)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Fails the test if any script touched a key it did not declare.
pub fn assert_none_undeclared(server: &crate::RedisServer) {
    let mut conn = server.connection();
    let undeclared: Vec<String> = redis::cmd("LRANGE")
        .arg(UNDECLARED)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE");
    assert!(
        undeclared.is_empty(),
        "scripts touched keys they did not declare in KEYS: {undeclared:?}"
    );
}
