//! Getting `INFO lock` into Prometheus: redis_exporter (Debian's
//! prometheus-redis-exporter, installed by scripts/client-deps.sh) with the
//! Lua script clients/prometheus/lock-metrics.lua, against a server started
//! here; /metrics scraped over loopback.

use crate::common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The value of `redis_script_values{key="<field>"}`.
fn metric(text: &str, field: &str) -> Option<f64> {
    let prefix = format!("redis_script_values{{key=\"{field}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn redis_exporter_with_the_lock_script_exports_info_lock() {
    let binary = "prometheus-redis-exporter";
    assert!(
        Command::new(binary).arg("--version").output().is_ok(),
        "{binary} is missing: run `make test` (scripts/client-deps.sh installs Debian's \
         prometheus-redis-exporter)"
    );
    let s = Server::start();
    let mut c = s.conn();
    c.acquire("k", "holder", 60_000).int();
    let mut w = s.conn();
    w.send(&["LOCK.ACQUIRE", "k", "waiter", "60000", "WAIT", "5000"])
        .unwrap();
    sleep_ms(120);
    c.release("k", "holder").int();
    assert!(w.read_reply().unwrap().int() > 0);

    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/prometheus/lock-metrics.lua");
    let port = free_port();
    let _exporter = Exporter(
        Command::new(binary)
            .arg("-redis.addr")
            .arg(format!("redis://127.0.0.1:{}", s.port))
            .arg("-script")
            .arg(&script)
            .arg("-web.listen-address")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the exporter"),
    );
    let mut text = String::new();
    wait_until(
        Duration::from_secs(10),
        "the exporter to serve /metrics",
        || {
            text = scrape(port).unwrap_or_default();
            text.contains("redis_script_values")
        },
    );
    assert_eq!(metric(&text, "lock_keys"), Some(1.0), "{text}");
    assert_eq!(metric(&text, "lock_grants"), Some(2.0));
    assert_eq!(metric(&text, "lock_wait_ms_count"), Some(1.0));
    assert!(metric(&text, "lock_wait_ms_sum").is_some_and(|v| v >= 100.0));
    assert_eq!(metric(&text, "lock_wait_ms_le_1000"), Some(1.0));
    assert_eq!(metric(&text, "lock_hold_ms_count"), Some(1.0));
    assert!(
        text.contains("redis_up 1"),
        "the exporter reached the server"
    );
}
