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

/// The operator's scripts, which [`crate::mutate::SCRIPTS`] leaves out, as the runtime
/// loads them.
pub const ADMIN_SCRIPTS: &[(&str, &str)] = &[
    (
        "admin_read",
        concat!(
            include_str!("../../runtime/src/store/redis/scripts/expiry.lua"),
            include_str!("../../runtime/src/store/redis/scripts/admin_read.lua")
        ),
    ),
    (
        "admin_refund",
        concat!(
            include_str!("../../runtime/src/store/redis/scripts/expiry.lua"),
            include_str!("../../runtime/src/store/redis/scripts/admin_refund.lua")
        ),
    ),
    (
        "admin_unlock",
        concat!(
            include_str!("../../runtime/src/store/redis/scripts/fence.lua"),
            include_str!("../../runtime/src/store/redis/scripts/admin_unlock.lua")
        ),
    ),
];

/// The key arguments of Redis calls in `code` (Lua without comments) that are not shown to
/// come from `KEYS`, as `COMMAND key`. A name counts as a key when every value it is given
/// is one: each assignment's right-hand side, each call's argument for a parameter, and for
/// `p[1]` of `for _, p in ipairs(list)` the first field of each `list[#list + 1] = { … }`
/// (and `p` itself for `ipairs(KEYS)`).
/// Names are not scoped: one name given a non-key anywhere counts as a non-key everywhere,
/// which errs toward reporting.
pub fn undeclared_keys(code: &str) -> Vec<String> {
    // name → every expression it is given.
    let mut given: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut give = |name: &str, value: &str| {
        given
            .entry(name.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    };
    for line in code.lines() {
        let line = line.trim().trim_start_matches("local ").trim();
        // `a, b = x, y` (not `==`, `<=`, `>=`, `~=`).
        if let Some((names, values)) = split_assignment(line) {
            let values = top_level_args(values);
            for (i, name) in names.split(',').enumerate() {
                let value = values.get(i).map_or("<returned>", String::as_str);
                give(name, value);
            }
        }
        // `for _, p in ipairs(list)`: p[1] is what every entry of list leads with.
        if let Some(rest) = line.strip_prefix("for _, ")
            && let Some((var, list)) = rest.split_once(" in ipairs(")
            && let Some(list) = list.strip_suffix(") do")
        {
            if list == "KEYS" {
                give(var, "KEYS[i]");
            }
            let entry = format!("{list}[#{list} + 1] = {{");
            for at in code.match_indices(&entry) {
                let fields = &code[at.0 + entry.len()..];
                let first = top_level_args(fields.split('}').next().unwrap_or(""));
                give(
                    &format!("{var}[1]"),
                    first.first().map_or("", String::as_str),
                );
            }
        }
    }
    // Parameters: what each call passes.
    for (at, _) in code.match_indices("function ") {
        let rest = &code[at + "function ".len()..];
        let Some((fname, rest)) = rest.split_once('(') else {
            continue;
        };
        let Some((params, _)) = rest.split_once(')') else {
            continue;
        };
        let short = fname.rsplit(['.', ':']).next().unwrap_or(fname).trim();
        if short.is_empty() {
            continue;
        }
        let call = format!("{short}(");
        for (pos, _) in code.match_indices(&call) {
            let before = code[..pos].chars().next_back().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' || code[..pos].ends_with("function ") {
                continue;
            }
            if code[..pos].ends_with(&format!("function {}", &fname[..fname.len() - short.len()])) {
                continue;
            }
            let args = top_level_args(call_args(&code[pos + call.len()..]));
            for (i, param) in params.split(',').enumerate() {
                let arg = args.get(i).map_or("nil", String::as_str);
                // A call passing the name on (`f(key)` into `key`) adds nothing; the name
                // must still get a key from somewhere.
                if arg != param.trim() {
                    give(param, arg);
                }
            }
        }
    }
    // The greatest set of names all of whose values are keys.
    let mut keys: std::collections::BTreeSet<String> = given.keys().cloned().collect();
    loop {
        let is_key = |e: &str, keys: &std::collections::BTreeSet<String>| {
            (e.starts_with("KEYS[") && e.ends_with(']')) || keys.contains(e)
        };
        let drop: Vec<String> = keys
            .iter()
            .filter(|name| {
                let values = &given[*name];
                values.is_empty() || !values.iter().all(|e| is_key(e, &keys))
            })
            .cloned()
            .collect();
        if drop.is_empty() {
            break;
        }
        for name in drop {
            keys.remove(&name);
        }
    }
    let mut undeclared = Vec::new();
    for call in ["redis.call(", "redis.pcall("] {
        for (pos, _) in code.match_indices(call) {
            let args = top_level_args(call_args(&code[pos + call.len()..]));
            let command = args.first().map_or("", |c| c.trim_matches(['\'', '"']));
            if UNKEYED.contains(&command) {
                continue;
            }
            let key = args.get(1).map_or("", String::as_str);
            if !((key.starts_with("KEYS[") && key.ends_with(']')) || keys.contains(key)) {
                undeclared.push(format!("{command} {key}"));
            }
        }
    }
    undeclared
}

/// `names = values` of an assignment statement, if `line` is one.
fn split_assignment(line: &str) -> Option<(&str, &str)> {
    let at = line.char_indices().find(|&(i, c)| {
        c == '='
            && !line[i + 1..].starts_with('=')
            && !matches!(line[..i].chars().next_back(), Some('=' | '<' | '>' | '~'))
    })?;
    let (names, values) = (&line[..at.0], &line[at.0 + 1..]);
    let names_ok = !names.trim().is_empty()
        && names.split(',').all(|n| {
            let n = n.trim();
            !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
    names_ok.then_some((names, values))
}

/// The text of a call's arguments: from just past its `(` to its matching `)`.
fn call_args(rest: &str) -> &str {
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' if depth == 0 => return &rest[..i],
            ')' | '}' | ']' => depth -= 1,
            _ => {}
        }
    }
    rest
}

/// `text` split at its top-level commas, each part trimmed.
fn top_level_args(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut depth, mut start, mut quote) = (0i32, 0, None);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '{' | '[') => depth += 1,
            (None, ')' | '}' | ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(text[start..i].trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text[start..].trim().to_owned());
    parts
}
