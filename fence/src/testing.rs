//! A PostgreSQL server for tests (feature `testing`): the one
//! `VOLCANO_TEST_PG_URL` names, or else a throwaway cluster started from
//! the system's PostgreSQL binaries and stopped when the test process
//! exits.
//!
//! ```no_run
//! let Some(pg) = volcano_fence::testing::Postgres::or_skip("my_test") else {
//!     return; // said why on stderr; with CI=true it panics instead
//! };
//! let url = pg.url(); // postgres://postgres@127.0.0.1:PORT/postgres
//! # let _ = url;
//! ```
//!
//! The cluster: `initdb` into a temporary folder (as the `postgres` user
//! when running as root), trust authentication on loopback only, a free
//! port, fsync off. One per test process, shared by its tests: give each
//! test its own schema or its own resource names. A watchdog process stops
//! it and removes the folder once the test process has exited, however it
//! exited.

use std::fmt;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A PostgreSQL server to test against.
#[derive(Debug)]
pub struct Postgres {
    url: String,
}

/// Why no PostgreSQL server is available.
#[derive(Debug, Clone)]
pub struct Unavailable(String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

static SHARED: OnceLock<Result<Postgres, Unavailable>> = OnceLock::new();

impl Postgres {
    /// The server of this test process: `VOLCANO_TEST_PG_URL` if set, else
    /// a throwaway cluster, started on first use.
    pub fn shared() -> Result<&'static Postgres, Unavailable> {
        SHARED
            .get_or_init(|| match std::env::var("VOLCANO_TEST_PG_URL") {
                Ok(url) if !url.is_empty() => Ok(Postgres { url }),
                _ => start_cluster(),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// [`Postgres::shared`] for a test named `test`: `None` (after saying
    /// on stderr that the test was skipped, and why) when there is no
    /// PostgreSQL. With `CI=true` a missing PostgreSQL panics instead: CI
    /// never skips silently.
    pub fn or_skip(test: &str) -> Option<&'static Postgres> {
        match Postgres::shared() {
            Ok(pg) => Some(pg),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("{test}: PostgreSQL is required with CI=true: {why}")
            }
            Err(why) => {
                eprintln!("skipped {test}: {why}");
                None
            }
        }
    }

    /// The server's connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

fn unavailable(what: impl Into<String>) -> Unavailable {
    Unavailable(format!(
        "{}; install PostgreSQL (apt-get install postgresql) or set VOLCANO_TEST_PG_URL",
        what.into()
    ))
}

/// Where `initdb` and `pg_ctl` are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`, else the `PATH`.
fn bin_dir() -> Result<PathBuf, Unavailable> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some(dir) = versions.pop() {
        return Ok(dir);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists());
    on_path.ok_or_else(|| {
        unavailable("no PostgreSQL binaries (initdb, pg_ctl) in pg_config --bindir, /usr/lib/postgresql/*/bin or the PATH")
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `program args...`, as the `postgres` user when running as root
/// (PostgreSQL refuses to run as root).
fn as_server_user(program: &Path, root: bool) -> Command {
    if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

fn run(mut cmd: Command, what: &str) -> Result<(), Unavailable> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| unavailable(format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(unavailable(format!(
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

fn free_port() -> Result<u16, Unavailable> {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| unavailable(format!("no free loopback port: {e}")))
}

fn start_cluster() -> Result<Postgres, Unavailable> {
    let bin = bin_dir()?;
    let root = is_root();
    let dir = tempfile::Builder::new()
        .prefix("volcano-pg-")
        .tempdir()
        .map_err(|e| unavailable(format!("no temporary folder: {e}")))?
        .keep();
    let data = dir.join("data");
    if root {
        let mut chown = Command::new("chown");
        chown.arg("postgres:").arg(&dir);
        run(chown, "chown of the cluster folder to postgres")?;
    }
    let mut initdb = as_server_user(&bin.join("initdb"), root);
    initdb.arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "--auth=trust",
        "-N",
        "-E",
        "UTF8",
        "--locale=C",
    ]);
    run(initdb, "initdb")?;
    let port = free_port()?;
    let options = format!(
        "-F -c fsync=off -c full_page_writes=off -c synchronous_commit=off \
         -c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=200",
        dir.display()
    );
    let mut pg_ctl = as_server_user(&bin.join("pg_ctl"), root);
    pg_ctl
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-t", "60", "-o", &options, "start"]);
    run(pg_ctl, "pg_ctl start")?;
    watch(&dir, &data);
    Ok(Postgres {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
    })
}

/// Starts the watchdog: once this process has exited, it stops the
/// cluster (immediate shutdown of the postmaster) and removes its folder.
fn watch(dir: &Path, data: &Path) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         kill -QUIT \"$(head -n 1 '{pidfile}')\" 2>/dev/null; sleep 1; rm -rf '{dir}'",
        pid = std::process::id(),
        pidfile = data.join("postmaster.pid").display(),
        dir = dir.display()
    );
    // Not waited for: it outlives this process by design.
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}
