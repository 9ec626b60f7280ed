//! The test harness, one file per concern: `server` (processes, ports,
//! dirs, the clock shim), `resp` (the raw client), `info` (INFO and
//! LOCK.INFO), `inputs` (bad-input tables, error texts), `dump` (DUMP
//! payloads), `time`, and for the load and failover tests `load` (a
//! checked client load), `cluster` (a six-node cluster) and `sentinel` (a
//! master, replicas and Sentinels, a load that follows failovers, and checks
//! over the whole history). Everything but `load`, `cluster` and `sentinel`
//! is re-exported here: tests `use common::*`. The bench includes this
//! harness too (benches/lockbench/main.rs): one client (`Conn`, which also
//! pipelines) and one server launcher (`ServerBuilder`, which also runs a
//! server under callgrind) for tests and bench.
//!
//! - [`Server`]: one redis-server in its own fresh data dir under
//!   `<tmp>/redis-lock-tests/`, on a free port of 127.0.0.1 only, with a start-up
//!   deadline. It is killed on drop; if the test failed, the tail of its log is
//!   printed and its dir kept, else the dir is removed.
//! - [`Conn`]: one connection; `cmd` sends a command and reads one reply with a
//!   read timeout.
//! - [`Reply`]: a parsed reply, with accessors that panic with the reply shown.
//! - [`LockInfo`]: `LOCK.INFO` parsed from either protocol.
//! - The exact error texts come from the module's own `src/redis/errors.rs`.
//!
//! Environment: `REDIS_LOCK_MODULE` (the module's path, else
//! `target/debug/libredis_lock.so`), `REDIS_SERVER` (else `redis-server`),
//! `REDIS_LOCK_TEST_STARTUP_SECS` (the start-up deadline, else 15 s).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

mod docs;
mod dump;
mod info;
mod inputs;
mod resp;
mod server;
mod time;

pub mod cluster;
pub mod load;
pub mod sentinel;

// Each test uses some of these.
#[allow(unused_imports)]
pub use docs::*;
#[allow(unused_imports)]
pub use dump::*;
#[allow(unused_imports)]
pub use info::*;
#[allow(unused_imports)]
pub use inputs::*;
#[allow(unused_imports)]
pub use resp::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use time::*;

/// The repository's root: the directory of the workspace's `Cargo.lock`, at
/// or above the package this harness is compiled into (the module's for the
/// tests, benches/lockbench for the bench).
pub fn repo() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        here.ancestors()
            .find(|p| p.join("Cargo.lock").is_file())
            .unwrap_or(here)
            .to_path_buf()
    })
}

/// The module's error texts, compiled from the module's own source.
#[path = "../../src/redis/errors.rs"]
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
