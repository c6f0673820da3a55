//! Deny lists of rate limits (issue 47): `redguard::admin`'s `deny_*` on memory, a single
//! node (also with declared keys), Sentinel's master and, for exact keys (kept beside their
//! limit, in its slot), a Cluster; read by the deciding script in the same call, so one
//! handle's entry refuses another handle's next call before its limit is read: nothing
//! charged, the state key untouched (absent for a key never admitted). Prefixes and networks
//! are refused on a Cluster.

use std::time::Duration;

use redguard::admin::{Admin, MAX_DENY_PATTERNS, QuotaTtl, ScanSelect};

use redguard::rate::{Algorithm, Limiter};
use redguard::{Error, Redguard, key::GuardKind};
use redguard_tests::RedisServer;

const SCOPE: &str = "api::deny";
const HOUR: QuotaTtl = QuotaTtl::For(Duration::from_secs(3600));

/// The cases of exact keys, which a Cluster serves too.
macro_rules! on_deny_stores_and_cluster {
    ($($case:ident),* $(,)?) => {
        on_deny_stores!($($case),*);
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = ::redguard_tests::RedisCluster::start();
                    let one = cluster.connect().await;
                    let other = cluster.connect().await;
                    super::$case(one, other, None).await;
                    cluster.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

macro_rules! on_deny_stores {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let rg = ::redguard::Redguard::memory();
                    super::$case(rg.clone(), rg, None).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = ::redguard_tests::RedisServer::start();
                    let one = ::redguard_tests::connect(&server).await;
                    let other = ::redguard_tests::connect(&server).await;
                    super::$case(one, other, Some(&server)).await;
                    server.assert_every_key_has_ttl();
                }
            )*
        }
        mod declared {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = ::redguard_tests::RedisServer::start();
                    let one = ::redguard_tests::declared::connect(&server).await;
                    let other = ::redguard_tests::declared::connect(&server).await;
                    super::$case(one, other, Some(&server)).await;
                    ::redguard_tests::declared::assert_none_undeclared(&server);
                }
            )*
        }
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let sentinel = ::redguard_tests::RedisSentinel::start_small();
                    let one = sentinel.connect().await;
                    let other = sentinel.connect().await;
                    super::$case(one, other, None).await;
                    sentinel.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

on_deny_stores_and_cluster!(
    an_entry_added_on_one_handle_refuses_on_another_without_touching_the_limit,
    an_entry_lapses_with_its_ttl,
    a_permanent_exact_entry_is_kept_365_days,
    bad_entries_are_refused_and_nothing_is_written,
);

mod patterns {
    use super::*;

    on_deny_stores!(
        prefix_and_cidr_entries_match_ipv4_and_ipv6,
        the_pattern_list_is_bounded,
    );
}

fn limiter(rg: &Redguard, body: &str, algorithm: Algorithm) -> Limiter {
    redguard::limiter(body)
        .scope(SCOPE)
        .rate("100/min")
        .algorithm(algorithm)
        .on(rg)
}

fn tenant(rg: &Redguard, id: &str) -> Limiter {
    limiter(rg, &format!("tenant:{id}"), Algorithm::Gcra)
}

/// The raw value and expiry of every key whose name contains `part`, but the deny entries
/// (`:deny` companions): the limit's own keys.
fn raw(server: Option<&RedisServer>, part: &str) -> Vec<(String, Option<String>, i64)> {
    let Some(server) = server else {
        return Vec::new();
    };
    let mut conn = server.connection();
    let mut keys: Vec<String> = server
        .keys()
        .into_iter()
        .filter(|k| k.contains(part) && !k.ends_with(":deny"))
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let v: Option<String> = ::redis::cmd("GET").arg(&k).query(&mut conn).ok().flatten();
            let t: i64 = ::redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query(&mut conn)
                .unwrap();
            (k, v, t)
        })
        .collect()
}

fn assert_denied<T: std::fmt::Debug>(result: redguard::Result<T>, reason: Option<&str>) {
    match result {
        Err(Error::Denied { reason: got, .. }) => assert_eq!(got.as_deref(), reason),
        other => panic!("expected Denied, got {other:?}"),
    }
}

/// One handle adds, the other's next call is refused: on GCRA (rate_gcra.lua) and on a
/// window algorithm (rate_check.lua), nothing charged and the stored state untouched; a key
/// never admitted gets no state at all. Removing the entry restores the limit.
async fn an_entry_added_on_one_handle_refuses_on_another_without_touching_the_limit(
    one: Redguard,
    other: Redguard,
    server: Option<&RedisServer>,
) {
    let admin = Admin::new(one);
    let gcra = || tenant(&other, "acme");
    let window = || limiter(&other, "tenant:acme-w", Algorithm::FixedWindow);
    gcra().check().await.unwrap();
    window().check().await.unwrap();
    let (gcra_left, window_left) = (
        gcra().peek().await.unwrap().remaining,
        window().peek().await.unwrap().remaining,
    );
    let before = raw(server, "tenant:acme");
    let added = admin
        .deny_add(SCOPE, "tenant:acme", Some("abuse report 17"), HOUR)
        .await
        .unwrap();
    assert_eq!(added.entry, "tenant:acme");
    admin
        .deny_add(SCOPE, "tenant:acme-w", None, HOUR)
        .await
        .unwrap();
    for _ in 0..3 {
        assert_denied(gcra().check().await, Some("abuse report 17"));
        assert_denied(window().check().await, None);
        assert!(matches!(gcra().decide().await, Err(Error::Denied { .. })));
    }
    assert_eq!(gcra().peek().await.unwrap().remaining, gcra_left);
    assert_eq!(window().peek().await.unwrap().remaining, window_left);
    assert_eq!(
        raw(server, "tenant:acme"),
        before,
        "the limit's state is untouched"
    );
    // Another key of the scope is not denied.
    tenant(&other, "globex").check().await.unwrap();

    // A key that was never admitted gets no state: only its entry is written.
    admin
        .deny_add(SCOPE, "tenant:newco", None, HOUR)
        .await
        .unwrap();
    assert_denied(tenant(&other, "newco").check().await, None);
    assert!(raw(server, "tenant:newco").is_empty());

    let listed = admin.deny_list(SCOPE).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.entry.as_str()).collect();
    assert_eq!(names, ["tenant:acme", "tenant:acme-w", "tenant:newco"]);
    assert_eq!(listed[0].reason.as_deref(), Some("abuse report 17"));
    assert!(listed[0].expires_in_ms.is_some_and(|ms| ms > 3_500_000));
    // The entries are their limits' `:deny` companions, which the admin tools name as such.
    let state = admin
        .key(GuardKind::RateLimit, SCOPE, "tenant:acme")
        .unwrap();
    let companion = format!("{}:deny", state.as_str());
    assert_eq!(admin.raw_key(&companion).unwrap().as_str(), state.as_str());
    let report = admin
        .scan(&ScanSelect::guard(GuardKind::RateLimit).scope(SCOPE))
        .await
        .unwrap();
    let companions = report.groups.iter().find(|g| g.role == "deny");
    assert_eq!(companions.map(|g| g.count), Some(3), "{report:?}");

    for entry in ["tenant:acme", "tenant:acme-w", "tenant:newco"] {
        assert!(admin.deny_remove(SCOPE, entry).await.unwrap(), "{entry}");
    }
    assert!(!admin.deny_remove(SCOPE, "tenant:acme").await.unwrap());
    gcra().check().await.unwrap();
    window().check().await.unwrap();
    tenant(&other, "newco").check().await.unwrap();
    assert!(admin.deny_list(SCOPE).await.unwrap().is_empty());
}

/// Prefixes, and networks over the http layer's client-IP keys: IPv4 addresses, and IPv6
/// blocks (`2001-db8-0-7--_64`), denied when the whole block is in the network.
async fn prefix_and_cidr_entries_match_ipv4_and_ipv6(
    one: Redguard,
    other: Redguard,
    _server: Option<&RedisServer>,
) {
    let admin = Admin::new(one);
    let ip = |body: &str| limiter(&other, body, Algorithm::Gcra);
    let bucket = |body: &str| limiter(&other, body, Algorithm::TokenBucket);
    ip("ip:198.51.100.1").check().await.unwrap();
    for entry in ["10.0.0.0/8", "2001:db8::/32", "203.0.113.7/32", "bots:*"] {
        admin
            .deny_add(SCOPE, entry, Some("net"), QuotaTtl::Permanent)
            .await
            .unwrap();
    }
    for denied in [
        "ip:10.1.2.3",
        "10.255.255.255",
        "ip:203.0.113.7",
        "ip:2001-db8-0-7--_64",
        "2001-db8--1_128",
        "bots:crawler",
    ] {
        assert_denied(ip(denied).check().await, Some("net"));
        // rate_check.lua's path: the same key, whose state is never read.
        assert_denied(bucket(denied).check().await, Some("net"));
    }
    for admitted in [
        "ip:11.1.2.3",
        "ip:203.0.113.8",
        "ip:2001-db9-0-7--_64",
        // A block wider than the network is not all in it.
        "ip:2001--_16",
        "ip:10-0-0-1",
        "bot:crawler",
        "tenant:10.1.2.3x",
    ] {
        ip(admitted).check().await.unwrap();
    }
    // Entries as written back: the network with its host bits cleared.
    admin
        .deny_add(SCOPE, "192.0.2.77/24", None, HOUR)
        .await
        .unwrap();
    let listed: Vec<String> = admin
        .deny_list(SCOPE)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.entry)
        .collect();
    assert_eq!(
        listed,
        [
            "10.0.0.0/8",
            "192.0.2.0/24",
            "2001:db8::/32",
            "203.0.113.7/32",
            "bots:*"
        ]
    );
    assert_denied(ip("192.0.2.1").check().await, None);
    // Permanent entries: removed, so every key keeps a TTL.
    for entry in listed {
        assert!(admin.deny_remove(SCOPE, &entry).await.unwrap(), "{entry}");
    }
    ip("ip:10.1.2.3").check().await.unwrap();
}

async fn an_entry_lapses_with_its_ttl(
    one: Redguard,
    other: Redguard,
    _server: Option<&RedisServer>,
) {
    let admin = Admin::new(one);
    tenant(&other, "acme").check().await.unwrap();
    admin
        .deny_add(
            SCOPE,
            "tenant:acme",
            None,
            QuotaTtl::For(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_denied(tenant(&other, "acme").check().await, None);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    tenant(&other, "acme").check().await.unwrap();
    assert!(admin.deny_list(SCOPE).await.unwrap().is_empty());
}

/// An exact key's entry always has a TTL (every key does): "permanent" is the longest, 365
/// days, shown as such and renewed by adding it again. Left in place: the harness checks
/// every key has a TTL.
async fn a_permanent_exact_entry_is_kept_365_days(
    one: Redguard,
    other: Redguard,
    _server: Option<&RedisServer>,
) {
    const YEAR_MS: u64 = 365 * 86_400_000;
    let admin = Admin::new(one);
    tenant(&other, "acme").check().await.unwrap();
    let added = admin
        .deny_add(SCOPE, "tenant:acme", None, QuotaTtl::Permanent)
        .await
        .unwrap();
    assert_eq!(added.expires_in_ms, Some(YEAR_MS));
    let listed = admin.deny_list(SCOPE).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0]
            .expires_in_ms
            .is_some_and(|ms| ms <= YEAR_MS && ms > YEAR_MS - 60_000),
        "{listed:?}"
    );
    assert_denied(tenant(&other, "acme").check().await, None);
}

/// Prefixes and networks (walked on every call) are bounded at `MAX_DENY_PATTERNS`; one more
/// is refused with nothing written, replacing an entry is not one more, and a removal makes
/// room. Exact keys, kept each beside its limit, are not bounded.
async fn the_pattern_list_is_bounded(
    one: Redguard,
    other: Redguard,
    _server: Option<&RedisServer>,
) {
    let admin = Admin::new(one);
    // A state that outlives the adds: the scope stays in use.
    redguard::limiter("anchor")
        .scope(SCOPE)
        .rate("1/h")
        .on(&other)
        .check()
        .await
        .unwrap();
    let entry = |i: usize| format!("tenant:p{i}:*");
    let max = MAX_DENY_PATTERNS;
    for i in 0..max {
        admin.deny_add(SCOPE, &entry(i), None, HOUR).await.unwrap();
    }
    let err = admin
        .deny_add(SCOPE, &entry(max), None, HOUR)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("deny entries are set already")),
        "{err}"
    );
    // An exact key is not one more pattern.
    admin
        .deny_add(SCOPE, "tenant:t0", None, HOUR)
        .await
        .unwrap();
    admin
        .deny_add(SCOPE, &entry(0), Some("again"), HOUR)
        .await
        .unwrap();
    assert!(admin.deny_remove(SCOPE, &entry(1)).await.unwrap());
    admin
        .deny_add(SCOPE, &entry(max), None, HOUR)
        .await
        .unwrap();
    assert_eq!(admin.deny_list(SCOPE).await.unwrap().len(), max + 1);
    assert_denied(tenant(&other, "t0").check().await, None);
    assert_denied(tenant(&other, &format!("p{max}:x")).check().await, None);
    assert_denied(tenant(&other, "p0:x").check().await, Some("again"));
    tenant(&other, "t1").check().await.unwrap();
    tenant(&other, "p1:x").check().await.unwrap();
}

async fn bad_entries_are_refused_and_nothing_is_written(
    one: Redguard,
    other: Redguard,
    _server: Option<&RedisServer>,
) {
    let admin = Admin::new(one);
    tenant(&other, "acme").check().await.unwrap();
    for entry in [
        "",
        "tenant acme",
        "tenant:{x}",
        "10.0.0.0/33",
        "::/129",
        "a*b",
    ] {
        assert!(
            admin.deny_add(SCOPE, entry, None, HOUR).await.is_err(),
            "{entry:?}"
        );
    }
    for reason in ["two\nlines", &"x".repeat(201)] {
        assert!(
            admin
                .deny_add(SCOPE, "tenant:acme", Some(reason), HOUR)
                .await
                .is_err()
        );
    }
    for ttl in [Duration::ZERO, Duration::from_secs(400 * 86_400)] {
        assert!(
            admin
                .deny_add(SCOPE, "tenant:acme", None, QuotaTtl::For(ttl))
                .await
                .is_err()
        );
    }
    // A scope no limit uses: a typo.
    assert!(
        admin
            .deny_add("api::nothing", "tenant:acme", None, HOUR)
            .await
            .is_err()
    );
    assert!(admin.deny_list(SCOPE).await.unwrap().is_empty());
    tenant(&other, "acme").check().await.unwrap();
}

/// On a Cluster, prefixes and networks are refused (they name keys in every slot; the script
/// reads the limit's), with nothing written; exact keys work there (the `cluster` cases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_lists_are_refused_on_a_cluster() {
    let cluster = redguard_tests::RedisCluster::start();
    let rg = cluster.connect().await;
    tenant(&rg, "acme").check().await.unwrap();
    let admin = Admin::new(rg.clone());
    for entry in ["tenant:*", "10.0.0.0/8"] {
        let err = admin.deny_add(SCOPE, entry, None, HOUR).await.unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("Cluster")),
            "{err}"
        );
        assert!(admin.deny_remove(SCOPE, entry).await.is_err());
    }
    assert!(admin.deny_list(SCOPE).await.unwrap().is_empty());
    tenant(&rg, "acme").check().await.unwrap();
    cluster.assert_every_key_has_ttl();
}

/// A denied GCRA check is refused by the lean script in the call that would have decided it
/// (one script call, not a second through rate_check.lua: a denied call costs no more than an
/// admitted one), and in coalesced batches each check gets its own answer and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_check_is_one_script_call_and_batches_answer_each() {
    let server = RedisServer::start();
    // No tally: its flusher's calls would be counted too.
    let rg = Redguard::redis(server.url())
        .top_tally(false)
        .connect()
        .await
        .unwrap();
    let admin = Admin::new(rg.clone());
    tenant(&rg, "acme").check().await.unwrap();
    admin
        .deny_add(SCOPE, "tenant:acme", Some("abuse 17"), HOUR)
        .await
        .unwrap();
    admin
        .deny_add(SCOPE, "tenant:bad*", None, HOUR)
        .await
        .unwrap();
    let before = redguard_tests::faults::script_calls(&server);
    assert_denied(tenant(&rg, "acme").check().await, Some("abuse 17"));
    assert_denied(tenant(&rg, "bad-1").check().await, None);
    tenant(&rg, "good").check().await.unwrap();
    assert_eq!(redguard_tests::faults::script_calls(&server) - before, 3);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let rg = rg.clone();
        tasks.spawn(async move {
            let id = match i % 3 {
                0 => "acme".to_owned(),
                1 => format!("bad-{i}"),
                _ => format!("ok-{i}"),
            };
            (i, tenant(&rg, &id).check().await)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        match joined.unwrap() {
            (i, result) if i % 3 == 0 => assert_denied(result, Some("abuse 17")),
            (i, result) if i % 3 == 1 => assert_denied(result, None),
            (i, result) => assert!(result.is_ok(), "{i}: {result:?}"),
        }
    }
    server.assert_every_key_has_ttl();
}

mod layer {
    use super::*;

    /// The http layer answers a denied client `403` with `"error": "denied"` (not `429`:
    /// retrying does not help) and no `Retry-After`; IPv4 and IPv6 clients by network.
    async fn the_layer_answers_a_denied_client_403(rg: Redguard) {
        use axum::body::Body;
        use http_body_util::BodyExt as _;
        use redguard::http::{ClientIp, RateLimitLayer};
        use tower::ServiceExt as _;

        let layer = RateLimitLayer::builder(ClientIp::peer())
            .limit("ip", "100/min")
            .scope("web")
            .on(&rg)
            .build()
            .unwrap();
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .layer(layer);
        let call = |peer: std::net::SocketAddr| {
            let app = app.clone();
            async move {
                let request = axum::http::Request::get("/")
                    .extension(peer)
                    .body(Body::empty())
                    .unwrap();
                app.oneshot(request).await.unwrap()
            }
        };
        let v4 = |last: u8| std::net::SocketAddr::from(([198, 51, 100, last], 1000));
        let v6 = |seg: u16| std::net::SocketAddr::from(([0x2001, 0xdb8, 0, seg, 0, 0, 0, 1], 1000));
        assert_eq!(call(v4(1)).await.status(), 200);
        let admin = Admin::new(rg.clone());
        admin
            .deny_add("web.ip", "198.51.100.0/25", Some("scraper"), HOUR)
            .await
            .unwrap();
        admin
            .deny_add("web.ip", "2001:db8:0:7::/64", None, HOUR)
            .await
            .unwrap();
        for peer in [v4(1), v4(127), v6(7)] {
            let refused = call(peer).await;
            assert_eq!(refused.status(), 403, "{peer}");
            assert!(refused.headers().get("retry-after").is_none());
            let body = refused.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["error"], "denied", "{body}");
            assert!(
                !body.to_string().contains("scraper"),
                "the reason stays in logs: {body}"
            );
        }
        for peer in [v4(128), v6(8)] {
            assert_eq!(call(peer).await.status(), 200, "{peer}");
        }
    }

    redguard_tests::on_memory_and_redis!(the_layer_answers_a_denied_client_403);
}
