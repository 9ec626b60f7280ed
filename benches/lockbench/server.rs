//! How the bench starts its servers: the test harness's (tests/common), with
//! the release module (built here when stale), a temporary directory of the
//! bench's, no automatic saves, and callgrind when asked. Killed on drop.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::Conn;

/// How long a server may take to answer PING (loading 1M keys included).
const STARTUP_DEADLINE: Duration = Duration::from_secs(120);

/// The module to load: `REDIS_LOCK_MODULE`, else the release build, built
/// (`cargo build --release`) when missing or older than a source file.
pub fn module_path() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("REDIS_LOCK_MODULE") {
        let p = PathBuf::from(p);
        if !p.exists() {
            return Err(io::Error::other(format!(
                "REDIS_LOCK_MODULE={} does not exist",
                p.display()
            )));
        }
        return Ok(p);
    }
    let root = crate::root();
    let so = root.join("target/release/libredis_lock.so");
    let built = fs::metadata(&so).and_then(|m| m.modified()).ok();
    let newest_source = newest_mtime(&root.join("src"))
        .into_iter()
        .chain(fs::metadata(root.join("Cargo.toml")).and_then(|m| m.modified()))
        .max();
    let stale = match (built, newest_source) {
        (None, _) => true,
        (Some(b), Some(s)) => s > b,
        (Some(_), None) => false,
    };
    if stale {
        eprintln!("lockbench: building the release module (cargo build --release)");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--release", "--lib"])
            .current_dir(root)
            .status()?;
        if !status.success() {
            return Err(io::Error::other("cargo build --release failed"));
        }
    }
    if !so.exists() {
        return Err(io::Error::other(format!("{} was not built", so.display())));
    }
    Ok(so)
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// A fresh directory for one bench run's server files, removed on drop
/// (declare it before the `Server`, so the server is stopped first).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> io::Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("lockbench-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// How the server is run.
#[derive(Clone)]
pub struct Options {
    /// The module to load; `None`: a plain redis-server, the baseline a user
    /// compares with.
    pub module: Option<PathBuf>,
    pub dir: PathBuf,
    /// Run under `valgrind --tool=callgrind` (instrumentation off at start).
    pub callgrind: bool,
    /// Extra `--name value` arguments (e.g. `--hz 1`).
    pub extra: Vec<String>,
}

/// A connection of the harness's client, with a read timeout long enough
/// for a bench's slowest reply (a SAVE or FLUSHALL of a million keys).
pub fn connect(port: u16) -> io::Result<Conn> {
    let c = Conn::try_connect(port)?;
    c.set_read_timeout(Duration::from_secs(60))?;
    Ok(c)
}

/// The harness's server (tests/common), started as `opts` says.
pub struct Server {
    inner: common::Server,
    pub port: u16,
    /// The clock its measured steps hold still, if started with one
    /// ([`Server::start_with_clock`]).
    clock: Option<common::ShiftedClock>,
}

impl Server {
    pub fn start(opts: &Options) -> io::Result<Server> {
        Server::start_with(opts, false, None)
    }

    /// [`Server::start`], under callgrind counting the whole process (its
    /// cron and event handlers too; `opts.callgrind` is taken as set).
    pub fn start_whole(opts: &Options) -> io::Result<Server> {
        Server::start_with(opts, true, None)
    }

    /// [`Server::start`] with a clock [`Server::freeze_clock`] can hold
    /// still (tests/shims/clockshim.c, no offset).
    pub fn start_with_clock(opts: &Options) -> io::Result<Server> {
        Server::start_with(opts, false, Some(common::ShiftedClock::new(0)))
    }

    /// Whether it runs with a clock [`Server::freeze_clock`] holds.
    pub fn has_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Holds the server's clocks still (`true`) or lets them run; nothing
    /// without a clock.
    pub fn freeze_clock(&self, frozen: bool) {
        match (&self.clock, frozen) {
            (Some(c), true) => c.freeze(),
            (Some(c), false) => c.thaw(),
            (None, _) => {}
        }
    }

    fn start_with(
        opts: &Options,
        whole: bool,
        clock: Option<common::ShiftedClock>,
    ) -> io::Result<Server> {
        let mut b = common::Server::builder()
            .dir(&opts.dir)
            .startup_deadline(STARTUP_DEADLINE)
            .config("appendonly no");
        b = match &opts.module {
            Some(m) => b.module_at(m),
            None => b.without_module(),
        };
        if whole {
            b = b.callgrind_whole(&opts.dir.join("callgrind.out"));
        } else if opts.callgrind {
            b = b.callgrind(&opts.dir.join("callgrind.out"));
        }
        for pair in opts.extra.chunks(2) {
            let name = pair.first().map_or("", |n| n.trim_start_matches("--"));
            let value = pair.get(1).map_or("", String::as_str);
            b = b.config(&format!("{name} {value}"));
        }
        if let Some(c) = &clock {
            b = b.clock(c);
        }
        let inner = b.start();
        let port = inner.port;
        Ok(Server { inner, port, clock })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid().unwrap_or(0)
    }

    pub fn conn(&self) -> io::Result<Conn> {
        connect(self.port)
    }

    /// Stops the server and starts it again on the same directory and port,
    /// so it loads `dump.rdb`. Returns the log's path (one log, appended).
    pub fn restart(&mut self) -> io::Result<PathBuf> {
        self.inner
            .try_restart()
            .map_err(|e| io::Error::other(format!("redis-server did not restart: {e}")))?;
        Ok(self.inner.log_path())
    }
}
