//! Server processes: the module and redis-server paths, free ports, data
//! dirs, [`ServerBuilder`] / [`Server`] (killed on drop), the clock shim
//! ([`ShiftedClock`]) and replication sync.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::*;

pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_LOCK_MODULE") {
        return PathBuf::from(p);
    }
    super::repo().join("target/debug/libredis_lock.so")
}

/// `REDIS_SERVER`, else `redis-server` from `PATH`.
pub fn server_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

/// A port of 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

fn fresh_dir() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "{}-{}-{}",
        std::process::id(),
        n,
        nanos
    ));
    fs::create_dir_all(&dir).expect("create the server's temp dir");
    dir
}

/// Quotes a value for redis.conf (double quotes, backslash escapes).
fn conf_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Builds a [`Server`]: extra redis.conf lines on top of the defaults.
pub struct ServerBuilder {
    lines: Vec<String>,
    module: bool,
    save_default: bool,
    env: Vec<(String, String)>,
    args: Vec<String>,
    /// The module file, else [`module_path`].
    module_file: Option<PathBuf>,
    /// A data dir of the caller's (kept), else a fresh one.
    dir: Option<PathBuf>,
    /// A command the server runs under (valgrind).
    wrapper: Vec<String>,
    startup: Option<Duration>,
    /// A cluster node: its `cluster-port` is drawn afresh with the data port
    /// at every start attempt (a bus port drawn once may be taken by then).
    cluster_bus: bool,
}

impl ServerBuilder {
    /// One extra redis.conf line, e.g. `"appendonly yes"`.
    pub fn config(mut self, line: &str) -> Self {
        if line.trim_start().starts_with("save ") {
            self.save_default = false;
        }
        self.lines.push(line.to_string());
        self
    }

    /// Runs the server with its wall clock shifted by `clock` (which the test
    /// can step while the server runs).
    pub fn clock(mut self, clock: &ShiftedClock) -> Self {
        self.preload("clockshim");
        self.env.push((
            "CLOCKSHIM_FILE".into(),
            clock.file.to_string_lossy().into_owned(),
        ));
        self
    }

    /// Adds the shim `tests/shims/<name>.c` to the server's `LD_PRELOAD`.
    fn preload(&mut self, name: &str) {
        let lib = shim(name).to_string_lossy().into_owned();
        match self.env.iter_mut().find(|(k, _)| k == "LD_PRELOAD") {
            Some((_, v)) => *v = format!("{v}:{lib}"),
            None => self.env.push(("LD_PRELOAD".into(), lib)),
        }
    }

    /// Start a plain redis-server, without the module (for comparisons).
    pub fn without_module(mut self) -> Self {
        self.module = false;
        self
    }

    /// Loads this module file (the bench's release build) instead of
    /// [`module_path`].
    pub fn module_at(mut self, path: &Path) -> Self {
        self.module_file = Some(path.to_path_buf());
        self
    }

    /// Uses this data dir (created if needed, never removed).
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Runs the server under callgrind, instrumentation off until
    /// `callgrind_control -i on`, counting only a request's own work: reading
    /// and executing it (`readQueryFromClient`, which runs the command and its
    /// propagation) and writing its reply (the pending-writes handlers); not
    /// the server's cron, its incremental rehashing or active expiry, whose
    /// share of a step depends on how long the step took. Every such server
    /// gets the same hash seed (`tests/shims/seedshim.c`), so its hash tables
    /// lay keys and commands out alike in every run.
    pub fn callgrind(mut self, out_file: &Path) -> Self {
        self.preload("seedshim");
        self.wrapper = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            "--toggle-collect=readQueryFromClient",
            "--toggle-collect=handleClientsWithPendingWritesUsingThreads",
            "--toggle-collect=handleClientsWithPendingWrites",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--callgrind-out-file={}", out_file.display())])
        .collect();
        self
    }

    /// Runs the server under callgrind counting the whole process (its
    /// cron, timers and event handlers too), instrumentation off until
    /// `callgrind_control -i on`: what a server costs at rest, or a
    /// connection's whole life. Same hash seed as [`Self::callgrind`].
    pub fn callgrind_whole(mut self, out_file: &Path) -> Self {
        self = self.callgrind(out_file);
        self.wrapper = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=yes",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("--callgrind-out-file={}", out_file.display())])
        .collect();
        self
    }

    /// A cluster node (`cluster-enabled yes`) whose bus port is a free port
    /// of its own, drawn at each start attempt, so a high data port never
    /// overflows the bus port and a bus port taken meanwhile is retried.
    pub fn cluster_node(mut self) -> Self {
        self.cluster_bus = true;
        self.config("cluster-enabled yes")
    }

    /// How long the server may take to answer PING (loading a big file).
    pub fn startup_deadline(mut self, d: Duration) -> Self {
        self.startup = Some(d);
        self
    }

    /// Start a Sentinel (`redis-server <conf> --sentinel`, without the
    /// module); `config` adds its `sentinel ...` lines.
    pub fn sentinel(mut self) -> Self {
        self.module = false;
        self.args.push("--sentinel".into());
        self
    }

    pub fn start(self) -> Server {
        let module = if self.module {
            let path = self.module_file.clone().unwrap_or_else(module_path);
            if !path.exists() {
                panic!(
                    "the module is not built: {} does not exist. Run `cargo build` first \
                     (`make test` does it), or set REDIS_LOCK_MODULE to the module's path.",
                    path.display()
                );
            }
            Some(path)
        } else {
            None
        };
        let keep_dir = self.dir.is_some();
        let dir = match &self.dir {
            Some(d) => {
                fs::create_dir_all(d).expect("create the server's dir");
                d.clone()
            }
            None => fresh_dir(),
        };
        let mut last_err = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let mut server = Server {
                port,
                dir: dir.clone(),
                conf: dir.join("redis.conf"),
                child: None,
                keep_dir,
                env: self.env.clone(),
                args: self.args.clone(),
                wrapper: self.wrapper.clone(),
                startup: self.startup.unwrap_or_else(startup_deadline),
            };
            let mut lines = self.lines.clone();
            if self.cluster_bus {
                let bus = std::iter::repeat_with(free_port)
                    .find(|&p| p != port)
                    .unwrap_or(0);
                lines.push(format!("cluster-port {bus}"));
            }
            server.write_conf(module.as_deref(), &lines, self.save_default);
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => {
                    let log = server.log_tail(100);
                    server.keep_dir = true; // the dir is reused by the next attempt
                    if log.contains("Address already in use") {
                        last_err = e;
                        let _ = fs::remove_file(server.log_path());
                        continue;
                    }
                    drop(server);
                    panic!(
                        "redis-server did not start: {e}\n--- log ({}) ---\n{log}",
                        dir.join("redis.log").display()
                    );
                }
            }
        }
        panic!("redis-server did not start after 5 port attempts: {last_err}");
    }
}

/// One redis-server process with the module loaded.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
    keep_dir: bool,
    /// Extra environment of the process (a shifted clock).
    env: Vec<(String, String)>,
    /// Extra arguments after the configuration file (`--sentinel`).
    args: Vec<String>,
    /// The command the server runs under (valgrind), if any.
    wrapper: Vec<String>,
    startup: Duration,
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            lines: Vec::new(),
            module: true,
            save_default: true,
            env: Vec::new(),
            args: Vec::new(),
            module_file: None,
            dir: None,
            wrapper: Vec::new(),
            startup: None,
            cluster_bus: false,
        }
    }

    /// A server with the default configuration.
    pub fn start() -> Server {
        Server::builder().start()
    }

    fn write_conf(&self, module: Option<&Path>, extra: &[String], save_default: bool) {
        let mut conf = String::new();
        conf.push_str("bind 127.0.0.1\n");
        conf.push_str(&format!("port {}\n", self.port));
        conf.push_str(&format!(
            "dir {}\n",
            conf_quote(&self.dir.to_string_lossy())
        ));
        conf.push_str("daemonize no\n");
        conf.push_str(&format!(
            "logfile {}\n",
            conf_quote(&self.log_path().to_string_lossy())
        ));
        conf.push_str("enable-debug-command yes\n");
        // No 5-second wait before a diskless full sync.
        conf.push_str("repl-diskless-sync-delay 0\n");
        if save_default {
            conf.push_str("save \"\"\n");
        }
        if let Some(m) = module {
            conf.push_str(&format!(
                "loadmodule {}\n",
                conf_quote(&m.to_string_lossy())
            ));
        }
        for line in extra {
            conf.push_str(line);
            conf.push('\n');
        }
        fs::write(&self.conf, conf).expect("write redis.conf");
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(server_binary());
                c
            }
            None => Command::new(server_binary()),
        };
        let child = cmd
            .arg(&self.conf)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", server_binary().display()))?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("redis-server exited at start-up: {status}"));
                }
            }
            if self.ping_once() {
                return Ok(());
            }
            if start.elapsed() > self.startup {
                self.kill_child();
                return Err(format!("no PONG within {:?}", self.startup));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether our own child answers PING on our port: a PONG (not e.g.
    /// `-LOADING`) from a server whose `process_id` is our child's, so that a
    /// server of another test that took the port in a race is never used.
    fn ping_once(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(|c| c.id()) else {
            return false;
        };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
        let mut c = Conn::from_stream(stream, self.port);
        match c.try_cmd(&["PING"]) {
            Ok(Reply::Status(s)) if s == "PONG" => {}
            _ => return false,
        }
        match c.try_cmd(&["INFO", "server"]) {
            Ok(Reply::Bulk(b)) => {
                let info = String::from_utf8_lossy(&b).into_owned();
                info_get(&info, "process_id").as_deref() == Some(pid.to_string().as_str())
            }
            _ => false,
        }
    }

    fn kill_child(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("(no log: {e})"));
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        lines[from..].join("\n")
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// A new connection (read timeout [`DEFAULT_TIMEOUT`]).
    pub fn conn(&self) -> Conn {
        Conn::connect(self.port)
    }

    /// SIGSTOP: the process stops where it is (what a VM stall or a long
    /// pause does); its sockets stay open and the kernel keeps accepting
    /// connections and queueing requests for it.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after [`Server::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.pid().expect("the server is running");
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} {pid} failed");
    }

    /// SIGKILL: the server dies without saving anything.
    pub fn kill9(&mut self) {
        self.kill_child();
    }

    /// `SHUTDOWN NOSAVE`, then waits for the process to exit.
    pub fn shutdown_nosave(&mut self) {
        self.shutdown_with("NOSAVE");
    }

    /// `SHUTDOWN SAVE`, then waits for the process to exit.
    pub fn shutdown_save(&mut self) {
        self.shutdown_with("SAVE");
    }

    fn shutdown_with(&mut self, how: &str) {
        if let Ok(mut c) = Conn::try_connect(self.port) {
            // The connection closes without a reply when the shutdown succeeds.
            let _ = c.try_cmd(&["SHUTDOWN", how]);
        }
        let start = Instant::now();
        loop {
            match self.child.as_mut().map(|c| c.try_wait()) {
                None | Some(Ok(Some(_))) | Some(Err(_)) => {
                    self.child = None;
                    return;
                }
                Some(Ok(None)) => {}
            }
            if start.elapsed() > Duration::from_secs(15) {
                self.kill_child();
                panic!("redis-server did not exit after SHUTDOWN {how}");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same dir, port and configuration (kills it
    /// first if it is still running), so it loads its RDB or AOF.
    pub fn restart(&mut self) {
        self.kill_child();
        if let Err(e) = self.spawn_and_wait() {
            panic!(
                "redis-server did not restart: {e}\n--- log ---\n{}",
                self.log_tail(100)
            );
        }
    }

    /// Like [`Server::restart`], but a server that does not start is an `Err`
    /// with the reason and the log's tail (a file it refuses to load).
    pub fn try_restart(&mut self) -> Result<(), String> {
        self.kill_child();
        self.spawn_and_wait()
            .map_err(|e| format!("{e}\n--- log ---\n{}", self.log_tail(30)))
    }

    /// Adds a redis.conf line for the next (re)start; a later directive
    /// overrides an earlier one.
    pub fn add_config(&mut self, line: &str) {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&self.conf)
            .expect("open redis.conf");
        writeln!(f, "{line}").expect("append to redis.conf");
    }

    /// `REPLICAOF 127.0.0.1 <master>` and waits until the replica is in sync.
    pub fn replicaof(&self, master: &Server) {
        let mut c = self.conn();
        c.cmd(&["REPLICAOF", "127.0.0.1", &master.port.to_string()])
            .ok();
        wait_for_sync(master, self);
    }

    /// `REPLICAOF NO ONE`.
    pub fn promote(&self) {
        self.conn().cmd(&["REPLICAOF", "NO", "ONE"]).ok();
    }

    /// One field of `INFO <section>`, e.g. `info_field("replication", "master_repl_offset")`.
    pub fn info_field(&self, section: &str, field: &str) -> String {
        self.conn().info_field(section, field)
    }

    /// The master's replication offset (`master_repl_offset`).
    pub fn repl_offset(&self) -> i64 {
        self.info_field("replication", "master_repl_offset")
            .parse()
            .expect("master_repl_offset is an integer")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_child();
        if thread::panicking() {
            eprintln!(
                "--- last lines of redis-server log (port {}, {}) ---\n{}\n--- end of log ---",
                self.port,
                self.log_path().display(),
                self.log_tail(100)
            );
        } else if !self.keep_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A wall clock shifted by an offset the test sets, and can step while the
/// server runs: the LD_PRELOAD library `tests/shims/clockshim.c` (built
/// here with `cc` on first use) reads the offset from a small file.
/// libfaketime cannot be used: Debian's redis-server hangs under it.
///
/// It can also hold the servers' clocks still ([`ShiftedClock::freeze`]):
/// the bench counts a step's instructions so, where the module's work
/// depends on how much wall time passed (a lease's deadline slots), which
/// under callgrind is many times what the same requests take natively.
pub struct ShiftedClock {
    file: PathBuf,
    /// The last freeze's number (the shim's second word).
    freezes: std::sync::atomic::AtomicI64,
}

impl ShiftedClock {
    pub fn new(offset_ms: i64) -> ShiftedClock {
        let file = fresh_dir().join("clock-offset");
        let mut words = offset_ms.to_le_bytes().to_vec();
        words.extend_from_slice(&0i64.to_le_bytes());
        fs::write(&file, words).expect("write the clock offset");
        ShiftedClock {
            file,
            freezes: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// Writes the shim's word `at` (0: the offset, 1: the freeze).
    fn write_word(&self, at: u64, value: i64) {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .expect("open the clock offset");
        f.write_all_at(&value.to_le_bytes(), at * 8)
            .expect("write the clock offset");
    }

    /// Steps the clock of every server using it to `offset_ms` from now.
    pub fn set(&self, offset_ms: i64) {
        self.write_word(0, offset_ms);
    }

    /// Holds the wall and monotonic clocks of every server using it at what
    /// each reads next, until [`ShiftedClock::thaw`].
    pub fn freeze(&self) {
        let number = self.freezes.fetch_add(1, Ordering::Relaxed) + 1;
        self.write_word(1, number);
    }

    /// Lets the clocks run again: both jump to the real time (plus the
    /// offset) together, so no server sees a clock step.
    pub fn thaw(&self) {
        self.write_word(1, 0);
    }
}

impl Drop for ShiftedClock {
    fn drop(&mut self) {
        if let Some(dir) = self.file.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Builds the LD_PRELOAD library `tests/shims/<name>.c` once per test
/// binary (or bench).
fn shim(name: &str) -> PathBuf {
    static SHIMS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = SHIMS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let src = super::repo().join(format!("tests/shims/{name}.c"));
    let out = fresh_dir().join(format!("lib{name}.so"));
    let status = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("run cc (make deps installs a C compiler)");
    assert!(status.success(), "building {} failed", src.display());
    built.push((name.to_string(), out.clone()));
    out
}

/// Waits until `replica` is linked to `master` and has processed everything the
/// master has sent so far.
pub fn wait_for_sync(master: &Server, replica: &Server) {
    let mut m = master.conn();
    let mut r = replica.conn();
    let start = Instant::now();
    loop {
        let target: i64 = m
            .info_field("replication", "master_repl_offset")
            .parse()
            .unwrap_or(i64::MAX);
        let info = r.info("replication");
        let up = info_get(&info, "master_link_status").as_deref() == Some("up")
            && info_get(&info, "master_sync_in_progress").as_deref() == Some("0");
        let offset: i64 = info_get(&info, "slave_repl_offset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1);
        if up && offset >= target {
            return;
        }
        if start.elapsed() > SYNC_DEADLINE {
            panic!(
                "replica on port {} did not catch up with master on port {} within \
                 {SYNC_DEADLINE:?}: master offset {target}, replica info:\n{info}",
                replica.port, master.port
            );
        }
        thread::sleep(Duration::from_millis(5));
    }
}
