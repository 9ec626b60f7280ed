//! Reading INFO and `LOCK.INFO`: [`info_get`], [`LockInfo`], [`assert_same_lock`].

use super::*;

/// The value of `field` in an INFO text.
pub fn info_get(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_string())
    })
}

/// One holder as listed by `LOCK.INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    pub owner: Vec<u8>,
    pub holds: i64,
    pub ttl: i64,
    pub token: i64,
}

/// A lock's mode, `(owner, holds, token)` of each holder, and waiters.
pub type Stable = (String, Vec<(Vec<u8>, i64, i64)>, i64);

/// `LOCK.INFO` parsed; holders sorted by owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    pub mode: String,
    pub holders: Vec<HolderInfo>,
    pub waiters: i64,
    /// A semaphore's limit (`None` for a lock).
    pub limit: Option<i64>,
}

impl LockInfo {
    /// Parses a `LOCK.INFO` reply, checking its exact shape (flat array in
    /// RESP2, map in RESP3: `mode`, `holders`, `waiters` in that order).
    pub fn parse(r: &Reply) -> Option<LockInfo> {
        if r.is_nil() {
            return None;
        }
        let pairs: Vec<(String, Reply)> = match r {
            Reply::Array(a) => {
                assert!(
                    a.len() == 6 || a.len() == 8,
                    "LOCK.INFO (RESP2) has 6 elements (8 for a semaphore): {r:?}"
                );
                r.pairs()
            }
            Reply::Map(m) => {
                assert!(
                    m.len() == 3 || m.len() == 4,
                    "LOCK.INFO (RESP3) has 3 entries (4 for a semaphore): {r:?}"
                );
                r.pairs()
            }
            other => panic!("LOCK.INFO: expected an array, a map or nil, got {other:?}"),
        };
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        let mode = pairs[0].1.str();
        let want: &[&str] = match mode.as_str() {
            "semaphore" => &["mode", "holders", "waiters", "limit"],
            _ => &["mode", "holders", "waiters"],
        };
        assert_eq!(keys, want, "LOCK.INFO keys: {r:?}");
        assert!(
            mode == "exclusive" || mode == "shared" || mode == "semaphore",
            "LOCK.INFO mode is exclusive, shared or semaphore: {r:?}"
        );
        let limit = pairs.get(3).map(|(_, l)| l.int());
        let mut holders: Vec<HolderInfo> = pairs[1]
            .1
            .array()
            .iter()
            .map(|h| {
                let h = h.array();
                assert_eq!(h.len(), 4, "a holder is [owner, holds, ttl, token]: {r:?}");
                HolderInfo {
                    owner: h[0].bulk().to_vec(),
                    holds: h[1].int(),
                    ttl: h[2].int(),
                    token: h[3].int(),
                }
            })
            .collect();
        holders.sort_by(|a, b| a.owner.cmp(&b.owner));
        let waiters = pairs[2].1.int();
        Some(LockInfo {
            mode,
            holders,
            waiters,
            limit,
        })
    }

    /// The holder named `owner`; panics if absent.
    pub fn holder(&self, owner: impl AsRef<[u8]>) -> &HolderInfo {
        let owner = owner.as_ref();
        self.holders
            .iter()
            .find(|h| h.owner == owner)
            .unwrap_or_else(|| panic!("no holder {:?} in {self:?}", show(owner)))
    }

    /// Owners, holds and tokens (everything but the time-dependent ttl).
    pub fn stable(&self) -> Stable {
        (
            self.mode.clone(),
            self.holders
                .iter()
                .map(|h| (h.owner.clone(), h.holds, h.token))
                .collect(),
            self.waiters,
        )
    }
}

/// Asserts that two `LOCK.INFO` states are equal except for the ttls, which
/// may differ by at most `ttl_slack` ms.
pub fn assert_same_lock(a: &Option<LockInfo>, b: &Option<LockInfo>, ttl_slack: i64, what: &str) {
    match (a, b) {
        (None, None) => {}
        (Some(a), Some(b)) => {
            assert_eq!(a.stable(), b.stable(), "{what}: {a:?} vs {b:?}");
            for (x, y) in a.holders.iter().zip(&b.holders) {
                assert!(
                    (x.ttl - y.ttl).abs() <= ttl_slack,
                    "{what}: ttl of {:?} differs by more than {ttl_slack} ms: {a:?} vs {b:?}",
                    show(&x.owner)
                );
            }
        }
        _ => panic!("{what}: {a:?} vs {b:?}"),
    }
}

/// `major.minor` of the server (Valkey reports its Redis compatibility version
/// as `redis_version`, 7.2.4).
pub fn server_version(c: &mut Conn) -> (u32, u32) {
    let v = c.info_field("server", "redis_version");
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}
