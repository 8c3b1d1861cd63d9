//! A redis-server whose wall clock the test steps: forward and back, by any amount, at once.
//! Redis expires keys by its wall clock, and the acquire script mints tokens from it (`TIME`),
//! so this is how a test shows what a clock step on the server does to a lock.
//!
//! The server runs with `clockshim.c` preloaded (built here with the system's C compiler, once
//! per test process), which adds to every wall-clock reading an offset the test writes into a
//! file of the server's own. Monotonic clocks are not touched, as a real clock step leaves them.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::{unique_temp_dir, RedisServer, ServerOptions};

/// A redis-server with a clock of its own, and the handle to step it.
pub struct SteppedServer {
    pub server: RedisServer,
    clock: File,
    offset_ns: i64,
}

impl SteppedServer {
    /// Starts a server (with `args`, as [`RedisServer::start_with`]) whose clock reads true until
    /// stepped.
    pub fn start_with(args: &[&str]) -> SteppedServer {
        let dir = unique_temp_dir("fencelock-clock");
        let path = dir.join("offset");
        let clock = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        clock
            .write_all_at(&0i64.to_ne_bytes(), 0)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let server = RedisServer::start_as(&ServerOptions {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![
                (OsString::from("LD_PRELOAD"), shim().clone().into()),
                (OsString::from("FENCELOCK_CLOCK_FILE"), path.into()),
            ],
            ..ServerOptions::default()
        });
        SteppedServer {
            server,
            clock,
            offset_ns: 0,
        }
    }

    /// Steps the server's wall clock forward by `by`, at once.
    pub fn forward(&mut self, by: Duration) {
        self.set(self.offset_ns + i64::try_from(by.as_nanos()).expect("a step that fits"));
    }

    /// Steps the server's wall clock back by `by`, at once.
    pub fn back(&mut self, by: Duration) {
        self.set(self.offset_ns - i64::try_from(by.as_nanos()).expect("a step that fits"));
    }

    fn set(&mut self, offset_ns: i64) {
        self.offset_ns = offset_ns;
        // In place: the server has the file mapped, and a truncation would fault it.
        self.clock
            .write_all_at(&offset_ns.to_ne_bytes(), 0)
            .unwrap_or_else(|e| panic!("cannot step the clock: {e}"));
    }

    /// The server's `TIME`, in microseconds.
    pub fn time_us(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query(&mut self.server.connection())
            .unwrap_or_else(|e| panic!("TIME: {e}"));
        secs * 1_000_000 + micros
    }
}

/// The shim, built once per test process.
fn shim() -> &'static PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = unique_temp_dir("fencelock-clockshim");
        let source = dir.join("clockshim.c");
        std::fs::write(&source, include_str!("clockshim.c"))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
        let lib = dir.join("libclockshim.so");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let built = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run the C compiler {cc:?} to build the clock shim: {e} (install one: apt-get install -y gcc)")
            });
        assert!(built.success(), "{cc} failed to build {}", source.display());
        lib
    })
}
