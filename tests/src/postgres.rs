//! A real Postgres server for the transactional-outcome tests: `initdb` and `postgres` on a
//! free port in a temp dir, stopped on drop. Postgres refuses to run as root, so as root the
//! server runs as `nobody` (through `setpriv`, which execs: the child is the postmaster).
//!
//! ```no_run
//! let pg = redguard_tests::postgres::Postgres::start();
//! let url = pg.url(); // postgres://redguard@127.0.0.1:PORT/postgres, trust auth
//! # let _ = url;
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to tell someone whose machine lacks Postgres.
const INSTALL_HINT: &str = "the Postgres server binaries (initdb, postgres) were not found in \
    /usr/lib/postgresql/*/bin nor on PATH. The transactional-outcome tests start their own \
    Postgres: install it (Debian/Ubuntu: `sudo apt-get install postgresql`; scripts/test does \
    this), or point REDGUARD_PG_BIN at the directory holding initdb";

/// The unprivileged user the server runs as when the tests run as root.
const SERVER_USER: &str = "nobody";

/// A running Postgres server, stopped (fast shutdown) when dropped.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    child: Option<Child>,
    bin: PathBuf,
    // Last: removed after the server stopped.
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Whether the server binaries are there, for callers that skip Postgres rather than
    /// panic in [`Postgres::start`] (the bench).
    ///
    /// ```no_run
    /// if redguard_tests::postgres::Postgres::available() {
    ///     let _pg = redguard_tests::postgres::Postgres::start();
    /// }
    /// ```
    pub fn available() -> bool {
        bindir().is_some_and(|bin| bin.join("initdb").exists())
    }

    /// Initializes a cluster in a temp dir and starts it on a free port; panics with what to
    /// install when the binaries are missing.
    pub fn start() -> Postgres {
        let bin = bindir().unwrap_or_else(|| panic!("{INSTALL_HINT}"));
        let mut dir = tempfile::tempdir().expect("create a temp dir for postgres");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("create the data dir");
        let root = is_root();
        if root {
            // The temp dir is 0700 root's; the server's user must reach its data dir.
            chmod(dir.path(), 0o755);
            chown(&data);
        }
        let status = as_server_user(root, &bin.join("initdb"))
            .args([
                "-D",
                path_str(&data),
                "-U",
                "redguard",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run initdb");
        assert!(
            status.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        for _ in 0..5 {
            let port = crate::free_port();
            let child = as_server_user(root, &bin.join("postgres"))
                .args(["-D", path_str(&data), "-p", &port.to_string()])
                .args([
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "unix_socket_directories=",
                ])
                .args([
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn postgres");
            let mut server = Postgres {
                port,
                child: Some(child),
                bin: bin.clone(),
                dir,
            };
            if server.wait_ready() {
                return server;
            }
            server.stop();
            dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("temp dir"));
        }
        panic!("postgres did not start on any of 5 free ports");
    }

    /// The connection URL (user `redguard`, database `postgres`, no password).
    pub fn url(&self) -> String {
        format!("postgres://redguard@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(child) = &mut self.child
                && let Ok(Some(_)) = child.try_wait()
            {
                // Exited: most likely the port was taken meanwhile.
                self.child = None;
                return false;
            }
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "redguard",
                    "-q",
                ])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Fast shutdown (SIGINT: sessions end, open transactions roll back), then SIGKILL if it
    /// lingers.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where initdb is: `REDGUARD_PG_BIN`, the newest Debian `/usr/lib/postgresql/N/bin`, or PATH.
fn bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("REDGUARD_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists())
}

fn as_server_user(root: bool, program: &Path) -> Command {
    if root {
        let mut command = Command::new("setpriv");
        command.args([
            "--reuid",
            SERVER_USER,
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ]);
        command.arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .expect("chmod the temp dir");
}

fn chown(path: &Path) {
    let status = Command::new("chown")
        .args([&format!("{SERVER_USER}:nogroup"), path_str(path)])
        .status()
        .expect("run chown");
    assert!(
        status.success(),
        "chown {SERVER_USER} {} failed",
        path.display()
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}
