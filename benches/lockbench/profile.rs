//! `--callgrind`: the same commands as section 1, a fixed number of each, on
//! a redis-server running under `valgrind --tool=callgrind`. Instruction
//! counts do not depend on what else the machine is doing, so this is the
//! repeatable comparison (and the dumps say where the instructions go:
//! `callgrind_annotate --inclusive=yes <dump>`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server::{Options, Server};
use crate::throughput::{round_plan, Op, Pool, Scripts, Step};

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

/// The newest dump `callgrind.out.<n>` in `dir`.
fn newest_dump(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("callgrind.out.")?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

fn instructions(dump: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(dump)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no summary in {}", dump.display())))
}

pub struct Row {
    pub op: Op,
    pub per_request: f64,
    pub dump: PathBuf,
}

pub fn run(opts: &Options, requests: usize) -> io::Result<Vec<Row>> {
    let server = Server::start(opts)?;
    let pid = server.pid().to_string();
    control(&["-i", "on", &pid])?;
    let mut c = server.conn()?;
    let scripts = Scripts::load(&mut c)?;
    let mut pool = Pool::new(server.port, 50, 16)?;
    // Warm-up: every command once through its code paths.
    for step in round_plan(1) {
        match step {
            Step::FlushAll => {
                c.ok(&[b"FLUSHALL"])?;
            }
            Step::Run(op) => {
                pool.select(op.db())?;
                pool.run(1000, &|i, b| op.encode(&scripts, i, b), &|_, _| true)?;
            }
        }
    }
    let mut rows = Vec::new();
    for step in round_plan(1) {
        match step {
            Step::FlushAll => {
                c.ok(&[b"FLUSHALL"])?;
            }
            Step::Run(op) => {
                pool.select(op.db())?;
                control(&["-z", &pid])?;
                let out = pool.run(requests, &|i, b| op.encode(&scripts, i, b), &|_, r| {
                    op.expected(r)
                })?;
                control(&["-d", op.short(), &pid])?;
                if out.unexpected > 0 {
                    return Err(io::Error::other(format!(
                        "{}: {} unexpected replies",
                        op.short(),
                        out.unexpected
                    )));
                }
                let dump = newest_dump(server.dir())
                    .ok_or_else(|| io::Error::other("callgrind wrote no dump"))?;
                let per_request = instructions(&dump)? as f64 / requests as f64;
                eprintln!("  {}: {per_request:.0} instructions/request", op.short());
                rows.push(Row {
                    op,
                    per_request,
                    dump,
                });
            }
        }
    }
    Ok(rows)
}

pub fn table(rows: &[Row], requests: usize) -> String {
    let get = |op: Op| {
        rows.iter()
            .find(|r| r.op == op)
            .map_or(f64::NAN, |r| r.per_request)
    };
    let mut s = format!(
        "### Instructions per request (callgrind, server side, {requests} requests each, 50 connections x pipeline 16)\n\n"
    );
    s.push_str("| command | instructions/request | compared with | ratio (lower is better) | dump |\n|---|---:|---|---:|---|\n");
    for op in Op::ALL {
        let Some(row) = rows.iter().find(|r| r.op == op) else {
            continue;
        };
        let dump = row
            .dump
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bases = op.baselines();
        if bases.is_empty() {
            s.push_str(&format!(
                "| {} | {:.0} | | | {dump} |\n",
                op.label(),
                row.per_request
            ));
        }
        for (i, (base, _)) in bases.iter().enumerate() {
            let first = if i == 0 {
                format!("| {} | {:.0} ", op.label(), row.per_request)
            } else {
                "| | ".into()
            };
            s.push_str(&format!(
                "{first}| {} ({:.0}) | {:.2}x | {} |\n",
                base.label(),
                get(*base),
                row.per_request / get(*base),
                if i == 0 { dump.as_str() } else { "" }
            ));
        }
    }
    s
}
