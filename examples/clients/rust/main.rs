//! The Rust client example: holds `orders:42` on 127.0.0.1:PORT for two
//! seconds of work (the watchdog renews a 900 ms lease meanwhile), then
//! releases it.
//!
//!     cargo run --example lock-client -- 6379
//!
//! The helper is `redis_lock.rs` beside this file; tests/clients.rs tests it.

#[allow(dead_code)]
mod redis_lock;

use std::time::Duration;

use redis_lock::{with_lock, LockError, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = std::env::args().nth(1).unwrap_or_else(|| "6379".into());
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let opts = Options {
        ttl: Duration::from_millis(900),
        wait: Some(Duration::from_secs(5)),
        ..Options::default()
    };
    let written = with_lock(&client, "orders:42", &opts, |lease| {
        println!("holding orders:42, fencing token {}", lease.token());
        std::thread::sleep(Duration::from_secs(2)); // the work
        lease.check()?; // do not write with a lost lease
        Ok::<_, LockError>(format!("written with fencing token {}", lease.token()))
    })??;
    println!("{written}; released");
    Ok(())
}
