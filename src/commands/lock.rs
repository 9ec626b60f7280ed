//! The lock commands, each declared once (`command!`: name, access, keys,
//! arity and docs) beside its handler: parse, run the core transition,
//! reply. Replication and the key's expiry are `transitions`' job; waiting is
//! `waiting`'s.

use std::os::raw::c_long;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{Context, ContextFlags, RedisResult, RedisValue};

use crate::commands::args;
use crate::redis::errors::{LockError, Unguardable};
use crate::redis::ffi::{self, api, Argv, DbKey};
use crate::redis::replies;
use crate::redis::script_caller;
use crate::redis::spec::{self, command, Access, Arg, ArgKind, Keys, Spec, DELETE, RO, UPDATE};
use crate::state::bindings::{self, ClientId};
use crate::state::deadlocks::{self, Check};
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::transitions;
use crate::state::waiting;
use crate::time::clock;
use crate::time::fencing;
use lock_core::{Attempt, Kind, Lock, Owner, Release};

const KEY: Arg = Arg::new(c"key", ArgKind::Key);
const OWNER: Arg = Arg::new(c"owner", ArgKind::String);
const TTL: Arg = Arg::new(c"ttl", ArgKind::Integer);
const WAIT: Arg = Arg::option(c"ms", ArgKind::Integer, c"WAIT");
const BIND: Arg = Arg::flag(c"bind", c"BIND");
const TOKEN: Arg = Arg::option(c"token", ArgKind::Integer, c"TOKEN");
const SESSION: Arg = Arg::option(c"id", ArgKind::Integer, c"SESSION");
const GRANT_ARGS: &[Arg] = &[KEY, OWNER, TTL, WAIT, BIND, SESSION];

/// `LOCK.ACQUIRE`, `RACQUIRE`, `READ`: what the one-key grants share.
macro_rules! grant_command {
    (name: $name:literal, handler: $handler:path, summary: $summary:literal, complexity: $complexity:literal $(,)?) => {
        command! {
            name: $name,
            handler: $handler,
            access: Access::Grant,
            fast: false,
            blocking: true,
            keys: Keys::First(UPDATE),
            arity: -4,
            since: c"0.1.0",
            summary: $summary,
            complexity: $complexity,
            args: GRANT_ARGS,
        }
    };
}

pub const ACQUIRE: Spec = grant_command! {
    name: c"lock.acquire",
    handler: acquire,
    summary: c"Acquires an exclusive, non-reentrant lock for ttl milliseconds; returns a fencing token, or nil when the lock is held. WAIT blocks up to ms milliseconds (0: no limit); BIND ends the holder when this connection closes.",
    complexity: c"O(1)",
};

/// `LOCK.ACQUIRE key owner ttl [WAIT ms] [BIND]`
fn acquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    grant(ctx, args::grant(args, Kind::Acquire)?)
}

pub const RACQUIRE: Spec = grant_command! {
    name: c"lock.racquire",
    handler: racquire,
    summary: c"Acquires an exclusive, reentrant lock: the holder asking again adds a hold. Returns a fencing token, or nil when the lock is held.",
    complexity: c"O(1)",
};

/// `LOCK.RACQUIRE key owner ttl [WAIT ms] [BIND]`
fn racquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    grant(ctx, args::grant(args, Kind::Racquire)?)
}

pub const READ: Spec = grant_command! {
    name: c"lock.read",
    handler: read,
    summary: c"Acquires the shared (read) side of a read-write lock, reentrant per reader; returns the reader's fencing token, or nil while a writer holds or waits.",
    complexity: c"O(R), R the readers holding the lock",
};

/// `LOCK.READ key owner ttl [WAIT ms] [BIND]`
fn read(ctx: &Context, args: Argv<'_>) -> RedisResult {
    grant(ctx, args::grant(args, Kind::Read)?)
}

pub const SEMAPHORE: Spec = command! {
    name: c"lock.semaphore",
    handler: semaphore,
    access: Access::Grant,
    fast: false,
    blocking: true,
    keys: Keys::First(UPDATE),
    arity: -5,
    since: c"0.2.0",
    summary: c"Takes one of limit permits of a semaphore for ttl milliseconds (one per owner, each with its own lease and token); returns the fencing token, or nil when every permit is held. The grant that creates the key fixes its limit.",
    complexity: c"O(P), P the permits held",
    args: &[
        KEY,
        Arg::new(c"limit", ArgKind::Integer),
        OWNER,
        TTL,
        WAIT,
        BIND,
        SESSION,
    ],
};

/// `LOCK.SEMAPHORE key limit owner ttl [WAIT ms] [BIND]`
fn semaphore(ctx: &Context, args: Argv<'_>) -> RedisResult {
    grant(ctx, args::semaphore(args)?)
}

// Its keys are found from numkeys: by its key spec for COMMAND GETKEYS and
// ACLs, by the command itself (`getkeys-api`) for cluster routing.
pub const MACQUIRE: Spec = command! {
    name: c"lock.macquire",
    handler: macquire,
    access: Access::Grant,
    fast: false,
    blocking: true,
    keys: Keys::Counted(UPDATE, macquire_keys),
    arity: -5,
    since: c"0.2.0",
    summary: c"Acquires exclusive locks on numkeys keys, all or none, atomically; returns their fencing tokens in key order, or nil. With WAIT it waits for all of them at once, holding none meanwhile; a wait that would close a cycle is answered DEADLOCK.",
    complexity: c"O(N), N the keys",
    args: &[
        Arg::new(c"numkeys", ArgKind::Integer),
        KEY.many(),
        OWNER,
        TTL,
        WAIT,
        BIND,
        SESSION,
    ],
};

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl [WAIT ms] [BIND]`: all
/// the keys or none. Every key is decided before any is granted.
fn macquire(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let grant = args::macquire(args)?;
    if grant.wait.is_some() && spec::guarding() {
        return Err(LockError::NotGuardable(Unguardable::Wait).into());
    }
    session_live(grant.ask.session)?;
    let bind = match grant.bind {
        true => Some(bound_connection(ctx)?),
        false => None,
    };
    let ask = grant.ask;
    let free = transitions::check_all(ctx, &grant.keys, ask, |k| waiting::has_waiters(ctx, k))?;
    if free {
        // The connection's lease, which bound holders follow from their
        // grants on, each replicated once with it (drawn now for a
        // connection's first binding, as a single grant's).
        let known = bind.and_then(bindings::lease_of);
        let lease = known
            .or_else(|| bind.and_then(|_| sessions::draw_lease()))
            .unwrap_or(0);
        let tokens = transitions::grant_all(ctx, &grant.keys, ask, lease)?;
        let db = ffi::selected_db(ctx);
        if let Some(client) = bind {
            for (name, token) in grant.keys.iter().zip(&tokens) {
                bindings::bind(
                    client,
                    db,
                    name.as_slice(),
                    ask.owner,
                    *token,
                    ask.kind.mode(),
                );
            }
            if known.is_none() {
                bindings::set_lease(client, lease);
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
            let check = deadlocks::check(ctx, &keys, &request);
            if let Check::Cycle = check {
                return Err(LockError::Deadlock.into());
            }
            let now = clock::now_ms();
            let mut waits = Vec::with_capacity(keys.len());
            for (key, name) in keys.into_iter().zip(&grant.keys) {
                let open = LockKey::open(ctx, *name, false)?;
                let next_expiry = open.lock()?.and_then(|l| {
                    l.live(now)
                        .map(|h| h.deadline)
                        .filter(|d| lock_core::lock::session_of(*d).is_none())
                        .min()
                });
                waits.push((key, next_expiry));
            }
            let session = request.session;
            let id = waiting::block_multi(ctx, waits, request, ms, bind)?;
            if session != 0 {
                sessions::add_waiter(session, id);
            }
            if let Check::Unfinished(search) = check {
                deadlocks::go_on_later(id, search);
            }
            Ok(RedisValue::NoReply)
        }
        _ => {
            stats::REFUSALS.incr();
            Ok(RedisValue::Null)
        }
    }
}

/// Where a `LOCK.MACQUIRE` call's keys are, when a cluster asks.
fn macquire_keys(ctx: &Context, args: Argv<'_>) {
    for pos in args::macquire_key_positions(args) {
        if let Ok(pos) = std::os::raw::c_int::try_from(pos) {
            api!(RedisModule_KeyAtPos(ctx.ctx, pos));
        }
    }
}

/// A grant request: its attempt, then the answer. A grant, bound or not,
/// is answered in line (in each command's own code); the rest, out of
/// line.
#[inline(always)]
fn grant(ctx: &Context, grant: args::Grant<'_>) -> RedisResult {
    if grant.wait.is_some() && spec::guarding() {
        return Err(LockError::NotGuardable(Unguardable::Wait).into());
    }
    if grant.ask.session != 0 {
        session_live(grant.ask.session)?;
    }
    let bind = match grant.bind {
        true => Some(bound_connection(ctx)?),
        false => None,
    };
    let event = replies::event_of(grant.ask.kind);
    // Tokens above this one are issued by this grant: a new grant's.
    let issued = bind.map(|_| fencing::last());
    // The connection's lease, which a bound holder follows (drawn now for
    // a connection's first binding, kept with it once bound).
    let known = bind.and_then(bindings::lease_of);
    let lease = known
        .or_else(|| bind.and_then(|_| sessions::draw_lease()))
        .unwrap_or(0);
    let (attempt, next_expiry) = transitions::grant(ctx, grant.key, grant.ask, event, lease)?;
    match (attempt, bind) {
        (Attempt::Granted(_), None) => replies::answer(attempt),
        (Attempt::Granted(token), Some(client)) => {
            let (db, name) = (ffi::selected_db(ctx), grant.key.as_slice());
            let (owner, mode) = (grant.ask.owner, grant.ask.kind.mode());
            match issued.is_some_and(|last| token > last) {
                true => bindings::bind_new(client, db, name, owner, token, mode),
                // A repeat: its grant may be bound already.
                false => bindings::bind(client, db, name, owner, token, mode),
            }
            if known.is_none() {
                bindings::set_lease(client, lease);
            }
            replies::answer(attempt)
        }
        _ => answer_grant(ctx, &grant, attempt, next_expiry, bind),
    }
}

/// A refused grant: waiting, or its refusal counted (and the other
/// answers that are not a grant).
#[inline(never)]
fn answer_grant(
    ctx: &Context,
    grant: &args::Grant<'_>,
    attempt: Attempt,
    next_expiry: Option<u64>,
    bind: Option<ClientId>,
) -> RedisResult {
    // At the holder limit, a request with WAIT waits its turn like a busy
    // one (v4); only one without WAIT gets the limit's error.
    let waits = attempt.waits() && (attempt == Attempt::Busy || grant.wait.is_some());
    match attempt {
        _ if waits => match grant.wait {
            Some(ms) if waiting::can_block(ctx) => {
                let key = ffi::db_key(ctx, grant.key.as_slice());
                let request = grant.ask.to_request();
                let check = deadlocks::check(ctx, &[key], &request);
                if let Check::Cycle = check {
                    return Err(LockError::Deadlock.into());
                }
                let session = request.session;
                let id = waiting::block(ctx, grant.key, request, ms, next_expiry, bind)?;
                if session != 0 {
                    sessions::add_waiter(session, id);
                }
                if let Check::Unfinished(search) = check {
                    deadlocks::go_on_later(id, search);
                }
                Ok(RedisValue::NoReply)
            }
            _ => {
                stats::REFUSALS.incr();
                Ok(RedisValue::Null)
            }
        },
        other => replies::answer(other),
    }
}

/// `SESSION id` names a live session (or none: 0): else `NOSESSION`,
/// nothing changed.
#[inline(never)]
fn session_live(id: u64) -> Result<(), LockError> {
    if id == 0 || sessions::live_deadline(id, clock::now_ms()).is_some() {
        return Ok(());
    }
    Err(LockError::NoSession)
}

/// The connection a `BIND` binds to: the caller's (inside MULTI/EXEC, the
/// connection running the transaction). A script or a function has no
/// connection of its own to outlive: `BIND` there is an error.
fn bound_connection(ctx: &Context) -> Result<ClientId, LockError> {
    // Inside LOCK.GUARD: the guard's sender (the command's own client is a
    // temporary one).
    if spec::guarding() {
        let caller = spec::guard_caller().ok_or(LockError::BindInScript)?;
        // (The guard's own context: its sender's command.)
        script_caller::learn(spec::guard_context());
        return Ok(caller);
    }
    let id = match api!(RedisModule_GetClientId(ctx.ctx)) {
        Some(id) if id != 0 => id,
        _ => return Err(LockError::BindInScript),
    };
    // A script's commands run as the script's own client, so a connection
    // seen binding outside one never runs inside one: the last such is
    // remembered, and its next BIND skips the context's flags (costly).
    if id != OUTSIDE_SCRIPTS.load(Ordering::Relaxed) {
        if ctx.get_flags().contains(ContextFlags::LUA) {
            return Err(LockError::BindInScript);
        }
        OUTSIDE_SCRIPTS.store(id, Ordering::Relaxed);
        // Before the first binding: where the server keeps the connection
        // a script runs for, learnt from a connection's own command.
        script_caller::learn(ctx.ctx);
    }
    Ok(id)
}

/// The last connection seen binding outside a script ([`bound_connection`]).
static OUTSIDE_SCRIPTS: AtomicU64 = AtomicU64::new(0);

// Not `fast` (v3 contract: `write`), though O(1) now: its holders follow
// the connection's lease (docs/design.md, "Bound locks").
pub const KEEPALIVE: Spec = command! {
    name: c"lock.keepalive",
    handler: keepalive,
    access: Access::Write,
    fast: false,
    blocking: false,
    keys: Keys::None,
    arity: 2,
    since: c"0.2.0",
    summary: c"Renews every holder bound (BIND) to the calling connection to ttl milliseconds from now; returns how many.",
    complexity: c"O(1): the holders bound to the connection follow its lease",
    args: &[TTL],
};

/// `LOCK.KEEPALIVE ttl`: renews every holder bound to the calling
/// connection; the reply is how many. The holders follow the connection's
/// lease (`lock_core::lease`): one change, whatever their number, inside
/// MULTI/EXEC and scripts as outside, replicated as one effect with the
/// absolute deadline.
fn keepalive(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let ttl = args::keepalive(args)?;
    if bindings::count() == 0 {
        return Ok(RedisValue::Integer(0));
    }
    // Inside LOCK.GUARD the command's own client is RedisModule_Call's: the
    // holders renewed are those bound to the guard's sender. Inside a script
    // or a function, those of the connection running it.
    let client = if spec::guarding() {
        spec::guard_caller()
    } else if ctx.get_flags().contains(ContextFlags::LUA) {
        script_caller::caller(ctx.ctx).map_err(|_| LockError::KeepaliveInScript)?
    } else {
        api!(RedisModule_GetClientId(ctx.ctx))
    };
    let Some((client, lease)) = client.and_then(|c| Some((c, bindings::lease_of(c)?))) else {
        return Ok(RedisValue::Integer(0));
    };
    let now = clock::now_ms();
    let deadline = lock_core::lock::lease_end(now, ttl);
    // Its bound holders that follow no lease (those that follow a
    // session, whose session is their renewal) count as renewed, as their
    // RENEW answers 1.
    // (The lease first: it lets go of followers whose key went, and of
    // their bindings.)
    let followers = sessions::lease_count(lease) as usize;
    let others = bindings::live_of(client).saturating_sub(followers);
    let renewed = sessions::lease_keepalive(lease, now, deadline) + others as u64;
    crate::redis::replication::replicate_lease_keep(ctx, lease, now, deadline);
    timers::sessions_changed();
    Ok(RedisValue::Integer(ffi::int(renewed)))
}

pub const RELEASE: Spec = command! {
    name: c"lock.release",
    handler: release,
    access: Access::Write,
    fast: true,
    blocking: false,
    keys: Keys::First(DELETE),
    arity: -3,
    since: c"0.1.0",
    summary: c"Removes one of the owner's holds: 1 when its last hold is gone, 0 when it still holds, nil when it held nothing. With TOKEN, only the owner's grant carrying that fencing token (another grant to the same owner: nil, nothing changed).",
    complexity: c"O(R + G), R the holders, G the waiters granted as a result",
    args: &[KEY, OWNER, TOKEN],
};

/// `LOCK.RELEASE key owner [TOKEN token]`
fn release(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let release = args::release(args)?;
    let outcome = transitions::release(ctx, release.key, release.owner, release.token)?;
    Ok(match outcome {
        Release::Last => RedisValue::Integer(1),
        Release::Remaining => RedisValue::Integer(0),
        Release::NotHeld => {
            stats::RELEASES_NOT_HELD.incr();
            RedisValue::Null
        }
    })
}

pub const RENEW: Spec = command! {
    name: c"lock.renew",
    handler: renew,
    access: Access::Write,
    fast: true,
    blocking: false,
    keys: Keys::First(UPDATE),
    arity: -4,
    since: c"0.1.0",
    summary: c"Sets the owner's lease to ttl milliseconds from now (holds unchanged): 1, or 0 when it holds nothing. With TOKEN, only the owner's grant carrying that fencing token (another grant to the same owner: 0, nothing changed).",
    complexity: c"O(R), R the holders",
    args: &[KEY, OWNER, TTL, TOKEN],
};

/// `LOCK.RENEW key owner ttl [TOKEN token]`
fn renew(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let renew = args::renew(args)?;
    let renewed = transitions::renew(ctx, renew.key, renew.owner, renew.ttl, renew.token)?;
    Ok(RedisValue::Integer(i64::from(renewed)))
}

pub const INFO: Spec = command! {
    name: c"lock.info",
    handler: info,
    access: Access::Read,
    fast: true,
    blocking: false,
    keys: Keys::First(RO),
    arity: -2,
    since: c"0.1.0",
    summary: c"Describes a lock: mode, holders ([owner, holds, ttl-ms-left, token] each) and waiters; with WAITERS, each waiter's owner and ms waited (also on a free key that requests wait for, mode free); nil when free.",
    complexity: c"O(R), R the holders; O(R+W) with WAITERS, W the waiters",
    args: &[KEY, Arg::flag(c"waiters", c"WAITERS").since(c"0.2.0")],
};

/// `LOCK.INFO key [WAITERS]`: read-only, so expired holders are hidden, not
/// removed. `WAITERS` adds `waiting`: each waiting request's owner and how
/// long it has waited, in queue order.
fn info(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let (name, list_waiters) = args::info(args)?;
    let key = LockKey::open(ctx, name, false)?;
    let now = clock::now_ms();
    let stored = key.lock()?;
    // Holders of a closed connection hold nothing (left out, not removed).
    let open = stored
        .as_deref()
        .and_then(|l| bindings::without_closed(ffi::selected_db(ctx), name.as_slice(), l, now));
    // Holders of an ended session hold nothing (left out, not removed).
    let current = open.as_ref().or(stored.as_deref());
    let live = current.and_then(|l| sessions::without_ended(l, now));
    match live.as_ref().or(current) {
        Some(lock) if lock.is_held(now) => {
            let waiting =
                list_waiters.then(|| waiting::waiting_on(&ffi::db_key(ctx, name.as_slice()), now));
            reply_info(ctx, Some(lock), now, waiting::waiters(ctx, name), waiting);
            Ok(RedisValue::NoReply)
        }
        // Nobody holds it, and yet requests wait: multi-key requests that
        // head no other request's way hold a free key for themselves (no
        // later request overtakes them). With WAITERS, the queue is shown
        // (`mode` `free`); without, the reply stays nil (the contract's
        // "nil when free").
        _ if list_waiters && waiting::has_waiters(ctx, name) => {
            let waiting = waiting::waiting_on(&ffi::db_key(ctx, name.as_slice()), now);
            reply_info(ctx, None, now, waiting.len(), Some(waiting));
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
    lock: Option<&Lock>,
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
    let limit = lock.and_then(Lock::limit);
    let fields = 3 + usize::from(limit.is_some()) + usize::from(waiting.is_some());
    api!(RedisModule_ReplyWithMap(c, len(fields)));
    bulk(b"mode");
    bulk(lock.map_or("free", |l| l.mode().name()).as_bytes());
    bulk(b"holders");
    let live: Vec<_> = lock.into_iter().flat_map(|l| l.live(now)).collect();
    api!(RedisModule_ReplyWithArray(c, len(live.len())));
    for h in live {
        api!(RedisModule_ReplyWithArray(c, 4));
        bulk(h.owner);
        api!(RedisModule_ReplyWithLongLong(c, i64::from(h.holds)));
        // A session holder's lease is its session's.
        api!(RedisModule_ReplyWithLongLong(
            c,
            int(sessions::deadline_of(&h).saturating_sub(now))
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
