//! `CountingProxy`: a loopback proxy in front of a client that counts its round trips (for
//! `renewal`), reading the RESP that goes through with `resp`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::measure::exclude_this_thread;
use crate::resp::{parse_replies, parse_requests};

/// One round trip as the proxy saw it: the client sent `commands` (of which `evalsha` were
/// EVALSHA), then waited for every reply.
#[derive(Clone, Copy)]
pub struct RoundTrip {
    pub at: Instant,
    commands: u64,
    pub evalsha: u64,
}

/// A loopback proxy that counts round trips. It forwards requests at once and holds replies back
/// until the client has been quiet for `QUIET` and every command is answered, so a sync client
/// cannot see a reply while still sending: each round trip is counted exactly once. (A client
/// that stalls for longer than `QUIET` in the middle of one write would be counted twice.)
pub struct CountingProxy {
    port: u16,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    stop: Arc<AtomicBool>,
    /// Hold replies back as described; when off, replies pass at once and the log is rough.
    exact: Arc<AtomicBool>,
}

pub const QUIET: Duration = Duration::from_millis(2);

struct ProxyConn {
    state: Mutex<ProxyState>,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    exact: Arc<AtomicBool>,
}

struct ProxyState {
    outstanding: u64,
    last_request: Instant,
    /// Every reply so far was delivered: the next request byte starts a round trip.
    answered: bool,
    current: usize,
}

impl CountingProxy {
    pub fn start(upstream_port: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let exact = Arc::new(AtomicBool::new(false));
        let (log2, stop2, exact2) = (Arc::clone(&log), Arc::clone(&stop), Arc::clone(&exact));
        thread::spawn(move || {
            exclude_this_thread();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).expect("blocking");
                        let upstream =
                            TcpStream::connect(("127.0.0.1", upstream_port)).expect("upstream");
                        proxy_connection(client, upstream, Arc::clone(&log2), Arc::clone(&exact2));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                }
            }
        });
        CountingProxy {
            port,
            log,
            stop,
            exact,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Holds replies back as described (`true`), or lets them pass at once (`false`).
    pub fn set_exact(&self, exact: bool) {
        self.exact.store(exact, Ordering::SeqCst);
    }

    pub fn round_trips_since(&self, since: Instant) -> Vec<RoundTrip> {
        let log = self.log.lock().expect("log");
        log.iter().filter(|rt| rt.at >= since).copied().collect()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn proxy_connection(
    client: TcpStream,
    upstream: TcpStream,
    log: Arc<Mutex<Vec<RoundTrip>>>,
    exact: Arc<AtomicBool>,
) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let conn = Arc::new(ProxyConn {
        state: Mutex::new(ProxyState {
            outstanding: 0,
            last_request: Instant::now(),
            answered: true,
            current: 0,
        }),
        log,
        exact,
    });
    let (c_in, c_out) = (client.try_clone().expect("clone"), client);
    let (u_in, u_out) = (upstream.try_clone().expect("clone"), upstream);
    let conn2 = Arc::clone(&conn);
    thread::spawn(move || {
        exclude_this_thread();
        pump_requests(c_in, u_out, &conn2);
    });
    thread::spawn(move || {
        exclude_this_thread();
        pump_replies(u_in, c_out, &conn);
    });
}

fn pump_requests(mut from: TcpStream, mut to: TcpStream, conn: &ProxyConn) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        let (consumed, commands, evalsha) = parse_requests(&pending);
        pending.drain(..consumed);
        {
            let mut st = conn.state.lock().expect("state");
            let mut log = conn.log.lock().expect("log");
            if st.answered {
                st.answered = false;
                st.current = log.len();
                log.push(RoundTrip {
                    at: Instant::now(),
                    commands: 0,
                    evalsha: 0,
                });
            }
            log[st.current].commands += commands;
            log[st.current].evalsha += evalsha;
            st.outstanding += commands;
            st.last_request = Instant::now();
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn pump_replies(mut from: TcpStream, mut to: TcpStream, conn: &ProxyConn) {
    from.set_read_timeout(Some(QUIET / 2)).expect("timeout");
    let mut buf = vec![0u8; 256 * 1024];
    let mut unparsed: Vec<u8> = Vec::new();
    let mut held: Vec<u8> = Vec::new();
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                held.extend_from_slice(&buf[..n]);
                unparsed.extend_from_slice(&buf[..n]);
                let (consumed, replies) = parse_replies(&unparsed);
                unparsed.drain(..consumed);
                let mut st = conn.state.lock().expect("state");
                st.outstanding = st.outstanding.saturating_sub(replies);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        if held.is_empty() {
            continue;
        }
        let release = {
            let mut st = conn.state.lock().expect("state");
            let ok = !conn.exact.load(Ordering::Relaxed)
                || (st.outstanding == 0 && st.last_request.elapsed() >= QUIET);
            if ok {
                st.answered = true;
            }
            ok
        };
        if release {
            if to.write_all(&held).is_err() {
                break;
            }
            held.clear();
        }
    }
    let _ = to.write_all(&held);
    let _ = to.shutdown(Shutdown::Both);
}
