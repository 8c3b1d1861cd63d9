#![allow(dead_code)] // each test binary uses a different subset

//! Test support: a throw-away `redis-server` per test, a child-process helper
//! (for lock holders in another process), a lock-hold history checker, a
//! loopback TCP fault proxy and the fault-injection tests' shared helpers.
//!
//! Included by each test binary (`tests/<area>/main.rs`) with
//! `#[path = "../support/mod.rs"] mod support;`, by the soak examples with
//! `#[path = "../tests/support/mod.rs"] mod support;`, and by the benches with
//! `#[path = "../../tests/support/mod.rs"] mod support;` (in `benches/locks/server.rs`).

#[cfg(target_os = "linux")]
pub mod cgroup;
pub mod clock;
pub mod cluster;
pub mod faults;
pub mod fenced_workload;
pub mod history;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod proxy;
pub mod quorum;
pub mod sentinel;
pub mod sets;
pub mod soak;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wake;
pub mod workload;

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{self, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError};

/// `Duration::from_millis(n)`.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How long a freshly spawned server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Readiness poll interval.
const READY_POLL: Duration = Duration::from_millis(10);
/// Attempts at finding a free port in `start`.
const START_TRIES: u32 = 10;
/// Attempts at re-binding the same port in `restart`.
const RESTART_TRIES: u32 = 10;
/// Upper bound on waiting for a SIGKILLed process to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeouts of `RedisServer::connection()`.
const CONN_TIMEOUT: Duration = Duration::from_secs(5);

const INSTALL_HINT: &str = "set REDIS_SERVER_BIN or install it: \
     `sudo apt-get install -y redis-server` on Debian/Ubuntu, `brew install redis` on macOS";

// ---------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// Calls `check` every `poll` until it returns `Ok`, at most `timeout` and at most
/// `timeout / poll + 1` times; `Err` carries the last reason it gave.
pub fn poll_until<T>(
    timeout: Duration,
    poll: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis() / poll.as_millis().max(1) + 1;
    let mut last = String::from("never checked");
    for _ in 0..max_polls {
        match check() {
            Ok(value) => return Ok(value),
            Err(why) => last = why,
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        thread::sleep(poll.min(deadline - now));
    }
    Err(last)
}

/// Creates a fresh, empty directory under `std::env::temp_dir()` whose name is
/// unique across threads and processes (pid + counter + nanos).
pub fn unique_temp_dir(prefix: &str) -> PathBuf {
    let base = std::env::temp_dir();
    let mut last_err = None;
    for _ in 0..100 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("{prefix}-{}-{n}-{nanos}", process::id()));
        match fs::create_dir(&path) {
            Ok(()) => return path,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => panic!("cannot create temp dir {}: {e}", path.display()),
        }
    }
    panic!(
        "cannot create a unique temp dir under {}: {last_err:?}",
        base.display()
    )
}

/// A port that was free on 127.0.0.1 a moment ago (bind :0, read, drop).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind 127.0.0.1:0 to find a free port: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr of a bound listener: {e}"))
        .port()
}

/// Sends `sig` to `pid`. Returns whether kill(2) succeeded.
///
/// Callers only pass the pid of a child process they still own and have not
/// reaped, so the pid cannot have been recycled for another process.
fn send_signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false; // never signal a process group or "every process"
    }
    // SAFETY: kill(2) takes two plain integers and touches no memory of ours;
    // `pid` is positive (a single process, never a group) and belongs to an
    // unreaped child of this process, so it cannot name an unrelated process.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Signals `child` only if it has not exited (and so has not been reaped) yet. After SIGSTOP it
/// returns once the process is stopped: kill(2) returns first, and a process running on the
/// other core runs on for a moment, which a test freezing a server before a request must not
/// leave to chance.
fn signal_if_alive(child: &mut process::Child, sig: libc::c_int) -> bool {
    let sent = match child.try_wait() {
        Ok(None) => send_signal(child.id(), sig),
        _ => false,
    };
    if sent && sig == libc::SIGSTOP {
        await_stopped(child.id());
    }
    sent
}

/// Waits (bounded: 5 s) until process `pid` runs no more: stopped (`T` in `/proc/<pid>/stat`), or
/// dead. Linux only; elsewhere it returns at once.
fn await_stopped(pid: u32) {
    #[cfg(target_os = "linux")]
    {
        let state = || {
            let stat =
                fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
            // "pid (comm) S ...": the state follows the last ')', as comm may hold one.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or("?")
                .to_string();
            // Z or X: it died meanwhile, and runs no more either.
            if matches!(state.as_str(), "T" | "t" | "Z" | "X") {
                Ok(())
            } else {
                Err(format!("state {state}"))
            }
        };
        if let Err(why) = poll_until(Duration::from_secs(5), Duration::from_millis(1), state) {
            panic!("process {pid} did not stop within 5 s of SIGSTOP: {why}");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = pid;
}

/// Polls `try_wait` until the child has exited or `timeout` passed.
fn reap(child: &mut process::Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// SIGCONT (in case it is stopped), SIGKILL, then reap (bounded). Never panics.
fn kill_and_reap(child: &mut process::Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    signal_if_alive(child, libc::SIGCONT);
    signal_if_alive(child, libc::SIGKILL);
    reap(child, REAP_TIMEOUT)
}

/// Lossy UTF-8 contents of `path` from byte `offset` on ("" if unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    if file.seek(SeekFrom::Start(offset)).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Server processes: one redis-server (a data server or a sentinel), and how
// the test's own connections log in to it
// ---------------------------------------------------------------------------

/// How the test's own connections to a server (readiness probes, [`RedisServer::connection`],
/// the probes of a [`sentinel::SentinelSet`]) log in: the ACL user and password it wants, and,
/// for a server that speaks only TLS, the CA that signed its certificate. The default is a plain
/// connection without credentials.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub username: Option<String>,
    pub password: Option<String>,
    /// PEM of the CA to trust: connect with TLS (needs the `tls` feature).
    pub tls_ca: Option<String>,
}

impl Access {
    /// A redis-rs client for `127.0.0.1:port` that logs in so.
    pub fn client(&self, port: u16) -> Result<redis::Client, String> {
        let mut login = redis::RedisConnectionInfo::default();
        if let Some(user) = &self.username {
            login = login.set_username(user);
        }
        if let Some(password) = &self.password {
            login = login.set_password(password);
        }
        match &self.tls_ca {
            None => {
                let info = redis::IntoConnectionInfo::into_connection_info(
                    redis::ConnectionAddr::Tcp("127.0.0.1".to_owned(), port),
                )
                .map_err(|e| format!("127.0.0.1:{port}: {e}"))?;
                redis::Client::open(info.set_redis_settings(login))
                    .map_err(|e| format!("127.0.0.1:{port}: {e}"))
            }
            Some(ca) => tls_client(port, login, ca),
        }
    }

    /// A connection to `127.0.0.1:port` whose connect, reads and writes time out after
    /// `timeout`.
    pub fn connect(&self, port: u16, timeout: Duration) -> Result<redis::Connection, String> {
        let con = self
            .client(port)?
            .get_connection_with_timeout(timeout)
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        con.set_read_timeout(Some(timeout))
            .map_err(|e| format!("set_read_timeout: {e}"))?;
        con.set_write_timeout(Some(timeout))
            .map_err(|e| format!("set_write_timeout: {e}"))?;
        Ok(con)
    }
}

#[cfg(feature = "tls")]
fn tls_client(
    port: u16,
    login: redis::RedisConnectionInfo,
    ca: &str,
) -> Result<redis::Client, String> {
    let addr = redis::ConnectionAddr::TcpTls {
        host: "127.0.0.1".to_owned(),
        port,
        insecure: false,
        tls_params: None,
    };
    let info = redis::IntoConnectionInfo::into_connection_info(addr)
        .map_err(|e| format!("127.0.0.1:{port}: {e}"))?
        .set_redis_settings(login);
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.as_bytes().to_vec()),
    };
    redis::Client::build_with_tls(info, certificates)
        .map_err(|e| format!("127.0.0.1:{port} (TLS): {e}"))
}

#[cfg(not(feature = "tls"))]
fn tls_client(port: u16, _: redis::RedisConnectionInfo, _: &str) -> Result<redis::Client, String> {
    Err(format!(
        "127.0.0.1:{port}: a TLS connection needs the `tls` feature"
    ))
}

/// One `redis-server` process (a data server, or a sentinel with `--sentinel`) on 127.0.0.1,
/// with a temp dir of its own that holds its log (`redis.log`) and early fatal errors
/// (`redis.stdio`). SIGCONT, SIGKILL and reaped, and its dir removed, on drop.
struct ServerProcess {
    /// `None` once killed (and reaped).
    child: Mutex<Option<process::Child>>,
    /// Pid of the most recently spawned process.
    pid: u32,
    /// The port the readiness probe reaches it on.
    port: u16,
    dir: PathBuf,
    bin: OsString,
    args: Vec<OsString>,
    /// Set in its environment (a clock shim's, say), at every start.
    env: Vec<(OsString, OsString)>,
    /// What it is, for messages: "redis-server", "sentinel".
    what: &'static str,
}

enum Readiness {
    Ready,
    /// The port is taken by someone else: retry (with a new port in `start`).
    PortTaken(String),
    /// Any other failure: give up.
    Failed(String),
}

impl ServerProcess {
    /// Spawns `redis-server` with `args_for(port)` for a free `port` (another on a port taken
    /// meanwhile, [`START_TRIES`] in all) in `dir`, and returns once it answers PING as itself
    /// on that port, logged in with `access`. `hint` ends the message of a failed start.
    fn start(
        what: &'static str,
        dir: PathBuf,
        access: &Access,
        hint: &str,
        env: &[(OsString, OsString)],
        mut args_for: impl FnMut(u16) -> Vec<OsString>,
    ) -> ServerProcess {
        let bin = redis_bin();
        let mut attempts = Vec::new();
        for _ in 0..START_TRIES {
            let port = free_port();
            let args = args_for(port);
            let log_offset = file_len(&dir.join("redis.log"));
            let mut child = match spawn_server(&bin, &dir, &args, env, what) {
                Ok(child) => child,
                Err(msg) => {
                    let _ = fs::remove_dir_all(&dir);
                    panic!("{msg}");
                }
            };
            match wait_ready(&mut child, port, &dir, log_offset, access) {
                Readiness::Ready => {
                    return ServerProcess {
                        pid: child.id(),
                        child: Mutex::new(Some(child)),
                        port,
                        dir,
                        bin,
                        args,
                        env: env.to_vec(),
                        what,
                    };
                }
                Readiness::PortTaken(why) => {
                    kill_and_reap(&mut child);
                    attempts.push(format!("port {port}: {why}"));
                }
                Readiness::Failed(why) => {
                    kill_and_reap(&mut child);
                    let logs = server_logs(&dir, 0);
                    let _ = fs::remove_dir_all(&dir);
                    panic!(
                        "{what} ({} {}) on port {port} failed to start: {why}{hint}\n{logs}",
                        bin.to_string_lossy(),
                        shown_args(&args)
                    );
                }
            }
        }
        let logs = server_logs(&dir, 0);
        let _ = fs::remove_dir_all(&dir);
        panic!(
            "{what} ({}) could not get a free port after {START_TRIES} tries: {attempts:#?}\n{logs}",
            bin.to_string_lossy()
        );
    }

    /// Kills the process if running, then starts it again on the same port, with the same dir
    /// and arguments, and waits until it answers PING (not LOADING).
    fn restart(&mut self, access: &Access) {
        self.kill();
        let mut attempts = Vec::new();
        for attempt in 1..=RESTART_TRIES {
            let log_offset = file_len(&self.dir.join("redis.log"));
            let mut child = spawn_server(&self.bin, &self.dir, &self.args, &self.env, self.what)
                .unwrap_or_else(|msg| panic!("{msg}"));
            match wait_ready(&mut child, self.port, &self.dir, log_offset, access) {
                Readiness::Ready => {
                    self.pid = child.id();
                    *self
                        .child
                        .get_mut()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(child);
                    return;
                }
                Readiness::PortTaken(why) => {
                    kill_and_reap(&mut child);
                    attempts.push(why);
                    thread::sleep(Duration::from_millis(50 * u64::from(attempt)));
                }
                Readiness::Failed(why) => {
                    kill_and_reap(&mut child);
                    panic!(
                        "{} restart on port {} failed: {why}\n{}",
                        self.what,
                        self.port,
                        server_logs(&self.dir, log_offset)
                    );
                }
            }
        }
        panic!(
            "{} restart: port {} stayed taken after {RESTART_TRIES} tries: {attempts:#?}\n{}",
            self.what,
            self.port,
            server_logs(&self.dir, 0)
        );
    }

    /// SIGKILL and reap. Idempotent.
    fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(mut child) = child {
            kill_and_reap(&mut child);
        }
    }

    /// Sends `sig` if the process runs; whether it was sent.
    fn signal(&self, sig: libc::c_int) -> bool {
        let mut guard = lock(&self.child);
        match guard.as_mut() {
            Some(child) => signal_if_alive(child, sig),
            None => false,
        }
    }

    /// Whether the process exists (a paused one counts as running).
    fn is_running(&self) -> bool {
        let mut guard = lock(&self.child);
        match guard.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `args` as one line, for messages.
fn shown_args(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn redis_bin() -> OsString {
    match std::env::var_os("REDIS_SERVER_BIN") {
        Some(bin) if !bin.is_empty() => bin,
        _ => OsString::from("redis-server"),
    }
}

/// Spawns `bin args` with stdin closed and stdout/stderr appended to `<dir>/redis.stdio`.
fn spawn_server(
    bin: &OsString,
    dir: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    what: &str,
) -> Result<process::Child, String> {
    let stdio_path = dir.join("redis.stdio");
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stdio_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", stdio_path.display()));
    let stdio_err = stdio
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
    Command::new(bin)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stdio_err)
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                format!(
                    "redis-server not found (tried {:?} for a {what}; {INSTALL_HINT})",
                    bin.to_string_lossy()
                )
            } else {
                format!(
                    "cannot spawn a {what} with {:?}: {e} ({INSTALL_HINT})",
                    bin.to_string_lossy()
                )
            }
        })
}

/// The server's log (from byte `log_offset`) and any stdout/stderr, for panics.
fn server_logs(dir: &Path, log_offset: u64) -> String {
    let log = read_from(&dir.join("redis.log"), log_offset);
    let stdio = read_from(&dir.join("redis.stdio"), 0);
    let mut out = format!("--- redis.log ---\n{log}");
    if !stdio.trim().is_empty() {
        out.push_str(&format!("--- redis stdout/stderr ---\n{stdio}"));
    }
    out
}

/// Polls until the server answers PING (not LOADING) and is really *our*
/// process (INFO's process_id), it exits, or READY_TIMEOUT passes.
fn wait_ready(
    child: &mut process::Child,
    port: u16,
    dir: &Path,
    log_offset: u64,
    access: &Access,
) -> Readiness {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last_error = String::from("no attempt yet");
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let log = read_from(&dir.join("redis.log"), log_offset);
                let stdio = read_from(&dir.join("redis.stdio"), 0);
                if log.contains("Address already in use")
                    || stdio.contains("Address already in use")
                {
                    return Readiness::PortTaken(format!(
                        "exited ({status}): address already in use"
                    ));
                }
                return Readiness::Failed(format!("exited early ({status})"));
            }
            Ok(None) => {}
            Err(e) => return Readiness::Failed(format!("try_wait: {e}")),
        }
        if Instant::now() >= deadline {
            return Readiness::Failed(format!(
                "not ready within {READY_TIMEOUT:?} (last error: {last_error})"
            ));
        }
        match ping_once(port, access) {
            Ok(server_pid) if server_pid == child.id() => return Readiness::Ready,
            Ok(server_pid) => {
                return Readiness::PortTaken(format!(
                    "port answered by another redis-server (pid {server_pid}, ours is {})",
                    child.id()
                ))
            }
            Err(e) => last_error = e,
        }
        thread::sleep(READY_POLL);
    }
}

/// One readiness probe: TCP connect, PING, then `INFO server` for the pid.
fn ping_once(port: u16, access: &Access) -> Result<u32, String> {
    let probe_timeout = Duration::from_millis(500);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, probe_timeout).map_err(|e| format!("tcp connect: {e}"))?;
    let mut con = access
        .client(port)?
        .get_connection_with_timeout(probe_timeout)
        .map_err(|e| format!("connect: {e}"))?;
    con.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    con.set_write_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| format!("set_write_timeout: {e}"))?;
    // A LOADING error (dataset still being loaded) lands here too: not ready yet.
    let pong: String = redis::cmd("PING")
        .query(&mut con)
        .map_err(|e| format!("PING: {e}"))?;
    if pong != "PONG" {
        return Err(format!("PING answered {pong:?}"));
    }
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|e| format!("INFO: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| "INFO server has no process_id".to_string())
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// A `redis-server` child process on 127.0.0.1 with its own temp dir, killed
/// and cleaned up on drop.
///
/// Its log goes to `<dir>/redis.log`; its stdout/stderr (early fatal config
/// errors only) go to `<dir>/redis.stdio`.
pub struct RedisServer {
    process: ServerProcess,
    /// The TLS port of a server that has one (`--tls-port`).
    tls_port: Option<u16>,
    /// How [`RedisServer::connection`] and the readiness probe log in.
    access: Access,
}

/// Which ports a [`RedisServer`] listens on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Listen {
    /// A plain port only.
    #[default]
    Plain,
    /// A plain port, and a TLS port beside it (`--tls-port`); probes use the plain one.
    PlainAndTls,
    /// TLS only (`--port 0 --tls-port P`): [`RedisServer::port`] is the TLS port, and the
    /// probes and [`RedisServer::connection`] use TLS, trusting [`Access::tls_ca`].
    TlsOnly,
}

/// How [`RedisServer::start_as`] starts a server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Appended to the command line, as in [`RedisServer::start_with`].
    pub args: Vec<String>,
    pub listen: Listen,
    /// How the test's connections log in: the password that `args` set with `--requirepass`,
    /// say, and for [`Listen::TlsOnly`] the CA of the server's certificate.
    pub access: Access,
    /// Set in the server's environment (see `clock.rs`).
    pub env: Vec<(OsString, OsString)>,
}

impl RedisServer {
    /// Starts a redis-server on a free 127.0.0.1 port, with its own temp dir,
    /// `--save ""` and `--appendonly no`; returns once it answers PING.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`RedisServer::start`], with `extra_args` appended to the command
    /// line (later arguments override earlier ones, e.g. `&["--appendonly", "yes"]`).
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_as(&ServerOptions {
            args: extra_args.iter().map(|s| s.to_string()).collect(),
            ..ServerOptions::default()
        })
    }

    /// Like [`RedisServer::start_with`], listening for TLS on a second free port as well
    /// (`--tls-port`; see [`RedisServer::tls_url`]). `extra_args` carry the certificates
    /// (`--tls-cert-file` and so on). The plain port stays open: readiness is checked there,
    /// and [`RedisServer::connection`] uses it.
    pub fn start_tls(extra_args: &[&str]) -> RedisServer {
        Self::start_as(&ServerOptions {
            args: extra_args.iter().map(|s| s.to_string()).collect(),
            listen: Listen::PlainAndTls,
            ..ServerOptions::default()
        })
    }

    /// A server started as `options` say: see [`ServerOptions`].
    pub fn start_as(options: &ServerOptions) -> RedisServer {
        Self::start_as_with(options, Vec::new)
    }

    /// Like [`RedisServer::start_as`], with the arguments `per_try()` gives put before
    /// `options.args`, drawn afresh for every start attempt: a second port of the server's own
    /// (a cluster bus port, say), which a retry after a port taken meanwhile must draw again
    /// like the main port. [`RedisServer::restart`] reuses those of the attempt that started.
    fn start_as_with(
        options: &ServerOptions,
        mut per_try: impl FnMut() -> Vec<String>,
    ) -> RedisServer {
        let ServerOptions {
            args,
            listen,
            access,
            env,
        } = options;
        assert!(
            (*listen == Listen::TlsOnly) == access.tls_ca.is_some(),
            "a TLS-only server is probed over TLS, and only it: give Access::tls_ca with it"
        );
        let dir = unique_temp_dir("fencelock-redis");
        let mut tls_port = None;
        let hint = if *listen == Listen::Plain {
            ""
        } else {
            " (a redis-server built without TLS support refuses --tls-port)"
        };
        let process =
            ServerProcess::start("redis-server", dir.clone(), access, hint, env, |port| {
                let (plain, tls) = match listen {
                    Listen::Plain => (port, None),
                    // A taken TLS port fails the start as a taken plain port does: both are new
                    // per try.
                    Listen::PlainAndTls => (port, Some(free_port())),
                    Listen::TlsOnly => (0, Some(port)),
                };
                tls_port = tls;
                let mut all: Vec<OsString> = vec![
                    "--port".into(),
                    plain.to_string().into(),
                    "--bind".into(),
                    "127.0.0.1".into(),
                    "--dir".into(),
                    dir.clone().into(),
                    "--logfile".into(),
                    dir.join("redis.log").into(),
                ];
                for arg in ["--save", "", "--appendonly", "no", "--daemonize", "no"] {
                    all.push(arg.into());
                }
                all.extend(per_try().into_iter().map(OsString::from));
                all.extend(args.iter().map(OsString::from));
                if let Some(tls) = tls {
                    all.extend(["--tls-port".into(), tls.to_string().into()]);
                }
                all
            });
        RedisServer {
            process,
            tls_port,
            access: access.clone(),
        }
    }

    /// The port the server answers on (for a [`Listen::TlsOnly`] server, its TLS port).
    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// The TLS port of a server made by [`RedisServer::start_tls`] (or TLS-only).
    pub fn tls_port(&self) -> u16 {
        self.tls_port
            .unwrap_or_else(|| panic!("the server was not started with start_tls"))
    }

    /// `rediss://HOST:TLS_PORT/`, for `host` `127.0.0.1` or `localhost` (say).
    pub fn tls_url(&self, host: &str) -> String {
        format!("rediss://{host}:{}/", self.tls_port())
    }

    /// Pid of the current (or, after `kill`, the last) server process.
    pub fn pid(&self) -> u32 {
        self.process.pid
    }

    /// The server's own temp dir (its `--dir`; holds `redis.log`).
    pub fn dir(&self) -> &Path {
        &self.process.dir
    }

    /// How the test's connections log in to it.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// SIGSTOP: the server stops answering (connections stay open).
    pub fn pause(&self) {
        self.process.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        self.process.signal(libc::SIGCONT);
    }

    /// SIGKILL and reap. Idempotent.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the server if running, then starts it again on the same port,
    /// with the same dir and arguments (so an AOF/RDB in the dir is loaded),
    /// and waits until it answers PING (not LOADING).
    pub fn restart(&mut self) {
        self.process.restart(&self.access);
    }

    /// Whether the server process exists (a paused server counts as running).
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Contents of the server's log file ("" if none).
    pub fn log(&self) -> String {
        read_from(&self.dir().join("redis.log"), 0)
    }

    /// A fresh connection (logged in as [`RedisServer::access`] says) with 5 s
    /// connect/read/write timeouts, for test assertions. Panics if the server cannot be
    /// reached.
    pub fn connection(&self) -> redis::Connection {
        self.access
            .connect(self.port(), CONN_TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to test redis at {}: {e}", self.url()))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// Lock clients and server statistics (not in the original support spec: added
// because the integration tests import them)
// ---------------------------------------------------------------------------

/// Namespace of [`lock_client`]'s clients: their keys are `test:lock:{KEY}`
/// and their release channels are `test:released:<client id>`. A holder process (the `hold`
/// example) must get `FENCELOCK_NAMESPACE=test` to contend with them.
pub const NAMESPACE: &str = "test";

/// The Redis lock key of `key` under [`NAMESPACE`] (test keys need no escaping).
pub fn lock_key(key: &str) -> String {
    format!("{NAMESPACE}:lock:{{{key}}}")
}

/// The Redis fence counter key of `key` under [`NAMESPACE`].
pub fn fence_key(key: &str) -> String {
    format!("{NAMESPACE}:fence:{{{key}}}")
}

/// Whether `key` is locked in Redis right now.
pub fn lock_exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(lock_key(key)).query(con).unwrap()
}

/// The remaining lease of `key`'s lock in Redis, in ms (-2: not locked).
pub fn lock_pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(lock_key(key)).query(con).unwrap()
}

/// The PostgreSQL the tests use: `DATABASE_URL`, or `postgres://postgres@127.0.0.1:5432/test` (a
/// database `.ci/run` sets up).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A `LockClient` for `server`, in namespace [`NAMESPACE`], with a lease of
/// `lease_ms` milliseconds. Panics if the builder rejects it.
pub fn lock_client(server: &RedisServer, lease_ms: u64) -> fencelock::LockClient {
    lock_client_at(&server.url(), lease_ms)
}

/// [`lock_client`] for a server at `url` (a proxy in front of one, say).
pub fn lock_client_at(url: &str, lease_ms: u64) -> fencelock::LockClient {
    fencelock::LockClient::builder(url)
        .namespace(NAMESPACE)
        .lease(Duration::from_millis(lease_ms))
        .build()
        .unwrap_or_else(|e| panic!("LockClient for {url} (lease {lease_ms} ms): {e}"))
}

/// One `try_lock` of `key`, waiting up to `wait`, that must fail with `Error::Rejected` (a
/// set-up error, not an outage) within `at_once`; its message.
pub fn rejected_at_once(
    client: &fencelock::LockClient,
    key: &str,
    wait: Duration,
    at_once: Duration,
) -> String {
    let started = Instant::now();
    let err = match client.try_lock(key, wait) {
        Err(e) => e,
        Ok(got) => panic!(
            "expected a rejected connection, got {:?}",
            got.map(|g| g.token())
        ),
    };
    let took = started.elapsed();
    assert!(err.is_rejected(), "{err:?}");
    assert!(!err.is_connection(), "{err:?}");
    assert!(took < at_once, "reported after {took:?}: {err}");
    err.to_string()
}

/// How many waiting clients `key`'s queue in Redis holds (under [`NAMESPACE`]).
pub fn queue_len(con: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("LLEN")
        .arg(format!("{NAMESPACE}:queue:{{{key}}}"))
        .query(con)
        .unwrap_or_else(|e| panic!("LLEN: {e}"))
}

/// Polls (bounded: 10 s) until `key`'s queue in Redis holds `n` waiting clients.
pub fn await_queue_len(con: &mut redis::Connection, key: &str, n: u64) {
    let start = Instant::now();
    while queue_len(con, key) != n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the queue of {key:?} never held {n} waiters"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Each client's release channel under [`NAMESPACE`] (`test:released:<client id>`) with its
/// number of subscribers, sorted by channel.
pub fn release_channels(con: &mut redis::Connection) -> Vec<(String, i64)> {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{NAMESPACE}:released:*"))
        .query(con)
        .unwrap_or_else(|e| panic!("PUBSUB CHANNELS: {e}"));
    if channels.is_empty() {
        return Vec::new();
    }
    let mut counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channels)
        .query(con)
        .unwrap_or_else(|e| panic!("PUBSUB NUMSUB: {e}"));
    counts.sort();
    counts
}

/// A counter of `INFO stats` (`total_reads_processed`, say).
pub fn info_stat(con: &mut redis::Connection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(con)
        .unwrap_or_else(|e| panic!("INFO stats: {e}"));
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO stats"))
}

/// How many times `command` (lower case, e.g. "evalsha") ran since the server
/// started or since the last `CONFIG RESETSTAT`, from `INFO commandstats`
/// (0 if it never ran).
pub fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_else(|e| panic!("INFO commandstats: {e}"));
    let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
        })
        .map(|calls| {
            calls
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("cmdstat_{command} calls={calls:?}: {e}"))
        })
        .unwrap_or(0)
}

/// The `addr=` port of the connection with id `id` in a `CLIENT LIST` reply: the client's end
/// of that connection, to find its socket with [`await_unread_bytes`].
pub fn client_port_in_list(list: &str, id: u64) -> u16 {
    let id_field = format!("id={id}");
    list.lines()
        .find(|l| l.split(' ').any(|f| f == id_field))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("addr=")))
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no addr for client id {id} in CLIENT LIST:\n{list}"))
}

/// The client's end (its local port) of the test's own connection `con`, from `CLIENT INFO`.
pub fn own_client_port(con: &mut redis::Connection) -> u16 {
    let info: String = redis::cmd("CLIENT")
        .arg("INFO")
        .query(con)
        .unwrap_or_else(|e| panic!("CLIENT INFO: {e}"));
    info.split_whitespace()
        .find_map(|f| f.strip_prefix("addr="))
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no addr in CLIENT INFO: {info}"))
}

/// Bytes that the server listening on `server_port` has not read yet from the connection whose
/// client end is `client_port`, from the kernel's socket table (`/proc/net/tcp`, `tcp6`); `None`
/// while no such connection is listed.
#[cfg(target_os = "linux")]
pub fn unread_bytes(server_port: u16, client_port: u16) -> Option<u64> {
    // Each row: "sl local_address rem_address st tx_queue:rx_queue ...", addresses as
    // HEXIP:HEXPORT. The server's end has the server's port as local and the client's as remote.
    let port_of = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| fs::read_to_string(path).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|row| {
                    let f: Vec<&str> = row.split_whitespace().collect();
                    let (local, remote, queues) = (f.get(1)?, f.get(2)?, f.get(4)?);
                    if port_of(local)? != server_port || port_of(remote)? != client_port {
                        return None;
                    }
                    u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
                })
                .collect::<Vec<_>>()
        })
        .next()
}

/// Waits (at most `limit`) until the server listening on `server_port`, frozen by SIGSTOP, holds
/// unread bytes from the connection whose client end is `client_port`: a request sent on it is
/// then in the server's socket, and on SIGCONT the server reads it before anything sent on
/// another connection after this returned. This is the condition itself: how long a thread
/// takes to get its request out varies with the machine's load.
///
/// Linux only (the kernel's socket table); elsewhere it waits a fixed second, which a loaded
/// machine can exceed.
pub fn await_unread_bytes(server_port: u16, client_port: u16, limit: Duration) {
    #[cfg(target_os = "linux")]
    {
        let waited = poll_until(limit, Duration::from_millis(2), || {
            match unread_bytes(server_port, client_port) {
                Some(n) if n > 0 => Ok(n),
                other => Err(format!("unread bytes {other:?}")),
            }
        });
        if let Err(last) = waited {
            panic!(
                "the server on port {server_port} never held unread bytes from client port \
                 {client_port} within {limit:?}: {last}"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (server_port, client_port);
        thread::sleep(Duration::from_secs(1).min(limit));
    }
}

/// Whether thread `tid` of this process sleeps on a futex at this moment (one reading; see
/// [`await_parked`]), and what was seen.
#[cfg(target_os = "linux")]
pub fn parked_now(tid: i32) -> (bool, String) {
    let dir = format!("/proc/self/task/{tid}");
    let stat = fs::read_to_string(format!("{dir}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    let wchan = fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
    (
        state == Some("S") && wchan.contains("futex"),
        format!("{state:?} {wchan}"),
    )
}

/// The calling thread's kernel thread id, for [`await_parked`].
#[cfg(target_os = "linux")]
pub fn own_tid() -> i32 {
    // SAFETY: gettid(2) takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The calling thread's kernel thread id, for [`await_parked`] (0 where it is not read).
#[cfg(not(target_os = "linux"))]
pub fn own_tid() -> i32 {
    0
}

/// Waits (at most `limit`) until thread `tid` of this process sleeps on a futex: a condition
/// variable or a channel, as a lock call parked in its client's own queue behind another thread
/// does. Seen twice, 2 ms apart, so that a moment's wait for a mutex on the way does not count.
/// This is the condition itself: how long a thread takes to get there varies with the load.
///
/// Linux only (`/proc/self/task/<tid>/wchan`); elsewhere it waits a fixed 100 ms.
pub fn await_parked(tid: i32, limit: Duration) {
    #[cfg(target_os = "linux")]
    {
        let parked = || parked_now(tid);
        let mut seen = 0;
        let waited = poll_until(limit, Duration::from_millis(2), || match parked() {
            (true, _) if seen >= 1 => Ok(()),
            (true, what) => {
                seen += 1;
                Err(what)
            }
            (false, what) => {
                seen = 0;
                Err(what)
            }
        });
        if let Err(last) = waited {
            panic!("thread {tid} never parked within {limit:?}: last seen {last}");
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = tid;
        thread::sleep(Duration::from_millis(100).min(limit));
    }
}

// ---------------------------------------------------------------------------
// Child processes (lock holders in another process)
// ---------------------------------------------------------------------------

/// Path of a compiled example binary (`target/<profile>/examples/<name>`),
/// derived from the test binary's own path (`target/<profile>/deps/<test>`).
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("std::env::current_exe(): {e}"));
    let deps = exe
        .parent()
        .unwrap_or_else(|| panic!("test binary {} has no parent dir", exe.display()));
    let profile_dir = deps
        .parent()
        .unwrap_or_else(|| panic!("deps dir {} has no parent dir", deps.display()));
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        panic!(
            "example binary {} not found: build examples first: a plain `cargo test` builds \
             them (a filtered `cargo test --test X` does not); or `cargo build --examples` \
             (same profile as the tests)",
            path.display()
        );
    }
    path
}

/// Lines kept for diagnostics in `Child`'s panic messages.
const SEEN_LINES_KEPT: usize = 200;

/// A child process whose stdout lines can be awaited with a timeout.
///
/// stdout is piped and read line by line by a thread; stderr is inherited;
/// stdin is piped (see [`Child::send_line`]) and closed on drop.
pub struct Child {
    inner: Mutex<process::Child>,
    pid: u32,
    program: String,
    lines: Receiver<String>,
    stdin: Mutex<Option<ChildStdin>>,
    /// Recent stdout lines (all of them, matched or not), for panic messages.
    seen: Mutex<Vec<String>>,
}

impl Child {
    /// Spawns `cmd` with stdout and stdin piped and stderr inherited.
    pub fn spawn(mut cmd: Command) -> Child {
        let program = format!("{cmd:?}");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {program}: {e}"));
        let pid = child.id();
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("child {program} has no piped stdout"));
        let stdin = child.stdin.take();
        let (tx, rx) = crossbeam_channel::unbounded();
        let reader = thread::Builder::new()
            .name(format!("child-{pid}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        if let Err(e) = reader {
            kill_and_reap(&mut child);
            panic!("cannot start the stdout reader thread for {program}: {e}");
        }
        Child {
            inner: Mutex::new(child),
            pid,
            program,
            lines: rx,
            stdin: Mutex::new(stdin),
            seen: Mutex::new(Vec::new()),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the next stdout line starting with `prefix`, skipping other
    /// lines; returns the whole line. Panics on timeout or EOF, showing the
    /// lines seen.
    pub fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut skipped: Vec<String> = Vec::new();
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.fail_expect(prefix, timeout, "timed out", &skipped);
            }
            match self.lines.recv_timeout(deadline - now) {
                Ok(line) => {
                    {
                        let mut seen = lock(&self.seen);
                        if seen.len() >= SEEN_LINES_KEPT {
                            seen.remove(0);
                        }
                        seen.push(line.clone());
                    }
                    if line.starts_with(prefix) {
                        return line;
                    }
                    skipped.push(line);
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fail_expect(prefix, timeout, "timed out", &skipped)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.fail_expect(prefix, timeout, "stdout closed (EOF)", &skipped)
                }
            }
        }
    }

    fn fail_expect(&self, prefix: &str, timeout: Duration, what: &str, skipped: &[String]) -> ! {
        let status = match lock(&self.inner).try_wait() {
            Ok(Some(status)) => format!("exited: {status}"),
            Ok(None) => "still running".to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        let seen = lock(&self.seen).clone();
        panic!(
            "{what} waiting {timeout:?} for a stdout line starting with {prefix:?} from child \
             pid {} ({}); process {status}\nlines skipped while waiting: {skipped:#?}\n\
             last lines seen: {seen:#?}",
            self.pid, self.program
        );
    }

    /// Writes `line` plus a newline to the child's stdin and flushes.
    /// Panics if stdin was closed or the child is gone.
    pub fn send_line(&self, line: &str) {
        let mut guard = lock(&self.stdin);
        let stdin = guard
            .as_mut()
            .unwrap_or_else(|| panic!("stdin of child pid {} is closed", self.pid));
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("writing to stdin of child pid {}: {e}", self.pid));
    }

    /// Closes the child's stdin (it reads EOF).
    pub fn close_stdin(&self) {
        lock(&self.stdin).take();
    }

    /// SIGSTOP.
    pub fn pause(&self) {
        signal_if_alive(&mut lock(&self.inner), libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal_if_alive(&mut lock(&self.inner), libc::SIGCONT);
    }

    /// SIGKILL and reap (bounded). Idempotent.
    pub fn kill(&mut self) {
        let inner = self
            .inner
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        kill_and_reap(inner);
    }

    /// Waits up to `timeout` for the child to exit by itself; `None` if it is
    /// still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let inner = self
            .inner
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reap(inner, timeout)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.close_stdin();
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// Log capture (process-wide: one test per binary that uses it)
// ---------------------------------------------------------------------------

static LOG_RECORDS: std::sync::Mutex<Vec<(log::Level, String)>> = std::sync::Mutex::new(Vec::new());
/// The target of each record in `LOG_RECORDS`, in the same order.
static LOG_TARGETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let mut records = LOG_RECORDS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        records.push((record.level(), record.args().to_string()));
        LOG_TARGETS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record.target().to_owned());
    }
    fn flush(&self) {}
}

/// Installs a logger that keeps every record, at every level, for [`log_records`].
pub fn capture_logs() {
    log::set_logger(&Capture).unwrap_or_else(|e| panic!("a logger is already set: {e}"));
    log::set_max_level(log::LevelFilter::Trace);
}

/// Every record logged since [`capture_logs`], oldest first.
pub fn log_records() -> Vec<(log::Level, String)> {
    LOG_RECORDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// [`log_records`] with each record's target: (target, level, message).
pub fn log_records_with_targets() -> Vec<(String, log::Level, String)> {
    // Taken in the order `log` takes them, so the two lists are of one length and order.
    let records = LOG_RECORDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let targets = LOG_TARGETS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    targets
        .iter()
        .zip(records.iter())
        .map(|(target, (level, message))| (target.clone(), *level, message.clone()))
        .collect()
}

/// A xorshift64* generator: reproducible choices from a seed (faults and their timing in the
/// soaks, keys and hold times in the quorum workload).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Adds the ACL user `locker` (password `secret`) with what docs/design.md says a client of the
/// test namespace needs on one server: the keys `~test:*` and the release channels
/// `&test:released:*` (not the quorum's `&test:freed:*`), every command allowed.
pub fn add_documented_acl_user(con: &mut redis::Connection) {
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "locker",
            "on",
            ">secret",
            "resetchannels",
            &format!("~{NAMESPACE}:*"),
        ])
        .arg(&[&format!("&{NAMESPACE}:released:*"), "+@all"])
        .query(con)
        .unwrap_or_else(|e| panic!("ACL SETUSER locker: {e}"));
}
