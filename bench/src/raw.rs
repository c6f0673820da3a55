//! The same scripts as the runtime, sent as plain `EVALSHA`s through the `redis` crate on
//! the kind of connection the runtime uses: the client overhead's baseline.

use redis::aio::ConnectionManager;

/// A script's SHA1, as `EVALSHA` names it. Computed once per case: hashing a script per
/// operation would cost more than sending it.
pub(crate) fn sha(script: &str) -> String {
    redis::Script::new(script).get_hash().to_owned()
}

/// `EVALSHA <sha> <keys> <args>` as redis-benchmark arguments.
pub(crate) fn evalsha(sha: &str, keys: &[&str], args: &[&str]) -> Vec<String> {
    let numkeys = keys.len().to_string();
    ["EVALSHA", sha, numkeys.as_str()]
        .into_iter()
        .chain(keys.iter().copied())
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// `EVALSHA <sha> <keys> <args>` as a command, in buffers sized up front, as the runtime
/// builds it: the raw baseline pays for nothing the runtime does not.
pub(crate) fn command(sha: &str, keys: &[&str], args: &[&str]) -> redis::Cmd {
    let (n, size) = (
        keys.len() + args.len(),
        64 + 96 * keys.len() + 24 * args.len(),
    );
    let mut cmd = redis::Cmd::with_capacity(3 + n, size);
    cmd.arg("EVALSHA")
        .arg(sha)
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
}

/// Sends `commands` one after the other, each awaiting its reply.
pub(crate) async fn send(mut conn: ConnectionManager, commands: Vec<redis::Cmd>) {
    for cmd in commands {
        let _: redis::Value = cmd.query_async(&mut conn).await.expect("EVALSHA");
    }
}
