//! README's "Try it" section, run as written (issue 13, part 4). The commands and the expected
//! session are read from README.md itself, so the two cannot drift apart:
//!
//! - each command of an `sh` block runs through `sh -c` from the workspace root, in an
//!   environment without the service's settings (`PORT`, `ORDER_DB`, `REDGUARD_REDIS_URL`,
//!   `REDIS_URL`, its secrets and trusted proxies) or what cargo sets for a test, as a newcomer's shell would be. One
//!   substitution: the Redis URL `redis://127.0.0.1:6379` becomes a `redis-server` of the
//!   test's own (on a free port, like every test here); that command runs twice, and the
//!   second process must replay the first one's order. `scripts/test` is not run from here:
//!   it is what CI runs (`.ci/run`), this test included. A command the test does not know
//!   fails it;
//! - `cargo run -p order-service -- --dev` is started, and the `console` session's commands run
//!   against it; each output is compared with README's: the status line, the headers README
//!   shows (a header it shows somewhere in the session must be absent where it does not),
//!   and the JSON body, with `fence` (a fencing token: Redis's clock in µs, or a counter)
//!   matched loosely — any number, the same wherever README shows the same one;
//! - the service is started a second time and the session must give the same result (each
//!   run starts with a fresh database).
//!
//! The commands in the prose below the session (several instances on one database, the load
//! generator) have placeholders and need Redis; `tests/service.rs` runs the same programs
//! with those settings.
//!
//! The session needs README's port (8080): concurrent runs of this test on one machine take
//! turns through a lock file, and a port taken by something else fails the test, naming it.

mod session;

use std::fs::File;
use std::io::Read;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use redguard_tests::RedisServer;

use self::session::Session;

/// The settings a fresh shell does not have; README's commands assume none is set.
const SETTINGS: [&str; 9] = [
    "PORT",
    "ORDER_DB",
    "REDGUARD_REDIS_URL",
    "REDIS_URL",
    "AUTH_SECRET",
    "ADMIN_TOKEN",
    "PAYMENT_SECRET",
    "TRUSTED_PROXIES",
    "BIND",
];

/// README's Redis, replaced by the test's own.
const README_REDIS: &str = "redis://127.0.0.1:6379";
/// A first `cargo run` may build the program.
const BUILD: Duration = Duration::from_secs(20 * 60);
/// A curl of the session.
const REQUEST: Duration = Duration::from_secs(30);

/// What cargo sets for this test process (the package's manifest and metadata, its binaries)
/// that a shell does not have. Inherited by a nested `cargo run`, it would also reach build
/// scripts that watch such variables (ring's watches `CARGO_MANIFEST_DIR`), which would then
/// rebuild for the nested run and again for the next `cargo test`.
fn set_by_cargo(name: &str) -> bool {
    name == "CARGO"
        || name == "OUT_DIR"
        || name.starts_with("CARGO_MANIFEST_")
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || name.starts_with("CARGO_CRATE_")
        || name.starts_with("CARGO_PRIMARY_")
        || name.starts_with("CARGO_TARGET_TMPDIR")
}

#[test]
fn try_it_runs_as_written() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("read README.md");
    let mut service = None;
    let mut session = None;
    for block in try_it(&readme) {
        match block.lang.as_str() {
            "console" => session = Some(Session::parse(&block.text)),
            "sh" => {
                for command in commands(&block.text) {
                    if command.starts_with("cargo run -p order-service") {
                        service = Some(command);
                    } else if command == "scripts/test" {
                        let ci = std::fs::read_to_string(workspace().join(".ci/run"))
                            .expect("read .ci/run");
                        assert!(
                            ci.contains("exec scripts/test"),
                            ".ci/run must run scripts/test"
                        );
                    } else if command.contains("cargo run -p quickstart") {
                        quickstart(&command);
                    } else {
                        panic!("README's Try it has a command this test does not run: {command}");
                    }
                }
            }
            other => panic!("README's Try it has a `{other}` block this test does not know"),
        }
    }
    let service = service.expect("README's Try it starts the order service");
    let session = session.expect("README's Try it has a curl session");
    let port = session.port();
    let _turn = PortTurn::take(port);
    for run in ["first", "second"] {
        let running = Background::start(&service, port);
        let mismatches = session.replay(|command| run_to_end(command, REQUEST).1);
        drop(running);
        assert!(
            mismatches.is_empty(),
            "the {run} run of README's session differs from README:\n{}",
            mismatches.join("\n")
        );
    }
}

/// Runs a quickstart command; it must succeed on the store it names.
fn quickstart(command: &str) {
    let redis = command.contains(README_REDIS).then(RedisServer::start);
    let command = match &redis {
        Some(server) => command.replace(
            README_REDIS,
            &format!("redis://127.0.0.1:{}", server.port()),
        ),
        None => command.to_owned(),
    };
    let (status, output) = run_to_end(&command, BUILD);
    assert!(status.success(), "`{command}` failed ({status}):\n{output}");
    let store = if redis.is_some() { "redis" } else { "memory" };
    assert!(
        output.contains(&format!("store = {store}")),
        "`{command}` did not run on {store}:\n{output}"
    );
    if redis.is_some() {
        // "shares its state across processes": a second process replays the first's order.
        let (status, output) = run_to_end(&command, BUILD);
        assert!(
            status.success() && output.contains("attempt 1: order 1001 (replayed: true)"),
            "a second `{command}` did not replay the first one's order ({status}):\n{output}"
        );
    }
}

/// A fenced block of README.
struct Block {
    lang: String,
    text: String,
}

/// The fenced blocks of README's "Try it" section.
fn try_it(readme: &str) -> Vec<Block> {
    let start = readme
        .find("\n## Try it\n")
        .expect("README has a `## Try it` section");
    let section = &readme[start + 1..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for line in section.lines() {
        match (open.as_mut(), line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(Block {
                    lang: lang.trim().to_owned(),
                    text: String::new(),
                });
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// The commands of an `sh` block: its non-empty lines that are not comments.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// `sh -c command` from the workspace root, without the service's settings, its own process
/// group (so it is stopped whole), stdout and stderr to `log`.
fn shell(command: &str, log: &File) -> Child {
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(command)
        .current_dir(workspace())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log.try_clone().expect("log file"));
    for name in SETTINGS {
        shell.env_remove(name);
    }
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo) {
            shell.env_remove(name);
        }
    }
    shell.spawn().expect("run sh")
}

/// Runs `command` to its end (killed after `bound`): its status, and stdout and stderr.
fn run_to_end(command: &str, bound: Duration) -> (ExitStatus, String) {
    let log = tempfile::tempfile().expect("a temp file");
    let mut child = shell(command, &log);
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sh") {
            break status;
        }
        if Instant::now() > deadline {
            stop_group(&mut child);
            panic!(
                "`{command}` did not finish within {bound:?}:\n{}",
                read(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, read(&log))
}

fn read(log: &File) -> String {
    let mut log = log.try_clone().expect("log file");
    std::io::Seek::rewind(&mut log).expect("rewind the log");
    let mut text = String::new();
    log.read_to_string(&mut text).expect("read the log");
    text
}

/// A command left running (the service), stopped with its whole process group on drop.
struct Background {
    child: Child,
    port: u16,
    log: File,
}

impl Background {
    /// Starts `command` and waits until something listens on `port`.
    fn start(command: &str, port: u16) -> Background {
        assert!(
            !listening(port),
            "port {port}, which README's session uses, is taken by another program"
        );
        let log = tempfile::tempfile().expect("a temp file");
        let mut running = Background {
            child: shell(command, &log),
            port,
            log: log.try_clone().expect("log file"),
        };
        let deadline = Instant::now() + BUILD;
        while !listening(port) {
            let exited = running.child.try_wait().expect("wait for sh");
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "`{command}` did not start listening on {port} ({exited:?}):\n{}",
                read(&log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        running
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        stop_group(&mut self.child);
        // The program is killed, not reaped by us: wait until its socket is closed, so the
        // next start does not take it for the new one listening.
        let deadline = Instant::now() + Duration::from_secs(10);
        while listening(self.port) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The fresh database the run made in the temp dir, named in its start-up line
        // ("... (store: memory, database: /tmp/orders-….db)").
        let log = read(&self.log);
        let named = log.lines().find_map(|line| {
            let path = line.split_once(", database: ")?.1.strip_suffix(')')?;
            path.starts_with(std::env::temp_dir().to_str()?)
                .then_some(path)
        });
        if let Some(db) = named {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{db}{suffix}"));
            }
        }
    }
}

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// SIGKILLs the process group `child` leads (sh, cargo, the program) and reaps `child`.
fn stop_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

/// This process's turn at README's port: concurrent runs of this test (other checkouts on
/// one machine) wait for each other instead of colliding.
struct PortTurn {
    _lock: File,
}

impl PortTurn {
    fn take(port: u16) -> PortTurn {
        let path = std::env::temp_dir().join(format!("redguard-readme-port-{port}.lock"));
        let lock = File::create(&path).expect("create the port lock file");
        lock.lock().expect("lock the port lock file");
        PortTurn { _lock: lock }
    }
}
