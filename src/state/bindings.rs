//! Holders bound to their connection (`BIND`): which connection holds which
//! grant, so that a closing connection releases all of them, and
//! `LOCK.KEEPALIVE` renews them.
//!
//! A binding is `(db, key, owner, token) -> client id`. It lives in this
//! server's memory only: it is not saved or replicated, and a restart or a
//! promotion forgets it (the holders keep their lease). A reload of the
//! server's own data while its connections stay open (`DEBUG RELOAD`)
//! keeps it: [`flushed`] parks the registry, [`reloaded`] puts it back.
//!
//! Bindings are kept the way the commands reach them, so that binding and
//! unbinding cost what a binding costs whatever their number:
//! - a grant's fencing token names it: a holder that leaves through a lock
//!   command or the timer reports its token ([`lock_core::Ended`]), found
//!   here in one look-up of a number ([`TokenIndex`]: a hash keyed at
//!   random per process, grown a few buckets at a time), its key and owner
//!   compared byte for byte. Tokens are the server's own and unique; a
//!   forged state that repeats one chains the bindings under it, so every
//!   look-up stays exact.
//! - a connection's bindings are a list in the order bound, each
//!   numbered, linked through their slots both ways: a binding that ends
//!   is unlinked in O(1) and leaves no hole, so no release ever walks the
//!   list, whatever its length; the timer takes a closed connection's
//!   bindings from its head, a page per turn ([`take_closed`]).
//! - each binding is one slot of a slab that grows in chunks, the key's
//!   name and the owner inside the slot when they fit (no allocation).
//!
//! A holder that leaves by other means (DEL, FLUSH*, Redis's expiry of the
//! key, the value a RENAME replaced) leaves a stale binding, found and dropped at the connection's next
//! `LOCK.KEEPALIVE` or at its close: every use checks the holder's token
//! first, so a stale binding never touches another grant. RENAME, MOVE and
//! SWAPDB carry bindings to the lock's new place.
//!
//! A connection that closes is marked closed here at once, in O(1)
//! whatever its number of bindings (its list is flagged; each binding
//! reads its list's flag; the list's count by mode moves to the closed
//! count): from then on every transaction on a key ends the key's holders
//! bound to a closed connection before anything else (`transitions`),
//! LOCK.INFO and the deadlock search leave them out, and INFO does not
//! count them. The timer ends the rest later, a page per turn
//! ([`take_closed`]). [`pending`] (one atomic) says whether any such holder
//! is left, so a server with none pays nothing.

use lock_core::hash::Keyed;
use lock_core::shards::{Entry, Sharded};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};

use crate::redis::ffi::DbKey;
use crate::redis::homes::{self, Home, Homes};
use lock_core::{Census, Changes, Lock, Mode, Owner};

/// A client id (`CLIENT ID`).
pub type ClientId = u64;

/// The bindings of a connection that closed, to end over the next ticks
/// ([`take_closed`]): its list, and the list's number (a list freed and
/// used again since is not this one).
#[derive(Clone, Copy, Debug)]
pub struct Detached {
    list: u32,
    gen: u64,
}

/// One bound grant, copied out: where, whose, which grant (its token), and
/// its number in its connection's order (`LOCK.KEEPALIVE`'s place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub key: DbKey,
    pub owner: Owner,
    pub token: u64,
    pub seq: u64,
}

/// No slot: the end of a chain, an ended binding's place in its list.
const NONE: u32 = u32::MAX;

/// Bytes of a key's name and an owner kept in the slot itself (most fit:
/// a key of 20 bytes and a UUID), so that binding allocates nothing.
const INLINE: usize = 62;

/// A key's name, then an owner: in the slot when they fit, else on the heap.
enum Bytes {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Bytes {
    fn new(name: &[u8], owner: &[u8]) -> Bytes {
        let len = name.len() + owner.len();
        if let Ok(short) = u8::try_from(len) {
            let mut buf = [0u8; INLINE];
            if let Some(used) = buf.get_mut(..len) {
                let (n, o) = used.split_at_mut(name.len());
                n.copy_from_slice(name);
                o.copy_from_slice(owner);
                return Bytes::Inline(short, buf);
            }
        }
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(owner);
        Bytes::Heap(bytes.into_boxed_slice())
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Inline(len, buf) => buf.get(..usize::from(*len)).unwrap_or_default(),
            Bytes::Heap(bytes) => bytes,
        }
    }

    /// What they take on the heap.
    fn heap(&self) -> usize {
        match self {
            Bytes::Inline(..) => 0,
            Bytes::Heap(bytes) => bytes.len(),
        }
    }
}

/// One binding, in its slot.
struct Binding {
    /// The key's name, then the owner.
    bytes: Bytes,
    name_len: usize,
    /// Its database's home (`homes`): a flush's bindings are dead at once.
    home: Home,
    token: u64,
    client: ClientId,
    /// Its connection's list (while the connection is open).
    list: u32,
    /// Its number, from the registry's count of binds: its place in its
    /// connection's order, and what tells it from a later binding in the
    /// same slot.
    seq: u64,
    /// The bindings before and after it in its connection's list ([`NONE`]:
    /// it is the first, the last).
    before: u32,
    after: u32,
    /// The next binding under the same token (only a forged state repeats
    /// a token).
    next: u32,
    /// The lock's mode, for INFO's count of pending holders by mode.
    mode: Mode,
}

impl Binding {
    fn name(&self) -> &[u8] {
        self.bytes
            .as_slice()
            .get(..self.name_len)
            .unwrap_or_default()
    }

    fn owner(&self) -> &[u8] {
        self.bytes
            .as_slice()
            .get(self.name_len..)
            .unwrap_or_default()
    }

    fn is_at(&self, home: Home, name: &[u8]) -> bool {
        self.home == home && self.name() == name
    }

    /// Copied out, its home being database `db`.
    fn bound(&self, db: i32) -> Bound {
        Bound {
            key: DbKey::new(db, self.name()),
            owner: self.owner().into(),
            token: self.token,
            seq: self.seq,
        }
    }

    /// Approximate bytes: its slot (its links in its connection's list
    /// among it), its bytes on the heap, its entries in the token index.
    fn cost(&self) -> usize {
        BASE_COST + self.bytes.heap()
    }
}

/// One connection's bindings in the order bound: the slots of the first
/// and the last, the others linked through `Binding::before` and `after`
/// (a bind and an unbind are O(1), whatever its length; nothing to
/// compact).
struct Client {
    head: u32,
    tail: u32,
    /// Its bindings (those of a flushed database too, until swept).
    live: usize,
    /// Its bindings by home, and by mode: `(home, count, census)`.
    by_home: Vec<(Home, usize, Census)>,
    /// The connection closed: its bindings hold nothing, and [`pending`]
    /// counts them until they are ended.
    closed: bool,
    /// This list's number: the registry's count of binds when it was made.
    gen: u64,
    /// The connection's lease, which its bound holders follow
    /// (`sessions::set_own`; 0: none drawn yet).
    lease: u64,
}

impl Default for Client {
    fn default() -> Self {
        Client {
            head: NONE,
            tail: NONE,
            live: 0,
            by_home: Vec::new(),
            closed: false,
            gen: 0,
            lease: 0,
        }
    }
}

impl Client {
    /// Its count and census in `home`, made if need be.
    fn in_home(&mut self, home: Home) -> Option<&mut (Home, usize, Census)> {
        let at = match self.by_home.iter().position(|e| e.0 == home) {
            Some(at) => at,
            None => {
                self.by_home.push((home, 0, Census::ZERO));
                self.by_home.len() - 1
            }
        };
        self.by_home.get_mut(at)
    }

    fn added(&mut self, home: Home, mode: Mode) {
        if let Some(e) = self.in_home(home) {
            e.1 += 1;
            e.2.add(mode, 1);
        }
    }

    fn removed(&mut self, home: Home, mode: Mode) {
        if let Some(at) = self.by_home.iter().position(|e| e.0 == home) {
            if let Some(e) = self.by_home.get_mut(at) {
                e.1 = e.1.saturating_sub(1);
                e.2.sub(mode, 1);
                if e.1 == 0 {
                    self.by_home.swap_remove(at);
                }
            }
        }
    }
}

/// What the bindings of one home count (INFO's gauges, less a flushed
/// home's at once).
#[derive(Default, Clone, Copy)]
struct Tally {
    count: usize,
    heap: usize,
    /// Those of closed connections, and by mode.
    pending: usize,
    closed: Census,
}

/// The tallies of the live homes: as many as databases with bindings (one,
/// mostly), so a list looked through beats a hash on a bind's path.
#[derive(Default)]
struct Tallies(Vec<(Home, Tally)>);

impl Tallies {
    #[inline]
    fn get_mut(&mut self, home: Home) -> Option<&mut Tally> {
        self.0.iter_mut().find(|e| e.0 == home).map(|e| &mut e.1)
    }

    #[inline]
    fn contains(&self, home: Home) -> bool {
        self.0.iter().any(|e| e.0 == home)
    }

    /// `home`'s tally, made if need be.
    #[inline]
    fn entry(&mut self, home: Home) -> Option<&mut Tally> {
        if !self.contains(home) {
            self.0.push((home, Tally::default()));
        }
        self.get_mut(home)
    }

    fn remove(&mut self, home: Home) -> Option<Tally> {
        let at = self.0.iter().position(|e| e.0 == home)?;
        Some(self.0.swap_remove(at).1)
    }
}
/// Slots come in chunks of this many: a slab that grows never copies what
/// it holds.
const CHUNK: usize = 1024;

/// The bindings' slots, by number.
#[derive(Default)]
struct Slab {
    chunks: Vec<Box<[Option<Binding>]>>,
    /// Slots handed out so far (the ones after are in no use yet).
    used: usize,
    free: lock_core::chunked::Chunked<u32>,
}

impl Slab {
    fn slot(&mut self, at: u32) -> Option<&mut Option<Binding>> {
        let at = at as usize;
        self.chunks.get_mut(at / CHUNK)?.get_mut(at % CHUNK)
    }

    fn get(&self, at: u32) -> Option<&Binding> {
        let at = at as usize;
        self.chunks.get(at / CHUNK)?.get(at % CHUNK)?.as_ref()
    }

    fn get_mut(&mut self, at: u32) -> Option<&mut Binding> {
        self.slot(at)?.as_mut()
    }

    /// The number of a free slot (to [`Slab::put`] a binding in next).
    #[inline(always)]
    fn vacant(&mut self) -> u32 {
        if let Some(at) = self.free.pop() {
            return at;
        }
        if self.used.is_multiple_of(CHUNK) {
            self.add_chunk();
        }
        self.used += 1;
        u32::try_from(self.used - 1).unwrap_or(NONE)
    }

    #[cold]
    #[inline(never)]
    fn add_chunk(&mut self) {
        self.chunks.push((0..CHUNK).map(|_| None).collect());
    }

    /// Puts `binding` in the free slot `at` ([`Slab::vacant`]).
    #[inline(always)]
    fn put(&mut self, at: u32, binding: Binding) {
        if let Some(slot) = self.slot(at) {
            *slot = Some(binding);
        }
    }
}

/// Old buckets moved per change of the index while it is resized, and
/// empty ones looked at at most.
const MOVES: usize = 2;
const EMPTY_VISITS: usize = 20;
/// The fewest buckets.
const MIN_BUCKETS: usize = 16;

/// The bindings' slots by their grant's token: buckets of chains through
/// `Binding::next` (a forged state's repeated token shares one chain), as
/// many buckets as bindings or more, a power of two. It grows fourfold a
/// few buckets at a time, as Redis's own dictionaries grow: while it does,
/// each change moves [`MOVES`] more old buckets, so no bind or release pays
/// for the whole table whatever its size (fourfold: each binding is moved
/// a third as often as doubling would, for 4 to 16 bytes of buckets a
/// binding; it only grows: all of it goes when the last binding does).
#[derive(Default)]
struct TokenIndex {
    /// The tokens' hash: a forged file cannot choose colliding tokens.
    keys: Keyed,
    buckets: Vec<u32>,
    /// The buckets being emptied into `buckets`: those before `moved` are.
    old: Vec<u32>,
    moved: usize,
    len: usize,
}

/// A bucket of the index: of its old buckets, or of its current ones.
#[derive(Clone, Copy)]
enum Bucket {
    Old(usize),
    New(usize),
}

impl TokenIndex {
    /// `token`'s hash: its bucket among `n` (a power of two) is its low bits.
    #[inline]
    fn hash(&self, token: u64) -> usize {
        self.keys.hash_one(token) as usize
    }

    /// `token`'s bucket among `n` (a power of two).
    #[inline]
    fn bucket(&self, token: u64, n: usize) -> usize {
        self.hash(token) & n.wrapping_sub(1)
    }

    /// The first slots of the chains that may hold the token of hash `h`:
    /// its old bucket's while not moved, and its current one's ([`NONE`]:
    /// none).
    #[inline]
    fn heads(&self, h: usize) -> (u32, u32) {
        let mut old = NONE;
        if !self.old.is_empty() {
            let b = h & (self.old.len() - 1);
            if b >= self.moved {
                old = self.old.get(b).copied().unwrap_or(NONE);
            }
        }
        let new = self
            .buckets
            .get(h & self.buckets.len().wrapping_sub(1))
            .copied()
            .unwrap_or(NONE);
        (old, new)
    }

    /// The buckets that may hold `token`: its old one while not moved,
    /// and its current one.
    fn buckets_of(&self, token: u64) -> (Option<Bucket>, Option<Bucket>) {
        let old = (!self.old.is_empty())
            .then(|| self.bucket(token, self.old.len()))
            .filter(|b| *b >= self.moved)
            .map(Bucket::Old);
        let new =
            (!self.buckets.is_empty()).then(|| Bucket::New(self.bucket(token, self.buckets.len())));
        (old, new)
    }
}

#[derive(Default)]
struct Registry {
    /// Its databases' homes (a binding keeps its home, not its database).
    homes: Homes,
    /// The counts of each live home.
    tally: Tallies,
    /// Bindings of flushed databases still in the slab (swept a slice at a
    /// time: [`sweep_dead`]), and where the sweep is.
    dead: usize,
    sweep: usize,
    slab: Slab,
    /// The slots by their grant's token.
    index: TokenIndex,
    /// Open connections with bindings: where each one's list is.
    clients: Sharded<ClientId, u32, Keyed>,
    /// Their lists (an empty one is free, its number in `free_lists`).
    lists: Vec<Client>,
    free_lists: Vec<u32>,
    /// The connection that bound last and its list: a connection binding
    /// many in a row does not look itself up each time (0: none).
    last: (ClientId, u32),
    /// The holders of closed connections not yet ended, by mode.
    closed_census: Census,
    /// Binds so far: the next binding's number.
    seq: u64,
}

impl Registry {
    fn get(&self, at: u32) -> Option<&Binding> {
        self.slab.get(at)
    }

    fn get_mut(&mut self, at: u32) -> Option<&mut Binding> {
        self.slab.get_mut(at)
    }

    /// The slot of the binding of grant `token` on `name` in `db`.
    fn find(&self, db: i32, name: &[u8], token: u64) -> Option<u32> {
        let home = self.homes.get(db)?;
        self.find_hashed(home, name, token, self.index.hash(token))
    }

    /// [`Registry::find`] in `home`, with `token`'s hash `h`.
    #[inline]
    fn find_hashed(&self, home: Home, name: &[u8], token: u64, h: usize) -> Option<u32> {
        let (old, new) = self.index.heads(h);
        if old != NONE {
            if let Some(at) = self.find_in(old, home, name, token) {
                return Some(at);
            }
        }
        self.find_in(new, home, name, token)
    }

    /// [`Registry::find`] along the chain from slot `at`.
    #[inline]
    fn find_in(&self, mut at: u32, home: Home, name: &[u8], token: u64) -> Option<u32> {
        while let Some(b) = self.get(at) {
            if b.token == token && b.is_at(home, name) {
                return Some(at);
            }
            at = b.next;
        }
        None
    }

    /// Indexes the free slot `at` under the token of hash `h` (its binding
    /// goes there next): the slot its binding's `next` is.
    #[inline(always)]
    fn index(&mut self, at: u32, h: usize) -> u32 {
        self.rehash_step();
        if self.index.len >= self.index.buckets.len() {
            self.grow_index();
        }
        let ix = &mut self.index;
        ix.len += 1;
        let b = h & ix.buckets.len().wrapping_sub(1);
        match ix.buckets.get_mut(b) {
            Some(head) => std::mem::replace(head, at),
            None => NONE,
        }
    }

    /// Takes the slot `at` (its binding, under `token` and before `next`
    /// in its chain, just taken out) out of the index.
    fn unindex(&mut self, at: u32, token: u64, next: u32) {
        let Registry { slab, index, .. } = self;
        index.len = index.len.saturating_sub(1);
        let (old, new) = index.buckets_of(token);
        for head in [old, new].into_iter().flatten() {
            let chain = match head {
                Bucket::Old(b) => index.old.get_mut(b),
                Bucket::New(b) => index.buckets.get_mut(b),
            };
            let Some(chain) = chain else {
                continue;
            };
            if *chain == at {
                *chain = next;
                break;
            }
            let mut prev = *chain;
            let mut found = false;
            while let Some(p) = slab.get_mut(prev) {
                if p.next == at {
                    p.next = next;
                    found = true;
                    break;
                }
                prev = p.next;
            }
            if found {
                break;
            }
        }
        self.rehash_step();
    }

    /// The index full: it starts growing fourfold (after any growth still
    /// under way is finished: a growth is done long before the next, each
    /// change moving old buckets).
    #[cold]
    #[inline(never)]
    fn grow_index(&mut self) {
        while !self.index.old.is_empty() {
            self.rehash_some();
        }
        let ix = &mut self.index;
        let n = (4 * ix.buckets.len()).max(MIN_BUCKETS);
        ix.old = std::mem::replace(&mut ix.buckets, vec![NONE; n]);
        ix.moved = 0;
    }

    /// While the index is resized: a few more of its old buckets moved.
    #[inline]
    fn rehash_step(&mut self) {
        if !self.index.old.is_empty() {
            self.rehash_some();
        }
    }

    #[inline(never)]
    fn rehash_some(&mut self) {
        let Registry { slab, index, .. } = self;
        let (mut moves, mut empty) = (MOVES, EMPTY_VISITS);
        while moves > 0 && empty > 0 {
            let Some(head) = index.old.get_mut(index.moved) else {
                break;
            };
            let mut at = std::mem::replace(head, NONE);
            index.moved += 1;
            if at == NONE {
                empty -= 1;
                continue;
            }
            moves -= 1;
            while let Some(b) = slab.get_mut(at) {
                let next = b.next;
                let bucket = index.bucket(b.token, index.buckets.len());
                if let Some(head) = index.buckets.get_mut(bucket) {
                    b.next = std::mem::replace(head, at);
                }
                at = next;
            }
        }
        if index.moved >= index.old.len() {
            index.old = Vec::new();
            index.moved = 0;
        }
    }

    /// The number of `client`'s list, made when it has none.
    #[inline(always)]
    fn list_of(&mut self, client: ClientId) -> u32 {
        if self.last.0 == client {
            return self.last.1;
        }
        self.look_up_list(client)
    }

    #[inline(never)]
    fn look_up_list(&mut self, client: ClientId) -> u32 {
        let at = match self.clients.entry(client) {
            Entry::Occupied(o) => *o.get(),
            Entry::Vacant(v) => {
                let at = match self.free_lists.pop() {
                    Some(at) => at,
                    None => {
                        self.lists.push(Client::default());
                        u32::try_from(self.lists.len() - 1).unwrap_or(NONE)
                    }
                };
                if let Some(c) = self.lists.get_mut(at as usize) {
                    c.gen = self.seq;
                }
                *v.insert(at)
            }
        };
        self.last = (client, at);
        at
    }

    /// `client`'s list no longer takes bindings (its last binding ended,
    /// or it closed).
    fn unlink_client(&mut self, client: ClientId) {
        self.clients.remove(&client);
        if self.last.0 == client {
            self.last = (0, NONE);
        }
    }

    /// List `at` is empty: free for another connection.
    fn free_list(&mut self, at: u32) {
        if let Some(c) = self.lists.get_mut(at as usize) {
            *c = Client::default();
            self.free_lists.push(at);
        }
    }

    /// Whether `b`'s connection closed.
    /// Of `bindings`, those of a holder of `lock` at `name` in `db`: the
    /// lock's holder of the binding's owner carries the binding's token
    /// (one look-up in the lock each).
    fn on_key<'a>(
        &'a self,
        db: i32,
        name: &'a [u8],
        lock: &'a Lock,
        bindings: impl Iterator<Item = &'a Binding> + 'a,
    ) -> impl Iterator<Item = &'a Binding> + 'a {
        let home = self.homes.get(db);
        bindings.filter(move |b| {
            Some(b.home) == home
                && b.name() == name
                && lock.holder(b.owner()).is_some_and(|h| h.token == b.token)
        })
    }

    /// [`closed_of`] by the closed connections' bindings: the lists
    /// looked through for the closed ones, and each of their bindings.
    fn closed_on(&self, db: i32, name: &[u8], lock: &Lock) -> Vec<(Owner, u64)> {
        let closed = self.lists.iter().filter(|c| c.closed).flat_map(|c| {
            let mut at = c.head;
            std::iter::from_fn(move || {
                let b = self.get(at)?;
                at = b.after;
                Some(b)
            })
        });
        self.on_key(db, name, lock, closed)
            .map(|b| (b.owner().into(), b.token))
            .collect()
    }

    fn is_closed(&self, b: &Binding) -> bool {
        self.lists.get(b.list as usize).is_some_and(|c| c.closed)
    }

    /// Lists slot `at` (a lock of `mode`) last in `client`'s order: the
    /// list, the binding's number and the binding before it there, for the
    /// binding to record.
    #[inline(always)]
    fn enlist(&mut self, at: u32, client: ClientId, home: Home, mode: Mode) -> (u32, u64, u32) {
        self.seq += 1;
        let seq = self.seq;
        let list = self.list_of(client);
        let Some(c) = self.lists.get_mut(list as usize) else {
            return (NONE, seq, NONE);
        };
        let before = std::mem::replace(&mut c.tail, at);
        if before == NONE {
            c.head = at;
        }
        c.live += 1;
        c.added(home, mode);
        if let Some(b) = self.slab.get_mut(before) {
            b.after = at;
        }
        (list, seq, before)
    }

    /// Lists the binding in slot `at` last in `client`'s order.
    fn list(&mut self, at: u32, client: ClientId) {
        let Some((home, mode)) = self.slab.get(at).map(|b| (b.home, b.mode)) else {
            return;
        };
        let (list, seq, before) = self.enlist(at, client, home, mode);
        if let Some(b) = self.slab.get_mut(at) {
            b.client = client;
            b.list = list;
            b.seq = seq;
            b.before = before;
            b.after = NONE;
        }
    }

    /// Takes the binding in slot `at` out of its connection's list (and,
    /// when the connection closed, out of what closed connections have
    /// pending).
    fn unlist(&mut self, at: u32) {
        let Some(b) = self.get(at) else {
            return;
        };
        let (client, list, mode, home) = (b.client, b.list, b.mode, b.home);
        let (before, after) = (b.before, b.after);
        let Some(c) = self.lists.get_mut(list as usize) else {
            return;
        };
        if c.head == at {
            c.head = after;
        }
        if c.tail == at {
            c.tail = before;
        }
        c.live = c.live.saturating_sub(1);
        c.removed(home, mode);
        let closed = c.closed;
        let empty = c.live == 0;
        if let Some(b) = self.slab.get_mut(before) {
            b.after = after;
        }
        if let Some(b) = self.slab.get_mut(after) {
            b.before = before;
        }
        if let Some(b) = self.slab.get_mut(at) {
            (b.before, b.after) = (NONE, NONE);
        }
        if closed {
            // (A flushed home's were taken off the counts at the flush.)
            if let Some(t) = self.tally.get_mut(home) {
                t.pending = t.pending.saturating_sub(1);
                t.closed.sub(mode, 1);
                self.closed_census.sub(mode, 1);
                PENDING.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if empty {
            if !closed {
                self.unlink_client(client);
            }
            self.free_list(list);
        }
    }

    /// Ends the binding in slot `at`.
    fn remove(&mut self, at: u32) -> Option<Binding> {
        self.unlist(at);
        let b = self.slab.slot(at)?.take()?;
        self.unindex(at, b.token, b.next);
        self.slab.free.push(at);
        match self.tally.get_mut(b.home) {
            Some(t) => {
                t.count = t.count.saturating_sub(1);
                t.heap = t.heap.saturating_sub(b.bytes.heap());
                if t.count == 0 {
                    self.tally.remove(b.home);
                }
                if b.bytes.heap() != 0 {
                    HEAP_BYTES.fetch_sub(b.bytes.heap(), Ordering::Relaxed);
                }
                COUNT.fetch_sub(1, Ordering::Relaxed);
            }
            // A flushed database's, swept.
            None => self.dead = self.dead.saturating_sub(1),
        }
        if count() == 0 {
            // The last one: what many bindings grew goes back.
            self.renew();
        }
        Some(b)
    }

    /// A registry with no live binding starts again (its homes and count of
    /// binds kept); what it held, the bindings of flushed databases among
    /// it, is dropped a slice at a time (`homes::throw`) unless it is
    /// small.
    fn renew(&mut self) {
        let fresh = Registry {
            seq: self.seq,
            homes: self.homes.clone(),
            ..Registry::default()
        };
        let old = std::mem::replace(self, fresh);
        if old.dead == 0 && old.slab.chunks.len() <= 16 {
            return;
        }
        homes::throw(old.into_pieces());
    }

    /// What it holds, as pieces to drop one at a time (a chunk of slots,
    /// a connection's list); the rest goes at once (a few allocations).
    fn into_pieces(self) -> impl Iterator<Item = ()> + Send {
        let Registry { slab, lists, .. } = self;
        slab.chunks
            .into_iter()
            .map(drop)
            .chain(lists.into_iter().map(drop))
    }

    /// The home of database `db` is dead (a flush): its counts go at
    /// once, its bindings when swept.
    fn kill(&mut self, home: Home) {
        let Some(t) = self.tally.remove(home) else {
            return;
        };
        COUNT.fetch_sub(t.count, Ordering::Relaxed);
        HEAP_BYTES.fetch_sub(t.heap, Ordering::Relaxed);
        PENDING.fetch_sub(t.pending, Ordering::Relaxed);
        for (mode, n) in t.closed.iter() {
            self.closed_census.sub(mode, n);
        }
        self.dead += t.count;
        self.sweep = 0;
    }

    /// Up to `n` bindings of flushed databases taken out (about `4 n`
    /// slots looked at); how many are left.
    fn sweep(&mut self, n: usize) -> usize {
        let (mut taken, mut looked) = (0, 0);
        while self.dead > 0 && taken < n && looked < 4 * n {
            if self.sweep >= self.slab.used {
                self.sweep = 0;
            }
            let at = u32::try_from(self.sweep).unwrap_or(NONE);
            self.sweep += 1;
            looked += 1;
            // (A live home's bindings are in its tally; a dead one has none.)
            let dead = self.get(at).is_some_and(|b| !self.tally.contains(b.home));
            if dead {
                self.remove(at);
                taken += 1;
            }
        }
        self.dead
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
/// How many bindings exist: the cheap check on every transition.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Bytes held by bindings, for INFO.
/// Bytes bindings hold on the heap (key and owner too long for their slot).
static HEAP_BYTES: AtomicUsize = AtomicUsize::new(0);
/// What each binding takes besides: its slot (its links in its
/// connection's list among it) and its entries in the token index (up to
/// four buckets).
const BASE_COST: usize = std::mem::size_of::<Option<Binding>>() + 16;
/// How many bindings belong to closed connections and are not ended yet:
/// the cheap check before a transaction looks for them.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Called when the first binding appears (none before it): `events` starts
/// hearing connections close then, and only then.
static FIRST_BOUND: OnceLock<fn()> = OnceLock::new();

/// Registers what runs when the first binding appears (once, at load).
pub fn on_first_binding(f: fn()) {
    let _ = FIRST_BOUND.set(f);
}

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many holders are bound now, counting those of closed connections
/// not yet ended ([`pending`]).
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// Whether the grant `token` may be bound (no: it is not, for certain): a
/// bit of a 65,536-bit filter of the bound grants' tokens, so a release or
/// an ended lease asks the registry only about its own grant, whatever is
/// bound elsewhere ([`forget`] is the exact answer).
#[inline]
pub fn may_be_bound(token: u64) -> bool {
    BOUND_TOKENS.may_contain(token)
}

/// The bound grants' tokens as a filter ([`may_be_bound`]): a bit set per
/// binding made; all cleared when a binding is made while no other exists
/// and none is parked (a flush's, which a reload may bring back), once
/// 1,024 were made since the last clearing (a word a binding, amortized:
/// at most one bit in 64 left over).
static BOUND_TOKENS: TokenFilter = TokenFilter::new();

struct TokenFilter {
    bits: [AtomicU64; TokenFilter::WORDS],
    /// Bits set since the last clearing.
    set: AtomicUsize,
}

impl TokenFilter {
    const WORDS: usize = 1024;

    const fn new() -> TokenFilter {
        TokenFilter {
            bits: [const { AtomicU64::new(0) }; TokenFilter::WORDS],
            set: AtomicUsize::new(0),
        }
    }

    /// The token's word and bit (tokens are a counter: its bits mixed).
    fn bit(token: u64) -> (usize, u64) {
        let h = token.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> 54) as usize, 1 << ((h >> 48) & 63))
    }

    fn insert(&self, token: u64) {
        let set = self.set.fetch_add(1, Ordering::Relaxed);
        if set >= TokenFilter::WORDS && count() == 1 && !ANY_PARKED.load(Ordering::Relaxed) {
            // The only binding: what earlier ones set goes.
            for w in &self.bits {
                w.store(0, Ordering::Relaxed);
            }
            self.set.store(1, Ordering::Relaxed);
        }
        let (word, bit) = TokenFilter::bit(token);
        if let Some(w) = self.bits.get(word) {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }

    #[inline]
    fn may_contain(&self, token: u64) -> bool {
        let (word, bit) = TokenFilter::bit(token);
        self.bits
            .get(word)
            .is_some_and(|w| w.load(Ordering::Relaxed) & bit != 0)
    }
}

/// How many bound holders belong to connections that closed and are not
/// ended yet (they hold nothing: the next transaction on their key ends them).
pub fn pending() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// [`pending`] by mode, as `Lock::census`.
/// Never waits for the registry (INFO also runs while a crash report is
/// written): zeros when it is busy.
pub fn pending_census() -> Census {
    if pending() == 0 {
        return Census::ZERO;
    }
    REGISTRY
        .try_lock()
        .map_or(Census::ZERO, |r| r.closed_census)
}

/// Bytes the bindings occupy (estimate).
pub fn memory() -> usize {
    count() * BASE_COST + HEAP_BYTES.load(Ordering::Relaxed)
}

/// Binds the grant `token` of `owner` on `name` in `db` (a lock of `mode`)
/// to `client`, moving it from any earlier connection.
pub fn bind(client: ClientId, db: i32, name: &[u8], owner: &[u8], token: u64, mode: Mode) {
    let mut guard = registry();
    let r = &mut *guard;
    let h = r.index.hash(token);
    let home = r.homes.home(db);
    if let Some(at) = r.find_hashed(home, name, token, h) {
        let Some(b) = r.get(at) else {
            return;
        };
        if b.owner() == owner {
            if b.client != client || b.mode != mode || r.is_closed(b) {
                r.unlist(at);
                if let Some(b) = r.get_mut(at) {
                    b.mode = mode;
                }
                r.list(at, client);
            }
            return;
        }
        // Another owner under this grant's token: a forged state; the
        // grant being bound is the one that holds now.
        r.remove(at);
    }
    insert(r, h, (client, home, name, owner, token, mode));
}

/// [`bind`] for a grant just made: its token was issued after every token
/// this server had issued or seen (`fencing::last`), so no binding can name
/// it yet and nothing is looked up.
pub fn bind_new(client: ClientId, db: i32, name: &[u8], owner: &[u8], token: u64, mode: Mode) {
    let mut guard = registry();
    let r = &mut *guard;
    let h = r.index.hash(token);
    let home = r.homes.home(db);
    insert(r, h, (client, home, name, owner, token, mode));
}

/// A new binding, its token of hash `h`: in a free slot, indexed, listed.
#[inline(always)]
fn insert(r: &mut Registry, h: usize, what: (ClientId, Home, &[u8], &[u8], u64, Mode)) {
    let at = r.slab.vacant();
    let next = r.index(at, h);
    add(r, at, what, next);
}

/// A new binding in the free slot `at` (indexed already, before `next` in
/// its chain), listed last in its connection's order.
#[inline(always)]
fn add(
    r: &mut Registry,
    at: u32,
    (client, home, name, owner, token, mode): (ClientId, Home, &[u8], &[u8], u64, Mode),
    next: u32,
) {
    let (list, seq, before) = r.enlist(at, client, home, mode);
    let b = Binding {
        bytes: Bytes::new(name, owner),
        name_len: name.len(),
        home,
        token,
        client,
        list,
        seq,
        before,
        after: NONE,
        next,
        mode,
    };
    if COUNT.fetch_add(1, Ordering::Relaxed) == 0 {
        if let Some(first) = FIRST_BOUND.get() {
            first();
        }
    }
    BOUND_TOKENS.insert(token);
    if let Some(t) = r.tally.entry(home) {
        t.count += 1;
        t.heap += b.bytes.heap();
    }
    if b.bytes.heap() != 0 {
        HEAP_BYTES.fetch_add(b.bytes.heap(), Ordering::Relaxed);
    }
    r.slab.put(at, b);
}

/// The grants `tokens` on `name` in `db` ended (their holders left): their
/// bindings too.
pub fn forget(db: i32, name: &[u8], tokens: impl IntoIterator<Item = u64>) {
    if count() == 0 {
        return;
    }
    let mut r = registry();
    for token in tokens {
        if let Some(at) = r.find(db, name, token) {
            r.remove(at);
        }
    }
}

/// The holders of `lock` (at `name` in `db`) bound to a connection that
/// closed: owner and grant. The smaller side is walked: the lock's holders
/// (each one's binding looked up by its token), or the closed
/// connections' bindings (each one's holder looked up by its owner:
/// [`Registry::closed_on`]), so a lock of a million holders costs
/// nothing more while a few bindings elsewhere wait to be ended.
pub fn closed_of(db: i32, name: &[u8], lock: &Lock) -> Vec<(Owner, u64)> {
    if pending() == 0 {
        return Vec::new();
    }
    let r = registry();
    if r.lists.len().saturating_add(pending()) < lock.holder_count() {
        return r.closed_on(db, name, lock);
    }
    lock.holders()
        .filter(|h| {
            r.find(db, name, h.token)
                .and_then(|at| r.get(at))
                .is_some_and(|b| r.is_closed(b) && b.owner() == h.owner)
        })
        .map(|h| (h.owner.into(), h.token))
        .collect()
}

/// Whether the grant `token` of `owner` on `name` in `db` is bound to a
/// connection that closed (it holds nothing any more).
pub fn is_closed(db: i32, name: &[u8], owner: &[u8], token: u64) -> bool {
    if pending() == 0 {
        return false;
    }
    let r = registry();
    r.find(db, name, token)
        .and_then(|at| r.get(at))
        .is_some_and(|b| r.is_closed(b) && b.owner() == owner)
}

/// A copy of `lock` (at `name` in `db`) as the next transaction on it will
/// see it: without the holders of connections that closed; `None` when it
/// has none. For the readers that must not write: LOCK.INFO, the deadlock
/// search, a multi-key request's check.
pub fn without_closed(db: i32, name: &[u8], lock: &Lock, now: u64) -> Option<Lock> {
    let gone = closed_of(db, name, lock);
    if gone.is_empty() {
        return None;
    }
    let mut copy = lock.clone();
    let mut changes = Changes::default();
    for (owner, token) in gone {
        copy.release_all(&owner, token, now, &mut changes);
    }
    Some(copy)
}

/// Bytes the bindings of `lock`'s holders (at `name` in `db`) take. The
/// smaller side is walked, as [`closed_of`] does: the lock's holders, or
/// the bindings' slots (each binding of this key counted when the lock's
/// holder of its owner carries its token).
pub fn memory_of(db: i32, name: &[u8], lock: &Lock) -> usize {
    if count() == 0 {
        return 0;
    }
    let r = registry();
    if r.slab.used < lock.holder_count() {
        return r
            .on_key(
                db,
                name,
                lock,
                r.slab.chunks.iter().flat_map(|c| c.iter().flatten()),
            )
            .map(Binding::cost)
            .sum();
    }
    lock.holders()
        .filter_map(|h| r.find(db, name, h.token).and_then(|at| r.get(at)))
        .map(Binding::cost)
        .sum()
}

/// Up to `n` grants bound to `client`, in the order bound, after the one
/// numbered `after` (from the first when `None`): a page of them (the tests
/// read a connection's list by it; `LOCK.KEEPALIVE` renews the connection's
/// lease instead).
#[cfg(test)]
pub fn page_of_client(client: ClientId, after: Option<u64>, n: usize) -> Vec<Bound> {
    if count() == 0 {
        return Vec::new();
    }
    let r = registry();
    let Some(c) = r
        .clients
        .get(&client)
        .and_then(|at| r.lists.get(*at as usize))
    else {
        return Vec::new();
    };
    let mut page = Vec::new();
    let mut at = c.head;
    while let Some(b) = r.get(at) {
        at = b.after;
        if page.len() >= n {
            break;
        }
        if after.is_some_and(|after| b.seq <= after) {
            continue;
        }
        if let Some(db) = r.homes.db_of(b.home) {
            page.push(b.bound(db));
        }
    }
    page
}

/// The lease of `client`'s bound holders (`LOCK.KEEPALIVE` renews it):
/// drawn by `draw` the first time (`None`: it has no binding).
pub fn lease(client: ClientId, draw: impl FnOnce() -> Option<u64>) -> Option<u64> {
    let mut r = registry();
    let at = *r.clients.get(&client)?;
    let c = r.lists.get_mut(at as usize)?;
    if c.lease == 0 {
        c.lease = draw()?;
    }
    Some(c.lease)
}

/// How many bindings `client` has (those of flushed databases gone).
pub fn live_of(client: ClientId) -> usize {
    let r = registry();
    r.clients
        .get(&client)
        .and_then(|at| r.lists.get(*at as usize))
        .map_or(0, |c| {
            c.by_home
                .iter()
                .filter(|e| r.tally.contains(e.0))
                .map(|e| e.1)
                .sum()
        })
}

/// `client`'s bound holders follow `lease` (drawn before its first
/// binding): kept with its list unless it has one already.
pub fn set_lease(client: ClientId, lease: u64) {
    let mut r = registry();
    let Some(at) = r.clients.get(&client).copied() else {
        return;
    };
    if let Some(c) = r.lists.get_mut(at as usize) {
        if c.lease == 0 {
            c.lease = lease;
        }
    }
}

/// The lease of `client`'s bound holders, if it has one.
pub fn lease_of(client: ClientId) -> Option<u64> {
    if count() == 0 {
        return None;
    }
    let r = registry();
    // (The connection that bound last, as a bind finds it: no look-up.)
    let at = match r.last {
        (last, at) if last == client => at,
        _ => *r.clients.get(&client)?,
    };
    r.lists
        .get(at as usize)
        .map(|c| c.lease)
        .filter(|l| *l != 0)
}

/// The connection `client` closed: its holders hold nothing from now on,
/// in O(1) whatever their number (its list is flagged closed, its count by
/// mode moves to [`pending_census`]); what the timer ends later, a page per
/// turn ([`take_closed`]), unless a command ends them first.
pub fn detach_client(client: ClientId) -> Option<Detached> {
    if count() == 0 {
        return None;
    }
    let mut guard = registry();
    let r = &mut *guard;
    let list = *r.clients.get(&client)?;
    r.unlink_client(client);
    let c = r.lists.get_mut(list as usize)?;
    c.closed = true;
    let gen = c.gen;
    let by_home = c.by_home.clone();
    for (home, n, census) in by_home {
        // (A flushed home's bindings hold nothing: not pending.)
        if let Some(t) = r.tally.get_mut(home) {
            t.pending += n;
            t.closed.add_all(census);
            r.closed_census.add_all(census);
            PENDING.fetch_add(n, Ordering::Relaxed);
        }
    }
    Some(Detached { list, gen })
}

/// Up to `n` bindings of the closed connection `d`, taken out of the
/// registry (the grants they were, for the caller to end), and whether
/// more are left.
pub fn take_closed(d: &Detached, n: usize) -> (Vec<Bound>, bool) {
    let mut r = registry();
    let mut taken = Vec::new();
    for _ in 0..n {
        // Its first binding (a list freed since, or another's now: none).
        let at = match r.lists.get(d.list as usize) {
            Some(c) if c.closed && c.gen == d.gen && c.head != NONE => c.head,
            _ => break,
        };
        // A flushed database's goes unreported (its holder went with it).
        let db = r.get(at).and_then(|b| r.homes.db_of(b.home));
        match (r.remove(at), db) {
            (Some(b), Some(db)) => taken.push(b.bound(db)),
            (Some(_), None) => {}
            // (Never: a listed slot holds its binding.)
            (None, _) => break,
        }
    }
    let more = r
        .lists
        .get(d.list as usize)
        .is_some_and(|c| c.closed && c.gen == d.gen && c.live > 0);
    (taken, more)
}

/// RENAME or MOVE carried the lock at `from` to `to` with its holders,
/// whose grants are `tokens`: their bindings follow. (Bindings of the
/// value RENAME replaced are stale, as after a DEL.)
pub fn moved(from: &DbKey, to: &DbKey, tokens: impl IntoIterator<Item = u64>) {
    if count() == 0 {
        return;
    }
    let mut guard = registry();
    let r = &mut *guard;
    let to_home = r.homes.home(to.db);
    for token in tokens {
        let Some(at) = r.find(from.db, &from.name, token) else {
            continue;
        };
        let closed = r.get(at).is_some_and(|b| r.is_closed(b));
        let Some(b) = r.slab.get_mut(at) else {
            continue;
        };
        let (from_home, mode, list) = (b.home, b.mode, b.list);
        let before = b.bytes.heap();
        b.bytes = Bytes::new(&to.name, b.owner());
        b.name_len = to.name.len();
        b.home = to_home;
        let after = b.bytes.heap();
        HEAP_BYTES.fetch_sub(before, Ordering::Relaxed);
        HEAP_BYTES.fetch_add(after, Ordering::Relaxed);
        // Its counts move to its new home (MOVE: another database).
        if let Some(t) = r.tally.get_mut(from_home) {
            t.count = t.count.saturating_sub(1);
            t.heap = t.heap.saturating_sub(before);
            if closed {
                t.pending = t.pending.saturating_sub(1);
                t.closed.sub(mode, 1);
            }
            if t.count == 0 {
                r.tally.remove(from_home);
            }
        }
        if let Some(t) = r.tally.entry(to_home) {
            t.count += 1;
            t.heap += after;
            if closed {
                t.pending += 1;
                t.closed.add(mode, 1);
            }
        }
        if let Some(c) = r.lists.get_mut(list as usize) {
            c.removed(from_home, mode);
            c.added(to_home, mode);
        }
    }
}

/// SWAPDB: bindings follow their keys (the two databases' homes swap: O(1)).
pub fn swap_dbs(a: i32, b: i32) {
    registry().homes.swap(a, b);
}

/// FLUSHDB / FLUSHALL (`db` -1): the bindings of what was flushed go. A
/// flush of every database may be `DEBUG RELOAD`'s (or `DEBUG LOADAOF`'s),
/// which loads the server's own data back in the same command while the
/// connections stay open: the bindings are parked (the registry taken
/// whole, nothing walked) for [`reloaded`] to put back, and dropped by
/// [`drop_parked`] if no such load follows.
///
/// A flush of one database is O(1) whatever it held: its home dies, its
/// counts go at once (every answer is exact right after it), and its
/// bindings are dropped later, a slice of a tick at a time: all at once by
/// [`homes::throw`] when no other database has any, else by
/// [`sweep_dead`]. Whether work is left for the ticks.
pub fn flushed(db: i32) -> bool {
    if db == -1 {
        park();
        return false;
    }
    let mut r = registry();
    for home in r.homes.flushed(db) {
        r.kill(home);
    }
    if r.dead == 0 {
        return false;
    }
    if count() == 0 {
        r.renew();
    }
    r.dead > 0 || homes::any()
}

/// Bindings of flushed databases left in the registry (swept by
/// [`sweep_dead`]).
pub fn dead() -> usize {
    REGISTRY.try_lock().map_or(0, |r| r.dead)
}

/// Takes out up to `n` bindings of flushed databases; how many are left.
pub fn sweep_dead(n: usize) -> usize {
    registry().sweep(n)
}

/// The bindings a flush of every database took away, as they were, until
/// the load that may follow it (`DEBUG RELOAD`) ends or anything else runs.
struct Parked {
    registry: Registry,
    count: usize,
    heap: usize,
    pending: usize,
}

static PARKED: Mutex<Option<Parked>> = Mutex::new(None);
/// Whether [`PARKED`] holds anything: the cron's cheap check.
static ANY_PARKED: AtomicBool = AtomicBool::new(false);

fn parked() -> MutexGuard<'static, Option<Parked>> {
    PARKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every database was flushed: the registry is set aside whole (an earlier
/// parked one is dropped: only the latest state can come back).
fn park() {
    let mut r = registry();
    let seq = r.seq;
    let registry = std::mem::replace(
        &mut *r,
        Registry {
            seq,
            ..Registry::default()
        },
    );
    let p = Parked {
        registry,
        count: COUNT.swap(0, Ordering::Relaxed),
        heap: HEAP_BYTES.swap(0, Ordering::Relaxed),
        pending: PENDING.swap(0, Ordering::Relaxed),
    };
    drop(r);
    let keep = p.count != 0;
    let (earlier, now) = match keep {
        true => (parked().replace(p), None),
        false => (parked().take(), Some(p)),
    };
    // Dropped a slice of a tick at a time (a million bindings take tens of
    // milliseconds to free).
    for gone in [earlier, now].into_iter().flatten() {
        homes::throw(gone.registry.into_pieces());
    }
    ANY_PARKED.store(keep, Ordering::Relaxed);
}

/// The server's own data was loaded back right after a flush of every
/// database (`DEBUG RELOAD`, `DEBUG LOADAOF`): the parked bindings are
/// back, as they were (their holders came back with their tokens; one whose
/// holder did not is stale, as after Redis's own expiry of a key, and every
/// use checks the holder's token first). Whether any belong to a closed
/// connection, still to be ended ([`pending`]).
pub fn reloaded() -> bool {
    if !ANY_PARKED.load(Ordering::Relaxed) {
        return false;
    }
    ANY_PARKED.store(false, Ordering::Relaxed);
    let Some(p) = parked().take() else {
        return false;
    };
    let mut r = registry();
    if count() != 0 {
        // Bound since the flush: what was parked is not the current state.
        homes::throw(p.registry.into_pieces());
        return false;
    }
    let seq = r.seq;
    *r = p.registry;
    r.seq = r.seq.max(seq);
    COUNT.store(p.count, Ordering::Relaxed);
    HEAP_BYTES.store(p.heap, Ordering::Relaxed);
    PENDING.store(p.pending, Ordering::Relaxed);
    p.pending != 0
}

/// No load of the server's own data followed the flush (a plain
/// `FLUSHALL`, a replica's full sync): the parked bindings go.
pub fn drop_parked() {
    if ANY_PARKED.swap(false, Ordering::Relaxed) {
        let gone = parked().take();
        if let Some(p) = gone {
            homes::throw(p.registry.into_pieces());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection `client` closed: its bindings, taken out of the registry
    /// in one go (the server uses [`detach_client`] and [`take_closed`], a
    /// page per turn).
    fn take_client(client: ClientId) -> Vec<Bound> {
        let Some(closed) = detach_client(client) else {
            return Vec::new();
        };
        let (all, more) = take_closed(&closed, usize::MAX);
        assert!(!more);
        all
    }

    fn key(db: i32, k: &str) -> DbKey {
        DbKey::new(db, k.as_bytes())
    }

    fn bind_at(client: ClientId, k: &DbKey, owner: &[u8], token: u64, mode: Mode) {
        bind(client, k.db, &k.name, owner, token, mode);
    }

    /// A census's counts in `Mode::ALL` order.
    fn counts(c: Census) -> Vec<usize> {
        c.iter().map(|(_, n)| n).collect()
    }

    /// A lock of `mode` held by `holders` (owner, token).
    fn lock_of(mode: Mode, holders: &[(&[u8], u64)]) -> Lock {
        let kind = match mode {
            Mode::Exclusive => lock_core::Kind::Acquire,
            Mode::Shared => lock_core::Kind::Read,
            Mode::Semaphore => lock_core::Kind::Semaphore(10),
        };
        let holders = holders
            .iter()
            .map(|(owner, token)| lock_core::Holder {
                owner: (*owner).into(),
                holds: 1,
                since: 0,
                token: *token,
                deadline: u64::MAX,
            })
            .collect();
        Lock::from_holders(kind, holders).unwrap_or_default()
    }

    // One test: the registry is a process-wide static.
    #[test]
    fn bind_move_forget_rename_swap_and_take() {
        let ex = Mode::Exclusive;
        bind_at(1, &key(0, "a"), b"o", 10, ex);
        bind_at(1, &key(0, "b"), b"o", 11, ex);
        bind_at(2, &key(0, "c"), b"p", 12, ex);
        assert_eq!(count(), 3);
        assert!(memory() > 0);
        // A repeat with BIND from another connection moves the binding.
        bind_at(2, &key(0, "a"), b"o", 10, ex);
        assert_eq!(count(), 3);
        assert_eq!(page_of_client(1, None, usize::MAX).len(), 1);
        assert_eq!(page_of_client(2, None, usize::MAX).len(), 2);
        // Only the grant's own token, at its own key, ends it.
        forget(0, b"b", [99]);
        forget(0, b"a", [11]);
        forget(1, b"b", [11]);
        assert_eq!(count(), 3);
        forget(0, b"b", [11]);
        assert!(page_of_client(1, None, usize::MAX).is_empty());
        let a = lock_of(ex, &[(b"o", 10)]);
        assert!(memory_of(0, b"a", &a) > 0);
        moved(&key(0, "a"), &key(3, "a2"), [10]);
        assert_eq!(memory_of(0, b"a", &a), 0);
        assert!(memory_of(3, b"a2", &a) > 0);
        swap_dbs(3, 4);
        let mut held: Vec<_> = take_client(2)
            .into_iter()
            .map(|b| (b.key, b.token))
            .collect();
        held.sort();
        assert_eq!(held, vec![(key(0, "c"), 12), (key(4, "a2"), 10)]);
        assert_eq!(count(), 0);
        assert_eq!(memory(), 0);
        bind_at(5, &key(2, "x"), b"o", 1, ex);
        bind_at(5, &key(3, "y"), b"o", 2, ex);
        flushed(2);
        assert_eq!(page_of_client(5, None, usize::MAX).len(), 1);
        // Counted out at once, taken out of the slab by the sweep.
        assert_eq!((count(), live_of(5), dead()), (1, 1, 1));
        assert_eq!(sweep_dead(10), 0);
        assert_eq!(count(), 1);
        // A closed connection's holders in a flushed database are no
        // longer pending, nor handed to the timer to end.
        bind_at(11, &key(6, "c1"), b"o", 31, ex);
        bind_at(11, &key(6, "c2"), b"o", 32, Mode::Shared);
        bind_at(11, &key(7, "c3"), b"o", 33, ex);
        let closed = detach_client(11).unwrap();
        assert_eq!(pending(), 3);
        flushed(6);
        assert_eq!(pending(), 1);
        assert_eq!(counts(pending_census()), [1, 0, 0]);
        swap_dbs(7, 8);
        let (taken, more) = take_closed(&closed, 10);
        assert!(!more);
        assert_eq!(
            taken
                .iter()
                .map(|b| (b.key.clone(), b.token))
                .collect::<Vec<_>>(),
            vec![(key(8, "c3"), 33)]
        );
        assert_eq!(pending(), 0);
        flushed(-1);
        assert_eq!(count(), 0);

        // A closed connection: its holders are pending at once, whatever
        // ends them (a command's forget, the timer's take).
        bind_at(8, &key(0, "p"), b"o", 20, ex);
        bind_at(8, &key(0, "q"), b"o", 21, Mode::Shared);
        bind_at(8, &key(0, "r"), b"o", 22, Mode::Semaphore);
        bind_at(9, &key(0, "p"), b"z", 23, ex);
        assert_eq!(pending(), 0);
        let detached = detach_client(8).unwrap();
        assert_eq!(pending(), 3);
        assert_eq!(counts(pending_census()), [1, 1, 1]);
        let p = lock_of(Mode::Shared, &[(b"o", 20), (b"z", 23)]);
        assert_eq!(closed_of(0, b"p", &p), vec![(b"o".as_slice().into(), 20)]);
        assert!(is_closed(0, b"p", b"o", 20));
        assert!(!is_closed(0, b"p", b"z", 23), "z's connection is open");
        assert!(!is_closed(0, b"p", b"o", 21), "another grant");
        let without = without_closed(0, b"p", &p, 0).map(|l| l.holder_count());
        assert_eq!(without, Some(1));
        forget(0, b"p", [20]);
        assert!(closed_of(0, b"p", &p).is_empty());
        forget(0, b"q", [21]);
        assert_eq!(counts(pending_census()), [0, 0, 1]);
        // A repeat with BIND elsewhere (after its end) takes it off the list.
        bind_at(9, &key(0, "r"), b"o", 22, Mode::Semaphore);
        assert_eq!(pending(), 0);
        assert_eq!(pending_census(), Census::ZERO);
        assert_eq!(take_closed(&detached, 10), (Vec::new(), false));
        assert_eq!(page_of_client(9, None, usize::MAX).len(), 2);
        // Paged in order, one at a time, each page after the last.
        let first = page_of_client(9, None, 1);
        let second = page_of_client(9, Some(first[0].seq), 1);
        assert_eq!(second.len(), 1);
        assert!(first[0].seq < second[0].seq);
        assert!(page_of_client(9, Some(second[0].seq), 1).is_empty());
        flushed(-1);
        assert_eq!(count(), 0);

        // A forged state repeating a token: each binding is found by its
        // own key.
        bind_at(3, &key(0, "f1"), b"o", 77, ex);
        bind_at(3, &key(0, "f2"), b"o", 77, ex);
        bind_at(3, &key(0, "f3"), b"o", 77, ex);
        assert_eq!(count(), 3);
        forget(0, b"f2", [77]);
        assert_eq!(count(), 2);
        assert!(memory_of(0, b"f3", &lock_of(ex, &[(b"o", 77)])) > 0);
        forget(0, b"f1", [77]);
        forget(0, b"f3", [77]);
        assert_eq!(count(), 0);

        // Many bound and most ended: the list is unlinked in place, and paging
        // by number still goes through the rest in order, once each.
        for t in 0..1000u64 {
            bind_at(4, &key(0, &format!("m{t}")), b"o", 1000 + t, ex);
        }
        let first = page_of_client(4, None, 10);
        for t in (0..1000u64).filter(|t| t % 10 != 0) {
            forget(0, format!("m{t}").as_bytes(), [1000 + t]);
        }
        let mut seen = first.iter().filter(|b| b.token % 10 == 0).count();
        let mut after = first.last().map(|b| b.seq);
        loop {
            let page = page_of_client(4, after, 7);
            let Some(last) = page.last() else {
                break;
            };
            assert!(page.iter().all(|b| b.token % 10 == 0));
            assert!(page.iter().all(|b| Some(b.seq) > after));
            seen += page.len();
            after = Some(last.seq);
        }
        assert_eq!(seen, 100);
        assert_eq!(count(), 100);
        flushed(-1);
        assert_eq!(count(), 0);
        assert_eq!(memory(), 0);

        // Binds and releases interleaved while the token index doubles a
        // few buckets at a time: each binding is found by its token, on
        // its own key, exactly, against a plain set.
        let mut live = std::collections::BTreeSet::new();
        let mut x: u64 = 7;
        for step in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = (x >> 33) % 5000;
            let k = format!("s{t}");
            if x.is_multiple_of(3) && live.remove(&t) {
                forget(0, k.as_bytes(), [t + 1]);
            } else if live.insert(t) {
                // Not bound now: as a new grant's, or found missing.
                match step % 2 == 0 {
                    true => bind_new(20 + step % 3, 0, k.as_bytes(), b"o", t + 1, ex),
                    false => bind(20 + step % 3, 0, k.as_bytes(), b"o", t + 1, ex),
                }
            }
            assert_eq!(count(), live.len());
        }
        for t in &live {
            let k = format!("s{t}");
            forget(0, k.as_bytes(), [t + 2]);
            forget(1, k.as_bytes(), [t + 1]);
            assert!(memory_of(0, k.as_bytes(), &lock_of(ex, &[(b"o", t + 1)])) > 0);
        }
        assert_eq!(count(), live.len());
        for t in &live {
            forget(0, format!("s{t}").as_bytes(), [t + 1]);
        }
        assert_eq!(count(), 0);
        assert_eq!(memory(), 0);
    }

    /// This thread's CPU time (a loaded machine's preemptions not counted).
    fn thread_cpu() -> std::time::Duration {
        #[repr(C)]
        struct Timespec {
            s: i64,
            ns: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        let mut t = Timespec { s: 0, ns: 0 };
        // SAFETY: `t` is a valid timespec for the call to fill.
        unsafe { clock_gettime(3, &mut t) };
        std::time::Duration::new(t.s.max(0) as u64, t.ns.clamp(0, 999_999_999) as u32)
    }

    /// The figure of benchmarks.md section 10's in-process row: a million
    /// bindings on one connection, released every other one a round in
    /// the order bound down to 1,000; the longest release's thread CPU
    /// time. `cargo test --release --lib unbinds_in_halving_rounds --
    /// --ignored --nocapture` (run alone: the registry is process-wide).
    #[test]
    #[ignore]
    fn unbinds_in_halving_rounds() {
        const N: u64 = 1_000_000;
        let ex = Mode::Exclusive;
        let names: Vec<String> = (0..N).map(|i| format!("g:{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            bind_new(77, 0, name.as_bytes(), b"O", 1 + i as u64, ex);
        }
        let mut live: Vec<u64> = (0..N).collect();
        let (mut longest, mut over_1ms, mut released) = (std::time::Duration::ZERO, 0, 0);
        while live.len() > 1000 {
            let gone: Vec<u64> = live.iter().copied().skip(1).step_by(2).collect();
            live = live.iter().copied().step_by(2).collect();
            for i in gone {
                let t = thread_cpu();
                forget(0, names[i as usize].as_bytes(), [1 + i]);
                let took = thread_cpu() - t;
                longest = longest.max(took);
                over_1ms += usize::from(took > std::time::Duration::from_millis(1));
                released += 1;
            }
        }
        assert_eq!(count(), live.len());
        println!(
            "{N} bindings, {released} released in halving rounds: longest release {longest:?} of thread CPU, {over_1ms} over 1 ms"
        );
        let detached = detach_client(77).unwrap();
        let (mut longest, mut pages) = (std::time::Duration::ZERO, 0);
        loop {
            let t = thread_cpu();
            let (_, more) = take_closed(&detached, 100);
            longest = longest.max(thread_cpu() - t);
            pages += 1;
            if !more {
                break;
            }
        }
        assert_eq!(count(), 0);
        println!("the rest taken by the close: {pages} pages of 100, the longest {longest:?}");
    }
}
