//! `fencelock`: run a command under a distributed lock (or a permit of a semaphore), look at a
//! lock, break one; run a command while leading an election, ask who leads.
//!
//! Built with the `cli` feature (`cargo install fencelock --features cli`), so that library
//! users never build its dependencies. `docs/cli.md` is the user's guide; `fencelock --help`
//! lists the exit statuses.

#![deny(unsafe_op_in_unsafe_fn)]

mod elect;
mod format;
mod run;
mod signals;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock::{FencingToken, LockClient, LockStatus};

use crate::format::{human, json_string, parse_duration, parse_timeout};

const AFTER_HELP: &str = "\
Redis URLs (--url):
  redis://[user:password@]host[:port][/db]         one server, e.g. redis://10.0.0.1:6379/0
  redis+unix:///path[?db=N]                        one server over a Unix socket, e.g.
                                                   redis+unix:///run/redis/redis.sock
  redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]
                                                   the master a group of sentinels names, e.g.
                                                   redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/mymaster
  redis+cluster://[[user]:password@]host[:port][,host[:port]...]
                                                   a Redis Cluster, from some of its nodes, e.g.
                                                   redis+cluster://10.0.0.1:30001,10.0.0.2:30002
  redis+quorum://[[user]:password@]host[:port],host[:port],host[:port][...][/db]
                                                   a quorum of independent masters, e.g.
                                                   redis+quorum://redis-1,redis-2,redis-3
  rediss://, rediss+sentinel://, rediss+cluster://, rediss+quorum://  the same over TLS

Exit statuses:
  0       success (run, elect: CMD exited with 0; leader: somebody leads)
  1       fencelock failed: Redis unreachable, not answering in time (run, elect --timeout:
          within DUR plus the connection timeout), refused the connection or replied with an
          error
  2       bad command line: an unknown option, a bad duration, a key, election name,
          namespace, URL, lease or value that fencelock refuses; run --permits N: the
          semaphore is in use with another count
  3       leader: nobody leads the election
  75      run: Redis said the lock is held (--permits: all permits are held), and it was not
          granted within --timeout;
          elect: another candidate led, and this one did not come to lead within --timeout
          (EX_TEMPFAIL)
  76      run: the lock (permit) was lost while CMD ran; elect: the leadership was lost while CMD ran;
          CMD was sent SIGTERM (SIGKILL after --grace)
  126     run, elect: CMD could not be executed
  127     run, elect: CMD was not found
  128+N   run, elect: CMD was killed by signal N, or fencelock got signal N while waiting
  other   run, elect: CMD's own exit status";

/// Run a command under a distributed lock on Redis, look at a lock, or break one; run a command
/// while leading an election, or ask who leads.
#[derive(Debug, Parser)]
#[command(name = "fencelock", version, after_long_help = AFTER_HELP)]
struct Cli {
    /// The Redis server, or servers: redis://, redis+unix://, redis+sentinel://,
    /// redis+cluster:// or redis+quorum:// (rediss... over TLS); "Redis URLs" in --help shows
    /// each form
    #[arg(
        long,
        global = true,
        display_order = 100,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/"
    )]
    url: String,

    /// Prefix of the lock keys in Redis; clients contend only within one namespace [default:
    /// fencelock]
    #[arg(long, global = true, display_order = 101, env = "FENCELOCK_NAMESPACE")]
    namespace: Option<String>,

    /// How long connecting to Redis may take (TCP, TLS, password, database), and waiting for a
    /// pooled connection
    #[arg(
        long,
        global = true,
        display_order = 102,
        value_name = "DUR",
        value_parser = parse_timeout,
        env = "FENCELOCK_CONNECT_TIMEOUT",
        default_value = "1s"
    )]
    connect_timeout: Duration,

    /// How long to wait for each reply from Redis
    #[arg(
        long,
        global = true,
        display_order = 103,
        value_name = "DUR",
        value_parser = parse_timeout,
        env = "FENCELOCK_RESPONSE_TIMEOUT",
        default_value = "5s"
    )]
    response_timeout: Duration,

    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run CMD while holding the lock on KEY, and release it when CMD exits.
    ///
    /// CMD gets FENCELOCK_TOKEN (the grant's fencing token) and FENCELOCK_KEY in its
    /// environment; pass the token to storage that checks it. fencelock exits with CMD's
    /// status. SIGINT, SIGTERM and SIGHUP sent to fencelock are passed on to CMD (a terminal's
    /// Ctrl-C reaches CMD directly and is not sent twice). If the lock is lost while CMD runs,
    /// CMD gets SIGTERM, then SIGKILL after --grace, and fencelock exits with 76.
    ///
    /// With --permits N, KEY names a counting semaphore and fencelock takes one of its N permits
    /// instead of the lock: at most N runs of KEY hold one at once. FENCELOCK_TOKEN is then the
    /// permit's token, and a lost permit is handled as a lost lock.
    #[command(
        override_usage = "fencelock [OPTIONS] run [--lease DUR] [--timeout DUR] [--grace DUR] [--permits N] KEY -- CMD [ARGS]..."
    )]
    Run(RunArgs),
    /// Show whether KEY is held, the holder's fencing token, its remaining lease and how many
    /// clients wait.
    #[command(override_usage = "fencelock [OPTIONS] status [--json] KEY")]
    Status {
        /// Print one JSON object instead of text
        #[arg(long)]
        json: bool,
        /// The lock's key
        key: String,
    },
    /// Release the lock on KEY whoever holds it (only with --force).
    ///
    /// This breaks mutual exclusion: the holder keeps running until its next renewal (within a
    /// third of its lease) tells it the lock is gone, and meanwhile the next waiter, which gets
    /// the lock at once, runs too. Fencing tokens keep the old holder's late writes out of
    /// storage that checks them; without such storage, force a lock only once its holder is dead
    /// or stopped.
    #[command(override_usage = "fencelock [OPTIONS] release --force KEY")]
    Release {
        /// Required: releasing a lock someone else holds breaks mutual exclusion
        #[arg(long, required = true)]
        force: bool,
        /// The lock's key
        key: String,
    },
    /// Campaign in the election NAME, run CMD while leading it, and resign when CMD exits.
    ///
    /// Candidates lead in the order they came. CMD gets FENCELOCK_EPOCH (the leadership's epoch,
    /// a fencing token higher than every earlier leader's) and FENCELOCK_ELECTION in its
    /// environment. fencelock exits with CMD's status. Signals are passed on as by `run`. If
    /// the leadership is lost while CMD runs, CMD gets SIGTERM, then SIGKILL after --grace, and
    /// fencelock exits with 76.
    #[command(
        override_usage = "fencelock [OPTIONS] elect [--value VALUE] [--lease DUR] [--timeout DUR] [--grace DUR] NAME -- CMD [ARGS]..."
    )]
    Elect(ElectArgs),
    /// Show who leads the election NAME (its value) and the leadership's epoch; exit 3 if
    /// nobody leads.
    ///
    /// With --watch, print a line at every change, the current leader first, until SIGINT,
    /// SIGTERM or SIGHUP (exit 0).
    #[command(override_usage = "fencelock [OPTIONS] leader [--json] [--watch] NAME")]
    Leader {
        /// Print one JSON object (with --watch, one per line) instead of text
        #[arg(long)]
        json: bool,
        /// Print every change of leader or of its value as it happens, until interrupted
        #[arg(long)]
        watch: bool,
        /// The election's name
        name: String,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// How long a grant lives in Redis without renewal; renewed about every third of it while
    /// CMD runs, so it is how long others wait if fencelock dies [default: 30s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    lease: Option<Duration>,

    /// Give up (exit 75) if the lock is not granted within DUR; 0s makes one attempt. If Redis
    /// does not answer, fencelock exits 1 within DUR plus the connection timeout [default: wait
    /// as long as it takes]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// After the lock is lost and CMD was sent SIGTERM, how long to wait before SIGKILL
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    grace: Duration,

    /// Take one of N permits of the semaphore KEY instead of the lock: at most N such runs at
    /// once. Every run of KEY must give the same N while any holds or waits (exit 2 if not)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,

    /// The lock's key (with --permits, the semaphore's name)
    key: String,

    /// The command to run and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// What this candidate advertises while it leads: `leader` shows it [default: HOSTNAME:PID,
    /// the host's name and fencelock's process id]
    #[arg(long, value_name = "VALUE")]
    value: Option<String>,

    /// How long a leadership lives in Redis without renewal; renewed about every third of it
    /// while CMD runs, so it is how long the next candidate waits if fencelock dies [default:
    /// 30s]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    lease: Option<Duration>,

    /// Give up (exit 75) if this candidate does not lead within DUR; 0s makes one attempt. If
    /// Redis does not answer, fencelock exits 1 within DUR plus the connection timeout
    /// [default: wait as long as it takes]
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// After the leadership is lost and CMD was sent SIGTERM, how long to wait before SIGKILL
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    grace: Duration,

    /// The election's name
    name: String,

    /// The command to run and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let lease = match &cli.command {
        Commands::Run(args) => args.lease,
        Commands::Elect(args) => args.lease,
        _ => None,
    };
    let timeouts = Timeouts {
        connect: cli.connect_timeout,
        response: cli.response_timeout,
    };
    let client = match client(&cli.url, cli.namespace.as_deref(), lease, timeouts) {
        Ok(client) => client,
        Err(e) => return ExitCode::from(exit::report(&e)),
    };
    let code = match cli.command {
        Commands::Run(args) => {
            let how = run::Run {
                timeout: args.timeout,
                connect_timeout: cli.connect_timeout,
                grace: args.grace,
                command: args.command,
            };
            match args.permits {
                None => run::run(
                    &run::Lock {
                        client,
                        key: args.key,
                    },
                    &how,
                ),
                Some(permits) => match client.semaphore(&args.key, permits) {
                    Ok(semaphore) => run::run(&run::Permits { semaphore }, &how),
                    Err(e) => exit::report(&e),
                },
            }
        }
        Commands::Status { json, key } => status(&client, &key, json),
        Commands::Release { force: _, key } => force_release(&client, &key),
        Commands::Elect(args) => match client.election(&args.name) {
            Ok(election) => run::run(
                &elect::Campaign {
                    election,
                    value: args.value.unwrap_or_else(elect::default_value),
                },
                &run::Run {
                    timeout: args.timeout,
                    connect_timeout: cli.connect_timeout,
                    grace: args.grace,
                    command: args.command,
                },
            ),
            Err(e) => exit::report(&e),
        },
        Commands::Leader { json, watch, name } => elect::leader(&client, &name, json, watch),
    };
    ExitCode::from(code)
}

/// The connection and response timeouts of the client.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    connect: Duration,
    response: Duration,
}

fn client(
    url: &str,
    namespace: Option<&str>,
    lease: Option<Duration>,
    timeouts: Timeouts,
) -> fencelock::Result<LockClient> {
    let mut builder = LockClient::builder(url)
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response);
    if let Some(namespace) = namespace {
        builder = builder.namespace(namespace);
    }
    if let Some(lease) = lease {
        builder = builder.lease(lease);
    }
    builder.build()
}

fn status(client: &LockClient, key: &str, json: bool) -> u8 {
    match client.status(key) {
        Ok(status) if json => {
            println!("{}", status_json(key, &Shown::from(&status)));
            exit::OK
        }
        Ok(status) => {
            print!("{}", status_text(key, &Shown::from(&status)));
            exit::OK
        }
        Err(e) => exit::report(&e),
    }
}

/// What `status` prints: a [`LockStatus`]'s parts (it is `#[non_exhaustive]`, so only the
/// library makes one).
#[derive(Debug, Clone, Copy)]
struct Shown {
    held: bool,
    token: Option<FencingToken>,
    remaining_lease: Option<Duration>,
    waiters: u64,
}

impl From<&LockStatus> for Shown {
    fn from(status: &LockStatus) -> Shown {
        Shown {
            held: status.held,
            token: status.token,
            remaining_lease: status.remaining_lease,
            waiters: status.waiters,
        }
    }
}

/// One object: `key`, `held`, `token` (a number, or null), `remaining_lease_ms` (null when
/// free or without expiry) and `waiters`.
fn status_json(key: &str, status: &Shown) -> String {
    let token = status
        .token
        .map_or_else(|| "null".to_owned(), |t| t.to_string());
    let lease = status
        .remaining_lease
        .map_or_else(|| "null".to_owned(), |d| d.as_millis().to_string());
    format!(
        "{{\"key\":{},\"held\":{},\"token\":{token},\"remaining_lease_ms\":{lease},\"waiters\":{}}}",
        json_string(key),
        status.held,
        status.waiters
    )
}

fn status_text(key: &str, status: &Shown) -> String {
    let mut lines = vec![format!("key      {key:?}")];
    if status.held {
        lines.push("state    held".to_owned());
        lines.push(match status.token {
            Some(token) => format!("token    {token}"),
            None => "token    unknown (the fence counter is gone)".to_owned(),
        });
        lines.push(match status.remaining_lease {
            Some(left) => format!("lease    {} left", human(left)),
            None => "lease    no expiry (set by hand?)".to_owned(),
        });
    } else {
        lines.push("state    free".to_owned());
    }
    lines.push(format!("waiters  {}", status.waiters));
    lines.join("\n") + "\n"
}

fn force_release(client: &LockClient, key: &str) -> u8 {
    match client.force_unlock(key) {
        Ok(true) => {
            println!("released {key:?}; its holder learns it at its next renewal");
            exit::OK
        }
        Ok(false) => {
            println!("{key:?} was not held");
            exit::OK
        }
        Err(e) => exit::report(&e),
    }
}

/// fencelock's exit statuses (see `AFTER_HELP`).
mod exit {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    pub(crate) const OK: u8 = 0;
    pub(crate) const ERROR: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
    /// `leader`: nobody leads (as LSB init scripts' `status` says "not running").
    pub(crate) const NOBODY_LEADS: u8 = 3;
    /// EX_TEMPFAIL of sysexits.h: try again later.
    pub(crate) const TEMPFAIL: u8 = 75;
    pub(crate) const LOST: u8 = 76;
    pub(crate) const CANNOT_EXECUTE: u8 = 126;
    pub(crate) const NOT_FOUND: u8 = 127;

    /// Prints a library error and returns its exit status: a refused argument is the command
    /// line's fault, anything else fencelock's.
    pub(crate) fn report(e: &fencelock::Error) -> u8 {
        eprintln!("fencelock: {e}");
        of_error(e)
    }

    /// A library error's exit status: a refused argument is the command line's fault, anything
    /// else fencelock's.
    pub(crate) fn of_error(e: &fencelock::Error) -> u8 {
        if e.is_invalid_argument() {
            USAGE
        } else {
            ERROR
        }
    }

    /// 128 + N for signal N, as shells report it.
    pub(crate) fn by_signal(signal: libc::c_int) -> u8 {
        u8::try_from(128 + signal).unwrap_or(u8::MAX)
    }

    /// CMD's exit status as fencelock's: its code, or 128 + N if signal N killed it.
    pub(crate) fn of(status: ExitStatus) -> u8 {
        match (status.code(), status.signal()) {
            // Exit codes are 0 to 255 on Unix.
            (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(ERROR),
            (None, Some(signal)) => by_signal(signal),
            (None, None) => ERROR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_its_command_after_a_double_dash() {
        let cli = Cli::try_parse_from([
            "fencelock",
            "--namespace",
            "ops",
            "run",
            "--timeout",
            "500ms",
            "job",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        assert_eq!(cli.namespace.as_deref(), Some("ops"));
        let Commands::Run(args) = cli.command else {
            panic!("not run: {cli:?}");
        };
        assert_eq!(args.key, "job");
        assert_eq!(args.timeout, Some(Duration::from_millis(500)));
        assert_eq!(args.grace, Duration::from_secs(10));
        assert_eq!(args.command, ["sh", "-c", "exit 3"]);
        assert_eq!(args.permits, None);

        let cli = Cli::try_parse_from([
            "fencelock",
            "run",
            "--permits",
            "4",
            "uploads",
            "--",
            "true",
        ])
        .unwrap();
        let Commands::Run(args) = cli.command else {
            panic!("not run: {cli:?}");
        };
        assert_eq!((args.permits, args.key.as_str()), (Some(4), "uploads"));

        for bad in [
            &["fencelock", "run", "job"][..],
            &["fencelock", "run", "job", "sh"],
            &["fencelock", "run", "--timeout", "5", "job", "--", "sh"],
            &["fencelock", "run", "--permits", "0", "job", "--", "sh"],
            &["fencelock", "run", "--permits", "-1", "job", "--", "sh"],
            &["fencelock", "release", "job"],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), i32::from(exit::USAGE), "{bad:?}");
        }
    }

    #[test]
    fn elect_takes_its_command_after_a_double_dash_and_leader_a_name() {
        let cli = Cli::try_parse_from([
            "fencelock",
            "elect",
            "--value",
            "node-a:8080",
            "--lease",
            "3s",
            "--timeout",
            "0s",
            "scheduler",
            "--",
            "./schedule.sh",
            "--all",
        ])
        .unwrap();
        let Commands::Elect(args) = cli.command else {
            panic!("not elect: {cli:?}");
        };
        assert_eq!(args.name, "scheduler");
        assert_eq!(args.value.as_deref(), Some("node-a:8080"));
        assert_eq!(args.lease, Some(Duration::from_secs(3)));
        assert_eq!(args.timeout, Some(Duration::ZERO));
        assert_eq!(args.grace, Duration::from_secs(10));
        assert_eq!(args.command, ["./schedule.sh", "--all"]);

        let cli = Cli::try_parse_from(["fencelock", "elect", "scheduler", "--", "true"]).unwrap();
        let Commands::Elect(args) = cli.command else {
            panic!("not elect: {cli:?}");
        };
        assert_eq!((args.value, args.lease, args.timeout), (None, None, None));

        let cli =
            Cli::try_parse_from(["fencelock", "leader", "--watch", "--json", "scheduler"]).unwrap();
        let Commands::Leader { json, watch, name } = cli.command else {
            panic!("not leader: {cli:?}");
        };
        assert!(json && watch);
        assert_eq!(name, "scheduler");

        for bad in [
            &["fencelock", "elect", "scheduler"][..],
            &["fencelock", "elect", "scheduler", "true"],
            &["fencelock", "leader"],
            &["fencelock", "leader", "a", "b"],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), i32::from(exit::USAGE), "{bad:?}");
        }
    }

    #[test]
    fn the_usage_after_a_missing_argument_shows_only_what_is_required() {
        for (args, usage) in [
            (
                &[
                    "fencelock",
                    "release",
                    "--url",
                    "redis://127.0.0.1:1/",
                    "job",
                ][..],
                "Usage: fencelock [OPTIONS] release --force KEY\n",
            ),
            (
                &["fencelock", "run", "--namespace", "ops", "job"],
                "Usage: fencelock [OPTIONS] run [--lease DUR] [--timeout DUR] [--grace DUR] \
                 [--permits N] KEY -- CMD [ARGS]...\n",
            ),
            (
                &["fencelock", "status", "--connect-timeout", "2s"],
                "Usage: fencelock [OPTIONS] status [--json] KEY\n",
            ),
            (
                &["fencelock", "elect", "scheduler"],
                "Usage: fencelock [OPTIONS] elect [--value VALUE] [--lease DUR] [--timeout DUR] \
                 [--grace DUR] NAME -- CMD [ARGS]...\n",
            ),
            (
                &["fencelock", "leader", "--watch"],
                "Usage: fencelock [OPTIONS] leader [--json] [--watch] NAME\n",
            ),
        ] {
            let shown = Cli::try_parse_from(args).unwrap_err().render().to_string();
            assert!(shown.contains(usage), "{args:?}: {shown}");
            assert!(!shown.contains("<URL>"), "{args:?}: {shown}");
        }
    }

    #[test]
    fn every_url_form_in_the_help_is_taken() {
        let help = Cli::command().render_long_help().to_string();
        for url in [
            "redis://10.0.0.1:6379/0",
            "redis+unix:///run/redis/redis.sock",
            "redis+sentinel://10.0.0.1,10.0.0.2,10.0.0.3/mymaster",
            "redis+cluster://10.0.0.1:30001,10.0.0.2:30002",
            "redis+quorum://redis-1,redis-2,redis-3",
        ] {
            assert!(help.contains(url), "{url} not in the help");
            // Building parses the URL and connects to nothing.
            let timeouts = Timeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(5),
            };
            if let Err(e) = client(url, None, None, timeouts) {
                panic!("{url}: {e}");
            }
        }
        for scheme in [
            "rediss",
            "rediss+sentinel",
            "rediss+cluster",
            "rediss+quorum",
        ] {
            assert!(
                help.contains(&format!("{scheme}://")),
                "{scheme} not in the help"
            );
        }
    }

    #[test]
    fn timeouts_default_to_one_and_five_seconds_and_refuse_zero() {
        let cli = Cli::try_parse_from(["fencelock", "status", "job"]).unwrap();
        assert_eq!(cli.connect_timeout, Duration::from_secs(1));
        assert_eq!(cli.response_timeout, Duration::from_secs(5));
        let cli = Cli::try_parse_from([
            "fencelock",
            "status",
            "--connect-timeout",
            "250ms",
            "--response-timeout",
            "2s",
            "job",
        ])
        .unwrap();
        assert_eq!(cli.connect_timeout, Duration::from_millis(250));
        assert_eq!(cli.response_timeout, Duration::from_secs(2));
        for flag in ["--connect-timeout", "--response-timeout"] {
            let err = Cli::try_parse_from(["fencelock", flag, "0s", "status", "job"]).unwrap_err();
            assert_eq!(err.exit_code(), i32::from(exit::USAGE), "{flag}");
        }
    }

    #[test]
    fn status_reads_as_text_and_as_json() {
        let status = |held, token: Option<u64>, lease: Option<u64>, waiters| Shown {
            held,
            token: token.map(Into::into),
            remaining_lease: lease.map(Duration::from_millis),
            waiters,
        };
        let held = status(true, Some(1_800_000_000_000_042), Some(2_950), 2);
        assert_eq!(
            status_json("a\"b", &held),
            r#"{"key":"a\"b","held":true,"token":1800000000000042,"remaining_lease_ms":2950,"waiters":2}"#
        );
        assert_eq!(
            status_text("job", &held),
            "key      \"job\"\nstate    held\ntoken    1800000000000042\nlease    2.9s left\nwaiters  2\n"
        );
        let free = status(false, None, None, 0);
        assert_eq!(
            status_json("job", &free),
            r#"{"key":"job","held":false,"token":null,"remaining_lease_ms":null,"waiters":0}"#
        );
        assert_eq!(
            status_text("job", &free),
            "key      \"job\"\nstate    free\nwaiters  0\n"
        );
    }
}
