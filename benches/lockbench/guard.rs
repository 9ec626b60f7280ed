//! Section 9: guarded writes (issue 33). A write that must happen only while
//! its writer holds a lock, four ways, side by side in one run:
//!
//! - `SET data value`: the write alone, unguarded (no module), the floor;
//! - `LOCK.GUARD lock owner CALL SET data value`, the lock held by `owner`;
//! - the check-then-set script users write today for a `SET NX PX` lock
//!   ([`LUA_GUARDED_SET`], `EVALSHA`), the lock taken with `SET NX PX`;
//! - `LOCK.GUARD` with `TOKEN`, under the holder's fencing token.
//!
//! Request `i` guards with lock `lk:i` (held for an hour, taken before the
//! timed or counted requests, not measured) and writes `data:i`. The
//! unguarded `SET` and the script run on a server without the module (what
//! a user compares with), with the same `SET NX PX` locks in its keyspace,
//! so that all four write into keyspaces of the same size.
//!
//! Throughput (`--only 9`): as section 1 measures (50 connections x
//! pipeline 16, one client thread, every reply checked), in interleaved
//! rounds, each pair's order reversed every other round; each ratio is the
//! median of the ratios within a round. Instructions (`--callgrind --only
//! 9`, and within every `--callgrind` run): the profile's servers and
//! steps ([`crate::profile`]), rows `plain:guard-*` on the plain server and
//! `lock-guard-*` on the module's, which `make bench-check` gates.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::Path;

use crate::common::{encode, Arg, Conn, Reply};
use crate::profile::{self, Profiled, Row};
use crate::server::{Options, Server, TempDir};
use crate::stats;
use crate::throughput::{Pool, KEY_PREFIX, OWNER, TTL};

/// The check-then-set users write for a `SET NX PX` lock: KEYS[1] the
/// lock, KEYS[2] the data, ARGV[1] the owner, ARGV[2] the value.
pub const LUA_GUARDED_SET: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[2], ARGV[2]) else return redis.error_reply('NOTHELD') end";

/// The written keys: `data:i`.
const DATA_PREFIX: &[u8] = b"data:";
/// The written value: a UUID, as section 1's `SET` writes.
const VALUE: &[u8] = OWNER;
/// The database of the throughput runs, on both servers.
const DB: &[u8] = b"9";

/// One measured way to write.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Way {
    Set,
    Guard,
    Lua,
    GuardToken,
}

impl Way {
    /// Table order, and the order of a round: each guard next to what it is
    /// compared with.
    pub const ALL: [Way; 4] = [Way::Set, Way::Guard, Way::Lua, Way::GuardToken];

    pub fn label(self) -> &'static str {
        match self {
            Way::Set => "`SET data value` (unguarded, no module)",
            Way::Guard => "`LOCK.GUARD lock owner CALL SET data value`",
            Way::Lua => "Lua check-then-set (`EVALSHA`, lock taken with `SET NX PX`)",
            Way::GuardToken => "`LOCK.GUARD lock owner TOKEN t CALL SET data value`",
        }
    }

    /// The callgrind row: `lock-` rows are the module's (gated by
    /// `make bench-check`), `plain:` rows Redis's.
    pub fn row(self) -> &'static str {
        match self {
            Way::Set => "plain:guard-base-set",
            Way::Guard => "lock-guard-set",
            Way::Lua => "plain:guard-lua",
            Way::GuardToken => "lock-guard-token-set",
        }
    }

    fn needs_module(self) -> bool {
        matches!(self, Way::Guard | Way::GuardToken)
    }

    /// Takes lock `lk:i` for the request `i`: `LOCK.ACQUIRE` (answers the
    /// token) with the module, `SET NX PX` without.
    fn encode_lock(self, i: usize, buf: &mut Vec<u8>) {
        let k = Arg::K(KEY_PREFIX, i);
        let b = Arg::B;
        if self.needs_module() {
            encode(buf, &[b(b"LOCK.ACQUIRE"), k, b(OWNER), b(TTL)]);
        } else {
            encode(buf, &[b(b"SET"), k, b(OWNER), b(b"NX"), b(b"PX"), b(TTL)]);
        }
    }

    /// The lock's token (as a decimal) from the reply to
    /// [`Way::encode_lock`]: empty for a `SET NX PX` lock; `None` when the
    /// lock was not taken.
    fn taken(self, r: &Reply) -> Option<Vec<u8>> {
        match (self.needs_module(), r) {
            (true, Reply::Int(t)) if *t > 0 => Some(t.to_string().into_bytes()),
            (false, r) if r.is("OK") => Some(Vec::new()),
            _ => None,
        }
    }

    /// Request `i`, with its lock's token and the script's SHA1.
    fn encode(self, i: usize, token: &[u8], sha: &[u8], buf: &mut Vec<u8>) {
        let (lock, data) = (Arg::K(KEY_PREFIX, i), Arg::K(DATA_PREFIX, i));
        let b = Arg::B;
        match self {
            Way::Set => encode(buf, &[b(b"SET"), data, b(VALUE)]),
            Way::Guard => encode(
                buf,
                &[
                    b(b"LOCK.GUARD"),
                    lock,
                    b(OWNER),
                    b(b"CALL"),
                    b(b"SET"),
                    data,
                    b(VALUE),
                ],
            ),
            Way::Lua => encode(
                buf,
                &[
                    b(b"EVALSHA"),
                    b(sha),
                    b(b"2"),
                    lock,
                    data,
                    b(OWNER),
                    b(VALUE),
                ],
            ),
            Way::GuardToken => encode(
                buf,
                &[
                    b(b"LOCK.GUARD"),
                    lock,
                    b(OWNER),
                    b(b"TOKEN"),
                    b(token),
                    b(b"CALL"),
                    b(b"SET"),
                    data,
                    b(VALUE),
                ],
            ),
        }
    }
}

/// Loads [`LUA_GUARDED_SET`] (`SCRIPT LOAD`): its SHA1.
fn load_script(c: &mut Conn) -> io::Result<Vec<u8>> {
    match c.ok(&[b"SCRIPT", b"LOAD", LUA_GUARDED_SET.as_bytes()])? {
        Reply::Bulk(sha) => Ok(sha),
        r => Err(io::Error::other(format!("SCRIPT LOAD: {}", r.show()))),
    }
}

// ---------------------------------------------------------------------------
// Throughput
// ---------------------------------------------------------------------------

/// The throughput runs' results: each way's rate in each round.
pub type Results = stats::Rounds<Way>;

/// One server of the runs: a connection for `FLUSHDB`, the pool, the
/// script's SHA1 there.
struct Side {
    c: Conn,
    pool: Pool,
    sha: Vec<u8>,
}

impl Side {
    fn new(port: u16, conns: usize, pipeline: usize) -> io::Result<Side> {
        let mut c = crate::server::connect(port)?;
        c.ok(&[b"SELECT", DB])?;
        let sha = load_script(&mut c)?;
        let mut pool = Pool::new(port, conns, pipeline)?;
        pool.select(9)?;
        Ok(Side { c, pool, sha })
    }

    /// One timed run of `w` on an emptied database with its locks taken
    /// (not timed): its rate; unexpected replies are noted in `problems`.
    fn run(&mut self, w: Way, requests: usize, problems: &mut Vec<String>) -> io::Result<f64> {
        self.c.ok(&[b"FLUSHDB"])?;
        let tokens = RefCell::new(vec![Vec::new(); requests]);
        let taken =
            self.pool.run(
                requests,
                &|i, buf| w.encode_lock(i, buf),
                &|i, r| match w.taken(r) {
                    Some(t) => {
                        tokens.borrow_mut()[i] = t;
                        true
                    }
                    None => false,
                },
            )?;
        if taken.unexpected > 0 {
            return Err(io::Error::other(format!(
                "{}: {} locks not taken ({})",
                w.row(),
                taken.unexpected,
                taken.example.unwrap_or_default()
            )));
        }
        let tokens = tokens.into_inner();
        let sha = &self.sha;
        let out = self.pool.run(
            requests,
            &|i, buf| w.encode(i, &tokens[i], sha, buf),
            &|_, r| r.is("OK"),
        )?;
        if out.unexpected > 0 {
            problems.push(format!(
                "{}: {} unexpected replies (first: {})",
                w.row(),
                out.unexpected,
                out.example.clone().unwrap_or_default()
            ));
        }
        Ok(out.rate())
    }
}

/// `rounds` interleaved rounds of the four ways, `requests` each: the
/// guards on the module's server (`module_port`), the unguarded `SET` and
/// the script on a server without the module, started here.
pub fn run(
    module_port: u16,
    requests: usize,
    rounds: usize,
    conns: usize,
    pipeline: usize,
) -> io::Result<Results> {
    let plain_dir = TempDir::new()?;
    let plain_server = Server::start(&Options {
        module: None,
        dir: plain_dir.0.clone(),
        callgrind: false,
        extra: Vec::new(),
    })?;
    let mut module = Side::new(module_port, conns, pipeline)?;
    let mut plain = Side::new(plain_server.port, conns, pipeline)?;
    let mut results = Results::new(requests, rounds, conns, pipeline);
    for round in 1..=rounds {
        eprint!("  round {round}/{rounds}:");
        let mut order = Way::ALL.to_vec();
        if round.is_multiple_of(2) {
            order.reverse();
        }
        for w in order {
            let side = if w.needs_module() {
                &mut module
            } else {
                &mut plain
            };
            let rate = side.run(w, requests, &mut results.problems)?;
            eprint!(" {} {}", w.row(), stats::rate(rate));
            results.rates.entry(w).or_default().push(rate);
        }
        eprintln!();
    }
    module.c.ok(&[b"FLUSHDB"])?;
    Ok(results)
}

/// What each guard is compared with, and the throughput goal, if any.
const COMPARED: [(Way, Way, Option<f64>); 4] = [
    (Way::Guard, Way::Set, None),
    (Way::Guard, Way::Lua, Some(2.0)),
    (Way::GuardToken, Way::Set, None),
    (Way::GuardToken, Way::Lua, Some(2.0)),
];

/// The throughput goals: (goal, measured, met).
pub fn goals(r: &Results) -> Vec<(String, String, bool)> {
    COMPARED
        .iter()
        .filter_map(|&(w, base, goal)| {
            let goal = goal?;
            let ratio = r.paired_ratio(w, base);
            Some((
                format!("{} >= {goal} x {} (req/s)", w.label(), base.label()),
                stats::ratio(ratio),
                ratio >= goal,
            ))
        })
        .collect()
}

/// The throughput table (Markdown).
pub fn table(r: &Results) -> String {
    let mut s = format!(
        "### 9. Guarded writes: throughput ({} requests per run, {} connections x pipeline {}, median of {} interleaved rounds; request i guards with lock `lk:i`, held, and writes `data:i`)\n\n",
        r.requests, r.conns, r.pipeline, r.rounds
    );
    s.push_str("| command | req/s (median) | rounds min-max | compared with | ratio | goal |\n");
    s.push_str("|---|---:|---:|---|---:|---|\n");
    for w in Way::ALL {
        let rates = r.rates.get(&w).cloned().unwrap_or_default();
        let (lo, hi) = stats::min_max(&rates);
        let head = format!(
            "| {} | {} | {}-{} ",
            w.label(),
            stats::rate(r.median(w)),
            stats::rate(lo),
            stats::rate(hi)
        );
        let bases: Vec<_> = COMPARED.iter().filter(|c| c.0 == w).collect();
        if bases.is_empty() {
            s.push_str(&head);
            s.push_str("| | | |\n");
        }
        for (i, &&(_, base, goal)) in bases.iter().enumerate() {
            let ratio = r.paired_ratio(w, base);
            let goal = match goal {
                Some(g) if ratio >= g => format!(">= {g} met"),
                Some(g) => format!(">= {g} **not met**"),
                None => String::new(),
            };
            s.push_str(if i == 0 { &head } else { "| | | " });
            s.push_str(&format!(
                "| {} | {} | {goal} |\n",
                base.label(),
                stats::ratio(ratio)
            ));
        }
    }
    for p in &r.problems {
        s.push_str(&format!("\n**Unexpected replies**: {p}\n"));
    }
    s
}

// ---------------------------------------------------------------------------
// Instructions (callgrind)
// ---------------------------------------------------------------------------

/// The four ways under callgrind, as rows [`Way::row`]: the guards on a
/// server with `module`, and with `baselines` the unguarded `SET` and the
/// script on a server without it (`make bench-check` measures only the
/// guards). Each server is the profile's ([`Profiled`]), started here, one
/// at a time, its dumps below `dir`.
pub fn profile(
    dir: &Path,
    module: &Path,
    requests: usize,
    baselines: bool,
) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let sides: &[bool] = if baselines { &[false, true] } else { &[true] };
    for &with_module in sides {
        let sub = dir.join(if with_module {
            "guard-module"
        } else {
            "guard-plain"
        });
        std::fs::create_dir_all(&sub)?;
        let mut p = Profiled::start(&profile::options(with_module.then_some(module), sub))?;
        let sha = load_script(&mut p.c)?;
        for w in Way::ALL {
            if w.needs_module() != with_module {
                continue;
            }
            // Each lock's token, by request (the warm-up's too).
            let tokens: RefCell<HashMap<usize, Vec<u8>>> = RefCell::new(HashMap::new());
            let prepare = |p: &mut Profiled, offset: usize, n: usize| -> io::Result<()> {
                // One connection, one request at a time: replies in order.
                let got = RefCell::new(Vec::with_capacity(n));
                p.run(
                    "prepare",
                    (n, offset, 1),
                    &|_, i, b| w.encode_lock(i, b),
                    &|r| {
                        let t = w.taken(r);
                        let ok = t.is_some();
                        got.borrow_mut().push(t.unwrap_or_default());
                        ok
                    },
                )?;
                let mut tokens = tokens.borrow_mut();
                for (k, t) in got.into_inner().into_iter().enumerate() {
                    tokens.insert(offset + k, t);
                }
                Ok(())
            };
            let per_request = p.measure(
                w.row(),
                (requests, 1),
                &prepare,
                &|_, i, b| {
                    let tokens = tokens.borrow();
                    let t = tokens.get(&i).map_or(&[][..], Vec::as_slice);
                    w.encode(i, t, &sha, b)
                },
                &|r| r.is("OK"),
            )?;
            rows.push(Row {
                name: w.row().to_string(),
                per_request,
            });
        }
    }
    Ok(rows)
}

/// The instruction goal: a guard at most this many times a plain `SET`.
const INSTRUCTION_GOAL: f64 = 1.5;

/// The callgrind table (Markdown) from the last of `runs`, with the
/// instruction goal's rows; empty when the guard rows were not measured.
pub fn callgrind_table(runs: &[Vec<Row>], requests: usize) -> String {
    let Some(rows) = runs.last() else {
        return String::new();
    };
    let get = |w: Way| {
        rows.iter()
            .find(|r| r.name == w.row())
            .map_or(f64::NAN, |r| r.per_request)
    };
    if get(Way::Guard).is_nan() {
        return String::new();
    }
    let (set, lua) = (get(Way::Set), get(Way::Lua));
    let mut s = format!(
        "\n### 9. Guarded writes: instructions per request (callgrind, server side, {requests} requests each, one connection, one request at a time; request i guards with lock `lk:i`, held, and writes `data:i`)\n\n"
    );
    s.push_str("| command | row | instructions/request | vs `SET data value` | vs the Lua check-then-set | goal |\n");
    s.push_str("|---|---|---:|---:|---:|---|\n");
    for w in Way::ALL {
        let n = get(w);
        let goal = match w {
            Way::Guard | Way::GuardToken if n / set <= INSTRUCTION_GOAL => {
                format!("<= {INSTRUCTION_GOAL}x `SET` met")
            }
            Way::Guard | Way::GuardToken => format!("<= {INSTRUCTION_GOAL}x `SET` **not met**"),
            _ => String::new(),
        };
        s.push_str(&format!(
            "| {} | `{}` | {n:.0} | {} | {} | {goal} |\n",
            w.label(),
            w.row(),
            stats::ratio(n / set),
            stats::ratio(n / lua),
        ));
    }
    s
}
