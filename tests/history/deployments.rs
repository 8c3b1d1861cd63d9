//! The locked-set workload of `main.rs` on every deployment (one server, Sentinel, Cluster, a
//! quorum of five) under clock faults, crashes and client faults, its history judged by the
//! checker.
//!
//! The counters live on a redis-server of their own (or in PostgreSQL) that no fault touches: a
//! holder whose lock broke still reaches its data, the case fencing is for. A holder works up to
//! three leases between its read and its write (renewal keeps its lock meanwhile, unless a fault
//! breaks it), so that a lock lost to a fault turns into a late write-back.
//!
//! The nemeses, each in turn, with two to three leases between faults:
//!
//! - `clock-jump`: the wall clocks of the lock's servers stepped forward by two leases, and back
//!   four leases later (a step back costs liveness only);
//! - `clock-back`: stepped back by two leases, and left there;
//! - `clock-fast`: running four times fast for four leases, then at the true rate again and
//!   stepped back to the true time;
//! - `clock-slow`: running at a quarter of the true rate for four leases, then at the true rate,
//!   left behind;
//! - `kill`: SIGKILL of the lock's server and a restart (one server: at once, with its AOF if it
//!   has one; Sentinel: the master, restarted as a replica once the sentinels failed it over;
//!   quorum: one master, its data wiped, restarted once the longest lease ran out; Cluster: the
//!   master of a lock key's slot, restarted once the cluster promoted its replica, when it comes
//!   back as that replica's replica);
//! - `migrate` (Cluster): a lock key's slot moved to another master while the workload runs:
//!   `CLUSTER SETSLOT IMPORTING` and `MIGRATING`, the lock key `MIGRATE`d first and the slot
//!   left split for a lease (the lock's other keys still on the source: calls on that key meet
//!   `ASK` and `TRYAGAIN`), then the rest of its keys and `SETSLOT NODE`;
//! - `pause-client-short`: a client process frozen (SIGSTOP) for one to one and a half leases
//!   right after one of its threads read its counter;
//! - `throttle-client` (root; `throttle.rs`): a client process put, right after one of its
//!   threads read its counter, in a cgroup with a CPU quota of 1 ms a second for six leases, so
//!   that its renewal thread runs late.
//!
//! The lock's servers are, for clock faults: the one server, the Sentinel master, every Cluster
//! master, and on a quorum two masters (a minority) or three (a majority).
//!
//! The documented assumptions the faults break: a server clock that jumps forward or runs fast
//! expires a lease early (docs/design.md, "Assumptions": the clocks run at about the same rate,
//! within the drift margin of 2 ms + 1 % of the lease), so another client is granted while the
//! holder, whose deadline is on its own monotonic clock, still says held; on a quorum it takes a
//! majority of such clocks. A restart without persistence forgets the lock. A client frozen or
//! starved of CPU past its lease writes late, which no lease can prevent. The fence keeps the
//! data in every case: the fenced stores must lose no update, and tokens must never go back.
//!
//! `deployment_row` runs any deployment, nemesis and store from the environment (for the table
//! in docs/reliability.md): `FENCELOCK_HISTORY_DEPLOYMENT` (`one`, `one-aof`, `one-aof-nofsync`,
//! `sentinel`, `sentinel-acks`, `cluster`, `quorum-minority`, `quorum-majority`),
//! `FENCELOCK_HISTORY_NEMESIS` (`none` or some of the names above, comma-separated),
//! `FENCELOCK_HISTORY_STORES` (some of `unfenced`, `fenced-redis`, `postgres`), with
//! `FENCELOCK_HISTORY_SECS`, `FENCELOCK_HISTORY_SEED` and `FENCELOCK_HISTORY_DIR` as in
//! `main.rs`. Without them it runs one server, no fault, every store, for a few seconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fencelock::{FencedRedis, LockClient};

use super::recorder::{monotonic_ns, Event, Recorder, Type};
use super::support::cluster::ClusterSet;
use super::support::quorum::Quorum;
use super::support::sentinel::{SentinelSet, MASTER_NAME};
use super::support::{self, database_url, ms, unique_temp_dir, RedisServer, Rng, NAMESPACE};
use super::{
    check, counter_key, hold_until_stopped, key_name, pg_connect, CounterTable, Store, Verdict,
    Worker, KEYS, LEASE_MS, PROCESSES,
};

const WORKER_ENV: &str = "FENCELOCK_DEPLOYMENT_WORKER";
/// Per store, unless `FENCELOCK_HISTORY_SECS` says otherwise.
const SHORT_SECS: u64 = 6;
/// The longest work between a read and its write, in leases.
const WORK_LEASES: u64 = 3;

// ---------------------------------------------------------------------------
// Deployments and nemeses
// ---------------------------------------------------------------------------

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deployment {
    /// One server, no persistence.
    One,
    /// One server, AOF with `appendfsync always`.
    OneAof,
    /// One server, AOF with `appendfsync no` (the kernel writes it when it likes).
    OneAofNoFsync,
    /// A master, two replicas (`min-replicas-to-write 1`), three sentinels; clients with
    /// `min_replica_acks(1)` when `acks`.
    Sentinel { acks: bool },
    /// Three masters with a replica each.
    Cluster,
    /// Five masters (AOF, fsync always); clock faults on `clocked` of them.
    Quorum { clocked: usize },
}

impl Deployment {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Deployment::One => "one",
            Deployment::OneAof => "one-aof",
            Deployment::OneAofNoFsync => "one-aof-nofsync",
            Deployment::Sentinel { acks: false } => "sentinel",
            Deployment::Sentinel { acks: true } => "sentinel-acks",
            Deployment::Cluster => "cluster",
            Deployment::Quorum { clocked: 3 } => "quorum-majority",
            Deployment::Quorum { .. } => "quorum-minority",
        }
    }

    fn parse(name: &str) -> Deployment {
        [
            Deployment::One,
            Deployment::OneAof,
            Deployment::OneAofNoFsync,
            Deployment::Sentinel { acks: false },
            Deployment::Sentinel { acks: true },
            Deployment::Cluster,
            Deployment::Quorum { clocked: 2 },
            Deployment::Quorum { clocked: 3 },
        ]
        .into_iter()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("FENCELOCK_HISTORY_DEPLOYMENT: unknown deployment {name:?}"))
    }
}

/// The faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nemesis {
    ClockJump,
    ClockBack,
    ClockFast,
    ClockSlow,
    Kill,
    PauseClientShort,
    ThrottleClient,
    Migrate,
}

const NEMESES: [Nemesis; 8] = [
    Nemesis::ClockJump,
    Nemesis::ClockBack,
    Nemesis::ClockFast,
    Nemesis::ClockSlow,
    Nemesis::Kill,
    Nemesis::PauseClientShort,
    Nemesis::ThrottleClient,
    Nemesis::Migrate,
];

impl Nemesis {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Nemesis::ClockJump => "clock-jump",
            Nemesis::ClockBack => "clock-back",
            Nemesis::ClockFast => "clock-fast",
            Nemesis::ClockSlow => "clock-slow",
            Nemesis::Kill => "kill",
            Nemesis::PauseClientShort => "pause-client-short",
            Nemesis::ThrottleClient => "throttle-client",
            Nemesis::Migrate => "migrate",
        }
    }

    fn parse_list(spec: &str) -> Vec<Nemesis> {
        if spec == "none" {
            return Vec::new();
        }
        spec.split(',')
            .map(|f| {
                NEMESES
                    .into_iter()
                    .find(|n| n.name() == f.trim())
                    .unwrap_or_else(|| panic!("FENCELOCK_HISTORY_NEMESIS: unknown fault {f:?}"))
            })
            .collect()
    }
}

/// A running deployment and the counters' server.
enum Running {
    One(RedisServer, support::clock::ServerClock),
    Sentinel(SentinelSet),
    Cluster(ClusterSet),
    Quorum(Quorum),
}

impl Running {
    fn start(deployment: Deployment) -> Running {
        let one = |args: &[&str]| {
            let clock = support::clock::ServerClock::new();
            let server = RedisServer::start_as(&support::ServerOptions {
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                env: clock.env(),
                ..support::ServerOptions::default()
            });
            Running::One(server, clock)
        };
        match deployment {
            Deployment::One => one(&[]),
            Deployment::OneAof => one(&["--appendonly", "yes", "--appendfsync", "always"]),
            Deployment::OneAofNoFsync => one(&["--appendonly", "yes", "--appendfsync", "no"]),
            Deployment::Sentinel { .. } => Running::Sentinel(
                SentinelSet::builder()
                    .replicas(2)
                    .server_args(&[
                        "--min-replicas-to-write",
                        "1",
                        "--min-replicas-max-lag",
                        "1",
                        "--appendonly",
                        "yes",
                    ])
                    .clocks()
                    .start(),
            ),
            Deployment::Cluster => Running::Cluster(ClusterSet::start_with_clocks(3, 1, &[])),
            Deployment::Quorum { .. } => {
                let quorum = Quorum::start_with_clocks(5);
                quorum.note_lease(ms(LEASE_MS));
                Running::Quorum(quorum)
            }
        }
    }

    /// The URL the clients are given.
    fn url(&self) -> String {
        match self {
            Running::One(server, _) => server.url(),
            Running::Sentinel(set) => {
                format!("redis+sentinel://{}/{MASTER_NAME}", set.sentinel_hosts())
            }
            Running::Cluster(set) => {
                let hosts: Vec<String> = set
                    .node_ports()
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect();
                format!("redis+cluster://{}", hosts.join(","))
            }
            Running::Quorum(quorum) => quorum.url(),
        }
    }

    /// The clocks a clock fault moves: see the module doc.
    fn clocks(&self, deployment: Deployment) -> Vec<&support::clock::ServerClock> {
        match (self, deployment) {
            (Running::One(_, clock), _) => vec![clock],
            (Running::Sentinel(set), _) => vec![set.clock(set.master_index())],
            (Running::Cluster(set), _) => set
                .master_ports()
                .into_iter()
                .map(|p| set.clock(set.index_of_port(p)))
                .collect(),
            (Running::Quorum(quorum), Deployment::Quorum { clocked }) => {
                (0..clocked).map(|i| quorum.clock(i)).collect()
            }
            (Running::Quorum(_), _) => unreachable!("a quorum is started for a quorum"),
        }
    }

    /// SIGKILL of the lock's server and its restart: see the module doc. `round` picks the
    /// quorum's master.
    fn kill_and_restart(&mut self, round: usize) -> String {
        match self {
            Running::One(server, _) => {
                server.kill();
                server.restart();
                "the server".to_owned()
            }
            Running::Sentinel(set) => {
                let settle = Duration::from_secs(60);
                let (i, port) = (set.master_index(), set.master_port());
                set.server_mut(i).kill();
                set.wait_for_switch(port, settle);
                set.restart_server(i);
                set.wait_settled(settle);
                format!("the master (server {i})")
            }
            Running::Cluster(set) => {
                let settle = Duration::from_secs(60);
                let key = key_name(round % KEYS);
                let slot = ClusterSet::slot_of(&format!("{{{key}}}"));
                let master = set.master_of_slot(slot);
                let replica = set.replica_of(master);
                let i = set.index_of_port(master);
                set.kill(i);
                // The cluster's own failover: the replica is promoted once the masters agree
                // the killed one failed (about twice the node timeout).
                let promoted = set.wait_for_owner_change(slot, master, settle);
                assert_eq!(
                    promoted,
                    replica,
                    "slot {slot} went to {promoted}, not to {master}'s replica\n{}",
                    set.logs()
                );
                set.restart(i);
                set.wait_ok(settle);
                // Asked of the restarted node itself: it follows the promoted replica.
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut set.connection(i))
                    .expect("INFO replication of the restarted node");
                assert!(
                    info.contains("role:slave")
                        && info.contains(&format!("master_port:{promoted}")),
                    "the restarted node {master} is not {promoted}'s replica:\n{info}"
                );
                format!(
                    "master {master} (slot {slot} of {key}); replica {promoted} promoted, \
                     {master} back as its replica"
                )
            }
            Running::Quorum(quorum) => {
                let i = round % quorum.len();
                quorum.kill_and_wipe(i);
                quorum.restart(i);
                format!("master {i}, wiped")
            }
        }
    }
}

impl Running {
    /// The `migrate` nemesis (module doc): the slot of key `round % KEYS` to the next master.
    /// Returns what moved, asked of the servers: the slot's owner after, and the keys of the
    /// slot on the source before and on the target after.
    fn migrate(&self, round: usize) -> String {
        let Running::Cluster(set) = self else {
            panic!("migrate is a Cluster nemesis");
        };
        let key = key_name(round % KEYS);
        let slot = ClusterSet::slot_of(&format!("{{{key}}}"));
        let source = set.master_of_slot(slot);
        let masters = set.master_ports();
        let at = masters.iter().position(|&p| p == source).expect("a master");
        let target = masters[(at + 1) % masters.len()];
        let count = |port: u16| -> i64 {
            redis::cmd("CLUSTER")
                .arg("COUNTKEYSINSLOT")
                .arg(slot)
                .query(&mut set.connection(set.index_of_port(port)))
                .expect("CLUSTER COUNTKEYSINSLOT")
        };
        let before = count(source);
        set.begin_migration(slot, target);
        // The lock key first, alone, for a lease: a holder's renewal follows it by ASK, and an
        // acquire, whose other keys are still on the source, meets TRYAGAIN.
        set.migrate_key(slot, &support::lock_key(&key));
        thread::sleep(ms(LEASE_MS));
        set.migrate_rest(slot);
        set.finish_migration(slot);
        let owner = set.master_of_slot(slot);
        assert_eq!(owner, target, "slot {slot} is on {owner}, not {target}");
        let after = count(target);
        format!("slot {slot} of {key} from {source} ({before} keys) to {target} ({after} keys)")
    }
}

// ---------------------------------------------------------------------------
// A run
// ---------------------------------------------------------------------------

/// What a run of the workload gave.
pub(crate) struct Run {
    pub(crate) verdict: Verdict,
    /// Faults injected (the nemesis's ok operations).
    pub(crate) faults: u64,
    dir: Option<PathBuf>,
}

impl Drop for Run {
    /// Removes a temporary history, unless the test failed: then it stays for a look.
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            if thread::panicking() {
                eprintln!("the history stays in {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn env_secs(default: u64) -> u64 {
    std::env::var("FENCELOCK_HISTORY_SECS").map_or(default, |s| {
        s.parse().expect("FENCELOCK_HISTORY_SECS: whole seconds")
    })
}

fn env_seed() -> u64 {
    std::env::var("FENCELOCK_HISTORY_SEED").map_or_else(
        |_| monotonic_ns() | 1,
        |s| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hexadecimal seed"),
    )
}

/// Runs the locked set on `deployment` through `store` for `secs` (more, up to twice, until
/// `min_faults` were injected), with `nemeses` in turn; then the checker.
pub(crate) fn run(
    deployment: Deployment,
    store: Store,
    nemeses: &[Nemesis],
    secs: u64,
    min_faults: u64,
) -> Run {
    let seed = env_seed();
    let duration = Duration::from_secs(secs);
    let names: Vec<&str> = nemeses.iter().map(|n| n.name()).collect();
    let nemesis_name = if names.is_empty() {
        "none".to_owned()
    } else {
        names.join("+")
    };
    let keep = std::env::var("FENCELOCK_HISTORY_DIR")
        .ok()
        .map(PathBuf::from);
    let dir = match &keep {
        Some(base) => {
            let dir = base.join(format!(
                "{}-{nemesis_name}-{}-{seed:x}",
                deployment.name(),
                store.name()
            ));
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            dir
        }
        None => unique_temp_dir(&format!("fencelock-history-{}", deployment.name())),
    };
    println!(
        "locked set on {} through {}: {secs} s, seed {seed:x}, nemesis {nemesis_name}, history in {}",
        deployment.name(),
        store.name(),
        dir.display()
    );

    let mut running = Running::start(deployment);
    let data = RedisServer::start();
    let mut db = (store == Store::Postgres).then(pg_connect);
    let table = db.as_mut().map(CounterTable::create);
    let parent = Recorder::create(&dir.join("test.jsonl"));
    let read_counters = |db: &mut Option<postgres::Client>| {
        let fenced = FencedRedis::builder(data.url().as_str())
            .namespace(NAMESPACE)
            .build()
            .expect("a store");
        let mut con = data.connection();
        for k in 0..KEYS {
            let key = key_name(k);
            parent.invoke("test", "read", &key);
            let value: i64 = match store {
                Store::Unfenced => redis::cmd("GET")
                    .arg(counter_key(&key))
                    .query::<Option<i64>>(&mut con)
                    .expect("GET counter")
                    .unwrap_or(0),
                Store::FencedRedis => fenced.get_i64(&key).expect("get counter").unwrap_or(0),
                Store::Postgres => db
                    .as_mut()
                    .expect("a database connection")
                    .query_one(
                        &format!(
                            "SELECT value FROM {} WHERE id = $1",
                            table.as_ref().expect("a table").name
                        ),
                        &[&key],
                    )
                    .expect("SELECT counter")
                    .get(0),
            };
            parent.record(&Event::new("test", Type::Ok, "read", Some(&key)).value(value));
        }
    };
    read_counters(&mut db);

    let acks = matches!(deployment, Deployment::Sentinel { acks: true });
    let env: Vec<(&str, String)> = vec![
        (WORKER_ENV, "1".to_owned()),
        ("REDIS_URL", running.url()),
        ("FENCELOCK_HISTORY_STORE_URL", data.url()),
        ("FENCELOCK_HISTORY_STORE", store.name().to_owned()),
        ("FENCELOCK_HISTORY_FILE_DIR", dir.display().to_string()),
        ("FENCELOCK_HISTORY_SEED", format!("{seed:x}")),
        ("FENCELOCK_HISTORY_LIMIT", (secs * 2 + 120).to_string()),
        (
            "FENCELOCK_HISTORY_WORK_MS",
            (LEASE_MS * WORK_LEASES).to_string(),
        ),
        ("FENCELOCK_DEPLOYMENT_ACKS", acks.to_string()),
        ("DATABASE_URL", database_url()),
        (
            "FENCELOCK_HISTORY_TABLE",
            table.as_ref().map_or_else(String::new, |t| t.name.clone()),
        ),
    ];
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|i| {
            let mut env = env.clone();
            env.push(("FENCELOCK_DEPLOYMENT_INDEX", i.to_string()));
            Worker::spawn_as_test(
                "deployments::deployment_worker",
                &env,
                std::process::Command::new(&exe),
            )
        })
        .collect();

    let mut rng = Rng(seed);
    let lease = ms(LEASE_MS);
    let started = Instant::now();
    let mut faults = 0;
    let mut n = 0;
    while started.elapsed() < duration
        || (!nemeses.is_empty() && faults < min_faults && started.elapsed() < duration * 2)
    {
        thread::sleep(lease * 2 + ms(rng.below(LEASE_MS)));
        if nemeses.is_empty() {
            continue;
        }
        let nemesis = nemeses[n % nemeses.len()];
        n += 1;
        let injected = inject(
            nemesis,
            deployment,
            &mut running,
            &mut workers,
            &parent,
            &mut rng,
            n,
        );
        faults += u64::from(injected);
    }

    for (i, worker) in workers.iter_mut().enumerate() {
        worker.signal(libc::SIGCONT);
        if let Err(e) = worker.finish(Duration::from_secs(60)) {
            panic!("worker {i}: {e}");
        }
    }
    read_counters(&mut db);
    drop(workers);
    drop(table);
    drop(running);

    let verdict = check(&dir);
    println!("{}", verdict.output);
    println!(
        "row: {} | {nemesis_name} | {} | ops {} | grants {} | faults {} | unknown {} | mutex {} | \
         tokens {} | lost {}",
        deployment.name(),
        store.name(),
        verdict.count("ops"),
        verdict.count("grants"),
        verdict.count("faults"),
        verdict.count("unknown"),
        verdict.count("mutex_violations"),
        verdict.count("token_regressions"),
        verdict.count("lost_updates"),
    );
    Run {
        verdict,
        faults,
        dir: keep.is_none().then_some(dir),
    }
}

/// Injects one fault, recorded in `parent`; whether one was made.
fn inject(
    nemesis: Nemesis,
    deployment: Deployment,
    running: &mut Running,
    workers: &mut [Worker],
    parent: &Recorder,
    rng: &mut Rng,
    round: usize,
) -> bool {
    let lease = ms(LEASE_MS);
    let begin = |f: &'static str, value: u64, target: &str| {
        parent.record(
            &Event::new("nemesis", Type::Invoke, f, None)
                .value(value as i64)
                .target(target),
        );
    };
    let end = |f: &'static str| parent.record(&Event::new("nemesis", Type::Ok, f, None));
    match nemesis {
        Nemesis::ClockJump | Nemesis::ClockBack => {
            let step = lease * 2;
            let clocks = running.clocks(deployment);
            let what = format!(
                "{} clock(s) {} by {} ms",
                clocks.len(),
                if nemesis == Nemesis::ClockJump {
                    "forward"
                } else {
                    "back"
                },
                step.as_millis()
            );
            begin("clock-step", step.as_millis() as u64, &what);
            for clock in &clocks {
                if nemesis == Nemesis::ClockJump {
                    clock.forward(step);
                } else {
                    clock.back(step);
                }
            }
            if nemesis == Nemesis::ClockJump {
                thread::sleep(lease * 4);
                for clock in &clocks {
                    clock.back(step);
                }
            }
            end("clock-step");
            true
        }
        Nemesis::ClockFast | Nemesis::ClockSlow => {
            let rate = if nemesis == Nemesis::ClockFast {
                4.0
            } else {
                0.25
            };
            let clocks = running.clocks(deployment);
            begin(
                "clock-skew",
                (lease * 4).as_millis() as u64,
                &format!("{} clock(s) at {rate}x for 4 leases", clocks.len()),
            );
            // From the true time on: a slow clock left behind by an earlier round is not
            // stepped forward (that would be a jump).
            for clock in &clocks {
                clock.set_rate(rate);
            }
            thread::sleep(lease * 4);
            for clock in &clocks {
                clock.set_rate(1.0);
                if nemesis == Nemesis::ClockFast {
                    // Back to where it was: a step back, which costs liveness only.
                    let ahead = clock.ahead_ns();
                    if ahead > 0 {
                        clock.back(Duration::from_nanos(ahead as u64));
                    }
                }
            }
            end("clock-skew");
            true
        }
        Nemesis::Kill => {
            begin("kill", 0, "the lock's server");
            let what = running.kill_and_restart(round);
            parent.record(
                &Event::new("nemesis", Type::Ok, "kill", None).target(&format!("killed {what}")),
            );
            true
        }
        Nemesis::Migrate => {
            begin("migrate", 0, "a lock key's slot");
            let what = running.migrate(round);
            parent.record(&Event::new("nemesis", Type::Ok, "migrate", None).target(&what));
            true
        }
        Nemesis::PauseClientShort => {
            let target = rng.below(PROCESSES as u64) as usize;
            let worker = &mut workers[target];
            if !worker.await_read(lease * 4) {
                return false;
            }
            let pause = lease + ms(rng.below(LEASE_MS / 2 + 1));
            begin(
                "pause-client",
                pause.as_millis() as u64,
                &format!("worker {target}"),
            );
            worker.signal(libc::SIGSTOP);
            thread::sleep(pause);
            worker.signal(libc::SIGCONT);
            end("pause-client");
            true
        }
        Nemesis::ThrottleClient => {
            let target = rng.below(PROCESSES as u64) as usize;
            let worker = &mut workers[target];
            if !worker.await_read(lease * 4) {
                return false;
            }
            // 1 ms of CPU a second: once the process used it, none of its threads runs for the
            // rest of the second, three leases and more.
            let throttle = super::support::cgroup::CpuThrottle::new(1, 1000);
            begin(
                "throttle-client",
                (lease * 6).as_millis() as u64,
                &format!("worker {target}: 1 ms of CPU a second, for 6 leases"),
            );
            throttle.add(worker.child.id());
            thread::sleep(lease * 6);
            let held_back = throttle.throttled();
            drop(throttle);
            parent.record(
                &Event::new("nemesis", Type::Ok, "throttle-client", None)
                    .target(&format!("held back {held_back} times")),
            );
            true
        }
    }
}

// ---------------------------------------------------------------------------
// The worker process
// ---------------------------------------------------------------------------

/// The body of a worker process (a no-op in an ordinary test run): the holders of `main.rs` on a
/// client of any deployment, with `min_replica_acks(1)` when asked.
#[test]
fn deployment_worker() {
    if std::env::var(WORKER_ENV).is_err() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    let store = Store::parse(&var("FENCELOCK_HISTORY_STORE"));
    let url = var("REDIS_URL");
    let store_url = var("FENCELOCK_HISTORY_STORE_URL");
    let seed = u64::from_str_radix(&var("FENCELOCK_HISTORY_SEED"), 16).expect("a hex seed");
    let limit = Duration::from_secs(var("FENCELOCK_HISTORY_LIMIT").parse().expect("seconds"));
    let dir = PathBuf::from(var("FENCELOCK_HISTORY_FILE_DIR"));
    let table = var("FENCELOCK_HISTORY_TABLE");
    let index: u64 = var("FENCELOCK_DEPLOYMENT_INDEX").parse().expect("an index");
    let work: u64 = var("FENCELOCK_HISTORY_WORK_MS").parse().expect("ms");
    let acks: bool = var("FENCELOCK_DEPLOYMENT_ACKS").parse().expect("a bool");

    let recorder = Arc::new(Recorder::create(&dir.join(format!("client-{index}.jsonl"))));
    let mut builder = LockClient::builder(url.as_str())
        .namespace(NAMESPACE)
        .lease(ms(LEASE_MS))
        .response_timeout(ms(LEASE_MS))
        .connection_timeout(ms(LEASE_MS));
    if acks {
        builder = builder.min_replica_acks(1, ms(LEASE_MS / 4));
    }
    let client = builder.build().expect("a client");
    hold_until_stopped(
        client, recorder, store, &store_url, work, table, index, seed, limit,
    );
}

// ---------------------------------------------------------------------------
// What every run must show
// ---------------------------------------------------------------------------

pub(crate) fn assert_busy(run: &Run) {
    let v = &run.verdict;
    assert!(v.count("grants") >= 10, "too few grants:\n{}", v.output);
    assert!(
        v.count("increments") >= 5,
        "too few increments:\n{}",
        v.output
    );
}

/// The nemesis bit: without a fence, updates were lost. Tokens never go back.
pub(crate) fn assert_bites(run: &Run) {
    let v = &run.verdict;
    assert_busy(run);
    assert!(run.faults >= 1, "no fault was injected:\n{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
    assert!(
        v.count("lost_updates") >= 1,
        "no update lost without a fence under {} faults: the nemesis did not bite\n{}",
        run.faults,
        v.output
    );
}

/// The fence kept the data: no update lost, no token went back (the lock itself may have
/// broken: mutual exclusion is what the fault's assumption was for).
pub(crate) fn assert_fence_holds(run: &Run) {
    let v = &run.verdict;
    assert_busy(run);
    assert!(run.faults >= 1, "no fault was injected:\n{}", v.output);
    assert_eq!(v.count("lost_updates"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}

/// Nothing broke at all: the deployment's guarantee held under the faults.
pub(crate) fn assert_clean(run: &Run) {
    assert_busy(run);
    assert!(
        run.faults >= 1,
        "no fault was injected:\n{}",
        run.verdict.output
    );
    assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
}

// ---------------------------------------------------------------------------
// The short runs (CI)
// ---------------------------------------------------------------------------

const CLOCK_BREAKS: [Nemesis; 2] = [Nemesis::ClockJump, Nemesis::ClockFast];
const ALL_CLOCK: [Nemesis; 4] = [
    Nemesis::ClockJump,
    Nemesis::ClockBack,
    Nemesis::ClockFast,
    Nemesis::ClockSlow,
];

#[test]
fn clock_skew_on_one_server_without_a_fence_loses_updates() {
    let run = run(
        Deployment::One,
        Store::Unfenced,
        &[Nemesis::ClockFast],
        env_secs(SHORT_SECS),
        3,
    );
    assert_bites(&run);
}

#[test]
fn clock_faults_on_one_server_through_fenced_redis_lose_nothing() {
    let run = run(
        Deployment::One,
        Store::FencedRedis,
        &ALL_CLOCK,
        env_secs(SHORT_SECS),
        4,
    );
    assert_fence_holds(&run);
}

#[test]
fn clock_faults_on_sentinel_without_a_fence_lose_updates() {
    let run = run(
        Deployment::Sentinel { acks: false },
        Store::Unfenced,
        &CLOCK_BREAKS,
        env_secs(SHORT_SECS),
        3,
    );
    assert_bites(&run);
}

#[test]
fn clock_faults_on_sentinel_through_fenced_redis_lose_nothing() {
    let run = run(
        Deployment::Sentinel { acks: true },
        Store::FencedRedis,
        &ALL_CLOCK,
        env_secs(SHORT_SECS),
        4,
    );
    assert_fence_holds(&run);
}

#[test]
fn clock_faults_on_cluster_without_a_fence_lose_updates() {
    let run = run(
        Deployment::Cluster,
        Store::Unfenced,
        &CLOCK_BREAKS,
        env_secs(SHORT_SECS),
        3,
    );
    assert_bites(&run);
}

#[test]
fn clock_faults_on_cluster_through_fenced_redis_lose_nothing() {
    let run = run(
        Deployment::Cluster,
        Store::FencedRedis,
        &ALL_CLOCK,
        env_secs(SHORT_SECS),
        4,
    );
    assert_fence_holds(&run);
}

#[test]
fn clock_faults_on_a_quorum_majority_without_a_fence_lose_updates() {
    let run = run(
        Deployment::Quorum { clocked: 3 },
        Store::Unfenced,
        &CLOCK_BREAKS,
        env_secs(SHORT_SECS),
        3,
    );
    assert_bites(&run);
}

/// Two of five masters' clocks jump and run fast. A quorum does not make the lock tolerate
/// that: a holder granted by a bare majority (three masters, the others busy with another
/// client's attempt) that includes those two holds, once their clocks expired its keys, on one
/// master only, and another client can take the other four. The fence keeps the data.
#[test]
fn clock_faults_on_a_quorum_minority_can_break_exclusion_the_fence_keeps_the_data() {
    let run = run(
        Deployment::Quorum { clocked: 2 },
        Store::FencedRedis,
        &CLOCK_BREAKS,
        env_secs(SHORT_SECS),
        3,
    );
    assert_fence_holds(&run);
}

/// Clocks stepped back or running slow on a majority of the masters: leases last longer by the
/// servers' clocks, which costs liveness only. The lock never overlaps and tokens rise, even with
/// the unfenced store (whose losses, if a loaded machine delays a renewal past its lease, are
/// counted, not asserted: they say nothing about the clocks).
#[test]
fn slow_and_backward_clocks_on_a_quorum_majority_break_nothing() {
    let run = run(
        Deployment::Quorum { clocked: 3 },
        Store::Unfenced,
        &[Nemesis::ClockBack, Nemesis::ClockSlow],
        env_secs(SHORT_SECS),
        3,
    );
    assert_busy(&run);
    assert!(run.faults >= 1, "no fault:\n{}", run.verdict.output);
    let v = &run.verdict;
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}

#[test]
fn kill_without_persistence_on_one_server_without_a_fence_loses_updates() {
    let run = run(
        Deployment::One,
        Store::Unfenced,
        &[Nemesis::Kill],
        env_secs(SHORT_SECS),
        3,
    );
    assert_bites(&run);
}

#[test]
fn kill_on_one_server_through_fenced_redis_loses_nothing() {
    let run = run(
        Deployment::One,
        Store::FencedRedis,
        &[Nemesis::Kill],
        env_secs(SHORT_SECS),
        3,
    );
    assert_fence_holds(&run);
}

/// With AOF and fsync always, a killed server comes back with its locks: no overlap.
#[test]
fn kill_with_aof_on_one_server_keeps_every_lock() {
    let run = run(
        Deployment::OneAof,
        Store::FencedRedis,
        &[Nemesis::Kill],
        env_secs(SHORT_SECS),
        3,
    );
    assert_clean(&run);
}

/// A quorum master killed, wiped and restarted after the longest lease: nothing breaks.
#[test]
fn quorum_master_wipes_break_nothing() {
    let run = run(
        Deployment::Quorum { clocked: 2 },
        Store::FencedRedis,
        &[Nemesis::Kill],
        env_secs(SHORT_SECS),
        2,
    );
    assert_clean(&run);
}

/// The master of a lock key's slot killed (SIGKILL), its replica promoted by the cluster, the
/// killed node restarted as that replica's replica (the nemesis asserts both from the servers).
/// What docs/design.md promises on Cluster: tokens keep rising across the failover (the fence
/// counter is replicated, and the clock floor lifts one that was not), and the fence keeps the
/// data. The lock's record holds too: no node that lost the keys grants meanwhile (the killed
/// one is gone, and a restarted master says `CLUSTERDOWN` for its first 2 s, by which time it
/// knows it was replaced), and the failover takes about twice the node timeout, many leases,
/// so every holder on that master was told of its loss before the replica grants. So the
/// whole history must come out clean.
#[test]
fn kill_of_a_cluster_master_breaks_nothing() {
    let run = run(
        Deployment::Cluster,
        Store::FencedRedis,
        &[Nemesis::Kill],
        env_secs(2),
        1,
    );
    assert_clean(&run);
}

/// A lock key's slot migrated to another master while the workload runs, the lock key first and
/// alone for a lease (the nemesis asserts from the servers that the slot moved). `MIGRATE`
/// carries a key with its remaining time to live and a script never runs with its keys split
/// between two nodes (`TRYAGAIN`, or `ASK` to where they all are), so a migration costs a few
/// retries and nothing else: the fence keeps the data, tokens keep rising (the fence counter
/// moves with its value), and the lock never overlaps. The whole history must come out clean.
#[test]
fn slot_migrations_on_cluster_break_nothing() {
    let run = run(
        Deployment::Cluster,
        Store::FencedRedis,
        &[Nemesis::Migrate],
        env_secs(3),
        2,
    );
    assert_clean(&run);
}

/// The fence keeps the data, and the lock's record holds: a process frozen between Redis' grant
/// and its reading of the reply gives back a grant whose lease ran out (`faults::late_grant`).
#[test]
fn short_client_pauses_through_fenced_redis_lose_nothing() {
    let run = run(
        Deployment::One,
        Store::FencedRedis,
        &[Nemesis::PauseClientShort],
        env_secs(SHORT_SECS),
        3,
    );
    assert_busy(&run);
    assert!(run.faults >= 1, "no pause:\n{}", run.verdict.output);
    let v = &run.verdict;
    assert_eq!(v.count("lost_updates"), 0, "{}", v.output);
    // A grant heard of after its lease ran out is given back, never returned: the lock's own
    // record holds too.
    assert_eq!(v.count("mutex_violations"), 0, "{}", v.output);
    assert_eq!(v.count("token_regressions"), 0, "{}", v.output);
}

/// Any deployment, nemesis and stores, from the environment (see the module doc): one row of
/// the table in docs/reliability.md per store. Without the variables: one server, no fault,
/// every store, which must all come out clean.
#[test]
fn deployment_row() {
    let deployment = std::env::var("FENCELOCK_HISTORY_DEPLOYMENT")
        .map_or(Deployment::One, |d| Deployment::parse(&d));
    let nemeses = std::env::var("FENCELOCK_HISTORY_NEMESIS")
        .map_or_else(|_| Vec::new(), |n| Nemesis::parse_list(&n));
    let stores: Vec<Store> = std::env::var("FENCELOCK_HISTORY_STORES").map_or_else(
        |_| vec![Store::Unfenced, Store::FencedRedis, Store::Postgres],
        |s| s.split(',').map(|s| Store::parse(s.trim())).collect(),
    );
    let secs = env_secs(3);
    // Every store runs before anything is asserted: a row is three runs.
    let runs: Vec<(Store, Run)> = stores
        .into_iter()
        .map(|store| (store, run(deployment, store, &nemeses, secs, 0)))
        .collect();
    for (store, run) in &runs {
        assert_busy(run);
        if nemeses.is_empty() {
            assert_eq!(run.verdict.code, 0, "{}", run.verdict.output);
        } else if *store != Store::Unfenced {
            assert_eq!(
                run.verdict.count("lost_updates"),
                0,
                "{}",
                run.verdict.output
            );
        }
    }
}
