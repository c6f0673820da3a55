//! The guide's on-call session (`runtime/docs/operations.md`), run as written: the commands of its `console` block after
//! `<!-- redguard-session -->`, against a Redis where a stuck request holds SK-1's stock
//! lock, compared with the output shown (any word with a digit in it — owner ids, fences,
//! times — matches any other such word).

use std::time::Duration;

use redguard_tests::RedisServer;

const SCOPE: &str = "order_service::orders::reserve_stock";

/// The session's commands and the output shown after each.
fn session() -> Vec<(String, String)> {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/docs/operations.md"
    ))
    .expect("read runtime/docs/operations.md");
    let (_, after) = guide
        .split_once("<!-- redguard-session -->")
        .expect("the guide has the on-call session");
    let block = after
        .split_once("```console\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("a console block")
        .0;
    let mut steps: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => steps.push((command.to_owned(), String::new())),
            None => {
                let (_, output) = steps.last_mut().expect("output after a command");
                output.push_str(line);
                output.push('\n');
            }
        }
    }
    steps
}

fn shape(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .map(|word| {
                    if word.chars().any(|c| c.is_ascii_digit()) {
                        "#"
                    } else {
                        word
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_call_session_runs_as_shown() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    // A request stuck in the database: it holds the lock, and its watchdog keeps renewing it.
    let stuck = rg
        .lock("stock:SK-1")
        .scope(SCOPE)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut printed = String::new();
    let mut differ = Vec::new();
    for (command, expected) in session() {
        let words: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(words[0], "redguard", "{command}");
        let output = tokio::task::spawn_blocking({
            let url = server.url();
            let args: Vec<String> = words[1..].iter().map(|w| (*w).to_owned()).collect();
            move || {
                std::process::Command::new(env!("CARGO_BIN_EXE_redguard"))
                    .env_remove("REDIS_URL")
                    .env_remove("REDGUARD_PREFIX")
                    .env_remove("REDGUARD_REDIS_CLUSTER_URLS")
                    .env("REDGUARD_REDIS_URL", url)
                    .env("RUST_LOG", "off")
                    .args(args)
                    .output()
                    .expect("run redguard")
            }
        })
        .await
        .unwrap();
        let actual = String::from_utf8(output.stdout).unwrap();
        printed.push_str(&format!("$ {command}\n{actual}"));
        assert!(
            output.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if shape(&actual) != shape(&expected) {
            differ.push(format!(
                "`{command}` printed:\n{actual}the guide shows:\n{expected}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{}\nthe session as it ran:\n{printed}",
        differ.join("\n")
    );
    // Freed safely: the next holder's token is above the stuck one's.
    let next = rg.lock("stock:SK-1").scope(SCOPE).acquire().await.unwrap();
    assert!(next.fence() > stuck.fence());
    next.release().await.unwrap();
    drop(stuck);
    server.assert_every_key_has_ttl();
}
