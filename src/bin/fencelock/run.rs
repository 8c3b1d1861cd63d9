//! `fencelock run`: take the lock, run CMD while holding it, release it when CMD exits. `run
//! --permits N` runs through the same steps with a permit of a semaphore for the lock, and
//! `elect` with the lead of an election (each a [`Target`]).
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
use fencelock::{Error, LockClient, LockGuard, LockOptions, Permit, Semaphore};

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

/// How `fencelock run` (or `elect`) was asked to wait and to run CMD.
pub(crate) struct Run {
    pub(crate) timeout: Option<Duration>,
    /// The client's connection timeout: with `timeout`, how much longer Redis has to answer.
    pub(crate) connect_timeout: Duration,
    pub(crate) grace: Duration,
    pub(crate) command: Vec<OsString>,
}

/// What a run takes before CMD starts and holds while CMD runs: a lock (`run`), or the lead of an
/// election (`elect`). Messages name it through these methods.
pub(crate) trait Target: Clone + Send + 'static {
    /// The lock's guard, or the leadership.
    type Held: Held;

    /// Takes it: one attempt for `Some(0)`, a wait of at most `timeout`, or (`None`) as long
    /// as it takes.
    fn take(
        &self,
        timeout: Option<Duration>,
        options: &LockOptions,
    ) -> Result<Option<Self::Held>, Error>;

    /// What is waited for: `"job"`, `election "sched"`.
    fn name(&self) -> String;

    /// Why one attempt did not take it: `"job" is held by another holder`.
    fn busy(&self) -> String;

    /// Why a wait of `timeout` ended without it.
    fn not_within(&self, timeout: Duration) -> String;

    /// Who holds it now, for the progress line: `, held with token 17`; empty if unknown.
    fn holder(&self) -> String;

    /// The variables CMD gets in its environment.
    fn env(&self, held: &Self::Held) -> Vec<(&'static str, String)>;

    /// What can be lost: `the lock on "job"`.
    fn what(&self) -> String;

    /// What giving it up after a failure costs: `releasing "job" failed, it expires with its
    /// lease`.
    fn give_up_failed(&self) -> String;

    /// A message of its own for an error that taking it ended with, instead of the library's.
    fn explain(&self, _error: &Error) -> Option<String> {
        None
    }
}

/// A lock's guard or a leadership, held while CMD runs.
pub(crate) trait Held: Send + 'static {
    fn is_held(&self) -> bool;
    /// Fires once it is known lost.
    fn lost(&self) -> &Receiver<()>;
    /// Releases the lock, or resigns: an error that `is_lock_lost` if it was lost before.
    fn give_up(self) -> Result<(), Error>;
}

/// `fencelock run`'s target: the lock on a key.
#[derive(Clone)]
pub(crate) struct Lock {
    pub(crate) client: LockClient,
    pub(crate) key: String,
}

impl Target for Lock {
    type Held = LockGuard;

    fn take(
        &self,
        timeout: Option<Duration>,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        match timeout {
            Some(timeout) => self.client.try_lock_with(&self.key, timeout, options),
            None => self.client.lock_with(&self.key, options).map(Some),
        }
    }

    fn name(&self) -> String {
        format!("{:?}", self.key)
    }

    fn busy(&self) -> String {
        format!("{:?} is held by another holder", self.key)
    }

    fn not_within(&self, timeout: Duration) -> String {
        format!("{:?} was not granted within {}", self.key, human(timeout))
    }

    fn holder(&self) -> String {
        match self.client.status(&self.key) {
            Ok(status) if status.held => match status.token {
                Some(token) => format!(", held with token {token}"),
                None => ", held".to_owned(),
            },
            Ok(_) => ", free: about to be granted".to_owned(),
            Err(_) => String::new(),
        }
    }

    fn env(&self, guard: &LockGuard) -> Vec<(&'static str, String)> {
        vec![
            ("FENCELOCK_TOKEN", guard.token().to_string()),
            ("FENCELOCK_KEY", self.key.clone()),
        ]
    }

    fn what(&self) -> String {
        format!("the lock on {:?}", self.key)
    }

    fn give_up_failed(&self) -> String {
        format!("releasing {:?} failed, it expires with its lease", self.key)
    }
}

impl Held for LockGuard {
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }

    fn lost(&self) -> &Receiver<()> {
        LockGuard::lost(self)
    }

    fn give_up(self) -> Result<(), Error> {
        self.unlock()
    }
}

/// `fencelock run --permits N`'s target: a permit of the semaphore on a key.
#[derive(Clone)]
pub(crate) struct Permits {
    pub(crate) semaphore: Semaphore,
}

impl Permits {
    fn key(&self) -> &str {
        self.semaphore.name()
    }
}

impl Target for Permits {
    type Held = Permit;

    fn take(
        &self,
        timeout: Option<Duration>,
        options: &LockOptions,
    ) -> Result<Option<Permit>, Error> {
        match timeout {
            Some(timeout) => self.semaphore.try_acquire_with(timeout, options),
            None => self.semaphore.acquire_with(options).map(Some),
        }
    }

    fn name(&self) -> String {
        format!("a permit of semaphore {:?}", self.key())
    }

    fn busy(&self) -> String {
        format!(
            "all {} permits of semaphore {:?} are held",
            self.semaphore.permits(),
            self.key()
        )
    }

    fn not_within(&self, timeout: Duration) -> String {
        format!(
            "no permit of semaphore {:?} was granted within {}",
            self.key(),
            human(timeout)
        )
    }

    fn holder(&self) -> String {
        match self.semaphore.status() {
            Ok(status) => format!(
                ", {} of {} held, {} waiting",
                status.held, status.permits, status.waiters
            ),
            Err(_) => String::new(),
        }
    }

    fn env(&self, permit: &Permit) -> Vec<(&'static str, String)> {
        vec![
            ("FENCELOCK_TOKEN", permit.token().to_string()),
            ("FENCELOCK_KEY", self.key().to_owned()),
        ]
    }

    fn what(&self) -> String {
        format!("the permit of semaphore {:?}", self.key())
    }

    fn give_up_failed(&self) -> String {
        format!(
            "releasing the permit of semaphore {:?} failed, it expires with its lease",
            self.key()
        )
    }

    /// A count other than the one in force: `--permits` is what the user can change.
    fn explain(&self, error: &Error) -> Option<String> {
        match error {
            Error::InvalidArgument {
                what: "permits",
                reason,
            } => Some(format!(
                "--permits {} does not match: {reason}; not run",
                self.semaphore.permits()
            )),
            _ => None,
        }
    }
}

impl Held for Permit {
    fn is_held(&self) -> bool {
        Permit::is_held(self)
    }

    fn lost(&self) -> &Receiver<()> {
        Permit::lost(self)
    }

    fn give_up(self) -> Result<(), Error> {
        self.release()
    }
}

/// Runs CMD while holding `target`; returns fencelock's exit status.
pub(crate) fn run<T: Target>(target: &T, run: &Run) -> u8 {
    if let Err(e) = signals::install() {
        eprintln!("fencelock: cannot handle signals: {e}");
        return exit::ERROR;
    }
    let held = match acquire_within(target, run) {
        Ok(held) => held,
        Err(Stop::TimedOut) => {
            match run.timeout.unwrap_or_default() {
                zero if zero.is_zero() => eprintln!("fencelock: {}; not run", target.busy()),
                timeout => eprintln!("fencelock: {}; not run", target.not_within(timeout)),
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
                 timeout {}); {} not run",
                human(waited),
                flag(run.timeout.unwrap_or_default()),
                human(run.connect_timeout),
                target.name()
            );
            return exit::ERROR;
        }
        Err(Stop::Signal(signal)) => {
            eprintln!(
                "fencelock: {} while waiting for {}; not run",
                signals::name(signal),
                target.name()
            );
            return exit::by_signal(signal);
        }
        Err(Stop::Failed(e)) => match target.explain(&e) {
            Some(message) => {
                eprintln!("fencelock: {message}");
                return exit::of_error(&e);
            }
            None => return exit::report(&e),
        },
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
    command.args(args).envs(target.env(&held));
    signals::terminate_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let status = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            eprintln!("fencelock: cannot run {program:?}: {e}");
            give_up(held, target);
            return status;
        }
    };

    match watch(&mut child, &held) {
        Watched::Exited(status) => {
            let code = exit::of(status);
            match held.give_up() {
                Ok(()) => code,
                Err(e) if e.is_lock_lost() => {
                    eprintln!(
                        "fencelock: {} was lost before {program:?} exited ({})",
                        target.what(),
                        describe(status)
                    );
                    exit::LOST
                }
                Err(e) => {
                    eprintln!("fencelock: {}: {e}", target.give_up_failed());
                    code
                }
            }
        }
        Watched::Lost => {
            eprintln!(
                "fencelock: lost {} while {program:?} ran; sending it SIGTERM",
                target.what()
            );
            stop(&mut child, run.grace, program);
            // It is another's or gone: this release finds nothing of ours to delete.
            let _ = held.give_up();
            exit::LOST
        }
        Watched::Unwatchable(e) => {
            eprintln!("fencelock: cannot watch {program:?} ({e}); killing it");
            let _ = child.kill();
            let _ = child.wait();
            give_up(held, target);
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
fn acquire_within<T: Target>(target: &T, run: &Run) -> Result<T::Held, Stop> {
    let started = Instant::now();
    let Some(timeout) = run.timeout else {
        return acquire(target, None, started);
    };
    let bound = timeout
        .saturating_add(run.connect_timeout)
        .saturating_add(SLACK);
    let (answer, answered) = crossbeam_channel::bounded(1);
    let target = target.clone();
    thread::Builder::new()
        .name("fencelock-acquire".into())
        .spawn(move || {
            // Sent into the void after the bound: the guard (leadership) drops, releasing the
            // lock (resigning).
            let _ = answer.send(acquire(&target, Some(timeout), started));
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

/// Takes the target: one attempt, then (refused) a wait that a signal cancels, shown on a
/// terminal while it lasts.
fn acquire<T: Target>(
    target: &T,
    timeout: Option<Duration>,
    started: Instant,
) -> Result<T::Held, Stop> {
    if let Some(held) = target.take(Some(Duration::ZERO), &LockOptions::new())? {
        return Ok(held);
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
        let target = target.clone();
        thread::Builder::new()
            .name("fencelock-progress".into())
            .spawn(move || show_progress(&target, started, &finished))
    });

    let options = LockOptions::new().cancel(cancelled);
    let left = timeout.map(|timeout| timeout.saturating_sub(started.elapsed()));
    let got = target.take(left, &options);
    drop(done);
    let signal = watcher.join().unwrap_or(None);
    if let Some(Ok(progress)) = progress {
        let _ = progress.join();
    }
    match (got, signal) {
        // A signal that came as the lock was granted still stops the run.
        (Ok(Some(held)), Some(signal)) => {
            give_up(held, target);
            Err(Stop::Signal(signal))
        }
        (Ok(Some(held)), None) => Ok(held),
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
fn show_progress<T: Target>(target: &T, started: Instant, finished: &Receiver<()>) {
    let mut stderr = std::io::stderr();
    let name = target.name();
    // Drawn on the second since the start, whatever a draw takes: each shows the next second.
    let mut next = Instant::now();
    loop {
        let holder = target.holder();
        // Nothing to do if the terminal is gone.
        let _ = write!(
            stderr,
            "\r\x1b[2Kfencelock: waiting for {name}{holder} ({})",
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
fn watch(child: &mut Child, held: &impl Held) -> Watched {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Watched::Exited(status),
            Ok(None) => {}
            Err(e) => return Watched::Unwatchable(e),
        }
        pass_on(child);
        if !held.is_held() {
            return Watched::Lost;
        }
        match held.lost().recv_timeout(POLL) {
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

/// Releases a lock no command ran under (or none will), or resigns such a leadership: failures
/// only cost its lease.
fn give_up<T: Target>(held: T::Held, target: &T) {
    if let Err(e) = held.give_up() {
        eprintln!("fencelock: {}: {e}", target.give_up_failed());
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
