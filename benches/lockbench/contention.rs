//! Section 2: contention on one key. W workers (one thread and one connection
//! each) loop for a fixed time: acquire -> one command inside (INCR) ->
//! release. Three ways to wait for the lock:
//!
//! - WAIT: `LOCK.ACQUIRE k w 10000 WAIT 1000`, blocked in the server, FIFO;
//! - polling: `LOCK.ACQUIRE k w 10000` every 1 ms until granted;
//! - back-off: the same, sleeping 1 ms, 2, 4 ... up to 128 ms between tries.
//!
//! Per configuration: grants/s, commands per grant (every command sent in the
//! window / grants in it), wait from the first try to the grant (p50, p99,
//! max), fairness (most / fewest grants of one worker) and the server's CPU.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{Conn, Reply};
use crate::stats::{self, Percentiles};

pub const KEY: &[u8] = b"contended";
const LEASE: &[u8] = b"10000";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Strategy {
    Wait,
    Poll,
    Backoff,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::Wait, Strategy::Poll, Strategy::Backoff];

    pub fn label(self) -> &'static str {
        match self {
            Strategy::Wait => "WAIT (server-side)",
            Strategy::Poll => "polling every 1 ms",
            Strategy::Backoff => "back-off 1 -> 128 ms",
        }
    }
}

pub struct Row {
    pub workers: usize,
    pub strategy: Strategy,
    pub secs: f64,
    pub grants: u64,
    pub commands: u64,
    pub waits: Percentiles,
    pub per_worker: Vec<u64>,
    /// Server CPU seconds per second of the run (1.0 = one core busy).
    pub server_cpu: f64,
    /// Releases that did not answer 1 (the lock was lost: must be 0).
    pub lost: u64,
    /// WAIT requests that timed out (1 s) and were sent again.
    pub timeouts: u64,
}

impl Row {
    pub fn grants_per_sec(&self) -> f64 {
        self.grants as f64 / self.secs
    }

    pub fn commands_per_grant(&self) -> f64 {
        self.commands as f64 / self.grants as f64
    }

    /// Most grants of one worker / fewest (infinite when one got none).
    pub fn fairness(&self) -> f64 {
        let max = self.per_worker.iter().copied().max().unwrap_or(0) as f64;
        let min = self.per_worker.iter().copied().min().unwrap_or(0) as f64;
        max / min
    }
}

struct WorkerResult {
    grants: u64,
    commands: u64,
    waits: Vec<u64>,
    lost: u64,
    timeouts: u64,
}

fn worker(
    port: u16,
    id: usize,
    strategy: Strategy,
    begin: Instant,
    end: Instant,
) -> io::Result<WorkerResult> {
    let mut c = crate::server::connect(port)?;
    c.set_read_timeout(Duration::from_secs(30))?;
    let owner = format!("worker-{id}");
    let owner = owner.as_bytes();
    let mut r = WorkerResult {
        grants: 0,
        commands: 0,
        waits: Vec::new(),
        lost: 0,
        timeouts: 0,
    };
    if let Some(d) = begin.checked_duration_since(Instant::now()) {
        thread::sleep(d);
    }
    'work: while Instant::now() < end {
        let asked = Instant::now();
        let mut pause = Duration::from_millis(1);
        let granted = loop {
            if Instant::now() >= end {
                break 'work;
            }
            r.commands += 1;
            let reply = match strategy {
                Strategy::Wait => {
                    c.call(&[b"LOCK.ACQUIRE", KEY, owner, LEASE, b"WAIT", b"1000"])?
                }
                Strategy::Poll | Strategy::Backoff => {
                    c.call(&[b"LOCK.ACQUIRE", KEY, owner, LEASE])?
                }
            };
            match reply {
                Reply::Int(_) => break Instant::now(),
                Reply::Nil => match strategy {
                    Strategy::Wait => r.timeouts += 1,
                    Strategy::Poll => thread::sleep(pause),
                    Strategy::Backoff => {
                        thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(128));
                    }
                },
                other => {
                    return Err(io::Error::other(format!(
                        "LOCK.ACQUIRE under contention: {}",
                        other.show()
                    )))
                }
            }
        };
        let counted = granted < end;
        if counted {
            r.grants += 1;
            r.commands += 2;
            r.waits.push(stats::micros(granted - asked));
            c.ok(&[b"INCR", b"inside"])?;
        }
        if c.call(&[b"LOCK.RELEASE", KEY, owner])? != Reply::Int(1) {
            r.lost += 1;
        }
    }
    Ok(r)
}

fn server_cpu(c: &mut Conn) -> io::Result<f64> {
    let user: f64 = c
        .try_info_field("cpu", "used_cpu_user")?
        .parse()
        .unwrap_or(0.0);
    let sys: f64 = c
        .try_info_field("cpu", "used_cpu_sys")?
        .parse()
        .unwrap_or(0.0);
    Ok(user + sys)
}

/// One configuration: `workers` workers using `strategy` for `secs` seconds.
pub fn run_one(port: u16, workers: usize, strategy: Strategy, secs: f64) -> io::Result<Row> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"DEL", KEY, b"inside"])?;
    let setup = Duration::from_millis(200 + 2 * workers as u64);
    let begin = Instant::now() + setup;
    let end = begin + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..workers)
        .map(|id| {
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || worker(port, id, strategy, begin, end))
        })
        .collect::<io::Result<_>>()?;
    thread::sleep(begin.saturating_duration_since(Instant::now()));
    let cpu0 = server_cpu(&mut c)?;
    thread::sleep(end.saturating_duration_since(Instant::now()));
    let cpu1 = server_cpu(&mut c)?;
    let results = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| io::Error::other("a contention worker panicked"))?
        })
        .collect::<io::Result<Vec<_>>>()?;
    let mut waits = Vec::new();
    for r in results.iter() {
        waits.extend_from_slice(&r.waits);
    }
    Ok(Row {
        workers,
        strategy,
        secs,
        grants: results.iter().map(|r| r.grants).sum(),
        commands: results.iter().map(|r| r.commands).sum(),
        waits: Percentiles::new(waits),
        per_worker: results.iter().map(|r| r.grants).collect(),
        server_cpu: (cpu1 - cpu0) / secs,
        lost: results.iter().map(|r| r.lost).sum(),
        timeouts: results.iter().map(|r| r.timeouts).sum(),
    })
}

pub fn run(port: u16, workers: &[usize], secs: f64) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &w in workers {
        for s in Strategy::ALL {
            let row = run_one(port, w, s, secs)?;
            eprintln!(
                "  W={w} {}: {} grants/s, {:.2} cmds/grant, p99 wait {}",
                s.label(),
                stats::rate(row.grants_per_sec()),
                row.commands_per_grant(),
                stats::dur_us(row.waits.at(99.0))
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

pub fn table(rows: &[Row], secs: f64) -> String {
    let mut s = format!(
        "### 2. Contention on one key ({secs} s per configuration; each worker loops acquire -> INCR -> release)\n\n"
    );
    s.push_str("| workers | waiting by | grants/s | commands/grant | wait p50 | wait p99 | wait max | fairness (max/min grants per worker) | server CPU |\n");
    s.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let fairness = r.fairness();
        let fairness = if fairness.is_finite() {
            format!("{fairness:.2}")
        } else {
            "inf (a worker got none)".into()
        };
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} | {:.0}% |\n",
            r.workers,
            r.strategy.label(),
            stats::rate(r.grants_per_sec()),
            r.commands_per_grant(),
            stats::dur_us(r.waits.at(50.0)),
            stats::dur_us(r.waits.at(99.0)),
            stats::dur_us(r.waits.max()),
            fairness,
            r.server_cpu * 100.0
        ));
    }
    let lost: u64 = rows.iter().map(|r| r.lost).sum();
    let timeouts: u64 = rows.iter().map(|r| r.timeouts).sum();
    if lost > 0 {
        s.push_str(&format!(
            "\n**{lost} releases did not answer 1** (a lease ran out while held).\n"
        ));
    }
    if timeouts > 0 {
        s.push_str(&format!(
            "\n{timeouts} WAIT requests timed out after 1 s and were sent again (counted as commands).\n"
        ));
    }
    s
}
