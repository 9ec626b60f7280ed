//! Command handlers: parse, run the core transition, reply. Replication and
//! the key's expiry are `store::update`'s job; waiting is `waiting`'s.

use std::os::raw::c_long;

use redis_module::{Context, ContextFlags, RedisResult, RedisValue};

use crate::args;
use crate::bindings::{self, ClientId};
use crate::clock;
use crate::deadlocks;
use crate::errors::LockError;
use crate::ffi::{self, api, Argv, DbKey};
use crate::keys::LockKey;
use crate::replication;
use crate::replies;
use crate::stats;
use crate::store;
use crate::timers::{self, Keepalive};
use crate::waiting;
use lock_core::{Attempt, Kind, Lock, Owner, Release};

/// `LOCK.ACQUIRE key owner ttl [WAIT ms] [BIND]`
pub fn acquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    grant(ctx, args::grant(args, Kind::Acquire)?)
}

/// `LOCK.RACQUIRE key owner ttl [WAIT ms] [BIND]`
pub fn racquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    grant(ctx, args::grant(args, Kind::Racquire)?)
}

/// `LOCK.READ key owner ttl [WAIT ms] [BIND]`
pub fn read(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    grant(ctx, args::grant(args, Kind::Read)?)
}

/// `LOCK.SEMAPHORE key limit owner ttl [WAIT ms] [BIND]`
pub fn semaphore(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    grant(ctx, args::semaphore(args)?)
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl [WAIT ms] [BIND]`: all
/// the keys or none. Every key is decided before any is granted.
pub fn macquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    // A cluster asks where the keys are (`getkeys-api`): Redis routes
    // module commands by this, not by the key spec.
    if api!(RedisModule_IsKeysPositionRequest(ctx.ctx)).unwrap_or(0) != 0 {
        for pos in args::macquire_key_positions(args) {
            if let Ok(pos) = std::os::raw::c_int::try_from(pos) {
                api!(RedisModule_KeyAtPos(ctx.ctx, pos));
            }
        }
        return Ok(RedisValue::NoReply);
    }
    master_only(ctx)?;
    let grant = args::macquire(args)?;
    let bind = match grant.bind {
        true => Some(bound_connection(ctx)?),
        false => None,
    };
    let ask = grant.ask;
    let free = store::check_all(ctx, &grant.keys, ask, |k| waiting::has_waiters(ctx, k))?;
    if free {
        let tokens = store::grant_all(ctx, &grant.keys, ask)?;
        let db = ffi::selected_db(ctx);
        if let Some(client) = bind {
            for (name, token) in grant.keys.iter().zip(&tokens) {
                bindings::bind(
                    client,
                    (db, name.as_slice().to_vec()),
                    ask.owner,
                    *token,
                    ask.kind.mode(),
                );
            }
        }
        let tokens = tokens.into_iter().map(|t| RedisValue::Integer(ffi::int(t)));
        return Ok(RedisValue::Array(tokens.collect()));
    }
    match grant.wait {
        Some(ms) if waiting::can_block(ctx) => {
            let keys: Vec<DbKey> = grant
                .keys
                .iter()
                .map(|k| ffi::db_key(ctx, k.as_slice()))
                .collect();
            let request = ask.to_request();
            if deadlocks::would_deadlock(ctx, &keys, &request) {
                return Err(LockError::Deadlock.into());
            }
            let now = clock::now_ms();
            let mut waits = Vec::with_capacity(keys.len());
            for (key, name) in keys.into_iter().zip(&grant.keys) {
                let open = LockKey::open(ctx, *name, false)?;
                let next_expiry = open
                    .lock()?
                    .and_then(|l| l.live(now).map(|h| h.deadline).min());
                waits.push((key, next_expiry));
            }
            waiting::block_multi(ctx, waits, request, ms, bind)
        }
        _ => {
            stats::REFUSALS.incr();
            Ok(RedisValue::Null)
        }
    }
}

/// A replica never writes a lock itself, even with `replica-read-only no`:
/// its tokens would repeat the master's and its state would diverge. Only the
/// master's stream (`LOCK.SYNC`) writes there.
fn master_only(ctx: &Context) -> Result<(), LockError> {
    if !replication::is_replica() {
        return Ok(());
    }
    let flags = ctx.get_flags();
    let from_master = flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING);
    if flags.contains(ContextFlags::SLAVE) && !from_master {
        return Err(LockError::Replica);
    }
    Ok(())
}

/// A grant request: its attempt, then the answer. The common one, granted
/// without `BIND`, is answered in line (in each command's own code); the
/// rest, out of line.
#[inline(always)]
fn grant(ctx: &Context, grant: args::Grant<'_>) -> RedisResult {
    let bind = match grant.bind {
        true => Some(bound_connection(ctx)?),
        false => None,
    };
    let event = replies::event_of(grant.ask.kind);
    let (attempt, next_expiry) = store::grant(ctx, grant.key, grant.ask, event)?;
    match (attempt, bind) {
        (Attempt::Granted(_), None) => replies::answer(attempt),
        _ => answer_grant(ctx, &grant, attempt, next_expiry, bind),
    }
}

/// A refused grant (waiting, or its refusal counted) or one bound to its
/// connection.
#[inline(never)]
fn answer_grant(
    ctx: &Context,
    grant: &args::Grant<'_>,
    attempt: Attempt,
    next_expiry: Option<u64>,
    bind: Option<ClientId>,
) -> RedisResult {
    match attempt {
        Attempt::Busy => match grant.wait {
            Some(ms) if waiting::can_block(ctx) => {
                let key = ffi::db_key(ctx, grant.key.as_slice());
                let request = grant.ask.to_request();
                if deadlocks::would_deadlock(ctx, &[key], &request) {
                    return Err(LockError::Deadlock.into());
                }
                waiting::block(ctx, grant.key, request, ms, next_expiry, bind)
            }
            _ => {
                stats::REFUSALS.incr();
                Ok(RedisValue::Null)
            }
        },
        Attempt::Granted(token) => {
            if let Some(client) = bind {
                let key = ffi::db_key(ctx, grant.key.as_slice());
                bindings::bind(client, key, grant.ask.owner, token, grant.ask.kind.mode());
            }
            replies::answer(attempt)
        }
        other => replies::answer(other),
    }
}

/// The connection a `BIND` binds to: the caller's (inside MULTI/EXEC, the
/// connection running the transaction). A script or a function has no
/// connection of its own to outlive: `BIND` there is an error.
fn bound_connection(ctx: &Context) -> Result<ClientId, LockError> {
    if ctx.get_flags().contains(ContextFlags::LUA) {
        return Err(LockError::BindInScript);
    }
    match api!(RedisModule_GetClientId(ctx.ctx)) {
        Some(id) if id != 0 => Ok(id),
        _ => Err(LockError::BindInScript),
    }
}

/// `LOCK.KEEPALIVE ttl`: renews every holder bound to the calling
/// connection; the reply is how many. Past one share of work (a connection
/// with thousands of bound holders), the caller waits while the rest is
/// done a share per tick, so the server never stalls for long
/// (`store::keepalive_share`); inside MULTI/EXEC or a script, all at once.
pub fn keepalive(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    let ttl = args::keepalive(args)?;
    let Some(client) = api!(RedisModule_GetClientId(ctx.ctx)) else {
        return Ok(RedisValue::Integer(0));
    };
    let mut job = Keepalive {
        client,
        ttl,
        after: None,
        renewed: 0,
        caller: 0,
    };
    let can_wait = waiting::can_block(ctx);
    let budget = can_wait.then_some(store::KEEPALIVE_SHARE);
    if store::keepalive_share(ctx, &mut job, budget) {
        return Ok(RedisValue::Integer(job.renewed));
    }
    job.caller = waiting::block_for_count(ctx)?;
    timers::keepalive_later(job);
    Ok(RedisValue::NoReply)
}

/// `LOCK.RELEASE key owner`
pub fn release(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    let release = args::release(args)?;
    let outcome = store::release(ctx, release.key, release.owner)?;
    Ok(match outcome {
        Release::Last => RedisValue::Integer(1),
        Release::Remaining => RedisValue::Integer(0),
        Release::NotHeld => {
            stats::RELEASES_NOT_HELD.incr();
            RedisValue::Null
        }
    })
}

/// `LOCK.RENEW key owner ttl`
pub fn renew(ctx: &Context, args: Argv<'_>) -> RedisResult {
    master_only(ctx)?;
    let renew = args::renew(args)?;
    let renewed = store::renew(ctx, renew.key, renew.owner, renew.ttl)?;
    Ok(RedisValue::Integer(i64::from(renewed)))
}

/// `LOCK.INFO key [WAITERS]`: read-only, so expired holders are hidden, not
/// removed. `WAITERS` adds `waiting`: each waiting request's owner and how
/// long it has waited, in queue order.
pub fn info(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let (name, list_waiters) = args::info(args)?;
    let key = LockKey::open(ctx, name, false)?;
    let now = clock::now_ms();
    let stored = key.lock()?;
    // Holders of a closed connection hold nothing (left out, not removed).
    let open = stored
        .as_deref()
        .and_then(|l| bindings::without_closed(&ffi::db_key(ctx, name.as_slice()), l, now));
    match open.as_ref().or(stored.as_deref()) {
        Some(lock) if lock.is_held(now) => {
            let waiting =
                list_waiters.then(|| waiting::waiting_on(&ffi::db_key(ctx, name.as_slice()), now));
            reply_info(ctx, lock, now, waiting::waiters(ctx, name), waiting);
            Ok(RedisValue::NoReply)
        }
        _ => Ok(RedisValue::Null),
    }
}

/// `mode`, `holders` (`[owner, holds, ttl-ms-left, token]` each), `waiters`,
/// and for a semaphore `limit`: a map in RESP3, a flat array in RESP2, in
/// that order.
fn reply_info(
    ctx: &Context,
    lock: &Lock,
    now: u64,
    waiters: usize,
    waiting: Option<Vec<(Owner, u64)>>,
) {
    let c = ctx.ctx;
    let int = |n: u64| ffi::int(n);
    let bulk = |s: &[u8]| {
        api!(RedisModule_ReplyWithStringBuffer(
            c,
            s.as_ptr().cast(),
            s.len()
        ))
    };
    let len = |n: usize| c_long::try_from(n).unwrap_or(c_long::MAX);
    let limit = lock.limit();
    let fields = 3 + usize::from(limit.is_some()) + usize::from(waiting.is_some());
    api!(RedisModule_ReplyWithMap(c, len(fields)));
    bulk(b"mode");
    bulk(lock.mode().name().as_bytes());
    bulk(b"holders");
    let live: Vec<_> = lock.live(now).collect();
    api!(RedisModule_ReplyWithArray(c, len(live.len())));
    for h in live {
        api!(RedisModule_ReplyWithArray(c, 4));
        bulk(h.owner);
        api!(RedisModule_ReplyWithLongLong(c, i64::from(h.holds)));
        api!(RedisModule_ReplyWithLongLong(
            c,
            int(h.deadline.saturating_sub(now))
        ));
        api!(RedisModule_ReplyWithLongLong(c, int(h.token)));
    }
    bulk(b"waiters");
    api!(RedisModule_ReplyWithLongLong(c, int(waiters as u64)));
    if let Some(limit) = limit {
        bulk(b"limit");
        api!(RedisModule_ReplyWithLongLong(c, i64::from(limit)));
    }
    if let Some(waiting) = waiting {
        bulk(b"waiting");
        api!(RedisModule_ReplyWithArray(c, len(waiting.len())));
        for (owner, waited) in waiting {
            api!(RedisModule_ReplyWithArray(c, 2));
            bulk(&owner);
            api!(RedisModule_ReplyWithLongLong(c, int(waited)));
        }
    }
}
