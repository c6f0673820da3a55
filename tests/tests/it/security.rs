//! Transport and credentials: `rediss://` against a server with a test certificate, and a
//! password in the URL.

use std::time::Duration;

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;

#[tokio::test]
async fn tls_with_a_trusted_ca_works_and_an_untrusted_server_is_refused() {
    let server = RedisServer::start_tls();
    let rg = Redguard::redis(server.tls_url())
        .tls_root_ca(server.ca_pem())
        .connect()
        .await
        .expect("connect over TLS");
    let token = rg
        .tokens()
        .issue("tls", Duration::from_secs(60))
        .await
        .unwrap();
    rg.tokens().consume("tls", &token).await.unwrap();
    assert_eq!(
        server.keys().len(),
        1,
        "the token went through the TLS port"
    );

    // Without the test CA the server's certificate is not trusted.
    let untrusted = Redguard::redis(server.tls_url())
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(matches!(untrusted, Err(Error::Backend(_))), "{untrusted:?}");
}

#[tokio::test]
async fn password_in_the_url_authenticates() {
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut server.connection())
        .unwrap();
    let url = format!("redis://:s3cret@127.0.0.1:{}/", server.port());
    let rg = Redguard::redis(url).connect().await.expect("authenticated");
    rg.tokens()
        .issue("auth", Duration::from_secs(60))
        .await
        .unwrap();
    let wrong = Redguard::redis(format!("redis://:nope@127.0.0.1:{}/", server.port()))
        .connect()
        .await;
    assert!(matches!(wrong, Err(Error::Backend(_))), "{wrong:?}");
    // Errors never echo the password.
    assert!(!format!("{wrong:?}").contains("nope"));
}

/// Sentinel handles take the data nodes' credentials apart from the URL-less sentinel
/// addresses: the right ones authenticate, wrong ones fail to connect within the connect
/// timeout, and neither the builder's `Debug` nor the error shows the password.
#[tokio::test]
async fn sentinel_node_credentials_authenticate_and_stay_secret() {
    let mut sentinel = redguard_tests::RedisSentinel::start_small();
    let master = sentinel.master();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">right-s3cret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut sentinel.node(master).connection())
        .unwrap();
    let rg = sentinel
        .builder()
        .node_auth("app", "right-s3cret")
        .connect()
        .await
        .expect("authenticated");
    rg.tokens()
        .issue("auth", Duration::from_secs(60))
        .await
        .unwrap();
    let builder = sentinel
        .builder()
        .node_auth("app", "wrong-s3cret")
        .connect_timeout(Duration::from_secs(1));
    assert!(!format!("{builder:?}").contains("wrong-s3cret"));
    let started = std::time::Instant::now();
    let wrong = builder.connect().await;
    assert!(matches!(wrong, Err(Error::Backend(_))), "{wrong:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!format!("{wrong:?}").contains("wrong-s3cret"));
}
