//! Sessions (`LOCK.SESSION`): one lease that many locks share, opened
//! lazily per server (per node in a cluster), kept alive by one keeper per
//! `Session` (a thread, in the tokio API too: its I/O never blocks the
//! runtime) that sends `LOCK.SESSION KEEPALIVE id ttl` at a third of the
//! ttl on a connection of its own (never a bound one), reconnecting after a
//! failure until the session's deadline (the last acknowledged keepalive's
//! send time + ttl) passes unanswered. The blocking [`crate::Session`] and
//! the tokio [`crate::aio::Session`] are each a handle on one [`Core`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::blocking::Conn;
use crate::commands;
use crate::{closed, io_failure, limit, tick, Error, OnLost, Target};

/// Why a lock on a session is lost: each cause its own words.
pub(crate) const ENDED_ZERO: &str =
    "LOCK.SESSION KEEPALIVE answered 0: the session had ended (closed elsewhere, or its deadline passed in the server)";
pub(crate) const ENDED_DEADLINE: &str =
    "the session's deadline passed with no keepalive acknowledged (the last acknowledged one's send time + ttl)";
pub(crate) const ENDED_NOSESSION: &str =
    "a grant naming the session was answered NOSESSION: the session had ended";
pub(crate) const CLOSED: &str =
    "its session was closed (Session::close, or the Session dropped): released with it";

/// What a session asks of a lock that follows it (a blocking or a tokio
/// lock's shared state), for one acquisition (`generation`).
pub(crate) trait Follower: Send + Sync {
    /// A keepalive was acknowledged: the lease lasts until `until`. False
    /// once that acquisition is over (the session forgets it).
    fn renewed(&self, generation: u64, until: Instant) -> bool;
    /// The session ended: the lock is lost; its own callback and its
    /// `LeaseLost` error, if this is news.
    fn ended(&self, generation: u64, why: &str) -> Option<(Option<OnLost>, Error)>;
    /// The session was closed: the lock is released (no callback).
    fn closed(&self, generation: u64);
}

type Followers = Vec<(Weak<dyn Follower>, u64)>;

/// The session open on one server (one node).
struct Node {
    id: i64,
    /// The last acknowledged keepalive's (or the OPEN's) send time + ttl.
    deadline: Instant,
    /// When the keeper sends the next keepalive.
    next: Instant,
    followers: Followers,
}

struct State {
    ttl: Duration,
    timeout: Duration,
    on_lost: Option<OnLost>,
    /// Node address ("" for a single server) -> the session open there.
    nodes: HashMap<String, Node>,
    /// A cluster's primaries: (first slot, last slot, host, port).
    slots: Vec<(u16, u16, String, u16)>,
    keeper: bool,
    /// The `Session` object is gone: nothing opens any more.
    dropped: bool,
}

/// One `Session`: its options, its sessions per node, its connection.
pub(crate) struct Core {
    target: Target,
    pid: u32,
    state: Mutex<State>,
    /// Wakes the keeper (a session opened, a grant refused, closed).
    wake: Condvar,
    /// The keeper's connection (a cluster connection routes by address):
    /// the keepalives go over it. Held across I/O, always with a timeout.
    conn: Mutex<Option<Conn>>,
    /// OPEN, CLOSE and CLUSTER SLOTS go over this one: an opener never
    /// keeps the keeper waiting (it must be back at a deadline).
    opener: Mutex<Option<Conn>>,
}

/// A lock's link to its session (the `Options` field).
#[derive(Clone)]
pub(crate) struct Link(pub(crate) Arc<Core>);

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Session")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The default ttl of a session: the locks' default lease.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(30);

impl Core {
    pub(crate) fn new(target: Target) -> Arc<Core> {
        Arc::new(Core {
            target,
            pid: std::process::id(),
            state: Mutex::new(State {
                ttl: DEFAULT_TTL,
                timeout: crate::DEFAULT_TIMEOUT,
                on_lost: None,
                nodes: HashMap::new(),
                slots: Vec::new(),
                keeper: false,
                dropped: false,
            }),
            wake: Condvar::new(),
            conn: Mutex::new(None),
            opener: Mutex::new(None),
        })
    }

    /// Whether a lock on `target` can be in this session: the same server
    /// (or a cluster: the session opens on the key's node).
    pub(crate) fn serves(&self, target: &Target) -> bool {
        match (&self.target, target) {
            (Target::Server(a), Target::Server(b)) => {
                a.get_connection_info().addr() == b.get_connection_info().addr()
            }
            (Target::Cluster(_), Target::Cluster(_)) => true,
            _ => false,
        }
    }

    pub(crate) fn set_ttl(&self, ttl: Duration) {
        lock(&self.state).ttl = ttl;
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        lock(&self.state).timeout = timeout;
    }

    pub(crate) fn set_on_lost(&self, f: OnLost) {
        lock(&self.state).on_lost = Some(f);
    }

    /// The sessions open now: (node, id); the node is "" on a single server.
    pub(crate) fn ids(&self) -> Vec<(String, i64)> {
        let mut ids: Vec<(String, i64)> = lock(&self.state)
            .nodes
            .iter()
            .map(|(n, s)| (n.clone(), s.id))
            .collect();
        ids.sort();
        ids
    }

    /// The node of `key`, and the session open there, if known without I/O.
    pub(crate) fn cached(&self, key: &[u8]) -> Option<(String, i64)> {
        let st = lock(&self.state);
        let node = match &self.target {
            Target::Server(_) => String::new(),
            Target::Cluster(_) => node_of(&st.slots, key)?,
        };
        let n = st.nodes.get(&node)?;
        (n.deadline > Instant::now()).then_some((node, n.id))
    }

    /// The session on `key`'s node: opened (`LOCK.SESSION OPEN`) if none is.
    pub(crate) fn ensure(
        self: &Arc<Self>,
        target: &Target,
        key: &[u8],
    ) -> Result<(String, i64), Error> {
        if self.pid != std::process::id() {
            return Err(Error::Forked);
        }
        if lock(&self.state).dropped {
            return Err(Error::Invalid("the lock's Session was dropped".into()));
        }
        if !self.serves(target) {
            return Err(Error::Invalid(
                "a lock and its Session must be on the same server (or cluster)".into(),
            ));
        }
        if let Some(found) = self.cached(key) {
            return Ok(found);
        }
        let (ttl, timeout) = {
            let st = lock(&self.state);
            (st.ttl, st.timeout)
        };
        if ttl < Duration::from_millis(1) {
            return Err(Error::Invalid("a session ttl under 1 ms".into()));
        }
        let mut conn = lock(&self.opener);
        let node = match &self.target {
            Target::Server(_) => String::new(),
            Target::Cluster(_) => self.cluster_node(&mut conn, key, timeout)?,
        };
        // Opened by another lock while this one waited for the connection?
        let (expired, known) = {
            let st = lock(&self.state);
            match st.nodes.get(&node) {
                Some(n) if n.deadline > Instant::now() => return Ok((node, n.id)),
                Some(n) => (true, n.id),
                None => (false, 0),
            }
        };
        if expired {
            self.end(&node, known, ENDED_DEADLINE);
        }
        let sent = Instant::now();
        let reply = query(
            &self.target,
            &mut conn,
            &node,
            &commands::session_open(ttl),
            timeout,
        );
        drop(conn);
        let id: i64 = redis::from_redis_value(reply?).map_err(redis::RedisError::from)?;
        let mut st = lock(&self.state);
        st.nodes.insert(
            node.clone(),
            Node {
                id,
                deadline: sent + ttl,
                next: Instant::now() + tick(ttl),
                followers: Vec::new(),
            },
        );
        if !st.keeper {
            let core = Arc::clone(self);
            let spawned = thread::Builder::new()
                .name("redis-native-lock-session".into())
                .spawn(move || keeper(&core));
            st.keeper = spawned.is_ok();
        }
        self.wake.notify_all();
        Ok((node, id))
    }

    /// `key`'s node in a cluster: its primary's address, from `CLUSTER
    /// SLOTS` (read again when the slot is not known).
    fn cluster_node(
        &self,
        conn: &mut Option<Conn>,
        key: &[u8],
        timeout: Duration,
    ) -> Result<String, Error> {
        if let Some(node) = node_of(&lock(&self.state).slots, key) {
            return Ok(node);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = query(&self.target, conn, "", &cmd, timeout)?;
        let slots = parse_slots(reply);
        let mut st = lock(&self.state);
        st.slots = slots;
        node_of(&st.slots, key).ok_or_else(|| {
            Error::Invalid(format!(
                "no node serves the slot of {:?} (CLUSTER SLOTS)",
                String::from_utf8_lossy(key)
            ))
        })
    }

    /// Tells a lock's loss: its own callback, then the session's.
    pub(crate) fn tell(&self, own: Option<OnLost>, err: &Error) {
        if let Some(own) = own {
            own(err);
        }
        let session = lock(&self.state).on_lost.clone();
        if let Some(session) = session {
            session(err);
        }
    }

    /// A lock granted in `node`'s session `id` follows it from now on. The
    /// session's deadline, or `None` if that session has ended meanwhile.
    pub(crate) fn follow(
        &self,
        node: &str,
        id: i64,
        follower: Weak<dyn Follower>,
        generation: u64,
    ) -> Option<Instant> {
        let mut st = lock(&self.state);
        let n = st.nodes.get_mut(node).filter(|n| n.id == id)?;
        n.followers.push((follower, generation));
        Some(n.deadline)
    }

    /// A grant naming `node`'s session `id` was answered `NOSESSION`. On a
    /// single server the session has ended: its locks are lost. In a
    /// cluster the slot may have moved: the slots are read again and the
    /// keeper asks the node now (a keepalive answered 0 ends it).
    pub(crate) fn refused(&self, node: &str, id: i64) {
        match &self.target {
            Target::Server(_) => self.end(node, id, ENDED_NOSESSION),
            Target::Cluster(_) => {
                let mut st = lock(&self.state);
                st.slots.clear();
                if let Some(n) = st.nodes.get_mut(node).filter(|n| n.id == id) {
                    n.next = Instant::now();
                }
                self.wake.notify_all();
            }
        }
    }

    /// Ends `node`'s session `id` here: every lock on it lost, each told once
    /// (its own callback, then the session's).
    fn end(&self, node: &str, id: i64, why: &str) {
        let (followers, on_lost) = {
            let mut st = lock(&self.state);
            if st.nodes.get(node).is_none_or(|n| n.id != id) {
                return;
            }
            let followers = st.nodes.remove(node).map(|n| n.followers);
            (followers.unwrap_or_default(), st.on_lost.clone())
        };
        for (f, generation) in followers {
            let Some(f) = f.upgrade() else { continue };
            if let Some((own, err)) = f.ended(generation, why) {
                if let Some(own) = own {
                    own(&err);
                }
                if let Some(session) = &on_lost {
                    session(&err);
                }
            }
        }
    }

    /// `LOCK.SESSION CLOSE` on every node: the locks on it are released at
    /// once (not lost: no callback). How many holders ended, as the servers
    /// say; the first failure after trying every node.
    pub(crate) fn close(&self) -> Result<i64, Error> {
        if self.pid != std::process::id() {
            return Ok(0); // a forked child: the parent's sessions
        }
        let (nodes, timeout) = {
            let mut st = lock(&self.state);
            let nodes: Vec<(String, Node)> = st.nodes.drain().collect();
            self.wake.notify_all();
            (nodes, st.timeout)
        };
        if nodes.is_empty() {
            return Ok(0);
        }
        for (_, n) in &nodes {
            for (f, generation) in &n.followers {
                if let Some(f) = f.upgrade() {
                    f.closed(*generation);
                }
            }
        }
        let mut conn = lock(&self.opener);
        let mut ended = 0;
        let mut failed = None;
        for (node, n) in &nodes {
            let reply = query(
                &self.target,
                &mut conn,
                node,
                &commands::session_close(n.id),
                timeout,
            );
            match reply.and_then(|v| redis::from_redis_value::<i64>(v).map_err(Into::into)) {
                Ok(count) => ended += count,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(ended),
        }
    }

    /// The `Session` object is gone: closed, and nothing opens any more.
    pub(crate) fn drop_session(&self) -> Result<i64, Error> {
        lock(&self.state).dropped = true;
        self.close()
    }
}

/// Sends `cmd` to `node` ("": the server) on `conn`, opened if need be; a
/// failed connection is dropped. One that had died while idle (killed, the
/// server's idle `timeout`: it ran nothing) is replaced at once, and the
/// command sent again on the new one.
fn query(
    target: &Target,
    conn: &mut Option<Conn>,
    node: &str,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> redis::RedisResult<Value> {
    let reused = conn.is_some();
    let reply = query_once(target, conn, node, cmd, timeout);
    match reply {
        Err(e) if reused && io_failure(&e) && !e.is_timeout() => {
            query_once(target, conn, node, cmd, timeout)
        }
        reply => reply,
    }
}

fn query_once(
    target: &Target,
    conn: &mut Option<Conn>,
    node: &str,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> redis::RedisResult<Value> {
    if conn.is_none() {
        *conn = Some(Conn::open(target, timeout)?);
    }
    let c = conn.as_mut().ok_or_else(closed)?;
    let reply = c
        .timeouts(Some(timeout))
        .and_then(|()| c.on_node(node, cmd));
    if matches!(&reply, Err(e) if io_failure(e)) {
        *conn = None;
    }
    reply
}

/// The keeper of a `Session`: a keepalive per node at a third of the ttl;
/// at a deadline passed unanswered, that node's session ends here (its
/// locks told at once, not at the next tick). It ends when no session is
/// open.
fn keeper(core: &Arc<Core>) {
    loop {
        let now = Instant::now();
        let mut expired = Vec::new();
        let due = {
            let mut st = lock(&core.state);
            if st.nodes.is_empty() || st.dropped {
                st.keeper = false;
                return;
            }
            for (node, n) in &st.nodes {
                if n.deadline <= now {
                    expired.push((node.clone(), n.id));
                }
            }
            let due = st
                .nodes
                .iter()
                .filter(|(_, n)| n.next <= now && n.deadline > now)
                .map(|(node, n)| (node.clone(), n.id))
                .next();
            if due.is_none() && expired.is_empty() {
                let earliest = st
                    .nodes
                    .values()
                    .map(|n| n.next.min(n.deadline))
                    .min()
                    .unwrap_or(now + Duration::from_secs(1));
                let wait = earliest.saturating_duration_since(now);
                drop(core.wake.wait_timeout(st, wait));
                continue;
            }
            due
        };
        for (node, id) in expired {
            core.end(&node, id, ENDED_DEADLINE);
        }
        if let Some((node, id)) = due {
            keepalive(core, &node, id);
        }
    }
}

/// One keepalive of `node`'s session `id`; its reply within the timeout
/// and never past the earliest deadline (the keeper must be back to end it).
fn keepalive(core: &Arc<Core>, node: &str, id: i64) {
    let (ttl, timeout, earliest) = {
        let st = lock(&core.state);
        let earliest = st.nodes.values().map(|n| n.deadline).min();
        (st.ttl, st.timeout, earliest)
    };
    let left = earliest.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
    let io = limit(timeout, left);
    let mut conn = lock(&core.conn);
    let sent = Instant::now();
    let keepalive = commands::session_keepalive(id, ttl);
    let reply = query(&core.target, &mut conn, node, &keepalive, io);
    drop(conn);
    match reply.map(redis::from_redis_value::<i64>) {
        Ok(Ok(1)) => {
            let until = sent + ttl;
            // Copies of the followers (they stay listed: an end or a close
            // meanwhile tells every one of them).
            let followers = {
                let mut st = lock(&core.state);
                let Some(n) = st.nodes.get_mut(node).filter(|n| n.id == id) else {
                    return; // closed or ended meanwhile
                };
                n.deadline = until;
                n.next = Instant::now() + tick(ttl);
                n.followers.clone()
            };
            let keep: Vec<bool> = followers
                .iter()
                .map(|(f, g)| f.upgrade().is_some_and(|f| f.renewed(*g, until)))
                .collect();
            let mut st = lock(&core.state);
            if let Some(n) = st.nodes.get_mut(node).filter(|n| n.id == id) {
                // Followers are only appended meanwhile: the first ones are these.
                let mut i = 0;
                n.followers.retain(|_| {
                    i += 1;
                    keep.get(i - 1).copied().unwrap_or(true)
                });
            }
        }
        Ok(Ok(0)) => core.end(node, id, ENDED_ZERO),
        _ => {
            // A failure (or an odd reply): again soon, on a new connection,
            // until the deadline passes.
            let mut st = lock(&core.state);
            if let Some(n) = st.nodes.get_mut(node).filter(|n| n.id == id) {
                let soon =
                    (tick(ttl) / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
                n.next = Instant::now() + soon;
            }
        }
    }
}

/// The primary serving `key`'s slot, as "host:port".
fn node_of(slots: &[(u16, u16, String, u16)], key: &[u8]) -> Option<String> {
    let slot = key_slot(key);
    slots
        .iter()
        .find(|(first, last, _, _)| (*first..=*last).contains(&slot))
        .map(|(_, _, host, port)| format!("{host}:{port}"))
}

/// `CLUSTER SLOTS`: each range's first and last slot and its primary.
fn parse_slots(reply: Value) -> Vec<(u16, u16, String, u16)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .into_iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let mut it = r.into_iter();
            let first: u16 = redis::from_redis_value(it.next()?).ok()?;
            let last: u16 = redis::from_redis_value(it.next()?).ok()?;
            let Value::Array(primary) = it.next()? else {
                return None;
            };
            let mut p = primary.into_iter();
            let host: String = redis::from_redis_value(p.next()?).ok()?;
            let port: u16 = redis::from_redis_value(p.next()?).ok()?;
            Some((first, last, host, port))
        })
        .collect()
}

/// A key's hash slot (CRC16/XMODEM of the key or its hash tag, mod 16384).
fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&c| c == b'}')?;
        (close > 0).then(|| rest.get(..close)).flatten()
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_as_the_cluster_computes_them() {
        // CLUSTER KEYSLOT's answers.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"123456789"), 0x31C3);
    }
}
