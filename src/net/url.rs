//! Every URL form a client takes: parsed, checked and shown without its password.
//!
//! | form | parsed by | into |
//! |---|---|---|
//! | `redis://`, `rediss://`, `redis+unix://`, `unix://` | [`client`] (redis-rs' parser, with [`check_url`] saying what it refused) | a `redis::Client` |
//! | `redis+sentinel://`, `rediss+sentinel://` | [`sentinel`] | the sentinels' `redis://` URLs and the master's name, credentials and database |
//! | `redis+cluster://`, `rediss+cluster://` | [`cluster`] | one `redis://` URL per seed |
//! | `redis+quorum://`, `rediss+quorum://` | [`quorum`] | one `redis://` URL per master |
//!
//! Each form's error message ends with the form expected, and names the URL by [`shown`], never
//! with its password. What the parsed URLs describe, and the checks of that description (a
//! quorum's size, TLS all or nothing), are `target.rs`'s.

use crate::error::{Error, Result};
use crate::net::tls::{self, TlsSettings, TLS_IS_OFF};

/// The port of a sentinel whose URL gives none.
pub const SENTINEL_PORT: u16 = 26379;

/// Checks a single server's URL as a client's build would, without TLS settings.
pub(crate) fn check(url: &str) -> Result<()> {
    client(url, &TlsSettings::default()).map(drop)
}

/// A client for `url`, with Nagle's algorithm off on its connections. redis-rs leaves it on,
/// and then a pipeline that spans several TCP segments (a renewal batch) can wait for a delayed
/// ACK: batches of a few hundred extends took 100-400 ms on loopback, long enough to lose leases.
/// redis-rs applies these TCP settings to the socket under a TLS stream too.
pub(crate) fn client(url: &str, tls: &TlsSettings) -> Result<redis::Client> {
    let parsed = redis::Client::open(url);
    if parsed.is_err() {
        // Say what is wrong, where redis-rs says only that the URL did not parse.
        check_url(url)?;
    }
    let invalid = |e: redis::RedisError| {
        Error::invalid(
            "url",
            format!(
                "{url_shown} does not parse ({e}); {FORMS}",
                url_shown = shown(url)
            ),
        )
    };
    let info = parsed.map_err(invalid)?.get_connection_info().clone();
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    let info = info.set_tcp_settings(tcp);
    if let redis::ConnectionAddr::TcpTls { host, insecure, .. } = info.addr() {
        if *insecure {
            return Err(Error::invalid(
                "url",
                format!(
                    "{}: certificate checks cannot be turned off (`#insecure`); trust the \
                     server's CA with tls_root_certificates instead",
                    shown(url)
                ),
            ));
        }
        tls::check_server_name(host).map_err(|why| Error::invalid("url", why))?;
        return tls::client(info, tls);
    }
    if tls.is_set() {
        return Err(Error::invalid(
            "url",
            format!(
                "TLS settings were given, but {} is not a rediss:// URL: its connections would \
                 not be encrypted",
                shown(url)
            ),
        ));
    }
    redis::Client::open(info).map_err(invalid)
}

/// The URL forms a client accepts, for error messages.
#[cfg(not(feature = "tls"))]
const FORMS: &str = "expected redis://[[user]:password@]host[:port][/db], \
                     redis+unix:///path/to/socket[?db=N] or unix:///path/to/socket";
#[cfg(feature = "tls")]
const FORMS: &str = "expected redis://[[user]:password@]host[:port][/db], \
                     rediss://[[user]:password@]host[:port][/db] (TLS), \
                     redis+unix:///path/to/socket[?db=N] or unix:///path/to/socket";

/// Says what is wrong with a URL that redis-rs' parser refused (it says only that the URL did
/// not parse). `Ok` if nothing here explains it.
fn check_url(url: &str) -> Result<()> {
    let wrong = |what: String| Err(Error::invalid("url", format!("{what}; {FORMS}")));
    if url.trim().is_empty() {
        return wrong("the URL is empty".into());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return wrong(no_scheme(url));
    };
    match scheme {
        "redis" => {}
        "redis+unix" | "unix" => return Ok(()),
        // redis-rs takes a fragment for a switch, and knows only `#insecure`.
        "rediss" if cfg!(feature = "tls") && url.contains('#') => {
            return wrong(format!(
                "{} has a fragment; certificate checks cannot be turned off: trust the \
                 server's CA with tls_root_certificates instead",
                shown(url)
            ))
        }
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => return wrong(TLS_IS_OFF.into()),
        other => return wrong(format!("the scheme {other}:// is not a Redis scheme")),
    }
    // The authority: what comes before the path, after any user info.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.contains(',') {
        return wrong(format!(
            "{} names several hosts; for the master that sentinels name, write \
             redis+sentinel://host1:port1,host2:port2/master_name",
            shown(url)
        ));
    }
    if host_port.is_empty() {
        return wrong(format!("{} has no host", shown(url)));
    }
    // A port after the last colon, unless the colon is inside an IPv6 address's brackets.
    if let Some((_, port)) = host_port.rsplit_once(':').filter(|(_, p)| !p.contains(']')) {
        if port.parse::<u16>().is_err() {
            return wrong(format!("the port {port:?} is not a number from 0 to 65535"));
        }
    }
    let path = rest[authority.len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or("");
    let db = path.trim_start_matches('/');
    if !db.is_empty() && db.parse::<i64>().is_err() {
        return wrong(format!("the database {db:?} is not a number"));
    }
    Ok(())
}

/// What to say of a URL without `://`: a scheme written with a wrong separator
/// (`redis//host:port/`, `redis:host`) is told how to write it; anything else as a host and
/// port, which a scheme turns into a URL.
fn no_scheme(url: &str) -> String {
    const SCHEMES: [&str; 7] = [
        "redis",
        "rediss",
        "redis+unix",
        "unix",
        "redis+sentinel",
        "redis+cluster",
        "redis+quorum",
    ];
    let url = url.trim();
    if let Some((head, _)) = url.split_once([':', '/']) {
        let scheme = head.to_ascii_lowercase();
        let rest = url[head.len()..]
            .trim_start_matches(':')
            .trim_start_matches('/');
        if SCHEMES.contains(&scheme.as_str()) && !rest.is_empty() {
            return format!(
                "the URL has no `://` after its scheme (write {})",
                shown(&format!("{scheme}://{rest}"))
            );
        }
    }
    // Shown as the URL it would be, whose password is masked.
    let fixed = shown(&format!("redis://{url}"));
    format!(
        "{} has no scheme (for a host and port, write {fixed})",
        fixed.trim_start_matches("redis://"),
    )
}

/// A URL as it may appear in a message: without its password.
pub(crate) fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // `unix:/path?pass=...`: no user info, but the query may carry a password.
        return url.split(['?', '#']).next().unwrap_or("").to_owned();
    };
    // The last `@` ends the user info even when the password holds `/`, `?` or `#`; what
    // follows the host (a query may carry a password too) is left out.
    let masked = match rest.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{user}:***@{host}")
        }
        None => rest.to_owned(),
    };
    let masked = masked.split(['?', '#']).next().unwrap_or("");
    format!("{scheme}://{masked}")
}

/// The host (lower case) and port (6379 when none is given) of a `redis://` URL.
pub(crate) fn server_of(url: &str) -> (String, String) {
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

/// `url` with the sentinel port ([`SENTINEL_PORT`]) when it names a host and no port: a bare
/// `redis://host` means the data port to redis-rs, and a sentinel never listens there.
pub(crate) fn with_sentinel_port(url: String) -> String {
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
pub(crate) fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_owned()
}

/// What a `redis+sentinel://` URL names.
#[derive(Debug)]
pub(crate) struct SentinelUrl {
    /// `redis://` (or `rediss://`) URLs of the sentinels, with the sentinels' credentials.
    pub(crate) sentinels: Vec<String>,
    pub(crate) master_name: String,
    /// The data nodes' credentials.
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// Parses a `redis+sentinel://` or `rediss+sentinel://` URL; `None` for any other scheme.
pub(crate) fn sentinel(url: &str) -> Option<Result<SentinelUrl>> {
    let trimmed = url.trim();
    let (scheme, rest) = trimmed.split_once("://")?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => false,
        "rediss+sentinel" => true,
        _ => return None,
    };
    Some(sentinel_rest(url, rest, tls))
}

fn sentinel_rest(url: &str, rest: &str, tls: bool) -> Result<SentinelUrl> {
    const FORM: &str = "expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]\
                        /master_name[/db][?sentinel_username=U&sentinel_password=P]";
    let wrong = |what: String| Error::invalid("url", format!("{}: {what}; {FORM}", shown(url)));
    if tls && !cfg!(feature = "tls") {
        return Err(Error::invalid("url", TLS_IS_OFF));
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
    Ok(SentinelUrl {
        sentinels,
        master_name,
        username,
        password,
        db,
    })
}

/// Parses a `redis+cluster://` or `rediss+cluster://` URL into its seeds' URLs; `None` for any
/// other scheme.
pub(crate) fn cluster(url: &str) -> Option<Result<Vec<String>>> {
    const FORM: &str = "expected redis+cluster://[[user]:password@]host[:port][,host[:port]...]";
    hosts(url, "cluster", FORM, |after| match after {
        "" | "/" => Ok(String::new()),
        _ => Err(format!(
            "unexpected {after:?} after the hosts (a cluster has database 0 only)"
        )),
    })
}

/// Parses a `redis+quorum://` or `rediss+quorum://` URL into its masters' URLs; `None` for any
/// other scheme. The credentials and the database apply to every master.
pub(crate) fn quorum(url: &str) -> Option<Result<Vec<String>>> {
    const FORM: &str =
        "expected redis+quorum://[[user]:password@]host[:port],host[:port],host[:port][...][/db]";
    hosts(url, "quorum", FORM, |after| {
        match after.trim_end_matches('/') {
            "" => Ok(String::new()),
            path => match path.strip_prefix('/').map(str::parse::<u32>) {
                Some(Ok(db)) => Ok(format!("/{db}")),
                _ => Err(format!("unexpected {after:?} after the hosts")),
            },
        }
    })
}

/// Parses `redis+<kind>://[[user]:password@]host[:port][,host[:port]...]<path>` (or
/// `rediss+<kind>://`) into one `redis://` (or `rediss://`) URL per host, each with the
/// credentials and with what `path` makes of the part after the hosts (an error message if it
/// refuses it); `None` for any other scheme. `form` ends every error message.
fn hosts(
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
            format!("{}: {what}; {form}", shown(url)),
        ))
    };
    if tls && !cfg!(feature = "tls") {
        return Some(Err(Error::invalid("url", TLS_IS_OFF)));
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

    fn client(url: &str) -> Result<redis::Client> {
        super::client(url, &TlsSettings::default())
    }

    fn reason(url: &str) -> String {
        match client(url) {
            Err(Error::InvalidArgument {
                what: "url",
                reason,
            }) => reason,
            Err(other) => panic!("{url:?}: {other}"),
            Ok(_) => panic!("{url:?} was accepted"),
        }
    }

    #[test]
    fn says_what_is_wrong_with_a_url() {
        for (url, says) in [
            ("", "empty"),
            ("   ", "empty"),
            ("localhost:6379", "write redis://localhost:6379"),
            ("redis//127.0.0.1:27001/", "write redis://127.0.0.1:27001/"),
            ("redis//:hunter2@h:1/", "write redis://:***@h:1/"),
            (":hunter2@h:1", "write redis://:***@h:1"),
            ("redis:/127.0.0.1:6379", "write redis://127.0.0.1:6379"),
            ("rediss//h:6380", "write rediss://h:6380"),
            ("http://localhost/", "not a Redis scheme"),
            ("redis://a:6379,b:6379/", "several hosts"),
            ("redis://localhost:99999/", "port \"99999\""),
            ("redis://localhost:63x9/", "port"),
            ("redis://", "no host"),
        ] {
            let reason = reason(url);
            assert!(reason.contains(says), "{url:?}: {reason}");
            assert!(reason.contains("expected redis://"), "{url:?}: {reason}");
        }
    }

    #[test]
    #[cfg(not(feature = "tls"))]
    fn rediss_needs_the_tls_feature() {
        let reason = reason("rediss://localhost/");
        assert!(reason.contains("build with the `tls` feature"), "{reason}");
    }

    #[test]
    #[cfg(feature = "tls")]
    fn tls_connections_keep_nagle_off() {
        // redis-rs applies the TCP settings to the socket under the TLS stream as well.
        let client = client("rediss://localhost:6380/").unwrap();
        let info = client.get_connection_info();
        assert!(matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }));
        assert!(info.tcp_settings().nodelay());
        let plain = super::client("redis://localhost/", &TlsSettings::default()).unwrap();
        assert!(plain.get_connection_info().tcp_settings().nodelay());
    }

    #[test]
    fn accepts_the_documented_forms() {
        for url in [
            "redis://127.0.0.1:6379/",
            "redis://127.0.0.1",
            "redis://:secret@127.0.0.1:6379/2",
            "redis://user:secret@localhost:6379/0",
            "redis://[::1]:6379/",
            "redis+unix:///tmp/redis.sock",
            "unix:///tmp/redis.sock?db=1",
            // Forms redis-rs accepts that a stricter check of ours once refused.
            "redis://127.0.0.1:6379/0\n",
            " redis://127.0.0.1:6379/",
            "REDIS://127.0.0.1:6379/",
            "redis://127.0.0.1:6379/0/",
            "redis://127.0.0.1:/",
            "unix:/tmp/redis.sock",
        ] {
            assert!(client(url).is_ok(), "{url:?}: {:?}", client(url).err());
        }
    }

    #[test]
    fn keeps_passwords_out_of_messages() {
        for (url, shows) in [
            ("unix:///tmp/x.sock?pass=hunter2", "unix:///tmp/x.sock"),
            ("redis://:pa/ss@h1/", "redis://:***@h1/"),
            ("redis://:hun?ter2@h1/", "redis://:***@h1/"),
            (
                "redis+sentinel://h1/m?sentinel_password=hunter2",
                "redis+sentinel://h1/m",
            ),
        ] {
            assert_eq!(shown(url), shows);
        }
        let reason = reason("redis://user:hunter2@a:1,b:2/");
        assert!(!reason.contains("hunter2"), "{reason}");
        assert!(reason.contains("user:***@a:1,b:2"), "{reason}");
    }
}
