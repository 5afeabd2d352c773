//! A PostgreSQL server for tests (feature `testing`): the one
//! `VOLCANO_TEST_PG_URL` names, or else a throwaway cluster started from
//! the system's PostgreSQL binaries (or those in `VOLCANO_TEST_PG_BINDIR`)
//! and stopped when the test process exits.
//!
//! ```no_run
//! let Some(pg) = volcano_fence::testing::Postgres::or_skip("my_test") else {
//!     return; // said why on stderr; with CI=true it panics instead
//! };
//! let url = pg.url(); // postgres://postgres@%2Ftmp%2Fvolcano-pg-…/postgres
//! # let _ = url;
//! ```
//!
//! The cluster: `initdb` into a temporary folder (as the `postgres` user
//! when running as root), reachable only through a Unix socket in that
//! folder (trust authentication, no TCP), fsync off. One per test process, shared by its tests: give each
//! test its own schema or its own resource names. A watchdog process stops
//! it and removes the folder once the test process has exited, however it
//! exited.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A PostgreSQL server to test against. Its `Debug` leaves out the URL,
/// which may carry a password (`VOLCANO_TEST_PG_URL`).
pub struct Postgres {
    url: String,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("url", &"[redacted]")
            .finish()
    }
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

/// Where `initdb` and `pg_ctl` are: `VOLCANO_TEST_PG_BINDIR` (to test
/// against another PostgreSQL version), else `pg_config --bindir`, else
/// the newest `/usr/lib/postgresql/*/bin`, else the `PATH`.
fn bin_dir() -> Result<PathBuf, Unavailable> {
    if let Some(dir) = std::env::var_os("VOLCANO_TEST_PG_BINDIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").exists() && dir.join("pg_ctl").exists() {
            return Ok(dir);
        }
        return Err(unavailable(format!(
            "VOLCANO_TEST_PG_BINDIR={} has no initdb and pg_ctl",
            dir.display()
        )));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    // The newest major version (compared as numbers: 17 after 9.6).
    let mut versions: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()
                .ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
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

/// The cluster's settings: fast and throwaway (no fsync), reachable only
/// through a Unix socket in its own folder (no TCP port to race for, and
/// nobody else on the machine can connect).
fn settings(dir: &Path) -> String {
    let socket_dir = dir.display().to_string().replace('\'', "''");
    format!(
        "\n# volcano_fence::testing\nfsync = off\nfull_page_writes = off\n\
         synchronous_commit = off\nlisten_addresses = ''\n\
         unix_socket_directories = '{socket_dir}'\nmax_connections = 200\n"
    )
}

/// A URL that reaches the cluster's socket in `dir`: the folder as the
/// host, percent-encoded (as libpq, sqlx and tokio-postgres read it).
fn socket_url(dir: &Path) -> String {
    let mut host = String::new();
    for byte in dir.display().to_string().bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                host.push(char::from(byte));
            }
            other => host.push_str(&format!("%{other:02X}")),
        }
    }
    format!("postgres://postgres@{host}/postgres")
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
    // First, so that the folder goes away whatever fails next; without a
    // watchdog nothing would stop the cluster, so none is started.
    if let Err(err) = watch(&dir, &data, &bin.join("pg_ctl"), root) {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(unavailable(format!(
            "could not start the cluster's watchdog (sh): {err}"
        )));
    }
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
    let conf = data.join("postgresql.conf");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&conf)
        .and_then(|mut f| std::io::Write::write_all(&mut f, settings(&dir).as_bytes()))
        .map_err(|e| unavailable(format!("could not write {}: {e}", conf.display())))?;
    let mut pg_ctl = as_server_user(&bin.join("pg_ctl"), root);
    pg_ctl
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-t", "60", "start"]);
    run(pg_ctl, "pg_ctl start")?;
    Ok(Postgres {
        url: socket_url(&dir),
    })
}

/// The watchdog's end of a pipe this process holds open for its whole
/// life: the watchdog reads EOF once this process has exited, however it
/// exited.
static LIFELINE: OnceLock<std::sync::Mutex<Vec<std::process::ChildStdin>>> = OnceLock::new();

/// Starts the watchdog, in its own process group (a Ctrl-C or a signal to
/// the test's group does not reach it): once this process has exited, it
/// stops the cluster (immediate shutdown) and removes its folder. Paths
/// are passed as arguments, never spliced into the script.
fn watch(dir: &Path, data: &Path, pg_ctl: &Path, root: bool) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    const SCRIPT: &str = r#"trap '' INT TERM HUP
read _ignored
if [ -f "$2/postmaster.pid" ]; then
  if [ "$4" = root ]; then runuser -u postgres -- "$3" -D "$2" -m immediate -w stop
  else "$3" -D "$2" -m immediate -w stop; fi
fi >/dev/null 2>&1
rm -rf "$1""#;
    let child = Command::new("sh")
        .args(["-c", SCRIPT, "volcano-pg-watchdog"])
        .arg(dir)
        .arg(data)
        .arg(pg_ctl)
        .arg(if root { "root" } else { "user" })
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    if let Some(stdin) = child?.stdin.take() {
        let lifeline = LIFELINE.get_or_init(Default::default);
        lifeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(stdin);
    }
    Ok(())
}
