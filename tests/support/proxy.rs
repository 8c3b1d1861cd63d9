//! A loopback TCP fault proxy: `client -> 127.0.0.1:proxy.port() -> 127.0.0.1:upstream`.
//!
//! Each accepted connection gets its own upstream connection and one thread per
//! direction. The fault [`Mode`] is global and can be changed at any time.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Poll interval of the accept loop and read timeout of the pumps (how fast
/// they notice a mode change or shutdown).
const TICK: Duration = Duration::from_millis(10);
/// Timeout for connecting to the upstream.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on writing one chunk to a peer that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on joining the proxy's threads on drop.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything as is.
    Pass,
    /// Hold each chunk read, in each direction, for this long before
    /// forwarding it (so a request/response round trip takes about 2x longer).
    Delay(Duration),
    /// Keep connections open (and accept new ones) but silently drop every
    /// byte, both directions. Bytes dropped are lost for good: after going back
    /// to `Pass`, a connection that lost bytes is out of sync.
    Blackhole,
    /// Close every open connection now (shutdown of both sockets: the client
    /// sees EOF / "connection reset"), and close new connections as soon as
    /// they are accepted.
    Reset,
}

struct Conn {
    client: TcpStream,
    upstream: TcpStream,
}

impl Conn {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

struct Shared {
    upstream: SocketAddr,
    mode: Mutex<Mode>,
    stop: AtomicBool,
    next_id: AtomicU64,
    accepted: AtomicU64,
    conns: Mutex<HashMap<u64, Conn>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn close_all(&self) {
        for (_, conn) in lock(&self.conns).drain() {
            conn.close();
        }
    }

    fn close(&self, id: u64) {
        if let Some(conn) = lock(&self.conns).remove(&id) {
            conn.close();
        }
    }

    fn spawn(self: &Arc<Self>, name: String, f: impl FnOnce(Arc<Shared>) + Send + 'static) {
        let shared = Arc::clone(self);
        match thread::Builder::new().name(name).spawn(move || f(shared)) {
            Ok(handle) => {
                let mut threads = lock(&self.threads);
                threads.retain(|h| !h.is_finished());
                threads.push(handle);
            }
            Err(e) => eprintln!("proxy: cannot spawn a thread: {e}"),
        }
    }
}

/// A loopback TCP proxy in front of `127.0.0.1:upstream_port`.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port, forwarding to `127.0.0.1:upstream_port`,
    /// in [`Mode::Pass`].
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("proxy: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy: local_addr: {e}"))
            .port();
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("proxy: set_nonblocking: {e}"));
        let shared = Arc::new(Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            mode: Mutex::new(Mode::Pass),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name(format!("proxy-{port}-accept"))
            .spawn(move || accept_loop(listener, accept_shared))
            .unwrap_or_else(|e| panic!("proxy: cannot spawn the accept thread: {e}"));
        Proxy {
            port,
            shared,
            accept_thread: Some(accept_thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/` (the proxy's port).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn upstream_port(&self) -> u16 {
        self.shared.upstream.port()
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Changes the mode; [`Mode::Reset`] also closes every open connection now.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
        if mode == Mode::Reset {
            self.shared.close_all();
        }
    }

    /// Closes every open connection now, whatever the mode.
    pub fn close_connections(&self) {
        self.shared.close_all();
    }

    /// Number of proxied connections currently open.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Number of connections accepted so far (including ones closed by `Reset`).
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.close_all();
        let deadline = Instant::now() + JOIN_TIMEOUT;
        if let Some(handle) = self.accept_thread.take() {
            join_bounded(handle, deadline);
        }
        // The accept thread has stopped (or we gave up on it): no new pumps.
        self.shared.close_all();
        let threads: Vec<JoinHandle<()>> = lock(&self.shared.threads).drain(..).collect();
        for handle in threads {
            join_bounded(handle, deadline);
        }
    }
}

/// Joins `handle` if it finishes before `deadline`; otherwise leaves it detached.
fn join_bounded(handle: JoinHandle<()>, deadline: Instant) {
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let _ = handle.join();
}

/// Runs until the proxy is dropped.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                handle_connection(client, &shared);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => thread::sleep(TICK), // WouldBlock, or a transient error
        }
    }
}

fn handle_connection(client: TcpStream, shared: &Arc<Shared>) {
    if shared.mode() == Mode::Reset {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let upstream = match TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(s) => s,
        Err(_) => {
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    };
    let setup = |s: &TcpStream| -> std::io::Result<()> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(TICK))?;
        s.set_write_timeout(Some(WRITE_TIMEOUT))
    };
    let clones = setup(&client)
        .and_then(|()| setup(&upstream))
        .and_then(|()| {
            Ok((
                client.try_clone()?,
                client.try_clone()?,
                upstream.try_clone()?,
                upstream.try_clone()?,
            ))
        });
    let Ok((c_read, c_write, u_read, u_write)) = clones else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = upstream.shutdown(Shutdown::Both);
        return;
    };
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    lock(&shared.conns).insert(id, Conn { client, upstream });
    shared.spawn(format!("proxy-conn{id}-up"), move |s| {
        pump(id, c_read, u_write, &s)
    });
    shared.spawn(format!("proxy-conn{id}-down"), move |s| {
        pump(id, u_read, c_write, &s)
    });
}

/// Copies `from` -> `to` according to the mode until EOF, an error, `Reset`
/// or shutdown; then closes the whole connection.
fn pump(id: u64, mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 16 * 1024];
    while !shared.stopped() {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if shared.mode() == Mode::Reset {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        match shared.mode() {
            Mode::Pass => {}
            Mode::Delay(d) => {
                let until = Instant::now() + d;
                while !shared.stopped() {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    thread::sleep((until - now).min(TICK));
                }
                // The mode may have changed while the chunk was held.
                match shared.mode() {
                    _ if shared.stopped() => break,
                    Mode::Blackhole => continue,
                    Mode::Reset => break,
                    Mode::Pass | Mode::Delay(_) => {}
                }
            }
            Mode::Blackhole => continue,
            Mode::Reset => break,
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    shared.close(id);
}
