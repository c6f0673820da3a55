//! Who `ClientIp` says a client is (issue 25, finding 9): one subscriber's IPv6 network is one
//! bucket, a forwarded entry with a port is its address, and no header value makes a key the
//! key rules refuse or a panic.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use proptest::prelude::*;
use redguard::http::{ClientIp, KeyExtractor as _, RateLimitLayer};
use redguard::{Redguard, key::KeyBuilder};
use tower::ServiceExt as _;

fn app(rg: &Redguard, ip: ClientIp) -> Router {
    let layer = RateLimitLayer::builder(ip)
        .limit("ip", "1/h")
        .on(rg)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer)
}

fn request(peer: &str, xff: Option<&str>) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    if let Some(xff) = xff {
        request
            .headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
    }
    request
        .extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    request
}

async fn admitted(app: &Router, requests: impl IntoIterator<Item = Request<Body>>) -> usize {
    let mut admitted = 0;
    for request in requests {
        let status = app.clone().oneshot(request).await.unwrap().status();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}"
        );
        admitted += usize::from(status == StatusCode::OK);
    }
    admitted
}

/// Twenty addresses of one /64 (what one subscriber owns) got twenty admissions of `1/h`
/// before: the key was the whole address.
async fn one_ipv6_network_is_one_bucket(rg: Redguard) {
    let app = app(&rg, ClientIp::peer());
    let same_net = (1..=20).map(|host| request(&format!("[2001:db8:0:7::{host:x}]:443"), None));
    assert_eq!(admitted(&app, same_net).await, 1);
    // The next /64 is another subscriber.
    assert_eq!(
        admitted(&app, [request("[2001:db8:0:8::1]:443", None)]).await,
        1
    );

    // A /56 per subscriber, as some providers assign.
    let wide = self::app(&rg, ClientIp::peer().ipv6_prefix(56).unwrap());
    let subnets = (0..20).map(|net| request(&format!("[2001:db8:1:{net:x}::1]:443"), None));
    assert_eq!(admitted(&wide, subnets).await, 1);
    assert_eq!(
        admitted(&wide, [request("[2001:db8:1:100::1]:443", None)]).await,
        1
    );
}

/// IPv4 stays one bucket per address, whether it arrives as IPv4 or IPv4-mapped IPv6.
async fn ipv4_clients_are_their_address(rg: Redguard) {
    let app = app(&rg, ClientIp::peer());
    let clients = (1..=20).map(|host| request(&format!("192.0.2.{host}:443"), None));
    assert_eq!(admitted(&app, clients).await, 20);
    assert_eq!(
        admitted(&app, [request("[::ffff:192.0.2.1]:443", None)]).await,
        0
    );
}

/// Behind a proxy that writes ports, every client shared the proxy's bucket before: the entry
/// `198.51.100.7:5678` was garbage, so the walk stopped at the trusted hop.
async fn forwarded_entries_with_ports_are_their_address(rg: Redguard) {
    let app = app(&rg, ClientIp::behind(["10.0.0.0/8"]).unwrap());
    let clients =
        (1..=10).map(|host| request("10.0.0.2:1", Some(&format!("198.51.100.{host}:5678"))));
    assert_eq!(admitted(&app, clients).await, 10);
    let v6 = (1..=10).map(|net| {
        request(
            "10.0.0.2:1",
            Some(&format!("[2001:db8:{net:x}::1]:443, 10.0.0.9:80")),
        )
    });
    assert_eq!(admitted(&app, v6).await, 10);
    // The same clients again, with other ports or none: their buckets are used up.
    let again = [
        request("10.0.0.3:1", Some("198.51.100.1")),
        request("10.0.0.3:1", Some("198.51.100.2:1")),
        request("10.0.0.3:1", Some("[2001:db8:1::2]")),
        request("10.0.0.3:1", Some("2001:db8:2::3")),
    ];
    assert_eq!(admitted(&app, again).await, 0);
}

mod memory {
    #[tokio::test]
    async fn one_ipv6_network_is_one_bucket() {
        super::one_ipv6_network_is_one_bucket(redguard::Redguard::memory()).await;
    }
    #[tokio::test]
    async fn ipv4_clients_are_their_address() {
        super::ipv4_clients_are_their_address(redguard::Redguard::memory()).await;
    }
    #[tokio::test]
    async fn forwarded_entries_with_ports_are_their_address() {
        super::forwarded_entries_with_ports_are_their_address(redguard::Redguard::memory()).await;
    }
}

mod redis {
    #[tokio::test]
    async fn one_ipv6_network_is_one_bucket() {
        let server = redguard_tests::RedisServer::start();
        super::one_ipv6_network_is_one_bucket(redguard_tests::connect(&server).await).await;
        server.assert_every_key_has_ttl();
    }
    #[tokio::test]
    async fn forwarded_entries_with_ports_are_their_address() {
        let server = redguard_tests::RedisServer::start();
        let rg = redguard_tests::connect(&server).await;
        super::forwarded_entries_with_ports_are_their_address(rg).await;
        server.assert_every_key_has_ttl();
    }
}

fn parts(peer: SocketAddr, xff: &[Vec<u8>]) -> axum::http::request::Parts {
    let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
    for value in xff {
        if let Ok(value) = axum::http::HeaderValue::from_bytes(value) {
            parts.headers.append("x-forwarded-for", value);
        }
    }
    parts.extensions.insert(peer);
    parts
}

/// Entries as proxies and attackers write them: addresses, ports, brackets, junk.
fn hop() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<IpAddr>().prop_map(|ip| ip.to_string()),
        any::<SocketAddr>().prop_map(|addr| addr.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
        Just("unknown".to_owned()),
        "[ -~]{0,40}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary header bytes never panic, and every key is one the key rules accept; the
    /// client is always the peer or an address the headers named.
    #[test]
    fn any_header_gives_a_valid_key(
        peer in any::<SocketAddr>(),
        lines in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(hop(), 0..5).prop_map(|hops| hops.join(", ").into_bytes()),
                proptest::collection::vec(any::<u8>(), 0..60),
            ],
            0..4,
        ),
        trust_all in any::<bool>(),
        bits in 1u8..=128,
    ) {
        let trusted: &[&str] = if trust_all { &["0.0.0.0/0", "::/0"] } else { &["10.0.0.0/8"] };
        let ip = ClientIp::behind(trusted).unwrap().ipv6_prefix(bits).unwrap();
        let parts = parts(peer, &lines);
        let key = ip.extract(&parts).expect("a request with a peer has a key");
        prop_assert!(
            KeyBuilder::new().part("ip", &key).finish().is_ok(),
            "key {key:?} breaks the key rules"
        );
        let client = ip.client(&parts).unwrap();
        let named = client == peer.ip().to_canonical()
            || lines.iter().any(|line| {
                String::from_utf8_lossy(line).contains(&client.to_string())
                    || String::from_utf8_lossy(line).contains(&client.to_canonical().to_string())
            });
        prop_assert!(named, "client {client} is neither the peer nor in the headers");
    }
}

#[test]
fn ipv6_prefix_out_of_range_is_a_config_error() {
    for bits in [0, 129, 255] {
        let err = ClientIp::peer().ipv6_prefix(bits).unwrap_err();
        assert!(matches!(err, redguard::Error::Config(_)), "{err:?}");
    }
}
