//! The master that a group of sentinels names, followed through failovers.
//!
//! ```text
//! state of the client's view      what moves it
//! ------------------------------  -----------------------------------------------------------
//! no master known                 a connection is asked for: ask every sentinel at once,
//!                                 within the connection timeout, and take the answer of the
//!                                 highest configuration epoch (one thread asks; others wait
//!                                 for its answer, each until its own deadline)
//! master M (epoch e)              every new connection to M is checked with ROLE first
//! M suspect                       a connection to M made at epoch e broke, timed out, or a
//!                                 command on it was refused as by a replica (READONLY,
//!                                 MASTERDOWN, NOREPLICAS): the next connection asks again
//! master M' != M (epoch e + 1)    the sentinels named M' (at a configuration epoch no lower
//!                                 than any seen before), a sentinel announced +switch-master,
//!                                 or M said ROLE slave: every connection made at epoch e is
//!                                 dropped when next used (pool, renewal, wake thread)
//! ```
//!
//! A watcher thread per client subscribes to `+switch-master` on one sentinel, and every
//! [`CHECK`] asks that sentinel for the master and asks the master for its `ROLE`, so that a
//! demoted master is left even when no connection to it breaks: an old master that comes back
//! after a failover takes writes for about ten seconds before Sentinel reconfigures it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, Value};

use crate::error::Result;
use crate::net::target::SentinelSpec;
use crate::net::tls::TlsSettings;

/// How often the watcher asks its sentinel for the master and the master for its role.
const CHECK: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The least time the sentinels still to answer are given once a majority has answered.
const MIN_GRACE: Duration = Duration::from_millis(50);

/// The data nodes of a Sentinel deployment, as one node: its current master.
pub(crate) struct Sentinel {
    state: Arc<State>,
}

struct State {
    name: String,
    /// The sentinels, in the order to ask them: the last one that answered first.
    sentinels: Mutex<Vec<Addressed>>,
    /// How to log in to a data node (credentials, database, TLS), less its address.
    template: redis::RedisConnectionInfo,
    tls: Option<TlsSettings>,
    current: Mutex<Current>,
    /// True while a thread asks the sentinels, so that a failover costs one round of questions,
    /// not one per thread that saw it; the others wait on `resolved`, each no later than its
    /// own deadline.
    resolving: Mutex<bool>,
    resolved: Condvar,
    /// Bumped whenever the master changes: connections made before are to be dropped.
    epoch: AtomicU64,
    /// The client's connection timeout: a connection given less (by a caller's deadline) that
    /// times out says nothing about the master.
    connection_timeout: Duration,
    /// The last round of questions got the master's address from a sentinel: see
    /// [`Sentinel::answered`].
    answered: AtomicBool,
}

/// A sentinel, and how to show it in a message.
#[derive(Clone)]
struct Addressed {
    shown: String,
    client: redis::Client,
    /// A question to this sentinel is still out (its thread still runs): at most one at a
    /// time, so that a frozen sentinel does not gather a thread per round.
    asking: Arc<AtomicBool>,
}

#[derive(Default)]
struct Current {
    master: Option<Master>,
    /// Ask the sentinels before the next connection.
    suspect: bool,
    /// Rounds of questions to the sentinels so far.
    rounds: u64,
    /// The highest configuration epoch a sentinel named the master in: a failover raises it.
    config_epoch: u64,
}

/// A sentinel's answer: the master's address, and the configuration epoch it belongs to.
struct Named {
    host: String,
    port: u16,
    config_epoch: u64,
}

#[derive(Clone)]
struct Master {
    host: String,
    port: u16,
    client: redis::Client,
}

impl Sentinel {
    /// Parses and checks; starts the watcher thread. Nothing is connected here.
    pub(crate) fn open(
        spec: &SentinelSpec,
        tls: &TlsSettings,
        connection_timeout: Duration,
    ) -> Result<Sentinel> {
        let mut sentinels = Vec::with_capacity(spec.sentinels.len());
        for url in &spec.sentinels {
            sentinels.push(Addressed {
                shown: crate::net::url::shown(url),
                client: crate::net::url::client(url, tls)?,
                asking: Arc::default(),
            });
        }
        let mut template = redis::RedisConnectionInfo::default().set_db(spec.db);
        if let Some(user) = &spec.username {
            template = template.set_username(user);
        }
        if let Some(password) = &spec.password {
            template = template.set_password(password);
        }
        let state = Arc::new(State {
            name: spec.master_name.clone(),
            sentinels: Mutex::new(sentinels),
            template,
            tls: spec.tls().then(|| tls.clone()),
            current: Mutex::default(),
            resolving: Mutex::new(false),
            resolved: Condvar::new(),
            epoch: AtomicU64::new(0),
            connection_timeout,
            answered: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&state);
        let timeout = connection_timeout.clamp(Duration::from_millis(10), Duration::from_secs(5));
        thread::Builder::new()
            .name("fencelock-sentinel".to_owned())
            .spawn(move || watch(&weak, timeout))
            .map_err(|e| crate::error::Error::Connection(Box::new(e)))?;
        Ok(Sentinel { state })
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.state.epoch.load(Ordering::Acquire)
    }

    /// The master as a message names it: by name, and at its address if one is known.
    pub(crate) fn shown(&self) -> String {
        let state = &self.state;
        match &state.current().master {
            Some(master) => format!("master {:?} at {}:{}", state.name, master.host, master.port),
            None => format!("master {:?}", state.name),
        }
    }

    /// Whether a sentinel named the master when they were last asked: while they answer, a
    /// master that stopped answering may yet be replaced, and a caller with time left asks
    /// again. With every sentinel out of reach, nothing new can be learnt.
    pub(crate) fn answered(&self) -> bool {
        self.state.answered.load(Ordering::Relaxed)
    }

    /// A new connection to the master, checked with `ROLE`, made within `connect_timeout`
    /// (asking the sentinels included). A master that cannot be reached, or says it is a
    /// replica, makes the sentinels be asked once more before the call gives up.
    pub(crate) fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<redis::Connection> {
        let state = &self.state;
        let deadline = Instant::now() + connect_timeout;
        // Sentinels given less than the connection timeout that do not answer may only be slow.
        let cut = connect_timeout < state.connection_timeout;
        let mut asked = false;
        loop {
            let (master, epoch) = state.master(deadline, cut, &mut asked)?;
            let left = left(deadline);
            let outcome = open(&master.client, left, response_timeout);
            match outcome {
                Ok((con, Role::Master)) => return Ok(con),
                Ok((_, Role::Other(role))) => {
                    state.moved_off(epoch);
                    if asked {
                        return Err(RedisError::from((
                            ErrorKind::Io,
                            "the master that the sentinels name is not a master",
                            format!("{}:{} says ROLE {role}", master.host, master.port),
                        )));
                    }
                }
                Err(e) if is_refusal(&e) => return Err(e),
                // Cut short by the caller's deadline: the master may just be slower than that.
                Err(e) if e.is_timeout() && connect_timeout < state.connection_timeout => {
                    return Err(e)
                }
                Err(e) => {
                    state.suspect(epoch);
                    if asked || left.is_zero() {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// A command on a connection made at `epoch` failed with `error`: after a broken
    /// connection, a timeout, or a refusal as by a replica, ask the sentinels before the next
    /// connection, unless the master has moved since that connection was made.
    pub(crate) fn failed(&self, epoch: u64, error: &RedisError) {
        if error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || not_master(error)
        {
            self.state.suspect(epoch);
        }
    }
}

/// What a server that does not know the SENTINEL command is.
const NOT_A_SENTINEL: &str = "not a sentinel";

/// A reply that says the server is no (writable) master any more: the command did nothing.
pub(crate) fn not_master(error: &RedisError) -> bool {
    matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "NOREPLICAS"))
}

/// A set-up error that asking again cannot fix: wrong credentials, a database that does not
/// exist, NOAUTH.
pub(super) fn is_refusal(e: &RedisError) -> bool {
    matches!(
        super::connect_error(e.clone()),
        crate::error::Error::Rejected(_)
    )
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl State {
    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The master to connect to, and the epoch it belongs to: the one known, unless it is
    /// suspect or none is, in which case the sentinels are asked (once per call: `asked`).
    /// `cut`: the call has less than the connection timeout (its caller's deadline), so
    /// sentinels that do not answer in it may only be slow, and [`Sentinel::answered`] is left
    /// as it was.
    fn master(&self, deadline: Instant, cut: bool, asked: &mut bool) -> RedisResult<(Master, u64)> {
        let rounds = {
            let current = self.current();
            match &current.master {
                Some(master) if !current.suspect || *asked => {
                    return Ok((master.clone(), self.epoch.load(Ordering::Acquire)))
                }
                _ => current.rounds,
            }
        };
        *asked = true;
        let (_turn, waited) = self.turn(deadline)?;
        {
            // Another thread asked while this one waited: its answer is as fresh.
            let current = self.current();
            if let (Some(master), true) = (&current.master, current.rounds != rounds) {
                if !current.suspect {
                    return Ok((master.clone(), self.epoch.load(Ordering::Acquire)));
                }
            }
        }
        // Sentinels that gave no answer within less than the connection timeout (what a
        // caller's deadline, or the wait for another thread's question, left) may only be slow.
        // (The deadline itself is never a whole connection timeout away by now: compare what
        // the call was given, and whether it waited for another thread.)
        let cut = cut || waited;
        let (named, every_one_failed) = self.ask(deadline);
        // Out of reach only when every sentinel failed outright (refused, broke, errored): one
        // that gave no answer in time, or was still answering an earlier question, may only be
        // slow, as on a loaded machine.
        if named.is_ok() || (!cut && every_one_failed) {
            self.answered.store(named.is_ok(), Ordering::Relaxed);
        }
        let named = named?;
        self.observe(&named)?;
        let mut current = self.current();
        current.suspect = false;
        current.rounds += 1;
        let master = current.master.clone().ok_or_else(|| {
            RedisError::from((ErrorKind::Io, "the master moved while it was looked up"))
        })?;
        Ok((master, self.epoch.load(Ordering::Acquire)))
    }

    /// Waits (no later than `deadline`) until no other thread is asking the sentinels, and
    /// takes the turn; the turn ends when the returned value is dropped.
    /// Also says whether it had to wait for another thread.
    fn turn(&self, deadline: Instant) -> RedisResult<(Turn<'_>, bool)> {
        let mut busy = self
            .resolving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let waited = *busy;
        while *busy {
            let left = left(deadline);
            if left.is_zero() {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the sentinels were still being asked for the master when the time was up",
                )));
            }
            busy = self
                .resolved
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *busy = true;
        Ok((Turn(self), waited))
    }

    /// Asks every sentinel at once for the master, and takes the answer of the highest
    /// configuration epoch: right after a failover a sentinel that was not its leader may still
    /// name the old master for a second or two, and an old master that comes back says `ROLE
    /// master` for about ten seconds, so the first answer is not enough. Once a majority has
    /// answered, the others get as long again as that took (at least [`MIN_GRACE`]): a frozen
    /// sentinel costs that much, not the whole connection timeout. The sentinel whose answer is
    /// taken moves to the front.
    ///
    /// Also says whether every sentinel failed outright (none was slow or busy).
    fn ask(&self, deadline: Instant) -> (RedisResult<Named>, bool) {
        let sentinels = self
            .sentinels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let started = Instant::now();
        let (tx, rx) = crossbeam_channel::bounded(sentinels.len());
        let mut answers: Vec<Option<RedisResult<Option<Named>>>> =
            sentinels.iter().map(|_| None).collect();
        let mut asked = 0;
        let mut busy = Vec::new();
        for (i, sentinel) in sentinels.iter().enumerate() {
            if sentinel.asking.swap(true, Ordering::AcqRel) {
                busy.push(i);
                continue;
            }
            let asking = Arc::clone(&sentinel.asking);
            let (tx, client, name) = (tx.clone(), sentinel.client.clone(), self.name.clone());
            let timeout = left(deadline).max(Duration::from_millis(1));
            // Threads of their own: a sentinel that hangs past its timeout (connecting to a
            // frozen process can take twice the timeout given) holds up nobody; its answer,
            // if it ever comes, goes nowhere.
            let spawned = thread::Builder::new()
                .name("fencelock-sentinel-ask".to_owned())
                .spawn(move || {
                    let answer = master_addr(&client, &name, timeout);
                    asking.store(false, Ordering::Release);
                    let _ = tx.send((i, answer));
                });
            match spawned {
                Ok(_) => asked += 1,
                Err(e) => {
                    sentinel.asking.store(false, Ordering::Release);
                    answers[i] = Some(Err(RedisError::from(e)));
                }
            }
        }
        drop(tx);
        let majority = sentinels.len() / 2 + 1;
        let (mut read, mut named) = (0, 0);
        let mut until = deadline;
        while read < asked {
            let Ok((i, answer)) = rx.recv_deadline(until) else {
                break;
            };
            read += 1;
            if matches!(answer, Ok(Some(_))) {
                named += 1;
                if named == majority {
                    let grace = started.elapsed().max(MIN_GRACE);
                    until = until.min(Instant::now() + grace);
                }
            }
            answers[i] = Some(answer);
        }
        let every_one_failed = answers.iter().all(|a| matches!(a, Some(Err(_))));
        let mut failures = Vec::new();
        let (mut unknown, mut refused, mut handshakes, mut not_sentinels) = (0, 0, 0, 0);
        let mut best: Option<(usize, Named)> = None;
        for (i, (sentinel, answer)) in sentinels.iter().zip(answers).enumerate() {
            match answer {
                Some(Ok(Some(answer))) => {
                    if best
                        .as_ref()
                        .is_none_or(|(_, b)| answer.config_epoch > b.config_epoch)
                    {
                        best = Some((i, answer));
                    }
                }
                Some(Ok(None)) => {
                    unknown += 1;
                    failures.push(format!(
                        "{}: no master named {:?}",
                        sentinel.shown, self.name
                    ));
                }
                Some(Err(e)) if is_refusal(&e) => {
                    // One sentinel's refusal (a password it wants) is its own: the others may
                    // answer. Only if none can is the set-up wrong.
                    refused += 1;
                    if e.to_string().contains(NOT_A_SENTINEL) {
                        not_sentinels += 1;
                    }
                    match crate::net::tls::HandshakeFailed::from_connect(e) {
                        Ok(failed) => {
                            handshakes += 1;
                            failures.push(format!("{}: {failed}", sentinel.shown));
                        }
                        Err(e) => failures.push(format!("{}: {e}", sentinel.shown)),
                    }
                }
                Some(Err(e)) => failures.push(format!("{}: {e}", sentinel.shown)),
                None if busy.contains(&i) => failures.push(format!(
                    "{}: still answering an earlier question",
                    sentinel.shown
                )),
                None => failures.push(format!("{}: no answer in time", sentinel.shown)),
            }
        }
        if let Some((i, answer)) = best {
            if i > 0 {
                let mut order = self
                    .sentinels
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(at) = order.iter().position(|s| s.shown == sentinels[i].shown) {
                    let answered = order.remove(at);
                    order.insert(0, answered);
                }
            }
            return (Ok(answer), false);
        }
        // Every sentinel answered, and none knows such a master or would let us ask: a set-up
        // error (a misspelt name, a password), which asking again will not fix.
        if unknown + refused == sentinels.len() {
            let kind = if not_sentinels == sentinels.len() {
                ErrorKind::InvalidClientConfig
            } else if unknown > 0 {
                ErrorKind::MasterNameNotFoundBySentinel
            } else {
                ErrorKind::AuthenticationFailed
            };
            // A failed handshake everywhere is told as one, so that the error points at TLS
            // (the certificates to trust), not at credentials.
            // Which hint fits: a set-up refused for its credentials, or servers that are not
            // sentinels, or a name they do not know.
            let what = if handshakes == sentinels.len() {
                crate::error::HANDSHAKE_FAILED
            } else if not_sentinels == sentinels.len() {
                crate::error::NOT_SENTINELS
            } else if unknown > 0 && unknown + not_sentinels == sentinels.len() {
                crate::error::UNKNOWN_MASTER
            } else {
                "no sentinel named the master"
            };
            return (
                Err(RedisError::from((kind, what, failures.join("; ")))),
                every_one_failed,
            );
        }
        let e = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no sentinel named the master {:?}: {}",
                self.name,
                failures.join("; ")
            ),
        ));
        (Err(e), every_one_failed)
    }

    /// The sentinels (or the watcher) name `host:port` as the master: a new address starts a
    /// new epoch. An answer of a lower configuration epoch than one seen before is ignored: for
    /// a second or two after a failover, the sentinels that did not lead it still name the old
    /// master under the old epoch, however many of them answer. (Sentinels set up again with
    /// `SENTINEL REMOVE` and `MONITOR` start over at epoch 0: clients built before then follow
    /// no failover until the epoch passes the highest they saw, and are to be rebuilt.)
    fn observe(&self, named: &Named) -> RedisResult<()> {
        let Named {
            host,
            port,
            config_epoch,
        } = named;
        let (host, port) = (host.as_str(), *port);
        let mut current = self.current();
        if *config_epoch < current.config_epoch {
            return Ok(());
        }
        current.config_epoch = *config_epoch;
        if let Some(master) = &current.master {
            if master.host == host && master.port == port {
                return Ok(());
            }
        }
        let client = self.client_for(host, port)?;
        let previous = current.master.replace(Master {
            host: host.to_owned(),
            port,
            client,
        });
        current.suspect = false;
        if previous.is_some() {
            // Only a move retires connections: the first master found is where the ones made
            // while it was looked up went.
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        drop(current);
        match previous {
            Some(old) => log::info!(
                "fencelock: the master {:?} moved from {}:{} to {host}:{port}",
                self.name,
                old.host,
                old.port
            ),
            None => log::debug!("fencelock: the master {:?} is {host}:{port}", self.name),
        }
        Ok(())
    }

    /// The master made at `epoch` looks unreachable: ask the sentinels before the next
    /// connection.
    fn suspect(&self, epoch: u64) {
        if self.epoch.load(Ordering::Acquire) == epoch {
            self.current().suspect = true;
        }
    }

    /// The master made at `epoch` says it is no master: forget it, and drop every connection
    /// to it.
    fn moved_off(&self, epoch: u64) {
        let mut current = self.current();
        if self.epoch.load(Ordering::Acquire) == epoch && current.master.is_some() {
            current.master = None;
            current.suspect = true;
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn client_for(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let addr = match &self.tls {
            None => ConnectionAddr::Tcp(host.to_owned(), port),
            Some(_) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let info = addr.into_connection_info()?;
        let tcp = info.tcp_settings().clone().set_nodelay(true);
        let info = info
            .set_tcp_settings(tcp)
            .set_redis_settings(self.template.clone());
        match &self.tls {
            None => redis::Client::open(info),
            Some(tls) => crate::net::tls::client(info, tls).map_err(|e| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "TLS settings",
                    e.to_string(),
                ))
            }),
        }
    }
}

/// A thread's turn to ask the sentinels; see [`State::turn`].
struct Turn<'a>(&'a State);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self
            .0
            .resolving
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
        self.0.resolved.notify_all();
    }
}

enum Role {
    Master,
    Other(String),
}

/// Connects to a data node and asks its `ROLE`.
fn open(
    client: &redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> RedisResult<(redis::Connection, Role)> {
    let connect_timeout = connect_timeout.max(Duration::from_millis(1));
    let mut con = client.get_connection_with_timeout(connect_timeout)?;
    con.set_read_timeout(Some(response_timeout))?;
    con.set_write_timeout(Some(response_timeout))?;
    let role = role(&mut con)?;
    Ok((con, role))
}

fn role(con: &mut redis::Connection) -> RedisResult<Role> {
    let reply: Value = redis::cmd("ROLE").query(con)?;
    let first = match reply {
        Value::Array(items) => items.into_iter().next(),
        _ => None,
    };
    let role: String = match first {
        Some(value) => redis::from_redis_value(value)?,
        None => {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "ROLE gave no role",
            )))
        }
    };
    Ok(if role == "master" {
        Role::Master
    } else {
        Role::Other(role)
    })
}

/// `SENTINEL MASTER name` on a new connection to a sentinel.
fn master_addr(
    sentinel: &redis::Client,
    name: &str,
    timeout: Duration,
) -> RedisResult<Option<Named>> {
    let mut con = sentinel.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    ask_master_addr(&mut con, name)
}

/// The master's address (`SENTINEL GET-MASTER-ADDR-BY-NAME`) and configuration epoch (from
/// `SENTINEL MASTER`), in one round trip; `None` if the sentinel knows no such master. The
/// address comes from the second: while a failover updates the configuration, it already names
/// the promoted replica, where `SENTINEL MASTER` still shows the old master. The epoch is asked
/// first, so that should the sentinel move between the two, the address is the newer of the
/// two, never an old address under a new epoch.
fn ask_master_addr(con: &mut redis::Connection, name: &str) -> RedisResult<Option<Named>> {
    let (master, addr): (Value, Value) = redis::pipe()
        .cmd("SENTINEL")
        .arg("MASTER")
        .arg(name)
        .cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .ignore_errors()
        .query(con)?;
    // An unknown name: an error to the first, nil to the second. A refusal of both (NOAUTH,
    // NOPERM) is the sentinel's answer, told as such, not as a reply of the wrong type. A server
    // that does not know the command is no sentinel (a data server's address, say).
    let addr: Option<(String, u16)> = match addr {
        Value::ServerError(e)
            if e.to_string()
                .to_ascii_lowercase()
                .contains("unknown command") =>
        {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                NOT_A_SENTINEL,
                e.to_string(),
            )))
        }
        Value::ServerError(e) => return Err(e.into()),
        value => redis::from_redis_value(value)?,
    };
    let Some((host, port)) = addr else {
        return Ok(None);
    };
    let fields: Vec<String> = match master {
        Value::ServerError(e) => return Err(e.into()),
        value => redis::from_redis_value(value)?,
    };
    let config_epoch = fields
        .chunks(2)
        .find(|pair| pair[0] == "config-epoch")
        .and_then(|pair| pair.get(1)?.parse().ok())
        .ok_or_else(|| {
            RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "SENTINEL MASTER without a config-epoch",
            ))
        })?;
    Ok(Some(Named {
        host,
        port,
        config_epoch,
    }))
}

/// The watcher: follows `+switch-master` on one sentinel, and every [`CHECK`] asks it for the
/// master and the master for its role. Exits within a [`CHECK`] of its client being dropped.
fn watch(state: &Weak<State>, timeout: Duration) {
    let mut next = 0;
    let mut backoff = Duration::from_millis(10);
    loop {
        let sentinel = {
            let Some(state) = state.upgrade() else {
                return;
            };
            let sentinels = state
                .sentinels
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            sentinels[next % sentinels.len()].clone()
        };
        match follow(state, &sentinel, timeout, &mut backoff) {
            Ok(()) => return,
            Err(e) => {
                log::debug!(
                    "fencelock: sentinel {} not followed, trying the next: {e}",
                    sentinel.shown
                );
                next += 1;
            }
        }
        // Sleep in steps, to notice the client going.
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if state.strong_count() == 0 {
                return;
            }
            thread::sleep(left(until).min(CHECK));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Follows one sentinel until the client is gone (`Ok`) or the sentinel fails (`Err`).
fn follow(
    state: &Weak<State>,
    sentinel: &Addressed,
    timeout: Duration,
    backoff: &mut Duration,
) -> RedisResult<()> {
    let name = match state.upgrade() {
        Some(state) => state.name.clone(),
        None => return Ok(()),
    };
    let mut events = sentinel.client.get_connection_with_timeout(timeout)?;
    events.set_write_timeout(Some(timeout))?;
    events.set_read_timeout(Some(timeout))?;
    events.send_packed_command(
        &redis::cmd("SUBSCRIBE")
            .arg("+switch-master")
            .get_packed_command(),
    )?;
    events.recv_response()?.extract_error()?;
    events.set_read_timeout(Some(CHECK))?;
    let mut questions = sentinel.client.get_connection_with_timeout(timeout)?;
    questions.set_read_timeout(Some(timeout))?;
    questions.set_write_timeout(Some(timeout))?;
    *backoff = Duration::from_millis(10);
    let mut master_con: Option<(u64, redis::Connection)> = None;
    let mut checked = Instant::now()
        .checked_sub(CHECK)
        .unwrap_or_else(Instant::now);
    loop {
        match events.recv_response() {
            Ok(value) => {
                if switched(value, &name) {
                    // Asked at once below: the message has no configuration epoch.
                    checked = Instant::now()
                        .checked_sub(CHECK)
                        .unwrap_or_else(Instant::now);
                }
            }
            Err(e) if e.is_timeout() || crate::net::wire::interrupted(&e) => {}
            Err(e) => return Err(e),
        }
        if checked.elapsed() < CHECK {
            continue;
        }
        checked = Instant::now();
        let Some(state) = state.upgrade() else {
            return Ok(());
        };
        if let Some(named) = ask_master_addr(&mut questions, &name)? {
            let _ = state.observe(&named);
        }
        // Briefly: a frozen master must not hold up the switch-master messages behind it.
        check_role(&state, &mut master_con, CHECK.min(timeout));
    }
}

/// Asks the master the client knows for its role; one that says it is a replica is left.
fn check_role(state: &State, con: &mut Option<(u64, redis::Connection)>, timeout: Duration) {
    let epoch = state.epoch.load(Ordering::Acquire);
    if con.as_ref().is_some_and(|(made, _)| *made != epoch) {
        *con = None;
    }
    if con.is_none() {
        let Some(master) = state.current().master.clone() else {
            return;
        };
        match open(&master.client, timeout, timeout) {
            Ok((made, Role::Master)) => *con = Some((epoch, made)),
            Ok((_, Role::Other(_))) => state.moved_off(epoch),
            Err(_) => {}
        }
        return;
    }
    if let Some((_, master)) = con {
        match role(master) {
            Ok(Role::Master) => {}
            Ok(Role::Other(_)) => {
                *con = None;
                state.moved_off(epoch);
            }
            Err(_) => *con = None,
        }
    }
}

/// Whether `value` is a `+switch-master` message for master `name`: `"<name> <old ip> <old
/// port> <new ip> <new port>"`.
fn switched(value: Value, name: &str) -> bool {
    let Some(msg) = redis::Msg::from_owned_value(value) else {
        return false;
    };
    let payload: String = msg.get_payload().unwrap_or_default();
    payload.split(' ').next() == Some(name)
}
