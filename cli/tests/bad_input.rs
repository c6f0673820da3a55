//! The `redguard` binary under bad input: a metrics page that is not what `/metrics` should
//! be, and arguments that are not what the commands take. It never panics (exit 101), it
//! answers 0 (done), 1 (refused: `redguard: <why>` on stderr) or 2 (bad usage), and a
//! refusal writes nothing to the store.

use std::process::Output;

use redguard_tests::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Runs the binary against `server` with `args`.
async fn redguard(server: &RedisServer, args: Vec<String>) -> Output {
    let url = server.url();
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_redguard"));
        for var in [
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
        cmd.env("REDGUARD_REDIS_URL", url)
            .args(&args)
            .output()
            .expect("run redguard")
    })
    .await
    .expect("join")
}

/// Serves `response` (raw bytes, written in the pieces given) to one request; the page's URL.
async fn serve_once(pieces: Vec<Vec<u8>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await;
        for piece in pieces {
            if socket.write_all(&piece).await.is_err() {
                return;
            }
            let _ = socket.flush().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    url
}

/// A chunked page whose chunk boundary falls inside `é`: the old hand-written decoder sliced
/// the text there and panicked (exit 101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_reads_a_chunked_page_split_inside_a_character() {
    let server = RedisServer::start();
    let body = "# HELP redguard_lock_acquired_total Locks acquired (caf\u{e9}).\n\
                redguard_lock_acquired_total{scope=\"caf\u{e9}\"} 7\n";
    let split = body.find('\u{e9}').unwrap() + 1; // between the two bytes of é
    let (first, second) = body.as_bytes().split_at(split);
    let mut page =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for chunk in [first, second] {
        page.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        page.extend_from_slice(chunk);
        page.extend_from_slice(b"\r\n");
    }
    page.extend_from_slice(b"0\r\n\r\n");
    let url = serve_once(vec![page]).await;
    let out = redguard(
        &server,
        vec!["--json".into(), "stats".into(), "--metrics-url".into(), url],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sample = &stats["metrics"][0];
    assert_eq!(sample["name"], "redguard_lock_acquired_total", "{stats}");
    assert_eq!(sample["labels"], "scope=\"caf\u{e9}\"", "{stats}");
    assert_eq!(sample["value"], "7", "{stats}");
}

/// Every key in the server and its value (`DUMP`, TTL aside): what a refusal must not change.
fn snapshot(conn: &mut redis::Connection) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(conn).unwrap();
            (key, value.unwrap_or_default())
        })
        .collect()
}

/// A held lock, a PROCESSING record and a charged rate limit in scope `shop`, made through
/// the store (no watchdog renews the lock, so nothing changes by itself).
fn state(rt: &tokio::runtime::Runtime, rg: &redguard::Redguard) {
    use redguard::__private::store::{Acquire, Begin};
    use redguard::{key::GuardKind, key::KeyBuilder};
    rt.block_on(async {
        let lock = rg
            .key(
                GuardKind::Lock,
                "shop",
                &KeyBuilder::new().text("stock:SK-1").finish().unwrap(),
            )
            .unwrap();
        let _ = redguard::__private::store::of(rg)
            .lock_acquire(Acquire {
                key: &lock,
                owner: "holder-1",
                lease: std::time::Duration::from_secs(120),
                level: 1,
                waiting: false,
                replicas: None,
            })
            .await
            .unwrap();
        let record = rg
            .key(
                GuardKind::Idempotency,
                "shop",
                &KeyBuilder::new().text("order:1").finish().unwrap(),
            )
            .unwrap();
        let _ = redguard::__private::store::of(rg)
            .idem_begin(Begin {
                key: &record,
                owner: "exec-1",
                fingerprint: "fp",
                ttl: std::time::Duration::from_secs(600),
                replicas: None,
            })
            .await
            .unwrap();
        let _ = redguard::limiter("export")
            .scope("shop")
            .rate("1/h")
            .on(rg)
            .decide()
            .await
            .unwrap();
    });
}

/// One argument: a flag of some command, a value that means something to one, or anything.
fn argument() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        prop::sample::select(vec![
            "inspect",
            "scan",
            "unlock",
            "forget",
            "reset",
            "refund",
            "stats",
            "deny",
            "add",
            "list",
            "remove",
            "top",
            "--admitted",
            "--window",
            "-n",
            "usage",
            "--reason",
            "--ttl",
            "--force",
            "idem",
            "lock",
            "rate",
            "raw",
            "--json",
            "--scope",
            "-s",
            "--raw",
            "--owner",
            "--units",
            "--limit",
            "--rate",
            "--burst",
            "--algorithm",
            "--cost",
            "--metrics-url",
            "--help",
            "-h",
            "--version",
            "--",
            "-",
            "",
        ])
        .prop_map(str::to_owned),
        prop::sample::select(vec![
            "shop",
            "stock:SK-1",
            "order:1",
            "limiter",
            "export",
            "holder-1",
            "exec-1",
            "redguard:lock:{shop:stock:SK-1}",
            "redguard:idem:{shop:order:1}",
            "redguard:rate:{shop:export}",
            "redguard:rate:{shop:export}:block",
            "redguard:lock:{shop:stock:SK-1}:sem",
            "redguard:lock:{a b}",
            "sessions:42",
            "*",
            "export*",
            "10.0.0.0/8",
            "2001:db8::/32",
            "10.0.0.0/33",
            "1h",
            "0s",
            "0",
            "1",
            "-1",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999",
            "5/s",
            "0/s",
            "1/0s",
            "100/min",
            "gcra",
            "sliding_log",
            "token_bucket",
            "nope",
            "http://127.0.0.1:1/metrics",
            "http://",
            "http://[::1",
            "https://x/metrics",
            "http://256.0.0.1/",
            "ftp://x",
            "{",
            "}",
            "{}",
            "a:{b}",
            "\u{e9}\u{1F600}",
        ])
        .prop_map(str::to_owned),
        // Anything an OS argument can hold (no NUL).
        "[^\u{0}]{0,40}",
        "[ -~]{0,600}",
    ]
}

/// Any argument list: exit 0, 1 (with `redguard: ` on stderr) or 2 (usage), never a panic
/// (101) or a signal, and a refusal (1 or 2) leaves every key as it was.
/// `PROPTEST_CASES=N` runs N cases (default 256, about 3 s).
#[test]
fn any_arguments_exit_0_1_or_2_and_a_refusal_writes_nothing() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // No `top` tally: its flusher's write a second after a call would land between two
    // snapshots.
    let rg = rt
        .block_on(
            redguard::Redguard::redis(server.url())
                .top_tally(false)
                .connect(),
        )
        .expect("connect to the test redis-server");
    state(&rt, &rg);
    let conn = std::cell::RefCell::new(server.connection());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let url = server.url();
    let args = prop::collection::vec(argument(), 0..7);
    let result = runner.run(&args, |args| {
        let before = snapshot(&mut conn.borrow_mut());
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redguard"))
            .env_remove("REDIS_URL")
            .env_remove("REDGUARD_PREFIX")
            .env_remove("RUST_LOG")
            .env("REDGUARD_REDIS_URL", &url)
            .args(&args)
            .output()
            .expect("run redguard");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        prop_assert!(
            matches!(code, Some(0..=2)),
            "exit {code:?} for {args:?}\n{stderr}"
        );
        if code == Some(1) {
            prop_assert!(
                stderr.lines().any(|line| line.starts_with("redguard: ")),
                "exit 1 without `redguard: <why>` for {args:?}\n{stderr}"
            );
        }
        if code != Some(0) {
            prop_assert_eq!(
                before,
                snapshot(&mut conn.borrow_mut()),
                "a refusal wrote, for {:?}",
                args
            );
        } else if before != snapshot(&mut conn.borrow_mut()) {
            // A repair that did what it was told: put the state back for the next cases
            // (a deny entry that was added would refuse the state's own rate limit).
            let mut denies: Vec<String> = redis::cmd("KEYS")
                .arg("redguard:rate:*:deny")
                .query(&mut *conn.borrow_mut())
                .unwrap();
            denies.push("redguard:rate:deny-list".to_owned());
            let _: () = redis::cmd("DEL")
                .arg(&denies)
                .query(&mut *conn.borrow_mut())
                .unwrap();
            state(&rt, &rg);
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    server.assert_every_key_has_ttl();
}
