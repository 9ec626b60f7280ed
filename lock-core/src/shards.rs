//! A hash map that grows a piece at a time: [`Sharded`].
//!
//! Std's `HashMap` grows by doubling, and the insert that crosses a growth
//! point moves every entry in one call: with a million entries, one
//! command holds the event loop for milliseconds. A map whose size clients
//! control (bound holders, waiters, sessions) is [`Sharded`] instead: a
//! fixed number of std maps ([`SHARDS`]), an entry's shard chosen from its
//! hash's bits 47 to 56, so a growth moves one shard's entries, a
//! [`SHARDS`]th of the map (about 1,000 of a million). The bits are clear
//! of those the std map uses within a shard (its bucket, the low bits; its
//! tag, the top seven): entries of one shard spread over its buckets and
//! tags as in a map of their own. A map of fewer than [`SMALL`] entries is
//! one std map (a session's keys, a connection's waiters: most maps are
//! small); the insert that reaches [`SMALL`] moves them into the shards.
//! The cost of a sharded map: the key hashed twice (one folded multiply
//! per eight bytes with the module's hash), one index, and [`SHARDS`]
//! std maps (48 bytes each, 48 KiB).

use std::borrow::Borrow;
use std::collections::hash_map::{self, HashMap};
use std::hash::{BuildHasher, Hash};

/// How many std maps a [`Sharded`] map is made of.
pub const SHARDS: usize = 1024;

/// How many entries a map holds in one std map before it is sharded (the
/// insert that shards it moves them: as many as a std map's growth at
/// that size moves).
pub const SMALL: usize = 1024;

/// The shard of a hash: its bits 47 to 56.
fn shard_of(h: u64) -> usize {
    ((h >> 47) as usize) & (SHARDS - 1)
}

/// A hash map of [`SHARDS`] std maps (see the module): the same calls as
/// `HashMap`'s that the module uses.
#[derive(Clone)]
pub struct Sharded<K, V, S> {
    /// Empty while the map is small, then [`SHARDS`] maps.
    shards: Box<[HashMap<K, V, S>]>,
    /// The entries while they are fewer than [`SMALL`] (a small map costs
    /// one std map, and one hash a call); empty once they are sharded
    /// (and where a shard index out of range would go: never, an index
    /// is below [`SHARDS`], but no panic may reach Redis).
    small: HashMap<K, V, S>,
    len: usize,
    hasher: S,
}

impl<K, V, S: Default> Default for Sharded<K, V, S> {
    fn default() -> Self {
        Sharded {
            shards: Box::default(),
            small: HashMap::default(),
            len: 0,
            hasher: S::default(),
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug, S> std::fmt::Debug for Sharded<K, V, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K, V, S> Sharded<K, V, S> {
    /// How many entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.shards
            .iter()
            .chain(std::iter::once(&self.small))
            .flat_map(|m| m.iter())
    }

    /// Every entry, its value writable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> + '_ {
        self.shards
            .iter_mut()
            .chain(std::iter::once(&mut self.small))
            .flat_map(|m| m.iter_mut())
    }

    /// How many entries its maps have room for, together (the memory it
    /// takes: this many of `(K, V)` and a byte each, and the maps).
    pub fn capacity(&self) -> usize {
        self.small.capacity() + self.shards.iter().map(HashMap::capacity).sum::<usize>()
    }

    /// How many pieces [`Sharded::piece_keys`] walks the map in: the
    /// small map, then each shard (one while the map is small).
    pub fn pieces(&self) -> usize {
        1 + self.shards.len()
    }

    /// The keys of piece `i` (`0..pieces()`): a map walked a piece at a
    /// time across calls, each a [`SHARDS`]th of a large map's keys (a key
    /// stays in its piece while the map is sharded; a small map is one
    /// piece of fewer than [`SMALL`]).
    pub fn piece_keys(&self, i: usize) -> impl Iterator<Item = &K> + '_ {
        let piece = match i.checked_sub(1) {
            None => Some(&self.small),
            Some(at) => self.shards.get(at),
        };
        piece.into_iter().flat_map(|m| m.keys())
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Every value, writable.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.iter_mut().map(|(_, v)| v)
    }

    /// Keeps the entries `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let mut len = 0;
        for m in self
            .shards
            .iter_mut()
            .chain(std::iter::once(&mut self.small))
        {
            m.retain(&mut keep);
            len += m.len();
        }
        self.len = len;
    }

    /// Every entry taken out (the map empty after, its shards kept).
    pub fn drain(&mut self) -> impl Iterator<Item = (K, V)> + '_ {
        self.len = 0;
        self.shards
            .iter_mut()
            .chain(std::iter::once(&mut self.small))
            .flat_map(|m| m.drain())
    }

    /// Every entry dropped.
    pub fn clear(&mut self) {
        self.shards = Box::default();
        self.small.clear();
        self.len = 0;
    }
}

impl<K: Eq + Hash, V, S: BuildHasher + Clone> Sharded<K, V, S> {
    /// An empty map hashed by `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        Sharded {
            shards: Box::default(),
            small: HashMap::with_hasher(hasher.clone()),
            len: 0,
            hasher,
        }
    }

    fn at<Q: ?Sized + Hash>(&self, k: &Q) -> usize {
        shard_of(self.hasher.hash_one(k))
    }

    fn shard<Q: ?Sized + Hash>(&self, k: &Q) -> &HashMap<K, V, S> {
        if self.shards.is_empty() {
            return &self.small;
        }
        self.shards.get(self.at(k)).unwrap_or(&self.small)
    }

    fn shard_mut<Q: ?Sized + Hash>(&mut self, k: &Q) -> &mut HashMap<K, V, S> {
        if self.shards.is_empty() {
            return &mut self.small;
        }
        let at = self.at(k);
        match self.shards.get_mut(at) {
            Some(m) => m,
            None => &mut self.small,
        }
    }

    /// The shard of `k` for an insert: the shards made when the small map
    /// is full (its [`SMALL`] entries moved into them).
    fn made<Q: ?Sized + Hash>(&mut self, k: &Q) -> &mut HashMap<K, V, S> {
        if self.shards.is_empty() && self.small.len() >= SMALL {
            self.shards = (0..SHARDS)
                .map(|_| HashMap::with_hasher(self.hasher.clone()))
                .collect();
            let small =
                std::mem::replace(&mut self.small, HashMap::with_hasher(self.hasher.clone()));
            for (k, v) in small {
                let at = self.at(&k);
                match self.shards.get_mut(at) {
                    Some(m) => m.insert(k, v),
                    None => self.small.insert(k, v),
                };
            }
        }
        self.shard_mut(k)
    }

    /// The value of `k`.
    pub fn get<Q: ?Sized + Hash + Eq>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.shard(k).get(k)
    }

    /// Gives back the room of `k`'s piece when it is at most an eighth
    /// full (a piece of a map that shrank, resized to what it holds: a
    /// piece's worth of work, so that a map emptied one removal at a time
    /// frees its room as it goes, not all at its drop).
    pub fn shrink_piece_of<Q: ?Sized + Hash>(&mut self, k: &Q) {
        let m = self.shard_mut(k);
        if m.capacity() > 64 && m.len() * 8 < m.capacity() {
            m.shrink_to_fit();
        }
    }

    /// The value of `k`, writable.
    pub fn get_mut<Q: ?Sized + Hash + Eq>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.shard_mut(k).get_mut(k)
    }

    /// Whether `k` has a value.
    pub fn contains_key<Q: ?Sized + Hash + Eq>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.get(k).is_some()
    }

    /// `k`'s value set to `v`: the one it had.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let old = self.made(&k).insert(k, v);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// `k`'s value taken out.
    pub fn remove<Q: ?Sized + Hash + Eq>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let v = self.shard_mut(k).remove(k);
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    /// `k`'s entry, to read, fill or take out.
    pub fn entry(&mut self, k: K) -> Entry<'_, K, V> {
        // The shard borrowed beside the count.
        self.made(&k);
        let at = if self.shards.is_empty() {
            SHARDS
        } else {
            self.at(&k)
        };
        let Sharded {
            shards, small, len, ..
        } = self;
        let e = match shards.get_mut(at) {
            Some(m) => m.entry(k),
            None => small.entry(k),
        };
        match e {
            hash_map::Entry::Occupied(o) => Entry::Occupied(OccupiedEntry { o, len }),
            hash_map::Entry::Vacant(v) => Entry::Vacant(VacantEntry { v, len }),
        }
    }
}

/// One shard, given as is (how [`IntoIter`] flattens the shards).
type AsIs<K, V, S> = fn(HashMap<K, V, S>) -> HashMap<K, V, S>;

/// A [`Sharded`] map's entries taken over, in no order.
pub type IntoIter<K, V, S> = std::iter::FlatMap<
    std::iter::Chain<std::vec::IntoIter<HashMap<K, V, S>>, std::iter::Once<HashMap<K, V, S>>>,
    HashMap<K, V, S>,
    AsIs<K, V, S>,
>;

impl<K, V, S> IntoIterator for Sharded<K, V, S> {
    type Item = (K, V);
    type IntoIter = IntoIter<K, V, S>;
    fn into_iter(self) -> Self::IntoIter {
        let id: AsIs<K, V, S> = |m| m;
        self.shards
            .into_vec()
            .into_iter()
            .chain(std::iter::once(self.small))
            .flat_map(id)
    }
}

impl<K: Eq + Hash, V, S: BuildHasher + Clone + Default> FromIterator<(K, V)> for Sharded<K, V, S> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(items: I) -> Self {
        let mut map = Sharded::default();
        map.extend(items);
        map
    }
}

impl<K: Eq + Hash, V, S: BuildHasher + Clone> Extend<(K, V)> for Sharded<K, V, S> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, items: I) {
        for (k, v) in items {
            self.insert(k, v);
        }
    }
}

impl<K, V, S> Sharded<K, V, S> {
    /// Every value taken over.
    pub fn into_values(self) -> impl Iterator<Item = V> {
        self.into_iter().map(|(_, v)| v)
    }
}

/// An entry of a [`Sharded`] map, as std's `Entry`.
pub enum Entry<'a, K, V> {
    Occupied(OccupiedEntry<'a, K, V>),
    Vacant(VacantEntry<'a, K, V>),
}

/// An entry with a value.
pub struct OccupiedEntry<'a, K, V> {
    o: hash_map::OccupiedEntry<'a, K, V>,
    len: &'a mut usize,
}

/// An entry without one.
pub struct VacantEntry<'a, K, V> {
    v: hash_map::VacantEntry<'a, K, V>,
    len: &'a mut usize,
}

impl<'a, K, V> Entry<'a, K, V> {
    /// Its value, `v` put in if it had none.
    pub fn or_insert(self, v: V) -> &'a mut V {
        self.or_insert_with(|| v)
    }

    /// Its value, what `make` returns put in if it had none.
    pub fn or_insert_with(self, make: impl FnOnce() -> V) -> &'a mut V {
        match self {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(make()),
        }
    }

    /// Its value, the default put in if it had none.
    pub fn or_default(self) -> &'a mut V
    where
        V: Default,
    {
        self.or_insert_with(V::default)
    }
}

impl<'a, K, V> OccupiedEntry<'a, K, V> {
    pub fn key(&self) -> &K {
        self.o.key()
    }
    pub fn get(&self) -> &V {
        self.o.get()
    }
    pub fn get_mut(&mut self) -> &mut V {
        self.o.get_mut()
    }
    pub fn into_mut(self) -> &'a mut V {
        self.o.into_mut()
    }
    /// The entry taken out: its value.
    pub fn remove(self) -> V {
        *self.len -= 1;
        self.o.remove()
    }
}

impl<'a, K, V> VacantEntry<'a, K, V> {
    pub fn key(&self) -> &K {
        self.v.key()
    }
    /// `v` put in: the value in the map.
    pub fn insert(self, v: V) -> &'a mut V {
        *self.len += 1;
        self.v.insert(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_hold_every_key_once() {
        let mut m: Sharded<u64, (), std::collections::hash_map::RandomState> = Sharded::default();
        for n in [10u64, 5000] {
            while (m.len() as u64) < n {
                m.insert(m.len() as u64, ());
            }
            let mut seen: Vec<u64> = (0..m.pieces())
                .flat_map(|i| m.piece_keys(i).copied())
                .collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(m.piece_keys(m.pieces()).count(), 0);
    }
    use proptest::prelude::*;
    use std::collections::hash_map::RandomState;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Get(u16),
        EntryAdd(u16, u32),
        EntryTake(u16),
        Retain(u16),
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Keys from a small range, so that removes and entries hit.
        let k = 0u16..2_000;
        prop_oneof![
            6 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => k.clone().prop_map(Op::Remove),
            2 => k.clone().prop_map(Op::Get),
            3 => (k.clone(), any::<u32>()).prop_map(|(k, v)| Op::EntryAdd(k, v)),
            2 => k.clone().prop_map(Op::EntryTake),
            1 => (1u16..8).prop_map(Op::Retain),
            1 => Just(Op::Drain),
        ]
    }

    fn same(s: &Sharded<u16, u32, RandomState>, m: &HashMap<u16, u32>) {
        assert_eq!(s.len(), m.len());
        assert_eq!(s.is_empty(), m.is_empty());
        let mut a: Vec<(u16, u32)> = s.iter().map(|(k, v)| (*k, *v)).collect();
        let mut b: Vec<(u16, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    proptest! {
        #[test]
        fn sharded_map_is_a_hash_map(ops in proptest::collection::vec(op(), 0..1_000)) {
            let mut s: Sharded<u16, u32, RandomState> = Sharded::default();
            let mut m: HashMap<u16, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(s.insert(k, v), m.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(s.remove(&k), m.remove(&k)),
                    Op::Get(k) => {
                        prop_assert_eq!(s.get(&k), m.get(&k));
                        prop_assert_eq!(s.contains_key(&k), m.contains_key(&k));
                        if let Some(v) = s.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = m.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    Op::EntryAdd(k, v) => {
                        *s.entry(k).or_insert(v) ^= 1;
                        *m.entry(k).or_insert(v) ^= 1;
                    }
                    Op::EntryTake(k) => {
                        let a = match s.entry(k) {
                            Entry::Occupied(o) => Some(o.remove()),
                            Entry::Vacant(v) => {
                                v.insert(7);
                                None
                            }
                        };
                        let b = match m.entry(k) {
                            hash_map::Entry::Occupied(o) => Some(o.remove()),
                            hash_map::Entry::Vacant(v) => {
                                v.insert(7);
                                None
                            }
                        };
                        prop_assert_eq!(a, b);
                    }
                    Op::Retain(n) => {
                        s.retain(|k, _| k % n != 0);
                        m.retain(|k, _| k % n != 0);
                    }
                    Op::Drain => {
                        let mut a: Vec<(u16, u32)> = s.drain().collect();
                        let mut b: Vec<(u16, u32)> = m.drain().collect();
                        a.sort_unstable();
                        b.sort_unstable();
                        prop_assert_eq!(a, b);
                    }
                }
                same(&s, &m);
            }
            let mut a: Vec<(u16, u32)> = s.into_iter().collect();
            let mut b: Vec<(u16, u32)> = m.into_iter().collect();
            a.sort_unstable();
            b.sort_unstable();
            prop_assert_eq!(a, b);
        }
    }

    /// A growth moves one shard: the entries spread over every shard, and
    /// no shard holds much more than its share.
    #[test]
    fn entries_spread_over_the_shards() {
        let mut s: Sharded<u64, (), RandomState> = Sharded::default();
        for k in 0..(SHARDS as u64 * 400) {
            s.insert(k, ());
        }
        let largest = s.shards.iter().map(HashMap::len).max().unwrap_or(0);
        let smallest = s.shards.iter().map(HashMap::len).min().unwrap_or(0);
        assert!(largest < 600, "largest shard {largest}");
        assert!(smallest > 250, "smallest shard {smallest}");
        assert_eq!(s.len(), SHARDS * 400);
    }
}
