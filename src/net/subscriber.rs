//! A pub/sub subscription that one thread holds for as long as its owner needs it: subscribe,
//! hand each message to the owner, check a quiet connection, and subscribe again when the
//! connection fails.
//!
//! The owner (above `net/`) says what to subscribe to, where, and what the messages mean
//! ([`Subscriber`]); the loop ([`run`]) is the same for all of them:
//!
//! | event | what the loop does |
//! |---|---|
//! | nobody needs the subscription | waits in [`Subscriber::wait_until_needed`], not connected |
//! | subscribed, first or again | tells the owner ([`Subscriber::subscribed`]): messages published while no subscription stood were lost |
//! | a message | hands it to the owner |
//! | no message for a [`HEARTBEAT`] | a PING: a half-open connection would otherwise swallow every message silently |
//! | the node subscribed on stopped being the one to hear ([`Subscriber::moved`], asked after every read) | subscribes again |
//! | the connection failed, or the subscription was refused | subscribes again after a pause ([`Backoff`]: 10 ms, doubling to 1 s, back to 10 ms once subscribed) |
//! | refused for want of permission (NOPERM) | has the owner say so once ([`Subscriber::not_permitted`]): a configuration error, not an outage |
//! | nobody needed it for [`LINGER`] | lets go of the connection, and waits until needed |
//! | the owner is gone | ends |

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Msg, RedisError, RedisResult};

use super::wire::interrupted;

/// How long a subscription may go quiet before its connection is checked with a PING, and so
/// about how long its thread takes to notice that its owner is gone.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long a subscription outlives the last thread that needed it: a busy key's waiters come
/// and go.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// Whether a subscription is needed, as its owner says after every read.
pub(crate) enum Need {
    Now,
    /// Nobody waits for its messages now: it is kept for [`LINGER`].
    NotNow,
    /// Its owner is gone: the thread ends.
    Never,
}

/// What a subscription's owner decides: what to subscribe to and where, when, and what its
/// messages mean.
pub(crate) trait Subscriber {
    /// Blocks until someone needs the subscription; `false` once nobody ever will (the owner is
    /// gone). Asked before every connection.
    fn wait_until_needed(&mut self) -> bool;

    /// Whether the subscription is still needed. Asked before every read, so cheap.
    fn needed(&mut self) -> Need;

    /// A new connection to the node to subscribe on, whose reads time out after a
    /// [`HEARTBEAT`].
    fn connect(&mut self) -> RedisResult<Connection>;

    /// The command that subscribes: `SUBSCRIBE` or `PSUBSCRIBE`, with its channels.
    fn subscribe(&self) -> redis::Cmd;

    /// How long a read waits before [`Subscriber::moved`] is asked: a [`HEARTBEAT`] unless
    /// the node to subscribe on may move sooner.
    fn poll(&self) -> Duration {
        HEARTBEAT
    }

    /// Whether the node subscribed on stopped being the one whose messages are wanted (its
    /// master moved, say): the loop then subscribes again.
    fn moved(&self) -> bool {
        false
    }

    /// The subscription stands, first or again: whatever was published while none stood went
    /// unheard.
    fn subscribed(&mut self);

    /// A message on the subscription.
    fn message(&mut self, msg: &Msg);

    /// The subscription was refused for want of permission; said once per thread.
    fn not_permitted(&self, e: &RedisError);

    /// What the subscription is, for the logs: "the release channel \"...\"", say.
    fn name(&self) -> String;
}

/// The pauses between failed subscriptions: 10 ms, doubling to 1 s.
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(10);
    pub(crate) const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Backoff {
        Backoff {
            next: Backoff::FIRST,
        }
    }

    /// Sleeps the pause due, and doubles the next.
    pub(crate) fn sleep(&mut self) {
        thread::sleep(self.next);
        self.next = (self.next * 2).min(Backoff::MAX);
    }

    /// A subscription stood: the next failure pauses the least again.
    pub(crate) fn reset(&mut self) {
        self.next = Backoff::FIRST;
    }
}

/// Holds `subscriber`'s subscription whenever it is needed, until its owner is gone.
pub(crate) fn run(subscriber: &mut impl Subscriber) {
    let mut backoff = Backoff::new();
    let mut warned = false;
    while subscriber.wait_until_needed() {
        let Err(e) = listen(subscriber, &mut backoff) else {
            continue;
        };
        // A configuration error, not an outage: said once, loudly.
        if e.code() == Some("NOPERM") && !std::mem::replace(&mut warned, true) {
            subscriber.not_permitted(&e);
        } else {
            log::debug!("fencelock: {} down, reconnecting: {e}", subscriber.name());
        }
        backoff.sleep();
    }
}

/// Subscribes and hands on messages until the subscription is not needed (`Ok`), or the
/// connection fails or must move (`Err`).
fn listen(subscriber: &mut impl Subscriber, backoff: &mut Backoff) -> RedisResult<()> {
    let mut con = subscriber.connect()?;
    // redis-rs' `PubSub::subscribe` takes an error reply (NOPERM, say) for the confirmation and
    // returns `Ok`, and the connection then waits, silent, for messages that never come; here an
    // error reply is the error. The confirmation (an array, or a push under RESP3) or an error:
    // the first reply either way.
    con.send_packed_command(&subscriber.subscribe().get_packed_command())?;
    con.recv_response()?.extract_error()?;
    // Wait for messages in steps of `poll`; the PING and its reply keep the heartbeat.
    let poll = subscriber.poll();
    if poll != HEARTBEAT {
        con.set_read_timeout(Some(poll))?;
    }
    backoff.reset();
    subscriber.subscribed();
    let mut pubsub = con.as_pubsub();
    let mut heard = Instant::now();
    let mut idle_since: Option<Instant> = None;
    loop {
        match subscriber.needed() {
            Need::Now => idle_since = None,
            Need::NotNow => {
                if idle_since.get_or_insert_with(Instant::now).elapsed() >= LINGER {
                    return Ok(());
                }
            }
            Need::Never => return Ok(()),
        }
        let quiet = match pubsub.get_message() {
            Ok(msg) => {
                heard = Instant::now();
                subscriber.message(&msg);
                false
            }
            Err(e) if e.is_timeout() => heard.elapsed() >= HEARTBEAT,
            // A signal cut the read short; redis-rs keeps what it had read of the message.
            // Signals coming faster than the heartbeat must not put off the heartbeat.
            Err(e) if interrupted(&e) => heard.elapsed() >= HEARTBEAT,
            Err(e) => return Err(e),
        };
        if subscriber.moved() {
            return Err(RedisError::from((
                redis::ErrorKind::Io,
                "the node to subscribe on moved",
            )));
        }
        if quiet {
            heard = Instant::now();
            // A half-open connection would otherwise swallow every message silently.
            if poll != HEARTBEAT {
                pubsub.set_read_timeout(Some(HEARTBEAT))?;
            }
            pubsub.ping::<()>()?;
            if poll != HEARTBEAT {
                pubsub.set_read_timeout(Some(poll))?;
            }
        }
    }
}
