//! Medians, percentiles and number formatting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median of `k`'s rates over the rounds (NaN when it has none).
pub fn median_of<K: Hash + Eq>(rates: &HashMap<K, Vec<f64>>, k: &K) -> f64 {
    rates.get(k).map_or(f64::NAN, |r| median(r))
}

/// The median over rounds of (`a`'s rate / `base`'s rate) in the same
/// round: two rows run side by side compared round by round.
pub fn paired_ratio<K: Hash + Eq>(rates: &HashMap<K, Vec<f64>>, a: &K, base: &K) -> f64 {
    let (Some(a), Some(b)) = (rates.get(a), rates.get(base)) else {
        return f64::NAN;
    };
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median(&r)
}

/// A throughput run's results, whatever its rows (`K`): each row's rate in
/// each round, and how the run was made.
pub struct Rounds<K> {
    pub rates: HashMap<K, Vec<f64>>,
    pub requests: usize,
    pub rounds: usize,
    pub conns: usize,
    pub pipeline: usize,
    pub problems: Vec<String>,
}

impl<K: Hash + Eq> Rounds<K> {
    pub fn new(requests: usize, rounds: usize, conns: usize, pipeline: usize) -> Rounds<K> {
        Rounds {
            rates: HashMap::new(),
            requests,
            rounds,
            conns,
            pipeline,
            problems: Vec::new(),
        }
    }

    pub fn median(&self, k: K) -> f64 {
        median_of(&self.rates, &k)
    }

    /// Median over rounds of (rate of `k` / rate of `base`) in the same round.
    pub fn paired_ratio(&self, k: K, base: K) -> f64 {
        paired_ratio(&self.rates, &k, &base)
    }
}

pub fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// Percentiles of durations in microseconds (nearest rank).
pub struct Percentiles {
    sorted: Vec<u64>,
}

impl Percentiles {
    pub fn new(mut us: Vec<u64>) -> Percentiles {
        us.sort_unstable();
        Percentiles { sorted: us }
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// The `p`-th percentile (0..=100), in microseconds; NaN when empty.
    pub fn at(&self, p: f64) -> f64 {
        if self.sorted.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.sorted.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.sorted.len()) - 1;
        self.sorted[i] as f64
    }

    pub fn max(&self) -> f64 {
        self.sorted.last().map_or(f64::NAN, |&x| x as f64)
    }
}

pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `123456.7` -> `123k`, `1234567` -> `1.23M`.
pub fn rate(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Microseconds as a readable duration: `850 µs`, `12.3 ms`, `1.20 s`.
pub fn dur_us(us: f64) -> String {
    if !us.is_finite() {
        "-".into()
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 100_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us < 1_000_000.0 {
        format!("{:.0} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

pub fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

pub fn bytes(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e7 {
        format!("{:.1} MB", x / 1e6)
    } else {
        format!("{x:.0} B")
    }
}
