//! `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`: runs one
//! Redis command if and only if `owner` holds `key` now, as one atomic step
//! (docs/design.md, "Guarded commands").
//!
//! The check and the command are one command of the module, so nothing can
//! run between them. The command runs through `RedisModule_Call` as the
//! caller's ACL user (`C`), under the rules of a script (`S`: no MULTI,
//! EXEC, WATCH, EVAL, ...), refused when memory is full if it would take
//! memory (`M`), in the caller's protocol (`0`), with its errors as replies
//! (`E`), and replicated as itself (`!`): replicas and the AOF see the
//! command alone, never the check. Blocking commands are refused here (a
//! script would run them without blocking); a lock command's `WAIT` by the
//! command itself (`spec::guarding`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

use crate::commands::args::{self, GuardArgs};
use crate::redis::errors::{LockError, Unguardable};
use crate::redis::ffi::{self, api, Argv};
use crate::redis::spec::{self, command, Access, Arg, ArgKind, Keys, Spec, RO};
use crate::state::bindings;
use crate::state::keys::LockKey;
use crate::time::clock;

pub const GUARD: Spec = command! {
    name: c"lock.guard",
    handler: guard,
    access: Access::Write,
    fast: false,
    blocking: false,
    keys: Keys::FirstAndCalled(RO, called_keys),
    arity: -5,
    since: c"0.3.0",
    summary: c"Runs command (with its arguments) if and only if owner holds the lock at key now (and, with TOKEN, under that fencing token), as one atomic step; the reply is the command's. Otherwise runs nothing and answers NOTHELD.",
    complexity: c"O(R) for the check, R the holders, then the command's own",
    args: &[
        Arg::new(c"key", ArgKind::Key),
        Arg::new(c"owner", ArgKind::String),
        Arg::option(c"token", ArgKind::Integer, c"TOKEN"),
        Arg {
            name: c"command",
            kind: ArgKind::String,
            token: Some(c"CALL"),
            optional: false,
            multiple: false,
            since: None,
        },
        Arg::new(c"arg", ArgKind::String).many().optional(),
    ],
};

/// `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`
fn guard(ctx: &Context, args: Argv<'_>) -> RedisResult {
    if spec::guarding() {
        return Err(LockError::NotGuardable(Unguardable::Guard).into());
    }
    let guard = args::guard(args)?;
    let called = args.from(guard.call);
    // A command name never holds a NUL (none is registered with one).
    let Some(name) = called.get(0).and_then(|n| Name::of(n.as_slice())) else {
        return Err(LockError::Syntax.into());
    };
    if let Some(refused) = refusal(ctx, name.bytes(), called) {
        return Err(LockError::NotGuardable(refused).into());
    }
    if !holds(ctx, &guard)? {
        return Err(LockError::NotHeld.into());
    }
    let reply = spec::as_guarded(ctx.ctx, || call(ctx, &name, called.from(1)))
        .filter(|r| !r.is_null())
        .ok_or(LockError::Internal)?;
    let sent = send(ctx, reply);
    api!(RedisModule_FreeCallReply(reply));
    sent
}

/// Runs the command `name` with `args` (`RedisModule_Call`'s flags: see
/// the top of this file). Up to eight arguments are passed one by one
/// (`s`): Redis sizes its argument vector from the format, where a vector
/// (`v`) costs it a reallocation.
fn call(ctx: &Context, name: &Name, args: Argv<'_>) -> Option<*mut raw::RedisModuleCallReply> {
    let (argv, argc) = args.as_raw();
    let mut a = [std::ptr::null_mut::<raw::RedisModuleString>(); 8];
    for (slot, i) in a.iter_mut().zip(0..argc) {
        *slot = args.get(i).map_or(std::ptr::null_mut(), |s| s.raw());
    }
    let c = ctx.ctx;
    let n = name.as_ptr();
    match argc {
        0 => api!(RedisModule_Call(c, n, c"CSME0!".as_ptr())),
        1 => api!(RedisModule_Call(c, n, c"sCSME0!".as_ptr(), a[0])),
        2 => api!(RedisModule_Call(c, n, c"ssCSME0!".as_ptr(), a[0], a[1])),
        3 => api!(RedisModule_Call(
            c,
            n,
            c"sssCSME0!".as_ptr(),
            a[0],
            a[1],
            a[2]
        )),
        4 => api!(RedisModule_Call(
            c,
            n,
            c"ssssCSME0!".as_ptr(),
            a[0],
            a[1],
            a[2],
            a[3]
        )),
        5 => api!(RedisModule_Call(
            c,
            n,
            c"sssssCSME0!".as_ptr(),
            a[0],
            a[1],
            a[2],
            a[3],
            a[4]
        )),
        6 => api!(RedisModule_Call(
            c,
            n,
            c"ssssssCSME0!".as_ptr(),
            a[0],
            a[1],
            a[2],
            a[3],
            a[4],
            a[5]
        )),
        _ => api!(RedisModule_Call(c, n, c"vCSME0!".as_ptr(), argv, argc)),
    }
}

/// A command's name, lower case and ending in a NUL (as `RedisModule_Call`
/// takes it): on the stack when short, as every command's name is.
enum Name {
    Short([u8; 32], usize),
    Long(Vec<u8>),
}

impl Name {
    /// `None` for a name holding a NUL (no command has one).
    fn of(raw: &[u8]) -> Option<Name> {
        if raw.contains(&0) {
            return None;
        }
        if raw.len() < 32 {
            let mut buf = [0; 32];
            for (b, r) in buf.iter_mut().zip(raw) {
                *b = r.to_ascii_lowercase();
            }
            return Some(Name::Short(buf, raw.len()));
        }
        let mut name = raw.to_ascii_lowercase();
        name.push(0);
        Some(Name::Long(name))
    }

    /// Without the NUL.
    fn bytes(&self) -> &[u8] {
        match self {
            Name::Short(buf, len) => buf.get(..*len).unwrap_or(&[]),
            Name::Long(name) => name.split_last().map_or(&[], |(_, n)| n),
        }
    }

    fn as_ptr(&self) -> *const std::os::raw::c_char {
        match self {
            Name::Short(buf, _) => buf.as_ptr().cast(),
            Name::Long(name) => name.as_ptr().cast(),
        }
    }
}

/// Whether the guard's owner holds its key now: a live holder, under the
/// token if one is given, not bound to a connection that closed.
fn holds(ctx: &Context, guard: &GuardArgs<'_>) -> Result<bool, LockError> {
    // Closed before the command runs: it may change or delete this key.
    let key = LockKey::open(ctx, guard.key, false)?;
    let lock = match key.lock() {
        Err(LockError::WrongType) => return Err(LockError::GuardWrongType),
        other => other?,
    };
    let Some(lock) = lock else {
        return Ok(false);
    };
    let now = clock::now_ms();
    let Some(holder) = lock.holder(guard.owner) else {
        return Ok(false);
    };
    if !holder.is_live(now) || guard.token.is_some_and(|t| t != holder.token) {
        return Ok(false);
    }
    if bindings::pending() == 0 {
        return Ok(true);
    }
    let db = ffi::selected_db(ctx);
    Ok(!bindings::is_closed(
        db,
        guard.key.as_slice(),
        guard.owner,
        holder.token,
    ))
}

/// The called command's reply, forwarded as it is; the refusals Redis
/// words as plain errors here as a direct call or this module words them:
/// an ACL refusal as `NOPERM`, a subcommand scripts may not run (`FUNCTION
/// FLUSH`) as the other commands LOCK.GUARD cannot run.
fn send(ctx: &Context, reply: *mut raw::RedisModuleCallReply) -> RedisResult {
    // The reply's first byte says whether it is an error (its type would
    // parse the whole reply).
    let mut len = 0;
    let proto = api!(RedisModule_CallReplyProto(reply, &mut len)).unwrap_or(std::ptr::null());
    // SAFETY: the reply owns `len` bytes at `proto` until it is freed.
    let first = (!proto.is_null() && len > 0).then(|| unsafe { *proto.cast::<u8>() });
    if first == Some(b'-') {
        let text = reply_text(reply);
        let text = text.strip_prefix(b"-").unwrap_or(&text).trim_ascii_end();
        if let Some(why) = text.strip_prefix(b"ERR acl verification failed, ") {
            let why = String::from_utf8_lossy(why);
            return Err(RedisError::String(format!(
                "NOPERM this user {why} (through LOCK.GUARD)"
            )));
        }
        if text.starts_with(b"ERR command '") && text.ends_with(b"is not allowed on script mode") {
            return Err(LockError::NotGuardable(Unguardable::NoScript).into());
        }
    }
    api!(RedisModule_ReplyWithCallReply(ctx.ctx, reply));
    Ok(RedisValue::NoReply)
}

/// A string or error reply's bytes (copied).
fn reply_text(reply: *mut raw::RedisModuleCallReply) -> Vec<u8> {
    let mut len = 0;
    let Some(ptr) = api!(RedisModule_CallReplyStringPtr(reply, &mut len)) else {
        return Vec::new();
    };
    if ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the reply owns `len` bytes at `ptr` until it is freed.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec()
}

/// What a command's flags say about running it guarded.
#[derive(Clone, Copy)]
struct Traits {
    blocking: bool,
    noscript: bool,
}

/// The commands whose traits are known: the last one asked for, and all.
type Known = (Option<(Vec<u8>, Traits)>, HashMap<Vec<u8>, Traits>);

thread_local! {
    /// Each command's traits by lower-case name, asked once (`COMMAND
    /// INFO`: commands are only added, by modules loading, or renamed at
    /// start-up), the last one asked for first (most callers guard one or
    /// two commands).
    static TRAITS: RefCell<Known> = RefCell::new((None, HashMap::new()));
}

/// Why `name` may not run guarded, if it may not. The lock commands block
/// only with `WAIT`, which they refuse themselves when guarded; the stream
/// reads only with `BLOCK`.
fn refusal(ctx: &Context, name: &[u8], called: Argv<'_>) -> Option<Unguardable> {
    let traits = TRAITS.with(|t| {
        let t = t.borrow();
        match &t.0 {
            Some((last, traits)) if last.as_slice() == name => Some(*traits),
            _ => t.1.get(name).copied(),
        }
    });
    let traits = match traits {
        Some(t) => t,
        None => {
            // An unknown command is Redis's to answer.
            let t = traits_of(ctx, name)?;
            TRAITS.with(|m| {
                let mut m = m.borrow_mut();
                m.0 = Some((name.to_vec(), t));
                m.1.insert(name.to_vec(), t);
            });
            t
        }
    };
    if traits.blocking && blocks(name, called) {
        Some(Unguardable::Blocking)
    } else if traits.noscript {
        Some(Unguardable::NoScript)
    } else {
        None
    }
}

/// Whether a command flagged `blocking` blocks with these arguments.
fn blocks(name: &[u8], called: Argv<'_>) -> bool {
    match name {
        _ if name.starts_with(b"lock.") => false,
        b"xread" | b"xreadgroup" => (1..called.len())
            .map_while(|i| called.get(i))
            .map(|a| a.as_slice())
            .take_while(|a| !a.eq_ignore_ascii_case(b"STREAMS"))
            .any(|a| a.eq_ignore_ascii_case(b"BLOCK")),
        _ => true,
    }
}

/// The command's flags, from `COMMAND INFO name`; `None` when there is no
/// such command.
fn traits_of(ctx: &Context, name: &[u8]) -> Option<Traits> {
    let reply = api!(RedisModule_Call(
        ctx.ctx,
        c"COMMAND".as_ptr(),
        c"cb".as_ptr(),
        c"INFO".as_ptr(),
        name.as_ptr(),
        name.len()
    ))
    .filter(|r| !r.is_null())?;
    let mut traits = None;
    let info = element(reply, 0);
    if !info.is_null() && reply_type(info) == raw::REDISMODULE_REPLY_ARRAY {
        let flags = element(info, 2);
        let mut t = Traits {
            blocking: false,
            noscript: false,
        };
        let count = api!(RedisModule_CallReplyLength(flags)).unwrap_or(0);
        for i in 0..count {
            match reply_text(element(flags, i)).as_slice() {
                b"blocking" => t.blocking = true,
                b"noscript" => t.noscript = true,
                _ => {}
            }
        }
        traits = Some(t);
    }
    api!(RedisModule_FreeCallReply(reply));
    traits
}

fn element(reply: *mut raw::RedisModuleCallReply, i: usize) -> *mut raw::RedisModuleCallReply {
    if reply.is_null() {
        return std::ptr::null_mut();
    }
    api!(RedisModule_CallReplyArrayElement(reply, i)).unwrap_or(std::ptr::null_mut())
}

fn reply_type(reply: *mut raw::RedisModuleCallReply) -> isize {
    api!(RedisModule_CallReplyType(reply)).map_or(-1, |t| t as isize)
}

/// Where a `LOCK.GUARD` call's keys are: the lock's, then the called
/// command's (as Redis finds them), so that cluster routing, `COMMAND
/// GETKEYS` and ACL key patterns see every key the call touches.
fn called_keys(ctx: &Context, args: Argv<'_>) {
    key_at(ctx, 1, RO);
    let Ok(guard) = args::guard(args) else {
        return;
    };
    let (argv, argc) = args.from(guard.call).as_raw();
    let Ok(argc) = c_int::try_from(argc) else {
        return;
    };
    let mut count: c_int = 0;
    let mut flags: *mut c_int = std::ptr::null_mut();
    let positions = api!(RedisModule_GetCommandKeysWithFlags(
        ctx.ctx, argv, argc, &mut count, &mut flags
    ))
    .unwrap_or(std::ptr::null_mut());
    if positions.is_null() {
        return;
    }
    let count = usize::try_from(count).unwrap_or(0);
    // SAFETY: Redis returns `count` positions (and as many flags, or none).
    let at = unsafe { std::slice::from_raw_parts(positions, count) };
    let key_flags = (!flags.is_null()).then(|| unsafe { std::slice::from_raw_parts(flags, count) });
    for (i, pos) in at.iter().enumerate() {
        let Some(pos) = usize::try_from(*pos)
            .ok()
            .and_then(|p| c_int::try_from(p + guard.call).ok())
        else {
            continue;
        };
        let flags = key_flags.and_then(|f| f.get(i)).copied();
        key_at(
            ctx,
            pos,
            flags.and_then(|f| u32::try_from(f).ok()).unwrap_or(0),
        );
    }
    api!(RedisModule_Free(positions.cast()));
    if !flags.is_null() {
        api!(RedisModule_Free(flags.cast()));
    }
}

/// Reports a key at `pos` with its key-spec `flags` (none known: 0, which
/// Redis reads as full access), where the server takes flags.
fn key_at(ctx: &Context, pos: c_int, flags: u32) {
    // SAFETY: reads a function pointer RedisModule_Init filled (or left None).
    let with_flags = unsafe { raw::RedisModule_KeyAtPosWithFlags }.is_some();
    match c_int::try_from(flags) {
        Ok(flags) if with_flags && flags != 0 => {
            api!(RedisModule_KeyAtPosWithFlags(ctx.ctx, pos, flags));
        }
        _ => {
            api!(RedisModule_KeyAtPos(ctx.ctx, pos));
        }
    }
}
