//! Databases' contents by name, so that `FLUSHDB`, `FLUSHALL` and `SWAPDB`
//! cost the module's tables O(1) whatever they hold (issue 38 item 1).
//!
//! A table that keeps entries by key (bindings, sessions' keys, the
//! connection leases' followers, the timer's index) keeps each under its
//! database's **home**, a number its own [`Homes`] hands out, not under the
//! database's number: a flush gives the flushed database a new home (the
//! old one is dead: its entries are recognised as gone when next looked
//! at), and `SWAPDB` swaps the homes of two databases (its entries follow
//! their keys without being rewritten). Each table keeps its counts by home,
//! so what it answers is exact right after the event; the dead entries go
//! later, a slice of the tick's share of the turn at a time: what a table
//! can hand over whole is thrown here ([`throw`]) and dropped by
//! [`drop_some`] from the timer's ticks (`timers::work_now`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// A database's contents, as a table names them (see the module's text).
pub type Home = i32;

/// Where a table keeps what belongs to no database yet (a follower loaded
/// before its key): never a database's home, never dead.
pub const NOWHERE: Home = -1;

/// One table's homes: which database each of its homes is now.
#[derive(Default, Clone, Debug)]
pub struct Homes {
    /// Database `db`'s home at `db` (made when first asked for).
    of_db: Vec<Option<Home>>,
    /// The next home handed out.
    next: Home,
}

impl Homes {
    /// Database `db`'s home, made if it has none yet (a negative `db`:
    /// [`NOWHERE`]).
    pub fn home(&mut self, db: i32) -> Home {
        let Ok(at) = usize::try_from(db) else {
            return NOWHERE;
        };
        if self.of_db.len() <= at {
            self.of_db.resize(at + 1, None);
        }
        let next = &mut self.next;
        match self.of_db.get_mut(at) {
            Some(Some(h)) => *h,
            Some(slot) => {
                let h = *next;
                *next = next.saturating_add(1);
                *slot = Some(h);
                h
            }
            None => NOWHERE,
        }
    }

    /// Database `db`'s home, if it has one (a negative `db`: [`NOWHERE`]).
    pub fn get(&self, db: i32) -> Option<Home> {
        match usize::try_from(db) {
            Ok(at) => self.of_db.get(at).copied().flatten(),
            Err(_) => Some(NOWHERE),
        }
    }

    /// The database whose home `home` is (`None`: a flush killed it).
    /// Linear in the databases in use (16 by default).
    pub fn db_of(&self, home: Home) -> Option<i32> {
        if home == NOWHERE {
            return Some(-1);
        }
        self.of_db
            .iter()
            .position(|h| *h == Some(home))
            .and_then(|db| i32::try_from(db).ok())
    }

    /// Whether `home` is a database's (or [`NOWHERE`]).
    pub fn is_live(&self, home: Home) -> bool {
        self.db_of(home).is_some()
    }

    /// FLUSHDB of `db` (-1: FLUSHALL): the homes that died; the databases
    /// get new ones when next asked.
    pub fn flushed(&mut self, db: i32) -> Vec<Home> {
        let mut dead = Vec::new();
        for (at, h) in self.of_db.iter_mut().enumerate() {
            if db == -1 || usize::try_from(db).is_ok_and(|db| db == at) {
                dead.extend(h.take());
            }
        }
        dead
    }

    /// SWAPDB `a` `b`: each database's contents are the other's.
    pub fn swap(&mut self, a: i32, b: i32) {
        let (a, b) = (self.home_slot(a), self.home_slot(b));
        if let (Some(a), Some(b)) = (a, b) {
            self.of_db.swap(a, b);
        }
    }

    fn home_slot(&mut self, db: i32) -> Option<usize> {
        let at = usize::try_from(db).ok()?;
        if self.of_db.len() <= at {
            self.of_db.resize(at + 1, None);
        }
        Some(at)
    }
}

/// The homes of a table whose entries outlive a flush (the waiting
/// registry: a request waits for a name, and a flush only frees it): a
/// permutation of the databases, each database its own home until a
/// `SWAPDB` exchanges two. Both ways O(1).
#[derive(Default, Clone, Debug)]
pub struct Swapped {
    /// Database `db`'s home at `db` (past the end: `db` itself).
    home_of: Vec<Home>,
    /// The database of home `h` at `h` (past the end: `h` itself).
    db_of: Vec<i32>,
}

impl Swapped {
    /// Database `db`'s home.
    pub fn home(&self, db: i32) -> Home {
        usize::try_from(db)
            .ok()
            .and_then(|at| self.home_of.get(at))
            .copied()
            .unwrap_or(db)
    }

    /// The database whose home `home` is.
    pub fn db(&self, home: Home) -> i32 {
        usize::try_from(home)
            .ok()
            .and_then(|at| self.db_of.get(at))
            .copied()
            .unwrap_or(home)
    }

    /// SWAPDB `a` `b`: each database's contents are the other's.
    pub fn swap(&mut self, a: i32, b: i32) {
        let (Ok(a), Ok(b)) = (usize::try_from(a), usize::try_from(b)) else {
            return;
        };
        let len = a.max(b) + 1;
        for table in [&mut self.home_of, &mut self.db_of] {
            while table.len() < len {
                table.push(i32::try_from(table.len()).unwrap_or(i32::MAX));
            }
        }
        self.home_of.swap(a, b);
        for db in [a, b] {
            let home = self
                .home_of
                .get(db)
                .copied()
                .and_then(|h| usize::try_from(h).ok());
            if let (Some(slot), Ok(db)) =
                (home.and_then(|h| self.db_of.get_mut(h)), i32::try_from(db))
            {
                *slot = db;
            }
        }
    }
}

/// What dead entries a table handed over whole: each step drops one piece.
type Pieces = Box<dyn Iterator<Item = ()> + Send>;

static GARBAGE: Mutex<VecDeque<Pieces>> = Mutex::new(VecDeque::new());
/// Whether [`GARBAGE`] has anything (the tick's cheap check).
static ANY: AtomicBool = AtomicBool::new(false);

fn garbage() -> std::sync::MutexGuard<'static, VecDeque<Pieces>> {
    GARBAGE.lock().unwrap_or_else(|p| p.into_inner())
}

/// What asks the timer for a tick (`timers::work_now`, registered at load:
/// the timer is above the tables that throw).
static WAKE: OnceLock<fn()> = OnceLock::new();

/// Registers what asks for a tick when something is thrown (once, at load).
pub fn on_throw(wake: fn()) {
    let _ = WAKE.set(wake);
}

/// Hands `pieces` over to be dropped a slice at a time (each item it yields
/// is one piece dropped), from the timer's next tick on ([`on_throw`]).
pub fn throw(pieces: impl Iterator<Item = ()> + Send + 'static) {
    garbage().push_back(Box::new(pieces));
    if !ANY.swap(true, Ordering::Relaxed) {
        if let Some(wake) = WAKE.get() {
            wake();
        }
    }
}

/// Whether anything thrown is left to drop.
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Drops thrown pieces, `per_look` between two calls of `over` (the tick's
/// share of the turn spent), until none is left or `over` says so. Whether
/// any is left.
pub fn drop_some(per_look: usize, over: impl Fn() -> bool) -> bool {
    if !any() {
        return false;
    }
    // Taken out while dropped: a piece's drop never runs under the lock.
    let mut current = garbage().pop_front();
    loop {
        let Some(mut pieces) = current.take() else {
            let left = !garbage().is_empty();
            ANY.store(left, Ordering::Relaxed);
            return left;
        };
        let done = pieces.by_ref().take(per_look).count() < per_look;
        if !done {
            current = Some(pieces);
        }
        if over() {
            let mut g = garbage();
            if let Some(rest) = current {
                g.push_front(rest);
            }
            let left = !g.is_empty();
            ANY.store(left, Ordering::Relaxed);
            return left;
        }
        if current.is_none() {
            current = garbage().pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_kill_homes_and_swaps_exchange_them() {
        let mut h = Homes::default();
        let (a, b) = (h.home(0), h.home(1));
        assert_ne!(a, b);
        assert_eq!(h.home(0), a);
        assert_eq!((h.db_of(a), h.db_of(b)), (Some(0), Some(1)));
        h.swap(0, 1);
        assert_eq!((h.db_of(a), h.db_of(b)), (Some(1), Some(0)));
        assert_eq!(h.get(0), Some(b));
        h.swap(0, 5);
        assert_eq!((h.get(0), h.get(5)), (None, Some(b)));
        assert_eq!(h.flushed(5), vec![b]);
        assert!(!h.is_live(b));
        let c = h.home(5);
        assert!(c != a && c != b);
        assert_eq!(h.flushed(-1), vec![a, c]);
        assert!(!h.is_live(a) && h.is_live(NOWHERE));
        assert_eq!(h.get(-1), Some(NOWHERE));
    }

    #[test]
    fn swaps_permute_the_databases() {
        let mut s = Swapped::default();
        assert_eq!((s.home(3), s.db(3)), (3, 3));
        s.swap(0, 5);
        s.swap(5, 2);
        // Database 0 holds what 5 held, 5 what 2 held, 2 what 0 held.
        assert_eq!((s.home(0), s.home(5), s.home(2)), (5, 2, 0));
        assert_eq!((s.db(5), s.db(2), s.db(0)), (0, 5, 2));
        assert_eq!((s.home(9), s.db(9), s.home(-1)), (9, 9, -1));
        s.swap(5, 2);
        s.swap(0, 5);
        assert_eq!(
            (0..7).map(|d| s.home(d)).collect::<Vec<_>>(),
            (0..7).collect::<Vec<_>>()
        );
    }

    #[test]
    fn thrown_pieces_are_dropped_a_slice_at_a_time() {
        let v: Vec<Box<u32>> = (0..1000).map(Box::new).collect();
        throw(v.into_iter().map(drop));
        let looks = std::cell::Cell::new(0);
        assert!(drop_some(100, || {
            looks.set(looks.get() + 1);
            looks.get() == 3
        }));
        assert!(!drop_some(100, || false));
        assert!(!any());
    }
}
