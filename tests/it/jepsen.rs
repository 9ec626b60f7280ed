//! The faults a Jepsen run injects that need no Sentinel (tests/sentinel.rs
//! has the failovers): an AOF whose tail was cut (`aof-load-truncated` no
//! and yes), a disk that fills up under the AOF, a client stopped with
//! SIGSTOP while it holds a lock, and a replica stopped under load.

use crate::common::load::*;
use crate::common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

/// The AOF file commands are appended to: the multi-part AOF's `.incr.aof`
/// (Redis 7 and later, Valkey), else the single `appendonly.aof`.
fn aof_tail_file(dir: &Path) -> PathBuf {
    let multi = dir.join("appendonlydir");
    if let Ok(entries) = std::fs::read_dir(&multi) {
        let mut incr: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
            .collect();
        incr.sort();
        if let Some(p) = incr.pop() {
            return p;
        }
    }
    dir.join("appendonly.aof")
}

/// Grants acknowledged with `appendfsync always`, SIGKILL, the last bytes of
/// the AOF cut off (a crash in the middle of a write). With
/// `aof-load-truncated no` the server refuses to start; with `yes` it loads
/// what is whole: every earlier grant with its token, the cut one gone (not
/// half there), and the next token is above the cut grant's, though that
/// one was acknowledged and is in no file any more.
#[test]
fn a_truncated_aof_tail_is_refused_or_loaded_without_the_cut_grant() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble yes")
        .start();
    let mut c = s.conn();
    let mut tokens = Vec::new();
    for i in 0..50 {
        tokens.push(token(c.acquire(&format!("k{i}"), "o", 600_000)));
    }
    let cut = token(c.acquire("k-cut", "o", 600_000));
    s.kill9();
    let file = aof_tail_file(&s.dir);
    let len = std::fs::metadata(&file).expect("the AOF").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open the AOF");
    f.set_len(len - 5).expect("cut the AOF's tail");
    drop(f);

    s.add_config("aof-load-truncated no");
    let refused = s.try_restart();
    let log = match refused {
        Ok(()) => panic!("a truncated AOF loaded with aof-load-truncated no"),
        Err(log) => log,
    };
    assert!(
        log.contains("aof-load-truncated") || log.contains("Unexpected end of file"),
        "the log says why: {log}"
    );

    s.add_config("aof-load-truncated yes");
    s.try_restart()
        .unwrap_or_else(|e| panic!("with aof-load-truncated yes the AOF loads: {e}"));
    let mut c = s.conn();
    for (i, t) in tokens.iter().enumerate() {
        let info = c
            .lock_info(format!("k{i}"))
            .unwrap_or_else(|| panic!("k{i}, granted before the cut, is there"));
        assert_eq!(info.holder("o").token, *t, "k{i} keeps its token");
    }
    assert!(
        c.lock_info("k-cut").is_none(),
        "the grant whose record was cut is gone, not half there: {:?}",
        c.lock_info("k-cut")
    );
    assert!(
        s.log_tail(200).contains("AOF loaded anyway")
            || s.log_tail(200).contains("aof-load-truncated"),
        "the log says the AOF was truncated: {}",
        s.log_tail(40)
    );
    let next = token(c.acquire("k-next", "o", 600_000));
    assert!(
        next > cut,
        "the next token ({next}) is above the cut grant's ({cut}), acknowledged but in no file"
    );
}

/// A tmpfs mount removed on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
            "tmpfs-{}-{}",
            std::process::id(),
            now_ms()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Tmpfs(dir))
    }

    fn free_bytes(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.0)
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df prints the free bytes")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The AOF's disk fills up (a small tmpfs; the test says why it did not run
/// where mounting is not allowed). Grants answered before the write failed
/// stay; from then on Redis refuses lock commands with MISCONF while
/// `LOCK.INFO` still answers; once space is back the AOF catches up, and
/// after SIGKILL and a restart every acknowledged grant is there with its
/// token, and nothing refused is.
#[test]
fn a_full_disk_under_the_aof_refuses_grants_then_loses_none_it_answered() {
    let disk = match Tmpfs::mount("4m") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: cannot mount a tmpfs here ({e}); the test needs root");
            return;
        }
    };
    let mut s = Server::builder()
        .config(&format!("dir {}", disk.0.display()))
        .config("appendonly yes")
        .config("appendfsync everysec")
        .config("aof-use-rdb-preamble yes")
        .start();
    let mut c = s.conn();
    token(c.acquire("k-first", "o", 600_000));
    // Leave about 64 KiB free.
    let filler = disk.0.join("filler");
    let free = disk.free_bytes();
    std::fs::write(&filler, vec![0u8; free.saturating_sub(64 * 1024) as usize])
        .expect("fill the disk");
    let owner = "o".repeat(500);
    let mut acked: Vec<(String, i64)> = Vec::new();
    let mut refused = None;
    for i in 0..10_000 {
        let key = format!("k{i}");
        match c.cmd(&["LOCK.ACQUIRE", &key, &owner, "600000"]) {
            Reply::Int(t) => acked.push((key, t)),
            Reply::Error(e) => {
                refused = Some((key, e));
                break;
            }
            other => panic!("LOCK.ACQUIRE {key}: {other:?}"),
        }
    }
    let (refused_key, err) = refused.expect("the disk filled up within 10,000 grants");
    eprintln!("{} grants answered, then {refused_key}: {err}", acked.len());
    assert!(err.starts_with("MISCONF"), "the refusal is MISCONF: {err}");
    assert!(
        c.lock_info(&refused_key).is_none(),
        "a refused grant changed nothing"
    );
    assert!(
        c.lock_info(&acked[0].0).is_some(),
        "LOCK.INFO still answers"
    );
    let again = c.cmd(&["LOCK.RELEASE", &acked[0].0, &owner]);
    assert!(
        again.is_err() && again.err().starts_with("MISCONF"),
        "a release is refused too while the AOF cannot be written: {again:?}"
    );

    std::fs::remove_file(&filler).expect("free the disk");
    wait_until(Duration::from_secs(10), "the AOF is written again", || {
        matches!(
            c.cmd(&["LOCK.ACQUIRE", "k-after", &owner, "600000"]),
            Reply::Int(_)
        )
    });
    sleep_ms(1_500); // appendfsync everysec
    s.kill9();
    s.restart();
    let mut c = s.conn();
    for (key, t) in &acked {
        let info = c
            .lock_info(key)
            .unwrap_or_else(|| panic!("{key}, answered before the disk filled up, is there"));
        assert_eq!(info.holder(&owner).token, *t, "{key} keeps its token");
    }
    assert!(
        c.lock_info(&refused_key).is_none(),
        "the refused grant is not there"
    );
    assert!(
        c.lock_info("k-after").is_some(),
        "the grant after the disk was freed is there"
    );
}

/// A `redis-cli` process: one command per line in, one reply per line out.
struct Cli {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Cli {
    fn start(port: u16) -> Cli {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-cli (make deps installs redis-tools)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Cli {
            child,
            stdin,
            stdout,
        }
    }

    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write to redis-cli");
        self.stdin.flush().expect("flush");
        let mut out = String::new();
        self.stdout
            .read_line(&mut out)
            .expect("read from redis-cli");
        out.trim_end().to_string()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig}");
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client process holding a lock is stopped past its lease (a GC pause, a
/// VM stall). A waiter gets the lock when the lease ends, with a higher
/// token; the stopped client, continued, can neither renew nor release what
/// is no longer its own, and a resource that keeps the highest token refuses
/// its late write.
#[test]
fn a_client_stopped_past_its_lease_is_fenced_off_when_it_continues() {
    let s = Server::start();
    let mut cli = Cli::start(s.port);
    let t1: i64 = cli
        .cmd("LOCK.ACQUIRE res stalled 400")
        .parse()
        .expect("a token from redis-cli");
    cli.signal("STOP");
    let mut c = s.conn();
    let t0 = std::time::Instant::now();
    let t2 = token(c.cmd(&["LOCK.ACQUIRE", "res", "next", "10000", "WAIT", "5000"]));
    let waited = t0.elapsed();
    assert!(
        t2 > t1,
        "the next holder's token {t2} is above the stopped one's {t1}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "the waiter got the lock when the stopped client's lease ended ({waited:?})"
    );
    // The resource: the next holder writes first.
    let mut highest = t2;
    cli.signal("CONT");
    assert_eq!(
        cli.cmd("LOCK.RENEW res stalled 400"),
        "0",
        "no renewal of a lost lease"
    );
    // nil (redis-cli prints an empty line): it holds nothing here.
    assert_eq!(
        cli.cmd("LOCK.RELEASE res stalled"),
        "",
        "no release of another's lock"
    );
    let late_write_accepted = t1 >= highest;
    if late_write_accepted {
        highest = t1;
    }
    assert!(
        !late_write_accepted,
        "the late write under {t1} is refused (highest {highest})"
    );
    let info = c.lock_info("res").expect("the lock is there");
    assert_eq!(
        info.holder("next").token,
        t2,
        "the next holder still holds it"
    );
    assert_eq!(info.holders.len(), 1);
}

/// A replica stopped under load: `WAIT 1` answers 0 while it is stopped, so
/// a client that waits for it knows its grant is not on a replica; once
/// continued the replica catches up and shows exactly the master's locks.
#[test]
fn a_replica_stopped_under_load_catches_up_and_wait_1_says_when_it_had_not() {
    let seed = test_seed("paused_replica");
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut cfg = LoadCfg::new(LoadCfg::numbered("k", 24));
    cfg.confirm_pct = 40;
    cfg.confirm_ms = 200;
    let port = master.port;
    let run = Running::start(Ledger::fresh(4, 24, "o"), &cfg, seed, move |_| {
        Single(Conn::connect(port))
    });
    run.wait_answered(300, Duration::from_secs(20));
    replica.pause();
    sleep_ms(1_500);
    replica.resume();
    run.wait_answered(300, Duration::from_secs(20));
    run.stop();
    let (ledgers, _) = run.join();
    let s = totals(&ledgers);
    eprintln!("{s:?}");
    assert!(
        s.unconfirmed > 0,
        "WAIT 1 answered 0 while the replica was stopped"
    );
    assert!(s.confirmations > 0, "WAIT 1 answered 1 otherwise");
    wait_for_sync(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    for k in &cfg.keys {
        assert_same_lock(&m.lock_info(k), &r.lock_info(k), 50, &show(k));
    }
}
