//! Waiting inside the server: `WAIT ms` on LOCK.ACQUIRE, LOCK.RACQUIRE and
//! LOCK.READ.
//!
//! A request that cannot be granted blocks its client (`RM_BlockClient`, with
//! reply, timeout, free and disconnect callbacks) and joins its key's FIFO
//! queue (`core::Queue`). Whenever a key with waiters changes (`store::update`
//! calls [`settle`]), the core grants from the head, and each answered waiter
//! is unblocked with its outcome; its grant is replicated with the
//! transition that caused it. Locks freed by other means (expiry, DEL, FLUSH,
//! RENAME ...) reach [`settle`] through the timer (`timers`, `events`).
//!
//! One place decides whether a client still waits: this registry. A waiter
//! leaves it exactly once: granted (then Redis will not time it out), timed
//! out or disconnected (then it is no longer in any queue, so it is never
//! granted). A grant whose client vanished before its reply is revoked.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::{raw, Context, ContextFlags, RedisResult, RedisString, RedisValue};

use crate::bindings::{self, ClientId};
use crate::config;
use crate::errors::LockError;
use crate::ffi::DbKey;
use crate::ffi::{self, api};
use crate::guard;
use crate::replies;
use crate::stats;
use crate::timers;
use crate::txn::Txn;
use lock_core::{Attempt, Kind, Owner, Queue, Request};

/// A blocked client's handle, unique while it is blocked.
type WaiterId = usize;

struct Blocked {
    handle: *mut raw::RedisModuleBlockedClient,
    key: DbKey,
    owner: Owner,
    kind: Kind,
    /// When its WAIT runs out (unix ms); `None` for `WAIT 0`.
    deadline: Option<u64>,
    /// `BIND`: the connection its grant is bound to.
    bind: Option<ClientId>,
}

/// A grant to end at the key's next visit, all its holds at once: its
/// client disconnected before hearing of it, or it was bound to a connection
/// that closed. Matched by token, so a later grant to the same owner stays.
struct Revocation {
    owner: Owner,
    token: u64,
    /// Its bound connection closed (counted in `INFO lock`).
    disconnect: bool,
}

/// What an unblocked waiter is told (the blocked client's private data).
struct Decision {
    outcome: Result<Attempt, LockError>,
    key: DbKey,
    owner: Owner,
    replied: bool,
}

#[derive(Default)]
struct Registry {
    queues: HashMap<DbKey, Queue<WaiterId>>,
    waiters: HashMap<WaiterId, Blocked>,
    revocations: HashMap<DbKey, Vec<Revocation>>,
}

// SAFETY: blocked-client handles are only used on Redis's main thread; the
// mutex only makes the static well-formed.
unsafe impl Send for Registry {}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether any request waits anywhere (cheap: for callbacks on every write).
pub fn anyone_waits() -> bool {
    !registry().queues.is_empty()
}

/// How many requests wait, on every key; `None` rather than wait for the
/// registry (INFO during a crash report).
pub fn total() -> Option<usize> {
    REGISTRY.try_lock().ok().map(|r| r.waiters.len())
}

/// How many requests wait for `key` in the current database.
pub fn waiters(ctx: &Context, key: &RedisString) -> usize {
    let registry = registry();
    if registry.queues.is_empty() {
        return 0;
    }
    registry
        .queues
        .get(&ffi::db_key(ctx, key.as_slice()))
        .map_or(0, Queue::len)
}

pub fn has_waiters(ctx: &Context, key: &RedisString) -> bool {
    waiters(ctx, key) > 0
}

/// Inside MULTI/EXEC, a script or a function, on a replica's stream or while
/// loading, a client cannot block: WAIT becomes an immediate try.
pub fn can_block(ctx: &Context) -> bool {
    !ctx.get_flags().intersects(
        ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::DENY_BLOCKING
            | ContextFlags::REPLICATED
            | ContextFlags::LOADING,
    )
}

/// Blocks the calling client until its request is granted, `ms` pass (0: no
/// limit), or it disconnects. `next_expiry` is the lock's earliest deadline:
/// the key is visited then, or at the WAIT deadline if that comes first.
///
/// The WAIT deadline is the module's, not Redis's block timeout: Redis checks
/// block timeouts only when its event loop wakes, and a grant made between
/// the deadline and that check would be swallowed (Redis skips the reply of a
/// client it times out after it was unblocked). Here the key's visit at the
/// deadline answers nil through the same unblock-and-reply path as a grant,
/// so every waiter gets exactly one reply.
pub fn block(
    ctx: &Context,
    key: RedisString,
    request: Request,
    ms: u64,
    next_expiry: Option<u64>,
    bind: Option<ClientId>,
) -> RedisResult {
    let key = ffi::db_key(ctx, key.as_slice());
    if registry().queues.get(&key).map_or(0, Queue::len) >= config::max_waiters() {
        return Err(LockError::TooManyWaiters(config::MAX_WAITERS.get()).into());
    }
    let now = crate::clock::now_ms();
    let deadline = (ms > 0).then(|| now.saturating_add(ms));
    // No timeout callback: Redis's block timeout is not used (see above),
    // and with one, a `CLIENT UNBLOCK id TIMEOUT` arriving after the module
    // unblocked the client with a grant, but before Redis handled that
    // unblock, made Redis drop the reply: the client never got one. Without
    // it, `CLIENT UNBLOCK` leaves lock waiters alone (it answers 0).
    let handle = api!(RedisModule_BlockClient(
        ctx.ctx,
        Some(on_reply),
        None,
        Some(free_decision),
        0
    ))
    .filter(|h| !h.is_null())
    .ok_or(LockError::Internal)?;
    api!(RedisModule_SetDisconnectCallback(
        handle,
        Some(on_disconnect)
    ));
    stats::WAITS.incr();
    let id = handle as WaiterId;
    let owner = request.owner.clone();
    let kind = request.kind;
    {
        let mut registry = registry();
        registry
            .queues
            .entry(key.clone())
            .or_default()
            .push(id, request);
        registry.waiters.insert(
            id,
            Blocked {
                handle,
                key: key.clone(),
                owner,
                kind,
                deadline,
                bind,
            },
        );
    }
    let visit = match (next_expiry, deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    timers::schedule_earlier(key.0, &key.1, visit);
    Ok(RedisValue::NoReply)
}

/// What a key's queue needs after [`settle`].
pub struct Pending {
    /// Requests still wait: visit the key at the lock's next expiry.
    pub waiting: bool,
    /// The earliest WAIT deadline among them: visit the key then too.
    pub next_timeout: Option<u64>,
}

/// Settles a key that just changed (called by `store::update` inside the
/// transition, so grants replicate with it): undoes grants whose clients
/// vanished, answers nil to waiters whose WAIT ran out, then grants from the
/// head of the queue.
pub fn answer_waiters(ctx: &Context, name: &RedisString, txn: &mut Txn) -> Pending {
    let none = Pending {
        waiting: false,
        next_timeout: None,
    };
    let mut registry = registry();
    if registry.queues.is_empty() && registry.revocations.is_empty() {
        return none;
    }
    let key = &ffi::db_key(ctx, name.as_slice());
    if let Some(revoked) = registry.revocations.remove(key) {
        for r in revoked {
            if txn
                .lock
                .release_all(&r.owner, r.token, txn.now, txn.changes)
            {
                txn.events.push(c"lock.release");
                if r.disconnect {
                    stats::RELEASES_ON_DISCONNECT.incr();
                }
            }
        }
    }
    let Registry {
        queues, waiters, ..
    } = &mut *registry;
    let Some(queue) = queues.get_mut(key) else {
        return none;
    };
    let timed_out: Vec<WaiterId> = queue
        .iter()
        .map(|w| w.id)
        .filter(|id| {
            waiters
                .get(id)
                .and_then(|w| w.deadline)
                .is_some_and(|d| d <= txn.now)
        })
        .collect();
    for id in timed_out {
        queue.remove(id);
        if let Some(waiter) = waiters.remove(&id) {
            stats::WAIT_TIMEOUTS.incr();
            unblock(waiter, Ok(Attempt::Busy));
        }
    }
    let before = txn.tokens.last();
    let answered = queue.settle(txn.lock, txn.now, txn.tokens, txn.changes);
    stats::GRANTS.add(usize::try_from(txn.tokens.last() - before).unwrap_or(0));
    for (id, attempt) in answered {
        if let Some(waiter) = waiters.remove(&id) {
            if let Attempt::Granted(token) = attempt {
                stats::GRANTS_AFTER_WAIT.incr();
                txn.events.push(replies::event_of(waiter.kind));
                if let Some(client) = waiter.bind {
                    bindings::bind(client, key.clone(), &waiter.owner, token);
                }
            }
            unblock(waiter, Ok(attempt));
        }
    }
    let next_timeout = queue
        .iter()
        .filter_map(|w| waiters.get(&w.id).and_then(|w| w.deadline))
        .min();
    let waiting = !queue.is_empty();
    if !waiting {
        queues.remove(key);
    }
    Pending {
        waiting,
        next_timeout,
    }
}

/// Ends the grant `token` of `owner` on `key` at the key's next visit (now).
pub fn revoke(key: DbKey, owner: Owner, token: u64, disconnect: bool) {
    let at = Some(crate::clock::now_ms());
    timers::schedule(key.0, &key.1, at);
    add_revocation(key, owner, token, disconnect);
}

/// Ends the grant `token` of `owner` on `key` at the key's next visit,
/// which the caller makes.
pub fn add_revocation(key: DbKey, owner: Owner, token: u64, disconnect: bool) {
    registry()
        .revocations
        .entry(key)
        .or_default()
        .push(Revocation {
            owner,
            token,
            disconnect,
        });
}

/// Answers every waiter of a key with an error (the key now holds another type).
pub fn fail_all(db: i32, key: &[u8], error: LockError) {
    let mut registry = registry();
    let id = (db, key.to_vec());
    let Some(queue) = registry.queues.remove(&id) else {
        return;
    };
    for w in queue.iter() {
        if let Some(waiter) = registry.waiters.remove(&w.id) {
            unblock(waiter, Err(error));
        }
    }
}

/// Every key with waiters in database `db` (all databases when `db` is -1).
pub fn keys_with_waiters(db: i32) -> Vec<DbKey> {
    registry()
        .queues
        .keys()
        .filter(|(d, _)| db == -1 || *d == db)
        .cloned()
        .collect()
}

/// Whether requests wait for this key.
pub fn is_waited_on(key: &DbKey) -> bool {
    let registry = registry();
    !registry.queues.is_empty() && registry.queues.contains_key(key)
}

fn unblock(waiter: Blocked, outcome: Result<Attempt, LockError>) {
    let decision = Box::new(Decision {
        outcome,
        key: waiter.key,
        owner: waiter.owner,
        replied: false,
    });
    let data = Box::into_raw(decision).cast::<c_void>();
    api!(RedisModule_UnblockClient(waiter.handle, data));
}

/// Removes a waiter whose client went away (or that Redis unblocked itself,
/// e.g. on a switch to replica); the request behind it may now be grantable
/// (a writer holding back readers), so its key is visited at once.
///
/// Redis frees a blocked-client handle only once the module has called
/// `RM_UnblockClient` on it, even when the client is gone: without that call
/// the handle and its two temporary clients (about 35 KB) leaked for every
/// waiter that disconnected.
fn leave(handle: *mut raw::RedisModuleBlockedClient) {
    let key = {
        let mut registry = registry();
        let id = handle as WaiterId;
        let Some(waiter) = registry.waiters.remove(&id) else {
            return;
        };
        if let Some(queue) = registry.queues.get_mut(&waiter.key) {
            queue.remove(id);
            if queue.is_empty() {
                registry.queues.remove(&waiter.key);
            }
        }
        waiter.key
    };
    // No private data: nothing is replied (the client is gone) or revoked.
    api!(RedisModule_UnblockClient(handle, std::ptr::null_mut()));
    timers::schedule(key.0, &key.1, Some(crate::clock::now_ms()));
}

extern "C" fn on_reply(
    raw_ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback("the WAIT reply", raw::REDISMODULE_OK as c_int, || {
        let ctx = Context::new(raw_ctx);
        let data =
            api!(RedisModule_GetBlockedClientPrivateData(raw_ctx)).unwrap_or(std::ptr::null_mut());
        // SAFETY: the private data is the `Decision` boxed in `unblock`.
        let reply = match unsafe { data.cast::<Decision>().as_mut() } {
            Some(decision) => {
                decision.replied = true;
                decision
                    .outcome
                    .map_or_else(|e| Err(e.into()), replies::answer)
            }
            None => Err(LockError::Internal.into()),
        };
        ctx.reply(reply);
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_disconnect(
    _raw_ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    guard::callback("the WAIT disconnect", (), || {
        leave(handle);
    })
}

extern "C" fn free_decision(_raw_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback("the WAIT cleanup", (), || {
        if data.is_null() {
            return;
        }
        // SAFETY: the private data is the `Decision` boxed in `unblock`; Redis
        // frees it exactly once.
        let decision = unsafe { Box::from_raw(data.cast::<Decision>()) };
        if let (false, Ok(Attempt::Granted(token))) = (decision.replied, decision.outcome) {
            // Granted, but the client went away before hearing it: undo.
            let (db, key) = decision.key;
            bindings::forget(&(db, key.clone()), &decision.owner);
            revoke((db, key), decision.owner, token, false);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// INFO runs during a crash report too, maybe while the crashing code
    /// holds the registry: counting must not wait for it.
    #[test]
    fn counting_waiters_never_waits_for_the_registry() {
        let held = registry();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(total()));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        assert_eq!(answer, Ok(None), "answered at once, without the count");
        assert_eq!(total(), Some(0));
    }
}
