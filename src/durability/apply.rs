//! `LOCK.SYNC`: applies one effect of the master's replication stream or of
//! the AOF (the wire format is `lock_core::effect`'s), exactly, whatever the time.

use lock_core::effect::{Effect, Malformed};
use lock_core::{Holder, Lock, Tokens};
use redis_module::{Context, ContextFlags, RedisResult, RedisValue};

use crate::redis::config;
use crate::redis::errors::LockError;
use crate::redis::ffi::{self, Argv, DbKey, KeyAt, Str};
use crate::redis::log;
use crate::redis::spec::{command, Access, Arg, ArgKind, Keys, Spec, UPDATE};
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::transitions;
use crate::time::clock;
use crate::time::fencing;

/// As on the RDB path: no token a server cannot have issued (the master's
/// clock may be ahead: a load's bound), refused; in a file (the AOF), a
/// lease past `lock.max-ttl` clamped to it. Logged and counted in a file.
fn within_bounds(holder: &mut Holder, loading: bool) -> Result<(), LockError> {
    let now = clock::now_ms();
    if !Tokens::loadable(holder.token, now) {
        if loading {
            stats::fixed_at_load(&log::AOF_DROPPED, &holder.token.to_string());
        }
        return Err(LockError::BadState);
    }
    // A session holder's deadline names its session: an id like a token.
    if let Some(id) = lock_core::lock::session_of(holder.deadline) {
        return match Tokens::loadable(id, now) {
            true => Ok(()),
            false => Err(LockError::BadState),
        };
    }
    let (latest, limit) = config::deadline_bounds(now);
    if loading && holder.deadline > limit {
        stats::fixed_at_load(
            &log::AOF_CLAMPED,
            &format!("deadline {}, now ending at {latest}", holder.deadline),
        );
        holder.deadline = latest;
    }
    Ok(())
}

/// The key and the effect of `LOCK.SYNC key ...` (`lock_core::effect`),
/// and the connection lease its holder follows (`:F<lease>`).
fn parse(argv: Argv<'_>) -> Result<(Str<'_>, Effect<'_>, Option<u64>), LockError> {
    let key = argv.get(1).ok_or(LockError::Syntax)?;
    let rest: Vec<&[u8]> = (2..argv.len())
        .filter_map(|i| argv.get(i))
        .map(Str::as_slice)
        .collect();
    match Effect::decode_following(&rest) {
        Ok((effect, lease)) => Ok((key, effect, lease)),
        Err(Malformed::Syntax) => Err(LockError::Syntax),
        Err(Malformed::BadState) => Err(LockError::BadState),
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
    summary: c"Internal: applies one replicated lock effect (mode:holds:token:deadline[:limit] owner, a holder that follows its connection's lease with :Flease after its numbers, or DROP owner; the 0.2 form SET owner mode holds token deadline [limit] still applies). Accepted only from the master or the AOF.",
    complexity: c"O(log R) for a lock of 1,024 holders or more (its index), else O(R), R the holders (one walk of them)",
    args: &[
        Arg::new(c"key", ArgKind::Key),
        Arg::new(c"effect", ArgKind::String).many(),
    ],
};

/// `LOCK.SYNC`: applies one replicated effect, exactly, whatever the time and
/// whatever this server held before: the master's stream is authoritative, as
/// it is for Redis's own types (a key of another type is replaced, holders
/// that cannot coexist with the one it sets are dropped).
/// (`Access::Internal`: the master's stream and the AOF only.)
fn sync(ctx: &Context, args: Argv<'_>) -> RedisResult {
    let flags = ctx.get_flags();
    let loading = flags.contains(ContextFlags::LOADING);
    let (name, effect, lease) = parse(args)?;
    // Not in the stream: a new grant counts from its arrival (`Lock::put`
    // keeps it for a changed one).
    let mut set = match effect {
        Effect::Set { kind, .. } => effect
            .holder(lock_core::since(clock::now_ms()))
            .map(|holder| (kind, holder)),
        Effect::Drop { .. } => None,
    };
    if let Some((_, holder)) = &mut set {
        within_bounds(holder, loading)?;
    }
    // A follower (`:F<lease>`): its own deadline goes to the lease table,
    // its entry names its token, as `LOCK.LEASESYNC OWN` and the holder's
    // effect did in two.
    let follows = match (lease, &mut set) {
        (Some(lease), Some((_, holder))) => {
            if !Tokens::loadable(lease, clock::now_ms()) {
                if loading {
                    stats::fixed_at_load(&log::AOF_SESSION_DROPPED, &format!("a lease's {lease}"));
                }
                return Err(LockError::BadState.into());
            }
            let own = holder.deadline;
            holder.deadline = lock_core::lock::session_deadline(holder.token);
            Some((holder.token, lease, own))
        }
        _ => None,
    };
    if let Some((kind, holder)) = &set {
        // Checked before anything is replaced: a bad effect changes nothing.
        Lock::default()
            .put(*kind, holder.clone())
            .map_err(|_| LockError::BadState)?;
        let key = LockKey::open(ctx, name, true)?;
        if matches!(key.lock(), Err(LockError::WrongType)) {
            key.delete();
        }
    }
    if let Some((token, lease, own)) = follows {
        fencing::observe(lease);
        sessions::sync_own(token, lease, own);
    }
    // The sessions the owner's holder followed before and after.
    let mut followed = (None, None);
    // The owner's holder found, set or appended, and the deadlines after:
    // through the index of a lock of 1,024 holders or more
    // (`Lock::apply_set_new`, `apply_drop`), else one walk of its holders.
    let sweep = transitions::write_back_known(ctx, name, true, |lock| {
        followed.1 = set.as_ref().and_then(|(_, h)| h.as_ref().session());
        let applied = if let Some((kind, holder)) = set {
            let token = holder.token;
            // Newer than every token this server has seen (each holder's
            // was seen as it came: a grant, an effect, a load, a RESTORE):
            // no other holder carries it, and an indexed lock's holders
            // are not walked for it.
            let fresh = token > fencing::last();
            let applied = lock
                .apply_set_new(kind, holder, fresh)
                .map_err(|_| LockError::BadState)?;
            fencing::observe(token);
            if flags.contains(ContextFlags::REPLICATED) {
                // A promotion owes a jump past the master's later grants.
                fencing::received();
            }
            applied
        } else if let Effect::Drop { owner } = effect {
            lock.apply_drop(owner)
        } else {
            return Ok((None, true, lock.latest_deadline()));
        };
        followed.0 = applied.followed;
        Ok((applied.sweep_at(), true, applied.latest_deadline()))
    })?
    .flatten();
    if followed.0 != followed.1 {
        let key = ffi::db_key(ctx, name.as_slice());
        if let Some(id) = followed.0 {
            sessions::leave(id, &key);
        }
        if let Some(id) = followed.1 {
            sessions::join(id, &key);
        }
    }
    // A visit to plan, or this key's planned one to drop.
    if sweep.is_some()
        || timers::any() && timers::planned(&KeyAt::new(ffi::selected_db(ctx), name.as_slice()))
    {
        let DbKey { db, name: key } = ffi::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, sweep);
    }
    if follows.is_some() {
        timers::sessions_changed();
    }
    // Our own replicas and AOF get the effect as it came.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
