//! A CPU quota for chosen processes: a child cgroup of the test's own, with `quota_ms` of CPU
//! time per `period_ms` for all its processes together. Once they used the quota, the kernel
//! runs none of their threads until the period ends: a holder's renewal thread runs late, as on
//! an overloaded host or in a container at its CPU limit.
//!
//! cgroup v2 (`cpu.max`, where `/sys/fs/cgroup/cgroup.controllers` lists `cpu`) or else v1
//! (`/sys/fs/cgroup/cpu`, `cpu.cfs_quota_us` and `cpu.cfs_period_us`). Needs root (or a
//! delegated cgroup); a missing or read-only hierarchy fails naming what it tried. On drop the
//! processes go back to the parent cgroup and the child is removed, also when the test fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::poll_until;

/// A child cgroup with a CPU quota; removed on drop.
pub struct CpuThrottle {
    dir: PathBuf,
    parent: PathBuf,
}

/// Which cgroup hierarchy controls CPU here, and its root.
fn hierarchy() -> Result<(bool, PathBuf), String> {
    let v2 = Path::new("/sys/fs/cgroup");
    if fs::read_to_string(v2.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
    {
        return Ok((true, v2.to_path_buf()));
    }
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Ok((false, v1.to_path_buf()));
    }
    Err(
        "no cgroup hierarchy with the cpu controller: neither /sys/fs/cgroup/cgroup.controllers \
         (v2) lists cpu nor /sys/fs/cgroup/cpu/cpu.cfs_quota_us (v1) exists"
            .to_owned(),
    )
}

impl CpuThrottle {
    /// Where the cgroup is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A child cgroup allowing `quota_ms` of CPU every `period_ms` (at most 1000).
    pub fn new(quota_ms: u64, period_ms: u64) -> CpuThrottle {
        let (v2, root) = hierarchy().unwrap_or_else(|e| panic!("cannot throttle a process: {e}"));
        static MADE: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "fencelock-throttle-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let dir = root.join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "cannot create the cgroup {}: {e} (it needs root, or a delegated cgroup)",
                dir.display()
            )
        });
        let throttle = CpuThrottle { dir, parent: root };
        let (quota_us, period_us) = (quota_ms * 1000, period_ms * 1000);
        if v2 {
            throttle.write("cpu.max", &format!("{quota_us} {period_us}"));
        } else {
            throttle.write("cpu.cfs_period_us", &period_us.to_string());
            throttle.write("cpu.cfs_quota_us", &quota_us.to_string());
        }
        throttle
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value)
            .unwrap_or_else(|e| panic!("cannot write {value:?} to {}: {e}", path.display()));
    }

    /// Moves process `pid` (every thread of it) into the cgroup.
    pub fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// How often the kernel held the cgroup back (`nr_throttled` of `cpu.stat`).
    pub fn throttled(&self) -> u64 {
        fs::read_to_string(self.dir.join("cpu.stat"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for CpuThrottle {
    /// Moves every process back to the parent cgroup and removes the child (bounded: 5 s; a
    /// cgroup that cannot be removed is reported, never a panic in a drop).
    fn drop(&mut self) {
        let removed = poll_until(Duration::from_secs(5), Duration::from_millis(20), || {
            for pid in self.pids() {
                let _ = fs::write(self.parent.join("cgroup.procs"), pid.to_string());
            }
            fs::remove_dir(&self.dir).map_err(|e| e.to_string())
        });
        if let Err(e) = removed {
            eprintln!("cannot remove the cgroup {}: {e}", self.dir.display());
        }
    }
}
