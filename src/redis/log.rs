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
