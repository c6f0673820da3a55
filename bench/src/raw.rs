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

/// `args` (as from [`evalsha`]) as a command.
pub(crate) fn command(args: &[String]) -> redis::Cmd {
    let mut cmd = redis::cmd(&args[0]);
    cmd.arg(&args[1..]);
    cmd
}

/// Sends `commands` one after the other, each awaiting its reply.
pub(crate) async fn send(mut conn: ConnectionManager, commands: Vec<redis::Cmd>) {
    for cmd in commands {
        let _: redis::Value = cmd.query_async(&mut conn).await.expect("EVALSHA");
    }
}
