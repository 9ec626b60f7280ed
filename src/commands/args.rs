//! Argument parsing: every command's syntax, and nothing else.
//!
//! Integers are parsed as Redis parses them (`RedisModule_StringToLongLong`):
//! no `+`, no leading zeros, no spaces, no `-0`, nothing past 64 bits.
//! Option names are case-insensitive. Extra arguments are an error.

use crate::redis::config;
use crate::redis::errors::LockError;
use crate::redis::ffi::{Argv, Str};
use lock_core::lock::MAX_LIMIT;
use lock_core::{Ask, Kind};

/// The longest WAIT, in milliseconds (about 31 years).
pub const MAX_WAIT_MS: i64 = 1_000_000_000_000;

/// `LOCK.ACQUIRE | LOCK.RACQUIRE | LOCK.READ key owner ttl [WAIT ms] [BIND]`
/// (and `LOCK.SEMAPHORE`): borrowed from the command's arguments.
pub struct Grant<'a> {
    pub key: Str<'a>,
    pub ask: Ask<'a>,
    /// `None`: answer at once; `Some(0)`: wait without limit; `Some(ms)`: up to `ms`.
    pub wait: Option<u64>,
    /// `BIND`: the holder also ends when this connection closes.
    pub bind: bool,
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl [WAIT ms] [BIND]`.
pub struct MultiGrant<'a> {
    /// In the order given (tokens are issued in this order), none repeated.
    pub keys: Vec<Str<'a>>,
    /// An exclusive request (`Kind::Acquire`) for each key.
    pub ask: Ask<'a>,
    pub wait: Option<u64>,
    pub bind: bool,
}

/// The most keys one `LOCK.MACQUIRE` takes.
pub const MAX_KEYS: usize = 1000;

/// `LOCK.RELEASE key owner [TOKEN token]`.
pub struct ReleaseArgs<'a> {
    pub key: Str<'a>,
    pub owner: &'a [u8],
    /// `TOKEN`: only the owner's grant carrying this token.
    pub token: Option<u64>,
}

/// `LOCK.RENEW key owner ttl [TOKEN token]`.
pub struct RenewArgs<'a> {
    pub key: Str<'a>,
    pub owner: &'a [u8],
    pub ttl: u64,
    /// `TOKEN`: only the owner's grant carrying this token.
    pub token: Option<u64>,
}

/// `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`.
pub struct GuardArgs<'a> {
    pub key: Str<'a>,
    pub owner: &'a [u8],
    /// `TOKEN`: the holder must hold under this token.
    pub token: Option<u64>,
    /// Where `command` is in the arguments.
    pub call: usize,
}

/// The arguments still to read.
struct Args<'a> {
    argv: Argv<'a>,
    at: usize,
}

impl<'a> Args<'a> {
    /// Skips the command name.
    fn new(argv: Argv<'a>) -> Args<'a> {
        Args { argv, at: 1 }
    }

    fn next_opt(&mut self) -> Option<Str<'a>> {
        let arg = self.argv.get(self.at)?;
        self.at += 1;
        Some(arg)
    }

    fn left(&self) -> usize {
        self.argv.len().saturating_sub(self.at)
    }

    fn next(&mut self) -> Result<Str<'a>, LockError> {
        self.next_opt().ok_or(LockError::Arity)
    }

    fn owner(&mut self) -> Result<&'a [u8], LockError> {
        let owner = self.next()?.as_slice();
        if owner.is_empty() {
            return Err(LockError::EmptyOwner);
        }
        Ok(owner)
    }

    fn ttl(&mut self) -> Result<u64, LockError> {
        let max = config::max_ttl_ms();
        let ttl = self.next()?.parse_integer().ok_or(LockError::BadTtl(max))?;
        if !(1..=max).contains(&ttl) {
            return Err(LockError::BadTtl(max));
        }
        u64::try_from(ttl).map_err(|_| LockError::BadTtl(max))
    }

    fn done(mut self) -> Result<(), LockError> {
        match self.next_opt() {
            None => Ok(()),
            Some(_) => Err(LockError::Arity),
        }
    }
}

/// The grant options: `WAIT ms`, `BIND`, `SESSION id`.
#[derive(Clone, Copy, Default)]
struct Options {
    wait: Option<u64>,
    bind: bool,
    /// 0: none.
    session: u64,
}

/// `WAIT ms`, `BIND` and `SESSION id`, in any order, each at most once
/// (none: nothing more to read, decided in line; the rest out of line).
#[inline(always)]
fn options(args: &mut Args<'_>) -> Result<Options, LockError> {
    match args.left() {
        0 => Ok(Options::default()),
        // `BIND` alone, also in line.
        1 if args
            .argv
            .get(args.at)
            .is_some_and(|o| o.as_slice().eq_ignore_ascii_case(b"BIND")) =>
        {
            args.at += 1;
            Ok(Options {
                bind: true,
                ..Options::default()
            })
        }
        _ => some_options(args),
    }
}

#[inline(never)]
fn some_options(args: &mut Args<'_>) -> Result<Options, LockError> {
    let mut wait = None;
    let mut bind = false;
    let mut session = 0;
    while let Some(option) = args.next_opt() {
        let option = option.as_slice();
        if option.eq_ignore_ascii_case(b"BIND") && !bind {
            bind = true;
            continue;
        }
        if option.eq_ignore_ascii_case(b"SESSION") && session == 0 {
            let id = args.next_opt().ok_or(LockError::Syntax)?;
            session = session_id(id)?;
            continue;
        }
        if !option.eq_ignore_ascii_case(b"WAIT") || wait.is_some() {
            return Err(LockError::Syntax);
        }
        let ms = args.next_opt().ok_or(LockError::Syntax)?;
        let ms = ms.parse_integer().ok_or(LockError::BadWait(MAX_WAIT_MS))?;
        if !(0..=MAX_WAIT_MS).contains(&ms) {
            return Err(LockError::BadWait(MAX_WAIT_MS));
        }
        wait = Some(u64::try_from(ms).map_err(|_| LockError::BadWait(MAX_WAIT_MS))?);
    }
    Ok(Options {
        wait,
        bind,
        session,
    })
}

/// A session id: a positive integer as Redis parses it, at most the
/// highest token, or [`LockError::BadSession`].
fn session_id(arg: Str<'_>) -> Result<u64, LockError> {
    let id = arg.parse_integer().ok_or(LockError::BadSession)?;
    u64::try_from(id)
        .ok()
        .filter(|id| (1..=lock_core::tokens::MAX_TOKEN).contains(id))
        .ok_or(LockError::BadSession)
}

/// A fencing token given with `TOKEN`: a positive integer as Redis parses
/// it, or [`LockError::BadToken`].
fn token_value(arg: Str<'_>) -> Result<u64, LockError> {
    let t = arg.parse_integer().ok_or(LockError::BadToken)?;
    u64::try_from(t)
        .ok()
        .filter(|t| *t > 0)
        .ok_or(LockError::BadToken)
}

/// `[TOKEN token]` and the end of the arguments: none left, decided in
/// line (the plain `LOCK.RELEASE` and `LOCK.RENEW`); the rest out of line.
#[inline(always)]
fn token_option(args: Args<'_>) -> Result<Option<u64>, LockError> {
    match args.left() {
        0 => Ok(None),
        _ => some_token(args),
    }
}

/// `TOKEN token`, once, and nothing after it: an unknown or repeated
/// option, or `TOKEN` without its value, is a syntax error.
#[inline(never)]
fn some_token(mut args: Args<'_>) -> Result<Option<u64>, LockError> {
    let mut token = None;
    while let Some(option) = args.next_opt() {
        if !option.as_slice().eq_ignore_ascii_case(b"TOKEN") || token.is_some() {
            return Err(LockError::Syntax);
        }
        let value = args.next_opt().ok_or(LockError::Syntax)?;
        token = Some(token_value(value)?);
    }
    Ok(token)
}

/// An integer argument from 1 to `max`, or `error`.
fn count(arg: Str<'_>, max: usize, error: LockError) -> Result<usize, LockError> {
    let n = arg.parse_integer().ok_or(error)?;
    usize::try_from(n)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or(error)
}

/// `LOCK.ACQUIRE | LOCK.RACQUIRE | LOCK.READ key owner ttl [WAIT ms] [BIND]
/// [SESSION id]`.
#[inline(always)]
pub fn grant(argv: Argv<'_>, kind: Kind) -> Result<Grant<'_>, LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let owner = args.owner()?;
    let ttl = args.ttl()?;
    let Options {
        wait,
        bind,
        session,
    } = options(&mut args)?;
    Ok(Grant {
        key,
        ask: Ask {
            kind,
            owner,
            ttl,
            session,
        },
        wait,
        bind,
    })
}

/// `LOCK.SEMAPHORE key limit owner ttl [WAIT ms] [BIND]`.
pub fn semaphore(argv: Argv<'_>) -> Result<Grant<'_>, LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let bad = LockError::BadLimit(MAX_LIMIT);
    let limit = count(args.next()?, MAX_LIMIT as usize, bad)?;
    let limit = u32::try_from(limit).map_err(|_| bad)?;
    let owner = args.owner()?;
    let ttl = args.ttl()?;
    let Options {
        wait,
        bind,
        session,
    } = options(&mut args)?;
    Ok(Grant {
        key,
        ask: Ask {
            kind: Kind::Semaphore(limit),
            owner,
            ttl,
            session,
        },
        wait,
        bind,
    })
}

/// Where `LOCK.MACQUIRE`'s keys are in `argv` (the command name first), for
/// a cluster's routing; empty when numkeys is not valid (the command itself
/// then answers the error).
pub fn macquire_key_positions(argv: Argv<'_>) -> std::ops::Range<usize> {
    let Some(numkeys) = argv
        .get(1)
        .and_then(|n| count(n, MAX_KEYS, LockError::Syntax).ok())
    else {
        return 0..0;
    };
    if argv.len() < numkeys.saturating_add(4) {
        return 0..0;
    }
    2..numkeys + 2
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl [WAIT ms] [BIND]`.
pub fn macquire(argv: Argv<'_>) -> Result<MultiGrant<'_>, LockError> {
    let mut args = Args::new(argv);
    let bad = LockError::BadNumkeys(MAX_KEYS);
    let numkeys = count(args.next()?, MAX_KEYS, bad)?;
    // numkeys keys, then at least owner and ttl.
    if args.left() < numkeys.saturating_add(2) {
        return Err(bad);
    }
    let mut keys = Vec::with_capacity(numkeys);
    for _ in 0..numkeys {
        keys.push(args.next()?);
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    if !keys.iter().all(|k| seen.insert(k.as_slice())) {
        return Err(LockError::RepeatedKey);
    }
    let owner = args.owner()?;
    let ttl = args.ttl()?;
    let Options {
        wait,
        bind,
        session,
    } = options(&mut args)?;
    Ok(MultiGrant {
        keys,
        ask: Ask {
            kind: Kind::Acquire,
            owner,
            ttl,
            session,
        },
        wait,
        bind,
    })
}

/// `LOCK.RELEASE key owner [TOKEN token]`.
pub fn release(argv: Argv<'_>) -> Result<ReleaseArgs<'_>, LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let owner = args.owner()?;
    let token = token_option(args)?;
    Ok(ReleaseArgs { key, owner, token })
}

/// `LOCK.RENEW key owner ttl [TOKEN token]`.
pub fn renew(argv: Argv<'_>) -> Result<RenewArgs<'_>, LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let owner = args.owner()?;
    let ttl = args.ttl()?;
    let token = token_option(args)?;
    Ok(RenewArgs {
        key,
        owner,
        ttl,
        token,
    })
}

/// `LOCK.KEEPALIVE ttl`.
pub fn keepalive(argv: Argv<'_>) -> Result<u64, LockError> {
    let mut args = Args::new(argv);
    let ttl = args.ttl()?;
    args.done()?;
    Ok(ttl)
}

/// The arguments of a `LOCK.SESSION` subcommand, after its name.
fn session_args(argv: Argv<'_>) -> Args<'_> {
    Args { argv, at: 2 }
}

/// `LOCK.SESSION OPEN ttl`: the session's ttl.
pub fn session_open(argv: Argv<'_>) -> Result<u64, LockError> {
    let mut args = session_args(argv);
    let ttl = args.ttl()?;
    args.done()?;
    Ok(ttl)
}

/// `LOCK.SESSION KEEPALIVE id ttl`: the id and the new ttl.
pub fn session_keepalive(argv: Argv<'_>) -> Result<(u64, u64), LockError> {
    let mut args = session_args(argv);
    let id = session_id(args.next()?)?;
    let ttl = args.ttl()?;
    args.done()?;
    Ok((id, ttl))
}

/// `LOCK.SESSION CLOSE id` and `LOCK.SESSION INFO id`: the id.
pub fn session_id_only(argv: Argv<'_>) -> Result<u64, LockError> {
    let mut args = session_args(argv);
    let id = session_id(args.next()?)?;
    args.done()?;
    Ok(id)
}

/// `LOCK.SESSIONSYNC id deadline` (internal): a session's absolute
/// deadline, 0 for its end.
pub fn session_sync(argv: Argv<'_>) -> Result<(u64, u64), LockError> {
    let mut args = Args::new(argv);
    let id = session_id(args.next()?)?;
    let deadline = args.next()?.parse_integer().ok_or(LockError::Syntax)?;
    let deadline = u64::try_from(deadline).map_err(|_| LockError::Syntax)?;
    args.done()?;
    Ok((id, deadline))
}

/// `LOCK.LEASESYNC OWN|KEEP a b deadline` (internal): whether a KEEP, and
/// the three numbers.
pub fn lease_sync(argv: Argv<'_>) -> Result<(bool, u64, u64, u64), LockError> {
    let mut args = Args::new(argv);
    let kind = args.next()?;
    let keep = match kind.as_slice() {
        k if k.eq_ignore_ascii_case(b"KEEP") => true,
        k if k.eq_ignore_ascii_case(b"OWN") => false,
        _ => return Err(LockError::Syntax),
    };
    let mut number = || -> Result<u64, LockError> {
        let n = args.next()?.parse_integer().ok_or(LockError::Syntax)?;
        u64::try_from(n).map_err(|_| LockError::Syntax)
    };
    let (a, b, deadline) = (number()?, number()?, number()?);
    args.done()?;
    Ok((keep, a, b, deadline))
}

/// `LOCK.INFO key [WAITERS]`: the key, and whether the waiters are listed.
pub fn info(argv: Argv<'_>) -> Result<(Str<'_>, bool), LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let waiters = match args.next_opt() {
        None => false,
        Some(option) if option.as_slice().eq_ignore_ascii_case(b"WAITERS") => true,
        Some(_) => return Err(LockError::Syntax),
    };
    args.done().map_err(|_| LockError::Syntax)?;
    Ok((key, waiters))
}

/// `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`: what comes
/// after `CALL` is the command's, read by Redis.
pub fn guard(argv: Argv<'_>) -> Result<GuardArgs<'_>, LockError> {
    let mut args = Args::new(argv);
    let key = args.next()?;
    let owner = args.owner()?;
    let mut token = None;
    let mut option = args.next()?.as_slice();
    if option.eq_ignore_ascii_case(b"TOKEN") {
        token = Some(token_value(args.next()?)?);
        option = args.next()?.as_slice();
    }
    if !option.eq_ignore_ascii_case(b"CALL") {
        return Err(LockError::Syntax);
    }
    if args.left() == 0 {
        return Err(LockError::Arity);
    }
    Ok(GuardArgs {
        key,
        owner,
        token,
        call: args.at,
    })
}
