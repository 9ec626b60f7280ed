//! `make bench` / `cargo bench --bench lockbench`: redis-lock side by side with
//! `SET NX PX` and the lock libraries' Lua scripts, on one redis-server that
//! this program starts itself (127.0.0.1, a free port, its own temporary
//! directory, the release module), measured in one run and printed as one
//! report (Markdown) with the machine and the server version on top.
//!
//! 1. throughput, uncontended, unique keys (`throughput`); with
//!    `--callgrind --only 1`, a reader's `READ` and `RENEW` on a key of
//!    1,000 readers alone (`wide:` rows, in every `--callgrind` run too);
//! 2. contention on one key: WAIT vs polling vs back-off (`contention`);
//! 3. latency of a hand-off and of a grant after an expiry (`latency`);
//! 4. memory and 5. persistence of many held locks (`memory`);
//! 6. locks bound to their connection: kill to grant, keepalive, the stall
//!    of a disconnect with many bound locks (`bind`);
//! 7. what deadlock detection costs with 10,000 requests waiting on 1,000
//!    keys (`deadlock`);
//!    With `--callgrind`, what `BIND` adds to a grant and a release, with
//!    100,000 more bound locks on the connection and without (`--only 6`:
//!    those rows alone);
//! 9. guarded writes: `LOCK.GUARD ... CALL SET` against `SET` and the Lua
//!    check-then-set script (`guard`; with `--callgrind --only 9`, its
//!    instructions alone);
//! 10. stalls: for each shape of state clients can build (wide wait-for
//!     graphs, long chains, deadlines together, a million bound holders,
//!     20,000 holders of one key, flushes and swaps of a million bound or
//!     session holders), the longest PING on another connection
//!     and the request's own server time (`stalls`; `--only 10` alone, on
//!     a server of its own).
//!
//! Options: `--quick` (or `BENCH_QUICK=1`): a ~40 s smoke run with small
//! counts. `--only 1,3`: some sections only. `--storms` (with `--only 8`):
//! section 8's storms alone. `--shapes 1,3` (with `--only 10`): some of
//! section 10's shapes; `--wide 200000` (with shape 13): its reader
//! counts (200,000 and 1,000,000 else); `--holders 1000000` (with shape
//! 6): its holder count (20,000 else). `--callgrind`: instructions per
//! request of each command under `valgrind --tool=callgrind` instead (slow,
//! repeatable). Environment: `REDIS_LOCK_MODULE` (the module to load; else
//! target/release/libredis_lock.so, built when missing or stale).
//!
//! The full run writes the chart to docs/bench/contention.svg; every run
//! writes its report to target/lockbench/.

// The test harness (tests/common): its client and its server launcher are
// the bench's too.
#[path = "../../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

mod bind;
mod chart;
mod contention;
mod deadlock;
mod guard;
mod latency;
mod memory;
mod profile;
mod queues;
mod renewals;
mod server;
mod stalls;
mod stats;
mod tax;
mod throughput;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use server::{Options, Server};

/// How much to measure.
struct Plan {
    name: &'static str,
    rounds: usize,
    requests: usize,
    conns: usize,
    pipeline: usize,
    contention_secs: f64,
    workers: Vec<usize>,
    latency: latency::Samples,
    mem_keys: usize,
    shared_grants: usize,
    callgrind_requests: usize,
    /// `--check`'s requests a row (CI's `make bench-check`), but section
    /// 6's bound grants ([`Plan::callgrind_requests`]).
    check_requests: usize,
    bind_samples: usize,
    stall_locks: usize,
    deadlock_keys: usize,
    deadlock_waiters: usize,
    /// Section 8's sizes: clients already waiting.
    queue_sizes: Vec<usize>,
    /// `--storms`: section 8's storms alone, without its growth rows.
    storms_only: bool,
    /// Section 10's sizes.
    stalls: stalls::Plan,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            name: "full",
            rounds: 5,
            requests: 300_000,
            conns: 50,
            pipeline: 16,
            contention_secs: 3.0,
            workers: vec![8, 64, 256],
            latency: latency::Samples {
                handoff: 2000,
                handoff_poll: 300,
                expiry: 300,
                expiry_poll: 150,
            },
            mem_keys: 1_000_000,
            shared_grants: 100_000,
            callgrind_requests: 20_000,
            // Half, for CI's time: each gated row within 0.83% of its figure
            // at 20,000 (two checks at 20,000 differed by up to 0.94%)
            // (docs/benchmarks.md, "Reproduce").
            check_requests: 10_000,
            bind_samples: 100,
            stall_locks: 100_000,
            deadlock_keys: 1000,
            deadlock_waiters: 10_000,
            queue_sizes: vec![10, 100, 1000, 10_000],
            storms_only: false,
            stalls: stalls::Plan::full(),
        }
    }

    fn quick() -> Plan {
        Plan {
            name: "quick",
            rounds: 3,
            requests: 30_000,
            contention_secs: 0.5,
            latency: latency::Samples {
                handoff: 200,
                handoff_poll: 30,
                expiry: 30,
                expiry_poll: 15,
            },
            mem_keys: 100_000,
            shared_grants: 10_000,
            callgrind_requests: 2000,
            check_requests: 2000,
            bind_samples: 10,
            stall_locks: 10_000,
            deadlock_keys: 100,
            deadlock_waiters: 1000,
            queue_sizes: vec![10, 100, 1000],
            stalls: stalls::Plan::quick(),
            ..Plan::full()
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--hold") {
        // Section 6's holder process.
        if let Err(e) = bind::hold(args.get(1..).unwrap_or(&[])) {
            eprintln!("lockbench --hold: {e}");
            std::process::exit(1);
        }
        return;
    }
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let callgrind = args.iter().any(|a| a == "--callgrind");
    let only: Option<Vec<u32>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    let mut plan = if quick { Plan::quick() } else { Plan::full() };
    plan.storms_only = args.iter().any(|a| a == "--storms");
    // `--shapes 1,3` (with `--only 10`): some of section 10's shapes.
    plan.stalls.shapes = args
        .iter()
        .position(|a| a == "--shapes")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
    // `--wide 200000` (with `--only 10 --shapes 13`): those reader counts.
    if let Some(wide) = args
        .iter()
        .position(|a| a == "--wide")
        .and_then(|i| args.get(i + 1))
    {
        plan.stalls.wide = wide
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    // `--holders 1000000` (with `--only 10 --shapes 6`): shape (6)'s
    // holder count (`lock.max-holders` raised to it).
    if let Some(n) = args
        .iter()
        .position(|a| a == "--holders")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
    {
        plan.stalls.holders = n;
    }
    let result = if callgrind {
        run_callgrind(&plan, &args)
    } else {
        run(&plan, only.as_deref())
    };
    if let Err(e) = result {
        eprintln!("lockbench: {e}");
        std::process::exit(1);
    }
}

fn root() -> &'static Path {
    common::repo()
}

fn first_line(path: &str, prefix: &str) -> Option<String> {
    fs::read_to_string(path)
        .ok()?
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split(':').nth(1))
        .map(|v| v.trim().to_string())
}

/// `2026-04-30 12:34 UTC`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

fn machine() -> String {
    let cpu = first_line("/proc/cpuinfo", "model name").unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kb: f64 = first_line("/proc/meminfo", "MemTotal")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    format!(
        "{cpu}, {cores} cores, {:.0} GiB RAM, Linux {kernel} {}",
        mem_kb / 1024.0 / 1024.0,
        std::env::consts::ARCH
    )
}

fn server_version() -> String {
    // The binary the servers run: `REDIS_SERVER`, else `redis-server`.
    Command::new(std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into()))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Where reports and dumps go: `LOCKBENCH_DIR`, else target/lockbench (two
/// runs at once, on two servers, each with its own).
fn out_dir() -> io::Result<PathBuf> {
    let dir = std::env::var_os("LOCKBENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/lockbench"));
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn fmt_wall(secs: f64) -> String {
    let s = secs.round() as u64;
    format!("{}m {:02}s", s / 60, s % 60)
}

fn run(plan: &Plan, only: Option<&[u32]>) -> io::Result<()> {
    let started = Instant::now();
    let wants = |n: u32| only.is_none_or(|o| o.contains(&n));
    let module = server::module_path()?;
    let dir = server::TempDir::new()?;
    let opts = Options {
        module: Some(module.clone()),
        dir: dir.0.clone(),
        callgrind: false,
        // Section 7 keeps 10,000 clients blocked at once.
        extra: vec!["--maxclients".into(), "12000".into()],
    };
    let load_start = loadavg();
    let server = Server::start(&opts)?;
    let mut c = server.conn()?;
    let version = c.try_info_field("server", "redis_version")?;
    let allocator = c.try_info_field("memory", "mem_allocator")?;
    let scripts = throughput::Scripts::load(&mut c)?;
    eprintln!(
        "lockbench ({} run): redis {version} on 127.0.0.1:{}, module {}",
        plan.name,
        server.port,
        module.display()
    );

    let mut body = String::new();
    let mut goals: Vec<(String, String, bool)> = Vec::new();

    if wants(1) {
        eprintln!("1. throughput");
        let mut pool = throughput::Pool::new(server.port, plan.conns, plan.pipeline)?;
        // The baselines on a server without the module: the SET a user compares with.
        let plain_dir = server::TempDir::new()?;
        let plain = Server::start(&Options {
            module: None,
            dir: plain_dir.0.clone(),
            callgrind: false,
            extra: Vec::new(),
        })?;
        let mut plain_c = plain.conn()?;
        let plain_scripts = throughput::Scripts::load(&mut plain_c)?;
        let mut plain_pool = throughput::Pool::new(plain.port, plan.conns, plan.pipeline)?;
        // The C reference module, doing the same work through the module API.
        let floor_dir = server::TempDir::new()?;
        let floor = Server::start(&Options {
            module: Some(profile::build_floor(&floor_dir.0)?),
            dir: floor_dir.0.clone(),
            callgrind: false,
            extra: Vec::new(),
        })?;
        let mut floor_c = floor.conn()?;
        let floor_scripts = throughput::Scripts::load(&mut floor_c)?;
        let mut floor_pool = throughput::Pool::new(floor.port, plan.conns, plan.pipeline)?;
        let r = throughput::run(
            throughput::Side {
                c: &mut c,
                pool: &mut pool,
                scripts: &scripts,
            },
            throughput::Side {
                c: &mut plain_c,
                pool: &mut plain_pool,
                scripts: &plain_scripts,
            },
            throughput::Side {
                c: &mut floor_c,
                pool: &mut floor_pool,
                scripts: &floor_scripts,
            },
            plan.requests,
            plan.rounds,
        )?;
        drop(plain_pool);
        drop(plain);
        drop(floor_pool);
        drop(floor);
        body.push_str(&throughput::table(&r));
        body.push('\n');
        use throughput::Op;
        for (op, base, goal) in [
            (Op::Acquire, Op::Set, 0.9),
            (Op::Acquire, Op::LuaAcquire, 1.6),
            (Op::Racquire, Op::Redisson, 2.0),
        ] {
            let ratio = r.paired_ratio(op, base);
            goals.push((
                format!("{} >= {goal} x {}", op.label(), base.label()),
                format!("{ratio:.2}x"),
                ratio >= goal,
            ));
        }
    }

    if wants(2) {
        eprintln!("2. contention");
        let rows = contention::run(server.port, &plan.workers, plan.contention_secs)?;
        body.push_str(&contention::table(&rows, plan.contention_secs));
        let subtitle = format!(
            "{}; redis {version}; {} s per point; {} run, {}",
            machine(),
            plan.contention_secs,
            plan.name,
            utc_now()
        );
        let svg = chart::contention_svg(&rows, &subtitle);
        let chart_path = if plan.storms_only {
            out_dir()?.join("queues-storms.svg")
        } else if plan.name == "full" {
            let d = root().join("docs/bench");
            fs::create_dir_all(&d)?;
            d.join("contention.svg")
        } else {
            out_dir()?.join("contention-quick.svg")
        };
        fs::write(&chart_path, svg)?;
        body.push_str(&format!(
            "\nChart: `{}`\n\n",
            chart_path
                .strip_prefix(root())
                .unwrap_or(&chart_path)
                .display()
        ));
        let find =
            |s: contention::Strategy| rows.iter().find(|r| r.workers == 64 && r.strategy == s);
        if let (Some(w), Some(p)) = (
            find(contention::Strategy::Wait),
            find(contention::Strategy::Poll),
        ) {
            let ratio = w.waits.at(99.0) / p.waits.at(99.0);
            goals.push((
                "64 workers: WAIT p99 wait <= 1/10 of 1 ms polling".into(),
                format!(
                    "{} vs {} = 1/{:.1}",
                    stats::dur_us(w.waits.at(99.0)),
                    stats::dur_us(p.waits.at(99.0)),
                    1.0 / ratio
                ),
                ratio <= 0.1,
            ));
            goals.push((
                "64 workers: WAIT commands per grant <= 4.0".into(),
                format!(
                    "{:.2} (polling {:.2})",
                    w.commands_per_grant(),
                    p.commands_per_grant()
                ),
                w.commands_per_grant() <= 4.0,
            ));
        }
    }

    if wants(3) {
        eprintln!("3. latency");
        let rows = latency::run(server.port, &scripts, &plan.latency)?;
        body.push_str(&latency::table(&rows));
        body.push('\n');
    }

    if wants(6) {
        eprintln!("6. bound locks");
        let r = bind::run(server.port, plan.bind_samples, plan.stall_locks)?;
        body.push_str(&bind::table(&r));
        body.push('\n');
        body.push_str(&renewals::table(&renewals::run(server.port)?));
        body.push('\n');
        goals.push((
            "a killed holder's bound lock granted to its waiter: p99 < 50 ms".into(),
            format!(
                "{} (without BIND: the lease, {})",
                stats::dur_us(r.bound.at(99.0)),
                stats::dur_us(r.lease.at(50.0))
            ),
            r.bound.at(99.0) < 50_000.0,
        ));
    }

    if wants(7) {
        eprintln!("7. deadlock detection");
        let r = deadlock::run(server.port, plan.deadlock_keys, plan.deadlock_waiters)?;
        body.push_str(&deadlock::table(&r));
        body.push('\n');
    }

    if wants(8) {
        eprintln!("8. waiting at scale");
        let rows = match plan.storms_only {
            true => Vec::new(),
            false => queues::growth(server.port, &plan.queue_sizes)?,
        };
        let largest = plan.queue_sizes.iter().copied().max().unwrap_or(10);
        let storms = queues::storms(server.port, largest)?;
        body.push_str(&queues::table(&rows, &storms));
        // (No chart without the growth rows.)
        if !plan.storms_only {
            let subtitle = format!(
                "{}; redis {version}; {} run, {}",
                machine(),
                plan.name,
                utc_now()
            );
            let chart_path = if plan.name == "full" {
                let d = root().join("docs/bench");
                fs::create_dir_all(&d)?;
                d.join("queues.svg")
            } else {
                out_dir()?.join("queues-quick.svg")
            };
            fs::write(&chart_path, queues::growth_svg(&rows, &subtitle))?;
            body.push_str(&format!(
                "\nChart: `{}`\n\n",
                chart_path
                    .strip_prefix(root())
                    .unwrap_or(&chart_path)
                    .display()
            ));
        }
        if let (Some(big), Some(floor)) = (rows.last(), rows.first()) {
            let base = floor.empty_us;
            goals.push((
                format!("30.1: a new blocking request with {} waiting, one key / one chain, at most 2x nobody waiting", big.waiting),
                format!("{:.2}x / {:.2}x", big.hot_us / base, big.chain_us / base),
                big.hot_us <= 2.0 * base && big.chain_us <= 2.0 * base,
            ));
            goals.push((
                "30.2: every cycle found, no search cut".to_string(),
                format!(
                    "{} of 200 found, {} cut",
                    big.cycles_found,
                    rows.iter().map(|r| r.searches_cut).sum::<u64>()
                ),
                big.cycles_found == 200 && rows.iter().all(|r| r.searches_cut == 0),
            ));
        }
        let worst = [
            storms.timeouts,
            storms.timeouts_keys,
            storms.disconnects,
            storms.flushall,
            storms.del,
            storms.handoff,
        ]
        .into_iter()
        .max()
        .unwrap_or_default();
        goals.push((
            format!(
                "30.3: storms with {} waiting, longest PING at most 5 ms",
                storms.n
            ),
            stats::dur_us(worst.as_secs_f64() * 1e6),
            worst <= std::time::Duration::from_millis(5),
        ));
        goals.push((
            "30.3: hand-off grants/s through the long queue at least 0.9x a 10 queue".to_string(),
            format!("{:.2}x", storms.handoff_long / storms.handoff_short),
            storms.handoff_long >= 0.9 * storms.handoff_short,
        ));
    }

    if wants(9) {
        eprintln!("9. guarded writes");
        let r = guard::run(
            server.port,
            plan.requests,
            plan.rounds,
            plan.conns,
            plan.pipeline,
        )?;
        body.push_str(&guard::table(&r));
        body.push('\n');
        goals.extend(guard::goals(&r));
    }

    if wants(10) {
        eprintln!("10. stalls");
        let rows = stalls::run(&module, &plan.stalls)?;
        body.push_str(&stalls::table(&rows));
        body.push('\n');
    }

    if wants(4) || wants(5) {
        eprintln!("4. memory and 5. persistence");
        drop(c);
        // A fresh server: what earlier sections leave behind (10,000
        // connections of section 7, grown tables) would move used_memory
        // while the keys load. It has the C reference module beside the
        // module, only its floor type (`FLOOR.SET`, the module API's floor),
        // so that every kind is loaded and saved on the same server.
        let mem_dir = server::TempDir::new()?;
        let floor = profile::build_floor(&mem_dir.0)?;
        let mut extra = opts.extra.clone();
        extra.extend([
            "--loadmodule".into(),
            format!("{} floor-only", floor.display()),
        ]);
        let mut mem_server = Server::start(&Options {
            module: Some(module.clone()),
            dir: mem_dir.0.clone(),
            callgrind: false,
            extra,
        })?;
        let r = memory::run(&mut mem_server, plan.mem_keys, plan.shared_grants)?;
        let (mem, persist) = memory::tables(&r);
        body.push_str(&mem);
        body.push('\n');
        body.push_str(&persist);
        body.push('\n');
        let set = r.mem.iter().find(|m| m.kind == memory::Kind::Strings);
        let lock = r.mem.iter().find(|m| m.kind == memory::Kind::Locks);
        if let (Some(s), Some(l)) = (set, lock) {
            let ratio = l.per_key / s.per_key;
            goals.push((
                "memory per exclusive lock <= 1.2 x a `SET NX PX` key".into(),
                format!(
                    "{} vs {} = {ratio:.2}x",
                    stats::bytes(l.per_key),
                    stats::bytes(s.per_key)
                ),
                ratio <= 1.2,
            ));
        }
    }
    drop(server);
    drop(dir);

    let wall = started.elapsed().as_secs_f64();
    let mut report = String::new();
    report.push_str(&format!(
        "## redis-lock benchmarks ({} run, {})\n\n",
        plan.name,
        utc_now()
    ));
    report.push_str(&format!("- machine: {}\n", machine()));
    report.push_str(&format!(
        "- load average (1/5/15 min): {load_start} at start, {} at end\n",
        loadavg()
    ));
    report.push_str(&format!(
        "- server: redis {version} ({allocator}), one instance on 127.0.0.1 started by the bench, no AOF, no replicas; `{}`\n",
        server_version()
    ));
    report.push_str(&format!(
        "- module: `{}`\n",
        module.strip_prefix(root()).unwrap_or(&module).display()
    ));
    report.push_str(&format!(
        "- client: lockbench (Rust, std only, same machine); wall time of this run: {}\n\n",
        fmt_wall(wall)
    ));
    if !goals.is_empty() {
        report.push_str("### Goals\n\n| goal | measured | status |\n|---|---|---|\n");
        for (goal, measured, met) in &goals {
            report.push_str(&format!(
                "| {goal} | {measured} | {} |\n",
                if *met { "met" } else { "**not met**" }
            ));
        }
        report.push('\n');
    }
    report.push_str(&body);
    println!("{report}");
    let path = out_dir()?.join(format!("report-{}.md", plan.name));
    fs::write(&path, &report)?;
    eprintln!("report written to {}", path.display());
    Ok(())
}

/// `--callgrind [--repeat N] [--write-baseline] [--check]`.
fn run_callgrind(plan: &Plan, args: &[String]) -> io::Result<()> {
    let repeat: usize = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1)
        .max(1);
    let write_baseline = args.iter().any(|a| a == "--write-baseline");
    let check = args.iter().any(|a| a == "--check");
    // A check alone measures only what it gates (CI runs it): two servers
    // of the five, and section 9's guards on a third, well under half the time.
    let scope = match check && !write_baseline && repeat == 1 {
        true => profile::Scope::Gated,
        false => profile::Scope::All,
    };
    // `--requests N`: that many requests a row instead of the plan's.
    let asked: Option<usize> = args
        .windows(2)
        .find(|a| a[0] == "--requests")
        .and_then(|a| a[1].parse().ok());
    let requests = asked.unwrap_or(match scope {
        profile::Scope::Gated => plan.check_requests,
        profile::Scope::All => plan.callgrind_requests,
    });
    // Section 6's rows at the baseline's count in a check too: after its
    // 100,000 bound grants, a bound grant's figure depends on how many
    // follow (`lock-bind:acquire-bind-100k` at 10,000: 5.4% under its
    // figure at 20,000, which the other rows match within 0.83%).
    let bind_requests = asked.unwrap_or(plan.callgrind_requests);
    let module = server::module_path()?;
    let dir = out_dir()?.join("callgrind");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    eprintln!(
        "lockbench --callgrind: {requests} requests per command (section 6's: {bind_requests}) under valgrind (slow), {repeat} run(s)"
    );
    // `--only 9`: section 9's rows alone (guard.rs); `--only 6`: section
    // 6's, what `BIND` adds (bind.rs).
    let only = args
        .windows(2)
        .find(|a| a[0] == "--only")
        .map(|a| a[1].as_str());
    let (guard_only, bind_only, tax_only) =
        (only == Some("9"), only == Some("6"), only == Some("11"));
    // `--only 1`: the `wide:` rows alone (a key with 1,000 readers).
    let wide_only = only == Some("1");
    if (guard_only || bind_only || tax_only || wide_only) && (check || write_baseline) {
        return Err(io::Error::other(
            "--only 1, 6, 9 or 11 measures that section's rows alone: not with --check or --write-baseline",
        ));
    }
    let started = Instant::now();
    let mut runs = Vec::new();
    for n in 1..=repeat {
        eprintln!(" run {n}/{repeat}");
        let run_dir = dir.join(format!("run{n}"));
        // The four groups start servers of their own (free ports, their own
        // directories) and count instructions, which do not depend on how
        // the cores are shared: on a machine of several cores they run side
        // by side (CI's bench-check in about half the time), their rows
        // joined in the same order as one after another.
        let all = scope == profile::Scope::All;
        let (run_dir, module) = (&run_dir, &module);
        let rows = std::thread::scope(|s| -> io::Result<Vec<profile::Row>> {
            let groups = [
                s.spawn(
                    move || match guard_only || bind_only || tax_only || wide_only {
                        true => Ok(Vec::new()),
                        false => profile::run(run_dir, module, requests, scope),
                    },
                ),
                s.spawn(move || match bind_only || tax_only || wide_only {
                    true => Ok(Vec::new()),
                    false => guard::profile(run_dir, module, requests, all),
                }),
                s.spawn(move || match guard_only || tax_only || wide_only {
                    true => Ok(Vec::new()),
                    false => bind::profile(run_dir, module, bind_requests, all),
                }),
                s.spawn(move || match guard_only || bind_only || wide_only {
                    true => Ok(Vec::new()),
                    false => tax::profile(run_dir, module, requests, all),
                }),
                s.spawn(
                    move || match (guard_only || bind_only || tax_only) || !all {
                        true => Ok(Vec::new()),
                        false => profile::wide(run_dir, module, requests),
                    },
                ),
            ];
            let mut rows = Vec::new();
            for g in groups {
                let got = g
                    .join()
                    .map_err(|_| io::Error::other("a profiled group panicked"))?;
                rows.extend(got?);
            }
            Ok(rows)
        })?;
        runs.push(rows);
    }
    let mut report = format!(
        "## redis-lock: instructions per request ({})\n\n- machine: {}\n- server: `{}`\n- dumps: `{}` (`callgrind_annotate --inclusive=yes <dump>`)\n- wall time: {}\n\n",
        utc_now(),
        machine(),
        server_version(),
        dir.strip_prefix(root()).unwrap_or(&dir).display(),
        fmt_wall(started.elapsed().as_secs_f64())
    );
    let baseline_path = root().join("benches/baseline.tsv");
    let last = runs.last().cloned().unwrap_or_default();
    let baseline = match check {
        true => fs::read_to_string(&baseline_path)
            .map_err(|e| io::Error::other(format!("{}: {e}", baseline_path.display())))?,
        false => String::new(),
    };
    match scope {
        profile::Scope::All => {
            if !guard_only && !bind_only && !tax_only && !wide_only {
                report.push_str(&profile::table(&runs, requests));
            }
            report.push_str(&profile::wide_table(&runs, requests));
            report.push_str(&bind::callgrind_table(&runs, bind_requests));
            report.push_str(&guard::callgrind_table(&runs, requests));
            report.push_str(&tax::callgrind_table(&runs, requests));
        }
        profile::Scope::Gated => report.push_str(&profile::check_table(&last, &baseline)),
    }
    if repeat > 1 {
        report.push_str(&format!(
            "\nLargest spread of any row over the {repeat} runs: {:.2}%\n",
            profile::max_spread(&runs)
        ));
    }
    println!("{report}");
    fs::write(out_dir()?.join("callgrind.md"), &report)?;
    if write_baseline {
        fs::write(&baseline_path, profile::baseline_text(&last))?;
        eprintln!("baseline written to {}", baseline_path.display());
    }
    if check {
        let worse = profile::regressions(&last, &baseline, 0.03);
        if !worse.is_empty() {
            return Err(io::Error::other(format!(
                "more than 3% more instructions than benches/baseline.tsv:\n{}",
                worse.join("\n")
            )));
        }
        eprintln!("bench-check: no row more than 3% over benches/baseline.tsv");
    }
    Ok(())
}
