//! The one table of lock modes: every name, code, tag and counter slot of a
//! mode is read from [`Mode::row`], and every count by mode is a [`Census`]
//! (one slot per mode, indexed by the mode).
//!
//! Adding a lock kind means one variant here, its row, its place in
//! [`Mode::ALL`] (a test checks the order), and the kind's own logic
//! (`lock.rs`: how it admits a grant; `block.rs`: its header).

use std::ffi::CStr;

/// How a lock is held. The discriminant is the mode's slot in [`Mode::ALL`]
/// and in a [`Census`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Mode {
    Exclusive = 0,
    Shared = 1,
    /// Up to the lock's limit of holders, one permit each (`LOCK.SEMAPHORE`).
    Semaphore = 2,
}

/// One mode's row of the table.
#[derive(Clone, Copy)]
pub struct Row {
    /// The name in replies, in the replicated effect and the AOF
    /// (`effect`), and in `INFO` (`holders_<name>`).
    pub name: &'static CStr,
    /// The `INFO lock` field counting its holders.
    pub gauge: &'static CStr,
    /// The code saved in the RDB (encodings 1 and 2).
    pub code: u64,
    /// The first byte of a block held in it (`block`; encoding 3 saves it).
    pub tag: u8,
}

impl Mode {
    /// Every mode, each at its slot.
    pub const ALL: [Mode; 3] = [Mode::Exclusive, Mode::Shared, Mode::Semaphore];

    /// How many modes there are: the length of a [`Census`].
    pub const COUNT: usize = Mode::ALL.len();

    /// The table: one row per mode.
    pub const fn row(self) -> Row {
        match self {
            Mode::Exclusive => Row {
                name: c"exclusive",
                gauge: c"holders_exclusive",
                code: 0,
                tag: 0,
            },
            Mode::Shared => Row {
                name: c"shared",
                gauge: c"holders_shared",
                code: 1,
                tag: 1,
            },
            Mode::Semaphore => Row {
                name: c"semaphore",
                gauge: c"holders_semaphore",
                code: 2,
                tag: 2,
            },
        }
    }

    /// Its slot in [`Mode::ALL`] and in a [`Census`].
    pub const fn slot(self) -> usize {
        self as usize
    }

    /// The name used in replies and in the replication stream, NUL-terminated.
    pub fn c_name(self) -> &'static CStr {
        self.row().name
    }

    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("")
    }

    /// The mode with this name, if any.
    pub fn from_name(name: &[u8]) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.row().name.to_bytes() == name)
    }

    /// The code saved in the RDB.
    pub fn code(self) -> u64 {
        self.row().code
    }

    /// The mode saved as `code`, if any.
    pub fn from_code(code: u64) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.row().code == code)
    }

    /// The block tag of this mode.
    pub const fn tag(self) -> u8 {
        self.row().tag
    }

    /// The mode of a block tagged `tag`, if any.
    #[inline]
    pub fn from_tag(tag: u8) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.tag() == tag)
    }
}

/// A count by mode (holders, bindings): one slot per [`Mode`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct Census([usize; Mode::COUNT]);

impl Census {
    /// Nothing in any mode.
    pub const ZERO: Census = Census([0; Mode::COUNT]);

    /// `n` in `mode`, nothing in the others.
    #[inline]
    pub fn of(mode: Mode, n: usize) -> Census {
        let mut c = Census::ZERO;
        c.add(mode, n);
        c
    }

    /// The count in `mode`.
    pub fn get(&self, mode: Mode) -> usize {
        self.0.get(mode.slot()).copied().unwrap_or(0)
    }

    /// Adds `n` in `mode`.
    #[inline]
    pub fn add(&mut self, mode: Mode, n: usize) {
        if let Some(slot) = self.0.get_mut(mode.slot()) {
            *slot += n;
        }
    }

    /// Takes `n` from `mode`, stopping at zero.
    pub fn sub(&mut self, mode: Mode, n: usize) {
        if let Some(slot) = self.0.get_mut(mode.slot()) {
            *slot = slot.saturating_sub(n);
        }
    }

    /// Adds every count of `other`.
    pub fn add_all(&mut self, other: Census) {
        for (mode, n) in other.iter() {
            self.add(mode, n);
        }
    }

    /// Every mode with its count, in [`Mode::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = (Mode, usize)> {
        Mode::ALL.into_iter().zip(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_is_at_its_slot_and_its_row_is_its_own() {
        for (i, m) in Mode::ALL.into_iter().enumerate() {
            assert_eq!(m.slot(), i);
            assert_eq!(Mode::from_name(m.name().as_bytes()), Some(m));
            assert_eq!(Mode::from_code(m.code()), Some(m));
            assert_eq!(Mode::from_tag(m.tag()), Some(m));
            let gauge = format!("holders_{}", m.name());
            assert_eq!(m.row().gauge.to_bytes(), gauge.as_bytes());
        }
        assert_eq!(Mode::from_name(b"Exclusive"), None);
        assert_eq!(Mode::from_code(3), None);
        assert_eq!(Mode::from_tag(3), None);
    }

    #[test]
    fn a_census_counts_each_mode_apart() {
        let mut c = Census::of(Mode::Shared, 2);
        c.add(Mode::Semaphore, 1);
        c.add_all(Census::of(Mode::Shared, 3));
        c.sub(Mode::Exclusive, 4);
        let counts: Vec<(Mode, usize)> = c.iter().collect();
        assert_eq!(
            counts,
            vec![
                (Mode::Exclusive, 0),
                (Mode::Shared, 5),
                (Mode::Semaphore, 1)
            ]
        );
        assert_eq!(c.get(Mode::Shared), 5);
    }
}
