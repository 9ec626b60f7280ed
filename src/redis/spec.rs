//! What a command is, declared once: `command!` takes every field (a missing
//! one does not compile) and makes the command's C entry point. Registration
//! (`module`) derives the flags and the key positions from it, `metadata`
//! the arity, key specs, ACL categories and `COMMAND DOCS`; [`run`] applies
//! what `access` says (a replica's refusal, the master's stream only) before
//! the handler runs, and answers a cluster's key-position question with
//! `keys`. Each command's declaration sits beside its handler.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use redis_module::{raw, Context, ContextFlags, RedisResult};

use crate::redis::catch;
use crate::redis::errors::LockError;
use crate::redis::ffi::{api, Argv};
use crate::redis::replication;
use crate::redis::replies;

/// The C entry point of one command (made by `command!`).
pub type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Reports where a call's keys are (`RedisModule_KeyAtPos`), for a command
/// whose keys are found by reading its arguments.
pub type Locate = fn(&Context, Argv<'_>);

/// What a command may change, and so where it runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// Reads only (`readonly`, ACL `@read`).
    Read,
    /// Writes lock state (`write`): refused on a replica, whose locks only
    /// the master's stream writes.
    Write,
    /// Writes and may take memory (`write deny-oom`): a grant. Refused on a
    /// replica.
    Grant,
    /// Applies the master's stream (`write`, not in `@lock`): accepted only
    /// from the master or the AOF.
    Internal,
}

impl Access {
    /// The command flags it gives.
    pub const fn flags(self) -> &'static str {
        match self {
            Access::Read => "readonly",
            Access::Write | Access::Internal => "write",
            Access::Grant => "write deny-oom",
        }
    }

    /// The ACL category it gives.
    pub const fn category(self) -> &'static str {
        match self {
            Access::Read => "read",
            _ => "write",
        }
    }

    /// Refuses a call this access does not allow here.
    #[inline(always)]
    fn check(self, ctx: &Context) -> Result<(), LockError> {
        match self {
            Access::Read => Ok(()),
            Access::Write | Access::Grant => master_only(ctx),
            Access::Internal => {
                count_internal_call(ctx);
                from_master(ctx)
            }
        }
    }
}

/// Calls of the internal command (`LOCK.SYNC`) Redis counts in its own
/// command stats too: every call of its entry, except those of an AOF being
/// loaded (Redis runs them outside its stats). `stats::follow_resetstat`
/// compares the two to see `CONFIG RESETSTAT`.
static INTERNAL_CALLS: AtomicU64 = AtomicU64::new(0);

fn count_internal_call(ctx: &Context) {
    if !ctx.get_flags().contains(ContextFlags::LOADING) {
        INTERNAL_CALLS.fetch_add(1, Ordering::Relaxed);
    }
}

/// How many calls of the internal command Redis has counted at least, since
/// the module was loaded, if it never reset its stats.
pub fn internal_calls() -> u64 {
    INTERNAL_CALLS.load(Ordering::Relaxed)
}

/// A replica never writes a lock itself, even with `replica-read-only no`:
/// its tokens would repeat the master's and its state would diverge. Only the
/// master's stream (`LOCK.SYNC`) writes there.
#[inline(always)]
fn master_only(ctx: &Context) -> Result<(), LockError> {
    if !replication::is_replica() {
        return Ok(());
    }
    on_replica(ctx)
}

#[inline(never)]
fn on_replica(ctx: &Context) -> Result<(), LockError> {
    let flags = ctx.get_flags();
    let from_master = flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING);
    if flags.contains(ContextFlags::SLAVE) && !from_master {
        return Err(LockError::Replica);
    }
    Ok(())
}

/// The master's stream and the AOF only.
fn from_master(ctx: &Context) -> Result<(), LockError> {
    let flags = ctx.get_flags();
    match flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        true => Ok(()),
        false => Err(LockError::InternalCommand),
    }
}

/// Whether a command runs inside LOCK.GUARD now (Redis runs one command at
/// a time, on its main thread), and the guard's own context.
static GUARDING: AtomicBool = AtomicBool::new(false);
static GUARD_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// Inside LOCK.GUARD, nothing may wait: one atomic step cannot.
pub fn guarding() -> bool {
    GUARDING.load(Ordering::Relaxed)
}

/// The connection that sent the LOCK.GUARD running now, if it has one: a
/// `BIND` inside binds to it (the called command's own client is
/// `RedisModule_Call`'s, gone when the call returns).
/// (None inside a script: it has no connection of its own.)
pub fn guard_caller() -> Option<u64> {
    let ctx = GUARD_CTX.load(Ordering::Relaxed);
    if ctx.is_null() || Context::new(ctx).get_flags().contains(ContextFlags::LUA) {
        return None;
    }
    api!(RedisModule_GetClientId(ctx)).filter(|id| *id != 0)
}

/// The context of the LOCK.GUARD running now (null: none).
pub fn guard_context() -> *mut raw::RedisModuleCtx {
    GUARD_CTX.load(Ordering::Relaxed)
}

/// Runs `call` as the command of the LOCK.GUARD running in `ctx`:
/// [`guarding`] is true meanwhile.
pub fn as_guarded<T>(ctx: *mut raw::RedisModuleCtx, call: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            GUARDING.store(false, Ordering::Relaxed);
            GUARD_CTX.store(std::ptr::null_mut(), Ordering::Relaxed);
        }
    }
    GUARD_CTX.store(ctx, Ordering::Relaxed);
    GUARDING.store(true, Ordering::Relaxed);
    let _reset = Reset;
    call()
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
pub enum Keys {
    /// None (LOCK.KEEPALIVE).
    None,
    /// The first argument, with these key-spec flags.
    First(u32),
    /// `numkeys key [key ...]` from the first argument (LOCK.MACQUIRE):
    /// described by a key spec, and found by `locate` for cluster routing.
    Counted(u32, Locate),
    /// The first argument, then those of the command it runs (LOCK.GUARD):
    /// only `locate` can find them, so the key spec says it is incomplete.
    FirstAndCalled(u32, Locate),
}

impl Keys {
    /// How the command reports its keys when Redis asks (`getkeys-api`).
    pub const fn locate(self) -> Option<Locate> {
        match self {
            Keys::Counted(_, locate) | Keys::FirstAndCalled(_, locate) => Some(locate),
            Keys::None | Keys::First(_) => None,
        }
    }

    /// First key, last key, key step, as `RedisModule_CreateCommand` takes
    /// them (zeros: none, or found by the command).
    pub const fn positions(self) -> (c_int, c_int, c_int) {
        match self {
            Keys::First(_) => (1, 1, 1),
            _ => (0, 0, 0),
        }
    }
}

/// A key spec's flags: LOCK.INFO only reads its key (`RO`), so an ACL
/// `%R~pattern` allows it.
pub const RO: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
/// A grant or a renewal updates the lock (INSERT, UPDATE and DELETE are
/// mutually exclusive).
pub const UPDATE: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;
/// A release deletes from it.
pub const DELETE: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE;

/// An argument as `COMMAND DOCS` shows it.
pub struct Arg {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub token: Option<&'static CStr>,
    pub optional: bool,
    /// Repeated (`key [key ...]`).
    pub multiple: bool,
    /// The version that added it to a command that existed before
    /// (`COMMAND DOCS`' `since` of the argument).
    pub since: Option<&'static CStr>,
}

/// An argument's type in `COMMAND DOCS`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Key,
    String,
    Integer,
    /// A keyword alone (`BIND`).
    PureToken,
}

impl Arg {
    /// A required argument.
    pub const fn new(name: &'static CStr, kind: ArgKind) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
            since: None,
        }
    }

    /// An optional keyword alone: `[BIND]`.
    pub const fn flag(name: &'static CStr, token: &'static CStr) -> Arg {
        Arg {
            name,
            kind: ArgKind::PureToken,
            token: Some(token),
            optional: true,
            multiple: false,
            since: None,
        }
    }

    /// An optional keyword and its value: `[WAIT ms]`.
    pub const fn option(name: &'static CStr, kind: ArgKind, token: &'static CStr) -> Arg {
        Arg {
            name,
            kind,
            token: Some(token),
            optional: true,
            multiple: false,
            since: None,
        }
    }

    /// Optional: `[arg]`.
    pub const fn optional(self) -> Arg {
        Arg {
            optional: true,
            ..self
        }
    }

    /// Repeated: `key [key ...]`.
    pub const fn many(self) -> Arg {
        Arg {
            multiple: true,
            ..self
        }
    }

    /// Added in `version` to a command that existed before.
    pub const fn since(self, version: &'static CStr) -> Arg {
        Arg {
            since: Some(version),
            ..self
        }
    }
}

/// One command, whole: everything Redis is told about it comes from here.
pub struct Spec {
    /// As clients send it, lower case (`lock.acquire`).
    pub name: &'static CStr,
    pub entry: Entry,
    pub access: Access,
    /// O(1) and never waits: `fast` (and ACL `@fast`).
    pub fast: bool,
    /// May block its client (`WAIT`): `blocking` (and ACL `@blocking`).
    pub blocking: bool,
    pub keys: Keys,
    pub arity: c_int,
    /// The version that added it (`COMMAND DOCS`' `since`).
    pub since: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
}

impl Spec {
    /// A subcommand is named `container|sub` (`lock.session|open`): the
    /// container's name and its own. A container is a command some other
    /// is a subcommand of: registration makes it one (Redis runs its
    /// subcommands, never its handler); its declaration gives its docs.
    pub fn container_of(&self) -> Option<(&str, &str)> {
        self.name.to_str().ok()?.split_once('|')
    }

    /// Whether this command is a subcommand of `container`.
    pub fn is_subcommand_of(&self, container: &Spec) -> bool {
        self.container_of()
            .is_some_and(|(c, _)| container.name.to_str() == Ok(c))
    }

    /// The flags `RedisModule_CreateCommand` takes.
    pub fn flags(&self) -> String {
        let mut flags = String::from(self.access.flags());
        for (on, flag) in [
            (self.fast, " fast"),
            (self.blocking, " blocking"),
            (self.keys.locate().is_some(), " getkeys-api"),
        ] {
            if on {
                flags.push_str(flag);
            }
        }
        flags
    }

    /// Its ACL categories, `lock` (the module's own) last; the internal
    /// command is not in `@lock`.
    pub fn acl_categories(&self) -> String {
        let mut acl = String::from(self.access.category());
        for (on, category) in [
            (self.blocking, " blocking"),
            (self.fast, " fast"),
            (self.access != Access::Internal, " lock"),
        ] {
            if on {
                acl.push_str(category);
            }
        }
        acl
    }
}

/// Runs one call of a command, guarded, and replies (in line in each
/// command's entry point: one call fewer a command). A key-position
/// question is answered by `locate`; otherwise `access` is checked, then
/// `handler` runs.
#[inline(always)]
pub fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    name: &'static CStr,
    // A handler (its arguments as Redis passed them, nothing copied) by its
    // own type, not a pointer: called directly, in line in the entry point.
    handler: impl FnOnce(&Context, Argv<'_>) -> RedisResult,
    access: Access,
    locate: Option<Locate>,
) -> c_int {
    // Reading the arguments and writing the reply are inside the guard too:
    // nothing of the call runs outside one.
    let context = Context::new(ctx);
    catch::command(
        name,
        || {
            // SAFETY: what Redis passed to this command.
            let args = unsafe { Argv::from_raw(argv, argc) };
            if let Some(locate) = locate {
                if api!(RedisModule_IsKeysPositionRequest(ctx)).unwrap_or(0) != 0 {
                    locate(&context, args);
                    return raw::REDISMODULE_OK as c_int;
                }
            }
            let result = match access.check(&context) {
                Ok(()) => handler(&context, args),
                Err(e) => Err(e.into()),
            };
            replies::send(&context, result)
        },
        || replies::send(&context, Err(LockError::Internal.into())),
    )
}

/// Declares a command: every field named, in this order, none left out.
macro_rules! command {
    (
        name: $name:literal,
        handler: $handler:path,
        access: $access:expr,
        fast: $fast:literal,
        blocking: $blocking:literal,
        keys: $keys:expr,
        arity: $arity:literal,
        since: $since:literal,
        summary: $summary:literal,
        complexity: $complexity:literal,
        args: $args:expr $(,)?
    ) => {{
        extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            const LOCATE: Option<$crate::redis::spec::Locate> = $keys.locate();
            $crate::redis::spec::run(ctx, argv, argc, $name, $handler, $access, LOCATE)
        }
        $crate::redis::spec::Spec {
            name: $name,
            entry,
            access: $access,
            fast: $fast,
            blocking: $blocking,
            keys: $keys,
            arity: $arity,
            since: $since,
            summary: $summary,
            complexity: $complexity,
            args: $args,
        }
    }};
}
pub(crate) use command;
