//! `--callgrind`'s section 11, what the module costs others (issue 39): a
//! server that loads the module against one that does not, and against one
//! that loads the C module's `events-only` mode (benches/cmodule: the same
//! event subscriptions with empty callbacks, the module API's floor), at
//! `hz 10`:
//!
//! - at rest: the whole process under callgrind for a few seconds of
//!   nothing (no client sends anything), per cron tick (the dump's calls of
//!   `serverCron`) times `hz`: instructions a second, at `hz 10` and
//!   `hz 100`;
//! - a connection: opened, one PING, closed, the whole process, less the
//!   cron ticks that fell in (at the at-rest cost of a tick);
//! - other clients' writes on keys that are not locks, a request's own work
//!   as every callgrind row (`profile`).
//!
//! And every lock command on a busy server against the quiet one
//! (`profile`'s rows): in database 1, one client waiting for a held lock,
//! a shared lock whose readers' leases run out apart (a visit planned), and
//! a grant bound to an open connection; the measured keys in database 0
//! (emptied with `FLUSHDB`, not `FLUSHALL`, between rows); the server's
//! clocks held still in each measured step (`Profiled::start_frozen`: no
//! time-driven work inside a step, whose wall time under valgrind follows
//! the machine's load; periodic work is the at-rest rows'). With the full
//! run, again with 10,000 clients waiting on 10,000 other keys; and other
//! clients' writes on those servers beside the API's floor in the same
//! shape (`floor_rows`: as many plain keys where the lock server holds
//! locks, as many connections blocked as it has waiters, a module timer
//! where it plans a visit), with the module's own code a write.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{encode, Arg, Reply};
use crate::profile::{self, Plain, Profiled, Row};
use crate::server::{Options, Server};
use crate::throughput::{Op, KEY_PREFIX, OWNER};

/// Seconds of nothing an at-rest row watches.
const REST_SECS: u64 = 3;
/// Connections a connection row opens and closes.
const CONNS: usize = 1000;
/// The busy server's waiters in the full run's second busy shape.
const MANY_WAITERS: usize = 10_000;

/// `LOCKBENCH_TAX_WRITES=1` (with `--callgrind --only 11`): the third
/// table's busy columns alone, the API's floor and the module with one
/// client waiting (their dumps in `tax-floor-busy/` and `tax-busy/`): a
/// few minutes, for work on that path.
fn writes_only() -> bool {
    std::env::var("LOCKBENCH_TAX_WRITES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `LOCKBENCH_TAX_LOCKS=1` (with `--callgrind --only 11`): the second
/// table alone, the lock commands quiet, busy and with 10,000 waiting
/// (their dumps in `tax-busy/` and `tax-busy10k/`), for work on those rows.
fn locks_only() -> bool {
    std::env::var("LOCKBENCH_TAX_LOCKS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The three servers of the tax table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Plain,
    Module,
    Floor,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Plain => "plain",
            Side::Module => "module",
            Side::Floor => "events-floor",
        }
    }
}

/// The writes of the tax table: commands of other clients on keys that are
/// not locks, each firing one generic keyspace event or none.
#[derive(Clone, Copy)]
enum OtherWrite {
    Set,
    SetEx,
    Expire,
    Getex,
    Del,
    Rename,
    Move,
    Copy,
}

impl OtherWrite {
    const ALL: [OtherWrite; 8] = [
        OtherWrite::Set,
        OtherWrite::SetEx,
        OtherWrite::Expire,
        OtherWrite::Getex,
        OtherWrite::Del,
        OtherWrite::Rename,
        OtherWrite::Move,
        OtherWrite::Copy,
    ];

    fn short(self) -> &'static str {
        match self {
            OtherWrite::Set => "set",
            OtherWrite::SetEx => "set-ex",
            OtherWrite::Expire => "expire",
            OtherWrite::Getex => "getex",
            OtherWrite::Del => "del",
            OtherWrite::Rename => "rename",
            OtherWrite::Move => "move",
            OtherWrite::Copy => "copy",
        }
    }

    fn label(self) -> &'static str {
        match self {
            OtherWrite::Set => "`SET k v` (no generic event)",
            OtherWrite::SetEx => "`SET k v EX 100` (`expire`)",
            OtherWrite::Expire => "`EXPIRE k 100` (`expire`)",
            OtherWrite::Getex => "`GETEX k EX 200` (`expire`)",
            OtherWrite::Del => "`DEL k` (`del`)",
            OtherWrite::Rename => "`RENAME k k2` (`rename_from`, `rename_to`)",
            OtherWrite::Move => "`MOVE k 2` (`move_from`, `move_to`)",
            OtherWrite::Copy => "`COPY k k2` (`copy_to`)",
        }
    }

    fn needs_strings(self) -> bool {
        !matches!(self, OtherWrite::Set | OtherWrite::SetEx)
    }

    fn encode(self, i: usize, buf: &mut Vec<u8>) {
        let k = Arg::K(KEY_PREFIX, i);
        let b = Arg::B;
        match self {
            OtherWrite::Set => encode(buf, &[b(b"SET"), k, b(OWNER)]),
            OtherWrite::SetEx => encode(buf, &[b(b"SET"), k, b(OWNER), b(b"EX"), b(b"100")]),
            OtherWrite::Expire => encode(buf, &[b(b"EXPIRE"), k, b(b"100")]),
            OtherWrite::Getex => encode(buf, &[b(b"GETEX"), k, b(b"EX"), b(b"200")]),
            OtherWrite::Del => encode(buf, &[b(b"DEL"), k]),
            OtherWrite::Rename => encode(buf, &[b(b"RENAME"), k, Arg::K(b"renamed:", i)]),
            // Database 2: the busy shape's is 1; emptied after the row.
            OtherWrite::Move => encode(buf, &[b(b"MOVE"), k, b(b"2")]),
            OtherWrite::Copy => encode(buf, &[b(b"COPY"), k, Arg::K(b"copied:", i)]),
        }
    }

    fn expected(self, r: &Reply) -> bool {
        match self {
            OtherWrite::Set | OtherWrite::SetEx | OtherWrite::Rename => r.is("OK"),
            OtherWrite::Expire | OtherWrite::Del | OtherWrite::Move | OtherWrite::Copy => {
                *r == Reply::Int(1)
            }
            OtherWrite::Getex => matches!(r, Reply::Bulk(_)),
        }
    }
}

/// A server of `side` at `hz`, under callgrind (section 11's own options:
/// room for 10,000 waiting clients).
fn server_opts(side: Side, load: &Path, dir: PathBuf, hz: u32) -> Options {
    let mut opts = profile::options(None, dir);
    opts.extra = vec![
        "--hz".into(),
        hz.to_string(),
        "--activerehashing".into(),
        "no".into(),
        "--maxclients".into(),
        "12000".into(),
    ];
    match side {
        Side::Plain => {}
        Side::Module => opts.module = Some(load.to_path_buf()),
        // The C module's `events-only` mode (its argument on the
        // loadmodule line).
        Side::Floor => opts.extra.extend([
            "--loadmodule".into(),
            format!("{} events-only", load.display()),
        ]),
    }
    opts
}

fn control(args: &[&str]) -> io::Result<()> {
    let out = Command::new("callgrind_control").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "callgrind_control {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// The instructions of a whole-process dump, and its calls of `serverCron`
/// (the cron ticks it covers).
fn dump_totals(dump: &Path) -> io::Result<(u64, u64)> {
    let text = fs::read_to_string(dump)?;
    let total = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no summary in {}", dump.display())))?;
    // Names are compressed: `cfn=(12) serverCron` once, `cfn=(12)` after.
    let id = text.lines().find_map(|l| {
        let rest = l.strip_prefix("cfn=").or_else(|| l.strip_prefix("fn="))?;
        let (id, name) = rest.split_once(' ')?;
        (name == "serverCron").then(|| id.to_string())
    });
    let mut ticks = 0;
    if let Some(id) = id {
        let mut after = false;
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("cfn=") {
                after = rest.split(' ').next() == Some(id.as_str());
            } else if let Some(calls) = l.strip_prefix("calls=") {
                if after {
                    ticks += calls
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                after = false;
            }
        }
    }
    Ok((total, ticks))
}

fn newest_dump(dir: &Path) -> io::Result<PathBuf> {
    fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("callgrind.out.")?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
        .ok_or_else(|| io::Error::other("callgrind wrote no dump"))
}

/// Zeroes the counters, runs `f`, dumps: the dump's instructions and ticks.
fn window(
    server: &Server,
    name: &str,
    f: impl FnOnce() -> io::Result<()>,
) -> io::Result<(u64, u64)> {
    let pid = server.pid().to_string();
    control(&["-z", &pid])?;
    f()?;
    control(&["-d", name, &pid])?;
    dump_totals(&newest_dump(server.dir())?)
}

/// The instructions of `dump` in the module's own code (the object
/// loaded from `REDIS_LOCK_MODULE`'s file, `libredis_lock.so` unless it is
/// named otherwise), from `callgrind_annotate`.
fn own_code(dump: &Path) -> io::Result<u64> {
    let module = crate::server::module_path()?;
    let object = format!(
        "{}]",
        module
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("libredis_lock.so")
    );
    let out = Command::new("callgrind_annotate")
        .arg("--threshold=100")
        .arg(dump)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.contains(&object))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .replace(',', "")
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// At-rest rows (instructions a second at `hz` 10 and 100, and of them the
/// module's own code) and the connection row of one side, on a server
/// counted whole.
fn rest_and_conn(dir: &Path, side: Side, load: &Path, rows: &mut Vec<Row>) -> io::Result<()> {
    let sub = dir.join(format!("tax-whole-{}", side.name()));
    fs::create_dir_all(&sub)?;
    let server = Server::start_whole(&server_opts(side, load, sub, 10))?;
    let pid = server.pid().to_string();
    control(&["-i", "on", &pid])?;
    let mut c = server.conn()?;
    c.ok(&[b"PING"])?;
    for hz in [10u32, 100, 1] {
        c.ok(&[b"CONFIG", b"SET", b"hz", hz.to_string().as_bytes()])?;
        std::thread::sleep(Duration::from_millis(500));
        // Not gated (`make bench-check`): the allocator's statistics at each
        // cron tick, most of an idle server's work, move with the heap's
        // layout by a few percent; the module's own code, gated, does not.
        let name = format!("at-rest:{}:hz{hz}", side.name());
        let (total, ticks) = window(&server, &name, || {
            std::thread::sleep(Duration::from_secs(REST_SECS));
            Ok(())
        })?;
        let per_tick = total as f64 / ticks.max(1) as f64;
        let per_second = per_tick * f64::from(hz);
        let own = own_code(&newest_dump(server.dir())?)? as f64 / ticks.max(1) as f64;
        eprintln!(
            "  {name}: {per_second:.0} instructions/s ({ticks} ticks; the module's own code {:.0}/s)",
            own * f64::from(hz)
        );
        if hz == 1 {
            // A connection's whole life, at `hz 1` (the fewest cron ticks
            // to take out: a connection's cost does not depend on `hz`).
            let name = format!("{}:conn", side.name());
            let port = server.port;
            let (total, ticks) = window(&server, &name, || {
                for _ in 0..CONNS {
                    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
                    s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
                    let mut reply = [0u8; 7];
                    s.read_exact(&mut reply)?;
                }
                // The closes, freed at the event loop's next turns.
                std::thread::sleep(Duration::from_millis(1000));
                Ok(())
            })?;
            let per_conn = (total as f64 - ticks as f64 * per_tick) / CONNS as f64;
            let own_conn = own_code(&newest_dump(server.dir())?)? as f64 / CONNS as f64;
            eprintln!(
                "  {name}: {per_conn:.0} instructions/connection ({ticks} ticks taken out; the module's own code {own_conn:.0})"
            );
            rows.push(Row {
                name,
                per_request: per_conn,
            });
            rows.push(Row {
                name: format!("{}:conn-own", side.name()),
                per_request: own_conn,
            });
            continue;
        }
        rows.push(Row {
            name,
            per_request: per_second,
        });
        rows.push(Row {
            name: format!("{}:rest-own-hz{hz}", side.name()),
            per_request: own * f64::from(hz),
        });
    }
    Ok(())
}

/// The write rows of one side at `hz 10`, a request's own work.
fn writes(
    dir: &Path,
    side: Side,
    load: &Path,
    requests: usize,
    rows: &mut Vec<Row>,
) -> io::Result<()> {
    let sub = dir.join(format!("tax-writes-{}", side.name()));
    fs::create_dir_all(&sub)?;
    let mut p = Profiled::start(&server_opts(side, load, sub, 10))?;
    // Not `module:`: `make bench-check` measures the module's side alone,
    // and gates the busy rows, at rest and per connection.
    write_rows(&mut p, &format!("hz10-{}", side.name()), requests, rows)
}

/// The write rows on `p`'s server, as `<tag>:<write>`, each measured once
/// (the gated rows: `hz10-*`).
fn write_rows(p: &mut Profiled, tag: &str, requests: usize, rows: &mut Vec<Row>) -> io::Result<()> {
    write_rows_own(p, tag, requests, (false, 1), rows)
}

/// How many places in the allocator each write row beside the API's floor
/// is measured at ([`write_rows_own`]).
const LAYOUTS: usize = 8;

/// The first arguments' lengths of the commands left unfinished by the
/// connections that move a request's strings between a row's parts
/// ([`hold_strings`]): string objects of 24 to 64 bytes, the sizes a
/// request's own strings take.
const HELD_LENGTHS: [usize; 5] = [2, 7, 12, 19, 27];

/// Connections to `port` that each leave a command unfinished, its first
/// argument sent (of `HELD_LENGTHS`' lengths in turn from `from`): the
/// server keeps that argument's string object until the rest comes, so
/// each holds one object of a request's sizes (and its arguments' array)
/// for as long as it stays open.
fn hold_strings(port: u16, from: usize, n: usize) -> io::Result<Vec<TcpStream>> {
    let mut held = Vec::with_capacity(n);
    for i in from..from + n {
        let len = HELD_LENGTHS[i % HELD_LENGTHS.len()];
        let mut c = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        let mut head = format!("*3\r\n${len}\r\n").into_bytes();
        head.extend(std::iter::repeat_n(b'h', len));
        head.extend_from_slice(b"\r\n");
        c.write_all(&head)?;
        held.push(c);
    }
    Ok(held)
}

/// Where the keys that move the allocator between a row's parts start
/// (far from the measured keys).
const LAYOUT_OFFSET: usize = 50_000_000;

/// The write rows on `p`'s server, as `<tag>:<write>`; with `own`, each
/// write's instructions in the module's own code too (`<tag>-own:<write>`).
/// With `layouts` above 1, each row's requests are split in as many
/// parts, each after a few more small keys kept (3 a part more than the
/// part before) and a few more connections that each hold a string object
/// of a request's sizes ([`hold_strings`], 5 a part more): their
/// allocations move where the next requests' strings are put, and the row
/// is its parts' median. Redis's own string work (`strcasecmp` in the
/// command's look-up and its options', `memcmp`, `memset`) costs more or
/// less by where those strings lie (a page's end, a vector's alignment),
/// which a whole run of one request repeated meets at every request or
/// never: up to 50 instructions a write either way between two servers or
/// two runs, with the same calls. Keys alone moved them on Redis 7.0's
/// floor but not on Redis 8.2's, whose keys embed their names (issue 39.3's
/// fifth pass: the floor's parts all alike, the module's not). The
/// module's own code from the last part's dump (the same in every part).
fn write_rows_own(
    p: &mut Profiled,
    tag: &str,
    requests: usize,
    (own, layouts): (bool, usize),
    rows: &mut Vec<Row>,
) -> io::Result<()> {
    let part = requests / layouts.max(1);
    for w in OtherWrite::ALL {
        let name = format!("{tag}:{}", w.short());
        let mut parts: Vec<f64> = Vec::new();
        let mut held: Vec<TcpStream> = Vec::new();
        for layout in 0..layouts.max(1) {
            if layout > 0 {
                let port = p.port();
                let more = p.uninstrumented(|_| hold_strings(port, held.len(), 5))?;
                held.extend(more);
            }
            let prepare = move |p: &mut Profiled, offset: usize, n: usize| -> io::Result<()> {
                if offset == 0 && layout > 0 {
                    p.set_strings("layout", 3 * layout, LAYOUT_OFFSET)?;
                }
                if !w.needs_strings() {
                    return Ok(());
                }
                p.set_strings("prepare", n, offset)
            };
            let part_name = match layouts {
                1 => name.clone(),
                _ => format!("{name}@{layout}"),
            };
            let per_request = p.measure(
                &part_name,
                (part, 1),
                &prepare,
                &|_, i, b| w.encode(i, b),
                &|r| w.expected(r),
            )?;
            if matches!(w, OtherWrite::Move) {
                // The moved keys leave database 2 (the rows' `FLUSHDB` empties
                // database 0 only).
                p.c.ok(&[b"SELECT", b"2"])?;
                p.c.ok(&[b"FLUSHDB", b"SYNC"])?;
                p.c.ok(&[b"SELECT", b"0"])?;
            }
            parts.push(per_request);
        }
        parts.sort_by(f64::total_cmp);
        let mid = parts.len() / 2;
        let per_request = match (parts.get(mid), parts.len() % 2) {
            (Some(m), 1) => *m,
            (Some(m), _) => (m + parts.get(mid.wrapping_sub(1)).copied().unwrap_or(*m)) / 2.0,
            (None, _) => continue,
        };
        rows.push(Row { name, per_request });
        if own {
            rows.push(Row {
                name: format!("{tag}-own:{}", w.short()),
                per_request: own_code(&newest_dump(p.dir())?)? as f64 / part as f64,
            });
        }
    }
    Ok(())
}

/// The busy shape of [`make_busy`] on the API's floor, which has no
/// locks: in database 1 as many plain keys (with the same names and a
/// lease's TTL) as the lock server holds locks, and as many connections
/// blocked as it has waiting clients (the floor's `LOCK.ACQUIRE ... WAIT
/// 0` blocks its caller as redis-lock blocks a waiter), a module timer
/// armed where redis-lock plans the shared lock's visit (the floor's
/// `LOCK.READ`), and what redis-lock hears while a grant is bound (the
/// floor's `LOCK.KEEPALIVE`: `CLIENT_CHANGE`); so that what Redis does for a fuller database,
/// blocked clients, a timer and those listeners counts on both sides.
fn make_plain_busy(port: u16, waiters: usize) -> io::Result<Vec<TcpStream>> {
    let mut keep = Vec::new();
    let mut holder = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    let mut buf = Vec::new();
    encode(&mut buf, &[Arg::B(b"SELECT"), Arg::B(b"1")]);
    for i in 0..waiters {
        encode(
            &mut buf,
            &[
                Arg::B(b"SET"),
                Arg::K(b"busy:held:", i),
                Arg::B(b"holder"),
                Arg::B(b"PX"),
                Arg::B(b"3600000"),
            ],
        );
    }
    for k in [&b"busy:bound"[..], b"busy:shared"] {
        encode(
            &mut buf,
            &[
                Arg::B(b"SET"),
                Arg::B(k),
                Arg::B(b"holder"),
                Arg::B(b"PX"),
                Arg::B(b"3600000"),
            ],
        );
    }
    // The visit redis-lock plans at the second reader's deadline.
    encode(
        &mut buf,
        &[
            Arg::B(b"LOCK.READ"),
            Arg::B(b"busy:shared"),
            Arg::B(b"r2"),
            Arg::B(b"3500000"),
        ],
    );
    // What redis-lock hears while a grant is bound (the floor's
    // `LOCK.KEEPALIVE`): closed connections.
    encode(&mut buf, &[Arg::B(b"LOCK.KEEPALIVE"), Arg::B(b"3600000")]);
    holder.write_all(&buf)?;
    let want = 1 + waiters + 2 + 1 + 1;
    let mut got = 0;
    let mut chunk = [0u8; 65536];
    holder.set_read_timeout(Some(Duration::from_secs(120)))?;
    while got < want {
        let n = holder.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("the busy holder's connection closed"));
        }
        got += chunk[..n].iter().filter(|b| **b == b'\n').count();
    }
    keep.push(holder);
    for i in 0..waiters {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        s.write_all(&waiter_request(i))?;
        keep.push(s);
    }
    wait_for(port, "clients", "blocked_clients", waiters)?;
    Ok(keep)
}

/// A waiting client's request: `SELECT 1`, then `LOCK.ACQUIRE` of a held
/// key with `WAIT 0` (no limit).
fn waiter_request(i: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(&mut buf, &[Arg::B(b"SELECT"), Arg::B(b"1")]);
    encode(
        &mut buf,
        &[
            Arg::B(b"LOCK.ACQUIRE"),
            Arg::K(b"busy:held:", i),
            Arg::K(b"waiter:", i),
            Arg::B(b"3600000"),
            Arg::B(b"WAIT"),
            Arg::B(b"0"),
        ],
    );
    buf
}

/// Waits until `INFO <section>`'s `field` reads at least `n`.
fn wait_for(port: u16, section: &str, field: &str, n: usize) -> io::Result<()> {
    let mut c = crate::server::connect(port)?;
    let start = Instant::now();
    loop {
        let got: usize = c.try_info_field(section, field)?.parse().unwrap_or(0);
        if got >= n {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(io::Error::other(format!(
                "{field}: {got} of {n} after 600 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Other clients' writes on the API's floor, quiet and in the busy shape
/// of the lock server beside it ([`make_plain_busy`]), at its `hz`: rows
/// `floor-<tag>-writes:<write>`.
fn floor_rows(
    dir: &Path,
    floor: &Path,
    requests: usize,
    shapes: &[usize],
    rows: &mut Vec<Row>,
) -> io::Result<()> {
    for &waiters in shapes {
        let tag = match waiters {
            1 => "busy".to_string(),
            n => format!("busy{}k", n / 1000),
        };
        let sub = dir.join(format!("tax-floor-{tag}"));
        fs::create_dir_all(&sub)?;
        let mut opts = profile::options(None, sub);
        opts.extra.extend([
            "--maxclients".into(),
            "12000".into(),
            "--loadmodule".into(),
            format!("{} events-only", floor.display()),
        ]);
        // Its clocks held still in each measured step, as the lock
        // server's beside it ([`busy_rows`]).
        let mut p = Profiled::start_frozen(&opts)?;
        p.flush_db_only = true;
        p.settle = true;
        if waiters == 1 && !writes_only() {
            write_rows_own(
                &mut p,
                "floor-quiet-writes",
                requests,
                (false, LAYOUTS),
                rows,
            )?;
        }
        let keep = p.uninstrumented(|p| make_plain_busy(p.port(), waiters))?;
        p.settle_shape()?;
        write_rows_own(
            &mut p,
            &format!("floor-{tag}-writes"),
            requests,
            (false, LAYOUTS),
            rows,
        )?;
        drop(keep);
    }
    Ok(())
}

/// The busy shape in database 1 (see the top), with `waiters` clients
/// waiting (one each on a key of its own): the connections that keep it,
/// to be dropped after the rows.
fn make_busy(port: u16, waiters: usize) -> io::Result<Vec<TcpStream>> {
    let mut keep = Vec::new();
    let mut holder = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    let mut buf = Vec::new();
    encode(&mut buf, &[Arg::B(b"SELECT"), Arg::B(b"1")]);
    for i in 0..waiters {
        encode(
            &mut buf,
            &[
                Arg::B(b"LOCK.ACQUIRE"),
                Arg::K(b"busy:held:", i),
                Arg::B(b"holder"),
                Arg::B(b"3600000"),
            ],
        );
    }
    // A grant bound to this open connection; a shared lock whose readers
    // run out apart (its visit planned).
    for args in [
        &[
            &b"LOCK.ACQUIRE"[..],
            b"busy:bound",
            b"holder",
            b"3600000",
            b"BIND",
        ][..],
        &[b"LOCK.READ", b"busy:shared", b"r1", b"3600000"],
        &[b"LOCK.READ", b"busy:shared", b"r2", b"3500000"],
    ] {
        let args: Vec<Arg> = args.iter().map(|a| Arg::B(a)).collect();
        encode(&mut buf, &args);
    }
    holder.write_all(&buf)?;
    // Its replies: +OK, then one integer per grant.
    let want = 1 + waiters + 3;
    let mut got = 0;
    let mut chunk = [0u8; 65536];
    holder.set_read_timeout(Some(Duration::from_secs(120)))?;
    while got < want {
        let n = holder.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::other("the busy holder's connection closed"));
        }
        got += chunk[..n].iter().filter(|b| **b == b'\n').count();
    }
    keep.push(holder);
    for i in 0..waiters {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
        s.write_all(&waiter_request(i))?;
        keep.push(s);
    }
    wait_for(port, "lock", "lock_waiters", waiters)?;
    Ok(keep)
}

/// The lock commands and another client's `SET NX PX`, as rows
/// `<tag>:<command>`, the measured keys in database 0.
fn lock_rows(p: &mut Profiled, tag: &str, requests: usize, rows: &mut Vec<Row>) -> io::Result<()> {
    // Another client's write first: on names that were never locks (the
    // lock rows' locks go with a `FLUSHDB`, which leaves their names
    // counted while other locks exist: design.md, "Lock names, counted").
    let name = format!("{tag}:{}", Plain::SetNxPx.short());
    let per_request = p.measure_plain(&name, Plain::SetNxPx, requests)?;
    rows.push(Row { name, per_request });
    for op in Op::ALL {
        if !op.needs_module() {
            continue;
        }
        let name = format!("{tag}:{}", op.short());
        let per_request = p.measure_op(&name, op, requests)?;
        rows.push(Row { name, per_request });
    }
    Ok(())
}

/// The lock commands on one server, quiet (`quiet:`), then busy with one
/// waiter (`busy:`); with `all`, on a second server with 10,000 waiters
/// (`busy10k:`). Quiet and busy rows empty only database 0 between rows.
fn busy_rows(
    dir: &Path,
    module: &Path,
    requests: usize,
    all: bool,
    rows: &mut Vec<Row>,
) -> io::Result<()> {
    let writes_only = all && writes_only();
    for waiters in [1, MANY_WAITERS] {
        if waiters != 1 && (!all || writes_only) {
            continue;
        }
        let tag = match waiters {
            1 => "busy".to_string(),
            n => format!("busy{}k", n / 1000),
        };
        let sub = dir.join(format!("tax-{tag}"));
        fs::create_dir_all(&sub)?;
        let mut opts = profile::options(Some(module), sub);
        opts.extra.extend(["--maxclients".into(), "12000".into()]);
        // The server's clocks held still in each measured step
        // ([`Profiled::start_frozen`]), quiet and busy alike: the shape's
        // state is what it was (a reader's lease running, clients
        // waiting), but nothing that depends on the step's wall time,
        // which under valgrind follows the machine's load, changes within
        // it (a hold time's histogram bucket, the allocator's decay, the
        // module's timers and Redis's cron, which only run between steps).
        let mut p = Profiled::start_frozen(&opts)?;
        p.flush_db_only = true;
        p.settle = true;
        p.filter_at_rest = Some(p.filter_memory()?);
        // (Not with `make bench-check`, which gates the busy rows alone.)
        if waiters == 1 && all && !writes_only {
            lock_rows(&mut p, "quiet", requests, rows)?;
            if !locks_only() {
                write_rows_own(&mut p, "quiet-writes", requests, (true, LAYOUTS), rows)?;
            }
        }
        let keep = p.uninstrumented(|p| make_busy(p.port(), waiters))?;
        p.settle_shape()?;
        p.filter_at_rest = Some(p.filter_memory()?);
        // Other clients' writes while locks are in use (not gated: a row
        // of `make bench-check` is `busy:`), first: on names that were
        // never locks (the lock rows' locks in database 0 go with a
        // `FLUSHDB`, which leaves their names counted while other locks
        // exist: design.md, "Lock names, counted").
        if all && !locks_only() {
            write_rows_own(
                &mut p,
                &format!("{tag}-writes"),
                requests,
                (true, LAYOUTS),
                rows,
            )?;
        }
        if !writes_only {
            lock_rows(&mut p, &tag, requests, rows)?;
        }
        drop(keep);
    }
    Ok(())
}

/// Section 11's rows. `all`: every side and both busy shapes; else the
/// module's rows that `make bench-check` gates.
pub fn profile(dir: &Path, module: &Path, requests: usize, all: bool) -> io::Result<Vec<Row>> {
    fs::create_dir_all(dir)?;
    let mut rows = Vec::new();
    if all && writes_only() {
        // The third table's busy columns alone (one waiter).
        floor_rows(dir, &profile::build_floor(dir)?, requests, &[1], &mut rows)?;
        busy_rows(dir, module, requests, all, &mut rows)?;
        return Ok(rows);
    }
    if all && locks_only() {
        busy_rows(dir, module, requests, all, &mut rows)?;
        return Ok(rows);
    }
    let sides: Vec<(Side, PathBuf)> = match all {
        true => vec![
            (Side::Plain, PathBuf::new()),
            (Side::Floor, profile::build_floor(dir)?),
            (Side::Module, module.to_path_buf()),
        ],
        false => vec![(Side::Module, module.to_path_buf())],
    };
    for (side, load) in &sides {
        rest_and_conn(dir, *side, load, &mut rows)?;
    }
    if all {
        for (side, load) in &sides {
            writes(dir, *side, load, requests, &mut rows)?;
        }
        if let Some((_, floor)) = sides.iter().find(|(s, _)| *s == Side::Floor) {
            floor_rows(dir, floor, requests, &[1, MANY_WAITERS], &mut rows)?;
        }
    }
    busy_rows(dir, module, requests, all, &mut rows)?;
    Ok(rows)
}

/// Section 11 (Markdown) from the last run's rows; empty without them.
pub fn callgrind_table(runs: &[Vec<Row>], requests: usize) -> String {
    let Some(rows) = runs.last() else {
        return String::new();
    };
    let get = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map_or(f64::NAN, |r| r.per_request)
    };
    if get("module:rest-own-hz10").is_nan() {
        return String::new();
    }
    let mut s = String::from("\n### 11. What the module costs others (callgrind)\n\n");
    if !get("at-rest:plain:hz10").is_nan() {
        s.push_str(&format!(
            "Servers from the same binary: without the module, with the C module's `events-only` mode (the same event subscriptions, empty callbacks: the module API's floor), with the module; no lock in use. At rest: the whole process for {REST_SECS} s of nothing, per cron tick times `hz`. A connection: opened, one PING, closed ({CONNS} of them), the whole process less the cron ticks in it. Writes: {requests} requests each on keys that are not locks, a request's own work, `hz 10`.\n\n"
        ));
        s.push_str("| | without the module | the API's floor | with the module | ratio (module / without) | module - floor |\n|---|---:|---:|---:|---:|---:|\n");
        let mut line = |label: &str, short: &str, unit: &str| {
            let side =
                |side: &str| match (short.strip_prefix("at-rest:"), short.strip_prefix("hz10-")) {
                    (Some(hz), _) => get(&format!("at-rest:{side}:{hz}")),
                    (_, Some(w)) => get(&format!("hz10-{side}:{w}")),
                    _ => get(&format!("{side}:{short}")),
                };
            let (p, f, m) = (side("plain"), side("events-floor"), side("module"));
            let ratio = match p > 0.0 {
                true => format!("{:.3}x", m / p),
                false => String::new(),
            };
            s.push_str(&format!(
                "| {label} | {p:.0} | {f:.0} | {m:.0} | {ratio} | {:+.0}{unit} |\n",
                m - f
            ));
        };
        line(
            "the server at rest, `hz 10`, instructions a second",
            "at-rest:hz10",
            "",
        );
        line(
            "the server at rest, `hz 100`, instructions a second",
            "at-rest:hz100",
            "",
        );
        line("of it the module's own code, `hz 10`", "rest-own-hz10", "");
        line(
            "of it the module's own code, `hz 100`",
            "rest-own-hz100",
            "",
        );
        line(
            "a connection opened, one PING, closed (cron at `hz 1`, its ticks taken out)",
            "conn",
            "",
        );
        line("of it the module's own code", "conn-own", "");
        for w in OtherWrite::ALL {
            line(w.label(), &format!("hz10-{}", w.short()), "");
        }
    }
    s.push_str(&format!(
        "\n#### Lock commands on a quiet server and on a busy one ({requests} requests each, `hz 1`, the clocks held still in each step)\n\nBoth on one server, the measured keys in database 0 (`FLUSHDB` between rows): quiet first, then busy, with in database 1 one client waiting for a held lock, a shared lock whose two readers' leases run out apart (its visit planned), a grant bound to an open connection. The 10,000 waiters (on 10,000 keys) on a second server.\n\n"
    ));
    let many = !get(&format!("busy10k:{}", Op::Acquire.short())).is_nan();
    s.push_str("| command | quiet | busy | ratio |");
    if many {
        s.push_str(" busy, 10,000 waiting on other keys | ratio |");
    }
    s.push('\n');
    s.push_str("|---|---:|---:|---:|");
    if many {
        s.push_str("---:|---:|");
    }
    s.push('\n');
    let mut line = |label: &str, short: &str| {
        let q = get(&format!("quiet:{short}"));
        let b = get(&format!("busy:{short}"));
        if b.is_nan() {
            return;
        }
        s.push_str(&format!("| {label} | {q:.0} | {b:.0} | {:.3}x |", b / q));
        if many {
            let m = get(&format!("busy10k:{short}"));
            s.push_str(&format!(" {m:.0} | {:.3}x |", m / q));
        }
        s.push('\n');
    };
    for op in Op::ALL {
        if op.needs_module() {
            line(op.label(), op.short());
        }
    }
    let set = Plain::SetNxPx;
    line(&format!("another client's {}", set.label()), set.short());
    if !get("busy-writes:expire").is_nan() {
        s.push_str(&format!(
            "\n#### Other clients' writes while locks are in use ({requests} requests each, in {LAYOUTS} parts)\n\nOn keys that are not locks, database 0, `hz 1`, each row the median of {LAYOUTS} parts, the allocator moved between them by a few small keys and a few string objects of a request's sizes kept (Redis's own string work costs more or less by where its strings lie, which a run of one repeated request meets at every request or never), each beside the API's floor in the same shape: quiet (no lock; the floor: nothing), busy (database 1 as above: three locks, one client waiting; the floor: three plain keys of the same names and TTLs, one connection more blocked by the floor's `LOCK.ACQUIRE ... WAIT 0` as redis-lock blocks a waiter, a module timer armed where redis-lock plans its visit, and what redis-lock hears while a grant is bound: `CLIENT_CHANGE`), and with 10,000 more locks, each waited for (the floor: 10,000 plain keys more, 10,000 connections more blocked). The module's own code: `libredis_lock.so`'s instructions a write, from the last part's dump.\n\n| | floor, quiet | quiet | - floor | floor, busy | busy | - floor | own code | floor, 10,000 keys | 10,000 locks waited for | - floor | own code |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        ));
        for w in OtherWrite::ALL {
            let at = |tag: &str| get(&format!("{tag}:{}", w.short()));
            let (fq, q) = (at("floor-quiet-writes"), at("quiet-writes"));
            let (fb, b, ob) = (
                at("floor-busy-writes"),
                at("busy-writes"),
                at("busy-writes-own"),
            );
            let (fm, m, om) = (
                at("floor-busy10k-writes"),
                at("busy10k-writes"),
                at("busy10k-writes-own"),
            );
            s.push_str(&format!(
                "| {} | {fq:.0} | {q:.0} | {:+.0} | {fb:.0} | {b:.0} | {:+.0} | {ob:.0} | {fm:.0} | {m:.0} | {:+.0} | {om:.0} |\n",
                w.label(),
                q - fq,
                b - fb,
                m - fm
            ));
        }
    }
    s
}
