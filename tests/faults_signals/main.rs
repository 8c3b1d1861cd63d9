//! Signals: a socket with a read timeout is never restarted after a signal handler runs, so a
//! read blocked on a reply fails with EINTR (a debugger or `strace` attaching does the same).
//! fencelock must ride that out: no error, no lost lease, no lock left behind.
//!
//! Its own test binary: it installs a process-wide SIGUSR1 handler without SA_RESTART, and finds
//! the library's threads by name to signal them, so any other test in the process would have
//! its reads cut short and its threads counted.

#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::thread;
use std::time::{Duration, Instant};

use support::proxy::{Mode, Proxy};
use support::{lock_exists, ms, RedisServer};

static SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

/// Installs a SIGUSR1 handler without SA_RESTART (with it, the socket's timeout still stops the
/// kernel from restarting the read).
fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = count_signal as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = 0;
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
            0
        );
    });
}

/// One test at a time: each finds the library's threads by name, and a test running beside it
/// would have threads of the same names (pestering those, or seeing them end, miscounts).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The thread id of this process's thread named `name` (as the kernel truncates it), once it
/// runs (bounded: 10 s; a thread just spawned names itself when it is first scheduled).
fn thread_tid(name: &str) -> libc::pid_t {
    let found = support::poll_until(Duration::from_secs(10), ms(5), || {
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let path = task.path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                if let Some(tid) = path.file_name().and_then(|f| f.to_str()?.parse().ok()) {
                    return Ok(tid);
                }
            }
        }
        Err(format!("no thread named {name:?}"))
    });
    found.unwrap_or_else(|why| panic!("{why}"))
}

/// Sends SIGUSR1 to thread `tid` of this process every `every` until `stop`, for at most
/// `limit`. Returns how many were sent.
fn pester(tid: libc::pid_t, every: Duration, stop: &AtomicBool, limit: Duration) -> u64 {
    let end = Instant::now() + limit;
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        if unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1) } != 0 {
            break;
        }
        sent += 1;
        thread::sleep(every);
    }
    sent
}

#[test]
fn lock_and_unlock_ride_out_signals() {
    let _one = serial();
    install_handler();
    let server = RedisServer::start();
    // A slower round trip (1 ms each way) puts most signals inside a read of a reply.
    let proxy = Proxy::start(server.port());
    proxy.set_mode(Mode::Delay(ms(1)));
    let client = support::lock_client_at(&proxy.url(), 3_000);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            tx.send(unsafe { libc::gettid() }).unwrap();
            let mut done = 0;
            let end = Instant::now() + Duration::from_secs(2);
            while Instant::now() < end && done < 500 {
                let key = format!("signals:{}", done % 7);
                let guard = client.lock(&key).expect("lock under signals");
                assert!(guard.is_held());
                guard.unlock().expect("unlock under signals");
                done += 1;
            }
            stop.store(true, Ordering::Relaxed);
            done
        })
    };
    let target = rx.recv().unwrap();
    // A signal in about every other round trip of 2 ms.
    let sent = pester(target, ms(3), &stop, Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let done = worker.join().expect("no lock or unlock failed");
    assert!(done >= 50, "only {done} lock/unlock cycles in 2 s");
    assert!(
        sent >= 100 && SIGNALS.load(Ordering::Relaxed) >= 100,
        "too few signals to mean anything: {sent} sent"
    );
    // Nothing was left locked by an acquire whose reply a signal cut short.
    let mut con = server.connection();
    for i in 0..7 {
        assert!(!lock_exists(&mut con, &format!("signals:{i}")));
    }
}

#[test]
fn renewals_ride_out_signals() {
    let _one = serial();
    install_handler();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_mode(Mode::Delay(ms(2)));
    // A 2 s lease: renewal rounds keep it while a busy machine delays some of them (600 ms lost
    // up to all 300 leases under load, with or without signals going astray).
    let lease = ms(2_000);
    let client = support::lock_client_at(&proxy.url(), 2_000);
    let guards: Vec<_> = (0..300)
        .map(|i| client.lock(&format!("renewed:{i}")).unwrap())
        .collect();
    // Three leases' worth of renewals, each pipeline read pestered: a signal every 200 µs,
    // against replies that take 4 ms to come.
    let never = AtomicBool::new(false);
    let renewal = thread_tid("fencelock-renew");
    // At least three leases and 1,000 signals: a busy machine sends fewer per second (a sleep
    // of 200 µs lasts longer), so it pesters for longer, up to 30 s.
    let started = Instant::now();
    let mut sent = 0;
    while (sent < 1_000 || started.elapsed() < lease * 3) && started.elapsed() < ms(30_000) {
        sent += pester(renewal, Duration::from_micros(200), &never, ms(500));
    }
    assert!(sent >= 1_000, "too few signals to mean anything: {sent}");
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 300 leases lost under signals");
    for guard in guards {
        guard.unlock().expect("unlock after signals");
    }
}

#[test]
fn the_wake_thread_rides_out_signals_without_reconnecting() {
    let _one = serial();
    install_handler();
    let server = RedisServer::start();
    let client = support::lock_client(&server, 5_000);
    // The wake thread is subscribed once the client has been built.
    let _warm = client.lock("warm").unwrap();
    let mut con = server.connection();
    let before = support::info_stat(&mut con, "total_connections_received");
    let never = AtomicBool::new(false);
    let wake = thread_tid("fencelock-wake");
    // At least a second and 500 signals: a busy machine sends fewer per second (a sleep of
    // 200 µs lasts longer), so it pesters for longer, up to 30 s.
    let started = Instant::now();
    let mut sent = 0;
    while (sent < 500 || started.elapsed() < ms(1_000)) && started.elapsed() < ms(30_000) {
        sent += pester(wake, Duration::from_micros(200), &never, ms(250));
    }
    let seconds = started.elapsed().as_secs_f64().ceil() as u64;
    assert!(sent >= 500, "too few signals to mean anything: {sent}");
    let after = support::info_stat(&mut con, "total_connections_received");
    // At most once a second: the heartbeat's PING (every second), which a signal can cut.
    // Reconnecting at every interrupted read would make it about 65 times a second.
    assert!(
        after - before <= seconds,
        "the wake thread reconnected {} times under signals in {seconds} s",
        after - before
    );
}
