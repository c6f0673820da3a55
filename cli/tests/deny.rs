//! `redguard deny add/list/remove` as an operator runs it, against a running service (a
//! library handle standing for another instance): an entry added by the binary refuses the
//! service's next call on a matching key; bad input exits non-zero and writes nothing.

use std::process::Output;

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
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

fn tenant(rg: &Redguard, id: &str) -> redguard::rate::Limiter {
    redguard::limiter(redguard::key("tenant:{id}").part("id", id))
        .scope(SCOPE)
        .rate("10/min")
        .on(rg)
}

/// A service's handle that writes no `top` tally: its flusher's write a second after a call
/// would land between two snapshots.
async fn untallied(server: &RedisServer) -> Redguard {
    Redguard::redis(server.url())
        .top_tally(false)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Every key and its value (`DUMP`): what a refusal must not change.
fn snapshot(server: &RedisServer) -> Vec<(String, Vec<u8>)> {
    let mut conn = server.connection();
    let mut keys = server.keys();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value: Option<Vec<u8>> = ::redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
            (key, value.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_list_remove_refuses_the_services_next_call() {
    let server = RedisServer::start();
    let env = vec![("REDGUARD_REDIS_URL", server.url())];
    let service = untallied(&server).await;
    tenant(&service, "acme").check().await.unwrap();

    let added = json(
        &redguard(
            env.clone(),
            &[
                "--json",
                "deny",
                "add",
                SCOPE,
                "tenant:acme",
                "--ttl",
                "1h",
                "--reason",
                "abuse",
            ],
        )
        .await,
    );
    assert_eq!(added["entry"], "tenant:acme", "{added}");
    assert_eq!(added["reason"], "abuse", "{added}");
    match tenant(&service, "acme").check().await {
        Err(Error::Denied { reason, .. }) => assert_eq!(reason.as_deref(), Some("abuse")),
        other => panic!("expected Denied, got {other:?}"),
    }
    // Without --ttl: a day.
    ok(&redguard(env.clone(), &["deny", "add", SCOPE, "10.0.0.0/8"]).await);
    let listed = ok(&redguard(env.clone(), &["deny", "list", SCOPE]).await);
    assert!(listed.contains("tenant:acme (expires in"), "{listed}");
    assert!(listed.contains("): abuse"), "{listed}");
    assert!(
        listed.contains("10.0.0.0/8 (expires in 23h")
            || listed.contains("10.0.0.0/8 (expires in 1d"),
        "{listed}"
    );

    let removed = ok(&redguard(env.clone(), &["deny", "remove", SCOPE, "tenant:acme"]).await);
    assert_eq!(removed, "removed\n");
    let again = ok(&redguard(env.clone(), &["deny", "remove", SCOPE, "tenant:acme"]).await);
    assert_eq!(again, "no such entry\n");
    tenant(&service, "acme").check().await.unwrap();
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_non_zero_and_writes_nothing() {
    let server = RedisServer::start();
    let env = vec![("REDGUARD_REDIS_URL", server.url())];
    let service = untallied(&server).await;
    tenant(&service, "acme").check().await.unwrap();
    let long = "x".repeat(201);
    let cases: Vec<Vec<&str>> = vec![
        vec!["deny", "add", SCOPE, "*"],
        vec!["deny", "add", SCOPE, "tenant acme"],
        vec!["deny", "add", SCOPE, "tenant:{x}"],
        vec!["deny", "add", SCOPE, "10.0.0.0/33"],
        vec!["deny", "add", SCOPE, "2001:db8::/129"],
        vec!["deny", "add", SCOPE, "tenant:*x"],
        vec!["deny", "add", SCOPE, "tenant:acme", "--ttl", "0s"],
        vec!["deny", "add", SCOPE, "tenant:acme", "--ttl", "400d"],
        vec!["deny", "add", SCOPE, "tenant:acme", "--ttl", "soon"],
        vec![
            "deny",
            "add",
            SCOPE,
            "tenant:acme",
            "--reason",
            "two\nlines",
        ],
        vec!["deny", "add", SCOPE, "tenant:acme", "--reason", &long],
        vec!["deny", "add", "api::nothing", "tenant:acme"],
        vec![
            "deny",
            "add",
            SCOPE,
            "tenant:acme",
            "--ttl",
            "1h",
            "--permanent",
        ],
        vec!["deny", "add", SCOPE],
        vec!["deny", "remove", SCOPE, "a b"],
        vec!["deny", "list"],
        vec!["deny", "nope"],
    ];
    for args in cases {
        let before = snapshot(&server);
        let out = redguard(env.clone(), &args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?}\n{stderr}",
            out.status
        );
        if out.status.code() == Some(1) {
            assert!(stderr.contains("redguard: "), "{args:?}: {stderr}");
        }
        assert_eq!(before, snapshot(&server), "{args:?} wrote");
    }
    // `*` with --force is what it says.
    ok(&redguard(
        env.clone(),
        &["deny", "add", SCOPE, "*", "--force", "--ttl", "1h"],
    )
    .await);
    assert!(matches!(
        tenant(&service, "globex").check().await,
        Err(Error::Denied { .. })
    ));
    ok(&redguard(env.clone(), &["deny", "remove", SCOPE, "*"]).await);
    tenant(&service, "globex").check().await.unwrap();
}

/// The services' ACL user (the guide's line) cannot change a deny list: the scope check needs
/// `SCAN`, one of the operator's grants, so Redis refuses before anything is written. The
/// operator's user can, and the services' user is then refused by an exact entry and by a
/// prefix (its script reads both with the grants of the guide's line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_operator_credential_changes_a_deny_list() {
    let server = RedisServer::start();
    let service = untallied(&server).await;
    tenant(&service, "acme").check().await.unwrap();
    let url = common::acl_users(&server);
    let as_svc = vec![("REDGUARD_REDIS_URL", url("svc"))];
    let as_operator = vec![("REDGUARD_REDIS_URL", url("operator"))];
    for args in [
        &["deny", "add", SCOPE, "tenant:acme", "--ttl", "1h"][..],
        &["deny", "add", SCOPE, "tenant:*", "--ttl", "1h"],
    ] {
        let before = snapshot(&server);
        let out = redguard(as_svc.clone(), args).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.to_lowercase().contains("noperm") || stderr.contains("permission"),
            "{stderr}"
        );
        assert_eq!(snapshot(&server), before, "{args:?}");
    }
    let as_service = Redguard::redis(url("svc")).connect().await.unwrap();
    tenant(&as_service, "acme").check().await.unwrap();

    ok(&redguard(as_operator.clone(), &["deny", "add", SCOPE, "tenant:acme"]).await);
    assert!(matches!(
        tenant(&as_service, "acme").check().await,
        Err(Error::Denied { .. })
    ));
    tenant(&as_service, "globex").check().await.unwrap();
    ok(&redguard(as_operator.clone(), &["deny", "add", SCOPE, "tenant:glob*"]).await);
    assert!(matches!(
        tenant(&as_service, "globex").check().await,
        Err(Error::Denied { .. })
    ));
    // Nor can it remove one.
    let out = redguard(as_svc, &["deny", "remove", SCOPE, "tenant:acme"]).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(matches!(
        tenant(&as_service, "acme").check().await,
        Err(Error::Denied { .. })
    ));
    server.assert_every_key_has_ttl();
}
