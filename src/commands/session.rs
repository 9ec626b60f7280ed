//! `LOCK.SESSION OPEN | KEEPALIVE | CLOSE | INFO`: sessions, leases that
//! many holders share (docs/design.md, "Sessions"), and the internal
//! `LOCK.SESSIONSYNC` that applies them on a replica and from the AOF.
//!
//! The container `LOCK.SESSION` is declared by its subcommands' names
//! (`lock.session|open` ...): registration makes the container.

use redis_module::{Context, ContextFlags, RedisResult, RedisValue};

use crate::commands::args;
use crate::redis::config;
use crate::redis::errors::LockError;
use crate::redis::ffi::{self, api, Argv};
use crate::redis::log;
use crate::redis::replication;
use crate::redis::spec::{command, Access, Arg, ArgKind, Keys, Spec};
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::time::clock;
use crate::time::fencing;
use lock_core::Tokens;

const TTL: Arg = Arg::new(c"ttl", ArgKind::Integer);
const ID: Arg = Arg::new(c"id", ArgKind::Integer);

/// The container: its docs; Redis never calls its handler (a call without
/// a subcommand is Redis's own error).
pub const SESSION: Spec = command! {
    name: c"lock.session",
    handler: container,
    access: Access::Write,
    fast: false,
    blocking: false,
    keys: Keys::None,
    arity: -3,
    since: c"0.4.0",
    summary: c"Sessions: leases that many holders share (SESSION id on the grant commands), renewed by one O(1) command from any connection.",
    complexity: c"Depends on subcommand.",
    args: &[],
};

fn container(_ctx: &Context, _args: Argv<'_>) -> RedisResult {
    Err(LockError::Syntax.into())
}

pub const OPEN: Spec = command! {
    name: c"lock.session|open",
    handler: open,
    access: Access::Write,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 3,
    since: c"0.4.0",
    summary: c"Opens a session live for ttl milliseconds; returns its id (drawn like a fencing token: unique on the server, never reused).",
    complexity: c"O(1)",
    args: &[TTL],
};

/// `LOCK.SESSION OPEN ttl`
fn open(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let ttl = args::session_open(args)?;
    let max = config::max_sessions();
    if sessions::count() >= max {
        return Err(LockError::TooManySessions(max).into());
    }
    let now = clock::now_ms();
    let mut tokens = fencing::for_transaction(now);
    let start = tokens;
    let id = tokens.issue().ok_or(LockError::TokensExhausted)?;
    fencing::issued(&start, &tokens);
    let deadline = now.saturating_add(ttl);
    sessions::open(id, deadline);
    replication::replicate_session(ctx, id, deadline);
    timers::sessions_changed();
    Ok(RedisValue::Integer(ffi::int(id)))
}

pub const KEEPALIVE: Spec = command! {
    name: c"lock.session|keepalive",
    handler: keepalive,
    access: Access::Write,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 4,
    since: c"0.4.0",
    summary: c"Sets the session's deadline to ttl milliseconds from now (it may shorten it): 1, or 0 when the session has ended. Renews every holder following it at once.",
    complexity: c"O(1)",
    args: &[ID, TTL],
};

/// `LOCK.SESSION KEEPALIVE id ttl`
fn keepalive(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let (id, ttl) = args::session_keepalive(args)?;
    let now = clock::now_ms();
    let deadline = now.saturating_add(ttl);
    if !sessions::keep_alive(id, deadline, now) {
        return Ok(RedisValue::Integer(0));
    }
    replication::replicate_session(ctx, id, deadline);
    timers::sessions_changed();
    Ok(RedisValue::Integer(1))
}

pub const CLOSE: Spec = command! {
    name: c"lock.session|close",
    handler: close,
    access: Access::Write,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 3,
    since: c"0.4.0",
    summary: c"Ends the session now, and every holder following it with it; returns how many holders ended (0 for an ended or unknown session).",
    complexity: c"O(1) (its holders' keys are cleaned up later, a share per tick)",
    args: &[ID],
};

/// `LOCK.SESSION CLOSE id`: ended here at once (its holders hold nothing
/// from now on, for every command); the timer cleans up their keys.
fn close(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let id = args::session_id_only(args)?;
    let now = clock::now_ms();
    if sessions::live_deadline(id, now).is_none() {
        return Ok(RedisValue::Integer(0));
    }
    let holders = sessions::end(id).unwrap_or(0);
    replication::replicate_session(ctx, id, 0);
    timers::sessions_changed();
    Ok(RedisValue::Integer(ffi::int(holders)))
}

pub const INFO: Spec = command! {
    name: c"lock.session|info",
    handler: info,
    access: Access::Read,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 3,
    since: c"0.4.0",
    summary: c"Describes a session: ttl (ms left) and holders (how many follow it); nil when it ended or is unknown.",
    complexity: c"O(1)",
    args: &[ID],
};

/// `LOCK.SESSION INFO id`: a map in RESP3, a flat array in RESP2.
fn info(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let id = args::session_id_only(args)?;
    let now = clock::now_ms();
    let Some((deadline, holders)) = sessions::info(id, now) else {
        return Ok(RedisValue::Null);
    };
    let c = ctx.ctx;
    let bulk = |s: &[u8]| {
        api!(RedisModule_ReplyWithStringBuffer(
            c,
            s.as_ptr().cast(),
            s.len()
        ))
    };
    api!(RedisModule_ReplyWithMap(c, 2));
    bulk(b"ttl");
    api!(RedisModule_ReplyWithLongLong(
        c,
        ffi::int(deadline.saturating_sub(now))
    ));
    bulk(b"holders");
    api!(RedisModule_ReplyWithLongLong(c, ffi::int(holders)));
    Ok(RedisValue::NoReply)
}

pub const SYNC: Spec = command! {
    name: c"lock.sessionsync",
    handler: sync,
    access: Access::Internal,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 3,
    since: c"0.4.0",
    summary: c"Internal: applies one replicated session state (id and absolute deadline; 0: ended). Accepted only from the master or the AOF.",
    complexity: c"O(1)",
    args: &[ID, Arg::new(c"deadline", ArgKind::Integer)],
};

/// `LOCK.SESSIONSYNC id deadline`: the master's (or the AOF's) session
/// state. A deadline past what a lease may have is clamped at a load, and
/// refused from a master, as a lock's lease is.
fn sync(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let (id, mut deadline) = args::session_sync(args)?;
    let now = clock::now_ms();
    let loading = ctx.get_flags().contains(ContextFlags::LOADING);
    if !Tokens::loadable(id, now) {
        if loading {
            stats::fixed_at_load(&log::AOF_SESSION_DROPPED, &id.to_string());
        }
        return Err(LockError::BadState.into());
    }
    if deadline == 0 {
        sessions::end(id);
    } else {
        let (latest, limit) = config::deadline_bounds(now);
        if deadline > limit {
            if !loading {
                return Err(LockError::BadState.into());
            }
            stats::fixed_at_load(
                &log::AOF_SESSION_CLAMPED,
                &format!("{deadline}, now ending at {latest}"),
            );
            deadline = latest;
        }
        fencing::observe(id);
        if ctx.get_flags().contains(ContextFlags::REPLICATED) {
            fencing::received();
        }
        sessions::open(id, deadline);
    }
    timers::sessions_changed();
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

pub const LEASE_SYNC: Spec = command! {
    name: c"lock.leasesync",
    handler: lease_sync,
    access: Access::Internal,
    fast: true,
    blocking: false,
    keys: Keys::None,
    arity: 5,
    since: c"0.4.0",
    summary: c"Internal: applies one replicated change of a connection lease (OWN token lease deadline: a bound holder's own deadline; KEEP lease now deadline: a LOCK.KEEPALIVE). Accepted only from the master or the AOF.",
    complexity: c"O(1)",
    args: &[
        Arg::new(c"kind", ArgKind::String),
        Arg::new(c"a", ArgKind::Integer),
        Arg::new(c"b", ArgKind::Integer),
        Arg::new(c"deadline", ArgKind::Integer),
    ],
};

/// `LOCK.LEASESYNC OWN token lease deadline` or `LOCK.LEASESYNC KEEP lease
/// now deadline`: the master's (or the AOF's) change of a connection lease
/// (`lock_core::lease`). Ids no server can have issued are refused; a
/// deadline past what a lease may have is clamped at a load, and refused
/// from a master, as a session's is.
fn lease_sync(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let (keep, a, b, mut deadline) = args::lease_sync(args)?;
    let now = clock::now_ms();
    let loading = ctx.get_flags().contains(ContextFlags::LOADING);
    let ids = match keep {
        true => [a, a],
        false => [a, b],
    };
    if ids.iter().any(|id| !Tokens::loadable(*id, now)) {
        if loading {
            stats::fixed_at_load(&log::AOF_SESSION_DROPPED, &format!("a lease's {a} {b}"));
        }
        return Err(LockError::BadState.into());
    }
    let (latest, limit) = config::deadline_bounds(now);
    if deadline > limit {
        if !loading {
            return Err(LockError::BadState.into());
        }
        stats::fixed_at_load(
            &log::AOF_SESSION_CLAMPED,
            &format!("a lease's {deadline}, now ending at {latest}"),
        );
        deadline = latest;
    }
    for id in ids {
        fencing::observe(id);
    }
    if ctx.get_flags().contains(ContextFlags::REPLICATED) {
        fencing::received();
    }
    match keep {
        true => {
            sessions::lease_keepalive(a, b, deadline);
        }
        false => sessions::sync_own(a, b, deadline),
    }
    timers::sessions_changed();
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
