//! Every error reply the module sends, in one place.

use redis_module::RedisError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockError {
    WrongType,
    /// Missing or extra arguments (Redis checks the arity first; this is the backstop).
    Arity,
    EmptyOwner,
    /// The ttl is not an integer from 1 to the configured maximum (carried here).
    BadTtl(i64),
    /// WAIT is not an integer from 0 to the maximum (carried here).
    BadWait(i64),
    Syntax,
    /// The owner holds the key shared and asked for it exclusively.
    HeldShared,
    /// The owner holds the key exclusively and asked to read it.
    HeldExclusive,
    TooManyHolds,
    /// A semaphore key asked for as a lock.
    IsSemaphore,
    /// A lock key asked for as a semaphore.
    NotSemaphore,
    /// The semaphore exists with this other limit.
    OtherLimit(u32),
    /// The limit is not an integer from 1 to the maximum (carried here).
    BadLimit(u32),
    /// numkeys is not an integer from 1 to the maximum (carried here).
    BadNumkeys(usize),
    /// A key is named twice in one LOCK.MACQUIRE.
    RepeatedKey,
    /// Waiting would close a cycle of waits.
    Deadlock,
    /// The key already has `lock.max-waiters` (carried here) waiting requests.
    TooManyWaiters(i64),
    TokensExhausted,
    /// The lock would pass 4 GiB (owners that long, that many).
    TooLarge,
    /// The lock has `lock.max-holders` (carried here) holders already.
    TooManyHolders(usize),
    /// `BIND` where no connection of the caller's own can hold it.
    BindInScript,
    /// `LOCK.KEEPALIVE` in a script on a server that does not tell the
    /// module which connection runs the script (`script_caller`: none of
    /// those supported).
    KeepaliveInScript,
    /// This server became a replica while the client waited.
    Replica,
    /// The awaited key moved to another node with its slot (cluster MIGRATE).
    Migrating,
    /// `LOCK.SYNC` sent by an ordinary client.
    InternalCommand,
    /// A replicated state that breaks an invariant.
    BadState,
    /// LOCK.GUARD: the owner does not hold the key now (or not under that
    /// token).
    NotHeld,
    /// LOCK.GUARD's key holds another type (worded apart from the called
    /// command's own WRONGTYPE, so that a client can tell which).
    GuardWrongType,
    /// A TOKEN (LOCK.GUARD's, LOCK.RELEASE's, LOCK.RENEW's) is not a
    /// positive integer.
    BadToken,
    /// LOCK.GUARD asked to run what it may not (what it is, carried here).
    NotGuardable(Unguardable),
    /// LOCK.GUARD: the caller's ACL user may not run the command (Redis's
    /// reason carried here: it names no user data).
    NoPerm(&'static str),
    /// `SESSION id` names a session that ended or never existed here.
    NoSession,
    /// `LOCK.SESSION OPEN` past `lock.max-sessions` (carried here).
    TooManySessions(usize),
    /// A session id that is not a positive integer.
    BadSession,
    /// A bug caught before it could reach Redis (the log has the details).
    Internal,
}

/// What LOCK.GUARD refuses to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unguardable {
    /// BLPOP, XREAD and the rest: one atomic step cannot wait.
    Blocking,
    /// MULTI, EXEC, WATCH, DISCARD, EVAL, ...: what a script may not run.
    NoScript,
    /// Another LOCK.GUARD.
    Guard,
    /// A lock command with WAIT.
    Wait,
}

impl LockError {
    pub fn message(self) -> String {
        match self {
            LockError::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            }
            LockError::Arity => "ERR wrong number of arguments".into(),
            LockError::EmptyOwner => "ERR owner must not be empty".into(),
            LockError::BadTtl(max) => format!("ERR ttl must be an integer from 1 to {max}"),
            LockError::BadWait(max) => format!("ERR WAIT must be an integer from 0 to {max}"),
            LockError::Syntax => "ERR syntax error".into(),
            LockError::HeldShared => {
                "ERR owner holds this lock shared: release it before acquiring it exclusively"
                    .into()
            }
            LockError::HeldExclusive => {
                "ERR owner holds this lock exclusively: release it before reading it".into()
            }
            LockError::TooManyHolds => "ERR owner has too many holds on this lock".into(),
            LockError::IsSemaphore => {
                "ERR this key is a semaphore: use LOCK.SEMAPHORE (or release its holders first)"
                    .into()
            }
            LockError::NotSemaphore => {
                "ERR this key is a lock, not a semaphore (release its holders first)".into()
            }
            LockError::OtherLimit(limit) => {
                format!("ERR this semaphore's limit is {limit}: the grant that created it set it")
            }
            LockError::BadLimit(max) => format!("ERR limit must be an integer from 1 to {max}"),
            LockError::BadNumkeys(max) => {
                format!("ERR numkeys must be an integer from 1 to {max}, and that many keys given")
            }
            LockError::RepeatedKey => "ERR a key is named twice".into(),
            LockError::Deadlock => {
                "DEADLOCK waiting would close a cycle of lock waits: nothing was changed".into()
            }
            LockError::TooManyWaiters(max) => {
                format!("ERR too many clients wait for this lock (lock.max-waiters is {max})")
            }
            LockError::BindInScript => {
                "ERR BIND is not allowed in scripts and functions: they have no connection of their own"
                    .into()
            }
            LockError::KeepaliveInScript => {
                "ERR LOCK.KEEPALIVE in a script or function: this server does not tell the module which connection runs the script (see the log); call it outside the script"
                    .into()
            }
            LockError::Replica => "READONLY You can't write against a read only replica.".into(),
            LockError::Migrating => {
                "TRYAGAIN the lock moved with its slot to another node: retry the request".into()
            }
            LockError::TokensExhausted => "ERR no fencing token left to issue".into(),
            LockError::TooLarge => "ERR the lock would pass 4 GiB: nothing was changed".into(),
            LockError::TooManyHolders(max) => format!(
                "ERR this lock has as many holders as a lock may have (lock.max-holders is {max}): nothing was changed"
            ),
            LockError::InternalCommand => {
                "ERR LOCK.SYNC is internal: accepted only from the master or the AOF".into()
            }
            LockError::BadState => "ERR invalid lock state".into(),
            LockError::NotHeld => {
                "NOTHELD the owner does not hold this lock (or not under this token): nothing was run"
                    .into()
            }
            LockError::BadToken => "ERR TOKEN must be a positive integer".into(),
            LockError::GuardWrongType => {
                "WRONGTYPE LOCK.GUARD's key holds another type, not a lock: nothing was run".into()
            }
            LockError::NotGuardable(what) => format!(
                "ERR LOCK.GUARD cannot run {}: nothing was run",
                match what {
                    Unguardable::Blocking => "a blocking command",
                    Unguardable::NoScript => "a command that scripts may not run",
                    Unguardable::Guard => "another LOCK.GUARD",
                    Unguardable::Wait => "a lock command with WAIT",
                }
            ),
            LockError::NoPerm(why) => format!("NOPERM {why}"),
            LockError::NoSession => {
                "NOSESSION no such session: it ended or was never opened on this server: nothing was changed"
                    .into()
            }
            LockError::TooManySessions(max) => format!(
                "ERR too many sessions are open (lock.max-sessions is {max}): nothing was changed"
            ),
            LockError::BadSession => "ERR session id must be a positive integer".into(),
            LockError::Internal => {
                "ERR internal error in the lock module (see the server log)".into()
            }
        }
    }
}

impl From<LockError> for RedisError {
    fn from(e: LockError) -> Self {
        RedisError::String(e.message())
    }
}
