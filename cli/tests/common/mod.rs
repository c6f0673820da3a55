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
