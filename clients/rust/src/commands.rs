//! Every command the package sends (but the watcher's `SUBSCRIBE`, the
//! `redis` crate's own), built in one place, and what their replies mean:
//! the blocking API, the tokio API, RedLock and the watcher each only carry
//! them over their own connections. An exchange of several commands whose
//! next step depends on the last reply ([`Release`], [`Renew`]) is an
//! [`Exchange`]: the blocking and tokio connections each run it in a few
//! lines, with no decision of their own.

use std::collections::VecDeque;
use std::time::Duration;

use redis::{Arg, Cmd, FromRedisValue, Pipeline, RedisResult, Value};

use crate::{gone_error, millis, Error, Kind, Options};
use crate::{FREED, REGRANTED, RELEASE_NIL, RENEWED_FEWER, RENEW_ZERO, TAKEN, WRONGTYPE};

/// `name key…` for the kind: the head of every grant command.
fn head(kind: &Kind) -> Cmd {
    let one = |name: &str, key: &[u8]| {
        let mut c = redis::cmd(name);
        c.arg(key);
        c
    };
    match kind {
        Kind::Exclusive(k) => one("LOCK.ACQUIRE", k),
        Kind::Reentrant(k) => one("LOCK.RACQUIRE", k),
        Kind::Read(k) => one("LOCK.READ", k),
        Kind::Semaphore(k, limit) => {
            let mut c = one("LOCK.SEMAPHORE", k);
            c.arg(*limit);
            c
        }
        Kind::Multi(keys) => {
            let mut c = redis::cmd("LOCK.MACQUIRE");
            c.arg(keys.len()).arg(keys);
            c
        }
    }
}

/// `LOCK.ACQUIRE key owner ttl-ms`, as sent as is (RedLock: one try, no
/// `WAIT`).
pub(crate) fn acquire_once(key: &[u8], owner: &[u8], ttl_ms: u64) -> Cmd {
    let mut c = head(&Kind::Exclusive(key.to_vec()));
    c.arg(owner).arg(ttl_ms);
    c
}

/// A lock's grant command: the kind's head, owner, ttl (at least 1 ms),
/// `WAIT` as the options say, `BIND` when `bind`, `SESSION id` in a session.
pub(crate) fn acquire(
    kind: &Kind,
    o: &Options,
    owner: &[u8],
    bind: bool,
    session: Option<i64>,
) -> Cmd {
    let mut cmd = head(kind);
    cmd.arg(owner).arg(millis(o.ttl).max(1));
    match o.wait {
        None => {}
        Some(w) if w.is_zero() => {}
        Some(w) if w == Duration::MAX => {
            cmd.arg("WAIT").arg(0);
        }
        Some(w) => {
            cmd.arg("WAIT").arg(millis(w).max(1));
        }
    }
    if bind {
        cmd.arg("BIND");
    }
    if let Some(id) = session {
        cmd.arg("SESSION").arg(id);
    }
    cmd
}

/// `LOCK.SESSION OPEN ttl`, `KEEPALIVE id ttl`, `CLOSE id`.
pub(crate) fn session_open(ttl: Duration) -> Cmd {
    let mut c = redis::cmd("LOCK.SESSION");
    c.arg("OPEN").arg(millis(ttl).max(1));
    c
}

pub(crate) fn session_keepalive(id: i64, ttl: Duration) -> Cmd {
    let mut c = redis::cmd("LOCK.SESSION");
    c.arg("KEEPALIVE").arg(id).arg(millis(ttl).max(1));
    c
}

pub(crate) fn session_close(id: i64) -> Cmd {
    let mut c = redis::cmd("LOCK.SESSION");
    c.arg("CLOSE").arg(id);
    c
}

/// A grant refused because the session it names ended (or lives on another node).
pub(crate) fn no_session(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSESSION")
}

/// `LOCK.RELEASE key owner [TOKEN token]`: with the grant's token, a
/// holder whose grant ended never releases a later grant to the same owner
/// name (nil, nothing changed). Without: only where no grant is known (a
/// request whose reply was lost).
pub(crate) fn release(key: &[u8], owner: &[u8], token: Option<i64>) -> Cmd {
    let mut c = redis::cmd("LOCK.RELEASE");
    c.arg(key).arg(owner);
    if let Some(t) = token {
        c.arg("TOKEN").arg(t);
    }
    c
}

/// `LOCK.RENEW key owner ttl-ms [TOKEN token]`, the ttl as given: with the
/// token, renews that grant only (`0` when the owner name holds the key
/// under another one). Without: RedLock's fresh owner on every server.
pub(crate) fn renew(key: &[u8], owner: &[u8], ttl_ms: u64, token: Option<i64>) -> Cmd {
    let mut c = redis::cmd("LOCK.RENEW");
    c.arg(key).arg(owner).arg(ttl_ms);
    if let Some(t) = token {
        c.arg("TOKEN").arg(t);
    }
    c
}

/// `LOCK.INFO key`.
pub(crate) fn info(key: &[u8]) -> Cmd {
    let mut c = redis::cmd("LOCK.INFO");
    c.arg(key);
    c
}

/// `LOCK.GUARD key owner TOKEN token CALL command arg…` for a holder of
/// `kind` with `tokens` (in key order): guarded on `key` (one of the lock's
/// keys; `None`: its first) under that key's token, with `call`'s command
/// and arguments after `CALL`. [`Error::Invalid`] for a key not of the
/// lock, no command, or a cursor argument (`Cmd::cursor_arg`: its value is
/// the `redis` crate's own).
pub(crate) fn guard(
    kind: &Kind,
    tokens: &[i64],
    owner: &[u8],
    key: Option<&[u8]>,
    call: &Cmd,
) -> Result<Cmd, Error> {
    let keys = kind.keys();
    let at = match key {
        None => 0,
        Some(k) => keys.iter().position(|own| own[..] == *k).ok_or_else(|| {
            Error::Invalid(format!(
                "guarded on {:?}, not a key of this lock",
                String::from_utf8_lossy(k)
            ))
        })?,
    };
    let (Some(key), Some(token)) = (keys.get(at), tokens.get(at)) else {
        return Err(Error::Invalid("a guarded call without a held key".into()));
    };
    if call.args_iter().len() == 0 {
        return Err(Error::Invalid("a guarded call with no command".into()));
    }
    let mut c = redis::cmd("LOCK.GUARD");
    c.arg(key).arg(owner).arg("TOKEN").arg(*token).arg("CALL");
    for arg in call.args_iter() {
        match arg {
            Arg::Simple(a) => {
                c.arg(a);
            }
            _ => {
                return Err(Error::Invalid(
                    "a guarded call with a cursor argument (pass the cursor as an argument)".into(),
                ))
            }
        }
    }
    Ok(c)
}

/// What a guarded call's reply says.
pub(crate) enum Guarded<T> {
    /// The command ran: its reply, as asked for.
    Ran(T),
    /// `NOTHELD`: not this holder's now (nothing ran).
    NotHeld,
}

/// A `LOCK.GUARD` reply: the command's own (its errors are `Err`, as a
/// direct call's), or `NOTHELD`.
pub(crate) fn guarded<T: FromRedisValue>(reply: RedisResult<Value>) -> RedisResult<Guarded<T>> {
    match reply {
        Ok(v) => Ok(Guarded::Ran(redis::from_redis_value(v)?)),
        Err(e) if e.code() == Some("NOTHELD") => Ok(Guarded::NotHeld),
        Err(e) => Err(e),
    }
}

/// Why a lease is lost after a guarded call was refused.
pub(crate) const NOT_HELD: &str =
    "LOCK.GUARD answered NOTHELD: not held (under this token) any more; the command did not run";

/// `PUBLISH channel ""`: wakes the watcher listening on `channel`.
pub(crate) fn publish(channel: &str) -> Cmd {
    let mut c = redis::cmd("PUBLISH");
    c.arg(channel).arg("");
    c
}

/// `WAIT replicas timeout` (a timeout of at least 1 ms: 0 would wait for ever).
pub(crate) fn wait_replicas(replicas: u32, timeout: Duration) -> Cmd {
    let mut c = redis::cmd("WAIT");
    c.arg(replicas).arg(millis(timeout).max(1));
    c
}

/// `WAIT`'s reply: how many replicas acknowledged.
pub(crate) fn acknowledged(v: RedisResult<Value>) -> RedisResult<i64> {
    v.and_then(|v| redis::from_redis_value::<i64>(v).map_err(Into::into))
}

/// `CLIENT TRACKING ON REDIRECT <watcher> NOLOOP`.
pub(crate) fn tracking(watcher: i64) -> Cmd {
    let mut c = redis::cmd("CLIENT");
    c.arg("TRACKING")
        .arg("ON")
        .arg("REDIRECT")
        .arg(watcher)
        .arg("NOLOOP");
    c
}

/// `CLIENT ID`: the watcher's, which holders' tracking redirects to.
pub(crate) fn client_id() -> Cmd {
    let mut c = redis::cmd("CLIENT");
    c.arg("ID");
    c
}

/// Tokens from an acquire's reply: one for a single key, one per key for
/// `LOCK.MACQUIRE`; `None` when not granted.
pub(crate) fn tokens(reply: Value) -> RedisResult<Option<Vec<i64>>> {
    match reply {
        Value::Nil => Ok(None),
        Value::Int(t) => Ok(Some(vec![t])),
        Value::Array(items) => items
            .into_iter()
            .map(redis::from_redis_value::<i64>)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(Into::into),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply to a lock request",
            format!("{other:?}"),
        ))),
    }
}

/// One holder as `LOCK.INFO` shows it: owner, holds, ttl-ms-left, token.
pub(crate) type HolderInfo = (Vec<u8>, i64, i64, i64);

/// `LOCK.INFO`'s holders; `None` when free. Either protocol.
pub(crate) fn holders(reply: Value) -> Option<Vec<HolderInfo>> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Array(items) => {
            let mut it = items.into_iter();
            let mut out = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(m) => m,
        _ => return None,
    };
    for (k, v) in pairs {
        let name: Vec<u8> = redis::from_redis_value(k).unwrap_or_default();
        if name == b"holders" {
            let list: Vec<HolderInfo> = redis::from_redis_value(v).unwrap_or_default();
            return Some(list);
        }
    }
    Some(Vec::new())
}

/// Whether `LOCK.INFO`'s reply names `owner` among the holders (under
/// `token`, when given).
pub(crate) fn held_by(reply: Value, owner: &[u8], token: Option<i64>) -> bool {
    holders(reply).is_some_and(|h| {
        h.iter()
            .any(|(o, _, _, t)| o == owner && token.is_none_or(|token| *t == token))
    })
}

/// On a bound connection, in one round trip: `LOCK.KEEPALIVE ttl` (when
/// renewing) and `LOCK.INFO` of each key. The reads say whether the lock is
/// still ours, and keep the keys in the server's tracking table (a write of
/// our own, with NOLOOP, drops them).
/// An error reply is one reply among the others (`ignore_errors`): a key's
/// `WRONGTYPE` is an overwritten key, never a failed connection.
pub(crate) fn sync_pipe(kind: &Kind, keepalive: Option<Duration>) -> Pipeline {
    let mut p = redis::pipe();
    p.ignore_errors();
    if let Some(ttl) = keepalive {
        p.cmd("LOCK.KEEPALIVE").arg(millis(ttl).max(1));
    }
    for k in kind.keys() {
        p.add_command(info(&k));
    }
    p
}

/// What [`sync_pipe`]'s replies say: `None` while the grant (owner and
/// `tokens`, in key order) holds every key, else why not.
pub(crate) fn judge(
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    keepalive: bool,
    replies: Vec<Value>,
) -> Option<&'static str> {
    let mut it = replies.into_iter();
    // LOCK.KEEPALIVE's count (an error reply: nothing renewed).
    let renewed = if keepalive {
        it.next()
            .and_then(|v| redis::from_redis_value::<i64>(v).ok())
            .unwrap_or(0)
    } else {
        i64::MAX
    };
    for (info, token) in it.zip(tokens) {
        if let Value::ServerError(e) = &info {
            if e.code() == "WRONGTYPE" {
                return Some(WRONGTYPE);
            }
            continue; // no verdict: the renewal decides
        }
        let holders = holders(info);
        let Some(holders) = holders else {
            return Some(FREED);
        };
        if holders.iter().any(|(o, _, _, t)| o == owner && t == token) {
            continue;
        }
        if holders.iter().any(|(o, ..)| o == owner) {
            return Some(REGRANTED);
        }
        return Some(TAKEN);
    }
    if renewed < i64::try_from(kind.keys().len()).unwrap_or(i64::MAX) {
        return Some(RENEWED_FEWER);
    }
    None
}

/// Commands sent one at a time, each chosen by the replies before it. A
/// connection runs it: while [`Exchange::next`] names a command, send it
/// and hand its reply (or its failure) to [`Exchange::reply`]; an `Err`
/// from there ends the exchange; else [`Exchange::outcome`] is the answer.
pub(crate) trait Exchange {
    type Outcome;
    /// The command to send now; `None` when done.
    fn next(&self) -> Option<&Cmd>;
    /// Takes the reply to the command [`Exchange::next`] named: `Err` when
    /// the exchange cannot go on (the connection failed, the server refused).
    fn reply(&mut self, reply: RedisResult<Value>) -> RedisResult<()>;
    fn outcome(self) -> Self::Outcome;
}

/// How a holder's release ended.
pub(crate) enum Released {
    /// The last hold went (`1`).
    All,
    /// One hold of several went (`0`).
    OneHold,
    /// The lock was not ours any more: why.
    Gone(&'static str),
}

/// `LOCK.RELEASE` of one owner on each key; with `all`, each key's until
/// its last hold is gone.
pub(crate) struct Release {
    /// What is left to send, the current key's first.
    cmds: VecDeque<Cmd>,
    all: bool,
    out: Released,
}

impl Release {
    /// Under the grant's `tokens` (in key order).
    pub(crate) fn new(kind: &Kind, owner: &[u8], tokens: &[i64], all: bool) -> Release {
        Release {
            cmds: kind
                .keys()
                .iter()
                .zip(tokens)
                .map(|(k, t)| release(k, owner, Some(*t)))
                .collect(),
            all,
            out: Released::OneHold,
        }
    }

    fn gone(&mut self, why: &'static str) {
        self.out = Released::Gone(why);
        self.cmds.clear();
    }
}

impl Exchange for Release {
    type Outcome = Released;

    fn next(&self) -> Option<&Cmd> {
        self.cmds.front()
    }

    fn reply(&mut self, reply: RedisResult<Value>) -> RedisResult<()> {
        match reply {
            Ok(Value::Nil) => self.gone(RELEASE_NIL),
            Ok(Value::Int(1)) => {
                self.out = Released::All;
                self.cmds.pop_front();
            }
            Ok(_) if self.all => {} // a hold is left: the same again
            Ok(_) => {
                self.cmds.pop_front();
            }
            Err(e) if gone_error(&e) => self.gone(WRONGTYPE),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn outcome(self) -> Released {
        self.out
    }
}

/// `LOCK.RENEW` of one owner on each key (ttl at least 1 ms): the renewal
/// of a lock without `BIND`. Its outcome: `None` when every key was
/// renewed, else why the lease is lost.
pub(crate) struct Renew {
    cmds: VecDeque<Cmd>,
    lost: Option<&'static str>,
}

impl Renew {
    /// Under the grant's `tokens` (in key order).
    pub(crate) fn new(kind: &Kind, owner: &[u8], tokens: &[i64], ttl: Duration) -> Renew {
        let ms = millis(ttl).max(1);
        Renew {
            cmds: kind
                .keys()
                .iter()
                .zip(tokens)
                .map(|(k, t)| renew(k, owner, ms, Some(*t)))
                .collect(),
            lost: None,
        }
    }

    fn lost(&mut self, why: &'static str) {
        self.lost = Some(why);
        self.cmds.clear();
    }
}

impl Exchange for Renew {
    type Outcome = Option<&'static str>;

    fn next(&self) -> Option<&Cmd> {
        self.cmds.front()
    }

    fn reply(&mut self, reply: RedisResult<Value>) -> RedisResult<()> {
        match reply {
            Ok(Value::Int(1)) => {
                self.cmds.pop_front();
            }
            Ok(_) => self.lost(RENEW_ZERO),
            Err(e) if gone_error(&e) => self.lost(WRONGTYPE),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn outcome(self) -> Option<&'static str> {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrongtype() -> redis::RedisError {
        redis::make_extension_error("WRONGTYPE".into(), Some("not a lock".into()))
    }

    /// Runs `e` against canned replies; the commands it sent, and its end.
    fn run<E: Exchange>(
        mut e: E,
        replies: Vec<RedisResult<Value>>,
    ) -> (Vec<Vec<u8>>, RedisResult<E::Outcome>) {
        let mut sent = Vec::new();
        let mut replies = replies.into_iter();
        while let Some(cmd) = e.next() {
            sent.push(cmd.get_packed_command());
            let reply = replies.next().expect("a reply for every command");
            if let Err(err) = e.reply(reply) {
                return (sent, Err(err));
            }
        }
        (sent, Ok(e.outcome()))
    }

    fn multi() -> Kind {
        Kind::Multi(vec![b"a".to_vec(), b"b".to_vec()])
    }

    #[test]
    fn a_release_goes_key_by_key_and_stops_at_a_lock_not_ours() {
        let (sent, out) = run(
            Release::new(&multi(), b"o", &[3, 4], false),
            vec![Ok(Value::Int(1)), Ok(Value::Int(1))],
        );
        // Each key under its own token.
        assert_eq!(
            sent,
            [release(b"a", b"o", Some(3)), release(b"b", b"o", Some(4))]
                .map(|c| c.get_packed_command())
        );
        assert!(String::from_utf8_lossy(&sent[1]).ends_with("$5\r\nTOKEN\r\n$1\r\n4\r\n"));
        assert!(matches!(out, Ok(Released::All)));

        let (sent, out) = run(
            Release::new(&multi(), b"o", &[3, 4], false),
            vec![Ok(Value::Nil)],
        );
        assert_eq!(sent.len(), 1);
        assert!(matches!(out, Ok(Released::Gone(RELEASE_NIL))));

        let (_, out) = run(
            Release::new(&Kind::Reentrant(b"k".to_vec()), b"o", &[7], false),
            vec![Ok(Value::Int(0))],
        );
        assert!(matches!(out, Ok(Released::OneHold)));

        let (_, out) = run(
            Release::new(&Kind::Exclusive(b"k".to_vec()), b"o", &[7], false),
            vec![Err(wrongtype())],
        );
        assert!(matches!(out, Ok(Released::Gone(WRONGTYPE))));
    }

    #[test]
    fn a_release_of_every_hold_repeats_until_the_last() {
        let (sent, out) = run(
            Release::new(&Kind::Reentrant(b"k".to_vec()), b"o", &[7], true),
            vec![Ok(Value::Int(0)), Ok(Value::Int(0)), Ok(Value::Int(1))],
        );
        assert_eq!(sent.len(), 3);
        assert!(matches!(out, Ok(Released::All)));
    }

    #[test]
    fn a_renewal_stops_at_the_first_key_not_renewed() {
        let (sent, out) = run(
            Renew::new(&multi(), b"o", &[3, 4], Duration::from_micros(10)),
            vec![Ok(Value::Int(1)), Ok(Value::Int(0))],
        );
        // A ttl under 1 ms is sent as 1; each key under its own token.
        assert_eq!(
            sent,
            [renew(b"a", b"o", 1, Some(3)), renew(b"b", b"o", 1, Some(4))]
                .map(|c| c.get_packed_command())
        );
        assert!(matches!(out, Ok(Some(RENEW_ZERO))));

        let (sent, out) = run(
            Renew::new(&multi(), b"o", &[3, 4], Duration::from_secs(1)),
            vec![Err(wrongtype())],
        );
        assert_eq!(sent.len(), 1);
        assert!(matches!(out, Ok(Some(WRONGTYPE))));

        let (_, out) = run(
            Renew::new(&multi(), b"o", &[3, 4], Duration::from_secs(1)),
            vec![Ok(Value::Int(1)), Err(crate::closed())],
        );
        assert!(out.is_err());
    }

    #[test]
    fn a_read_tells_each_cause_apart() {
        let info = |holders: Vec<(&str, i64)>| {
            let list = holders
                .into_iter()
                .map(|(o, t)| {
                    Value::Array(vec![
                        Value::BulkString(o.into()),
                        Value::Int(1),
                        Value::Int(1000),
                        Value::Int(t),
                    ])
                })
                .collect();
            Value::Array(vec![
                Value::BulkString(b"mode".to_vec()),
                Value::BulkString(b"exclusive".to_vec()),
                Value::BulkString(b"holders".to_vec()),
                Value::Array(list),
            ])
        };
        let k = Kind::Exclusive(b"k".to_vec());
        let judged = |renewed: Option<i64>, v: Value| {
            let mut replies: Vec<Value> = renewed.map(Value::Int).into_iter().collect();
            replies.push(v);
            judge(&k, b"o", &[7], renewed.is_some(), replies)
        };
        assert_eq!(judged(None, info(vec![("o", 7)])), None);
        assert_eq!(judged(Some(1), info(vec![("o", 7)])), None);
        assert_eq!(judged(None, Value::Nil), Some(FREED));
        assert_eq!(judged(None, info(vec![("o", 9)])), Some(REGRANTED));
        assert_eq!(judged(Some(1), info(vec![("p", 9)])), Some(TAKEN));
        assert_eq!(judged(Some(0), info(vec![("o", 7)])), Some(RENEWED_FEWER));
        // The read's cause comes first: KEEPALIVE renewed nothing because it was freed.
        assert_eq!(judged(Some(0), Value::Nil), Some(FREED));
        // A WRONGTYPE read (the pipeline ignores errors): overwritten.
        let wrongtype = redis::ServerError::try_from(wrongtype()).expect("a server error");
        assert_eq!(
            judged(Some(0), Value::ServerError(wrongtype)),
            Some(WRONGTYPE)
        );
    }

    #[test]
    fn a_guarded_call_carries_the_holders_key_owner_and_token() {
        let packed = |c: &Cmd| String::from_utf8_lossy(&c.get_packed_command()).into_owned();
        let mut set = redis::cmd("SET");
        set.arg("job:1").arg(b"d\x00ne");
        let expected = |key: &str, token: i64| {
            let mut c = redis::cmd("LOCK.GUARD");
            c.arg(key)
                .arg("o")
                .arg("TOKEN")
                .arg(token)
                .arg("CALL")
                .arg("SET")
                .arg("job:1")
                .arg(b"d\x00ne");
            packed(&c)
        };
        let one = Kind::Exclusive(b"k".to_vec());
        let c = guard(&one, &[7], b"o", None, &set).unwrap();
        assert_eq!(packed(&c), expected("k", 7));
        // A multi-key lock: its first key, or the one named, each under its own token.
        let c = guard(&multi(), &[3, 4], b"o", None, &set).unwrap();
        assert_eq!(packed(&c), expected("a", 3));
        let c = guard(&multi(), &[3, 4], b"o", Some(b"b"), &set).unwrap();
        assert_eq!(packed(&c), expected("b", 4));
        // Refused before anything is sent.
        let invalid = |r: Result<Cmd, Error>| matches!(r, Err(Error::Invalid(_)));
        assert!(invalid(guard(&multi(), &[3, 4], b"o", Some(b"c"), &set)));
        assert!(invalid(guard(&one, &[], b"o", None, &set)));
        assert!(invalid(guard(&one, &[7], b"o", None, &redis::Cmd::new())));
        let mut scan = redis::cmd("SCAN");
        scan.cursor_arg(0);
        assert!(invalid(guard(&one, &[7], b"o", None, &scan)));
    }

    #[test]
    fn a_guarded_reply_is_the_commands_or_not_held() {
        assert!(matches!(
            guarded::<i64>(Ok(Value::Int(5))),
            Ok(Guarded::Ran(5))
        ));
        let not_held = redis::make_extension_error("NOTHELD".into(), Some("not held".into()));
        assert!(matches!(
            guarded::<i64>(Err(not_held)),
            Ok(Guarded::NotHeld)
        ));
        // The command's own errors stay its own, WRONGTYPE included.
        let e = guarded::<i64>(Err(wrongtype()))
            .err()
            .map(|e| e.code().map(String::from));
        assert_eq!(e, Some(Some("WRONGTYPE".to_string())));
        // A reply not of the type asked for: a parse error.
        assert!(guarded::<i64>(Ok(Value::Nil)).is_err());
    }

    #[test]
    fn a_grant_command_carries_wait_and_bind() {
        let packed = |c: Cmd| String::from_utf8_lossy(&c.get_packed_command()).into_owned();
        let o = Options {
            ttl: Duration::from_millis(1500),
            wait: Some(Duration::MAX),
            ..Options::default()
        };
        let c = packed(acquire(
            &Kind::Semaphore(b"s".to_vec(), 3),
            &o,
            b"o",
            true,
            None,
        ));
        assert_eq!(
            c,
            packed({
                let mut c = redis::cmd("LOCK.SEMAPHORE");
                c.arg("s")
                    .arg(3)
                    .arg("o")
                    .arg(1500)
                    .arg("WAIT")
                    .arg(0)
                    .arg("BIND");
                c
            })
        );
        let o = Options {
            wait: Some(Duration::ZERO),
            ..o
        };
        assert_eq!(
            packed(acquire(
                &Kind::Exclusive(b"k".to_vec()),
                &o,
                b"o",
                false,
                None
            )),
            packed(acquire_once(b"k", b"o", 1500))
        );
    }
}
