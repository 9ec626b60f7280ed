//! The fuzz runner (`lock_model::fuzz`) inside `cargo test`: pseudo-random
//! inputs from a seeded xorshift for `CORE_FUZZ_SECS` seconds (default 10;
//! `CORE_FUZZ_SEED` replays a run), and hand-made inputs for the corners.
//! The unbounded run is the cargo-fuzz target in `fuzz/` (`make fuzz`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lock_model::fuzz::{decode, run, XorShift};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs one input; on a failure prints what is needed to replay it.
fn run_reporting(data: &[u8], seed: u64, case: u64) {
    if let Err(e) = catch_unwind(AssertUnwindSafe(|| run(data))) {
        eprintln!(
            "core fuzz failure: seed {seed} (CORE_FUZZ_SEED={seed}), case {case}\n\
             input ({} bytes, hex): {}\ndecoded: {:#?}",
            data.len(),
            hex(data),
            decode(data)
        );
        std::panic::resume_unwind(e);
    }
}

/// The core under random operations and clock jumps, for a bounded time:
/// `CORE_FUZZ_SECS` (default 10), `CORE_FUZZ_SEED` to replay a run.
#[test]
fn core_fuzz_bounded() {
    let secs = env_u64("CORE_FUZZ_SECS").unwrap_or(10);
    let seed = env_u64("CORE_FUZZ_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = XorShift::new(seed);
    let until = Instant::now() + Duration::from_secs(secs);
    let mut cases = 0u64;
    let mut bytes = 0u64;
    // The corner cases first: empty and tiny inputs.
    for data in [&[][..], &[0], &[0xff; 64], &[7; 300]] {
        run_reporting(data, seed, cases);
    }
    while cases < 200 || Instant::now() < until {
        let data = rng.input();
        bytes += data.len() as u64;
        run_reporting(&data, seed, cases);
        cases += 1;
    }
    eprintln!("core fuzz: {cases} inputs, {bytes} bytes, seed {seed}, {secs} s");
}

/// Hand-made inputs that reach the corners: a backward jump past a
/// deadline and a token counter at its end.
#[test]
fn core_fuzz_corners() {
    // start: token near exhaustion, clock near the epoch
    let mut data = vec![0, 0, 0, 5, 0];
    // grants on key 0 by owners 0 and 1, clock forward 70, grant, back 70, grant
    data.extend([0, 1, 0, 0, 4, 1]); // Grant key0 Acquire owner0 ttl 2
    data.extend([6, 3, 70]); // forward 70
    data.extend([0, 1, 0, 1, 9, 5]); // Grant key0 Acquire owner1
    data.extend([8, 3, 70]); // back 70
    data.extend([0, 1, 2, 0, 9, 5]); // Grant key0 Read owner0
    data.extend([16, 1, 1, 1, 4, 4, 3]); // put
    run(&data);
    let mut rng = XorShift::new(42);
    for _ in 0..2000 {
        run(&rng.input());
    }
}
