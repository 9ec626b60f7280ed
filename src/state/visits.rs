//! What the timer's ticks do (registered with `timers::set_handler` at load):
//! visit due keys, end the grants of closed connections, announce locks Redis
//! expired. On a replica nothing is written: waiters of due keys are told to
//! go to the master.

use redis_module::Context;

use crate::redis::catch;
use crate::redis::errors::LockError;
use crate::redis::ffi::{self, api, DbKey, Str};
use crate::redis::homes;
use crate::redis::replication;
use crate::state::bindings;
use crate::state::deadlocks;
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::timers::{self, Due};
use crate::state::transitions;
use crate::state::waiting;
use crate::time::clock;

/// How many grants of a closed connection are ended between two looks at
/// the clock.
const RELEASED_PER_LOOK: usize = 32;

/// How many expired locks are announced between two looks at the clock.
const EXPIRED_PER_LOOK: usize = 32;

/// One tick's work, within its share of the turn (`clock::turn`): what
/// is left goes on at the next tick. A tick of a millisecond or more of
/// the main thread's CPU is a sample of the `lock-tick` event of Redis's
/// latency monitor (`LATENCY LATEST`, with `latency-monitor-threshold`
/// set): the module's own work in one turn, as `command` is a command's
/// (in CPU time: what the machine's load steals from the thread is not the
/// module's work).
pub fn tick(ctx: &Context, due: Due) {
    let started = clock::thread_cpu_ns();
    clock::turn(|| tick_work(ctx, due));
    let ms = clock::thread_cpu_ns().saturating_sub(started) / 1_000_000;
    if ms >= 1 {
        api!(RedisModule_LatencyAddSample(
            c"lock-tick".as_ptr(),
            i64::try_from(ms).unwrap_or(i64::MAX)
        ));
    }
}

fn tick_work(ctx: &Context, due: Due) {
    let replica = due.replica;
    catch::callback(
        "unblocking what waited for a turn",
        (),
        waiting::unblock_later,
    );
    catch::callback("answering failed waiters", (), waiting::fail_some);
    catch::callback("ending retired holders' entries", (), waiting::retire_some);
    catch::callback("waking flushed databases' waiters", (), waiting::wake_some);
    catch::callback("a deadlock search's slice", (), || deadlocks::go_on(ctx));
    // Locks Redis expired since the last tick, within the tick's share of
    // the turn (the rest at the next tick, at once).
    loop {
        let some = timers::take_expired_some(EXPIRED_PER_LOOK);
        if some.is_empty() {
            break;
        }
        for (DbKey { db, name: key }, leases) in some {
            catch::callback("announcing an expired lock", (), || {
                if ffi::select_db(ctx, db) {
                    transitions::announce_expired(ctx, &key, leases);
                }
            });
        }
        if clock::turn_over() {
            break;
        }
    }
    for closed in due.released {
        let mut more = true;
        while more && !clock::turn_over() {
            let (page, left) = bindings::take_closed(&closed, RELEASED_PER_LOOK);
            more = left;
            // A replica has no bindings (they are the master's); a demoted
            // master's closed connections leave their holders to the lease.
            // (Their bindings go, so nothing counts them as pending.)
            if replica {
                continue;
            }
            for b in page {
                catch::callback("releasing a bound grant", (), || {
                    waiting::add_revocation(b.key.clone(), b.owner, b.token, true);
                    visit(ctx, b.key.db, &b.key.name, false);
                });
            }
        }
        if more {
            timers::release_bound(closed);
        }
    }
    if !replica {
        catch::callback("ending sessions", (), || end_sessions(ctx));
    }
    catch::callback("dropping what flushes left", (), drop_flushed);
    catch::callback("ending holders set aside", (), || {
        end_set_aside(ctx, replica)
    });
    let mut visits = due.visits.into_iter();
    for (DbKey { db, name: key }, refresh) in visits.by_ref() {
        if replica {
            // Demoted while clients waited (a server that keeps them
            // blocked across the role change, as Valkey does): a replica
            // must not write, so they are told to go to the master.
            waiting::fail_all(db, &key, LockError::Replica);
        } else {
            catch::callback("a lock key's visit", (), || {
                visit(ctx, db, &key, refresh);
            });
        }
        if clock::turn_over() {
            break;
        }
    }
    // The share of the turn is spent: the keys not visited are visited at
    // the next tick.
    let now = Some(clock::now_ms());
    for (DbKey { db, name: key }, refresh) in visits {
        match refresh {
            true => timers::refresh(db, &key),
            false => timers::schedule(db, &key, now),
        }
    }
}

/// What FLUSHDB, FLUSHALL and SWAPDB left (`homes`): bindings of flushed
/// databases swept, what the tables threw away dropped, until the tick's
/// share of the turn is spent; the rest at the next turns.
fn drop_flushed() {
    const PER_LOOK: usize = 64;
    while bindings::dead() > 0 && !clock::turn_over() {
        bindings::sweep_dead(4 * PER_LOOK);
    }
    homes::drop_some(PER_LOOK, clock::turn_over);
    if bindings::dead() > 0 || homes::any() {
        timers::work_now();
    }
}

/// Holders a grant set aside from a key (`transitions::end_aside`): a
/// slice of each key's ended in a transaction on it, within the tick's
/// share of the turn; the rest at the next turns. A key that holds another
/// type now, or a server that is a replica now (it must not write; the
/// grant replicated `UNLINK` of them), lets them go uncounted.
fn end_set_aside(ctx: &Context, replica: bool) {
    let mut more = false;
    for DbKey { db, name: key } in transitions::set_aside_keys() {
        if clock::turn_over() {
            more = true;
            break;
        }
        let ended = !replica
            && ffi::select_db(ctx, db)
            && transitions::update(ctx, Str::from(&ffi::name(ctx, &key)), |txn| {
                more |= transitions::end_aside(db, &key, txn.changes);
            })
            .is_ok();
        if !ended {
            transitions::drop_aside(db, &key);
        }
    }
    if more {
        timers::work_now();
    }
}

/// Looks at one key: drops expired holders, grants waiters, re-indexes it;
/// on a refresh, sets its TTL again ([`retime`]).
/// Sessions whose deadline passed end (replicated as one effect each);
/// then ended sessions are cleaned up a share of the turn at a time: their
/// waiters answered `NOSESSION`, their keys visited (the holders that
/// followed them dropped and the drops replicated, the waiters they kept
/// out granted). What is left waits for the next tick.
fn end_sessions(ctx: &Context) {
    const PER_LOOK: usize = 32;
    for id in sessions::end_due(clock::now_ms()) {
        replication::replicate_session(ctx, id, 0);
    }
    while !clock::turn_over() {
        let (keys, waiters) = sessions::take_work(PER_LOOK, clock::now_ms());
        if keys.is_empty() && waiters.is_empty() {
            break;
        }
        for w in waiters {
            waiting::refuse_if_session_ended(w);
        }
        for k in keys {
            catch::callback("a session's key", (), || visit(ctx, k.db, &k.name, false));
        }
    }
}

fn visit(ctx: &Context, db: i32, key: &[u8], refresh: bool) {
    if !ffi::select_db(ctx, db) {
        return;
    }
    let name = ffi::name(ctx, key);
    let mut left = false;
    let result = transitions::update(ctx, Str::from(&name), |txn| {
        if !waiting::nothing_to_purge(db, key, txn.lock, txn.now, txn.changes) {
            left = txn.lock.purge(txn.now, txn.changes);
        }
    });
    // A purge in slices (a lock of many holders, many expired): the next
    // slice at the next turn, until none is left.
    if left {
        timers::schedule_earlier(db, key, Some(clock::now_ms()));
    }
    match result {
        Err(e) => waiting::fail_all(db, key, e),
        Ok(()) if refresh => retime(ctx, Str::from(&name)),
        Ok(()) => {}
    }
}

/// A refresh: the key's Redis TTL set again to its latest deadline (none
/// when that holder follows a session or its connection's lease), and
/// the same sent to replicas and the AOF as one absolute `PEXPIREAT` (or
/// `PERSIST`). O(1) at any holder count: the visit's write-back kept the
/// latest deadline in the block. The holders are not sent again: what
/// moved or re-timed the key (`PERSIST`, `PEXPIRE`, `RENAME`, `MOVE`,
/// `RESTORE`) reached the replicas as Redis's own command, and changed
/// no holder.
fn retime(ctx: &Context, name: Str<'_>) {
    let Ok(key) = LockKey::open(ctx, name, true) else {
        return;
    };
    let latest = match key.lock() {
        Ok(Some(lock)) => lock.latest_deadline(),
        _ => None,
    };
    let Some(latest) = latest else {
        return;
    };
    key.expire_at(latest);
    let expiry = lock_core::lock::session_of(latest)
        .is_none()
        .then_some(latest);
    replication::replicate_expiry(ctx, name, expiry);
}
