//! Bad input shared by commands.rs and replication.rs, and the exact error
//! texts it must get.

use super::*;

/// The exact text of one of the module's errors.
pub fn err_text(e: LockError) -> String {
    e.message()
}

/// `ERR ttl must be an integer from 1 to <max>` with the default maximum.
pub fn bad_ttl() -> String {
    LockError::BadTtl(MAX_TTL).message()
}

/// What a bad request must answer.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Exactly this error text.
    Exact(String),
    /// One of these error texts.
    OneOf(Vec<String>),
    /// Redis's own wrong-arity error for the command.
    Arity,
}

impl Expect {
    pub fn check(&self, args: &[Vec<u8>], r: &Reply) {
        let shown: Vec<String> = args.iter().map(|a| show(a)).collect();
        match self {
            Expect::Exact(e) => {
                assert_eq!(r, &Reply::Error(e.clone()), "reply to {shown:?}");
            }
            Expect::OneOf(es) => {
                assert!(
                    es.iter().any(|e| r == &Reply::Error(e.clone())),
                    "reply to {shown:?}: expected one of {es:?}, got {r:?}"
                );
            }
            Expect::Arity => {
                let name = String::from_utf8_lossy(&args[0]).to_lowercase();
                let want = format!("ERR wrong number of arguments for '{name}' command");
                match r {
                    Reply::Error(e) if e.to_lowercase() == want.to_lowercase() => {}
                    other => panic!("reply to {shown:?}: expected {want:?}, got {other:?}"),
                }
            }
        }
    }
}

fn words(s: &[&[u8]]) -> Vec<Vec<u8>> {
    s.iter().map(|w| w.to_vec()).collect()
}

/// One bad request (its arguments) and the error it must get.
pub type BadInput = (Vec<Vec<u8>>, Expect);

/// Bad requests against `key` (held by `holder` exclusively, or free) and
/// `strkey` (a string key), each with the error it must get. None of them may
/// change anything.
pub fn bad_inputs(key: &str, holder: &str, strkey: &str) -> Vec<BadInput> {
    let k = key.as_bytes();
    let o = holder.as_bytes();
    let s = strkey.as_bytes();
    let ttl = Expect::Exact(bad_ttl());
    let wait = Expect::Exact(LockError::BadWait(MAX_WAIT_MS).message());
    let syntax = Expect::Exact(LockError::Syntax.message());
    let empty = Expect::Exact(LockError::EmptyOwner.message());
    let wrongtype = Expect::Exact(LockError::WrongType.message());
    let mut v: Vec<BadInput> = Vec::new();
    let over_max = (MAX_TTL + 1).to_string();
    let over_wait = (MAX_WAIT_MS + 1).to_string();
    let bad_ttls: Vec<&[u8]> = vec![
        b"0",
        b"-1",
        b"abc",
        b"+5",
        b"05",
        b" 5",
        b"5 ",
        b"-0",
        b"1.5",
        b"",
        b"99999999999999999999",
        b"-99999999999999999999",
        over_max.as_bytes(),
    ];
    for cmd in [&b"LOCK.ACQUIRE"[..], b"LOCK.RACQUIRE", b"LOCK.READ"] {
        // Arity (Redis's own check, arity -4).
        v.push((words(&[cmd]), Expect::Arity));
        v.push((words(&[cmd, k]), Expect::Arity));
        v.push((words(&[cmd, k, o]), Expect::Arity));
        for t in &bad_ttls {
            v.push((words(&[cmd, k, o, t]), ttl.clone()));
            v.push((words(&[cmd, k, b"someone", t]), ttl.clone()));
        }
        v.push((words(&[cmd, k, b"", b"100000"]), empty.clone()));
        v.push((words(&[cmd, k, o, b"200000", b"FOO"]), syntax.clone()));
        v.push((words(&[cmd, k, o, b"200000", b"FOO", b"1"]), syntax.clone()));
        v.push((words(&[cmd, k, b"x", b"200000", b"NOWAIT"]), syntax.clone()));
        // WAIT without its value: a syntax error, or the WAIT error.
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT"]),
            Expect::OneOf(vec![
                LockError::Syntax.message(),
                LockError::BadWait(MAX_WAIT_MS).message(),
            ]),
        ));
        for w in [
            &b"-1"[..],
            b"abc",
            b"+5",
            b"05",
            b"-0",
            b" 5",
            b"",
            b"1.5",
            b"99999999999999999999",
            over_wait.as_bytes(),
        ] {
            v.push((words(&[cmd, k, o, b"200000", b"WAIT", w]), wait.clone()));
            v.push((words(&[cmd, k, b"x", b"200000", b"wait", w]), wait.clone()));
        }
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT", b"10", b"WAIT", b"10"]),
            syntax.clone(),
        ));
        v.push((
            words(&[cmd, k, o, b"200000", b"WAIT", b"10", b"extra"]),
            syntax.clone(),
        ));
        v.push((words(&[cmd, s, o, b"100000"]), wrongtype.clone()));
        v.push((words(&[cmd, s, b"x", b"100000"]), wrongtype.clone()));
    }
    // LOCK.RELEASE (arity -3) and LOCK.RENEW (arity -4): `[TOKEN token]`.
    let token = Expect::Exact(LockError::BadToken.message());
    let bad_tokens: Vec<&[u8]> = vec![
        b"0",
        b"-1",
        b"abc",
        b"+5",
        b"05",
        b" 5",
        b"-0",
        b"1.5",
        b"",
        b"9223372036854775808",
        b"99999999999999999999",
    ];
    v.push((words(&[b"LOCK.RELEASE"]), Expect::Arity));
    v.push((words(&[b"LOCK.RELEASE", k]), Expect::Arity));
    v.push((words(&[b"LOCK.RELEASE", k, b""]), empty.clone()));
    v.push((words(&[b"LOCK.RELEASE", s, o]), wrongtype.clone()));
    v.push((
        words(&[b"LOCK.RELEASE", s, o, b"TOKEN", b"5"]),
        wrongtype.clone(),
    ));
    v.push((words(&[b"LOCK.RENEW"]), Expect::Arity));
    v.push((words(&[b"LOCK.RENEW", k, o]), Expect::Arity));
    v.push((words(&[b"LOCK.RENEW", k, b"", b"100000"]), empty.clone()));
    for t in &bad_ttls {
        v.push((words(&[b"LOCK.RENEW", k, o, t]), ttl.clone()));
        v.push((
            words(&[b"LOCK.RENEW", k, o, t, b"TOKEN", b"5"]),
            ttl.clone(),
        ));
    }
    v.push((words(&[b"LOCK.RENEW", s, o, b"100000"]), wrongtype.clone()));
    v.push((
        words(&[b"LOCK.RENEW", s, o, b"100000", b"TOKEN", b"5"]),
        wrongtype.clone(),
    ));
    for head in [
        words(&[b"LOCK.RELEASE", k, o]),
        words(&[b"LOCK.RENEW", k, o, b"100000"]),
    ] {
        let with = |tail: &[&[u8]]| [head.clone(), words(tail)].concat();
        v.push((with(&[b"extra"]), syntax.clone()));
        v.push((with(&[b"TOKEN"]), syntax.clone()));
        v.push((with(&[b"WAIT", b"5"]), syntax.clone()));
        v.push((with(&[b"TOKEN", b"5", b"TOKEN", b"5"]), syntax.clone()));
        v.push((with(&[b"token", b"5", b"extra"]), syntax.clone()));
        v.push((with(&[b"TOKEN", b"5", b"TOKEN"]), syntax.clone()));
        for t in &bad_tokens {
            v.push((with(&[b"TOKEN", t]), token.clone()));
            v.push((with(&[b"token", t]), token.clone()));
        }
        // An empty owner is refused before the token is read.
        let mut no_owner = head.clone();
        no_owner[2] = Vec::new();
        no_owner.extend(words(&[b"TOKEN", b"abc"]));
        v.push((no_owner, empty.clone()));
    }
    // LOCK.INFO (arity -2): key [WAITERS].
    v.push((words(&[b"LOCK.INFO"]), Expect::Arity));
    v.push((
        words(&[b"LOCK.INFO", k, k]),
        Expect::Exact(LockError::Syntax.message()),
    ));
    v.push((
        words(&[b"LOCK.INFO", k, b"WAITERS", b"WAITERS"]),
        Expect::Exact(LockError::Syntax.message()),
    ));
    v.push((words(&[b"LOCK.INFO", s]), wrongtype.clone()));
    v
}
