//! `redguard quota set/get/list/clear` as an operator runs it, against a running service (a
//! library handle standing for another instance): an override set by the binary decides
//! the service's next call on that key; bad input and a service's own credential are refused
//! with exit status 1 and nothing written.

use std::process::Output;

use redguard::Redguard;
use redguard_tests::{RedisCluster, RedisServer};
use serde_json::Value;

mod common;
use common::redguard;

const SCOPE: &str = "api::tenants";

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "redguard failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stdout.clone()).expect("utf-8")
}

fn json(output: &Output) -> Value {
    serde_json::from_str(&ok(output)).expect("JSON output")
}

/// Refused: exit status 1, `redguard: <why>` on stderr.
fn refused(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("redguard: "), "{stderr}");
    stderr
}

fn tenant(rg: &Redguard, id: &str) -> redguard::rate::Limiter {
    redguard::limiter(redguard::key("tenant:{id}").part("id", id))
        .scope(SCOPE)
        .rate("1/min")
        .on(rg)
}

/// The whole session on one deployment: set, get, list, effect on the service, clear.
async fn session(env: Vec<(&'static str, String)>, service: Redguard) {
    tenant(&service, "acme").check().await.unwrap();
    assert!(!tenant(&service, "acme").decide().await.unwrap().allowed);
    let set = json(
        &redguard(
            env.clone(),
            &[
                "--json",
                "quota",
                "set",
                SCOPE,
                "tenant:acme",
                "--rate",
                "100/h",
                "--burst",
                "3",
                "--ttl",
                "30d",
            ],
        )
        .await,
    );
    assert_eq!(set["burst"], 3);
    assert_eq!(set["expires_in_ms"], 30 * 86_400_000u64);
    // The service's next call is decided with the override.
    let d = tenant(&service, "acme").decide().await.unwrap();
    assert!(d.allowed && d.limit == 3, "{d:?}");

    let got = json(
        &redguard(
            env.clone(),
            &["--json", "quota", "get", SCOPE, "tenant:acme"],
        )
        .await,
    );
    assert_eq!(got["rate"], "100/3600s");
    let text = ok(&redguard(env.clone(), &["quota", "get", SCOPE, "tenant:acme"]).await);
    assert!(text.contains("100/3600s burst 3"), "{text}");
    let list = json(&redguard(env.clone(), &["--json", "quota", "list", SCOPE]).await);
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["truncated"], false);

    let cleared = ok(&redguard(env.clone(), &["quota", "clear", SCOPE, "tenant:acme"]).await);
    assert!(cleared.contains("cleared"), "{cleared}");
    let d = tenant(&service, "acme").decide().await.unwrap();
    assert!(!d.allowed && d.limit == 1, "{d:?}");
    let none = ok(&redguard(env.clone(), &["quota", "get", SCOPE, "tenant:acme"]).await);
    assert!(none.contains("no override"), "{none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_list_clear_on_a_running_service() {
    let server = RedisServer::start();
    let service = redguard_tests::connect(&server).await;
    session(vec![("REDGUARD_REDIS_URL", server.url())], service).await;
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_list_clear_on_a_cluster() {
    let cluster = RedisCluster::start();
    let service = cluster.connect().await;
    let env = vec![("REDGUARD_REDIS_CLUSTER_URLS", cluster.urls().join(","))];
    session(env.clone(), service.clone()).await;
    // A prefix override cannot be read with the keys it covers on a Cluster: refused.
    let args = [
        "quota", "set", SCOPE, "tenant:*", "--rate", "10/s", "--ttl", "1h",
    ];
    let stderr = refused(&redguard(env, &args).await);
    assert!(stderr.contains("Cluster"), "{stderr}");
    assert_eq!(tenant(&service, "acme").peek().await.unwrap().limit, 1);
    cluster.assert_every_key_has_ttl();
}

/// `quota set SCOPE 'tenant:*'`: every key of the scope starting with `tenant:` is decided
/// with it on the service's next call, below an exact key's override; get, list and clear
/// name it with its `*`; listed, then gone with nothing left without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_override_on_a_running_service() {
    let server = RedisServer::start();
    let service = redguard_tests::connect(&server).await;
    let env = vec![("REDGUARD_REDIS_URL", server.url())];
    tenant(&service, "acme").check().await.unwrap();
    let set = |key: &'static str, burst: &'static str| {
        let env = env.clone();
        async move {
            let args = [
                "--json", "quota", "set", SCOPE, key, "--rate", "100/h", "--burst", burst, "--ttl",
                "1h",
            ];
            json(&redguard(env, &args).await)
        }
    };
    let set_prefix = set("tenant:*", "3").await;
    assert_eq!(
        set_prefix["key"].as_str().map(|k| k.ends_with(":tenant:*")),
        Some(true)
    );
    for id in ["acme", "globex"] {
        let d = tenant(&service, id).decide().await.unwrap();
        assert!(d.allowed && d.limit == 3, "{id}: {d:?}");
    }
    set("tenant:acme", "5").await;
    assert_eq!(tenant(&service, "acme").peek().await.unwrap().limit, 5);
    assert_eq!(tenant(&service, "globex").peek().await.unwrap().limit, 3);
    let got = json(&redguard(env.clone(), &["--json", "quota", "get", SCOPE, "tenant:*"]).await);
    assert_eq!(got["rate"], "100/3600s");
    assert_eq!(got["burst"], 3);
    let list = json(&redguard(env.clone(), &["--json", "quota", "list", SCOPE]).await);
    assert_eq!(list["overrides"].as_array().unwrap().len(), 2, "{list}");
    for key in ["tenant:*", "tenant:acme"] {
        let cleared = ok(&redguard(env.clone(), &["quota", "clear", SCOPE, key]).await);
        assert!(cleared.contains("cleared"), "{cleared}");
    }
    assert_eq!(tenant(&service, "globex").peek().await.unwrap().limit, 1);
    let none = ok(&redguard(env.clone(), &["quota", "get", SCOPE, "tenant:*"]).await);
    assert!(none.contains("no override"), "{none}");
    server.assert_every_key_has_ttl();
}

/// Every override key in the server.
fn overrides(server: &RedisServer) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*:quota")
        .query(&mut server.connection())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_nothing_is_written() {
    let server = RedisServer::start();
    let service = redguard_tests::connect(&server).await;
    tenant(&service, "acme").check().await.unwrap();
    let env = vec![("REDGUARD_REDIS_URL", server.url())];
    let cases: &[(&[&str], &str)] = &[
        (&["--rate", "0/s", "--ttl", "1h"], "rate"),
        (&["--rate", "2000000000/s", "--ttl", "1h"], "maximum"),
        (&["--rate", "10/31d", "--ttl", "1h"], "30 days"),
        (&["--rate", "ten/s", "--ttl", "1h"], "rate"),
        (&["--rate", "10/s", "--burst", "0", "--ttl", "1h"], "burst"),
        (
            &["--rate", "10/s", "--burst", "2000000000", "--ttl", "1h"],
            "burst",
        ),
        (&["--rate", "10/s", "--ttl", "0s"], "TTL"),
        (&["--rate", "10/s", "--ttl", "400d"], "permanent"),
        (&["--rate", "10/s", "--ttl", "soon"], "--ttl"),
    ];
    for (extra, why) in cases {
        let mut args = vec!["quota", "set", SCOPE, "tenant:acme"];
        args.extend_from_slice(extra);
        let stderr = refused(&redguard(env.clone(), &args).await);
        assert!(stderr.contains(why), "{extra:?}: {stderr}");
    }
    let keys: &[(&str, &str, &str)] = &[
        ("api::unused", "tenant:acme", "no rate limit of scope"),
        (SCOPE, "tenant:a*b*", "contains"),
        (SCOPE, "tenant:{acme}*", "contains"),
        (SCOPE, "tenant:{acme}", "key"),
        ("bad scope", "tenant:acme", "scope"),
    ];
    for (scope, key, why) in keys {
        let args = ["quota", "set", scope, key, "--rate", "10/s", "--permanent"];
        let stderr = refused(&redguard(env.clone(), &args).await);
        assert!(stderr.contains(why), "{scope} {key}: {stderr}");
    }
    // Neither a TTL nor `--permanent`: a usage error (clap's exit status 2).
    let out = redguard(
        env.clone(),
        &["quota", "set", SCOPE, "tenant:acme", "--rate", "10/s"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(overrides(&server).is_empty(), "{:?}", overrides(&server));
    assert_eq!(tenant(&service, "acme").peek().await.unwrap().limit, 1);
}

/// The services' ACL user (the guide's line) cannot set an override: the scope check needs
/// `SCAN`, one of the operator's grants, so Redis refuses before anything is written. The
/// operator's user (the services' line plus the operations page's grants) can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_credential_sets_an_override() {
    let server = RedisServer::start();
    let service = redguard_tests::connect(&server).await;
    tenant(&service, "acme").check().await.unwrap();
    let url = common::acl_users(&server);
    let set = [
        "quota",
        "set",
        SCOPE,
        "tenant:acme",
        "--rate",
        "10/s",
        "--ttl",
        "1h",
    ];
    let stderr = refused(&redguard(vec![("REDGUARD_REDIS_URL", url("svc"))], &set).await);
    assert!(
        stderr.to_lowercase().contains("noperm") || stderr.contains("permission"),
        "{stderr}"
    );
    assert!(overrides(&server).is_empty());
    ok(&redguard(vec![("REDGUARD_REDIS_URL", url("operator"))], &set).await);
    assert_eq!(overrides(&server).len(), 1);
    let d = tenant(&service, "acme").decide().await.unwrap();
    assert_eq!(d.limit, 10);
    // A prefix override too, and the services' user decides with it (the script reads the
    // prefix hash with the grants of the guide's line).
    let prefix = [
        "quota", "set", SCOPE, "tenant:*", "--rate", "20/s", "--ttl", "1h",
    ];
    ok(&redguard(vec![("REDGUARD_REDIS_URL", url("operator"))], &prefix).await);
    let as_service = redguard::Redguard::redis(url("svc"))
        .connect()
        .await
        .unwrap();
    let d = tenant(&as_service, "globex").decide().await.unwrap();
    assert!(d.allowed && d.limit == 20, "{d:?}");
    assert_eq!(tenant(&as_service, "acme").peek().await.unwrap().limit, 10);
    server.assert_every_key_has_ttl();
}
