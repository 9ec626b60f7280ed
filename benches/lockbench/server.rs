//! The bench's own redis-server: the release module loaded, 127.0.0.1 only, a
//! free port, its own temporary directory, no automatic saves. Killed on drop.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::resp::{Conn, Reply};

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
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
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

fn free_port() -> io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
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

pub struct Server {
    child: Option<Child>,
    pub port: u16,
    opts: Options,
    starts: usize,
}

impl Server {
    pub fn start(opts: &Options) -> io::Result<Server> {
        let mut server = Server {
            child: None,
            port: 0,
            opts: opts.clone(),
            starts: 0,
        };
        server.spawn()?;
        Ok(server)
    }

    pub fn log_path(&self) -> PathBuf {
        self.opts.dir.join(format!("redis-{}.log", self.starts))
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut last_err = None;
        for _ in 0..5 {
            self.starts += 1;
            let port = free_port()?;
            let log = self.log_path();
            let mut cmd = if self.opts.callgrind {
                let mut c = Command::new("valgrind");
                // Count only a request's own work: reading and executing it
                // (readQueryFromClient, which runs the command and its
                // propagation) and writing its reply (the pending-writes
                // handler in beforeSleep); not the server's cron, its
                // incremental rehashing or active expiry, whose share of a
                // step depends on how long the step took.
                c.arg("--tool=callgrind")
                    .arg("--instr-atstart=no")
                    .arg("--collect-atstart=no")
                    .arg("--toggle-collect=readQueryFromClient")
                    .arg("--toggle-collect=handleClientsWithPendingWritesUsingThreads")
                    .arg("--toggle-collect=handleClientsWithPendingWrites")
                    .arg(format!(
                        "--callgrind-out-file={}",
                        self.opts.dir.join("callgrind.out").display()
                    ))
                    .arg("redis-server");
                c
            } else {
                Command::new("redis-server")
            };
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(&self.opts.dir)
                .args([
                    "--dbfilename",
                    "dump.rdb",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(["--daemonize", "no", "--enable-debug-command", "yes"])
                .arg("--logfile")
                .arg(&log)
                .args(&self.opts.extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(module) = &self.opts.module {
                cmd.arg("--loadmodule").arg(module);
            }
            let child = cmd.spawn().map_err(|e| {
                io::Error::other(format!("cannot start redis-server (is it on PATH?): {e}"))
            })?;
            self.child = Some(child);
            self.port = port;
            match self.wait_ready() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    self.kill();
                    let tail = fs::read_to_string(&log).unwrap_or_default();
                    if !tail.contains("Address already in use") {
                        return Err(io::Error::other(format!(
                            "redis-server did not start: {e}\n{tail}"
                        )));
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    return Err(io::Error::other(format!("redis-server exited: {status}")));
                }
            }
            if let Ok(mut c) = Conn::connect(self.port) {
                if let Ok(Reply::Str(s)) = c.cmd(&[b"PING"]) {
                    if s == b"PONG" {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("no PONG before the start-up deadline"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn conn(&self) -> io::Result<Conn> {
        Conn::connect(self.port)
    }

    /// Stops the server without saving and starts it again on the same
    /// directory, so it loads `dump.rdb`. Returns the new log's path.
    pub fn restart(&mut self) -> io::Result<PathBuf> {
        if let Ok(mut c) = self.conn() {
            let _ = c.cmd(&[b"SHUTDOWN", b"NOSAVE"]);
        }
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        self.spawn()?;
        Ok(self.log_path())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
