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
