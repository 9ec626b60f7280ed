//! A Redis Cluster for the tests, and a small cluster client.
//!
//! [`Cluster::start`] starts six nodes (harness servers with the module, each in
//! its own dir with its own `cluster-config-file`, on free ports of 127.0.0.1,
//! with an explicit free `cluster-port`, drawn at each start attempt, so a
//! high data port never overflows the bus port), creates a 3-master, 3-replica cluster with
//! `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, and
//! waits (with a deadline) until every node agrees on the slots, says
//! `cluster_state:ok`, and every replica's link is up.
//!
//! Each node's fencing-token counter is first used (seeded from the wall
//! clock) 15 ms apart, in reverse node order: the nodes that become replicas
//! (`redis-cli` makes the first three masters) get seeds below their
//! masters' tokens, so a replica's counter is exactly what it received and a
//! promotion's tokens depend on that, not on a later seed; and the masters'
//! counters differ by thousands of tokens, so a test can move locks from a
//! master whose tokens are above another's counter ([`Cluster::masters_by_counter`]).
//!
//! [`ClusterClient`] routes by key slot (CRC16/XMODEM mod 16384, hash tags),
//! follows `MOVED` (updating its map) and `ASK` (`ASKING` first, map unchanged),
//! and retries `TRYAGAIN`/`CLUSTERDOWN`, all bounded.

#![allow(dead_code)]

use super::load::LockClient;
use super::*;
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const SLOTS: usize = 16384;

/// CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The key's slot: the hash tag (`{...}`, first `{` and the first `}` after
/// it, non-empty) if any, else the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&c| c == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&c| c == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    crc16(k) % SLOTS as u16
}

fn cli_binary() -> PathBuf {
    std::env::var_os("REDIS_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-cli"))
}

/// One node as a node sees it in `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: String,
    pub master_id: Option<String>,
    pub slots: Vec<String>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.split(',').any(|f| f == "master")
    }
    pub fn myself(&self) -> bool {
        self.flags.split(',').any(|f| f == "myself")
    }
}

pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // ip:port@cport[,hostname]
            let addr = f[1].split('@').next().unwrap_or("");
            let port = addr.rsplit(':').next().unwrap_or("0").parse().unwrap_or(0);
            NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].to_string(),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots: f[8..].iter().map(|s| s.to_string()).collect(),
            }
        })
        .collect()
}

/// `(first slot, last slot, master port)` ranges as a node sees them.
pub fn slot_ranges(c: &mut Conn) -> io::Result<Vec<(u16, u16, u16)>> {
    let r = c.try_cmd(&["CLUSTER", "SLOTS"])?;
    let mut v = Vec::new();
    if let Reply::Array(ranges) = r {
        for range in ranges {
            let a = range.array();
            let master = a[2].array();
            v.push((a[0].int() as u16, a[1].int() as u16, master[1].int() as u16));
        }
    }
    v.sort();
    Ok(v)
}

pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Six nodes, three masters with one replica each, ready.
    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Six nodes with these extra redis.conf lines each.
    pub fn start_with(lines: &[&str]) -> Cluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let mut b = Server::builder()
                .cluster_node()
                .config("cluster-config-file nodes.conf")
                .config("cluster-node-timeout 5000");
            for line in lines {
                b = b.config(line);
            }
            let s = b.start();
            nodes.push(s);
        }
        for s in nodes.iter().rev() {
            // First use of this node's token counter: now.
            s.conn().info("lock");
            sleep_ms(15);
        }
        let cluster = Cluster { nodes };
        cluster.create();
        cluster.wait_ready(Duration::from_secs(40));
        cluster
    }

    fn create(&self) {
        let log = self.nodes[0].dir.join("cluster-create.log");
        let out = fs::File::create(&log).expect("create the cluster-create log");
        let err = out.try_clone().expect("clone a file handle");
        let mut cmd = Command::new(cli_binary());
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        cmd.args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli_binary().display()));
        let start = Instant::now();
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish in 60 s:\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            sleep_ms(20);
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}):\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// Waits until every node says `cluster_state:ok`, knows six nodes, sees
    /// the same slot map and three replicas, and every replica's link is up.
    pub fn wait_ready(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let why = match self.ready() {
                Ok(()) => return,
                Err(why) => why,
            };
            if start.elapsed() > timeout {
                panic!("the cluster was not ready within {timeout:?}: {why}");
            }
            sleep_ms(50);
        }
    }

    fn ready(&self) -> Result<(), String> {
        let mut first_map: Option<Vec<(u16, u16, u16)>> = None;
        for n in &self.nodes {
            let mut c = Conn::try_connect(n.port).map_err(|e| e.to_string())?;
            let info = c
                .try_cmd(&["CLUSTER", "INFO"])
                .map_err(|e| e.to_string())?
                .str();
            for (f, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_ok", "16384"),
                ("cluster_known_nodes", "6"),
            ] {
                if info_get(&info, f).as_deref() != Some(want) {
                    return Err(format!("node {}: {f} is not {want}:\n{info}", n.port));
                }
            }
            let nodes = parse_nodes(
                &c.try_cmd(&["CLUSTER", "NODES"])
                    .map_err(|e| e.to_string())?
                    .str(),
            );
            let masters = nodes
                .iter()
                .filter(|l| l.is_master() && !l.slots.is_empty())
                .count();
            let replicas = nodes.iter().filter(|l| l.master_id.is_some()).count();
            if masters != 3 || replicas != 3 {
                return Err(format!(
                    "node {} sees {masters} masters, {replicas} replicas",
                    n.port
                ));
            }
            let map = slot_ranges(&mut c).map_err(|e| e.to_string())?;
            match &first_map {
                None => first_map = Some(map),
                Some(m) if *m != map => {
                    return Err(format!(
                        "node {} sees another slot map: {map:?} vs {m:?}",
                        n.port
                    ))
                }
                Some(_) => {}
            }
            let repl = c
                .try_cmd(&["INFO", "replication"])
                .map_err(|e| e.to_string())?
                .str();
            if info_get(&repl, "role").as_deref() == Some("slave")
                && (info_get(&repl, "master_link_status").as_deref() != Some("up")
                    || info_get(&repl, "master_sync_in_progress").as_deref() != Some("0"))
            {
                return Err(format!("replica {} is not in sync:\n{repl}", n.port));
            }
        }
        Ok(())
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// This node's own line of `CLUSTER NODES`.
    pub fn me(&self, i: usize) -> NodeLine {
        let text = self.nodes[i].conn().cmd(&["CLUSTER", "NODES"]).str();
        parse_nodes(&text)
            .into_iter()
            .find(|l| l.myself())
            .expect("CLUSTER NODES has a myself line")
    }

    pub fn id(&self, i: usize) -> String {
        self.nodes[i].conn().cmd(&["CLUSTER", "MYID"]).str()
    }

    /// `INFO replication` role: `master` or `slave`. Panics, with the
    /// assertion in its log, if the node no longer answers.
    pub fn role(&self, i: usize) -> String {
        let answer = Conn::try_connect(self.nodes[i].port).and_then(|mut c| {
            c.set_timeout(Duration::from_secs(5));
            c.try_cmd(&["INFO", "replication"])
        });
        match answer {
            Ok(Reply::Bulk(b)) => {
                info_get(&String::from_utf8_lossy(&b), "role").unwrap_or_default()
            }
            other => panic!(
                "node {} does not answer ({other:?}); its log says: {}",
                self.nodes[i].port,
                self.assertion(i)
            ),
        }
    }

    /// The assertion a node logged before it aborted, if any.
    pub fn assertion(&self, i: usize) -> String {
        sleep_ms(500); // a dying server writes its crash report first
        self.nodes[i]
            .log_tail(5_000)
            .lines()
            .filter(|l| l.contains("==>") || l.contains("ASSERTION FAILED ="))
            .map(|l| l.trim().to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Masters serving slots, by node index (ascending).
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let me = self.me(i);
                me.is_master() && !me.slots.is_empty()
            })
            .collect()
    }

    /// Masters ordered by their `lock_last_token`, lowest first.
    pub fn masters_by_counter(&self) -> Vec<usize> {
        let mut m: Vec<(i64, usize)> = self
            .masters()
            .into_iter()
            .map(|i| {
                let t = self.nodes[i]
                    .info_field("lock", "lock_last_token")
                    .parse()
                    .expect("lock_last_token is an integer");
                (t, i)
            })
            .collect();
        m.sort();
        m.into_iter().map(|(_, i)| i).collect()
    }

    /// The replica of the master at index `m`.
    pub fn replica_of(&self, m: usize) -> usize {
        let id = self.id(m);
        (0..self.nodes.len())
            .find(|&i| self.me(i).master_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no replica of node {}", self.nodes[m].port))
    }

    /// The index of the master serving `slot`, as node `asked` sees it.
    pub fn owner(&self, slot: u16) -> usize {
        let map = slot_ranges(&mut self.nodes[0].conn()).expect("CLUSTER SLOTS");
        let port = map
            .iter()
            .find(|(a, b, _)| *a <= slot && slot <= *b)
            .map(|r| r.2)
            .unwrap_or_else(|| panic!("slot {slot} is not served"));
        self.index_of(port)
    }

    /// Waits until every node maps `slot` to the node on `port`.
    pub fn wait_slot_owner(&self, slot: u16, port: u16, timeout: Duration) {
        wait_until(
            timeout,
            &format!("every node to map slot {slot} to {port}"),
            || {
                self.nodes.iter().all(|n| {
                    Conn::try_connect(n.port)
                        .and_then(|mut c| slot_ranges(&mut c))
                        .map(|m| {
                            m.iter()
                                .any(|(a, b, p)| *a <= slot && slot <= *b && *p == port)
                        })
                        .unwrap_or(false)
                })
            },
        );
    }
}

// ---------------------------------------------------------------------------
// Cluster client
// ---------------------------------------------------------------------------

pub struct ClusterClient {
    seeds: Vec<u16>,
    slots: Vec<u16>,
    conns: HashMap<u16, Conn>,
    last: u16,
    pub moved: u64,
    pub asked: u64,
    pub retried: u64,
}

impl ClusterClient {
    pub fn new(seeds: &[u16]) -> ClusterClient {
        let mut c = ClusterClient {
            seeds: seeds.to_vec(),
            slots: vec![0; SLOTS],
            conns: HashMap::new(),
            last: 0,
            moved: 0,
            asked: 0,
            retried: 0,
        };
        c.refresh();
        c
    }

    /// Loads the slot map from the first seed that answers with a full one.
    pub fn refresh(&mut self) {
        for &p in &self.seeds.clone() {
            let Ok(mut c) = Conn::try_connect(p) else {
                continue;
            };
            let Ok(map) = slot_ranges(&mut c) else {
                continue;
            };
            let covered: usize = map.iter().map(|(a, b, _)| (*b - *a) as usize + 1).sum();
            if covered == SLOTS {
                for (a, b, port) in map {
                    for s in a..=b {
                        self.slots[s as usize] = port;
                    }
                }
                return;
            }
        }
        panic!("no seed node {:?} has a full slot map", self.seeds);
    }

    fn conn(&mut self, port: u16) -> io::Result<&mut Conn> {
        match self.conns.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(Conn::try_connect(port)?)),
        }
    }

    /// The node the client would send `key` to now.
    pub fn node_for(&self, key: &[u8]) -> u16 {
        self.slots[key_slot(key) as usize]
    }

    /// Sends a command about `key` to its node, following redirections.
    pub fn call(&mut self, key: &[u8], args: &[Vec<u8>]) -> io::Result<Reply> {
        let slot = key_slot(key) as usize;
        let mut port = self.slots[slot];
        let mut ask = false;
        for attempt in 0..200 {
            let c = self.conn(port)?;
            let r = if ask {
                c.send(&["ASKING"])
                    .and_then(|_| c.send(args))
                    .and_then(|_| c.read_reply())
                    .and_then(|a| {
                        if !matches!(&a, Reply::Status(s) if s == "OK") {
                            return Err(io::Error::other(format!("ASKING: {a:?}")));
                        }
                        c.read_reply()
                    })
            } else {
                c.try_cmd(args)
            };
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    self.conns.remove(&port);
                    return Err(e);
                }
            };
            if let Reply::Error(e) = &r {
                let words: Vec<&str> = e.split_whitespace().collect();
                let target = || -> Option<u16> { words.get(2)?.rsplit(':').next()?.parse().ok() };
                match words.first().copied() {
                    Some("MOVED") => {
                        let p =
                            target().ok_or_else(|| io::Error::other(format!("bad MOVED: {e}")))?;
                        self.moved += 1;
                        self.slots[slot] = p;
                        if p == port || attempt > 5 {
                            // Nodes disagree for a moment (failover, migration).
                            sleep_ms(10);
                        }
                        port = p;
                        ask = false;
                        continue;
                    }
                    Some("ASK") => {
                        port = target().ok_or_else(|| io::Error::other(format!("bad ASK: {e}")))?;
                        self.asked += 1;
                        ask = true;
                        continue;
                    }
                    Some("TRYAGAIN") | Some("CLUSTERDOWN") => {
                        self.retried += 1;
                        sleep_ms(10);
                        port = self.slots[slot];
                        ask = false;
                        continue;
                    }
                    Some("UNBLOCKED") => {
                        // The server closes the connection after this reply.
                        self.conns.remove(&port);
                    }
                    _ => {}
                }
            }
            self.last = port;
            return Ok(r);
        }
        Err(io::Error::other(format!(
            "too many redirections for {}",
            show(key)
        )))
    }

    /// `call` with string arguments; panics on I/O errors.
    pub fn cmd(&mut self, args: &[&str]) -> Reply {
        let key = args.get(1).copied().unwrap_or("");
        let argv: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        self.call(key.as_bytes(), &argv)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub fn lock_info(&mut self, key: &str) -> Option<LockInfo> {
        LockInfo::parse(&self.cmd(&["LOCK.INFO", key]))
    }

    pub fn last_port(&self) -> u16 {
        self.last
    }
}

impl LockClient for ClusterClient {
    fn call(&mut self, key: &[u8], args: &[Vec<u8>]) -> io::Result<Reply> {
        ClusterClient::call(self, key, args)
    }

    fn wait_replicas(&mut self, n: i64, ms: i64) -> io::Result<Reply> {
        let port = self.last;
        self.conn(port)?
            .try_cmd(&["WAIT", &n.to_string(), &ms.to_string()])
    }

    fn served_by(&self) -> u16 {
        self.last
    }
}
