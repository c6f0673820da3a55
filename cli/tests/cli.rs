//! The `redguard` binary against real Redis servers (and a Cluster for `scan`), each
//! subcommand as an operator runs it: state made by the library, read and repaired by the
//! built binary, checked through its JSON and its text.

use std::process::Output;
use std::time::Duration;

use redguard::__private::store::{Begin, Finish, IdemBegin, IdemFinish};
use redguard::admin::Admin;
use redguard::{key::GuardKind, key::KeyBuilder, rate::Algorithm};
use redguard_tests::{RedisCluster, RedisServer};
use serde_json::Value;

mod common;
use common::redguard;

const SCOPE: &str = "shop::orders::reserve_stock";

fn on(server: &RedisServer) -> Vec<(&'static str, String)> {
    vec![("REDGUARD_REDIS_URL", server.url())]
}

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

async fn inspect_json(server: &RedisServer, guard: &str, key: &str, extra: &[&str]) -> Value {
    let mut args = vec!["--json", "inspect", guard, key, "--scope", SCOPE];
    args.extend_from_slice(extra);
    json(&redguard(on(server), &args).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_decodes_every_lock_kind() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let lock = || rg.lock("stock:SK-1").scope(SCOPE);
    let held = lock().acquire().await.unwrap();
    let seen = inspect_json(&server, "lock", "stock:SK-1", &[]).await;
    let first = &seen["locks"][0];
    assert_eq!(first["kind"], "exclusive");
    assert_eq!(first["fence"], held.fence());
    assert_eq!(first["depth"], 1);
    assert!(first["lease_left_ms"].as_u64().unwrap() > 20_000);
    assert!(first["held_for_ms"].as_u64().unwrap() < 10_000);
    let text = ok(&redguard(on(&server), &["inspect", "lock", "stock:SK-1", "-s", SCOPE]).await);
    for line in [
        "kind          exclusive",
        "held          yes, by ",
        "since",
        "lease left",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert!(
        text.contains(&format!("fence         {}", held.fence())),
        "{text}"
    );

    let fair = lock().fair().acquire().await.unwrap();
    let a = lock().permits(2).acquire().await.unwrap();
    let r = lock().read().acquire().await.unwrap();
    let seen = inspect_json(&server, "lock", "stock:SK-1", &[]).await;
    let kinds: Vec<&str> = seen["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["exclusive", "fair", "semaphore", "read_write"]);
    assert_eq!(seen["locks"][1]["fence"], fair.fence());
    assert_eq!(seen["locks"][2]["holders"].as_array().unwrap().len(), 1);
    assert_eq!(seen["locks"][3]["holders"].as_array().unwrap().len(), 1);
    // A raw key names one kind.
    let raw = format!("redguard:lock:{{{SCOPE}:stock:SK-1}}:sem");
    let seen = json(&redguard(on(&server), &["--json", "inspect", "raw", &raw]).await);
    assert_eq!(seen["locks"].as_array().unwrap().len(), 1);
    assert_eq!(seen["locks"][0]["kind"], "semaphore");
    for guard in [held, fair, a, r] {
        guard.release().await.unwrap();
    }
    let free = ok(&redguard(on(&server), &["inspect", "lock", "stock:SK-1", "-s", SCOPE]).await);
    assert!(free.contains("no (free)"), "{free}");
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_forget_a_record() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let body = KeyBuilder::new().text("7:req-1").finish().unwrap();
    let key = rg.key(GuardKind::Idempotency, SCOPE, &body).unwrap();
    let begin = Begin {
        key: &key,
        owner: "crashed-execution",
        fingerprint: "",
        ttl: Duration::from_secs(600),
        replicas: None,
    };
    redguard::__private::store::of(&rg)
        .idem_begin(begin)
        .await
        .unwrap();
    let seen = inspect_json(&server, "idem", "7:req-1", &[]).await;
    assert_eq!(seen["record"]["status"], "processing");
    assert_eq!(seen["record"]["owner"], "crashed-execution");
    assert!(seen["record"]["ttl_ms"].as_u64().unwrap() > 590_000);
    let out = redguard(on(&server), &["forget", "-s", SCOPE, "7:req-1"]).await;
    let text = ok(&out);
    assert!(
        text.contains("forgot") && text.contains("processing"),
        "{text}"
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("WARN") && log.contains("forgotten"), "{log}");
    let seen = inspect_json(&server, "idem", "7:req-1", &[]).await;
    assert!(seen.get("record").is_none(), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reset_and_refund_every_algorithm() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    for algorithm in Algorithm::ALL {
        let name = algorithm.as_str();
        let text = format!("login:{name}");
        let limiter = || {
            let l =
                redguard::limiter(redguard::key(&format!("{text}:{{ip}}")).part("ip", &"10.0.0.1"))
                    .scope(SCOPE)
                    .rate("4/min")
                    .algorithm(algorithm)
                    .block(Duration::from_secs(60))
                    .on(&rg);
            if algorithm.is_window() { l } else { l.burst(4) }
        };
        for _ in 0..3 {
            assert!(limiter().decide().await.unwrap().allowed);
        }
        let key = format!("{text}:10.0.0.1");
        let mut args = vec!["--rate", "4/min", "--algorithm", name];
        if !algorithm.is_window() {
            args.extend(["--burst", "4"]);
        }
        let seen = inspect_json(&server, "rate", &key, &args).await;
        assert_eq!(seen["rate"]["algorithm"], name, "{seen}");
        assert_eq!(seen["rate"]["used"], 3, "{name}: {seen}");
        assert_eq!(seen["decision"]["allowed"], true, "{name}: {seen}");
        assert_eq!(seen["decision"]["remaining"], 0, "{name}: {seen}");

        let out = redguard(
            on(&server),
            &["--json", "refund", "-s", SCOPE, &key, "--units", "2"],
        )
        .await;
        assert_eq!(json(&out)["count"], 2, "{name}");
        let seen = inspect_json(&server, "rate", &key, &[]).await;
        assert_eq!(seen["rate"]["used"], 1, "{name}: {seen}");
        for _ in 0..3 {
            let _ = limiter().decide().await.unwrap();
        }
        assert!(!limiter().decide().await.unwrap().allowed, "{name}");
        let seen = inspect_json(&server, "rate", &key, &[]).await;
        assert!(
            seen["rate"]["penalty_left_ms"].as_u64().unwrap() > 50_000,
            "{name}: {seen}"
        );
        let text = ok(&redguard(on(&server), &["inspect", "rate", &key, "-s", SCOPE]).await);
        assert!(text.contains("penalty left"), "{text}");

        let out = redguard(on(&server), &["reset", "-s", SCOPE, &key]).await;
        assert!(ok(&out).contains("2 key(s) deleted"), "{name}");
        assert!(limiter().decide().await.unwrap().allowed, "{name}: reset");
    }
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_frees_and_fences() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let stuck = rg.lock("stock:SK-1").scope(SCOPE).acquire().await.unwrap();
    let out = redguard(
        on(&server),
        &["--json", "unlock", "-s", SCOPE, "stock:SK-1"],
    )
    .await;
    let done = json(&out);
    assert_eq!(done["removed"], 1);
    assert_eq!(done["before"][0]["fence"], stuck.fence());
    let fence = done["fence"].as_u64().unwrap();
    assert!(fence > stuck.fence());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("WARN") && log.contains("released by force"),
        "{log}"
    );
    let next = rg.lock("stock:SK-1").scope(SCOPE).acquire().await.unwrap();
    assert!(next.fence() > fence);
    let again = ok(&redguard(
        on(&server),
        &["unlock", "-s", SCOPE, "stock:SK-1", "--owner", "x"],
    )
    .await);
    assert!(again.contains("nothing held"), "{again}");
    next.release().await.unwrap();
    drop(stuck);
    server.assert_every_key_has_ttl();
}

/// Issue 45: counts out of range are refused by the command line (exit 2, a message naming
/// the flag), before anything is read or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_counts_are_refused() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let limiter = redguard::limiter("login:10.0.0.3")
        .scope(SCOPE)
        .rate("4/min")
        .on(&rg);
    assert!(limiter.decide().await.unwrap().allowed);
    let before = inspect_json(&server, "rate", "login:10.0.0.3", &[]).await;
    for (args, flag) in [
        (
            &[
                "refund",
                "-s",
                SCOPE,
                "login:10.0.0.3",
                "--units",
                "18446744073709551615",
            ][..],
            "--units",
        ),
        (
            &["refund", "-s", SCOPE, "login:10.0.0.3", "--units", "0"],
            "--units",
        ),
        (&["scan", "--limit", "0"], "--limit"),
        (&["stats", "--limit", "0"], "--limit"),
    ] {
        let out = redguard(on(&server), args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let after = inspect_json(&server, "rate", "login:10.0.0.3", &[]).await;
    assert_eq!(before["rate"]["used"], 1, "{before}");
    assert_eq!(after["rate"]["used"], before["rate"]["used"], "{after}");
}

/// Issue 47: `usage` names the rule in force and agrees with the next call, in JSON and text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_names_the_limit_in_force() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let tenant = || {
        redguard::limiter("tenant:acme")
            .scope(SCOPE)
            .rate("4/h")
            .on(&rg)
    };
    tenant().check().await.unwrap();
    let usage = |extra: &'static [&'static str]| {
        let mut args = vec!["usage", SCOPE, "tenant:acme", "--rate", "4/h"];
        args.extend_from_slice(extra);
        let env = on(&server);
        async move { redguard(env, &args).await }
    };
    let seen = json(&usage(&["--json"]).await);
    assert_eq!(seen["source"]["rule"], "code", "{seen}");
    assert_eq!(
        (seen["used"].as_u64(), seen["burst"].as_u64()),
        (Some(1), Some(4))
    );
    assert_eq!(seen["next"]["remaining"], 2, "{seen}");
    let next = tenant().decide().await.unwrap();
    assert_eq!(next.remaining, 2);

    let quota = [
        "quota",
        "set",
        SCOPE,
        "tenant:acme",
        "--rate",
        "10/h",
        "--ttl",
        "1h",
    ];
    ok(&redguard(on(&server), &quota).await);
    let text = ok(&usage(&[]).await);
    assert!(
        text.contains("10/3600s burst 10 (set by the key's override)"),
        "{text}"
    );
    assert!(text.contains("used          2"), "{text}");
    assert!(text.contains("remaining     7"), "{text}");
    assert_eq!(tenant().decide().await.unwrap().remaining, 7);
    assert!(seen["denied"].is_null(), "{seen}");

    // A deny entry decides the next call whatever the limit says: usage names it, and the
    // next call agrees.
    let deny = ["deny", "add", SCOPE, "tenant:*", "--reason", "abuse 17"];
    ok(&redguard(on(&server), &deny).await);
    let text = ok(&usage(&[]).await);
    assert!(text.contains("DENIED by tenant:* ("), "{text}");
    assert!(text.contains("): abuse 17"), "{text}");
    let seen = json(&usage(&["--json"]).await);
    assert_eq!(seen["denied"]["entry"], "tenant:*", "{seen}");
    assert!(matches!(
        tenant().decide().await,
        Err(redguard::Error::Denied { .. })
    ));

    // Bad input: exit 2 from clap, nothing asked of the store.
    let out = redguard(on(&server), &["usage", SCOPE, "tenant:acme"]).await;
    assert_eq!(out.status.code(), Some(2));
    let out = redguard(
        on(&server),
        &["usage", SCOPE, "tenant:acme", "--rate", "fast"],
    )
    .await;
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
}

/// Issue 45: a log read through a pipe carries no ANSI colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_output_has_no_colour() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let _stuck = rg.lock("stock:SK-2").scope(SCOPE).acquire().await.unwrap();
    // A forced unlock logs at warn: the one line coloured at a terminal.
    let out = redguard(on(&server), &["unlock", "-s", SCOPE, "stock:SK-2"]).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("released by force"), "{log}");
    assert!(!log.contains("\x1b["), "{log:?}");
    assert!(!ok(&out).contains("\x1b["));
}

/// `resolve`: an UNKNOWN record shown as such by `inspect`, refused bad input (exit 1,
/// nothing written), a live PROCESSING one refused without `--force`, and the verdicts
/// that retries then see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_an_unknown_outcome() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let store = redguard::__private::store::of(&rg);
    let record = |name: &str| {
        let body = KeyBuilder::new().text(name).finish().unwrap();
        rg.key(GuardKind::Idempotency, SCOPE, &body).unwrap()
    };
    let (unknown, live) = (record("7:req-2"), record("7:req-3"));
    for (key, owner) in [(&unknown, "timed-out"), (&live, "running")] {
        let begin = Begin {
            key,
            owner,
            fingerprint: "",
            ttl: Duration::from_secs(600),
            replicas: None,
        };
        store.idem_begin(begin).await.unwrap();
    }
    let finish = Finish {
        key: &unknown,
        owner: "timed-out",
        outcome: IdemFinish::Unknown,
        ttl: Duration::from_secs(600),
        replicas: None,
    };
    store.idem_finish(finish).await.unwrap();
    let seen = inspect_json(&server, "idem", "7:req-2", &[]).await;
    assert_eq!(seen["record"]["status"], "unknown");
    let text = ok(&redguard(on(&server), &["inspect", "idem", "7:req-2", "-s", SCOPE]).await);
    assert!(text.contains("redguard resolve"), "{text}");

    let mut conn = server.connection();
    let mut snapshot = |key: &redguard::key::Key| -> Vec<(String, String)> {
        redis::cmd("HGETALL")
            .arg(key.as_str())
            .query(&mut conn)
            .unwrap()
    };
    let before = (snapshot(&unknown), snapshot(&live));
    // Usage errors are clap's (exit 2); refusals ours (exit 1). Neither writes.
    for (args, code) in [
        (&["resolve", "-s", SCOPE, "7:req-2"][..], 2),
        (&["resolve", "-s", SCOPE, "7:req-2", "--succeeded"], 2),
        (&["resolve", "-s", SCOPE, "7:req-2", "--value", "1"], 2),
        (
            &[
                "resolve",
                "-s",
                SCOPE,
                "7:req-2",
                "--failed",
                "--succeeded",
                "--value",
                "1",
            ],
            2,
        ),
        (
            &[
                "resolve",
                "-s",
                SCOPE,
                "7:req-2",
                "--succeeded",
                "--value",
                "{not json",
            ],
            1,
        ),
        (&["resolve", "-s", SCOPE, "7:req-3", "--failed"], 1),
        (&["resolve", "-s", SCOPE, "7:nothing-here", "--failed"], 1),
        (&["resolve", "-s", SCOPE, "7:{bad}", "--failed"], 1),
        (&["resolve", "--raw", "redguard:lock:{a:b}", "--failed"], 1),
    ] {
        let out = redguard(on(&server), args).await;
        assert_eq!(out.status.code(), Some(code), "{args:?}");
    }
    let after = (snapshot(&unknown), snapshot(&live));
    assert_eq!(after, before, "a refused resolve wrote");

    let out = redguard(
        on(&server),
        &[
            "--json",
            "resolve",
            "-s",
            SCOPE,
            "7:req-2",
            "--succeeded",
            "--value",
            r#"{"order_id":7}"#,
        ],
    )
    .await;
    let done: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(
        (&done["was"], &done["now"]),
        (&"unknown".into(), &"success".into())
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("WARN") && log.contains("resolved"), "{log}");
    let reply = store.idem_begin(Begin {
        key: &unknown,
        owner: "retry",
        fingerprint: "",
        ttl: Duration::from_secs(600),
        replicas: None,
    });
    assert_eq!(
        reply.await.unwrap(),
        IdemBegin::Done(br#"{"order_id":7}"#.to_vec())
    );

    let text = ok(&redguard(
        on(&server),
        &["resolve", "-s", SCOPE, "7:req-3", "--failed", "--force"],
    )
    .await);
    assert!(text.contains("processing -> fail"), "{text}");
    let reply = store.idem_begin(Begin {
        key: &live,
        owner: "retry",
        fingerprint: "",
        ttl: Duration::from_secs(600),
        replicas: None,
    });
    assert_eq!(reply.await.unwrap(), IdemBegin::Retrying);
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_outside_the_prefix_are_refused() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("SET")
        .arg("sessions:42")
        .arg("x")
        .arg("EX")
        .arg(60)
        .query(&mut conn)
        .unwrap();
    for args in [
        &["inspect", "raw", "sessions:42"][..],
        &["unlock", "--raw", "sessions:42"],
        &["forget", "--raw", "other:idem:{a:b}"],
        &["reset", "--raw", "redguard:rate:{a:b}:weird"],
        &["refund", "--raw", "redguard:lock:{a:b}", "--units", "1"],
        &["inspect", "lock", "stock:{SK-1}", "-s", SCOPE],
    ] {
        let out = redguard(on(&server), args).await;
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("redguard: "), "{args:?}: {err}");
    }
    // Untouched.
    let value: String = redis::cmd("GET")
        .arg("sessions:42")
        .query(&mut conn)
        .unwrap();
    assert_eq!(value, "x");
    // Another prefix is another application's keys.
    let mut env = on(&server);
    env.push(("REDGUARD_PREFIX", "shop".to_owned()));
    let out = redguard(env, &["inspect", "raw", "redguard:lock:{a:b}"]).await;
    assert!(!out.status.success());
    // No Redis configured: said so.
    let out = redguard(Vec::new(), &["scan"]).await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("REDGUARD_REDIS_URL"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_and_stats_on_a_cluster() {
    let cluster = RedisCluster::start();
    let rg = cluster.connect().await;
    let mut held = Vec::new();
    for i in 0..20 {
        held.push(
            rg.lock(format!("stock:SK-{i}").as_str())
                .scope(SCOPE)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // The keys are spread over every master.
    let masters: std::collections::HashSet<usize> = cluster
        .keys()
        .iter()
        .map(|key| cluster.master_of(key))
        .collect();
    assert!(masters.len() >= 2, "{masters:?}");
    let env = vec![("REDGUARD_REDIS_CLUSTER_URLS", cluster.urls().join(","))];
    let report = json(&redguard(env.clone(), &["--json", "scan", "lock", "-s", SCOPE]).await);
    let groups = report["groups"].as_array().unwrap();
    let exclusive = groups.iter().find(|g| g["role"] == "exclusive").unwrap();
    assert_eq!(exclusive["count"], 20, "{report}");
    assert!(
        exclusive["oldest_key"]
            .as_str()
            .unwrap()
            .starts_with("redguard:lock:{")
    );
    assert_eq!(report["truncated"], false);
    let bounded = json(&redguard(env.clone(), &["--json", "scan", "--limit", "5"]).await);
    assert_eq!(bounded["keys"], 5);
    assert_eq!(bounded["truncated"], true);
    let text = ok(&redguard(env.clone(), &["scan", "lock", "-s", SCOPE]).await);
    assert!(text.contains("40 key(s) matching"), "{text}");

    // stats: the store's numbers and a service's metrics.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let serve = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 1024];
        let _ = socket.read(&mut request).await.unwrap();
        let body = "# TYPE redguard_lock_acquired_total counter\n\
                    redguard_lock_acquired_total{scope=\"shop\"} 20\nprocess_cpu 1\n";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(response.as_bytes()).await.unwrap();
    });
    let stats = json(&redguard(env, &["--json", "stats", "--metrics-url", &url]).await);
    serve.await.unwrap();
    assert_eq!(stats["store"]["keys"], 40, "{stats}");
    assert_eq!(stats["metrics"][0]["name"], "redguard_lock_acquired_total");
    assert_eq!(stats["metrics"].as_array().unwrap().len(), 1);
    let admin = Admin::new(rg.clone());
    assert_eq!(
        admin
            .scan(&redguard::admin::ScanSelect::guard(GuardKind::Lock))
            .await
            .unwrap()
            .keys,
        40
    );
    for guard in held {
        guard.release().await.unwrap();
    }
    cluster.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_shown_not_fatal() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let lock = format!("redguard:lock:{{{SCOPE}:stock:SK-1}}");
    let idem = format!("redguard:idem:{{{SCOPE}:7:req-1}}");
    let rate = format!("redguard:rate:{{{SCOPE}:login:1}}");
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(&lock)
        .arg("x")
        .ignore()
        .cmd("EXPIRE")
        .arg(&lock)
        .arg(60)
        .ignore()
        .cmd("HSET")
        .arg(&idem)
        .arg("status")
        .arg("?")
        .ignore()
        .cmd("EXPIRE")
        .arg(&idem)
        .arg(60)
        .ignore()
        .cmd("HSET")
        .arg(&rate)
        .arg("a")
        .arg("zz")
        .ignore()
        .query(&mut conn)
        .unwrap();
    for (guard, key, problem) in [
        ("lock", "stock:SK-1", "holds a list"),
        ("idem", "7:req-1", "is not an idempotency record"),
        ("rate", "login:1", "has no TTL"),
    ] {
        let text = ok(&redguard(on(&server), &["inspect", guard, key, "-s", SCOPE]).await);
        assert!(
            text.contains("PROBLEM") && text.contains(problem),
            "{guard}: {text}"
        );
    }
}

/// The guide's ACL line for services (`runtime/docs/servers.md`), plus what its operations page
/// says an operator's user needs on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_acl_user_is_enough() {
    let server = RedisServer::start();
    let url = common::acl_users(&server)("operator");
    let rg = redguard::Redguard::redis(url.clone())
        .connect()
        .await
        .unwrap();
    let held = rg.lock("stock:SK-1").scope(SCOPE).acquire().await.unwrap();
    let env = vec![("REDGUARD_REDIS_URL", url)];
    for args in [
        &["scan"][..],
        &["inspect", "lock", "stock:SK-1", "-s", SCOPE],
        &["unlock", "stock:SK-1", "-s", SCOPE],
        &["forget", "7:req-1", "-s", SCOPE],
        &["reset", "login:1", "-s", SCOPE],
        &["refund", "login:1", "-s", SCOPE, "--units", "1"],
    ] {
        ok(&redguard(env.clone(), args).await);
    }
    drop(held);
}

/// `rediss://` with a private CA named by REDGUARD_TLS_CA, as the library reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    let server = RedisServer::start_tls();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, server.ca_pem()).unwrap();
    let env = vec![
        ("REDGUARD_REDIS_URL", server.tls_url()),
        ("REDGUARD_TLS_CA", ca.display().to_string()),
    ];
    let report = json(&redguard(env.clone(), &["--json", "scan"]).await);
    assert_eq!(report["keys"], 0);
    // Without the CA the server's certificate is not trusted.
    let out = redguard(env[..1].to_vec(), &["scan"]).await;
    assert!(!out.status.success());
}

/// Redis Sentinel named by REDGUARD_REDIS_SENTINELS, as the library reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_redis_sentinel() {
    let sentinel = redguard_tests::RedisSentinel::start_small();
    let env = vec![(
        "REDGUARD_REDIS_SENTINELS",
        sentinel.sentinel_addrs().join(","),
    )];
    let report = json(&redguard(env, &["--json", "scan"]).await);
    assert_eq!(report["keys"], 0);
}
