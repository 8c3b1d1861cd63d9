//! What a client connects to: one server, the master that Redis Sentinel names, a Redis
//! Cluster, or a quorum of independent masters.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

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
}

#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A URL not yet looked at: one server, or a `redis+sentinel://` URL (parsed when built, so
    /// that `From<&str>` cannot fail).
    Url(String),
    Sentinel(SentinelSpec),
    Cluster(ClusterSpec),
    Quorum(QuorumSpec),
}

/// The independent masters of a quorum: `redis://` (or `rediss://`) URLs, each with its own
/// credentials and database.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct QuorumSpec {
    pub(crate) nodes: Vec<String>,
}

/// The fewest masters a quorum takes: with fewer, one master down stops every lock.
pub const QUORUM_MIN_NODES: usize = 3;

/// The seed nodes of a Redis Cluster: `redis://` (or `rediss://`) URLs, each with the
/// credentials of the cluster's nodes. Every node found later is reached with the first seed's
/// credentials and scheme.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClusterSpec {
    pub(crate) seeds: Vec<String>,
}

/// The sentinels to ask, which master to ask them for, and how to log in to it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    /// `redis://` (or `rediss://`) URLs of the sentinels, each with its own credentials.
    pub(crate) sentinels: Vec<String>,
    pub(crate) master_name: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    /// Set by a setter that applies only to Sentinel, on a single-server topology.
    misuse: Option<&'static str>,
}

/// The port of a sentinel whose URL gives none.
pub const SENTINEL_PORT: u16 = 26379;

impl Topology {
    /// One Redis server at `url`: `redis://[[user]:password@]host[:port][/db]`, `rediss://`
    /// with the `tls` feature, or `redis+unix:///path`. The same as converting the URL.
    pub fn single(url: impl Into<String>) -> Topology {
        Topology {
            kind: Kind::Url(url.into()),
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
            kind: Kind::Sentinel(SentinelSpec {
                sentinels: sentinels
                    .into_iter()
                    .map(|url| with_sentinel_port(url.into()))
                    .collect(),
                master_name: master_name.into(),
                username: None,
                password: None,
                db: 0,
                misuse: None,
            }),
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
            kind: Kind::Cluster(ClusterSpec {
                seeds: seeds
                    .into_iter()
                    .map(|url| url.into().trim().to_owned())
                    .collect(),
            }),
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
            kind: Kind::Quorum(QuorumSpec {
                nodes: nodes
                    .into_iter()
                    .map(|url| url.into().trim().to_owned())
                    .collect(),
            }),
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
            Kind::Sentinel(spec) => set(spec),
            Kind::Url(url) => match parse_sentinel_url(url) {
                // A `redis+sentinel://` URL converted from a string: parse it now.
                Some(Ok(mut spec)) => {
                    set(&mut spec);
                    self.kind = Kind::Sentinel(spec);
                }
                _ => {
                    // Reported by build(), which is where every setting is checked.
                    let mut spec = SentinelSpec::misused(url);
                    spec.misuse = Some(setter);
                    self.kind = Kind::Sentinel(spec);
                }
            },
            Kind::Cluster(ClusterSpec { seeds: urls })
            | Kind::Quorum(QuorumSpec { nodes: urls }) => {
                let mut misused = SentinelSpec::misused(urls.first().map_or("", |s| s));
                misused.misuse = Some(setter);
                self.kind = Kind::Sentinel(misused);
            }
        }
        self
    }

    /// What to connect to, checked: a single server's URL, or a Sentinel set-up.
    pub(crate) fn resolve(&self) -> Result<Kind> {
        match &self.kind {
            Kind::Url(url) => {
                if let Some(spec) = parse_sentinel_url(url) {
                    return Ok(Kind::Sentinel(spec?));
                }
                if let Some(spec) = parse_cluster_url(url) {
                    return Ok(Kind::Cluster(spec?));
                }
                if let Some(spec) = parse_quorum_url(url) {
                    return Ok(Kind::Quorum(spec?));
                }
                Ok(Kind::Url(url.clone()))
            }
            Kind::Sentinel(spec) => {
                spec.check()?;
                Ok(Kind::Sentinel(spec.clone()))
            }
            Kind::Cluster(spec) => {
                spec.check()?;
                Ok(Kind::Cluster(spec.clone()))
            }
            Kind::Quorum(spec) => {
                spec.check()?;
                Ok(Kind::Quorum(spec.clone()))
            }
        }
    }
}

impl SentinelSpec {
    /// A stand-in for a single-server URL given a Sentinel-only setting: fails its check.
    fn misused(url: &str) -> SentinelSpec {
        SentinelSpec {
            sentinels: vec![url.to_owned()],
            master_name: String::new(),
            username: None,
            password: None,
            db: 0,
            misuse: None,
        }
    }

    fn check(&self) -> Result<()> {
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
        if self.sentinels.is_empty() {
            return Err(Error::invalid("topology", "no sentinel given"));
        }
        if self.master_name.trim().is_empty() {
            return Err(Error::invalid("topology", "the master name is empty"));
        }
        if self
            .master_name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(Error::invalid(
                "topology",
                format!(
                    "the master name {:?} has white space or control characters",
                    self.master_name
                ),
            ));
        }
        if self.db < 0 {
            return Err(Error::invalid(
                "topology",
                format!("the database {} is negative", self.db),
            ));
        }
        let tls = |url: &str| {
            url.trim_start()
                .to_ascii_lowercase()
                .starts_with("rediss://")
        };
        if self.sentinels.iter().any(|u| tls(u)) != self.sentinels.iter().all(|u| tls(u)) {
            return Err(Error::invalid(
                "topology",
                "some sentinel URLs are rediss:// and some are not: TLS is all or nothing",
            ));
        }
        Ok(())
    }

    /// Whether the sentinels, and so the data nodes, are reached over TLS.
    pub(crate) fn tls(&self) -> bool {
        self.sentinels
            .iter()
            .all(|u| u.trim_start().to_ascii_lowercase().starts_with("rediss://"))
    }
}

impl ClusterSpec {
    fn check(&self) -> Result<()> {
        let wrong = |why: String| Err(Error::invalid("topology", why));
        if self.seeds.is_empty() {
            return wrong("no seed node given".into());
        }
        let scheme = |url: &str| {
            url.split_once("://")
                .map(|(scheme, _)| scheme.to_ascii_lowercase())
        };
        for url in &self.seeds {
            match scheme(url).as_deref() {
                Some("redis") | Some("rediss") => {}
                _ => {
                    return wrong(format!(
                        "the seed {} is not a redis:// or rediss:// URL (a cluster node is \
                         reached over TCP)",
                        crate::net::connector::shown(url)
                    ))
                }
            }
        }
        if self
            .seeds
            .iter()
            .any(|u| scheme(u) != scheme(&self.seeds[0]))
        {
            return wrong(
                "some seed URLs are rediss:// and some are not: TLS is all or nothing".into(),
            );
        }
        for url in &self.seeds {
            crate::net::connector::check(url)?;
        }
        Ok(())
    }

    /// Whether the nodes are reached over TLS.
    pub(crate) fn tls(&self) -> bool {
        self.seeds
            .first()
            .is_some_and(|u| u.to_ascii_lowercase().starts_with("rediss://"))
    }
}

impl QuorumSpec {
    fn check(&self) -> Result<()> {
        let wrong = |why: String| Err(Error::invalid("topology", why));
        if self.nodes.len() < QUORUM_MIN_NODES {
            return wrong(format!(
                "a quorum needs at least {QUORUM_MIN_NODES} masters, {} given (with fewer, \
                 one master down stops every lock)",
                self.nodes.len()
            ));
        }
        let scheme = |url: &str| {
            url.split_once("://")
                .map(|(scheme, _)| scheme.to_ascii_lowercase())
        };
        for url in &self.nodes {
            if !matches!(scheme(url).as_deref(), Some("redis") | Some("rediss")) {
                return wrong(format!(
                    "the master {} is not a redis:// or rediss:// URL",
                    crate::net::connector::shown(url)
                ));
            }
            crate::net::connector::check(url)?;
        }
        if self
            .nodes
            .iter()
            .any(|u| scheme(u) != scheme(&self.nodes[0]))
        {
            return wrong(
                "some master URLs are rediss:// and some are not: TLS is all or nothing".into(),
            );
        }
        // One server named twice would count twice towards a majority: with it down, so would
        // be two of the N, and the quorum would ride out one master fewer than it says.
        let mut seen: Vec<(String, String)> = Vec::with_capacity(self.nodes.len());
        for url in &self.nodes {
            let place = server_of(url);
            if seen.contains(&place) {
                return wrong(format!(
                    "the master {}:{} is named twice: each must be a separate server (one named \
                     twice counts twice towards a majority, up or down)",
                    place.0, place.1
                ));
            }
            seen.push(place);
        }
        Ok(())
    }

    /// Whether the masters are reached over TLS.
    pub(crate) fn tls(&self) -> bool {
        self.nodes
            .first()
            .is_some_and(|u| u.to_ascii_lowercase().starts_with("rediss://"))
    }
}

/// The host (lower case) and port (6379 when none is given) of a `redis://` URL.
fn server_of(url: &str) -> (String, String) {
    let host_port = host_port(url).to_ascii_lowercase();
    match host_port.rsplit_once(':').filter(|(_, p)| !p.contains(']')) {
        Some((host, port)) => (
            host.to_owned(),
            port.parse::<u16>()
                .map_or(port.to_owned(), |p| p.to_string()),
        ),
        None => (host_port, "6379".to_owned()),
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
        if let Some(spec) = parse_sentinel_url(url) {
            return Ok(Topology {
                kind: Kind::Sentinel(spec?),
            });
        }
        if let Some(spec) = parse_cluster_url(url) {
            return Ok(Topology {
                kind: Kind::Cluster(spec?),
            });
        }
        if let Some(spec) = parse_quorum_url(url) {
            return Ok(Topology {
                kind: Kind::Quorum(spec?),
            });
        }
        crate::net::connector::check(url)?;
        Ok(Topology::single(url))
    }
}

impl fmt::Display for Topology {
    /// The URL form, without passwords.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Url(url) => f.write_str(&crate::net::connector::shown(url)),
            Kind::Sentinel(spec) => {
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
            Kind::Cluster(spec) => {
                let scheme = if spec.tls() {
                    "rediss+cluster"
                } else {
                    "redis+cluster"
                };
                write!(f, "{scheme}://")?;
                if let Some(first) = spec.seeds.first() {
                    let shown = crate::net::connector::shown(first);
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
            Kind::Quorum(spec) => {
                // Each master may have credentials and a database of its own: the URL form
                // when they share them, each URL without its password otherwise.
                let shown: Vec<String> = spec
                    .nodes
                    .iter()
                    .map(|u| crate::net::connector::shown(u))
                    .collect();
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

/// `url` with the sentinel port ([`SENTINEL_PORT`]) when it names a host and no port: a bare
/// `redis://host` means the data port to redis-rs, and a sentinel never listens there.
fn with_sentinel_port(url: String) -> String {
    let url = url.trim().to_owned();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url;
    };
    if !scheme.eq_ignore_ascii_case("redis") && !scheme.eq_ignore_ascii_case("rediss") {
        return url;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (authority, has_port) = match host.rsplit_once(':') {
        // An IPv6 address without a port: the last colon is inside the brackets.
        Some((_, port)) if port.contains(']') => (authority, false),
        // `host:` names no port: redis-rs takes it for 6379.
        Some((_, "")) => (&authority[..authority.len() - 1], false),
        Some(_) => (authority, true),
        None => (authority, false),
    };
    if has_port || host.is_empty() {
        return url.clone();
    }
    format!("{scheme}://{authority}:{SENTINEL_PORT}{}", &rest[end..])
}

/// The `host:port` of a sentinel URL, for display.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_owned()
}

/// Parses a `redis+sentinel://` or `rediss+sentinel://` URL; `None` for any other scheme.
fn parse_sentinel_url(url: &str) -> Option<Result<SentinelSpec>> {
    let trimmed = url.trim();
    let (scheme, rest) = trimmed.split_once("://")?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => false,
        "rediss+sentinel" => true,
        _ => return None,
    };
    Some(parse_sentinel_rest(url, rest, tls))
}

fn parse_sentinel_rest(url: &str, rest: &str, tls: bool) -> Result<SentinelSpec> {
    const FORM: &str = "expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]\
                        /master_name[/db][?sentinel_username=U&sentinel_password=P]";
    let wrong = |what: String| {
        Error::invalid(
            "url",
            format!("{}: {what}; {FORM}", crate::net::connector::shown(url)),
        )
    };
    if tls && !cfg!(feature = "tls") {
        return Err(Error::invalid("url", crate::net::connector::TLS_IS_OFF));
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    if before_query.contains('#') || query.contains('#') {
        return Err(wrong("a fragment is not allowed".into()));
    }
    let (authority, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    let (user_info, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => (Some(info), hosts),
        None => (None, authority),
    };
    let (username, password) = match user_info {
        None => (None, None),
        Some(info) => {
            let (user, password) = info.split_once(':').unwrap_or((info, ""));
            let user = decode(user).map_err(wrong)?;
            let password = decode(password).map_err(wrong)?;
            (
                Some(user).filter(|u| !u.is_empty()),
                Some(password).filter(|p| !p.is_empty()),
            )
        }
    };
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value).map_err(wrong)?;
        match name {
            "sentinel_username" => sentinel_username = Some(value),
            "sentinel_password" => sentinel_password = Some(value),
            other => {
                return Err(wrong(format!(
                    "unknown parameter {other:?} (known: sentinel_username, sentinel_password)"
                )))
            }
        }
    }
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let master_name = decode(segments.next().unwrap_or("")).map_err(wrong)?;
    if master_name.is_empty() {
        return Err(wrong("no master name after the hosts".into()));
    }
    let db = match segments.next() {
        None => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| wrong(format!("the database {db:?} is not a number")))?,
    };
    if let Some(extra) = segments.next() {
        return Err(wrong(format!("unexpected {extra:?} after the database")));
    }
    let sentinel_info = match (&sentinel_username, &sentinel_password) {
        (None, None) => String::new(),
        (user, password) => format!(
            "{}:{}@",
            encode(user.as_deref().unwrap_or("")),
            encode(password.as_deref().unwrap_or(""))
        ),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(wrong("an empty host in the list".into()));
        }
        let has_port = match host.rsplit_once(':') {
            // An IPv6 address without a port: the last colon is inside the brackets.
            Some((_, port)) if port.contains(']') => false,
            Some((_, port)) => {
                port.parse::<u16>().map_err(|_| {
                    wrong(format!("the port {port:?} is not a number from 0 to 65535"))
                })?;
                true
            }
            None => false,
        };
        let host = if has_port {
            host.to_owned()
        } else {
            format!("{host}:{SENTINEL_PORT}")
        };
        sentinels.push(format!("{scheme}://{sentinel_info}{host}"));
    }
    let spec = SentinelSpec {
        sentinels,
        master_name,
        username,
        password,
        db,
        misuse: None,
    };
    spec.check()?;
    Ok(spec)
}

/// Parses a `redis+cluster://` or `rediss+cluster://` URL; `None` for any other scheme.
fn parse_cluster_url(url: &str) -> Option<Result<ClusterSpec>> {
    const FORM: &str = "expected redis+cluster://[[user]:password@]host[:port][,host[:port]...]";
    let seeds = parse_hosts_url(url, "cluster", FORM, |after| match after {
        "" | "/" => Ok(String::new()),
        _ => Err(format!(
            "unexpected {after:?} after the hosts (a cluster has database 0 only)"
        )),
    })?;
    Some(seeds.and_then(|seeds| {
        let spec = ClusterSpec { seeds };
        spec.check().map(|()| spec)
    }))
}

/// Parses a `redis+quorum://` or `rediss+quorum://` URL; `None` for any other scheme. The
/// credentials and the database apply to every master.
fn parse_quorum_url(url: &str) -> Option<Result<QuorumSpec>> {
    const FORM: &str =
        "expected redis+quorum://[[user]:password@]host[:port],host[:port],host[:port][...][/db]";
    let nodes = parse_hosts_url(url, "quorum", FORM, |after| {
        match after.trim_end_matches('/') {
            "" => Ok(String::new()),
            path => match path.strip_prefix('/').map(str::parse::<u32>) {
                Some(Ok(db)) => Ok(format!("/{db}")),
                _ => Err(format!("unexpected {after:?} after the hosts")),
            },
        }
    })?;
    Some(nodes.and_then(|nodes| {
        let spec = QuorumSpec { nodes };
        spec.check().map(|()| spec)
    }))
}

/// Parses `redis+<kind>://[[user]:password@]host[:port][,host[:port]...]<path>` (or
/// `rediss+<kind>://`) into one `redis://` (or `rediss://`) URL per host, each with the
/// credentials and with what `path` makes of the part after the hosts (an error message if it
/// refuses it); `None` for any other scheme. `form` ends every error message.
fn parse_hosts_url(
    url: &str,
    kind: &str,
    form: &str,
    path: impl Fn(&str) -> std::result::Result<String, String>,
) -> Option<Result<Vec<String>>> {
    let trimmed = url.trim();
    let (scheme, rest) = trimmed.split_once("://")?;
    let (plain, over_tls) = (format!("redis+{kind}"), format!("rediss+{kind}"));
    let scheme = scheme.to_ascii_lowercase();
    let tls = match scheme {
        _ if scheme == plain => false,
        _ if scheme == over_tls => true,
        _ => return None,
    };
    let wrong = |what: String| {
        Err(Error::invalid(
            "url",
            format!("{}: {what}; {form}", crate::net::connector::shown(url)),
        ))
    };
    if tls && !cfg!(feature = "tls") {
        return Some(Err(Error::invalid(
            "url",
            crate::net::connector::TLS_IS_OFF,
        )));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(end);
    let suffix = match path(after) {
        Ok(suffix) => suffix,
        Err(what) => return Some(wrong(what)),
    };
    let (user_info, hosts) = match authority.rsplit_once('@') {
        Some((info, hosts)) => (format!("{info}@"), hosts),
        None => (String::new(), authority),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let mut urls = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Some(wrong("an empty host in the list".into()));
        }
        if let Some((_, port)) = host.rsplit_once(':').filter(|(_, p)| !p.contains(']')) {
            if port.parse::<u16>().is_err() {
                return Some(wrong(format!(
                    "the port {port:?} is not a number from 0 to 65535"
                )));
            }
        }
        urls.push(format!("{scheme}://{user_info}{host}{suffix}"));
    }
    Some(Ok(urls))
}

/// Percent-decodes `s`.
fn decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| "a % is not followed by two hex digits".to_owned())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded part is not UTF-8".to_owned())
}

/// Percent-encodes what may not stand as is in a URL's user info or path.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> SentinelSpec {
        match url.parse::<Topology>().map(|t| t.kind) {
            Ok(Kind::Sentinel(spec)) => spec,
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
            Ok(Kind::Sentinel(SentinelSpec { db: 3, .. }))
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
        let Kind::Sentinel(spec) = &t.kind else {
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
        let Kind::Cluster(spec) = &t.kind else {
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
            Ok(Kind::Cluster(ClusterSpec { seeds })) if seeds == ["redis://h1:7000"]
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
        let Kind::Quorum(spec) = t.resolve().unwrap() else {
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
