//! `LOCK.SYNC`: applies one effect of the master's replication stream or of
//! the AOF (the wire format is `replication`'s), exactly, whatever the time.

use lock_core::{Holder, Kind, Lock, Mode, Tokens};
use redis_module::{Context, ContextFlags, RedisResult, RedisValue};

use crate::clock;
use crate::config;
use crate::errors::LockError;
use crate::fencing;
use crate::ffi::{self, Argv, DbKey, Str};
use crate::keys::LockKey;
use crate::spec::{command, Access, Arg, ArgKind, Keys, Spec, UPDATE};
use crate::stats;
use crate::store;
use crate::timers;

enum Effect {
    Set(Kind, Holder),
    Drop(Box<[u8]>),
}

/// A decimal number of the state argument: digits only.
fn decimal(s: &[u8]) -> Result<u64, LockError> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return Err(LockError::BadState);
    }
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(LockError::BadState)
}

fn holder(owner: &[u8], holds: u64, token: u64, deadline: u64) -> Result<Holder, LockError> {
    Ok(Holder {
        owner: owner.into(),
        holds: u32::try_from(holds).map_err(|_| LockError::BadState)?,
        // Not in the stream: a new grant counts from its arrival
        // (`Lock::put` keeps it for a changed one).
        since: lock_core::since(clock::now_ms()),
        token,
        deadline,
    })
}

/// As on the RDB path: no token a server cannot have issued (the master's
/// clock may be ahead: a load's bound), refused; in a file (the AOF), a
/// lease past `lock.max-ttl` clamped to it. Logged and counted in a file.
fn within_bounds(holder: &mut Holder, loading: bool) -> Result<(), LockError> {
    let now = clock::now_ms();
    if !Tokens::loadable(holder.token, now) {
        if loading {
            stats::fixed_at_load(&format!(
                "lock: dropped an AOF effect with a token no server can have issued ({})",
                holder.token
            ));
        }
        return Err(LockError::BadState);
    }
    let (latest, limit) = config::deadline_bounds(now);
    if loading && holder.deadline > limit {
        stats::fixed_at_load(&format!(
            "lock: an AOF lease ended past lock.max-ttl ({}): now ending at {latest}",
            holder.deadline
        ));
        holder.deadline = latest;
    }
    Ok(())
}

fn kind(mode: Mode, limit: Option<u64>) -> Result<Kind, LockError> {
    match (mode, limit) {
        (Mode::Semaphore, Some(limit)) => Ok(Kind::Semaphore(
            u32::try_from(limit).map_err(|_| LockError::BadState)?,
        )),
        (Mode::Semaphore, None) | (_, Some(_)) => Err(LockError::Syntax),
        (mode, None) => Ok(mode.into()),
    }
}

/// `mode:holds:token:deadline[:limit]` (`replication::State`).
fn state(owner: &[u8], state: &[u8]) -> Result<Effect, LockError> {
    let mut parts = state.split(|b| *b == b':');
    let mode = parts
        .next()
        .and_then(Mode::from_name)
        .ok_or(LockError::BadState)?;
    let mut next = || parts.next().map(decimal).ok_or(LockError::BadState)?;
    let (holds, token, deadline) = (next()?, next()?, next()?);
    let limit = match mode {
        Mode::Semaphore => Some(next()?),
        _ => None,
    };
    if parts.next().is_some() {
        return Err(LockError::BadState);
    }
    Ok(Effect::Set(
        kind(mode, limit)?,
        holder(owner, holds, token, deadline)?,
    ))
}

fn parse(argv: Argv<'_>) -> Result<(Str<'_>, Effect), LockError> {
    let args: Vec<Str> = (0..argv.len()).filter_map(|i| argv.get(i)).collect();
    let number = |s: &Str| -> Result<u64, LockError> {
        let n = s.parse_integer().ok_or(LockError::BadState)?;
        u64::try_from(n).map_err(|_| LockError::BadState)
    };
    match args.as_slice() {
        [_, key, op, owner] if op.as_slice().eq_ignore_ascii_case(b"DROP") => {
            Ok((*key, Effect::Drop(owner.as_slice().into())))
        }
        [_, key, st, owner] if st.as_slice().contains(&b':') => {
            Ok((*key, state(owner.as_slice(), st.as_slice())?))
        }
        // The form of 0.2 and earlier (older AOF files, older masters).
        [_, key, op, owner, mode, holds, token, deadline, rest @ ..]
            if op.as_slice().eq_ignore_ascii_case(b"SET") =>
        {
            let mode = Mode::from_name(mode.as_slice()).ok_or(LockError::BadState)?;
            let limit = match rest {
                [] => None,
                [limit] => Some(number(limit)?),
                _ => return Err(LockError::Syntax),
            };
            let holder = holder(
                owner.as_slice(),
                number(holds)?,
                number(token)?,
                number(deadline)?,
            )?;
            Ok((*key, Effect::Set(kind(mode, limit)?, holder)))
        }
        _ => Err(LockError::Syntax),
    }
}

/// Internal: applies one replicated effect (replicas and AOF only).
pub const SYNC: Spec = command! {
    name: c"lock.sync",
    handler: sync,
    access: Access::Internal,
    fast: false,
    blocking: false,
    keys: Keys::First(UPDATE),
    arity: -4,
    since: c"0.1.0",
    summary: c"Internal: applies one replicated lock effect (SET owner mode holds token deadline, or DROP owner). Accepted only from the master or the AOF.",
    complexity: c"O(R), R the holders",
    args: &[
        Arg::new(c"key", ArgKind::Key),
        Arg::new(c"effect", ArgKind::String),
    ],
};

/// `LOCK.SYNC`: applies one replicated effect, exactly, whatever the time and
/// whatever this server held before: the master's stream is authoritative, as
/// it is for Redis's own types (a key of another type is replaced, holders
/// that cannot coexist with the one it sets are dropped).
/// (`Access::Internal`: the master's stream and the AOF only.)
fn sync(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let flags = ctx.get_flags();
    let (name, mut effect) = parse(args)?;
    if let Effect::Set(_, holder) = &mut effect {
        within_bounds(holder, flags.contains(ContextFlags::LOADING))?;
    }
    if let Effect::Set(kind, holder) = &effect {
        // Checked before anything is replaced: a bad effect changes nothing.
        Lock::default()
            .put(*kind, holder.clone())
            .map_err(|_| LockError::BadState)?;
        let key = LockKey::open(ctx, name, true)?;
        if matches!(key.lock(), Err(LockError::WrongType)) {
            key.delete();
        }
    }
    let sweep = store::write_back(ctx, name, true, |lock| {
        match effect {
            Effect::Set(kind, holder) => {
                let token = holder.token;
                lock.force(kind, holder).map_err(|_| LockError::BadState)?;
                fencing::observe(token);
                if flags.contains(ContextFlags::REPLICATED) {
                    // A promotion owes a jump past the master's later grants.
                    fencing::received();
                }
            }
            Effect::Drop(owner) => {
                lock.remove(&owner);
            }
        }
        Ok((lock.sweep_at(), true))
    })?
    .flatten();
    if sweep.is_some() || timers::any() {
        let DbKey { db, name: key } = ffi::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, sweep);
    }
    // Our own replicas and AOF get the effect as it came.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
