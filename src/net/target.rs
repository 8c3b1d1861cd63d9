//! What a client connects to, resolved: one server's URL, the sentinels and the master they
//! name, a Redis Cluster's seeds, or a quorum's masters; and the checks that make it one the
//! connector can open.
//!
//! The description users build and see, the public `Topology` with its setters, lives above
//! `net/`; a client's build resolves it into a [`Target`] and hands that to [`Connector::open`].
//! The URL forms are parsed in `url.rs`; what they describe, and the checks of that description
//! (a quorum's size, TLS all or nothing), are here.
//!
//! [`Connector::open`]: crate::net::connector::Connector::open

use crate::error::{Error, Result};
use crate::net::url::{self, server_of, shown};

/// The fewest masters a quorum takes: with fewer, one master down stops every lock.
pub const QUORUM_MIN_NODES: usize = 3;

/// What to connect to. A target that [`Target::check`] passed (every one that
/// [`Target::parse`] returns) is one the connector can open; a single server's URL is checked
/// when its client is made, with the TLS settings.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server, at a `redis://`, `rediss://`, `redis+unix://` or `unix://` URL.
    Single(String),
    Sentinel(SentinelSpec),
    Cluster(ClusterSpec),
    Quorum(QuorumSpec),
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
}

/// The seed nodes of a Redis Cluster: `redis://` (or `rediss://`) URLs, each with the
/// credentials of the cluster's nodes. Every node found later is reached with the first seed's
/// credentials and scheme.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ClusterSpec {
    pub(crate) seeds: Vec<String>,
}

/// The independent masters of a quorum: `redis://` (or `rediss://`) URLs, each with its own
/// credentials and database.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct QuorumSpec {
    pub(crate) nodes: Vec<String>,
}

impl Target {
    /// A URL of several servers (`redis+sentinel://`, `redis+cluster://`, `redis+quorum://` or
    /// their `rediss+` forms), parsed and checked; `None` for a single server's URL.
    pub(crate) fn parse(url: &str) -> Option<Result<Target>> {
        if let Some(parsed) = url::sentinel(url) {
            return Some(parsed.and_then(SentinelSpec::checked).map(Target::Sentinel));
        }
        if let Some(seeds) = url::cluster(url) {
            return Some(seeds.and_then(|seeds| {
                let spec = ClusterSpec { seeds };
                spec.check().map(|()| Target::Cluster(spec))
            }));
        }
        let nodes = url::quorum(url)?;
        Some(nodes.and_then(|nodes| {
            let spec = QuorumSpec { nodes };
            spec.check().map(|()| Target::Quorum(spec))
        }))
    }

    /// Checks a target made by hand: what [`parse`](Target::parse) checks of one it parsed. A
    /// single server's URL passes here; the connector checks it with the TLS settings.
    pub(crate) fn check(&self) -> Result<()> {
        match self {
            Target::Single(_) => Ok(()),
            Target::Sentinel(spec) => spec.check(),
            Target::Cluster(spec) => spec.check(),
            Target::Quorum(spec) => spec.check(),
        }
    }
}

impl SentinelSpec {
    /// The spec that a `redis+sentinel://` URL names, checked.
    fn checked(parsed: url::SentinelUrl) -> Result<SentinelSpec> {
        let url::SentinelUrl {
            sentinels,
            master_name,
            username,
            password,
            db,
        } = parsed;
        let spec = SentinelSpec {
            sentinels,
            master_name,
            username,
            password,
            db,
        };
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<()> {
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
                        shown(url)
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
            url::check(url)?;
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
                    shown(url)
                ));
            }
            url::check(url)?;
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
