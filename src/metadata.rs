//! What each command tells Redis about itself: arity, key specs and the text
//! of `COMMAND DOCS`, set with `RedisModule_SetCommandInfo` (Redis 7.0+).
//! ACL categories too, where the server has them. Flags are in the command
//! table in `lib.rs`.
//!
//! Key specs make `COMMAND GETKEYS`, cluster routing and ACL key patterns work:
//! LOCK.INFO only reads its key (`RO`), so an ACL `%R~pattern` allows it.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;
use redis_module::{Context, Status};

use crate::ffi::api;
use crate::log;

/// The version as `MODULE LIST` shows it, encoded as Redis modules do:
/// major * 10000 + minor * 100 + patch.
pub const MODULE_VERSION: i32 = {
    let major = parse(env!("CARGO_PKG_VERSION_MAJOR"));
    let minor = parse(env!("CARGO_PKG_VERSION_MINOR"));
    let patch = parse(env!("CARGO_PKG_VERSION_PATCH"));
    major * 10_000 + minor * 100 + patch
};

/// A version number part (digits only; anything else counts as 0).
const fn parse(digits: &str) -> i32 {
    let mut rest = digits.as_bytes();
    let mut n = 0;
    while let [d, tail @ ..] = rest {
        if !d.is_ascii_digit() {
            return 0;
        }
        n = n * 10 + (*d - b'0') as i32;
        rest = tail;
    }
    n
}

const KEY: u32 = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const STRING: u32 = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: u32 = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const PURE_TOKEN: u32 = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;

const RO: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
// INSERT, UPDATE and DELETE are mutually exclusive: a grant or a renewal
// updates the lock, a release deletes from it.
const GRANT: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;
const RENEW: u32 = GRANT;
const RELEASE: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE;
const SYNC_KEYS: u32 = GRANT;
/// A command without keys (LOCK.KEEPALIVE): no key spec.
const NO_KEYS: u32 = 0;

struct Arg {
    name: &'static CStr,
    kind: u32,
    token: Option<&'static CStr>,
    optional: bool,
    /// Repeated (`key [key ...]`).
    multiple: bool,
}

const fn arg(name: &'static CStr, kind: u32) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
    }
}

const K: Arg = arg(c"key", KEY);
const OWNER: Arg = arg(c"owner", STRING);
const TTL: Arg = arg(c"ttl", INTEGER);
const WAIT: Arg = Arg {
    name: c"ms",
    kind: INTEGER,
    token: Some(c"WAIT"),
    optional: true,
    multiple: false,
};

struct Doc {
    name: &'static CStr,
    /// The version that added it (`COMMAND DOCS`' `since`).
    since: &'static CStr,
    /// ACL categories where the server supports them (7.2+); `lock`, the
    /// module's own category, is dropped where the server cannot add it.
    acl: &'static CStr,
    summary: &'static CStr,
    complexity: &'static CStr,
    arity: c_int,
    key_flags: u32,
    /// Where its keys are: the first argument, or (LOCK.MACQUIRE) the
    /// number given by the first argument, then that many keys.
    numkeys: bool,
    args: &'static [Arg],
}

const BIND: Arg = Arg {
    name: c"bind",
    kind: PURE_TOKEN,
    token: Some(c"BIND"),
    optional: true,
    multiple: false,
};

const WAITERS: Arg = Arg {
    name: c"waiters",
    kind: PURE_TOKEN,
    token: Some(c"WAITERS"),
    optional: true,
    multiple: false,
};

const GRANT_ARGS: &[Arg] = &[K, OWNER, TTL, WAIT, BIND];
const LIMIT: Arg = arg(c"limit", INTEGER);
const NUMKEYS: Arg = arg(c"numkeys", INTEGER);
const KEYS: Arg = Arg {
    name: c"key",
    kind: KEY,
    token: None,
    optional: false,
    multiple: true,
};

const DOCS: &[Doc] = &[
    Doc {
        name: c"lock.acquire",
        since: c"0.1.0",
        acl: c"write blocking lock",
        summary: c"Acquires an exclusive, non-reentrant lock for ttl milliseconds; returns a fencing token, or nil when the lock is held. WAIT blocks up to ms milliseconds (0: no limit); BIND ends the holder when this connection closes.",
        complexity: c"O(1)",
        arity: -4,
        key_flags: GRANT,
        numkeys: false,
        args: GRANT_ARGS,
    },
    Doc {
        name: c"lock.racquire",
        since: c"0.1.0",
        acl: c"write blocking lock",
        summary: c"Acquires an exclusive, reentrant lock: the holder asking again adds a hold. Returns a fencing token, or nil when the lock is held.",
        complexity: c"O(1)",
        arity: -4,
        key_flags: GRANT,
        numkeys: false,
        args: GRANT_ARGS,
    },
    Doc {
        name: c"lock.read",
        since: c"0.1.0",
        acl: c"write blocking lock",
        summary: c"Acquires the shared (read) side of a read-write lock, reentrant per reader; returns the reader's fencing token, or nil while a writer holds or waits.",
        complexity: c"O(R), R the readers holding the lock",
        arity: -4,
        key_flags: GRANT,
        numkeys: false,
        args: GRANT_ARGS,
    },
    Doc {
        name: c"lock.semaphore",
        since: c"0.2.0",
        acl: c"write blocking lock",
        summary: c"Takes one of limit permits of a semaphore for ttl milliseconds (one per owner, each with its own lease and token); returns the fencing token, or nil when every permit is held. The grant that creates the key fixes its limit.",
        complexity: c"O(P), P the permits held",
        arity: -5,
        key_flags: GRANT,
        numkeys: false,
        args: &[K, LIMIT, OWNER, TTL, WAIT, BIND],
    },
    Doc {
        name: c"lock.macquire",
        since: c"0.2.0",
        acl: c"write blocking lock",
        summary: c"Acquires exclusive locks on numkeys keys, all or none, atomically; returns their fencing tokens in key order, or nil. With WAIT it waits for all of them at once, holding none meanwhile; a wait that would close a cycle is answered DEADLOCK.",
        complexity: c"O(N), N the keys",
        arity: -5,
        key_flags: GRANT,
        numkeys: true,
        args: &[NUMKEYS, KEYS, OWNER, TTL, WAIT, BIND],
    },
    Doc {
        name: c"lock.release",
        since: c"0.1.0",
        acl: c"write fast lock",
        summary: c"Removes one of the owner's holds: 1 when its last hold is gone, 0 when it still holds, nil when it held nothing.",
        complexity: c"O(R + G), R the holders, G the waiters granted as a result",
        arity: 3,
        key_flags: RELEASE,
        numkeys: false,
        args: &[K, OWNER],
    },
    Doc {
        name: c"lock.renew",
        since: c"0.1.0",
        acl: c"write fast lock",
        summary: c"Sets the owner's lease to ttl milliseconds from now (holds unchanged): 1, or 0 when it holds nothing.",
        complexity: c"O(R), R the holders",
        arity: 4,
        key_flags: RENEW,
        numkeys: false,
        args: &[K, OWNER, TTL],
    },
    Doc {
        name: c"lock.info",
        since: c"0.1.0",
        acl: c"read fast lock",
        summary: c"Describes a lock: mode, holders ([owner, holds, ttl-ms-left, token] each) and waiters; with WAITERS, each waiter's owner and ms waited; nil when free.",
        complexity: c"O(R), R the holders; O(R+W) with WAITERS, W the waiters",
        arity: -2,
        key_flags: RO,
        numkeys: false,
        args: &[K, WAITERS],
    },
    Doc {
        name: c"lock.keepalive",
        since: c"0.2.0",
        acl: c"write lock",
        summary: c"Renews every holder bound (BIND) to the calling connection to ttl milliseconds from now; returns how many.",
        complexity: c"O(B), B the holders bound to this connection",
        arity: 2,
        key_flags: NO_KEYS,
        numkeys: false,
        args: &[TTL],
    },
    Doc {
        name: c"lock.sync",
        since: c"0.1.0",
        acl: c"write",
        summary: c"Internal: applies one replicated lock effect (SET owner mode holds token deadline, or DROP owner). Accepted only from the master or the AOF.",
        complexity: c"O(R), R the holders",
        arity: -4,
        key_flags: SYNC_KEYS,
        numkeys: false,
        args: &[K, arg(c"effect", STRING)],
    },
];

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

fn raw_args(args: &[Arg]) -> Vec<raw::RedisModuleCommandArg> {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: an all-zero C struct is its documented "absent" value.
            let mut r: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
            r.name = a.name.as_ptr();
            r.type_ = a.kind;
            r.key_spec_index = if a.kind == KEY { 0 } else { -1 };
            r.token = a.token.map_or(std::ptr::null(), CStr::as_ptr);
            r.flags = if a.optional {
                raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int
            } else {
                raw::REDISMODULE_CMD_ARG_NONE as c_int
            };
            if a.multiple {
                r.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            r
        })
        .collect();
    // SAFETY: as above; the zeroed entry ends the array.
    out.push(unsafe { std::mem::zeroed() });
    out
}

/// One key, the first argument (none for [`NO_KEYS`]); or `numkeys` keys
/// after the first argument, which gives their number.
fn raw_key_specs(flags: u32, numkeys: bool) -> Vec<raw::RedisModuleCommandKeySpec> {
    if flags == NO_KEYS {
        // SAFETY: as above; the zeroed entry ends the (empty) array.
        return vec![unsafe { std::mem::zeroed() }];
    }
    // SAFETY: as above.
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = u64::from(flags);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs = raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
        index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
    };
    if numkeys {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        spec.fk = raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
        };
    } else {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk = raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        };
    }
    // SAFETY: as above; the zeroed entry ends the array.
    vec![spec, unsafe { std::mem::zeroed() }]
}

fn describe_one(ctx: &Context, doc: &Doc) -> Result<(), String> {
    let name = doc.name.to_string_lossy();
    let command = api!(RedisModule_GetCommand(ctx.ctx, doc.name.as_ptr()))
        .filter(|c| !c.is_null())
        .ok_or_else(|| format!("command {name} is not registered"))?;
    let mut args = raw_args(doc.args);
    let mut key_specs = raw_key_specs(doc.key_flags, doc.numkeys);
    // SAFETY: as above.
    let mut info: raw::RedisModuleCommandInfo = unsafe { std::mem::zeroed() };
    info.version = &INFO_VERSION;
    info.summary = doc.summary.as_ptr();
    info.complexity = doc.complexity.as_ptr();
    info.since = doc.since.as_ptr();
    info.arity = doc.arity;
    info.key_specs = key_specs.as_mut_ptr();
    info.args = args.as_mut_ptr();
    // Redis copies what it keeps; the vectors may go when this returns.
    match api!(RedisModule_SetCommandInfo(command, &info)) {
        Some(status) if status != raw::REDISMODULE_OK as c_int => {
            return Err(format!("Redis refused the command info of {name}"));
        }
        // Servers before 7.0 have no command info; the commands still work.
        _ => {}
    }
    set_acl_categories(command, doc);
    Ok(())
}

/// `write fast lock` (say) where the server knows every category; the
/// standard ones alone where it has no `lock` category; nothing on 7.0,
/// which has no ACL categories for module commands. The internal LOCK.SYNC
/// is not in `@lock`.
fn set_acl_categories(command: *mut raw::RedisModuleCommand, doc: &Doc) {
    // SAFETY: reads a function pointer RedisModule_Init filled (or left None).
    if unsafe { raw::RedisModule_SetCommandACLCategories }.is_none() {
        return;
    }
    let wanted = doc.acl.to_string_lossy();
    let standard = wanted.trim_end_matches(" lock");
    for categories in [wanted.as_ref(), standard] {
        let Ok(categories) = std::ffi::CString::new(categories) else {
            continue;
        };
        let status = api!(RedisModule_SetCommandACLCategories(
            command,
            categories.as_ptr()
        ));
        if status == Some(raw::REDISMODULE_OK as c_int) {
            return;
        }
    }
    log::warning(&format!(
        "lock: ACL categories '{standard}' refused for {}",
        doc.name.to_string_lossy()
    ));
}

/// The module's own ACL category, `@lock`, where the server can add one.
fn add_acl_category(ctx: &Context) {
    // SAFETY: reads a function pointer RedisModule_Init filled (or left None).
    if unsafe { raw::RedisModule_AddACLCategory }.is_some()
        && api!(RedisModule_AddACLCategory(ctx.ctx, c"lock".as_ptr()))
            != Some(raw::REDISMODULE_OK as c_int)
    {
        log::warning("lock: could not add the ACL category 'lock'");
    }
}

/// Sets arity, key specs and docs of every command.
pub fn describe(ctx: &Context) -> Status {
    add_acl_category(ctx);
    for doc in DOCS {
        if let Err(e) = describe_one(ctx, doc) {
            log::warning(&format!("lock: {e}"));
            return Status::Err;
        }
    }
    Status::Ok
}
