//! A list that grows a piece at a time: [`Chunked`].
//!
//! Std's `Vec` grows by doubling, and the push that crosses a growth point
//! copies every element in one call: a connection's list of a million
//! bindings, or a lease's batch of a million followers, copies 8 to 16 MB
//! in one command (and page-faults the new buffer in). A list whose length
//! clients control is [`Chunked`] instead: its elements in chunks of
//! [`CHUNK`], every chunk but the last full, so a push copies at most a
//! chunk's growth (the first chunk grows as a `Vec` does, up to [`CHUNK`]:
//! a short list costs what a `Vec` costs) and the list of chunks (24 bytes
//! a chunk, a thousandth of the elements). An element's place is its
//! index, as in a `Vec`: `place / CHUNK` is its chunk.

/// How many elements a chunk holds.
pub const CHUNK: usize = 1024;

/// A `Vec` in chunks of [`CHUNK`] (see the module): the calls of `Vec`'s
/// that the module uses.
#[derive(Debug, Clone)]
pub struct Chunked<T> {
    /// Every chunk but the last holds [`CHUNK`] elements; none is empty
    /// but a first and only one ([`Chunked::clear`] keeps its room).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Chunked<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, v: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(v),
            _ => {
                // A chunk after the first is made at its full size: it
                // never grows.
                let mut chunk = match self.chunks.is_empty() {
                    true => Vec::new(),
                    false => Vec::with_capacity(CHUNK),
                };
                chunk.push(v);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    pub fn pop(&mut self) -> Option<T> {
        let last = self.chunks.last_mut()?;
        let v = last.pop();
        if last.is_empty() {
            self.chunks.pop();
        }
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    pub fn get(&self, at: usize) -> Option<&T> {
        self.chunks.get(at / CHUNK)?.get(at % CHUNK)
    }

    pub fn get_mut(&mut self, at: usize) -> Option<&mut T> {
        self.chunks.get_mut(at / CHUNK)?.get_mut(at % CHUNK)
    }

    pub fn last(&self) -> Option<&T> {
        self.chunks.last()?.last()
    }

    /// Removes the element at `at`, the last one taking its place.
    pub fn swap_remove(&mut self, at: usize) -> Option<T> {
        if at >= self.len {
            return None;
        }
        let last = self.pop()?;
        match self.get_mut(at) {
            Some(slot) => Some(std::mem::replace(slot, last)),
            // `at` was the last.
            None => Some(last),
        }
    }

    /// Empties the list, keeping the first chunk's room (at most a
    /// chunk's) for the next pushes.
    pub fn clear(&mut self) {
        self.chunks.truncate(1);
        if let Some(first) = self.chunks.first_mut() {
            first.clear();
        }
        self.len = 0;
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.chunks.iter().flatten()
    }

    /// Keeps the elements `keep` says, in order. Linear in the list (the
    /// caller bounds how often).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let old = std::mem::take(self);
        for v in old.into_iter() {
            if keep(&v) {
                self.push(v);
            }
        }
    }

    /// The index of the first element for which `pred` is false, the
    /// elements for which it is true all coming first (as `slice`'s).
    pub fn partition_point(&self, mut pred: impl FnMut(&T) -> bool) -> usize {
        let whole = self
            .chunks
            .partition_point(|c| c.last().is_some_and(&mut pred));
        let within = self
            .chunks
            .get(whole)
            .map_or(0, |c| c.partition_point(&mut pred));
        (whole * CHUNK + within).min(self.len)
    }

    /// The elements from `at` on.
    pub fn iter_from(&self, at: usize) -> impl Iterator<Item = &T> + '_ {
        let (chunk, within) = (at / CHUNK, at % CHUNK);
        self.chunks
            .iter()
            .skip(chunk)
            .enumerate()
            .flat_map(move |(i, c)| c.iter().skip(if i == 0 { within } else { 0 }))
    }
}

impl<T> IntoIterator for Chunked<T> {
    type Item = T;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model: a `Vec`, through random pushes, pops, swap-removes,
    /// retains and reads, across several chunks.
    #[test]
    fn chunked_is_a_vec() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut c = Chunked::default();
        let mut v = Vec::new();
        for step in 0..200_000u64 {
            match next() % 100 {
                0..=59 => {
                    c.push(step);
                    v.push(step);
                }
                60..=74 => assert_eq!(c.pop(), v.pop()),
                75..=84 if !v.is_empty() => {
                    let at = (next() as usize) % (v.len() + 2);
                    let want = (at < v.len()).then(|| v.swap_remove(at));
                    assert_eq!(c.swap_remove(at), want);
                }
                85 => {
                    let m = next() % 7 + 2;
                    c.retain(|x| x % m != 0);
                    v.retain(|x| x % m != 0);
                }
                _ if !v.is_empty() => {
                    let at = (next() as usize) % v.len();
                    assert_eq!(c.get(at), v.get(at));
                    if let Some(x) = c.get_mut(at) {
                        *x += 1;
                    }
                    v[at] += 1;
                }
                _ => {}
            }
            assert_eq!(c.len(), v.len());
            assert_eq!(c.last(), v.last());
        }
        assert!(c.iter().eq(v.iter()));
        assert!(c.clone().into_iter().eq(v.clone()));
        for at in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, v.len()] {
            assert!(c.iter_from(at).eq(v.get(at..).unwrap_or_default().iter()));
        }
        // partition_point on a sorted list.
        let sorted: Chunked<u64> = {
            let mut s = Chunked::default();
            (0..5000).for_each(|x| s.push(x * 2));
            s
        };
        let plain: Vec<u64> = (0..5000).map(|x| x * 2).collect();
        for probe in [0, 1, 2, 2047, 2048, 2049, 4095, 9998, 9999, 20000] {
            assert_eq!(
                sorted.partition_point(|x| *x <= probe),
                plain.partition_point(|x| *x <= probe)
            );
        }
        c.clear();
        assert!(c.is_empty() && c.pop().is_none() && c.swap_remove(0).is_none());
    }

    /// No push copies more than a chunk (and the list of chunks): every
    /// chunk after the first is made at its full size.
    #[test]
    fn pushes_never_move_a_full_chunk() {
        let mut c = Chunked::default();
        for i in 0..10 * CHUNK {
            c.push(i);
        }
        let first = c.chunks.first().map(|f| f.as_ptr());
        for i in 0..10 * CHUNK {
            c.push(i);
        }
        assert_eq!(c.chunks.first().map(|f| f.as_ptr()), first);
        assert!(c.chunks.iter().skip(1).all(|ch| ch.capacity() == CHUNK));
    }
}
