//! Argument parsing: every command's syntax, and nothing else.
//!
//! Integers are parsed as Redis parses them (`RedisModule_StringToLongLong`):
//! no `+`, no leading zeros, no spaces, no `-0`, nothing past 64 bits.
//! Option names are case-insensitive. Extra arguments are an error.

use redis_module::RedisString;

use crate::config;
use crate::errors::LockError;
use lock_core::{Kind, Owner, Request};

/// The longest WAIT, in milliseconds (about 31 years).
pub const MAX_WAIT_MS: i64 = 1_000_000_000_000;

/// `LOCK.ACQUIRE | LOCK.RACQUIRE | LOCK.READ key owner ttl [WAIT ms] [BIND]`.
pub struct Grant {
    pub key: RedisString,
    pub request: Request,
    /// `None`: answer at once; `Some(0)`: wait without limit; `Some(ms)`: up to `ms`.
    pub wait: Option<u64>,
    /// `BIND`: the holder also ends when this connection closes.
    pub bind: bool,
}

/// `LOCK.RELEASE key owner`.
pub struct ReleaseArgs {
    pub key: RedisString,
    pub owner: Owner,
}

/// `LOCK.RENEW key owner ttl`.
pub struct RenewArgs {
    pub key: RedisString,
    pub owner: Owner,
    pub ttl: u64,
}

struct Args(std::vec::IntoIter<RedisString>);

impl Args {
    /// Skips the command name.
    fn new(args: Vec<RedisString>) -> Args {
        let mut it = args.into_iter();
        it.next();
        Args(it)
    }

    fn next(&mut self) -> Result<RedisString, LockError> {
        self.0.next().ok_or(LockError::Arity)
    }

    fn owner(&mut self) -> Result<Owner, LockError> {
        let owner = self.next()?;
        if owner.is_empty() {
            return Err(LockError::EmptyOwner);
        }
        Ok(owner.as_slice().into())
    }

    fn ttl(&mut self) -> Result<u64, LockError> {
        let max = config::max_ttl_ms();
        let ttl = self
            .next()?
            .parse_integer()
            .map_err(|_| LockError::BadTtl(max))?;
        if !(1..=max).contains(&ttl) {
            return Err(LockError::BadTtl(max));
        }
        u64::try_from(ttl).map_err(|_| LockError::BadTtl(max))
    }

    fn done(mut self) -> Result<(), LockError> {
        match self.0.next() {
            None => Ok(()),
            Some(_) => Err(LockError::Arity),
        }
    }
}

pub fn grant(args: Vec<RedisString>, kind: Kind) -> Result<Grant, LockError> {
    let mut args = Args::new(args);
    let key = args.next()?;
    let owner = args.owner()?;
    let ttl = args.ttl()?;
    let mut wait = None;
    let mut bind = false;
    while let Some(option) = args.0.next() {
        let option = option.as_slice();
        if option.eq_ignore_ascii_case(b"BIND") && !bind {
            bind = true;
            continue;
        }
        if !option.eq_ignore_ascii_case(b"WAIT") || wait.is_some() {
            return Err(LockError::Syntax);
        }
        let ms = args.0.next().ok_or(LockError::Syntax)?;
        let ms = ms
            .parse_integer()
            .map_err(|_| LockError::BadWait(MAX_WAIT_MS))?;
        if !(0..=MAX_WAIT_MS).contains(&ms) {
            return Err(LockError::BadWait(MAX_WAIT_MS));
        }
        wait = Some(u64::try_from(ms).map_err(|_| LockError::BadWait(MAX_WAIT_MS))?);
    }
    Ok(Grant {
        key,
        request: Request { kind, owner, ttl },
        wait,
        bind,
    })
}

pub fn release(args: Vec<RedisString>) -> Result<ReleaseArgs, LockError> {
    let mut args = Args::new(args);
    let parsed = ReleaseArgs {
        key: args.next()?,
        owner: args.owner()?,
    };
    args.done()?;
    Ok(parsed)
}

pub fn renew(args: Vec<RedisString>) -> Result<RenewArgs, LockError> {
    let mut args = Args::new(args);
    let parsed = RenewArgs {
        key: args.next()?,
        owner: args.owner()?,
        ttl: args.ttl()?,
    };
    args.done()?;
    Ok(parsed)
}

/// `LOCK.KEEPALIVE ttl`.
pub fn keepalive(args: Vec<RedisString>) -> Result<u64, LockError> {
    let mut args = Args::new(args);
    let ttl = args.ttl()?;
    args.done()?;
    Ok(ttl)
}

pub fn key_only(args: Vec<RedisString>) -> Result<RedisString, LockError> {
    let mut args = Args::new(args);
    let key = args.next()?;
    args.done()?;
    Ok(key)
}
