//! The set-up script the Makefile runs before every target (scripts/deps.sh):
//! silent, instant and needing no root when everything is installed; it
//! installs (apt-get) only what is missing. Run with stub `apt-get`, `sudo`
//! and `id` on a PATH of its own: nothing is installed for real.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A PATH directory with the real tools the script needs, the ones in
/// `present` among redis-server/redis-cli/cc/callgrind_control (valgrind), and
/// stubs that log their calls.
fn fake_path(dir: &Path, present: &[&str], uid: u32) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let which = |tool: &str| -> Option<PathBuf> {
        let out = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .ok()?;
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!p.is_empty()).then(|| PathBuf::from(p))
    };
    for tool in ["bash", "env", "cat"].iter().chain(present) {
        let real = which(tool).unwrap_or_else(|| panic!("{tool} is not installed here"));
        symlink(real, bin.join(tool)).unwrap();
    }
    let log = dir.join("calls.log");
    let stub = |name: &str, body: &str| {
        let p = bin.join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    };
    let record = format!("echo \"$0 $*\" >> {}", log.display());
    stub("apt-get", &record);
    stub("id", &format!("echo {uid}"));
    if uid == 0 {
        stub("systemctl", "exit 0");
    }
    bin
}

fn run(present: &[&str], uid: u32) -> (bool, String, String) {
    let dir = std::env::temp_dir().join(format!(
        "redis-lock-setup-{}-{}-{uid}",
        std::process::id(),
        present.len()
    ));
    let _ = fs::remove_dir_all(&dir);
    let bin = fake_path(&dir, present, uid);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/deps.sh");
    let out = Command::new(bin.join("bash"))
        .arg(&script)
        .env_clear()
        .env("PATH", &bin)
        .output()
        .expect("run scripts/deps.sh");
    let calls = fs::read_to_string(dir.join("calls.log")).unwrap_or_default();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = fs::remove_dir_all(&dir);
    (out.status.success(), calls, stderr)
}

#[test]
fn with_everything_installed_it_is_silent_and_needs_no_root() {
    let (ok, calls, stderr) = run(
        &["redis-server", "redis-cli", "cc", "callgrind_control"],
        1000,
    );
    assert!(ok, "deps.sh failed: {stderr}");
    assert!(calls.is_empty(), "apt-get was called: {calls}");
    assert!(stderr.is_empty(), "not silent: {stderr}");
}

#[test]
fn a_missing_server_is_installed_with_apt_get() {
    let (ok, calls, stderr) = run(&["redis-cli", "cc"], 0);
    assert!(ok, "deps.sh failed: {stderr}");
    assert!(calls.contains("install"), "apt-get install: {calls}");
    assert!(calls.contains("redis-server"), "{calls}");
    assert!(!calls.contains("libclang"), "libclang is there: {calls}");
}

#[test]
fn a_missing_valgrind_is_installed_for_the_instruction_gate() {
    let (ok, calls, stderr) = run(&["redis-server", "redis-cli", "cc"], 0);
    assert!(ok, "deps.sh failed: {stderr}");
    assert!(calls.contains("install"), "apt-get install: {calls}");
    assert!(calls.contains("valgrind"), "{calls}");
    assert!(
        !calls.contains("redis-server"),
        "the server is there: {calls}"
    );
}

#[test]
fn without_root_a_missing_tool_is_a_clear_error() {
    let (ok, calls, stderr) = run(&["redis-cli", "cc"], 1000);
    assert!(!ok);
    assert!(calls.is_empty(), "{calls}");
    assert!(stderr.contains("need root"), "{stderr}");
}
