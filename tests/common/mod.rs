//! Test harness: starts real `redis-server` processes with the built module and
//! talks to them with a small RESP2/RESP3 client.
//!
//! - [`Server`]: one redis-server in its own fresh data dir under
//!   `<tmp>/redis-lock-tests/`, on a free port of 127.0.0.1 only, with a start-up
//!   deadline. It is killed on drop; if the test failed, the tail of its log is
//!   printed and its dir kept, else the dir is removed.
//! - [`Conn`]: one connection; `cmd` sends a command and reads one reply with a
//!   read timeout.
//! - [`Reply`]: a parsed reply, with accessors that panic with the reply shown.
//! - [`LockInfo`]: `LOCK.INFO` parsed from either protocol.
//! - The exact error texts come from the module's own `src/errors.rs`.
//!
//! Environment: `REDIS_LOCK_MODULE` (the module's path, else
//! `target/debug/libredis_lock.so`), `REDIS_SERVER` (else `redis-server`),
//! `REDIS_LOCK_TEST_STARTUP_SECS` (the start-up deadline, else 15 s).

#![allow(dead_code)]

use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The module's error texts, compiled from the module's own source.
#[path = "../../src/errors.rs"]
pub mod errors;

pub use errors::LockError;

/// The longest WAIT the module accepts, in milliseconds (`args::MAX_WAIT_MS`).
pub const MAX_WAIT_MS: i64 = 1_000_000_000_000;

/// The default maximum ttl: 30 days in milliseconds, inclusive.
pub const MAX_TTL: i64 = 2_592_000_000;

/// What `TYPE` answers for a lock key (the module data type's name).
pub const TYPE_NAME: &str = "redislock";

/// How long a server may take to answer PING after it is started.
const STARTUP_DEADLINE: Duration = Duration::from_secs(15);

/// [`STARTUP_DEADLINE`], or `REDIS_LOCK_TEST_STARTUP_SECS` seconds when set
/// (a server under valgrind starts tens of times slower).
fn startup_deadline() -> Duration {
    std::env::var("REDIS_LOCK_TEST_STARTUP_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(STARTUP_DEADLINE, Duration::from_secs)
}

/// How long a replica may take to catch up with its master.
const SYNC_DEADLINE: Duration = Duration::from_secs(20);
/// The default read timeout of a connection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exact text of one of the module's errors.
pub fn err_text(e: LockError) -> String {
    e.message()
}

/// `ERR ttl must be an integer from 1 to <max>` with the default maximum.
pub fn bad_ttl() -> String {
    LockError::BadTtl(MAX_TTL).message()
}

// ---------------------------------------------------------------------------
// Paths and ports
// ---------------------------------------------------------------------------

pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_LOCK_MODULE") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredis_lock.so")
}

fn server_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

fn free_port() -> u16 {
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

/// The current wall-clock time in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Polls `f` every few ms until it returns true; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        if f() {
            return;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn sleep_ms(ms: u64) {
    thread::sleep(Duration::from_millis(ms));
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// Builds a [`Server`]: extra redis.conf lines on top of the defaults.
pub struct ServerBuilder {
    lines: Vec<String>,
    module: bool,
    save_default: bool,
    env: Vec<(String, String)>,
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
        self.env = clock.env();
        self
    }

    /// Start a plain redis-server, without the module (for comparisons).
    pub fn without_module(mut self) -> Self {
        self.module = false;
        self
    }

    pub fn start(self) -> Server {
        let module = if self.module {
            let path = module_path();
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
        let dir = fresh_dir();
        let mut last_err = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let mut server = Server {
                port,
                dir: dir.clone(),
                conf: dir.join("redis.conf"),
                child: None,
                keep_dir: false,
                env: self.env.clone(),
            };
            server.write_conf(module.as_deref(), &self.lines, self.save_default);
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
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            lines: Vec::new(),
            module: true,
            save_default: true,
            env: Vec::new(),
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
        let child = Command::new(server_binary())
            .arg(&self.conf)
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
            if start.elapsed() > startup_deadline() {
                self.kill_child();
                return Err(format!("no PONG within {:?}", startup_deadline()));
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
        let mut c = Conn {
            reader: BufReader::new(stream),
            port: self.port,
        };
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
/// server runs: the LD_PRELOAD library `tests/clockshim/clockshim.c` (built
/// here with `cc` on first use) reads the offset from a small file.
/// libfaketime cannot be used: Debian's redis-server hangs under it.
pub struct ShiftedClock {
    file: PathBuf,
}

impl ShiftedClock {
    pub fn new(offset_ms: i64) -> ShiftedClock {
        let file = fresh_dir().join("clock-offset");
        fs::write(&file, offset_ms.to_le_bytes()).expect("write the clock offset");
        ShiftedClock { file }
    }

    /// Steps the clock of every server using it to `offset_ms` from now.
    pub fn set(&self, offset_ms: i64) {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .expect("open the clock offset");
        f.write_all_at(&offset_ms.to_le_bytes(), 0)
            .expect("write the clock offset");
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "LD_PRELOAD".into(),
                clock_shim().to_string_lossy().into_owned(),
            ),
            (
                "CLOCKSHIM_FILE".into(),
                self.file.to_string_lossy().into_owned(),
            ),
        ]
    }
}

impl Drop for ShiftedClock {
    fn drop(&mut self) {
        if let Some(dir) = self.file.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// Builds the clock shim once per test binary.
fn clock_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let src = root.join("tests/clockshim/clockshim.c");
        let out = fresh_dir().join("libclockshim.so");
        let status = Command::new("cc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("run cc (make deps installs a C compiler)");
        assert!(status.success(), "building {} failed", src.display());
        out
    })
    .clone()
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

/// The value of `field` in an INFO text.
pub fn info_get(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

/// One RESP2 or RESP3 reply.
#[derive(Clone, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// Null bulk, null array (RESP2) or null (RESP3).
    Nil,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
    Double(String),
    Bool(bool),
    Verbatim(String, Vec<u8>),
    BigNumber(String),
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "+{s}"),
            Reply::Error(s) => write!(f, "-{s}"),
            Reply::Int(i) => write!(f, "{i}"),
            Reply::Bulk(b) => write!(f, "{:?}", show(b)),
            Reply::Nil => write!(f, "nil"),
            Reply::Array(a) => f.debug_list().entries(a).finish(),
            Reply::Set(a) => write!(f, "set{:?}", a),
            Reply::Push(a) => write!(f, "push{:?}", a),
            Reply::Map(m) => f
                .debug_map()
                .entries(m.iter().map(|(k, v)| (k, v)))
                .finish(),
            Reply::Double(d) => write!(f, ",{d}"),
            Reply::Bool(b) => write!(f, "#{b}"),
            Reply::Verbatim(fmt_, b) => write!(f, "={fmt_}:{:?}", show(b)),
            Reply::BigNumber(n) => write!(f, "({n}"),
        }
    }
}

/// Bytes shown as text with escapes.
pub fn show(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

impl Reply {
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }

    pub fn is_err(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The integer; panics otherwise.
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The error text; panics otherwise.
    pub fn err(&self) -> &str {
        match self {
            Reply::Error(e) => e,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    /// The bytes of a bulk, status or verbatim string; panics otherwise.
    pub fn bulk(&self) -> &[u8] {
        match self {
            Reply::Bulk(b) | Reply::Verbatim(_, b) => b,
            Reply::Status(s) => s.as_bytes(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// A string reply as UTF-8 (lossy).
    pub fn str(&self) -> String {
        String::from_utf8_lossy(self.bulk()).into_owned()
    }

    /// The elements of an array, set or push; panics otherwise.
    pub fn array(&self) -> &[Reply] {
        match self {
            Reply::Array(a) | Reply::Set(a) | Reply::Push(a) => a,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// Panics unless the reply is `+OK`.
    pub fn ok(&self) -> &Self {
        match self {
            Reply::Status(s) if s == "OK" => self,
            other => panic!("expected +OK, got {other:?}"),
        }
    }

    /// A RESP3 map, or a RESP2 flat array of key/value pairs, as pairs with
    /// string keys; panics otherwise.
    pub fn pairs(&self) -> Vec<(String, Reply)> {
        match self {
            Reply::Map(m) => m.iter().map(|(k, v)| (k.str(), v.clone())).collect(),
            Reply::Array(a) => {
                assert!(a.len() % 2 == 0, "odd-length array is not a map: {self:?}");
                a.chunks(2).map(|p| (p[0].str(), p[1].clone())).collect()
            }
            other => panic!("expected a map reply, got {other:?}"),
        }
    }

    /// The value for `key` in [`Reply::pairs`].
    pub fn get(&self, key: &str) -> Option<Reply> {
        self.pairs()
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    }
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// One client connection to a test server (127.0.0.1 only).
pub struct Conn {
    reader: BufReader<TcpStream>,
    pub port: u16,
}

impl Conn {
    pub fn connect(port: u16) -> Conn {
        Conn::try_connect(port).unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
    }

    pub fn try_connect(port: u16) -> std::io::Result<Conn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(DEFAULT_TIMEOUT))?;
        stream.set_write_timeout(Some(DEFAULT_TIMEOUT))?;
        Ok(Conn {
            reader: BufReader::new(stream),
            port,
        })
    }

    /// Sets the read timeout for the following replies.
    pub fn set_timeout(&mut self, t: Duration) {
        self.reader
            .get_ref()
            .set_read_timeout(Some(t))
            .expect("set_read_timeout");
    }

    /// Sends one command and reads its reply; panics on I/O errors or timeout.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        match self.try_cmd(args) {
            Ok(r) => r,
            Err(e) => panic!(
                "command {:?} to 127.0.0.1:{}: {e}",
                args.iter().map(|a| show(a.as_ref())).collect::<Vec<_>>(),
                self.port
            ),
        }
    }

    /// Like [`Conn::cmd`] with owned arguments.
    pub fn cmdv(&mut self, args: &[Vec<u8>]) -> Reply {
        self.cmd(args)
    }

    /// A command written as words separated by spaces (no empty or spaced args).
    pub fn line(&mut self, line: &str) -> Reply {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.cmd(&args)
    }

    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.read_reply()
    }

    /// Writes one command without reading its reply.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        self.reader.get_mut().flush()
    }

    /// Reads one reply (skipping RESP3 attributes).
    pub fn read_reply(&mut self) -> std::io::Result<Reply> {
        loop {
            let (prefix, line) = self.read_line()?;
            if prefix == b'|' {
                // An attribute: a map to skip, then the real reply follows.
                let n = parse_int(&line)?;
                for _ in 0..n * 2 {
                    self.read_reply()?;
                }
                continue;
            }
            return self.parse(prefix, line);
        }
    }

    fn read_line(&mut self) -> std::io::Result<(u8, String)> {
        let mut line = Vec::new();
        let n = self.reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed by the server",
            ));
        }
        if !line.ends_with(b"\r\n") {
            return Err(bad_data(format!("line without CRLF: {:?}", show(&line))));
        }
        line.truncate(line.len() - 2);
        let prefix = line[0];
        Ok((prefix, String::from_utf8_lossy(&line[1..]).into_owned()))
    }

    fn read_exact_crlf(&mut self, len: usize) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len + 2];
        self.reader.read_exact(&mut buf)?;
        if &buf[len..] != b"\r\n" {
            return Err(bad_data("bulk not followed by CRLF".into()));
        }
        buf.truncate(len);
        Ok(buf)
    }

    fn read_n(&mut self, n: i64) -> std::io::Result<Vec<Reply>> {
        (0..n).map(|_| self.read_reply()).collect()
    }

    fn parse(&mut self, prefix: u8, line: String) -> std::io::Result<Reply> {
        Ok(match prefix {
            b'+' => Reply::Status(line),
            b'-' => Reply::Error(line),
            b':' => Reply::Int(parse_int(&line)?),
            b'$' => {
                let n = parse_int(&line)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    Reply::Bulk(self.read_exact_crlf(n as usize)?)
                }
            }
            b'*' => {
                let n = parse_int(&line)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    Reply::Array(self.read_n(n)?)
                }
            }
            b'~' => Reply::Set(self.read_n(parse_int(&line)?)?),
            b'>' => Reply::Push(self.read_n(parse_int(&line)?)?),
            b'%' => {
                let n = parse_int(&line)?;
                let mut m = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let k = self.read_reply()?;
                    let v = self.read_reply()?;
                    m.push((k, v));
                }
                Reply::Map(m)
            }
            b'_' => Reply::Nil,
            b',' => Reply::Double(line),
            b'#' => match line.as_str() {
                "t" => Reply::Bool(true),
                "f" => Reply::Bool(false),
                other => return Err(bad_data(format!("bad boolean {other:?}"))),
            },
            b'(' => Reply::BigNumber(line),
            b'!' => {
                // RESP3 blob error.
                let n = parse_int(&line)?;
                let b = self.read_exact_crlf(n as usize)?;
                Reply::Error(String::from_utf8_lossy(&b).into_owned())
            }
            b'=' => {
                let n = parse_int(&line)?;
                let b = self.read_exact_crlf(n as usize)?;
                if b.len() >= 4 && b[3] == b':' {
                    Reply::Verbatim(
                        String::from_utf8_lossy(&b[..3]).into_owned(),
                        b[4..].to_vec(),
                    )
                } else {
                    Reply::Verbatim(String::new(), b)
                }
            }
            other => return Err(bad_data(format!("unknown reply type {:?}", other as char))),
        })
    }

    /// Switches to RESP3 (`HELLO 3`); returns the server's hello map.
    pub fn hello3(&mut self) -> Reply {
        let r = self.cmd(&["HELLO", "3"]);
        assert!(matches!(r, Reply::Map(_)), "HELLO 3 replied {r:?}");
        r
    }

    /// `INFO <section>` as text.
    pub fn info(&mut self, section: &str) -> String {
        self.cmd(&["INFO", section]).str()
    }

    pub fn info_field(&mut self, section: &str, field: &str) -> String {
        let info = self.info(section);
        info_get(&info, field).unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{info}"))
    }

    /// `LOCK.INFO key`, parsed (either protocol); None when nil.
    pub fn lock_info(&mut self, key: impl AsRef<[u8]>) -> Option<LockInfo> {
        let r = self.cmd(&[b"LOCK.INFO".as_slice(), key.as_ref()]);
        LockInfo::parse(&r)
    }

    /// `PTTL key`.
    pub fn pttl(&mut self, key: impl AsRef<[u8]>) -> i64 {
        self.cmd(&[b"PTTL".as_slice(), key.as_ref()]).int()
    }

    /// `TYPE key` as a string.
    pub fn type_of(&mut self, key: impl AsRef<[u8]>) -> String {
        self.cmd(&[b"TYPE".as_slice(), key.as_ref()]).str()
    }

    /// `LOCK.ACQUIRE key owner ttl`.
    pub fn acquire(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.ACQUIRE", key, owner, &ttl.to_string()])
    }

    /// `LOCK.RACQUIRE key owner ttl`.
    pub fn racquire(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.RACQUIRE", key, owner, &ttl.to_string()])
    }

    /// `LOCK.READ key owner ttl`.
    pub fn read(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.READ", key, owner, &ttl.to_string()])
    }

    /// `LOCK.RELEASE key owner`.
    pub fn release(&mut self, key: &str, owner: &str) -> Reply {
        self.cmd(&["LOCK.RELEASE", key, owner])
    }

    /// `LOCK.RENEW key owner ttl`.
    pub fn renew(&mut self, key: &str, owner: &str, ttl: i64) -> Reply {
        self.cmd(&["LOCK.RENEW", key, owner, &ttl.to_string()])
    }

    pub fn ping(&mut self) {
        let r = self.cmd(&["PING"]);
        assert_eq!(r, Reply::Status("PONG".into()), "PING");
    }
}

fn bad_data(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

fn parse_int(s: &str) -> std::io::Result<i64> {
    s.parse()
        .map_err(|_| bad_data(format!("bad integer in reply: {s:?}")))
}

// ---------------------------------------------------------------------------
// LOCK.INFO
// ---------------------------------------------------------------------------

/// One holder as listed by `LOCK.INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    pub owner: Vec<u8>,
    pub holds: i64,
    pub ttl: i64,
    pub token: i64,
}

/// A lock's mode, `(owner, holds, token)` of each holder, and waiters.
pub type Stable = (String, Vec<(Vec<u8>, i64, i64)>, i64);

/// `LOCK.INFO` parsed; holders sorted by owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    pub mode: String,
    pub holders: Vec<HolderInfo>,
    pub waiters: i64,
    /// A semaphore's limit (`None` for a lock).
    pub limit: Option<i64>,
}

impl LockInfo {
    /// Parses a `LOCK.INFO` reply, checking its exact shape (flat array in
    /// RESP2, map in RESP3: `mode`, `holders`, `waiters` in that order).
    pub fn parse(r: &Reply) -> Option<LockInfo> {
        if r.is_nil() {
            return None;
        }
        let pairs: Vec<(String, Reply)> = match r {
            Reply::Array(a) => {
                assert!(
                    a.len() == 6 || a.len() == 8,
                    "LOCK.INFO (RESP2) has 6 elements (8 for a semaphore): {r:?}"
                );
                r.pairs()
            }
            Reply::Map(m) => {
                assert!(
                    m.len() == 3 || m.len() == 4,
                    "LOCK.INFO (RESP3) has 3 entries (4 for a semaphore): {r:?}"
                );
                r.pairs()
            }
            other => panic!("LOCK.INFO: expected an array, a map or nil, got {other:?}"),
        };
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        let mode = pairs[0].1.str();
        let want: &[&str] = match mode.as_str() {
            "semaphore" => &["mode", "holders", "waiters", "limit"],
            _ => &["mode", "holders", "waiters"],
        };
        assert_eq!(keys, want, "LOCK.INFO keys: {r:?}");
        assert!(
            mode == "exclusive" || mode == "shared" || mode == "semaphore",
            "LOCK.INFO mode is exclusive, shared or semaphore: {r:?}"
        );
        let limit = pairs.get(3).map(|(_, l)| l.int());
        let mut holders: Vec<HolderInfo> = pairs[1]
            .1
            .array()
            .iter()
            .map(|h| {
                let h = h.array();
                assert_eq!(h.len(), 4, "a holder is [owner, holds, ttl, token]: {r:?}");
                HolderInfo {
                    owner: h[0].bulk().to_vec(),
                    holds: h[1].int(),
                    ttl: h[2].int(),
                    token: h[3].int(),
                }
            })
            .collect();
        holders.sort_by(|a, b| a.owner.cmp(&b.owner));
        let waiters = pairs[2].1.int();
        Some(LockInfo {
            mode,
            holders,
            waiters,
            limit,
        })
    }

    /// The holder named `owner`; panics if absent.
    pub fn holder(&self, owner: impl AsRef<[u8]>) -> &HolderInfo {
        let owner = owner.as_ref();
        self.holders
            .iter()
            .find(|h| h.owner == owner)
            .unwrap_or_else(|| panic!("no holder {:?} in {self:?}", show(owner)))
    }

    /// Owners, holds and tokens (everything but the time-dependent ttl).
    pub fn stable(&self) -> Stable {
        (
            self.mode.clone(),
            self.holders
                .iter()
                .map(|h| (h.owner.clone(), h.holds, h.token))
                .collect(),
            self.waiters,
        )
    }
}

/// Asserts that two `LOCK.INFO` states are equal except for the ttls, which
/// may differ by at most `ttl_slack` ms.
pub fn assert_same_lock(a: &Option<LockInfo>, b: &Option<LockInfo>, ttl_slack: i64, what: &str) {
    match (a, b) {
        (None, None) => {}
        (Some(a), Some(b)) => {
            assert_eq!(a.stable(), b.stable(), "{what}: {a:?} vs {b:?}");
            for (x, y) in a.holders.iter().zip(&b.holders) {
                assert!(
                    (x.ttl - y.ttl).abs() <= ttl_slack,
                    "{what}: ttl of {:?} differs by more than {ttl_slack} ms: {a:?} vs {b:?}",
                    show(&x.owner)
                );
            }
        }
        _ => panic!("{what}: {a:?} vs {b:?}"),
    }
}

// ---------------------------------------------------------------------------
// Bad input, shared by commands.rs and replication.rs
// ---------------------------------------------------------------------------

/// What a bad request must answer.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Exactly this error text.
    Exact(String),
    /// One of these error texts.
    OneOf(Vec<String>),
    /// Redis's own wrong-arity error for the command.
    Arity,
}

impl Expect {
    pub fn check(&self, args: &[Vec<u8>], r: &Reply) {
        let shown: Vec<String> = args.iter().map(|a| show(a)).collect();
        match self {
            Expect::Exact(e) => {
                assert_eq!(r, &Reply::Error(e.clone()), "reply to {shown:?}");
            }
            Expect::OneOf(es) => {
                assert!(
                    es.iter().any(|e| r == &Reply::Error(e.clone())),
                    "reply to {shown:?}: expected one of {es:?}, got {r:?}"
                );
            }
            Expect::Arity => {
                let name = String::from_utf8_lossy(&args[0]).to_lowercase();
                let want = format!("ERR wrong number of arguments for '{name}' command");
                match r {
                    Reply::Error(e) if e.to_lowercase() == want.to_lowercase() => {}
                    other => panic!("reply to {shown:?}: expected {want:?}, got {other:?}"),
                }
            }
        }
    }
}

fn words(s: &[&[u8]]) -> Vec<Vec<u8>> {
    s.iter().map(|w| w.to_vec()).collect()
}

/// One bad request (its arguments) and the error it must get.
pub type BadInput = (Vec<Vec<u8>>, Expect);

/// Bad requests against `key` (held by `holder` exclusively, or free) and
/// `strkey` (a string key), each with the error it must get. None of them may
/// change anything.
pub fn bad_inputs(key: &str, holder: &str, strkey: &str) -> Vec<BadInput> {
    let k = key.as_bytes();
    let o = holder.as_bytes();
    let s = strkey.as_bytes();
    let ttl = Expect::Exact(bad_ttl());
    let wait = Expect::Exact(LockError::BadWait(MAX_WAIT_MS).message());
    let syntax = Expect::Exact(LockError::Syntax.message());
    let empty = Expect::Exact(LockError::EmptyOwner.message());
    let wrongtype = Expect::Exact(LockError::WrongType.message());
    let mut v: Vec<BadInput> = Vec::new();
    let over_max = (MAX_TTL + 1).to_string();
    let over_wait = (MAX_WAIT_MS + 1).to_string();
    let bad_ttls: Vec<&[u8]> = vec![
        b"0",
        b"-1",
        b"abc",
        b"+5",
        b"05",
        b" 5",
        b"5 ",
        b"-0",
        b"1.5",
        b"",
        b"99999999999999999999",
        b"-99999999999999999999",
        over_max.as_bytes(),
    ];
    for cmd in [&b"LOCK.ACQUIRE"[..], b"LOCK.RACQUIRE", b"LOCK.READ"] {
        // Arity (Redis's own check, arity -4).
        v.push((words(&[cmd]), Expect::Arity));
        v.push((words(&[cmd, k]), Expect::Arity));
        v.push((words(&[cmd, k, o]), Expect::Arity));
        for t in &bad_ttls {
            v.push((words(&[cmd, k, o, t]), ttl.clone()));
            v.push((words(&[cmd, k, b"someone", t]), ttl.clone()));
        }
        v.push((words(&[cmd, k, b"", b"100000"]), empty.clone()));
        v.push((words(&[cmd, k, o, b"200000", b"FOO"]), syntax.clone()));
        v.push((words(&[cmd, k, o, b"200000", b"FOO", b"1"]), syntax.clone()));
        v.push((words(&[cmd, k, b"x", b"200000", b"NOWAIT"]), syntax.clone()));
        // WAIT without its value: a syntax error, or the WAIT error.
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT"]),
            Expect::OneOf(vec![
                LockError::Syntax.message(),
                LockError::BadWait(MAX_WAIT_MS).message(),
            ]),
        ));
        for w in [
            &b"-1"[..],
            b"abc",
            b"+5",
            b"05",
            b"-0",
            b" 5",
            b"",
            b"1.5",
            b"99999999999999999999",
            over_wait.as_bytes(),
        ] {
            v.push((words(&[cmd, k, o, b"200000", b"WAIT", w]), wait.clone()));
            v.push((words(&[cmd, k, b"x", b"200000", b"wait", w]), wait.clone()));
        }
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT", b"10", b"WAIT", b"10"]),
            syntax.clone(),
        ));
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT", b"10", b"extra"]),
            syntax.clone(),
        ));
        v.push((words(&[cmd, s, o, b"100000"]), wrongtype.clone()));
        v.push((words(&[cmd, s, b"x", b"100000"]), wrongtype.clone()));
    }
    // LOCK.RELEASE (arity 3).
    v.push((words(&[b"LOCK.RELEASE"]), Expect::Arity));
    v.push((words(&[b"LOCK.RELEASE", k]), Expect::Arity));
    v.push((words(&[b"LOCK.RELEASE", k, o, b"extra"]), Expect::Arity));
    v.push((words(&[b"LOCK.RELEASE", k, b""]), empty.clone()));
    v.push((words(&[b"LOCK.RELEASE", s, o]), wrongtype.clone()));
    // LOCK.RENEW (arity 4).
    v.push((words(&[b"LOCK.RENEW"]), Expect::Arity));
    v.push((words(&[b"LOCK.RENEW", k, o]), Expect::Arity));
    v.push((
        words(&[b"LOCK.RENEW", k, o, b"100000", b"extra"]),
        Expect::Arity,
    ));
    v.push((words(&[b"LOCK.RENEW", k, b"", b"100000"]), empty.clone()));
    for t in &bad_ttls {
        v.push((words(&[b"LOCK.RENEW", k, o, t]), ttl.clone()));
    }
    v.push((words(&[b"LOCK.RENEW", s, o, b"100000"]), wrongtype.clone()));
    // LOCK.INFO (arity 2).
    v.push((words(&[b"LOCK.INFO"]), Expect::Arity));
    v.push((words(&[b"LOCK.INFO", k, k]), Expect::Arity));
    v.push((words(&[b"LOCK.INFO", s]), wrongtype.clone()));
    v
}

// ---------------------------------------------------------------------------
// DUMP payloads
// ---------------------------------------------------------------------------

/// Redis's CRC-64 (Jones polynomial, reflected, init 0, no final xor), as used
/// in the footer of DUMP payloads.
pub fn crc64_redis(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 reflected
    let mut crc: u64 = 0;
    for &b in data {
        crc ^= b as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Splits a DUMP payload into (body, rdb version bytes); panics if too short.
pub fn dump_parts(payload: &[u8]) -> (&[u8], [u8; 2]) {
    assert!(
        payload.len() > 10,
        "a DUMP payload is longer than its footer"
    );
    let body_end = payload.len() - 10;
    let version = [payload[body_end], payload[body_end + 1]];
    (&payload[..body_end], version)
}

/// Builds a DUMP payload with a valid footer around `body`.
pub fn dump_with_footer(body: &[u8], version: [u8; 2]) -> Vec<u8> {
    let mut p = body.to_vec();
    p.extend_from_slice(&version);
    let crc = crc64_redis(&p);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}
