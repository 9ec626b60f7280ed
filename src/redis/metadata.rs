//! What each command tells Redis about itself, read from its declaration
//! (`spec::Spec`): arity, key specs and the text of `COMMAND DOCS`, set with
//! `RedisModule_SetCommandInfo` (Redis 7.0+); ACL categories too, where the
//! server has them.
//!
//! Key specs make `COMMAND GETKEYS`, cluster routing and ACL key patterns work.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;
use redis_module::{Context, Status};

use crate::redis::ffi::api;
use crate::redis::log;
use crate::redis::spec::{Arg, ArgKind, Keys, Spec};

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

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

fn raw_kind(kind: ArgKind) -> u32 {
    match kind {
        ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        ArgKind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
    }
}

fn raw_args(args: &[Arg]) -> Vec<raw::RedisModuleCommandArg> {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: an all-zero C struct is its documented "absent" value.
            let mut r: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
            r.name = a.name.as_ptr();
            r.type_ = raw_kind(a.kind);
            r.key_spec_index = if a.kind == ArgKind::Key { 0 } else { -1 };
            r.token = a.token.map_or(std::ptr::null(), CStr::as_ptr);
            r.since = a.since.map_or(std::ptr::null(), CStr::as_ptr);
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

/// The command's key spec (none without keys): the first argument, or
/// `numkeys` keys after the first argument, which gives their number; for a
/// command whose keys only it can find, the first argument, marked
/// incomplete so that Redis asks the command (`getkeys-api`).
fn raw_key_specs(keys: Keys) -> Vec<raw::RedisModuleCommandKeySpec> {
    let (flags, numkeys) = match keys {
        // SAFETY: as above; the zeroed entry ends the (empty) array.
        Keys::None => return vec![unsafe { std::mem::zeroed() }],
        Keys::First(flags) => (flags, false),
        Keys::Counted(flags, _) => (flags, true),
        Keys::FirstAndCalled(flags, _) => (flags | raw::REDISMODULE_CMD_KEY_INCOMPLETE, false),
    };
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

fn describe_one(ctx: &Context, doc: &Spec) -> Result<(), String> {
    let name = doc.name.to_string_lossy();
    let command = api!(RedisModule_GetCommand(ctx.ctx, doc.name.as_ptr()))
        .filter(|c| !c.is_null())
        .ok_or_else(|| format!("command {name} is not registered"))?;
    let mut args = raw_args(doc.args);
    let mut key_specs = raw_key_specs(doc.keys);
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
fn set_acl_categories(command: *mut raw::RedisModuleCommand, doc: &Spec) {
    // SAFETY: reads a function pointer RedisModule_Init filled (or left None).
    if unsafe { raw::RedisModule_SetCommandACLCategories }.is_none() {
        return;
    }
    let wanted = doc.acl_categories();
    let standard = wanted.trim_end_matches(" lock");
    for categories in [wanted.as_str(), standard] {
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
pub fn describe(ctx: &Context, commands: &[Spec]) -> Status {
    add_acl_category(ctx);
    for doc in commands {
        if let Err(e) = describe_one(ctx, doc) {
            log::warning(&format!("lock: {e}"));
            return Status::Err;
        }
    }
    Status::Ok
}
