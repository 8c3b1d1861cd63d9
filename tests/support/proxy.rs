//! A loopback TCP fault proxy: `client -> 127.0.0.1:proxy.port() -> 127.0.0.1:upstream`.
//!
//! Each accepted connection gets its own upstream connection and one thread per
//! direction. The fault [`Mode`] is global and can be changed at any time.
//!
//! [`Mode::HoldExisting`] is the one mode that tells connections apart: it holds back the bytes
//! of the connections open when it is set (a client's pooled or renewal connection, say), then
//! delivers them late, in order, while connections made later pass untouched. See
//! [`Proxy::held_bytes`], [`Proxy::held_upstream`], [`Proxy::orphaned_connections`] and
//! [`Proxy::release_held`] for watching and ending such a hold.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Hold back every byte, both directions, of the connections open (or being
    /// accepted) at the moment this mode is set, for up to this long from then
    /// or until [`Proxy::release_held`]; then deliver what was held, in order,
    /// and forward as in [`Mode::Pass`]. Connections accepted later pass
    /// untouched all along: a client that times out on a held connection and
    /// reconnects gets through, while what it sent on the old one reaches the
    /// upstream late (a stale command overtaken by newer ones).
    ///
    /// A held connection whose client closes (or resets) its side meanwhile is
    /// kept open upstream (an "orphan", see [`Proxy::orphaned_connections`]):
    /// at the release its held client bytes are still delivered upstream, then
    /// the upstream's write side is shut down, and the connection closes once
    /// the upstream closes in turn (Redis does after running every command it
    /// read). Answers that can no longer reach the client are read and dropped.
    ///
    /// Setting another mode ends the hold (as [`Proxy::release_held`]); held
    /// bytes are delivered whatever that mode is, unless it is [`Mode::Reset`],
    /// which closes the connections and loses them. Setting `HoldExisting`
    /// again starts a new hold over every connection open then.
    HoldExisting(Duration),
}

/// Which way a pump copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Client to upstream.
    Up,
    /// Upstream to client.
    Down,
}

/// The current [`Mode::HoldExisting`] hold.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Connections with an id below this one are held.
    cutoff: u64,
    /// The hold ends then (at the latest).
    until: Instant,
}

struct Conn {
    client: TcpStream,
    upstream: TcpStream,
    /// Its client closed its side while the connection was held (see [`Mode::HoldExisting`]).
    orphaned: bool,
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
    /// The current or last [`Mode::HoldExisting`] hold, if any was ever set.
    hold: Mutex<Option<Hold>>,
    /// Bytes read on held connections and not yet delivered (both directions).
    held_bytes: AtomicUsize,
    /// Every byte held back on its way upstream since the last hold began, in the order read
    /// (delivered or not).
    held_upstream: Mutex<Vec<u8>>,
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

    /// Whether connection `id` was open when the last hold began (held now or once).
    fn marked(&self, id: u64) -> bool {
        lock(&self.hold).is_some_and(|h| id < h.cutoff)
    }

    /// Whether connection `id` is held back right now.
    fn holding(&self, id: u64) -> bool {
        lock(&self.hold).is_some_and(|h| id < h.cutoff && Instant::now() < h.until)
    }

    /// Ends the current hold, if any: its connections deliver what they held.
    fn release_held(&self) {
        let mut hold = lock(&self.hold);
        if let Some(h) = hold.as_mut() {
            h.until = h.until.min(Instant::now());
        }
    }

    fn orphan(&self, id: u64) {
        if let Some(conn) = lock(&self.conns).get_mut(&id) {
            conn.orphaned = true;
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
            hold: Mutex::new(None),
            held_bytes: AtomicUsize::new(0),
            held_upstream: Mutex::new(Vec::new()),
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
    /// [`Mode::HoldExisting`] starts holding the connections open now; any other mode ends
    /// such a hold.
    pub fn set_mode(&self, mode: Mode) {
        match mode {
            Mode::HoldExisting(limit) => {
                // Under the mode's lock: a connection is either accepted under the old mode and
                // held, or under the new one.
                let mut current = lock(&self.shared.mode);
                lock(&self.shared.held_upstream).clear();
                *lock(&self.shared.hold) = Some(Hold {
                    cutoff: self.shared.next_id.load(Ordering::SeqCst),
                    until: Instant::now() + limit,
                });
                *current = mode;
            }
            _ => {
                self.shared.release_held();
                *lock(&self.shared.mode) = mode;
            }
        }
        if mode == Mode::Reset {
            self.shared.close_all();
        }
    }

    /// Ends a [`Mode::HoldExisting`] hold now (the mode itself stays as it is): held bytes are
    /// delivered, in order, within a few milliseconds.
    pub fn release_held(&self) {
        self.shared.release_held();
    }

    /// Bytes held back by [`Mode::HoldExisting`] and not delivered yet (both directions; held
    /// bytes of connections closed by [`Mode::Reset`] or the proxy's drop are lost, and no
    /// longer counted).
    pub fn held_bytes(&self) -> usize {
        self.shared.held_bytes.load(Ordering::SeqCst)
    }

    /// Every byte the current (or last) [`Mode::HoldExisting`] hold held back on its way
    /// upstream, delivered or not: what the clients sent on their held connections, in the
    /// order read (the chunks of different connections interleaved as they came).
    pub fn held_upstream(&self) -> Vec<u8> {
        lock(&self.shared.held_upstream).clone()
    }

    /// Connections whose client closed its side while they were held (see
    /// [`Mode::HoldExisting`]) and that are still open: their held bytes are not all delivered
    /// yet, or the upstream has not closed its side yet. Once this is 0 after a release, the
    /// upstream has read, and closed after, everything those clients had sent.
    pub fn orphaned_connections(&self) -> usize {
        lock(&self.shared.conns)
            .values()
            .filter(|c| c.orphaned)
            .count()
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
    let id = {
        // Under the mode's lock, so that `Mode::HoldExisting` holds every connection accepted
        // before it was set.
        let _mode = lock(&shared.mode);
        shared.next_id.fetch_add(1, Ordering::SeqCst)
    };
    lock(&shared.conns).insert(
        id,
        Conn {
            client,
            upstream,
            orphaned: false,
        },
    );
    shared.spawn(format!("proxy-conn{id}-up"), move |s| {
        pump(id, Dir::Up, c_read, u_write, &s)
    });
    shared.spawn(format!("proxy-conn{id}-down"), move |s| {
        pump(id, Dir::Down, u_read, c_write, &s)
    });
}

/// Copies `from` -> `to` according to the mode until EOF, an error, `Reset`
/// or shutdown; then closes the whole connection. While the connection is held
/// ([`Mode::HoldExisting`]) it reads and keeps what comes, and delivers it when
/// the hold ends.
fn pump(id: u64, dir: Dir, mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 16 * 1024];
    // Read while held, not delivered yet.
    let mut held: Vec<u8> = Vec::new();
    // `from` ended (EOF or an error) while the connection was held.
    let mut from_ended = false;
    // Writing to the client failed on a held connection: what the upstream still sends (answers
    // to late commands) is read and dropped, so that the upstream can finish them.
    let mut to_gone = false;
    while !shared.stopped() {
        if (from_ended || !held.is_empty()) && !shared.holding(id) {
            let delivered = to_gone || held.is_empty() || to.write_all(&held).is_ok();
            shared.held_bytes.fetch_sub(held.len(), Ordering::SeqCst);
            held = Vec::new();
            if from_ended {
                if dir == Dir::Up && delivered {
                    // Only half: the down pump closes the connection when the upstream has
                    // answered everything and closes its side.
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                break;
            }
            if !delivered {
                if dir == Dir::Down {
                    to_gone = true;
                } else {
                    break;
                }
            }
        }
        if from_ended {
            if shared.mode() == Mode::Reset {
                break;
            }
            thread::sleep(TICK);
            continue;
        }
        let read = match from.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => Some(n),
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
            Err(_) => None,
        };
        let Some(n) = read else {
            if shared.holding(id) {
                from_ended = true;
                if dir == Dir::Up {
                    shared.orphan(id);
                }
                continue;
            }
            break;
        };
        if shared.holding(id) {
            held.extend_from_slice(&buf[..n]);
            shared.held_bytes.fetch_add(n, Ordering::SeqCst);
            if dir == Dir::Up {
                lock(&shared.held_upstream).extend_from_slice(&buf[..n]);
            }
            continue;
        }
        if to_gone {
            continue;
        }
        match shared.mode() {
            Mode::Pass | Mode::HoldExisting(_) => {}
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
                    Mode::Pass | Mode::Delay(_) | Mode::HoldExisting(_) => {}
                }
            }
            Mode::Blackhole => continue,
            Mode::Reset => break,
        }
        if to.write_all(&buf[..n]).is_err() {
            if dir == Dir::Down && shared.marked(id) {
                to_gone = true;
                continue;
            }
            break;
        }
    }
    shared.held_bytes.fetch_sub(held.len(), Ordering::SeqCst);
    shared.close(id);
}
