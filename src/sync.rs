//! `LOCK.SYNC`: applies one effect of the master's replication stream or of
//! the AOF (the wire format is `replication`'s), exactly, whatever the time.

use lock_core::{Holder, Kind, Lock, Mode, Tokens};
use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue};

use crate::clock;
use crate::errors::LockError;
use crate::fencing;
use crate::ffi;
use crate::keys::LockKey;
use crate::store;
use crate::timers;

enum Effect {
    Set(Kind, Holder),
    Drop(Box<[u8]>),
}

fn parse(args: &[RedisString]) -> Result<(&RedisString, Effect), LockError> {
    let number = |s: &RedisString| -> Result<u64, LockError> {
        let n = s.parse_integer().map_err(|_| LockError::BadState)?;
        u64::try_from(n).map_err(|_| LockError::BadState)
    };
    match args {
        [_, key, op, owner] if op.as_slice().eq_ignore_ascii_case(b"DROP") => {
            Ok((key, Effect::Drop(owner.as_slice().into())))
        }
        [_, key, op, owner, mode, holds, token, deadline, rest @ ..]
            if op.as_slice().eq_ignore_ascii_case(b"SET") =>
        {
            let mode = Mode::from_name(mode.as_slice()).ok_or(LockError::BadState)?;
            let kind = match (mode, rest) {
                (Mode::Semaphore, [limit]) => {
                    Kind::Semaphore(u32::try_from(number(limit)?).map_err(|_| LockError::BadState)?)
                }
                (Mode::Semaphore, _) | (_, [_, ..]) => return Err(LockError::Syntax),
                (mode, []) => mode.into(),
            };
            let holder = Holder {
                owner: owner.as_slice().into(),
                holds: u32::try_from(number(holds)?).map_err(|_| LockError::BadState)?,
                // Not in the stream: a new grant counts from its arrival
                // (`Lock::put` keeps it for a changed one).
                since: lock_core::since(clock::now_ms()),
                token: number(token)?,
                deadline: number(deadline)?,
            };
            // As on the RDB path: no token a server cannot have issued.
            if !Tokens::plausible(holder.token, clock::now_ms()) {
                return Err(LockError::BadState);
            }
            Ok((key, Effect::Set(kind, holder)))
        }
        _ => Err(LockError::Syntax),
    }
}

/// `LOCK.SYNC`: applies one replicated effect, exactly, whatever the time and
/// whatever this server held before: the master's stream is authoritative, as
/// it is for Redis's own types (a key of another type is replaced, holders
/// that cannot coexist with the one it sets are dropped).
pub fn sync(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(LockError::InternalCommand.into());
    }
    let (name, effect) = parse(&args)?;
    if let Effect::Set(kind, holder) = &effect {
        // Checked before anything is replaced: a bad effect changes nothing.
        Lock::default()
            .put(*kind, holder.clone())
            .map_err(|_| LockError::BadState)?;
        let mut key = LockKey::open(ctx, name, true)?;
        if matches!(key.lock(), Err(LockError::WrongType)) {
            key.delete();
        }
    }
    let sweep = store::write_back(ctx, name, |lock| {
        match effect {
            Effect::Set(kind, holder) => {
                let token = holder.token;
                lock.force(kind, holder).map_err(|_| LockError::BadState)?;
                fencing::observe(token);
            }
            Effect::Drop(owner) => {
                lock.remove(&owner);
            }
        }
        Ok((lock.sweep_at(), true))
    })?;
    if sweep.is_some() || timers::any() {
        let (db, key) = ffi::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, sweep);
    }
    // Our own replicas and AOF get the effect as it came.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
