//! Replication and the AOF: every change is sent as its effect, the exact
//! state of each changed holder with its absolute deadline, through the
//! internal command `LOCK.SYNC` (the wire format is `lock_core::effect`'s,
//! encoder and decoder side by side), so a replica or an AOF replay never
//! recomputes anything from its own clock. Drops go first: a replica never
//! holds two modes at once, even midway. This file sends effects; `apply`
//! applies them.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::{raw, Context};

use crate::redis::ffi::{api, call, Str};
use lock_core::effect::{self, Encoded};
use lock_core::{Changes, HolderRef, Lock};

pub const SYNC_COMMAND: &CStr = c"LOCK.SYNC";

/// Whether this server is a replica: read at load, then set by every role
/// change (`events`), so a command on a master asks the server nothing.
static REPLICA: AtomicBool = AtomicBool::new(false);

pub fn set_replica(replica: bool) {
    REPLICA.store(replica, Ordering::Relaxed);
}

pub fn is_replica() -> bool {
    REPLICA.load(Ordering::Relaxed)
}

/// Whether no effect can reach anyone: this server is a master with no AOF,
/// no replication backlog and no replica, and no fork is under way. Redis
/// drops its own commands' propagation then (`shouldPropagate`), but
/// `RM_Replicate` builds and frees the effect's arguments first (a command
/// look-up and an object per argument: about 3,000 instructions, a fifth of
/// a `LOCK.ACQUIRE`); while this holds, effects are not built at all.
///
/// It starts false, and only [`check_listeners`] makes it true. Everything
/// that can give effects a listener sets it false before the next command
/// runs: a fork (a full sync's snapshot, an AOF rewrite: Redis creates a
/// backlog for a first replica, or turns the AOF on, in the same call that
/// forks, and whatever ran before the fork is in the snapshot), a role
/// change, a load. A fork's end, the end of a load, the event loop's first
/// turn (`events`) and every 65,536th effect built look again.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Effects may have a listener from now on (see [`QUIET`]).
pub fn listeners_may_appear() {
    QUIET.store(false, Ordering::Relaxed);
}

/// Looks whether anything can receive effects now (see [`QUIET`]).
pub fn check_listeners(ctx: &Context) {
    QUIET.store(nobody_listens(ctx), Ordering::Relaxed);
}

fn nobody_listens(ctx: &Context) -> bool {
    let Some(flags) = api!(RedisModule_GetContextFlags(ctx.ctx)) else {
        return false;
    };
    let flags = u32::try_from(flags).unwrap_or(0);
    let master = flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0;
    let busy = raw::REDISMODULE_CTX_FLAGS_AOF
        | raw::REDISMODULE_CTX_FLAGS_ACTIVE_CHILD
        | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if !master || flags & busy != 0 {
        return false;
    }
    let Some(info) =
        api!(RedisModule_GetServerInfo(ctx.ctx, c"replication".as_ptr())).filter(|i| !i.is_null())
    else {
        return false;
    };
    let field = |name: &CStr| {
        let mut err: std::os::raw::c_int = 0;
        let v = api!(RedisModule_ServerInfoGetFieldSigned(
            info,
            name.as_ptr(),
            &mut err
        ));
        v.filter(|_| err == 0)
    };
    let quiet = field(c"repl_backlog_active") == Some(0) && field(c"connected_slaves") == Some(0);
    api!(RedisModule_FreeServerInfo(ctx.ctx, info));
    quiet
}

/// `LOCK.SYNC key state owner`, as `RedisModule_Replicate` and
/// `RedisModule_EmitAOF` format their arguments.
pub const SET_FORMAT: &CStr = c"sbb";
/// `LOCK.SYNC key DROP owner`.
pub const DROP_FORMAT: &CStr = c"scb";

/// With nobody listening there is nothing to send: this counts the change
/// for Redis's save points (`server.dirty`), as `RM_Replicate` would (with
/// nobody listening, `RM_ReplicateVerbatim` only does that), and answers
/// true; false, counting nothing, when the effect must be built and sent.
#[inline]
fn count_if_nobody_listens(ctx: &Context) -> bool {
    let quiet = QUIET.load(Ordering::Relaxed);
    if quiet {
        call!(RedisModule_ReplicateVerbatim(ctx.ctx));
    } else if BUILT.fetch_add(1, Ordering::Relaxed) % LOOK_EVERY == LOOK_EVERY - 1 {
        look_again(ctx);
    }
    quiet
}

/// Effects built since load. Listeners can go without an event (a backlog
/// Redis frees after `repl-backlog-ttl`, an AOF turned off, the last replica
/// gone): while effects are built, every [`LOOK_EVERY`]th looks again
/// whether anything listens. Nothing else looks periodically: a server
/// whose effects nobody needs has them skipped, one that runs no lock
/// command runs nothing.
static BUILT: AtomicU64 = AtomicU64::new(0);
const LOOK_EVERY: u64 = 65_536;

#[cold]
#[inline(never)]
fn look_again(ctx: &Context) {
    check_listeners(ctx);
}

/// A follower's lease and own deadline (`(lease, own)`), by its token:
/// what its effect carries with it (`Encoded::of_follower`).
pub type Follows<'a> = &'a dyn Fn(u64) -> Option<(u64, u64)>;

/// Sends the effect of one transition to replicas and the AOF, straight
/// through `RedisModule_Replicate` (no argument strings are built here).
/// A changed holder that follows a connection lease carries its lease and
/// own deadline in its effect (`follows`).
pub fn replicate(ctx: &Context, key: Str<'_>, lock: &Lock, changes: &Changes, follows: Follows) {
    if count_if_nobody_listens(ctx) {
        return;
    }
    let lease = |h: &HolderRef<'_>| h.is_follower().then(|| follows(h.token)).flatten();
    let mut owners = changes.owners();
    // Most transitions change one holder: one look-up. With several, drops
    // go first.
    if let (Some(owner), None) = (owners.next(), owners.next()) {
        match lock.holder(owner) {
            Some(holder) => replicate_set(ctx, key, lock, &holder, lease(&holder)),
            None => replicate_drop(ctx, key, owner),
        }
        return;
    }
    // Each changed owner found once (a refresh lists every holder: linear
    // time in them, not quadratic).
    let found = lock.look_up_changed(changes);
    for (owner, holder) in &found {
        if holder.is_none() {
            replicate_drop(ctx, key, owner);
        }
    }
    for (_, holder) in &found {
        if let Some(holder) = holder {
            replicate_set(ctx, key, lock, holder, lease(holder));
        }
    }
}

/// Sends `UNLINK key` ahead of a transition's effects, where a grant set
/// the key's expired holders aside whole (`Lock::set_aside_for`): a
/// replica (and the AOF) drops them at once too, with no walk of them in
/// the apply of the new holder's set; the drops of their ends that follow
/// find nothing. With nobody listening, nothing (the transition's own
/// command goes verbatim, as every effect then).
pub fn replicate_unlink(ctx: &Context, key: Str<'_>) {
    if QUIET.load(Ordering::Relaxed) {
        return;
    }
    call!(RedisModule_Replicate(
        ctx.ctx,
        c"UNLINK".as_ptr(),
        c"s".as_ptr(),
        key.raw()
    ));
}

/// Sends the effect of a transition that leaves the lock one holder, the
/// one it changed (a grant that made the lock, `Lock::first`; a renewal of
/// its only holder, `Lock::renew_sole`): that holder's state, with the
/// lease it follows and its own deadline (`(lease, own)`: a bound grant).
#[inline]
pub fn replicate_sole(ctx: &Context, key: Str<'_>, lock: &Lock, follows: Option<(u64, u64)>) {
    if count_if_nobody_listens(ctx) {
        return;
    }
    if let Some(holder) = lock.first_holder() {
        replicate_set(ctx, key, lock, &holder, follows);
    }
}

/// Sends the effect of a transition whose one change is that `owner` no
/// longer holds (`Lock::release_sole`).
pub fn replicate_dropped(ctx: &Context, key: Str<'_>, owner: &[u8]) {
    if count_if_nobody_listens(ctx) {
        return;
    }
    replicate_drop(ctx, key, owner);
}

fn replicate_drop(ctx: &Context, key: Str<'_>, owner: &[u8]) {
    call!(RedisModule_Replicate(
        ctx.ctx,
        SYNC_COMMAND.as_ptr(),
        DROP_FORMAT.as_ptr(),
        key.raw(),
        effect::DROP.as_ptr(),
        owner.as_ptr(),
        owner.len()
    ));
}

fn replicate_set(
    ctx: &Context,
    key: Str<'_>,
    lock: &Lock,
    holder: &HolderRef<'_>,
    follows: Option<(u64, u64)>,
) {
    let state = match follows {
        None => Encoded::of(lock, holder),
        Some((lease, own)) => Encoded::of_follower(lock, holder, own, lease),
    };
    let state = state.as_bytes();
    call!(RedisModule_Replicate(
        ctx.ctx,
        SYNC_COMMAND.as_ptr(),
        SET_FORMAT.as_ptr(),
        key.raw(),
        state.as_ptr(),
        state.len(),
        holder.owner.as_ptr(),
        holder.owner.len()
    ));
}

/// Sends a lock key's Redis expiry, set again after something outside the
/// module re-timed or moved the key (`PERSIST`, `PEXPIRE`, `RENAME`,
/// `MOVE`, `RESTORE`: a refresh visit): `PEXPIREAT key deadline`, absolute
/// as every effect, or `PERSIST key` for a key whose latest holder follows
/// a session or its connection's lease (`expiry` `None`). The holders
/// themselves did not change: the replica has them as the master does.
pub fn replicate_expiry(ctx: &Context, key: Str<'_>, expiry: Option<u64>) {
    if count_if_nobody_listens(ctx) {
        return;
    }
    match expiry {
        Some(at) => call!(RedisModule_Replicate(
            ctx.ctx,
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            key.raw(),
            std::os::raw::c_longlong::try_from(at).unwrap_or(std::os::raw::c_longlong::MAX)
        )),
        None => call!(RedisModule_Replicate(
            ctx.ctx,
            c"PERSIST".as_ptr(),
            c"s".as_ptr(),
            key.raw()
        )),
    };
}

/// The internal command that applies a session's state on a replica or
/// from the AOF: `LOCK.SESSIONSYNC id deadline-unix-ms` (0: it ended).
pub const SESSION_SYNC_COMMAND: &CStr = c"LOCK.SESSIONSYNC";

/// Replicates session `id`'s absolute deadline (open, keepalive), or its
/// end (`deadline` 0: closed, or its deadline passed).
pub fn replicate_session(ctx: &Context, id: u64, deadline: u64) {
    let n = |v: u64| std::os::raw::c_longlong::try_from(v).unwrap_or(0);
    call!(RedisModule_Replicate(
        ctx.ctx,
        SESSION_SYNC_COMMAND.as_ptr(),
        c"ll".as_ptr(),
        n(id),
        n(deadline)
    ));
}

/// The internal command that applies a connection lease's change on a
/// replica or from the AOF (`lock_core::lease`): `LOCK.LEASESYNC OWN token
/// lease deadline` (the holder of grant `token` follows `lease`, its own
/// deadline absolute), or `LOCK.LEASESYNC KEEP lease now deadline` (a
/// KEEPALIVE at `now`: every follower alive then lives until `deadline`).
pub const LEASE_SYNC_COMMAND: &CStr = c"LOCK.LEASESYNC";

fn replicate_lease(ctx: &Context, kind: &CStr, a: u64, b: u64, c: u64) {
    if count_if_nobody_listens(ctx) {
        return;
    }
    let n = |v: u64| std::os::raw::c_longlong::try_from(v).unwrap_or(0);
    call!(RedisModule_Replicate(
        ctx.ctx,
        LEASE_SYNC_COMMAND.as_ptr(),
        c"clll".as_ptr(),
        kind.as_ptr(),
        n(a),
        n(b),
        n(c)
    ));
}

/// Replicates a follower's own deadline and lease (a RENEW of it, or its
/// move to another connection's lease: changes of no holder's entry; a
/// change of its entry carries them itself, `Encoded::of_follower`).
pub fn replicate_lease_own(ctx: &Context, token: u64, lease: u64, deadline: u64) {
    replicate_lease(ctx, c"OWN", token, lease, deadline);
}

/// Replicates a lease's KEEPALIVE at `now`.
pub fn replicate_lease_keep(ctx: &Context, lease: u64, now: u64, deadline: u64) {
    replicate_lease(ctx, c"KEEP", lease, now, deadline);
}
