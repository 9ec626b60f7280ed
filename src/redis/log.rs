//! Writing to the server's log, safely whatever the text holds.
//!
//! The `redis-module` crate's logging passes the message as a printf format
//! (a `%` in it reads arguments that do not exist) and panics on a NUL byte.
//! Messages here often quote what a client or a config file sent, so they go
//! through `"%s"`, with NUL bytes shown as `\0`.

use std::ffi::CString;

use redis_module::raw;

use crate::redis::ffi::api;

/// Logs `message` at the `warning` level.
pub fn warning(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    api!(RedisModule_Log(
        std::ptr::null_mut(),
        c"warning".as_ptr(),
        c"%s".as_ptr(),
        text.as_ptr()
    ));
}

/// `bytes` as printable text for a log line (invalid UTF-8 replaced, NUL shown
/// as `\0`): for quoting user data, never for handling it.
pub fn quoted(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\0', "\\0")
}

/// One kind of refused input (a `RESTORE` payload, a lock a load fixed, an
/// effect from a file): logged at most one line a second, each line with
/// the count of this kind since the line before it and the latest's
/// detail, so that no client can flood the log (contract v4, "Limits and
/// forged state"). The first of a kind after a quiet second is logged at
/// once; the rest of that second are counted, and their line comes with
/// the next one after the second is up, or from the server's cron
/// ([`flush_throttled`]) when none comes.
pub struct Throttled {
    what: &'static str,
    state: std::sync::Mutex<Unlogged>,
}

struct Unlogged {
    /// When the last line of this kind was written.
    last_line: Option<std::time::Instant>,
    /// How many were refused since, and the latest one's detail.
    count: u64,
    latest: String,
}

/// The most often a kind gets a line.
const THROTTLE: std::time::Duration = std::time::Duration::from_secs(1);

impl Throttled {
    const fn new(what: &'static str) -> Throttled {
        Throttled {
            what,
            state: std::sync::Mutex::new(Unlogged {
                last_line: None,
                count: 0,
                latest: String::new(),
            }),
        }
    }

    /// One more of this kind (`detail`: what was wrong with it): a line now
    /// if none was written in the last second, else counted for the next.
    pub fn warn(&self, detail: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.count = state.count.saturating_add(1);
        state.latest.clear();
        state.latest.push_str(detail);
        self.line_if_due(&mut state);
    }

    /// The line of what was counted, if a second has passed since the last.
    fn flush(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.count > 0 {
            self.line_if_due(&mut state);
        }
    }

    fn line_if_due(&self, state: &mut Unlogged) {
        let now = std::time::Instant::now();
        if state
            .last_line
            .is_some_and(|at| now.duration_since(at) < THROTTLE)
        {
            // Counted: its line comes with the next, or from a timer a
            // second from now (nothing runs periodically).
            flush_later();
            return;
        }
        warning(&format!(
            "lock: {}: {} (count since the last such line: {}; at most one line a second)",
            self.what, state.latest, state.count
        ));
        state.last_line = Some(now);
        state.count = 0;
    }
}

/// `RESTORE` payloads refused (state no server can have made).
pub static RESTORE_REFUSED: Throttled = Throttled::new("refused a RESTORE payload");
/// A loaded lock dropped (state no server can have made).
pub static LOAD_DROPPED: Throttled =
    Throttled::new("dropped a loaded lock no server can have made; the rest of the load goes on");
/// Loaded leases clamped to `lock.max-ttl`.
pub static LOAD_CLAMPED: Throttled = Throttled::new("a loaded lease ended past lock.max-ttl");
/// Loaded locks past `lock.max-holders`, kept.
pub static LOAD_CROWDED: Throttled =
    Throttled::new("a loaded lock is past lock.max-holders: kept as it is");
/// A saved token counter past the bound, clamped.
pub static LOAD_COUNTER: Throttled =
    Throttled::new("a saved token counter no server can have reached");
/// Effects from the AOF refused (a token no server can have issued).
pub static AOF_DROPPED: Throttled =
    Throttled::new("dropped an AOF effect with a token no server can have issued");
/// Leases from the AOF clamped to `lock.max-ttl`.
pub static AOF_CLAMPED: Throttled = Throttled::new("an AOF lease ended past lock.max-ttl");
/// Loaded holders of a session the server does not have (a RESTORE, or a
/// file without its sessions): each keeps the saved deadline as its lease.
pub static LOAD_SESSION_GONE: Throttled = Throttled::new(
    "loaded holder(s) followed a session this server does not have: each keeps the session's deadline at the save as its own lease",
);
/// A saved session with an id no server can have issued, dropped.
pub static LOAD_SESSION_DROPPED: Throttled =
    Throttled::new("dropped a saved session with an id no server can have issued");
/// A session from the AOF with an id no server can have issued, dropped.
pub static AOF_SESSION_DROPPED: Throttled =
    Throttled::new("dropped an AOF session with an id no server can have issued");
/// A session from the AOF ending past `lock.max-ttl`, clamped.
pub static AOF_SESSION_CLAMPED: Throttled =
    Throttled::new("an AOF session ended past lock.max-ttl");

/// Every kind, for [`flush_throttled`].
static KINDS: [&Throttled; 11] = [
    &RESTORE_REFUSED,
    &LOAD_DROPPED,
    &LOAD_CLAMPED,
    &LOAD_CROWDED,
    &LOAD_COUNTER,
    &AOF_DROPPED,
    &AOF_CLAMPED,
    &LOAD_SESSION_GONE,
    &LOAD_SESSION_DROPPED,
    &AOF_SESSION_DROPPED,
    &AOF_SESSION_CLAMPED,
];

/// The module's own context, for the flush timer (set once at load).
static OWN_CTX: std::sync::atomic::AtomicPtr<raw::RedisModuleCtx> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
/// Whether the flush timer is armed.
static FLUSH_ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Gives the log the module's own context (`events::own_ctx`), for the
/// timer that writes counted lines.
pub fn init(ctx: *mut raw::RedisModuleCtx) {
    OWN_CTX.store(ctx, std::sync::atomic::Ordering::Relaxed);
}

/// Arms the timer that writes the counted lines a second from now, once.
fn flush_later() {
    use std::sync::atomic::Ordering;
    let ctx = OWN_CTX.load(Ordering::Relaxed);
    if ctx.is_null() || FLUSH_ARMED.swap(true, Ordering::Relaxed) {
        return;
    }
    let ms = i64::try_from(THROTTLE.as_millis()).unwrap_or(1000);
    let armed = api!(RedisModule_CreateTimer(
        ctx,
        ms,
        Some(on_flush),
        std::ptr::null_mut()
    ));
    if armed.is_none() {
        FLUSH_ARMED.store(false, Ordering::Relaxed);
    }
}

extern "C" fn on_flush(_ctx: *mut raw::RedisModuleCtx, _data: *mut std::os::raw::c_void) {
    // No panic can happen here (locks taken as they are, no indexing).
    FLUSH_ARMED.store(false, std::sync::atomic::Ordering::Relaxed);
    flush_throttled();
}

/// Writes the counted lines that are due (a timer armed when a line was
/// counted instead of written): a burst's count is logged within about a
/// second of its end.
pub fn flush_throttled() {
    for kind in KINDS {
        kind.flush();
    }
}
