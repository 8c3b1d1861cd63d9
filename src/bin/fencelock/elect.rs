//! `fencelock elect`: campaign in an election, run CMD while leading, resign when CMD exits;
//! `fencelock leader`: who leads an election, once or (`--watch`) at every change.
//!
//! `elect` runs through `run`'s steps ([`crate::run`]) with a [`Campaign`] for the lock: the
//! same wait, timeouts, signals, loss handling and exit statuses.

use std::io::Write;
use std::time::Duration;

use fencelock::crossbeam_channel::{Receiver, RecvTimeoutError};
use fencelock::{Election, Error, FencingToken, Leader, Leadership, LockClient, LockOptions};

use crate::exit;
use crate::format::{human, json_string};
use crate::run::{Held, Target};
use crate::signals;

/// `fencelock elect`'s target: the lead of an election, proclaiming `value`.
#[derive(Clone)]
pub(crate) struct Campaign {
    pub(crate) election: Election,
    pub(crate) value: String,
}

impl Target for Campaign {
    type Held = Leadership;

    fn take(
        &self,
        timeout: Option<Duration>,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, Error> {
        match timeout {
            Some(timeout) => self
                .election
                .try_campaign_with(&self.value, timeout, options),
            None => self.election.campaign_with(&self.value, options).map(Some),
        }
    }

    fn name(&self) -> String {
        format!("election {:?}", self.election.name())
    }

    fn busy(&self) -> String {
        format!(
            "election {:?} is led by another candidate",
            self.election.name()
        )
    }

    fn not_within(&self, timeout: Duration) -> String {
        format!(
            "election {:?} was not won within {}",
            self.election.name(),
            human(timeout)
        )
    }

    fn holder(&self) -> String {
        match self.election.leader() {
            Ok(Some(leader)) => format!(
                ", led by {:?} with epoch {}",
                leader.value(),
                leader.epoch()
            ),
            Ok(None) => ", nobody leads".to_owned(),
            Err(_) => String::new(),
        }
    }

    fn env(&self, leadership: &Leadership) -> Vec<(&'static str, String)> {
        vec![
            ("FENCELOCK_EPOCH", leadership.epoch().to_string()),
            ("FENCELOCK_ELECTION", self.election.name().to_owned()),
        ]
    }

    fn what(&self) -> String {
        format!("the lead of election {:?}", self.election.name())
    }

    fn give_up_failed(&self) -> String {
        format!(
            "resigning from election {:?} failed, the leadership ends with its lease",
            self.election.name()
        )
    }
}

impl Held for Leadership {
    fn is_held(&self) -> bool {
        self.is_leader()
    }

    fn lost(&self) -> &Receiver<()> {
        Leadership::lost(self)
    }

    fn give_up(self) -> Result<(), Error> {
        self.resign()
    }
}

/// `--value`'s default: `HOSTNAME:PID`, fencelock's own process id.
pub(crate) fn default_value() -> String {
    let host = signals::hostname().unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// How long the watch waits for a change before it looks at signals again.
const POLL: Duration = Duration::from_millis(20);

/// `fencelock leader`: prints who leads `name` (exit 0), or that nobody does (exit 3); with
/// `watch`, a line at every change until a signal ends it (exit 0).
pub(crate) fn leader(client: &LockClient, name: &str, json: bool, watch: bool) -> u8 {
    let election = match client.election(name) {
        Ok(election) => election,
        Err(e) => return exit::report(&e),
    };
    if watch {
        return watch_leader(&election, json);
    }
    match election.leader() {
        Ok(leader) => {
            let shown = if json {
                leader_json(name, parts(leader.as_ref())) + "\n"
            } else {
                leader_text(name, parts(leader.as_ref()))
            };
            print!("{shown}");
            if leader.is_some() {
                exit::OK
            } else {
                exit::NOBODY_LEADS
            }
        }
        Err(e) => exit::report(&e),
    }
}

fn watch_leader(election: &Election, json: bool) -> u8 {
    if let Err(e) = signals::install() {
        eprintln!("fencelock: cannot handle signals: {e}");
        return exit::ERROR;
    }
    let observer = match election.observe() {
        Ok(observer) => observer,
        Err(e) => return exit::report(&e),
    };
    let mut stdout = std::io::stdout();
    loop {
        // Any of the caught signals is the end of watching, as asked.
        if !signals::take().is_empty() {
            return exit::OK;
        }
        let change = match observer.changes().recv_timeout(POLL) {
            Ok(change) => change,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                eprintln!(
                    "fencelock: stopped observing election {:?}",
                    election.name()
                );
                return exit::ERROR;
            }
        };
        let line = if json {
            leader_json(election.name(), parts(change.as_ref()))
        } else {
            leader_line(parts(change.as_ref()))
        };
        if let Err(e) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
            // Whoever read the output (`| head -1`) has what it wanted.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return exit::OK;
            }
            eprintln!("fencelock: cannot write to standard output: {e}");
            return exit::ERROR;
        }
    }
}

/// What is shown of a leader: its value and epoch (only the library makes a [`Leader`]).
type Shown<'a> = Option<(&'a str, FencingToken)>;

fn parts(leader: Option<&Leader>) -> Shown<'_> {
    leader.map(|leader| (leader.value(), leader.epoch()))
}

/// As `status` shows a lock: a label and a value per line.
fn leader_text(name: &str, leader: Shown<'_>) -> String {
    let mut lines = vec![format!("election {name:?}")];
    match leader {
        Some((value, epoch)) => {
            lines.push(format!("leader   {value:?}"));
            lines.push(format!("epoch    {epoch}"));
        }
        None => lines.push("leader   none".to_owned()),
    }
    lines.join("\n") + "\n"
}

/// One line per change for `--watch`: `leader "VALUE" epoch N`, or `leader none`.
fn leader_line(leader: Shown<'_>) -> String {
    match leader {
        Some((value, epoch)) => format!("leader {value:?} epoch {epoch}"),
        None => "leader none".to_owned(),
    }
}

/// One object: `election`, `leader` (the value, or null) and `epoch` (a number, or null).
fn leader_json(name: &str, leader: Shown<'_>) -> String {
    let (value, epoch) = match leader {
        Some((value, epoch)) => (json_string(value), epoch.to_string()),
        None => ("null".to_owned(), "null".to_owned()),
    };
    format!(
        "{{\"election\":{},\"leader\":{value},\"epoch\":{epoch}}}",
        json_string(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_reads_as_text_as_a_line_and_as_json() {
        let led = Some(("host-a:42", FencingToken::from(1_800_000_000_000_042)));
        assert_eq!(
            leader_text("sched", led),
            "election \"sched\"\nleader   \"host-a:42\"\nepoch    1800000000000042\n"
        );
        assert_eq!(
            leader_line(led),
            "leader \"host-a:42\" epoch 1800000000000042"
        );
        assert_eq!(
            leader_json("a\"b", led),
            r#"{"election":"a\"b","leader":"host-a:42","epoch":1800000000000042}"#
        );
        assert_eq!(
            leader_text("sched", None),
            "election \"sched\"\nleader   none\n"
        );
        assert_eq!(leader_line(None), "leader none");
        assert_eq!(
            leader_json("sched", None),
            r#"{"election":"sched","leader":null,"epoch":null}"#
        );
        // A value with a newline or a tab stays on its line.
        assert_eq!(
            leader_line(Some(("a\nb\tc", FencingToken::from(7)))),
            "leader \"a\\nb\\tc\" epoch 7"
        );
    }

    #[test]
    fn the_default_value_is_the_host_and_the_process_id() {
        let value = default_value();
        let (host, pid) = value.rsplit_once(':').unwrap();
        assert!(!host.is_empty(), "{value}");
        assert_eq!(pid, std::process::id().to_string());
    }
}
