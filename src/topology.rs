//! What a client connects to: one server, the master that Redis Sentinel names, a Redis
//! Cluster, or a quorum of independent masters.
//!
//! This is the description users build and see; a client's build resolves it into what
//! `net/target.rs` describes and checks (the URL forms are parsed in `net/url.rs`), and the
//! connector (`net/connector.rs`) makes connections from that.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::net::target::{ClusterSpec, QuorumSpec, SentinelSpec, Target};
use crate::net::url::{self, encode, host_port, shown, with_sentinel_port};

pub use crate::net::target::QUORUM_MIN_NODES;
pub use crate::net::url::SENTINEL_PORT;

/// The Redis deployment a [`LockClient`](crate::LockClient) or a
/// [`FencedRedis`](crate::FencedRedis) talks to.
///
/// Most programs never name this type: a URL converts into it, so
/// `LockClient::builder("redis://127.0.0.1:6379/")` is a single server, and a `redis+sentinel://`
/// URL is the master that a group of sentinels names, and a `redis+cluster://` URL a Redis
/// Cluster. Build one by hand to give each sentinel its own URL, or the data nodes credentials
/// of their own.
///
/// # Forms
///
/// | form | deployment |
/// |---|---|
/// | `redis://[[user]:password@]host[:port][/db]` | one server (`rediss://` with the `tls` feature; `redis+unix:///path` or `unix:///path` for a socket) |
/// | `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db][?sentinel_username=U&sentinel_password=P]` | the master named `master_name` by these sentinels (port 26379 unless given) |
/// | `rediss+sentinel://...` | the same over TLS, to the sentinels and to the master (the `tls` feature) |
/// | `redis+cluster://[[user]:password@]host[:port][,host[:port]...]` | a Redis Cluster that these seed nodes belong to (port 6379 unless given); `rediss+cluster://` over TLS |
/// | `redis+quorum://[[user]:password@]host[:port],host[:port],host[:port][...][/db]` | a [quorum](Topology::quorum) of at least three independent masters, each with these credentials and database; `rediss+quorum://` over TLS |
///
/// In the Sentinel form the user and password before the hosts are the *data nodes'* (the
/// master's), as in most Redis clients; the sentinels' own, if they have any, go in the query.
/// Percent-encode any of `:@/?#&=,%` in a password.
///
/// ```
/// use fencelock::Topology;
///
/// # fn main() -> Result<(), fencelock::Error> {
/// // One server.
/// let one: Topology = "redis://127.0.0.1:6379/".parse()?;
///
/// // Three sentinels watching the master "mymaster", whose data nodes want a password.
/// let ha: Topology =
///     "redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2,10.0.0.3/mymaster".parse()?;
/// assert_eq!(
///     ha,
///     Topology::sentinel(
///         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
///         "mymaster",
///     )
///     .master_password("s3cret")
/// );
/// // Shown without its password.
/// assert_eq!(
///     ha.to_string(),
///     "redis+sentinel://:***@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster"
/// );
/// # let _ = one;
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Topology {
    kind: Kind,
    /// A setter that applies only to Sentinel, given to a topology of another kind: the topology
    /// is then a Sentinel stand-in that `build()` refuses, where every setting is checked.
    misuse: Option<&'static str>,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind {
    /// A URL not yet looked at: one server, or any of the forms of several servers (parsed
    /// when built, so that `From<&str>` cannot fail).
    Url(String),
    /// Sentinel, Cluster or a quorum, made by hand or parsed from a URL; checked when built. A
    /// single server stays a `Url`.
    Target(Target),
}

impl Topology {
    /// One Redis server at `url`: `redis://[[user]:password@]host[:port][/db]`, `rediss://`
    /// with the `tls` feature, or `redis+unix:///path`. The same as converting the URL.
    pub fn single(url: impl Into<String>) -> Topology {
        Topology {
            kind: Kind::Url(url.into()),
            misuse: None,
        }
    }

    /// The master that the sentinels at `sentinels` (`redis://[[user]:password@]host[:port]`
    /// each, with the sentinel's own credentials if it has any; the port is 26379 when none is
    /// given) know as `master_name`.
    ///
    /// The client asks the sentinels for the master, checks with `ROLE` that it is one, and
    /// follows it through failovers: see "Running on Sentinel" in the README and in
    /// docs/design.md.
    /// Give the master's own credentials and database with
    /// [`master_password`](Topology::master_password),
    /// [`master_username`](Topology::master_username) and [`master_db`](Topology::master_db).
    ///
    /// ```
    /// use fencelock::{LockClient, Topology};
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = LockClient::builder(Topology::sentinel(
    ///         ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380", "redis://127.0.0.1:26381"],
    ///         "mymaster"))
    ///     .namespace("orders")
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn sentinel<I, S>(sentinels: I, master_name: impl Into<String>) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Topology {
            kind: Kind::Target(Target::Sentinel(SentinelSpec {
                sentinels: sentinels
                    .into_iter()
                    .map(|url| with_sentinel_port(url.into()))
                    .collect(),
                master_name: master_name.into(),
                username: None,
                password: None,
                db: 0,
            })),
            misuse: None,
        }
    }

    /// A Redis Cluster that the nodes at `seeds` belong to (`redis://[[user]:password@]host[:port]`
    /// each; one that answers is enough, more ride out a seed that is down). Every node the
    /// cluster names is reached with the first seed's credentials, and over TLS if it is
    /// `rediss://`.
    ///
    /// The client asks a seed for the map of hash slots (`CLUSTER SLOTS`), sends each lock's
    /// scripts to the master that owns the lock's slot, and follows the cluster through
    /// failovers and slot migrations (`MOVED`, `ASK`, `TRYAGAIN`): see "Running on Redis
    /// Cluster" in the README and in docs/design.md.
    ///
    /// ```
    /// use fencelock::{LockClient, Topology};
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = LockClient::builder(Topology::cluster(["redis://127.0.0.1:30001"]))
    ///     .namespace("orders")
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(seeds: I) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Topology {
            kind: Kind::Target(Target::Cluster(ClusterSpec {
                seeds: seeds
                    .into_iter()
                    .map(|url| url.into().trim().to_owned())
                    .collect(),
            })),
            misuse: None,
        }
    }

    /// A quorum of independent Redis masters (`redis://[[user]:password@]host[:port][/db]`
    /// each, at least [`QUORUM_MIN_NODES`], no replication between them): a lock is held while
    /// a majority of them grant and renew it, so it outlives a minority of masters that are
    /// down, frozen or cut off, with no failover at all.
    ///
    /// This is Redlock with fencing tokens that never go back: a grant's token is the largest
    /// of the tokens its majority minted, written back to that majority before the grant is
    /// reported, so any later grant (whose majority shares a master with it) mints a larger
    /// one. Tokens rise as long as a master that lost its data stays down for longer than the
    /// longest lease (see "Running on a quorum of masters" in the README and in
    /// docs/design.md).
    ///
    /// ```
    /// use std::time::Duration;
    /// use fencelock::{LockClient, Topology};
    ///
    /// # fn main() -> Result<(), fencelock::Error> {
    /// let client = LockClient::builder(Topology::quorum([
    ///         "redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
    ///         "redis://127.0.0.1:7004", "redis://127.0.0.1:7005"]))
    ///     .lease(Duration::from_secs(10))
    ///     .build()?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn quorum<I, S>(nodes: I) -> Topology
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Topology {
            kind: Kind::Target(Target::Quorum(QuorumSpec {
                nodes: nodes
                    .into_iter()
                    .map(|url| url.into().trim().to_owned())
                    .collect(),
            })),
            misuse: None,
        }
    }

    /// The password of the data nodes (the master and its replicas) of a Sentinel topology,
    /// when they want one (`requirepass`, or an ACL user's). Only for [`Topology::sentinel`]:
    /// a single server's password goes in its URL.
    pub fn master_password(self, password: impl Into<String>) -> Topology {
        let password = password.into();
        self.sentinel_only("master_password", |s| s.password = Some(password))
    }

    /// The ACL user of the data nodes of a Sentinel topology (with
    /// [`master_password`](Topology::master_password)). Only for [`Topology::sentinel`].
    pub fn master_username(self, username: impl Into<String>) -> Topology {
        let username = username.into();
        self.sentinel_only("master_username", |s| s.username = Some(username))
    }

    /// The database number on the master of a Sentinel topology (0 unless set). Only for
    /// [`Topology::sentinel`].
    pub fn master_db(self, db: i64) -> Topology {
        self.sentinel_only("master_db", |s| s.db = db)
    }

    fn sentinel_only(mut self, setter: &'static str, set: impl FnOnce(&mut SentinelSpec)) -> Self {
        match &mut self.kind {
            Kind::Target(Target::Sentinel(spec)) => set(spec),
            Kind::Url(url) | Kind::Target(Target::Single(url)) => match Target::parse(url) {
                // A `redis+sentinel://` URL converted from a string: parse it now.
                Some(Ok(Target::Sentinel(mut spec))) => {
                    set(&mut spec);
                    self.kind = Kind::Target(Target::Sentinel(spec));
                }
                _ => {
                    // Reported by build(), which is where every setting is checked.
                    self.kind = Kind::Target(Target::Sentinel(stand_in(url)));
                    self.misuse = Some(setter);
                }
            },
            Kind::Target(Target::Cluster(ClusterSpec { seeds: urls }))
            | Kind::Target(Target::Quorum(QuorumSpec { nodes: urls })) => {
                self.kind =
                    Kind::Target(Target::Sentinel(stand_in(urls.first().map_or("", |s| s))));
                self.misuse = Some(setter);
            }
        }
        self
    }

    /// What to connect to, checked: a single server's URL, or the servers of a Sentinel,
    /// Cluster or quorum set-up.
    pub(crate) fn resolve(&self) -> Result<Target> {
        if let Some(setter) = self.misuse {
            return Err(Error::invalid(
                "topology",
                format!(
                    "{setter} applies to a Sentinel topology (Topology::sentinel or a \
                     redis+sentinel:// URL); a single server takes its credentials and database \
                     in its URL"
                ),
            ));
        }
        match &self.kind {
            Kind::Url(url) => Target::parse(url).unwrap_or_else(|| Ok(Target::Single(url.clone()))),
            Kind::Target(target) => {
                target.check()?;
                Ok(target.clone())
            }
        }
    }
}

/// A stand-in for a topology given a Sentinel-only setting that it does not take: shown as the
/// Sentinel form of its first URL, refused when built.
fn stand_in(url: &str) -> SentinelSpec {
    SentinelSpec {
        sentinels: vec![url.to_owned()],
        master_name: String::new(),
        username: None,
        password: None,
        db: 0,
    }
}

impl From<&str> for Topology {
    /// A URL, parsed when the client is built.
    fn from(url: &str) -> Topology {
        Topology::single(url)
    }
}

impl From<String> for Topology {
    /// A URL, parsed when the client is built.
    fn from(url: String) -> Topology {
        Topology::single(url)
    }
}

impl From<&String> for Topology {
    /// A URL, parsed when the client is built.
    fn from(url: &String) -> Topology {
        Topology::single(url.as_str())
    }
}

impl From<&Topology> for Topology {
    fn from(topology: &Topology) -> Topology {
        topology.clone()
    }
}

impl FromStr for Topology {
    type Err = Error;

    /// Parses any of the [forms](Topology#forms), checking it as a client's build would (a
    /// single server's URL is checked without TLS settings).
    fn from_str(url: &str) -> Result<Topology> {
        if let Some(target) = Target::parse(url) {
            return target.map(|target| Topology {
                kind: Kind::Target(target),
                misuse: None,
            });
        }
        url::check(url)?;
        Ok(Topology::single(url))
    }
}

impl fmt::Display for Topology {
    /// The URL form, without passwords.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Url(url) | Kind::Target(Target::Single(url)) => f.write_str(&shown(url)),
            Kind::Target(Target::Sentinel(spec)) => {
                let scheme = if spec.tls() {
                    "rediss+sentinel"
                } else {
                    "redis+sentinel"
                };
                write!(f, "{scheme}://")?;
                match (&spec.username, &spec.password) {
                    (Some(user), Some(_)) => write!(f, "{}:***@", encode(user))?,
                    (Some(user), None) => write!(f, "{}@", encode(user))?,
                    (None, Some(_)) => f.write_str(":***@")?,
                    (None, None) => {}
                }
                for (i, url) in spec.sentinels.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(&host_port(url))?;
                }
                write!(f, "/{}", encode(&spec.master_name))?;
                if spec.db != 0 {
                    write!(f, "/{}", spec.db)?;
                }
                Ok(())
            }
            Kind::Target(Target::Cluster(spec)) => {
                let scheme = if spec.tls() {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                };
                write!(f, "{scheme}://")?;
                if let Some(first) = spec.seeds.first() {
                    let shown = shown(first);
                    let rest = shown.split_once("://").map_or("", |(_, r)| r);
                    if let Some((info, _)) = rest.rsplit_once('@') {
                        write!(f, "{info}@")?;
                    }
                }
                for (i, url) in spec.seeds.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(&host_port(url))?;
                }
                Ok(())
            }
            Kind::Target(Target::Quorum(spec)) => {
                // Each master may have credentials and a database of its own: the URL form
                // when they share them, each URL without its password otherwise.
                let shown: Vec<String> = spec.nodes.iter().map(|u| shown(u)).collect();
                let split = |u: &str| -> (String, String, String) {
                    let rest = u.split_once("://").map_or(u, |(_, r)| r);
                    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                    let (authority, path) = rest.split_at(end);
                    let (info, host) = match authority.rsplit_once('@') {
                        Some((info, host)) => (format!("{info}@"), host.to_owned()),
                        None => (String::new(), authority.to_owned()),
                    };
                    (info, host, path.trim_end_matches('/').to_owned())
                };
                let parts: Vec<_> = shown.iter().map(|u| split(u)).collect();
                let shared = parts
                    .iter()
                    .all(|(info, _, path)| *info == parts[0].0 && *path == parts[0].2);
                if !shared {
                    return write!(f, "quorum({})", shown.join(", "));
                }
                let scheme = if spec.tls() {
                    "rediss+quorum"
                } else {
                    "redis+quorum"
                };
                write!(f, "{scheme}://{}", parts[0].0)?;
                for (i, (_, host, _)) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(host)?;
                }
                f.write_str(&parts[0].2)
            }
        }
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Topology({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> SentinelSpec {
        match url.parse::<Topology>().map(|t| t.kind) {
            Ok(Kind::Target(Target::Sentinel(spec))) => spec,
            other => panic!("{url}: {:?}", other.map(|_| "not sentinel")),
        }
    }

    #[test]
    fn parses_the_sentinel_form() {
        let s =
            spec("redis+sentinel://u:p%40ss@h1:1,h2,[::1]:3,[::1]/mymaster/2?sentinel_password=sp");
        assert_eq!(
            s.sentinels,
            [
                "redis://:sp@h1:1",
                "redis://:sp@h2:26379",
                "redis://:sp@[::1]:3",
                "redis://:sp@[::1]:26379"
            ]
        );
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(s.username.as_deref(), Some("u"));
        assert_eq!(s.password.as_deref(), Some("p@ss"));
        assert_eq!(s.db, 2);
        let s = spec("redis+sentinel://h1/m");
        assert_eq!(s.sentinels, ["redis://h1:26379"]);
        assert_eq!((s.username, s.password, s.db), (None, None, 0));
    }

    #[test]
    fn says_what_is_wrong_with_a_sentinel_url() {
        for (url, says) in [
            ("redis+sentinel://h1:26379", "no master name"),
            ("redis+sentinel://h1:26379/", "no master name"),
            ("redis+sentinel://h1:2x/m", "port"),
            ("redis+sentinel://h1,,h2/m", "empty host"),
            ("redis+sentinel://h1/m/x", "database"),
            ("redis+sentinel://h1/m/1/2", "unexpected"),
            ("redis+sentinel://h1/m?db=1", "unknown parameter"),
            ("redis+sentinel://:%zz@h1/m", "hex"),
            ("redis+sentinel://:%+f@h1/m", "hex"),
        ] {
            match url.parse::<Topology>() {
                Err(Error::InvalidArgument { reason, .. }) => {
                    assert!(reason.contains(says), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn shows_no_password() {
        let t: Topology = "redis+sentinel://u:hunter2@h1:1,h2:2/m/3?sentinel_password=x"
            .parse()
            .unwrap();
        assert_eq!(t.to_string(), "redis+sentinel://u:***@h1:1,h2:2/m/3");
        assert!(!format!("{t:?}").contains("hunter2"));
        let t = Topology::from("redis://:hunter2@h:1/");
        assert!(!t.to_string().contains("hunter2"), "{t}");
    }

    #[test]
    fn sentinel_settings_need_a_sentinel_topology() {
        let t = Topology::single("redis://h/").master_password("x");
        assert!(matches!(t.resolve(), Err(Error::InvalidArgument { .. })));
        // A sentinel URL given as a string takes them.
        let t = Topology::from("redis+sentinel://h/m").master_db(3);
        assert!(matches!(
            t.resolve(),
            Ok(Target::Sentinel(SentinelSpec { db: 3, .. }))
        ));
    }

    #[test]
    fn a_sentinel_url_without_a_port_means_the_sentinel_port() {
        let t = Topology::sentinel(
            [
                "redis://h1",
                "redis://:pw@h2/",
                "redis://[::1]",
                "redis://h3:7",
                "redis+unix:///s",
                " REDIS://h4: ",
            ],
            "m",
        );
        let Kind::Target(Target::Sentinel(spec)) = &t.kind else {
            panic!("not sentinel");
        };
        assert_eq!(
            spec.sentinels,
            [
                "redis://h1:26379",
                "redis://:pw@h2:26379/",
                "redis://[::1]:26379",
                "redis://h3:7",
                "redis+unix:///s",
                "REDIS://h4:26379"
            ]
        );
        // So what it shows parses back to the same sentinels.
        let t = Topology::sentinel(["redis://h1", "redis://[::1]", "redis://h3:7"], "m");
        let shown = t.to_string();
        assert_eq!(shown, "redis+sentinel://h1:26379,[::1]:26379,h3:7/m");
        let again: Topology = shown.parse().unwrap();
        assert_eq!(again.to_string(), shown);
    }

    #[test]
    fn parses_the_cluster_form() {
        let t: Topology = "redis+cluster://u:p%40ss@h1:1,h2,[::1]:3".parse().unwrap();
        let Kind::Target(Target::Cluster(spec)) = &t.kind else {
            panic!("not cluster");
        };
        assert_eq!(
            spec.seeds,
            [
                "redis://u:p%40ss@h1:1",
                "redis://u:p%40ss@h2",
                "redis://u:p%40ss@[::1]:3"
            ]
        );
        assert_eq!(t.to_string(), "redis+cluster://u:***@h1:1,h2,[::1]:3");
        assert!(matches!(
            Topology::from("redis+cluster://h1:7000/").resolve(),
            Ok(Target::Cluster(ClusterSpec { seeds })) if seeds == ["redis://h1:7000"]
        ));
        let api = Topology::cluster(["redis://h1:1/", "redis://h2:2"]);
        assert_eq!(api.to_string(), "redis+cluster://h1:1,h2:2");
        for (url, says) in [
            ("redis+cluster://h1:1/3", "database 0"),
            ("redis+cluster://h1:x", "port"),
            ("redis+cluster://h1:1,,h2", "empty host"),
        ] {
            match url.parse::<Topology>() {
                Err(Error::InvalidArgument { reason, .. }) => {
                    assert!(reason.contains(says), "{url}: {reason}")
                }
                other => panic!("{url}: {:?}", other.map(|t| t.to_string())),
            }
        }
        let none: [&str; 0] = [];
        for (t, says) in [
            (Topology::cluster(none), "no seed"),
            (Topology::cluster(["redis+unix:///s"]), "over TCP"),
            (
                Topology::cluster(["redis://h:1", "rediss://h:2"]),
                "all or nothing",
            ),
            (Topology::cluster(["redis://h:1"]).master_db(1), "Sentinel"),
        ] {
            match t.resolve() {
                Err(Error::InvalidArgument { reason, .. }) => {
                    assert!(reason.contains(says), "{t:?}: {reason}")
                }
                other => panic!("{t:?}: {:?}", other.is_ok()),
            }
        }
    }

    #[test]
    fn parses_the_quorum_form() {
        let t: Topology = "redis+quorum://:p%40ss@h1:1,h2,[::1]:3/2".parse().unwrap();
        let Target::Quorum(spec) = t.resolve().unwrap() else {
            panic!("not quorum");
        };
        assert_eq!(
            spec.nodes,
            [
                "redis://:p%40ss@h1:1/2",
                "redis://:p%40ss@h2/2",
                "redis://:p%40ss@[::1]:3/2"
            ]
        );
        assert_eq!(t.to_string(), "redis+quorum://:***@h1:1,h2,[::1]:3/2");
        let api = Topology::quorum(["redis://h1:1/", "redis://h2:2", "redis://h3:3"]);
        assert_eq!(api.to_string(), "redis+quorum://h1:1,h2:2,h3:3");
        let own = Topology::quorum(["redis://:a@h1:1", "redis://:b@h2:2", "redis://h3:3"]);
        assert_eq!(
            own.to_string(),
            "quorum(redis://:***@h1:1, redis://:***@h2:2, redis://h3:3)"
        );
        for (url, says) in [
            ("redis+quorum://h1:1,h2:2", "at least 3"),
            ("redis+quorum://h1:1,h2:2,h1:1", "named twice"),
            ("redis+quorum://h1,h1:6379,h3", "named twice"),
            ("redis+quorum://H1:1,h1:01,h3", "named twice"),
            ("redis+quorum://h1:x,h2,h3", "port"),
            ("redis+quorum://h1,,h3", "empty host"),
            ("redis+quorum://h1,h2,h3/x", "after the hosts"),
        ] {
            let e = url.parse::<Topology>().unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let mixed = Topology::quorum(["redis://h:1", "rediss://h:2", "redis://h:3"]);
        assert!(mixed.resolve().is_err());
        let unix = Topology::quorum(["redis+unix:///s", "redis://h:2", "redis://h:3"]);
        assert!(unix.resolve().is_err());
    }

    #[test]
    fn checks_the_api_form() {
        let none: [&str; 0] = [];
        for (t, says) in [
            (Topology::sentinel(none, "m"), "no sentinel"),
            (Topology::sentinel(["redis://h:1"], " "), "empty"),
            (Topology::sentinel(["redis://h:1"], "a b"), "white space"),
            (
                Topology::sentinel(["redis://h:1"], "m").master_db(-1),
                "negative",
            ),
            (
                Topology::sentinel(["redis://h:1", "rediss://h:2"], "m"),
                "all or nothing",
            ),
        ] {
            match t.resolve() {
                Err(Error::InvalidArgument { reason, .. }) => {
                    assert!(reason.contains(says), "{t:?}: {reason}")
                }
                other => panic!("{t:?}: {:?}", other.is_ok()),
            }
        }
    }
}
