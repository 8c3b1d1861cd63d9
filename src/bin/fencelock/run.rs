//! `fencelock run`: take the lock, run CMD while holding it, release it when CMD exits.
//!
//! ```text
//! one attempt ─ granted ───────────────────────────────┐
//!      └ refused: wait (progress on a terminal; a signal cancels; --timeout: exit 75)
//!   (--timeout: no answer from Redis within it plus the connection timeout: exit 1)
//!                                                       ▼
//! spawn CMD (FENCELOCK_TOKEN, FENCELOCK_KEY) ─► watch: CMD exited → release, exit with its status
//!                                                      signal      → pass it on to CMD
//!                                                      lock lost   → SIGTERM, SIGKILL after
//!                                                                    --grace, exit 76
//! ```

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use fencelock::crossbeam_channel::{self, Receiver, RecvTimeoutError, Sender};
use fencelock::{Error, LockClient, LockGuard, LockOptions};

use crate::exit;
use crate::format::{human, seconds};
use crate::signals::{self, Received};

/// How often the watch loops look at CMD and at signals: the delay before a signal is passed
/// on or CMD's exit is noticed. A lost lock is noticed at once (a channel).
const POLL: Duration = Duration::from_millis(20);

/// How often the line a waiting `run` shows on a terminal is drawn again.
const REDRAW: Duration = Duration::from_secs(1);

/// How long after `--timeout` plus the connection timeout a run waits for the library's own
/// report (a connection attempt ends a little after the connection timeout) before it gives
/// up on Redis itself.
const SLACK: Duration = Duration::from_millis(200);

/// What `fencelock run` was asked to do.
pub(crate) struct Run {
    pub(crate) key: String,
    pub(crate) timeout: Option<Duration>,
    /// The client's connection timeout: with `timeout`, how much longer Redis has to answer.
    pub(crate) connect_timeout: Duration,
    pub(crate) grace: Duration,
    pub(crate) command: Vec<OsString>,
}

/// Runs CMD under the lock; returns fencelock's exit status.
pub(crate) fn run(client: &LockClient, run: &Run) -> u8 {
    if let Err(e) = signals::install() {
        eprintln!("fencelock: cannot handle signals: {e}");
        return exit::ERROR;
    }
    let guard = match acquire_within(client, run) {
        Ok(guard) => guard,
        Err(Stop::TimedOut) => {
            match run.timeout.unwrap_or_default() {
                zero if zero.is_zero() => {
                    eprintln!(
                        "fencelock: {:?} is held by another holder; not run",
                        run.key
                    );
                }
                timeout => eprintln!(
                    "fencelock: {:?} was not granted within {}; not run",
                    run.key,
                    human(timeout)
                ),
            }
            return exit::TEMPFAIL;
        }
        Err(Stop::NoAnswer(waited)) => {
            if std::io::stderr().is_terminal() {
                // The progress line, if one was drawn.
                eprint!("\r\x1b[2K");
            }
            eprintln!(
                "fencelock: Redis did not answer within {} (--timeout {} plus the connection \
                 timeout {}); {:?} not run",
                human(waited),
                flag(run.timeout.unwrap_or_default()),
                human(run.connect_timeout),
                run.key
            );
            return exit::ERROR;
        }
        Err(Stop::Signal(signal)) => {
            eprintln!(
                "fencelock: {} while waiting for {:?}; not run",
                signals::name(signal),
                run.key
            );
            return exit::by_signal(signal);
        }
        Err(Stop::Failed(e)) => return exit::report(&e),
        Err(Stop::Thread(e)) => {
            eprintln!("fencelock: cannot start a thread: {e}");
            return exit::ERROR;
        }
    };

    let Some((program, args)) = run.command.split_first() else {
        // clap requires CMD; an empty one is refused all the same.
        eprintln!("fencelock: no command to run");
        return exit::USAGE;
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env("FENCELOCK_TOKEN", guard.token().to_string())
        .env("FENCELOCK_KEY", &run.key);
    signals::terminate_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let status = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            eprintln!("fencelock: cannot run {program:?}: {e}");
            release(guard, &run.key);
            return status;
        }
    };

    match watch(&mut child, &guard) {
        Watched::Exited(status) => {
            let code = exit::of(status);
            match guard.unlock() {
                Ok(()) => code,
                Err(e) if e.is_lock_lost() => {
                    eprintln!(
                        "fencelock: the lock on {:?} was lost before {program:?} exited ({})",
                        run.key,
                        describe(status)
                    );
                    exit::LOST
                }
                Err(e) => {
                    eprintln!(
                        "fencelock: releasing {:?} failed, it expires with its lease: {e}",
                        run.key
                    );
                    code
                }
            }
        }
        Watched::Lost => {
            eprintln!(
                "fencelock: lost the lock on {:?} while {program:?} ran; sending it SIGTERM",
                run.key
            );
            stop(&mut child, run.grace, program);
            // The lock is another's or gone: this release finds nothing of ours to delete.
            let _ = guard.unlock();
            exit::LOST
        }
        Watched::Unwatchable(e) => {
            eprintln!("fencelock: cannot watch {program:?} ({e}); killing it");
            let _ = child.kill();
            let _ = child.wait();
            release(guard, &run.key);
            exit::ERROR
        }
    }
}

/// Why no lock was taken.
enum Stop {
    /// `--timeout` passed, or (0s) the one attempt found the lock held.
    TimedOut,
    /// Redis did not answer within `--timeout` plus the connection timeout (this long).
    NoAnswer(Duration),
    /// A signal ended the wait.
    Signal(libc::c_int),
    Failed(Error),
    /// The thread that watches for signals could not be started.
    Thread(std::io::Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

/// [`acquire`], and with `--timeout`, an answer within it plus the connection timeout
/// whatever Redis does.
///
/// The library bounds a wait with a deadline, but not a first attempt's connection (the
/// connection timeout) and reply (the response timeout, 5 s by default): a Redis that
/// accepts connections and then stops answering (frozen, overloaded) would hold a cron job's
/// `--timeout 0s` for that long. So the lock is taken on a thread of its own, and given up
/// at the bound. A request sent just before Redis stopped may still grant the lock when it
/// wakes; nobody renews that grant, and it expires with its lease.
fn acquire_within(client: &LockClient, run: &Run) -> Result<LockGuard, Stop> {
    let started = Instant::now();
    let Some(timeout) = run.timeout else {
        return acquire(client, &run.key, None, started);
    };
    let bound = timeout
        .saturating_add(run.connect_timeout)
        .saturating_add(SLACK);
    let (answer, answered) = crossbeam_channel::bounded(1);
    let (client, key) = (client.clone(), run.key.clone());
    thread::Builder::new()
        .name("fencelock-acquire".into())
        .spawn(move || {
            // Sent into the void after the bound: the guard drops, releasing the lock.
            let _ = answer.send(acquire(&client, &key, Some(timeout), started));
        })
        .map_err(Stop::Thread)?;
    match answered.recv_timeout(bound.saturating_sub(started.elapsed())) {
        Ok(got) => got,
        Err(RecvTimeoutError::Timeout) => Err(Stop::NoAnswer(started.elapsed())),
        Err(RecvTimeoutError::Disconnected) => Err(Stop::Thread(std::io::Error::other(
            "the thread taking the lock ended without an answer",
        ))),
    }
}

/// Takes the lock: one attempt, then (refused) a wait that a signal cancels, shown on a
/// terminal while it lasts.
fn acquire(
    client: &LockClient,
    key: &str,
    timeout: Option<Duration>,
    started: Instant,
) -> Result<LockGuard, Stop> {
    if let Some(guard) = client.try_lock(key, Duration::ZERO)? {
        return Ok(guard);
    }
    if timeout == Some(Duration::ZERO) {
        return Err(Stop::TimedOut);
    }
    // Dropping `done` ends the helper threads: the signal watch and the progress line.
    let (done, finished) = crossbeam_channel::bounded::<()>(0);
    let (cancel, cancelled) = crossbeam_channel::bounded(1);
    let watcher = {
        let finished = finished.clone();
        thread::Builder::new()
            .name("fencelock-signals".into())
            .spawn(move || watch_signals(&cancel, &finished))
            .map_err(Stop::Thread)?
    };
    let progress = std::io::stderr().is_terminal().then(|| {
        let (client, key) = (client.clone(), key.to_owned());
        thread::Builder::new()
            .name("fencelock-progress".into())
            .spawn(move || show_progress(&client, &key, started, &finished))
    });

    let options = LockOptions::new().cancel(cancelled);
    let got = match timeout {
        Some(timeout) => {
            let left = timeout.saturating_sub(started.elapsed());
            client.try_lock_with(key, left, &options)
        }
        None => client.lock_with(key, &options).map(Some),
    };
    drop(done);
    let signal = watcher.join().unwrap_or(None);
    if let Some(Ok(progress)) = progress {
        let _ = progress.join();
    }
    match (got, signal) {
        // A signal that came as the lock was granted still stops the run.
        (Ok(Some(guard)), Some(signal)) => {
            release(guard, key);
            Err(Stop::Signal(signal))
        }
        (Ok(Some(guard)), None) => Ok(guard),
        (Ok(None), _) => Err(Stop::TimedOut),
        (Err(e), Some(signal)) if e.is_cancelled() => Err(Stop::Signal(signal)),
        (Err(e), _) => Err(Stop::Failed(e)),
    }
}

/// Cancels the wait at the first signal, whoever sent it: nothing runs yet that could receive
/// it. Returns that signal, or `None` once `finished` disconnects.
fn watch_signals(cancel: &Sender<()>, finished: &Receiver<()>) -> Option<libc::c_int> {
    loop {
        if let Some(first) = signals::take().first() {
            let _ = cancel.send(());
            return Some(first.number);
        }
        match finished.recv_timeout(POLL) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return None,
        }
    }
}

/// Shows on stderr (a terminal) what the wait is for, drawn again about every second in place:
/// the key, the holder's token, how long it has waited. Clears the line at the end.
fn show_progress(client: &LockClient, key: &str, started: Instant, finished: &Receiver<()>) {
    let mut stderr = std::io::stderr();
    // Drawn on the second since the start, whatever a draw takes: each shows the next second.
    let mut next = Instant::now();
    loop {
        let holder = match client.status(key) {
            Ok(status) if status.held => match status.token {
                Some(token) => format!(", held with token {token}"),
                None => ", held".to_owned(),
            },
            Ok(_) => ", free: about to be granted".to_owned(),
            Err(_) => String::new(),
        };
        // Nothing to do if the terminal is gone.
        let _ = write!(
            stderr,
            "\r\x1b[2Kfencelock: waiting for {key:?}{holder} ({})",
            seconds(started.elapsed())
        );
        let _ = stderr.flush();
        while next <= Instant::now() {
            next += REDRAW;
        }
        match finished.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    let _ = write!(stderr, "\r\x1b[2K");
    let _ = stderr.flush();
}

/// How watching CMD ended.
enum Watched {
    Exited(ExitStatus),
    Lost,
    /// `try_wait` failed: CMD's fate cannot be known.
    Unwatchable(std::io::Error),
}

/// Watches CMD until it exits or the lock is lost, passing on signals meanwhile.
fn watch(child: &mut Child, guard: &LockGuard) -> Watched {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Watched::Exited(status),
            Ok(None) => {}
            Err(e) => return Watched::Unwatchable(e),
        }
        pass_on(child);
        if !guard.is_held() {
            return Watched::Lost;
        }
        match guard.lost().recv_timeout(POLL) {
            Err(RecvTimeoutError::Timeout) => {}
            // Sent or disconnected: either means lost.
            _ => return Watched::Lost,
        }
    }
}

/// Passes signals fencelock received on to CMD, except a terminal's, which CMD received itself.
fn pass_on(child: &mut Child) {
    for Received { number, by_kernel } in signals::take() {
        if !by_kernel {
            signals::send(child, number);
        }
    }
}

/// Stops CMD after the lock was lost: SIGTERM now, SIGKILL once `grace` has passed.
fn stop(child: &mut Child, grace: Duration, program: &OsString) {
    signals::send(child, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                eprintln!("fencelock: {program:?} {}", describe(status));
                return;
            }
            Ok(None) if Instant::now() < deadline => {
                pass_on(child);
                thread::sleep(POLL);
            }
            _ => break,
        }
    }
    eprintln!(
        "fencelock: {program:?} did not exit within {} of SIGTERM; sending SIGKILL",
        human(grace)
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Releases a lock no command ran under (or none will): failures only cost its lease.
fn release(guard: LockGuard, key: &str) {
    if let Err(e) = guard.unlock() {
        eprintln!("fencelock: releasing {key:?} failed, it expires with its lease: {e}");
    }
}

/// A duration as the command line gives it: `0s` rather than `0ms`.
fn flag(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_owned()
    } else {
        human(d)
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by {}", signals::name(signal)),
        (None, None) => "ended".to_owned(),
    }
}
