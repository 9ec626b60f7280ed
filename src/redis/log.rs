//! Writing to the server's log, safely whatever the text holds.
//!
//! The `redis-module` crate's logging passes the message as a printf format
//! (a `%` in it reads arguments that do not exist) and panics on a NUL byte.
//! Messages here often quote what a client or a config file sent, so they go
//! through `"%s"`, with NUL bytes shown as `\0`.

use std::ffi::CString;

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

/// Every kind, for [`flush_throttled`].
static KINDS: [&Throttled; 7] = [
    &RESTORE_REFUSED,
    &LOAD_DROPPED,
    &LOAD_CLAMPED,
    &LOAD_CROWDED,
    &LOAD_COUNTER,
    &AOF_DROPPED,
    &AOF_CLAMPED,
];

/// Writes the counted lines that are due (the server's cron, several times
/// a second): a burst's count is logged within about a second of its end.
pub fn flush_throttled() {
    for kind in KINDS {
        kind.flush();
    }
}
