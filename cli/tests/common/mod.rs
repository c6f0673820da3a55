//! What the CLI's test binaries share: running the built binary with only the settings a
//! test gives it.

use std::process::Output;

/// Runs the binary with `env` as its only redguard settings.
pub(crate) async fn redguard(env: Vec<(&'static str, String)>, args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_redguard"));
        for var in [
            "REDGUARD_REDIS_URL",
            "REDIS_URL",
            "REDGUARD_REDIS_CLUSTER_URLS",
            "REDGUARD_REDIS_SENTINELS",
            "REDGUARD_REDIS_MASTER",
            "REDGUARD_TLS_CA",
            "REDGUARD_PREFIX",
            "RUST_LOG",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env).args(&args).output().expect("run redguard")
    })
    .await
    .expect("join")
}

/// Creates the users `svc` (the services' line of the guide's servers page) and `operator`
/// (that line plus the operations page's grants), password `secret`, on `server`; returns
/// the URL for one of them.
pub(crate) fn acl_users(server: &redguard_tests::RedisServer) -> impl Fn(&str) -> String {
    let guide = |page: &str| {
        std::fs::read_to_string(format!(
            "{}/../runtime/docs/{page}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let service_rules = guide("servers.md")
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER redguard "))
        .expect("the guide's ACL line")
        .to_owned();
    let operator_rules = guide("operations.md")
        .lines()
        .find_map(|l| {
            l.split_once("operator's user needs `")
                .map(|(_, rest)| rest)
        })
        .and_then(|rest| rest.split('`').next())
        .expect("the guide's operator grants")
        .to_owned();
    let mut conn = server.connection();
    for (user, rules) in [
        ("svc", service_rules.clone()),
        ("operator", format!("{service_rules} {operator_rules}")),
    ] {
        let mut cmd = ::redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user);
        for rule in rules.split_whitespace() {
            cmd.arg(rule);
        }
        let _: () = cmd.query(&mut conn).unwrap();
    }
    let port = server.port();
    move |user: &str| format!("redis://{user}:secret@127.0.0.1:{port}")
}
