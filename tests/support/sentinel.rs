//! A real-process Redis Sentinel set-up on 127.0.0.1: one master, some replicas and three
//! sentinels, every process a child of the test with its own temp dir, killed and reaped on drop.
//!
//! Sentinel configuration: quorum 2, `down-after-milliseconds 1000`, `failover-timeout 5000`,
//! `parallel-syncs 1`. Measured on a 2-core machine with Redis 7.0.15: `SENTINEL FAILOVER` to
//! the new address about 1.1 s, SIGSTOP of the master to the new address about 3.1 s, and a
//! live old master (demoted, or resumed after SIGCONT) a synced replica about 10 s later.
//!
//! Data servers get `--repl-diskless-sync-delay 0` (before `server_args`, which may override
//! it): Redis 7's default waits 5 s before every full sync, which held up the start and every
//! rejoin of an old master.
//!
//! Replicas are started as plain servers and then told `REPLICAOF 127.0.0.1 <master>` (not
//! `--replicaof` on the command line): [`RedisServer::restart`] reuses the start arguments,
//! so a `--replicaof` argument would make a restarted server that Sentinel has since promoted
//! come back replicating from its own replica. A restarted server therefore comes back as an
//! (empty, unless persistence is in `server_args`) master; [`SentinelSet::restart_server`]
//! points it at the current master again, or Sentinel converts it itself (`+convert-to-slave`,
//! about 10 s later: Sentinel's `INFO` period for replicas is 10 s and it acts only 8 s after it
//! saw the role change).
//!
//! [`SentinelSet::builder`] adds credentials and TLS: a password on the data servers
//! (`requirepass`, `masterauth`; the sentinels get `sentinel auth-pass`), or an ACL user with the
//! `default` user off (`masteruser`, `sentinel auth-user`); a password on the sentinels
//! (`requirepass`, `sentinel sentinel-pass`); and TLS only on all of them (`port 0`, `tls-port`,
//! `tls-replication yes`, so that every address a sentinel gives is a TLS port), with
//! certificates of a CA made for the set. The set's own probes log in as each needs ([`Access`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::clock::ServerClock;
#[cfg(feature = "tls")]
use super::tls::{Ca, CertFiles};
use super::{
    read_from, unique_temp_dir, Access, Listen, RedisServer, ServerOptions, ServerProcess,
};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// Sentinels that must agree that the master is down before a failover.
const QUORUM: u32 = 2;
/// Sentinels in a set.
const SENTINELS: usize = 3;
/// `sentinel down-after-milliseconds`.
const DOWN_AFTER_MS: u64 = 1000;
/// `sentinel failover-timeout`. Sentinel waits twice this after a failover attempt of a master
/// before it tries again on its own, but a completed failover resets that clock
/// (`sentinelResetMaster`), and `SENTINEL FAILOVER` ignores it: three forced failovers in a row
/// worked here. It also bounds the reconfiguration of the other replicas.
const FAILOVER_TIMEOUT_MS: u64 = 5000;

/// How long [`SentinelSet::start`] may take to reach its ready state (after the processes run).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`SentinelSet::failover`] retries `-INPROG` / `-NOGOODSLAVE`.
const FAILOVER_RETRY: Duration = Duration::from_secs(20);
/// How long [`SentinelSet::failover`] waits for the switch once a sentinel accepted.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(15);
/// Poll interval of the wait loops.
const POLL: Duration = Duration::from_millis(50);
/// Connect/read/write timeout of the probes (a paused process must not hang a wait loop).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Log lines per process in panic messages.
const LOG_TAIL_LINES: usize = 25;

// ---------------------------------------------------------------------------
// One sentinel process
// ---------------------------------------------------------------------------

/// A `redis-server <dir>/sentinel.conf --sentinel` child process. Its log is
/// `<dir>/redis.log` (the name the shared readiness check looks at), early fatal errors go to
/// `<dir>/redis.stdio`; Sentinel rewrites `<dir>/sentinel.conf` as it learns the topology.
struct Sentinel {
    process: ServerProcess,
    /// Whether it is SIGSTOPped (by [`SentinelSet::pause_sentinel`]).
    paused: AtomicBool,
}

/// What every sentinel of a set is told beyond the common settings.
struct SentinelSettings {
    master_port: u16,
    /// How the sentinels log in to the data servers (`sentinel auth-user`, `auth-pass`).
    data: Access,
    /// How they, and the test, log in to the sentinels (`requirepass`, and `sentinel
    /// sentinel-pass` for each other); `tls_ca` set: TLS only.
    own: Access,
    /// The certificate lines of a TLS set (`tls-cert-file` and so on), else empty.
    tls_conf: String,
}

impl Sentinel {
    /// Starts a sentinel monitoring `127.0.0.1:master_port` on a free port (retrying on a port
    /// taken between `free_port` and the bind) and waits until it answers PING as itself.
    fn start(settings: &SentinelSettings) -> Sentinel {
        let dir = unique_temp_dir("fencelock-sentinel");
        let conf = dir.join("sentinel.conf");
        let hint = if settings.tls_conf.is_empty() {
            ""
        } else {
            " (a redis-server built without TLS support refuses tls-port)"
        };
        let process =
            ServerProcess::start("sentinel", dir.clone(), &settings.own, hint, &[], |port| {
                // Written afresh on every try: a sentinel that started rewrote it.
                fs::write(&conf, sentinel_conf(port, &dir, settings))
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", conf.display()));
                vec![conf.clone().into(), "--sentinel".into()]
            });
        Sentinel {
            process,
            paused: AtomicBool::new(false),
        }
    }

    fn port(&self) -> u16 {
        self.process.port
    }

    /// Running and not paused.
    fn is_live(&self) -> bool {
        !self.paused.load(Ordering::SeqCst) && self.process.is_running()
    }

    fn kill(&mut self) {
        self.process.kill();
        self.paused.store(false, Ordering::SeqCst);
    }
}

fn sentinel_conf(port: u16, dir: &Path, settings: &SentinelSettings) -> String {
    // `sentinel resolve-hostnames` and `announce-hostnames` stay at their default (no): every
    // address here is 127.0.0.1.
    let mut conf = if settings.own.tls_ca.is_some() {
        // `tls-replication yes`: to the data servers and to each other over TLS, and announced
        // to the other sentinels by the TLS port.
        format!(
            "port 0\ntls-port {port}\n{}tls-auth-clients no\ntls-replication yes\n",
            settings.tls_conf
        )
    } else {
        format!("port {port}\n")
    };
    let _ = write!(
        conf,
        "bind 127.0.0.1\n\
         daemonize no\n\
         dir \"{dir}\"\n\
         logfile \"{log}\"\n",
        dir = dir.display(),
        log = dir.join("redis.log").display(),
    );
    if let Some(password) = &settings.own.password {
        let _ = write!(
            conf,
            "requirepass \"{password}\"\nsentinel sentinel-pass \"{password}\"\n"
        );
    }
    let _ = write!(
        conf,
        "sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n\
         sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n",
        master_port = settings.master_port,
    );
    if let Some(user) = &settings.data.username {
        let _ = writeln!(conf, "sentinel auth-user {MASTER_NAME} \"{user}\"");
    }
    if let Some(password) = &settings.data.password {
        let _ = writeln!(conf, "sentinel auth-pass {MASTER_NAME} \"{password}\"");
    }
    conf
}

// ---------------------------------------------------------------------------
// Probes (short timeouts, errors as strings for the wait loops' messages)
// ---------------------------------------------------------------------------

fn connect(port: u16, access: &Access) -> Result<redis::Connection, String> {
    access.connect(port, PROBE_TIMEOUT)
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` on the sentinel at `port`: the master's port.
fn sentinel_master_port(port: u16, access: &Access) -> Result<u16, String> {
    let mut con = connect(port, access)?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut con)
        .map_err(|e| format!("sentinel {port}: GET-MASTER-ADDR-BY-NAME: {e}"))?;
    let (host, master) =
        addr.ok_or_else(|| format!("sentinel {port}: no master named {MASTER_NAME}"))?;
    if host != "127.0.0.1" {
        return Err(format!(
            "sentinel {port}: master at {host}:{master}, not 127.0.0.1"
        ));
    }
    Ok(master)
}

/// `SENTINEL <what> mymaster` (REPLICAS, SENTINELS): one field map per instance.
fn sentinel_instances(
    port: u16,
    access: &Access,
    what: &str,
) -> Result<Vec<HashMap<String, String>>, String> {
    let mut con = connect(port, access)?;
    redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER_NAME)
        .query(&mut con)
        .map_err(|e| format!("sentinel {port}: SENTINEL {what}: {e}"))
}

/// Whether a `flags` field of `SENTINEL REPLICAS`/`SENTINELS` says the instance is usable.
fn flags_healthy(flags: &str) -> bool {
    !flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
}

/// `INFO replication` of the server at `port`, as field -> value.
fn replication_info(port: u16, access: &Access) -> Result<HashMap<String, String>, String> {
    let mut con = connect(port, access)?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .map_err(|e| format!("server {port}: INFO replication: {e}"))?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

/// The `slaveN:` entries of a master's `INFO replication` that are `state=online`: their ports.
fn online_replica_ports(info: &HashMap<String, String>) -> Vec<u16> {
    let mut ports: Vec<u16> = info
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix("slave")
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .filter_map(|(_, v)| {
            let fields: HashMap<&str, &str> =
                v.split(',').filter_map(|f| f.split_once('=')).collect();
            (fields.get("state") == Some(&"online"))
                .then(|| fields.get("port").and_then(|p| p.parse().ok()))
                .flatten()
        })
        .collect();
    ports.sort_unstable();
    ports
}

/// Whether the server at `port` says `role:master`.
fn is_master(port: u16, access: &Access) -> Result<bool, String> {
    Ok(replication_info(port, access)?
        .get("role")
        .map(String::as_str)
        == Some("master"))
}

/// The last [`LOG_TAIL_LINES`] lines of `<dir>/redis.log` (and any stdout/stderr), headed by `name`.
fn log_tail_of(name: &str, dir: &Path) -> String {
    let log = read_from(&dir.join("redis.log"), 0);
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
    let mut out = format!(
        "--- {name} ({}/redis.log, last {LOG_TAIL_LINES} lines) ---\n{tail}\n",
        dir.display()
    );
    let stdio = read_from(&dir.join("redis.stdio"), 0);
    if !stdio.trim().is_empty() {
        let _ = writeln!(out, "--- {name} stdout/stderr ---\n{stdio}");
    }
    out
}

// ---------------------------------------------------------------------------
// The set
// ---------------------------------------------------------------------------

/// A master (server 0 at the start), `replicas` replicas and three sentinels, all real processes
/// on 127.0.0.1, dropped (sentinels first: SIGCONT, SIGKILL, reap) with the set.
///
/// Data servers are [`RedisServer`]s: pause, resume, kill and restart them through
/// [`SentinelSet::servers`] / [`SentinelSet::server_mut`]. The wait helpers treat a server that
/// is running as live, so resume a paused one before [`SentinelSet::wait_settled`].
pub struct SentinelSet {
    // Declared (so dropped) before the servers: no sentinel reacts to the servers' deaths.
    sentinels: Vec<Sentinel>,
    servers: Vec<RedisServer>,
    /// How the probes log in to the data servers, and to the sentinels.
    data_access: Access,
    sentinel_access: Access,
    /// The certificate files of a TLS set: dropped after every process that reads them.
    #[cfg(feature = "tls")]
    _cert_files: Option<CertFiles>,
    /// Each data server's wall clock, by index, when started with
    /// [`SentinelSetBuilder::clocks`]; dropped after the servers that read them.
    clocks: Vec<ServerClock>,
}

/// How to start a [`SentinelSet`]: `SentinelSet::builder().replicas(1).data_password("pw")
/// .sentinel_password("spw").start()`. Without a setter: no replica, no password, plain TCP.
#[derive(Clone, Debug, Default)]
pub struct SentinelSetBuilder {
    replicas: usize,
    server_args: Vec<String>,
    data_user: Option<String>,
    data_password: Option<String>,
    sentinel_password: Option<String>,
    tls: bool,
    clocks: bool,
}

impl SentinelSetBuilder {
    /// How many replicas beside the master.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// Appended to every data server's command line (the master's too: any server may become
    /// master), e.g. `&["--min-replicas-to-write", "1"]`.
    pub fn server_args(mut self, args: &[&str]) -> Self {
        self.server_args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// The data servers want `password` (`requirepass`, and `masterauth` to replicate); the
    /// sentinels are given it (`sentinel auth-pass`). With [`data_user`](Self::data_user), it is
    /// that user's password instead.
    pub fn data_password(mut self, password: &str) -> Self {
        self.data_password = Some(password.to_owned());
        self
    }

    /// The data servers know an ACL user `user` (every command, key and channel), with the
    /// [`data_password`](Self::data_password), and the `default` user is off: every connection
    /// logs in as `user`. Replicas replicate as it (`masteruser`), the sentinels log in as it
    /// (`sentinel auth-user`).
    pub fn data_user(mut self, user: &str) -> Self {
        self.data_user = Some(user.to_owned());
        self
    }

    /// The sentinels want `password` (`requirepass`), and give it to each other (`sentinel
    /// sentinel-pass`).
    pub fn sentinel_password(mut self, password: &str) -> Self {
        self.sentinel_password = Some(password.to_owned());
        self
    }

    /// Data servers and sentinels speak TLS only (`port 0`, `tls-port`, `tls-replication yes`,
    /// `tls-auth-clients no`), with a certificate for 127.0.0.1 of a CA made for the set
    /// ([`SentinelSet::ca_pem`]).
    #[cfg(feature = "tls")]
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Every data server gets a wall clock of its own that the test can step and skew
    /// ([`SentinelSet::clock`]; a restarted server keeps it).
    pub fn clocks(mut self) -> Self {
        self.clocks = true;
        self
    }

    /// Starts the set: see [`SentinelSet::start`] for when it returns.
    pub fn start(self) -> SentinelSet {
        assert!(
            self.data_user.is_none() || self.data_password.is_some(),
            "an ACL user needs a password (data_password)"
        );
        #[cfg(feature = "tls")]
        let (cert_files, ca_pem) = if self.tls {
            let ca = Ca::new("fencelock sentinel test CA");
            let files = CertFiles::write(&ca, &ca.server(&["127.0.0.1"]));
            (Some(files), Some(ca.pem().to_owned()))
        } else {
            (None, None)
        };
        #[cfg(not(feature = "tls"))]
        let ca_pem: Option<String> = None;
        let data_access = Access {
            username: self.data_user.clone(),
            password: self.data_password.clone(),
            tls_ca: ca_pem.clone(),
        };
        let sentinel_access = Access {
            username: None,
            password: self.sentinel_password.clone(),
            tls_ca: ca_pem,
        };
        // No 5 s wait before a full sync (Redis 7's default `repl-diskless-sync-delay`): it
        // would hold up the start and every rejoin of a demoted master. `server_args` can
        // override it.
        let mut args: Vec<String> = vec!["--repl-diskless-sync-delay".into(), "0".into()];
        #[cfg(feature = "tls")]
        let tls_conf = match &cert_files {
            Some(files) => {
                args.extend(files.server_args());
                args.extend(
                    ["--tls-auth-clients", "no", "--tls-replication", "yes"].map(str::to_owned),
                );
                format!(
                    "tls-cert-file \"{}\"\ntls-key-file \"{}\"\ntls-ca-cert-file \"{}\"\n",
                    files.cert_file, files.key_file, files.ca_file
                )
            }
            None => String::new(),
        };
        #[cfg(not(feature = "tls"))]
        let tls_conf = String::new();
        match (&self.data_user, &self.data_password) {
            (Some(user), Some(password)) => {
                // A word an argument: redis-server joins the words after an option into its line.
                let acl_password = format!(">{password}");
                args.extend(
                    [
                        "--user",
                        "default",
                        "off",
                        "--user",
                        user,
                        "on",
                        &acl_password,
                        "~*",
                        "&*",
                        "+@all",
                        "--masteruser",
                        user,
                        "--masterauth",
                        password,
                    ]
                    .map(str::to_owned),
                );
            }
            (None, Some(password)) => {
                for arg in ["--requirepass", password, "--masterauth", password] {
                    args.push(arg.to_owned());
                }
            }
            _ => {}
        }
        args.extend(self.server_args);
        let options = ServerOptions {
            args,
            listen: if data_access.tls_ca.is_some() {
                Listen::TlsOnly
            } else {
                Listen::Plain
            },
            access: data_access.clone(),
            env: Vec::new(),
        };
        let mut set = SentinelSet {
            sentinels: Vec::new(),
            servers: Vec::new(),
            data_access,
            sentinel_access,
            #[cfg(feature = "tls")]
            _cert_files: cert_files,
            clocks: Vec::new(),
        };
        if self.clocks {
            set.clocks = (0..=self.replicas).map(|_| ServerClock::new()).collect();
        }
        let options_of = |i: usize| match set.clocks.get(i) {
            Some(clock) => ServerOptions {
                env: clock.env(),
                ..options.clone()
            },
            None => options.clone(),
        };
        let options: Vec<ServerOptions> = (0..=self.replicas).map(options_of).collect();
        // Built in place, so a panic half-way drops (kills) whatever was started already.
        set.servers.push(RedisServer::start_as(&options[0]));
        let master_port = set.servers[0].port();
        for replica_options in &options[1..] {
            let replica = RedisServer::start_as(replica_options);
            replica_of(&replica, master_port);
            set.servers.push(replica);
        }
        // Replicas first: a sentinel learns the replicas from the master's first INFO.
        if let Err(why) = poll(SETTLE_TIMEOUT, || set.replication_settled(master_port)) {
            panic!(
                "sentinel set-up: replication to master {master_port} not settled within \
                 {SETTLE_TIMEOUT:?}: {why}\n{}",
                set.logs()
            );
        }
        let settings = SentinelSettings {
            master_port,
            data: set.data_access.clone(),
            own: set.sentinel_access.clone(),
            tls_conf,
        };
        for _ in 0..SENTINELS {
            set.sentinels.push(Sentinel::start(&settings));
        }
        if let Err(why) = poll(SETTLE_TIMEOUT, || set.ready(master_port)) {
            panic!(
                "sentinel set-up: not ready within {SETTLE_TIMEOUT:?}: {why}\n{}",
                set.logs()
            );
        }
        set
    }
}

impl SentinelSet {
    /// A master, `replicas` replicas and 3 sentinels (quorum 2, `down-after-milliseconds 1000`,
    /// `failover-timeout 5000`, `parallel-syncs 1`), each on a free 127.0.0.1 port in its own temp
    /// dir. Returns once `SENTINEL CKQUORUM mymaster` is OK on every sentinel, the master's
    /// `INFO replication` shows every replica online (`connected_slaves == replicas`), every
    /// replica's `master_link_status` is up, and every sentinel lists all replicas and the 2
    /// other sentinels, none of them down.
    pub fn start(replicas: usize) -> SentinelSet {
        Self::builder().replicas(replicas).start()
    }

    /// [`SentinelSet::start`] with `server_args` appended to every data server's command line
    /// (e.g. `&["--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"]`; the master gets
    /// them too, because any server may become master).
    pub fn start_with(replicas: usize, server_args: &[&str]) -> SentinelSet {
        Self::builder()
            .replicas(replicas)
            .server_args(server_args)
            .start()
    }

    /// A set with passwords, an ACL user or TLS: see [`SentinelSetBuilder`].
    pub fn builder() -> SentinelSetBuilder {
        SentinelSetBuilder::default()
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel (`rediss://` in a TLS set), by index (killed
    /// ones included), without credentials.
    pub fn sentinel_urls(&self) -> Vec<String> {
        let scheme = if self.sentinel_access.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.sentinels
            .iter()
            .map(|s| format!("{scheme}://127.0.0.1:{}/", s.port()))
            .collect()
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`: the hosts of a `redis+sentinel://` URL.
    pub fn sentinel_hosts(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The PEM of the CA that signed every certificate of a TLS set.
    pub fn ca_pem(&self) -> &str {
        self.data_access
            .tls_ca
            .as_deref()
            .unwrap_or_else(|| panic!("not a TLS set: see SentinelSetBuilder::tls"))
    }

    /// How the test logs in to the data servers ([`RedisServer::connection`] does so).
    pub fn data_access(&self) -> &Access {
        &self.data_access
    }

    /// How the test logs in to the sentinels.
    pub fn sentinel_access(&self) -> &Access {
        &self.sentinel_access
    }

    /// Every sentinel's port, by index (killed ones included).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Sentinel::port).collect()
    }

    /// The data servers; index 0 was the master at the start.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// Data server `i`'s wall clock: see [`SentinelSetBuilder::clocks`].
    pub fn clock(&self, i: usize) -> &ServerClock {
        self.clocks
            .get(i)
            .unwrap_or_else(|| panic!("server {i} has no clock of its own: build with clocks()"))
    }

    /// Data server `i`, to kill or restart it (see also [`SentinelSet::restart_server`]).
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// The index of the data server on `port`. Panics if none is.
    pub fn server_by_port(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port() == port)
            .unwrap_or_else(|| {
                let ports: Vec<u16> = self.servers.iter().map(RedisServer::port).collect();
                panic!("no data server on port {port} (servers: {ports:?})")
            })
    }

    /// The master's port as a live sentinel reports it (`SENTINEL GET-MASTER-ADDR-BY-NAME`),
    /// asking each live (not killed, not paused) sentinel in turn until one answers. Panics if
    /// none does.
    pub fn master_port(&self) -> u16 {
        let mut errors = Vec::new();
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                errors.push(format!("sentinel {i} (port {}): not live", sentinel.port()));
                continue;
            }
            match sentinel_master_port(sentinel.port(), &self.sentinel_access) {
                Ok(port) => return port,
                Err(why) => errors.push(format!("sentinel {i}: {why}")),
            }
        }
        panic!(
            "no live sentinel reported the master's address: {errors:#?}\n{}",
            self.logs()
        )
    }

    /// The index of the master [`SentinelSet::master_port`] reports.
    pub fn master_index(&self) -> usize {
        self.server_by_port(self.master_port())
    }

    /// `SENTINEL FAILOVER mymaster` on the first live sentinel (retrying `-INPROG` and
    /// `-NOGOODSLAVE` for up to 20 s), then [`SentinelSet::wait_for_switch`] (15 s). Returns the
    /// new master's port. The old master, if alive, stays a writable master until Sentinel
    /// reconfigures it (about 10 s): [`SentinelSet::wait_settled`] waits for that.
    pub fn failover(&self) -> u16 {
        let from = self.master_port();
        let accepted = poll(FAILOVER_RETRY, || {
            let (i, sentinel) = self
                .sentinels
                .iter()
                .enumerate()
                .find(|(_, s)| s.is_live())
                .ok_or_else(|| "no live sentinel".to_string())?;
            let mut con = connect(sentinel.port(), &self.sentinel_access)
                .map_err(|e| format!("sentinel {i}: {e}"))?;
            let reply: Result<String, redis::RedisError> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER_NAME)
                .query(&mut con);
            match reply {
                Ok(_) => Ok(Ok(())),
                Err(e) => {
                    let text = e.to_string();
                    if text.contains("INPROG") || text.contains("NOGOODSLAVE") {
                        Err(format!("sentinel {i}: SENTINEL FAILOVER: {text}"))
                    } else {
                        Ok(Err(format!("sentinel {i}: SENTINEL FAILOVER: {text}")))
                    }
                }
            }
        });
        match accepted {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("failover from {from} refused: {why}\n{}", self.logs()),
            Err(why) => panic!(
                "failover from {from}: no sentinel accepted SENTINEL FAILOVER within \
                 {FAILOVER_RETRY:?}: {why}\n{}",
                self.logs()
            ),
        }
        self.wait_for_switch(from, SWITCH_TIMEOUT)
    }

    /// Polls the live sentinels until one reports a master other than `from_port` and that
    /// server's `INFO replication` says `role:master`; returns its port. Panics after `timeout`.
    pub fn wait_for_switch(&self, from_port: u16, timeout: Duration) -> u16 {
        let switched = poll(timeout, || {
            let mut reasons = Vec::new();
            for (i, sentinel) in self.sentinels.iter().enumerate() {
                if !sentinel.is_live() {
                    continue;
                }
                match sentinel_master_port(sentinel.port(), &self.sentinel_access) {
                    Ok(port) if port == from_port => {
                        reasons.push(format!("sentinel {i}: still {from_port}"))
                    }
                    Ok(port) => match is_master(port, &self.data_access) {
                        Ok(true) => return Ok(port),
                        Ok(false) => reasons.push(format!(
                            "sentinel {i}: {port}, whose role is not master yet"
                        )),
                        Err(why) => reasons.push(format!("sentinel {i}: {port}: {why}")),
                    },
                    Err(why) => reasons.push(format!("sentinel {i}: {why}")),
                }
            }
            if reasons.is_empty() {
                reasons.push("no live sentinel".to_string());
            }
            Err(reasons.join("; "))
        });
        switched.unwrap_or_else(|why| {
            panic!(
                "no switch away from master {from_port} within {timeout:?}: {why}\n{}",
                self.logs()
            )
        })
    }

    /// Waits until every live sentinel reports the same master, that server says `role:master`,
    /// every other running server is its replica with `master_link_status:up`, the master's
    /// `INFO replication` lists exactly those replicas as online, and every live sentinel lists
    /// each of them as a replica that is not down. Panics after `timeout`.
    pub fn wait_settled(&self, timeout: Duration) {
        if let Err(why) = poll(timeout, || self.settled()) {
            panic!(
                "sentinel set not settled within {timeout:?}: {why}\n{}",
                self.logs()
            );
        }
    }

    /// Restarts data server `i` (same port, dir and arguments: it comes back as a master) and,
    /// if a sentinel reports another server as master, makes it that master's replica. Does not
    /// wait for the sync: use [`SentinelSet::wait_settled`].
    pub fn restart_server(&mut self, i: usize) {
        self.servers[i].restart();
        let master = self.master_port();
        if master != self.servers[i].port() {
            replica_of(&self.servers[i], master);
        }
    }

    /// SIGKILLs sentinel `i` and reaps it. Idempotent.
    pub fn kill_sentinel(&mut self, i: usize) {
        self.sentinels[i].kill();
    }

    /// SIGSTOPs sentinel `i`; the helpers skip it until [`SentinelSet::resume_sentinel`]. A
    /// sentinel stopped for more than 2 s enters TILT mode for 30 s when resumed (it sees its
    /// clock jump): it still answers queries but acts on nothing.
    pub fn pause_sentinel(&self, i: usize) {
        let sentinel = &self.sentinels[i];
        if sentinel.process.signal(libc::SIGSTOP) {
            sentinel.paused.store(true, Ordering::SeqCst);
        }
    }

    /// SIGCONT after [`SentinelSet::pause_sentinel`].
    pub fn resume_sentinel(&self, i: usize) {
        let sentinel = &self.sentinels[i];
        sentinel.process.signal(libc::SIGCONT);
        sentinel.paused.store(false, Ordering::SeqCst);
    }

    /// Log tails of every sentinel and data server, for panic messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sentinels.iter().enumerate() {
            let state = if s.is_live() {
                "live"
            } else if s.paused.load(Ordering::SeqCst) {
                "paused"
            } else {
                "dead"
            };
            out.push_str(&log_tail_of(
                &format!("sentinel {i}, port {}, {state}", s.port()),
                &s.process.dir,
            ));
        }
        for (i, s) in self.servers.iter().enumerate() {
            let state = if s.is_running() { "running" } else { "dead" };
            out.push_str(&log_tail_of(
                &format!("server {i}, port {}, {state}", s.port()),
                s.dir(),
            ));
        }
        out
    }

    /// Ports of the running data servers other than `master`.
    fn live_replica_ports(&self, master: u16) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .servers
            .iter()
            .filter(|s| s.is_running() && s.port() != master)
            .map(RedisServer::port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Every running server but `master` replicates from it with its link up, and the master
    /// sees exactly those replicas online.
    fn replication_settled(&self, master: u16) -> Result<(), String> {
        let info = replication_info(master, &self.data_access)?;
        if info.get("role").map(String::as_str) != Some("master") {
            return Err(format!("server {master} is not role:master: {info:?}"));
        }
        let replicas = self.live_replica_ports(master);
        for &port in &replicas {
            let info = replication_info(port, &self.data_access)?;
            let (role, link_to, link) = (
                info.get("role").map(String::as_str),
                info.get("master_port").and_then(|p| p.parse::<u16>().ok()),
                info.get("master_link_status").map(String::as_str),
            );
            if role != Some("slave") || link_to != Some(master) || link != Some("up") {
                return Err(format!(
                    "server {port}: role {role:?}, master_port {link_to:?}, \
                     master_link_status {link:?} (want slave of {master}, up)"
                ));
            }
        }
        let online = online_replica_ports(&info);
        let connected = info.get("connected_slaves").cloned().unwrap_or_default();
        if online != replicas || connected != replicas.len().to_string() {
            return Err(format!(
                "master {master}: connected_slaves {connected}, online replicas {online:?}, \
                 want {replicas:?}"
            ));
        }
        Ok(())
    }

    /// Every live sentinel lists each of `replicas` as a replica that is not down.
    fn sentinels_see_replicas(&self, replicas: &[u16]) -> Result<(), String> {
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                continue;
            }
            let listed = sentinel_instances(sentinel.port(), &self.sentinel_access, "REPLICAS")?;
            for &port in replicas {
                let entry = listed
                    .iter()
                    .find(|r| r.get("port").and_then(|p| p.parse::<u16>().ok()) == Some(port));
                match entry {
                    None => return Err(format!("sentinel {i} does not list replica {port} yet")),
                    Some(r) => {
                        let flags = r.get("flags").map(String::as_str).unwrap_or("");
                        if !flags.split(',').any(|f| f == "slave") || !flags_healthy(flags) {
                            return Err(format!("sentinel {i}: replica {port} has flags {flags}"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The start-up condition (see [`SentinelSet::start`]).
    fn ready(&self, master: u16) -> Result<(), String> {
        self.replication_settled(master)?;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            let mut con = connect(sentinel.port(), &self.sentinel_access)
                .map_err(|e| format!("sentinel {i}: {e}"))?;
            let quorum: String = redis::cmd("SENTINEL")
                .arg("CKQUORUM")
                .arg(MASTER_NAME)
                .query(&mut con)
                .map_err(|e| format!("sentinel {i}: CKQUORUM: {e}"))?;
            if !quorum.starts_with("OK") {
                return Err(format!("sentinel {i}: CKQUORUM: {quorum}"));
            }
            let reported = sentinel_master_port(sentinel.port(), &self.sentinel_access)?;
            if reported != master {
                return Err(format!(
                    "sentinel {i} reports master {reported}, not {master}"
                ));
            }
            let peers = sentinel_instances(sentinel.port(), &self.sentinel_access, "SENTINELS")?;
            let healthy = peers
                .iter()
                .filter(|p| flags_healthy(p.get("flags").map(String::as_str).unwrap_or("")))
                .count();
            if healthy != SENTINELS - 1 {
                return Err(format!(
                    "sentinel {i} knows {healthy} healthy other sentinels (of {} listed), want {}",
                    peers.len(),
                    SENTINELS - 1
                ));
            }
        }
        self.sentinels_see_replicas(&self.live_replica_ports(master))
    }

    /// The [`SentinelSet::wait_settled`] condition.
    fn settled(&self) -> Result<(), String> {
        let mut master = None;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_live() {
                continue;
            }
            let port = sentinel_master_port(sentinel.port(), &self.sentinel_access)?;
            match master {
                None => master = Some(port),
                Some(m) if m == port => {}
                Some(m) => {
                    return Err(format!(
                        "sentinels disagree: one reports {m}, sentinel {i} reports {port}"
                    ))
                }
            }
        }
        let master = master.ok_or_else(|| "no live sentinel".to_string())?;
        self.replication_settled(master)?;
        self.sentinels_see_replicas(&self.live_replica_ports(master))
    }
}

/// `REPLICAOF 127.0.0.1 <master_port>` on `server`.
fn replica_of(server: &RedisServer, master_port: u16) {
    let mut con = server.connection();
    let reply: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master_port)
        .query(&mut con)
        .unwrap_or_else(|e| {
            panic!(
                "REPLICAOF 127.0.0.1 {master_port} on server {}: {e}\n{}",
                server.port(),
                log_tail_of("server", server.dir())
            )
        });
    assert!(reply.starts_with("OK"), "REPLICAOF answered {reply:?}");
}

/// [`poll_until`](super::poll_until) every [`POLL`].
fn poll<T>(timeout: Duration, check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    super::poll_until(timeout, POLL, check)
}
