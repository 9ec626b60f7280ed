//! The bottom layer: calling the Redis module API without panicking, and the
//! few conversions every layer needs. Imports nothing from the crate.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lock_core::hash::Keyed;

use redis_module::{raw, Context, RedisString};

/// Calls a Redis module API entry, or yields `None` when the server lacks it.
///
/// Every use passes handles that are alive for the call, and pointers into
/// memory the caller owns for the call's duration. Contexts, keys and IOs are
/// the ones Redis passed to the callback that makes the call. A
/// blocked-client handle is different: it outlives any callback and stays
/// valid only until the module's one `RM_UnblockClient` on it; the waiting
/// registry (`waiting.rs`) hands each handle out exactly once (`take`), and
/// only the holder of a taken handle calls `RM_UnblockClient`, so no call
/// uses a handle after that.
macro_rules! api {
    ($f:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: the entry was filled by RedisModule_Init (or is None); the
        // arguments are live handles and buffers, as the macro's doc says
        // (blocked-client handles: alive until their one RM_UnblockClient).
        match unsafe { redis_module::raw::$f } {
            Some(f) => Some(unsafe { f($($arg),*) }),
            None => None,
        }
    };
}
pub(crate) use api;

/// The module API entries every command calls, each there in every server
/// this module supports (Redis 7.0 on): [`required_api_missing`] checks them
/// once, at load, and the module refuses to load without one. [`call`]
/// calls only these (a name not listed here does not compile), without a
/// check per call.
macro_rules! required_api {
    ($($f:ident),* $(,)?) => {
        /// One marker per entry [`call`] may call.
        #[allow(non_upper_case_globals, dead_code)]
        pub mod required {
            $(pub const $f: () = ();)*
        }

        /// The first required entry the server did not fill, if any.
        pub fn required_api_missing() -> Option<&'static str> {
            // SAFETY: reads of entries RedisModule_Init filled (or left
            // empty); nothing writes them after it.
            $(if unsafe { redis_module::raw::$f }.is_none() {
                return Some(stringify!($f));
            })*
            None
        }
    };
}

required_api!(
    RedisModule_OpenKey,
    RedisModule_CloseKey,
    RedisModule_KeyType,
    RedisModule_ModuleTypeGetType,
    RedisModule_ModuleTypeGetValue,
    RedisModule_ModuleTypeSetValue,
    RedisModule_ModuleTypeReplaceValue,
    RedisModule_DeleteKey,
    RedisModule_SetAbsExpire,
    RedisModule_StringPtrLen,
    RedisModule_StringToLongLong,
    RedisModule_ReplyWithLongLong,
    RedisModule_ReplyWithNull,
    RedisModule_Replicate,
    RedisModule_ReplicateVerbatim,
    RedisModule_NotifyKeyspaceEvent,
);

/// Calls a required module API entry ([`required_api!`]): there, checked at
/// load, so no check (and no `Option`) per call. The arguments are as
/// [`api!`]'s.
macro_rules! call {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        // Only entries checked at load.
        let () = $crate::redis::ffi::required::$f;
        // SAFETY: `required_api_missing` found the entry filled when the
        // module loaded (it refuses to load otherwise) and nothing empties
        // it after; the arguments are live handles and buffers, as `api!`'s
        // doc says.
        match unsafe { redis_module::raw::$f } {
            Some(f) => unsafe { f($($arg),*) },
            None => unsafe { std::hint::unreachable_unchecked() },
        }
    }};
}
pub(crate) use call;

/// A key in one database: the same name in two databases is two locks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DbKey {
    pub db: i32,
    pub name: Vec<u8>,
}

impl DbKey {
    pub fn new(db: i32, name: &[u8]) -> DbKey {
        DbKey {
            db,
            name: name.to_vec(),
        }
    }
}

/// A key looked up by its database and name, borrowed: a map of [`DbKey`]s
/// answers `(db, &name)` without the name being copied
/// (`map.contains_key(&(db, name) as &dyn KeyRef)`).
pub trait KeyRef {
    fn db(&self) -> i32;
    fn name(&self) -> &[u8];
}

impl KeyRef for DbKey {
    fn db(&self) -> i32 {
        self.db
    }
    fn name(&self) -> &[u8] {
        &self.name
    }
}

impl KeyRef for (i32, &[u8]) {
    fn db(&self) -> i32 {
        self.0
    }
    fn name(&self) -> &[u8] {
        self.1
    }
}

impl<'a> Borrow<dyn KeyRef + 'a> for DbKey {
    fn borrow(&self) -> &(dyn KeyRef + 'a) {
        self
    }
}

// As `DbKey`'s derived `Hash` and `Eq`: its database, then its name.
impl Hash for dyn KeyRef + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.db().hash(state);
        self.name().hash(state);
    }
}

impl PartialEq for dyn KeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.db() == other.db() && self.name() == other.name()
    }
}

impl Eq for dyn KeyRef + '_ {}

/// A map by key that the fast paths ask on every lock command of a busy
/// server (is anyone waiting for this key, is its visit planned): hashed
/// by [`Keyed`] (clients choose key names; about a fifth of `HashMap`'s
/// default hash of a short key).
/// Sharded: clients make it as big as they like, and it grows a shard at a
/// time ([`lock_core::shards`]).
pub type DbKeyMap<V> = lock_core::shards::Sharded<DbKey, V, Keyed>;

/// A key set's filter, readable without the set's lock: a bit per hash of a
/// key's database and name ([`KeyAt`], keyed as [`Keyed`]), set when a key joins the set,
/// all cleared when the set is emptied. No bit: the key is not in the set,
/// for certain; a bit: it may be (the set itself then answers). The fast
/// paths ask it before they lock the waiting registry or the timer's index.
pub struct KeyFilter {
    bits: [AtomicU64; KeyFilter::WORDS],
    dirty: AtomicBool,
}

impl KeyFilter {
    /// 65,536 bits (8 KiB): with 10,000 keys in the set, one key of seven
    /// not in it is looked up for nothing; emptying it is 1,024 stores,
    /// once per emptied set.
    const WORDS: usize = 1024;

    pub const fn new() -> KeyFilter {
        KeyFilter {
            bits: [const { AtomicU64::new(0) }; KeyFilter::WORDS],
            dirty: AtomicBool::new(false),
        }
    }

    fn bit(key: &KeyAt<'_>) -> (usize, u64) {
        ((key.hash >> 54) as usize, 1 << (key.hash & 63))
    }

    /// `(db, name)` joins the set.
    pub fn insert(&self, db: i32, name: &[u8]) {
        let (word, bit) = KeyFilter::bit(&KeyAt::new(db, name));
        if let Some(w) = self.bits.get(word) {
            w.fetch_or(bit, Ordering::Relaxed);
        }
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Whether `key` may be in the set.
    #[inline]
    pub fn may_contain(&self, key: &KeyAt<'_>) -> bool {
        let (word, bit) = KeyFilter::bit(key);
        self.bits
            .get(word)
            .is_some_and(|w| w.load(Ordering::Relaxed) & bit != 0)
    }

    /// Every key may be in the set from now on (until [`KeyFilter::clear`]):
    /// its keys moved in a way the bits cannot follow (`SWAPDB`).
    pub fn fill(&self) {
        for w in &self.bits {
            w.store(u64::MAX, Ordering::Relaxed);
        }
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// The set is empty.
    pub fn clear(&self) {
        if self.dirty.swap(false, Ordering::Relaxed) {
            for w in &self.bits {
                w.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// A key by database and name, with its hash for [`KeyFilter`] (made once
/// for every filter a fast path asks): one multiply per eight bytes of the
/// name, no call.
pub struct KeyAt<'a> {
    pub db: i32,
    pub name: &'a [u8],
    hash: u64,
}

impl<'a> KeyAt<'a> {
    pub fn new(db: i32, name: &'a [u8]) -> KeyAt<'a> {
        let mut h = Keyed::default().build_hasher();
        h.write_u64(u64::from(db as u32) ^ ((name.len() as u64) << 32));
        h.write(name);
        KeyAt {
            db,
            name,
            hash: h.finish(),
        }
    }
}

/// The calling client's database.
pub fn selected_db(ctx: &Context) -> i32 {
    api!(RedisModule_GetSelectedDb(ctx.ctx)).unwrap_or(0)
}

/// `key` in the calling client's database.
pub fn db_key(ctx: &Context, key: &[u8]) -> DbKey {
    DbKey::new(selected_db(ctx), key)
}

/// Runs `f`, which may select other databases (`select_db`), and then
/// selects the calling client's own again (a panic in `f` too).
pub fn keeping_db<T>(ctx: &Context, f: impl FnOnce() -> T) -> T {
    struct Home<'c>(&'c Context, i32);
    impl Drop for Home<'_> {
        fn drop(&mut self) {
            select_db(self.0, self.1);
        }
    }
    let _home = Home(ctx, selected_db(ctx));
    f()
}

/// Selects database `db` for the context's client; false when Redis refuses.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    api!(RedisModule_SelectDb(ctx.ctx, db)) == Some(raw::REDISMODULE_OK as c_int)
}

/// A key name as a module string, binary-safe (NUL bytes included), freed on drop.
pub fn name(ctx: &Context, key: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx.ctx, key)
}

/// A count or a token as a reply integer: saturating at `i64::MAX`.
pub fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// A module string Redis owns for the length of a call (a command's
/// argument, a key name it passed): borrowed, never retained or freed here.
#[derive(Clone, Copy)]
pub struct Str<'a> {
    ptr: *mut raw::RedisModuleString,
    life: std::marker::PhantomData<&'a raw::RedisModuleString>,
}

impl<'a> Str<'a> {
    /// The string at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` is a live module string for all of `'a` (Redis passed it to the
    /// running callback, or a `RedisString` that outlives `'a` holds it).
    pub unsafe fn from_raw(ptr: *mut raw::RedisModuleString) -> Str<'a> {
        Str {
            ptr,
            life: std::marker::PhantomData,
        }
    }

    pub fn raw(self) -> *mut raw::RedisModuleString {
        self.ptr
    }

    /// Its bytes, binary-safe.
    pub fn as_slice(self) -> &'a [u8] {
        let mut len = 0usize;
        let p = call!(RedisModule_StringPtrLen(self.ptr, &mut len));
        if p.is_null() {
            return &[];
        }
        // SAFETY: Redis returns the string's buffer and its length; the
        // string lives for 'a.
        unsafe { std::slice::from_raw_parts(p.cast(), len) }
    }

    /// The integer it spells, as Redis parses one (`RM_StringToLongLong`).
    pub fn parse_integer(self) -> Option<i64> {
        let mut n: std::os::raw::c_longlong = 0;
        let status = call!(RedisModule_StringToLongLong(self.ptr, &mut n));
        (status == raw::REDISMODULE_OK as c_int).then_some(n)
    }
}

/// Whether [`name_of`] reads a name in place: set at load by
/// [`learn_string_layout`] once strings the server made, of every length
/// class, read so gave what `RM_StringPtrLen` gives.
static IN_PLACE: AtomicBool = AtomicBool::new(false);

/// The bytes of a key name Redis passed a callback, binary-safe: read in
/// place when the server's strings were seen to be laid out as Redis 7.0
/// to 8.x and Valkey lay them (a 4-bit type and 4-bit encoding, then the
/// buffer's address at offset 8; an `sds` buffer whose header byte before
/// it gives the length): a string, raw or embedded, of up to 65,535
/// bytes; `RM_StringPtrLen` for any other (19 instructions of Redis's:
/// the keyspace callback's price on every other key's write).
#[inline(always)]
pub fn name_of<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    if in_place_ok() {
        // SAFETY: `s` is a live string Redis passed (`Str`'s contract); the
        // layout read was checked at load (`learn_string_layout`).
        if let Some(name) = unsafe { in_place(s) }.or_else(|| unsafe { in_place_other(s) }) {
            return name;
        }
    } else if VALKEY_IN_PLACE.load(Ordering::Relaxed) {
        // SAFETY: as above, Valkey's layout checked at load.
        if let Some(name) = unsafe { in_place_valkey_out_of_line(s) } {
            return name;
        }
    }
    // SAFETY: as above.
    unsafe { Str::from_raw(s.cast_mut()) }.as_slice()
}

/// Whether [`in_place`] may read this server's strings.
pub fn in_place_ok() -> bool {
    IN_PLACE.load(Ordering::Relaxed)
}

/// A way to read the strings Redis passes a callback, chosen once at load
/// ([`strings`]) for the callback that runs on every other key's write
/// (the keyspace callback): it is registered as the one built for this
/// server's layout, so its reads are inline with no test of the layout a
/// call.
pub trait Strings {
    /// `s`'s bytes, or `None` for a string this reader leaves to
    /// [`name_of`] (no call of Redis's when read in place).
    ///
    /// # Safety
    ///
    /// `s` is a live string object of a server [`strings`] chose this
    /// reader for.
    unsafe fn name<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]>;

    /// `f` of `s`'s bytes (their address and length, and whether they lie
    /// inside the string object after at least 8 bytes of it, an embedded
    /// string's: the 8 bytes before their end may be read), or `None` as
    /// [`name`]: for a look inline in each of the reader's branches (no
    /// length carried from one to the next).
    ///
    /// # Safety
    ///
    /// As [`Strings::name`]'s.
    ///
    /// [`name`]: Strings::name
    #[inline(always)]
    unsafe fn with_name<R>(
        s: *const raw::RedisModuleString,
        f: impl FnOnce(*const u8, usize, bool) -> R,
    ) -> Option<R> {
        // SAFETY: the caller's.
        unsafe { Self::name(s) }.map(|n| f(n.as_ptr(), n.len(), false))
    }
}

/// Redis 7.0 to 8.x's strings ([`in_place`]).
pub struct RedisStrings;

/// Valkey 8.1 on's strings ([`in_place_valkey`]).
pub struct ValkeyStrings;

/// Strings not read in place: through `RM_StringPtrLen`.
pub struct StringsByCall;

impl Strings for RedisStrings {
    #[inline(always)]
    unsafe fn name<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
        // SAFETY: the caller's.
        unsafe { in_place(s) }
    }

    #[inline(always)]
    unsafe fn with_name<R>(
        s: *const raw::RedisModuleString,
        f: impl FnOnce(*const u8, usize, bool) -> R,
    ) -> Option<R> {
        // SAFETY: as `in_place`, whose reads these are, `f` in each branch.
        // An embedded string (encoding 8: the low byte 0x80) has its bytes
        // after the object's 16 bytes and its `sds` header.
        unsafe {
            let head = s.cast::<u8>();
            let low = *head;
            if low & 0x7f != 0 {
                return None;
            }
            let inside = low == 0x80;
            let buf = head.add(8).cast::<*const u8>().read_unaligned();
            let kind = *buf.sub(1);
            if kind == 1 {
                Some(f(buf, usize::from(*buf.sub(3)), inside))
            } else if kind & 7 == 0 {
                Some(f(buf, usize::from(kind >> 3), inside))
            } else {
                None
            }
        }
    }
}

impl Strings for ValkeyStrings {
    #[inline(always)]
    unsafe fn name<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
        // SAFETY: the caller's.
        unsafe { in_place_valkey(s) }
    }

    #[inline(always)]
    unsafe fn with_name<R>(
        s: *const raw::RedisModuleString,
        f: impl FnOnce(*const u8, usize, bool) -> R,
    ) -> Option<R> {
        // SAFETY: as `in_place_valkey`, whose reads these are: an embedded
        // name (a request's) with `f` in its own branch, the rest read so.
        // The header's bits 32 to 34 alone tell an embedded value (only a
        // string embeds one: the type is not looked at): `hasembval` set and
        // `hasembkey` clear, after the header, and after the expiry's room
        // when `hasexpire` is set (Valkey 9.1 gives it to a name whose
        // allocation has the room): one byte read, its bits as an offset.
        unsafe {
            let head = s.cast::<u8>();
            let bits = *head.add(4);
            if bits & 6 != 4 {
                return in_place_valkey(s).map(|n| f(n.as_ptr(), n.len(), false));
            }
            let hdr = head.add(8 + 8 * usize::from(bits & 1));
            if *hdr.add(2) != 1 {
                return None;
            }
            // (Its bytes after the 8-byte header and the `sds` header.)
            Some(f(hdr.add(3), usize::from(*hdr), true))
        }
    }
}

impl Strings for StringsByCall {
    #[inline(always)]
    unsafe fn name<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
        Some(name_of(s))
    }
}

/// Which [`Strings`] reader this server's strings take (known once
/// [`learn_string_layout`] ran).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    Redis,
    Valkey,
    ByCall,
}

/// This server's [`Layout`].
pub fn strings() -> Layout {
    if in_place_ok() {
        Layout::Redis
    } else if VALKEY_IN_PLACE.load(Ordering::Relaxed) {
        Layout::Valkey
    } else {
        Layout::ByCall
    }
}

/// What `dladdr` tells of an address (glibc's `Dl_info`).
#[repr(C)]
struct DlInfo {
    fname: *const std::os::raw::c_char,
    fbase: *mut std::os::raw::c_void,
    sname: *const std::os::raw::c_char,
    saddr: *mut std::os::raw::c_void,
}

/// The start of glibc's `Elf64_Sym`, as `dladdr1` gives it: the symbol's
/// value and size.
#[repr(C)]
struct ElfSym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// `dladdr1`'s flag for the symbol's table entry (glibc's `RTLD_DL_SYMENT`).
const RTLD_DL_SYMENT: c_int = 1;

extern "C" {
    fn dladdr(addr: *const std::os::raw::c_void, info: *mut DlInfo) -> c_int;
    fn dladdr1(
        addr: *const std::os::raw::c_void,
        info: *mut DlInfo,
        extra: *mut *const ElfSym,
        flags: c_int,
    ) -> c_int;
    fn dlsym(
        handle: *mut std::os::raw::c_void,
        name: *const std::os::raw::c_char,
    ) -> *mut std::os::raw::c_void;
}

/// The base address of the object `p` lies in (the server's executable, a
/// module, a library), if any: `None` for the heap or a stack.
fn image_of(p: *const std::os::raw::c_void) -> Option<*mut std::os::raw::c_void> {
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    // SAFETY: `dladdr` reads no memory at `p` (it compares the address with
    // the loaded objects' ranges) and writes `info` only.
    let found = unsafe { dladdr(p, &mut info) } != 0;
    (found && !info.fbase.is_null()).then_some(info.fbase)
}

/// Whether `p` lies in the server's own executable (where the module API's
/// entries are): the event names Redis passes a keyspace callback are
/// literals there, whose bytes never change, so one such address seen to
/// hold a name holds it for as long as the server runs (another module's
/// names, which may be built in memory that is freed and reused, are not).
pub fn in_server_image(p: *const std::os::raw::c_char) -> bool {
    // SAFETY: reading an entry RedisModule_Init filled (or left empty).
    let Some(entry) = (unsafe { raw::RedisModule_StringPtrLen }) else {
        return false;
    };
    let server = image_of(entry as *const std::os::raw::c_void);
    server.is_some() && server == image_of(p.cast())
}

/// The server's global state (`struct redisServer server`, Valkey's
/// `struct valkeyServer server`), as its words: its address and how many
/// there are, when the server's executable exports it (Redis and Valkey
/// link with `-rdynamic`) with its size; `None` otherwise, or when the
/// symbol found lies outside the server's executable.
pub fn server_global() -> Option<(*const u64, usize)> {
    // SAFETY: `dlsym` with glibc's RTLD_DEFAULT (null) looks the name up in
    // the process's global scope, the executable first; it reads no memory
    // of the object.
    let found = unsafe { dlsym(std::ptr::null_mut(), c"server".as_ptr()) };
    if found.is_null() || !in_server_image(found.cast()) {
        return None;
    }
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    let mut sym: *const ElfSym = std::ptr::null();
    // SAFETY: `dladdr1` writes `info` and `sym` only; `sym` then points at
    // the symbol table entry in the executable's mapped image.
    let done = unsafe { dladdr1(found, &mut info, &mut sym, RTLD_DL_SYMENT) } != 0;
    if !done || sym.is_null() || info.saddr != found {
        return None;
    }
    let size = usize::try_from(unsafe { (*sym).size }).ok()?;
    (found.align_offset(8) == 0 && size >= 8).then_some((found.cast_const().cast(), size / 8))
}

/// The server's client behind a command's context (`RedisModuleCtx`'s
/// third field, `client`, after the API table's entry and the module, in
/// every server since Redis 4 and in Valkey): an address only, never read
/// here.
pub fn ctx_client(ctx: *mut raw::RedisModuleCtx) -> *const u64 {
    if ctx.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a live context the server built, whose first three fields
    // are pointers.
    unsafe { ctx.cast::<*const u64>().add(2).read() }
}

/// `s`'s bytes read from its object and its `sds` header, for the
/// headers a name of up to 255 bytes Redis makes from a request has
/// (`sdshdr8`: len, alloc, kind; Redis 8: `sdshdr5` for the shortest);
/// `None` for an encoding or header kind not read here (no call: the
/// keyspace callback's fast path).
///
/// # Safety
///
/// `s` is a live string object of a server whose layout
/// [`learn_string_layout`] accepted ([`in_place_ok`]).
#[inline(always)]
pub unsafe fn in_place<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
    let head = s.cast::<u8>();
    // Type 0 (a string) in the low nibble, encoding 0 (raw) or 8
    // (embedded) in the high one.
    if unsafe { *head } & 0x7f != 0 {
        return None;
    }
    let buf = unsafe { head.add(8).cast::<*const u8>().read_unaligned() };
    let kind = unsafe { *buf.sub(1) };
    // sdshdr8 (Redis 7's names, its flags' upper bits unused) first: one
    // compare.
    let len = if kind == 1 {
        unsafe { *buf.sub(3) }
    } else if kind & 7 == 0 {
        // sdshdr5 (Redis 8's short strings): the length in the kind
        // byte's upper five bits.
        kind >> 3
    } else {
        return None;
    };
    Some(unsafe { std::slice::from_raw_parts(buf, usize::from(len)) })
}

/// [`in_place`] for the other `sds` header read in place (`sdshdr16`).
///
/// # Safety
///
/// As [`in_place`]'s.
#[inline(never)]
unsafe fn in_place_other<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
    let head = s.cast::<u8>();
    if unsafe { *head } & 0x7f != 0 {
        return None;
    }
    let buf = unsafe { head.add(8).cast::<*const u8>().read_unaligned() };
    let kind = unsafe { *buf.sub(1) };
    let len = match kind & 7 {
        // sdshdr16: len, alloc (two bytes each), kind.
        2 => usize::from(unsafe { buf.sub(5).cast::<u16>().read_unaligned() }),
        _ => return None,
    };
    Some(unsafe { std::slice::from_raw_parts(buf, len) })
}

/// Whether [`name_of`] reads a name in place from Valkey's string objects
/// ([`in_place_valkey`]): set at load as [`IN_PLACE`] is, on a server
/// whose strings [`in_place`] does not read.
static VALKEY_IN_PLACE: AtomicBool = AtomicBool::new(false);

/// `s`'s bytes read in place from a string object laid out as Valkey 8.1
/// on lays it out (`objectGetVal`): a 64-bit header whose low byte holds
/// the type and encoding as Redis's does, bit 32 `hasexpire`, bit 33
/// `hasembkey`, bit 34 `hasembval`; then either the value's `sds` embedded
/// after the header and the expiry's 8 bytes if there are (an `sdshdr8`:
/// length, room, kind; Valkey 9.1 gives short strings the room for an
/// expiry), or the buffer's address. `None` for anything else (a key
/// embedded before the value, another header kind): `RM_StringPtrLen`
/// reads those.
///
/// # Safety
///
/// `s` is a live string object of a server whose layout
/// [`learn_string_layout`] accepted for this reader.
#[inline(always)]
unsafe fn in_place_valkey<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
    let head = s.cast::<u8>();
    let word = unsafe { head.cast::<u64>().read_unaligned() };
    if word & 0x7f != 0 || (word >> 33) & 1 != 0 {
        return None;
    }
    if (word >> 34) & 1 == 1 {
        // SAFETY: an embedded value's `sdshdr8` starts after the header
        // and the expiry if there is one, within the object (checked at
        // load). Its flags byte whole (the kind, no other bit: one compare
        // with the byte in memory; a server that set others would fail the
        // check at load and be read through `RM_StringPtrLen`).
        let hdr = unsafe { head.add(valkey_embedded_at(word)) };
        if unsafe { *hdr.add(2) } != 1 {
            return None;
        }
        let len = usize::from(unsafe { *hdr });
        return Some(unsafe { std::slice::from_raw_parts(hdr.add(3), len) });
    }
    // SAFETY: the buffer's address at offset 8, its `sds` header before
    // it (checked at load).
    let buf = unsafe { head.add(8).cast::<*const u8>().read_unaligned() };
    let kind = unsafe { *buf.sub(1) };
    let len = match kind & 7 {
        0 => usize::from(kind >> 3),
        1 => usize::from(unsafe { *buf.sub(3) }),
        2 => usize::from(unsafe { buf.sub(5).cast::<u16>().read_unaligned() }),
        _ => return None,
    };
    Some(unsafe { std::slice::from_raw_parts(buf, len) })
}

/// [`in_place_valkey`] for [`name_of`], which is inlined in many places.
///
/// # Safety
///
/// As [`in_place_valkey`]'s.
#[inline(never)]
unsafe fn in_place_valkey_out_of_line<'a>(s: *const raw::RedisModuleString) -> Option<&'a [u8]> {
    // SAFETY: the caller's.
    unsafe { in_place_valkey(s) }
}

/// Reads strings the server makes, of every length class a name may have,
/// both ways: [`name_of`] reads in place from now on only if every one
/// read so matched `RM_StringPtrLen` (pointer and length) and the short
/// ones could be. Nothing is read through an address before it was seen
/// to be the one `RM_StringPtrLen` returns.
pub fn learn_string_layout(ctx: *mut raw::RedisModuleCtx) {
    let bytes: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    let mut ok = true;
    for len in [
        0usize, 1, 3, 7, 8, 9, 16, 31, 32, 33, 44, 45, 64, 255, 256, 300, 4096, 65_535, 65_536,
        70_000,
    ] {
        let Some(part) = bytes.get(..len) else {
            return;
        };
        let s = api!(RedisModule_CreateString(ctx, part.as_ptr().cast(), len))
            .unwrap_or(std::ptr::null_mut());
        if s.is_null() {
            return;
        }
        let mut n = 0usize;
        let p = call!(RedisModule_StringPtrLen(s, &mut n)).cast::<u8>();
        let head = s.cast::<u8>().cast_const();
        // SAFETY: a string object is at least its 8-byte header and the
        // address after it; the address is dereferenced (by `in_place`)
        // only once it is the buffer `RM_StringPtrLen` returned, whose
        // `sds` header precedes it.
        let same = unsafe { head.add(8).cast::<*const u8>().read_unaligned() } == p;
        let read = match same {
            true => unsafe { in_place(s) }
                .or_else(|| unsafe { in_place_other(s) })
                .map(|b| (b.as_ptr(), b.len())),
            false => None,
        };
        ok &= match read {
            Some((q, m)) => q == p && m == n && n == len,
            // Only the long ones (an `sds` header of 32 or 64 bits, or a
            // server that encodes them otherwise: Redis 8 gives 65,535
            // bytes a 32-bit header) go to `RM_StringPtrLen`.
            None => len > 255,
        };
        api!(RedisModule_FreeString(ctx, s));
    }
    IN_PLACE.store(ok, Ordering::Relaxed);
    if !ok {
        VALKEY_IN_PLACE.store(learn_valkey_layout(ctx, &bytes), Ordering::Relaxed);
    }
}

/// Where an embedded value's `sds` header starts in a Valkey object whose
/// header word is `word`: after the header, and the expiry if bit 32 says
/// there is one.
#[inline(always)]
fn valkey_embedded_at(word: u64) -> usize {
    8 + 8 * ((word >> 32) & 1) as usize
}

/// [`learn_string_layout`] for Valkey's objects ([`in_place_valkey`]):
/// whether every string read so matched `RM_StringPtrLen`, the short ones
/// all read. An address is dereferenced only once it is the buffer
/// `RM_StringPtrLen` returned.
fn learn_valkey_layout(ctx: *mut raw::RedisModuleCtx, bytes: &[u8]) -> bool {
    let mut ok = true;
    for len in [
        0usize, 1, 3, 7, 8, 9, 16, 31, 32, 33, 44, 45, 52, 53, 64, 255, 256, 300, 4096, 65_535,
        65_536, 70_000,
    ] {
        let Some(part) = bytes.get(..len) else {
            return false;
        };
        let s = api!(RedisModule_CreateString(ctx, part.as_ptr().cast(), len))
            .unwrap_or(std::ptr::null_mut());
        if s.is_null() {
            return false;
        }
        let mut n = 0usize;
        let p = call!(RedisModule_StringPtrLen(s, &mut n)).cast::<u8>();
        let head = s.cast::<u8>().cast_const();
        // SAFETY: a string object is at least its 8-byte header and 8
        // bytes after it (an address, an expiry, or an embedded `sdshdr8`
        // and at least its terminator); nothing is dereferenced through
        // them.
        let (word, at_8) = unsafe {
            (
                head.cast::<u64>().read_unaligned(),
                head.add(8).cast::<*const u8>().read_unaligned(),
            )
        };
        let expected = match (word >> 34) & 1 {
            1 => head.wrapping_add(valkey_embedded_at(word) + 3),
            _ => at_8,
        };
        let read = match expected == p {
            // SAFETY: the layout `in_place_valkey` reads led to the
            // buffer `RM_StringPtrLen` returned.
            true => unsafe { in_place_valkey(s) }.map(|b| (b.as_ptr(), b.len())),
            false => None,
        };
        ok &= match read {
            Some((q, m)) => q == p && m == n && n == len,
            None => len > 255,
        };
        api!(RedisModule_FreeString(ctx, s));
    }
    ok
}

impl<'a> From<&'a RedisString> for Str<'a> {
    fn from(s: &'a RedisString) -> Str<'a> {
        // SAFETY: the RedisString holds a reference for as long as it is
        // borrowed.
        unsafe { Str::from_raw(s.inner) }
    }
}

/// A command's arguments as Redis passed them, the name first: nothing
/// copied, retained or freed.
#[derive(Clone, Copy)]
pub struct Argv<'a> {
    args: &'a [*mut raw::RedisModuleString],
}

impl<'a> Argv<'a> {
    /// # Safety
    ///
    /// `argv` and `argc` are what Redis passed to the running command.
    pub unsafe fn from_raw(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Argv<'a> {
        let n = usize::try_from(argc).unwrap_or(0);
        let args = if argv.is_null() || n == 0 {
            &[][..]
        } else {
            // SAFETY: Redis passes argc live strings at argv.
            unsafe { std::slice::from_raw_parts(argv, n) }
        };
        Argv { args }
    }

    pub fn len(self) -> usize {
        self.args.len()
    }

    pub fn get(self, i: usize) -> Option<Str<'a>> {
        // SAFETY: each argument lives for the command's call ('a).
        self.args.get(i).map(|p| unsafe { Str::from_raw(*p) })
    }

    /// The arguments from `i` on (none past the end).
    pub fn from(self, i: usize) -> Argv<'a> {
        Argv {
            args: self.args.get(i..).unwrap_or(&[]),
        }
    }

    /// The array and its length, for the module API (which reads them for
    /// the call only).
    pub fn as_raw(self) -> (*mut *mut raw::RedisModuleString, usize) {
        (self.args.as_ptr().cast_mut(), self.args.len())
    }
}
