//! A history recorder in the manner of Jepsen: every operation of every client is written as an
//! `invoke` line when it starts and an `ok`, `fail` or `unknown` line when it ends, one JSON
//! object per line, to a file of the process that ran it. `tests/checker/check.py` reads the
//! files of all processes of a run and checks them; it shares no code with fencelock or with
//! this file, only the format below.
//!
//! Times are CLOCK_MONOTONIC nanoseconds, which every process on one machine shares, so the
//! histories of several processes merge into one. Each line:
//!
//! ```text
//! {"process":"c1t0","type":"invoke","f":"acquire","key":"k0","time":123456789}
//! {"process":"c1t0","type":"ok","f":"acquire","key":"k0","time":123999999,"token":42}
//! ```
//!
//! - `process`: the client thread (one operation at a time per process name);
//! - `type`: `invoke`, then `ok` (it took effect), `fail` (it certainly did not) or `unknown` (it
//!   may or may not have: a timeout, a broken connection); `info` for a line that is no
//!   operation of a client;
//! - `f`: `acquire`, `release`, `incr` (the locked-set workload's read-modify-write), `read` (of
//!   the final value), `pause-client`, `pause-server`, `partition`, `kill-client`,
//!   `restart-server`, `failover` (the nemesis);
//! - `token` (acquire ok): the fencing token granted;
//! - `permits` (acquire, of a semaphore): the semaphore's count of permits; `mode` (acquire, of
//!   a read-write lock): `read` or `write`. An acquire with neither is of a plain lock;
//! - `last_held` (release invoke): the last time the client saw `is_held()` true before it
//!   released; the hold ends there;
//! - `value`, `read` (incr ok): the value written and the value read; `value` (read ok): the value
//!   read; `value` (nemesis): the pause or partition planned, in milliseconds;
//! - `error`: why a call failed or its outcome is unknown, in words;
//! - `target` (nemesis): what was paused, when not the server; who was cut from whom.
//!
//! Included with `#[path = "support/recorder.rs"] mod recorder;`.

#![allow(dead_code)] // the crafted histories and the workload use different parts

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// CLOCK_MONOTONIC in nanoseconds: comparable across the processes of one machine (unlike
/// `Instant`, which cannot leave its process).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is, and reads nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    // CLOCK_MONOTONIC is never negative.
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// What a history line says about its operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Invoke,
    Ok,
    Fail,
    /// The operation may or may not have taken effect.
    Unknown,
    Info,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Invoke => "invoke",
            Type::Ok => "ok",
            Type::Fail => "fail",
            Type::Unknown => "unknown",
            Type::Info => "info",
        }
    }
}

/// The outcome of a call that returned `e`: `unknown` if the command may have run (no reply in
/// time, or the connection broke after it may have been sent), `fail` otherwise (refused before
/// anything ran, or a definite answer such as a lost lock or a stale token).
pub fn outcome_of(e: &fencelock::Error) -> Type {
    // is_connection() covers is_timeout() too.
    if e.is_connection() {
        Type::Unknown
    } else {
        Type::Fail
    }
}

/// One history line.
#[derive(Clone, Debug)]
pub struct Event {
    pub process: String,
    pub kind: Type,
    pub f: &'static str,
    pub key: Option<String>,
    pub time: u64,
    pub token: Option<u64>,
    pub last_held: Option<u64>,
    pub value: Option<i64>,
    pub read: Option<i64>,
    pub error: Option<String>,
    pub target: Option<String>,
    pub permits: Option<u32>,
    pub mode: Option<&'static str>,
}

impl Event {
    /// A line of `process` about `f` on `key`, stamped now.
    pub fn new(process: &str, kind: Type, f: &'static str, key: Option<&str>) -> Event {
        Event {
            process: process.to_owned(),
            kind,
            f,
            key: key.map(str::to_owned),
            time: monotonic_ns(),
            token: None,
            last_held: None,
            value: None,
            read: None,
            error: None,
            target: None,
            permits: None,
            mode: None,
        }
    }

    pub fn at(mut self, time: u64) -> Event {
        self.time = time;
        self
    }

    pub fn token(mut self, token: u64) -> Event {
        self.token = Some(token);
        self
    }

    pub fn last_held(mut self, time: u64) -> Event {
        self.last_held = Some(time);
        self
    }

    pub fn value(mut self, value: i64) -> Event {
        self.value = Some(value);
        self
    }

    pub fn read(mut self, value: i64) -> Event {
        self.read = Some(value);
        self
    }

    pub fn error(mut self, error: impl std::fmt::Display) -> Event {
        self.error = Some(error.to_string());
        self
    }

    pub fn target(mut self, target: &str) -> Event {
        self.target = Some(target.to_owned());
        self
    }

    /// An acquire of a semaphore of `n` permits.
    pub fn permits(mut self, n: u32) -> Event {
        self.permits = Some(n);
        self
    }

    /// An acquire of a read-write lock: `"read"` or `"write"`.
    pub fn mode(mut self, mode: &'static str) -> Event {
        self.mode = Some(mode);
        self
    }

    /// The JSON object, on one line, without the newline.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(128);
        out.push_str("{\"process\":");
        push_json_string(&mut out, &self.process);
        let _ = write!(
            out,
            ",\"type\":\"{}\",\"f\":\"{}\"",
            self.kind.as_str(),
            self.f
        );
        if let Some(key) = &self.key {
            out.push_str(",\"key\":");
            push_json_string(&mut out, key);
        }
        let _ = write!(out, ",\"time\":{}", self.time);
        if let Some(token) = self.token {
            let _ = write!(out, ",\"token\":{token}");
        }
        if let Some(t) = self.last_held {
            let _ = write!(out, ",\"last_held\":{t}");
        }
        if let Some(v) = self.value {
            let _ = write!(out, ",\"value\":{v}");
        }
        if let Some(v) = self.read {
            let _ = write!(out, ",\"read\":{v}");
        }
        if let Some(e) = &self.error {
            out.push_str(",\"error\":");
            push_json_string(&mut out, e);
        }
        if let Some(t) = &self.target {
            out.push_str(",\"target\":");
            push_json_string(&mut out, t);
        }
        if let Some(n) = self.permits {
            let _ = write!(out, ",\"permits\":{n}");
        }
        if let Some(m) = self.mode {
            let _ = write!(out, ",\"mode\":\"{m}\"");
        }
        out.push('}');
        out
    }
}

/// `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The history file of one process: lines appended one `write` each, unbuffered, so that a
/// process killed or frozen keeps every line it recorded.
pub struct Recorder {
    path: PathBuf,
    file: Mutex<File>,
}

impl Recorder {
    /// Creates (or truncates) the history file at `path`.
    pub fn create(path: &Path) -> Recorder {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot create history file {}: {e}", path.display()));
        Recorder {
            path: path.to_owned(),
            file: Mutex::new(file),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `event`. The time is taken by the caller; lines of one process may therefore be
    /// written slightly out of time order across threads (the checker sorts).
    pub fn record(&self, event: &Event) {
        let mut line = event.to_json();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("cannot write history file {}: {e}", self.path.display()));
    }

    /// Records the invocation of `f` on `key` by `process`, stamped now.
    pub fn invoke(&self, process: &str, f: &'static str, key: &str) {
        self.record(&Event::new(process, Type::Invoke, f, Some(key)));
    }
}
