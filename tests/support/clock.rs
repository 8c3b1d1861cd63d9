//! Redis-servers whose wall clocks the test steps and skews: forward and back, by any amount, at
//! once, and running fast or slow. Redis expires keys by its wall clock, and the acquire script
//! mints tokens from it (`TIME`), so this is how a test shows what a clock fault on the server
//! does to a lock.
//!
//! A server runs with `clockshim.c` preloaded (built here with the system's C compiler, once per
//! test process), which turns every wall-clock reading into `real + offset + (real - anchor) ×
//! rate`, with the three read from a file of the server's own that a [`ServerClock`] writes.
//! Monotonic clocks are not touched, as a real clock step or a drifting oscillator leaves them.
//! [`SteppedServer`] is one server with its clock; the Sentinel, Cluster and quorum harnesses
//! give each data server one when asked (`clocks`).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{unique_temp_dir, RedisServer, ServerOptions};

/// The wall clock of one server process: a file the preloaded shim maps, and what was written.
pub struct ServerClock {
    path: PathBuf,
    file: File,
    state: Mutex<Setting>,
}

/// What the shim reads: the clock is `real + offset_ns + (real - anchor_ns) × rate_ppm / 10⁶`.
#[derive(Clone, Copy, Debug, Default)]
struct Setting {
    offset_ns: i64,
    seq: u64,
    anchor_ns: i64,
    rate_ppm: i64,
}

/// The test process's own wall clock (not shimmed), in ns.
fn real_ns() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_nanos()).expect("a time that fits")
}

impl ServerClock {
    /// A clock that reads true until stepped or skewed.
    pub fn new() -> ServerClock {
        let dir = unique_temp_dir("fencelock-clock");
        let path = dir.join("clock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        let clock = ServerClock {
            path,
            file,
            state: Mutex::new(Setting::default()),
        };
        {
            let mut s = clock.state.lock().unwrap_or_else(|p| p.into_inner());
            clock.write(&mut s);
        }
        clock
    }

    /// What a server's environment needs for this clock: `LD_PRELOAD` of the shim and the file.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            (OsString::from("LD_PRELOAD"), shim().clone().into()),
            (
                OsString::from("FENCELOCK_CLOCK_FILE"),
                self.path.clone().into(),
            ),
        ]
    }

    /// Steps the clock forward by `by`, at once.
    pub fn forward(&self, by: Duration) {
        self.step(i64::try_from(by.as_nanos()).expect("a step that fits"));
    }

    /// Steps the clock back by `by`, at once.
    pub fn back(&self, by: Duration) {
        self.step(-i64::try_from(by.as_nanos()).expect("a step that fits"));
    }

    fn step(&self, ns: i64) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.offset_ns += ns;
        self.write(&mut s);
    }

    /// From now on the clock runs at `rate` times the true rate (1.0: true; 4.0: four times
    /// fast; 0.5: half speed), without a jump: the skew so far becomes part of the offset.
    pub fn set_rate(&self, rate: f64) {
        assert!(rate > 0.0, "a clock runs forward");
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = real_ns();
        let skewed = i128::from(now - s.anchor_ns) * i128::from(s.rate_ppm) / 1_000_000;
        s.offset_ns += i64::try_from(skewed).expect("a skew that fits");
        s.anchor_ns = now;
        s.rate_ppm = ((rate - 1.0) * 1e6).round() as i64;
        self.write(&mut s);
    }

    /// How far the clock is from the true one now, in ns (positive: ahead).
    pub fn ahead_ns(&self) -> i64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let skewed = i128::from(real_ns() - s.anchor_ns) * i128::from(s.rate_ppm) / 1_000_000;
        s.offset_ns + i64::try_from(skewed).expect("a skew that fits")
    }

    /// Writes `s` under the sequence lock: `seq` odd while the other fields change. In place:
    /// the server has the file mapped, and a truncation would fault it.
    fn write(&self, s: &mut Setting) {
        let put = |at: u64, v: [u8; 8]| {
            self.file
                .write_all_at(&v, at)
                .unwrap_or_else(|e| panic!("cannot set the clock in {}: {e}", self.path.display()))
        };
        s.seq += 1;
        put(8, s.seq.to_ne_bytes());
        put(0, s.offset_ns.to_ne_bytes());
        put(16, s.anchor_ns.to_ne_bytes());
        put(24, s.rate_ppm.to_ne_bytes());
        s.seq += 1;
        put(8, s.seq.to_ne_bytes());
    }
}

impl Default for ServerClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ServerClock {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A redis-server with a clock of its own, and the handle to step it.
pub struct SteppedServer {
    pub server: RedisServer,
    pub clock: ServerClock,
}

impl SteppedServer {
    /// Starts a server (with `args`, as [`RedisServer::start_with`]) whose clock reads true until
    /// stepped.
    pub fn start_with(args: &[&str]) -> SteppedServer {
        let clock = ServerClock::new();
        let server = RedisServer::start_as(&ServerOptions {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: clock.env(),
            ..ServerOptions::default()
        });
        SteppedServer { server, clock }
    }

    /// Steps the server's wall clock forward by `by`, at once.
    pub fn forward(&mut self, by: Duration) {
        self.clock.forward(by);
    }

    /// Steps the server's wall clock back by `by`, at once.
    pub fn back(&mut self, by: Duration) {
        self.clock.back(by);
    }

    /// The server's `TIME`, in microseconds.
    pub fn time_us(&self) -> u64 {
        time_us(&self.server)
    }
}

/// `server`'s `TIME`, in microseconds.
pub fn time_us(server: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query(&mut server.connection())
        .unwrap_or_else(|e| panic!("TIME: {e}"));
    secs * 1_000_000 + micros
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
