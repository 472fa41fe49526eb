//! Which `Host` and `Origin` a request may carry, on every route, open mode and keys alike.
//!
//! Two browser attacks reach a server on 127.0.0.1 from any web page the operator visits:
//! DNS rebinding (the page's own name is made to resolve to 127.0.0.1, so its scripts read
//! and call the API as "same origin"; the request still names the page's host in `Host`) and
//! cross-site requests (a plain HTML form may POST multipart or urlencoded bodies anywhere,
//! without a CORS preflight). The first is refused by answering only to the server's own
//! names, the second by refusing every state-changing request whose `Origin` or
//! `Sec-Fetch-Site` says it came from another origin. Clients that are not browsers (curl,
//! SDKs, MCP clients) send neither header and are unaffected.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, Uri};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ApiError;

/// A host as a request names it: a DNS name (lowercased) or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostName {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostName::Name(n) => f.write_str(n),
            HostName::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            HostName::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// `host[:port]` (RFC 3986 authority without user info): a reg-name, an IPv4 address or a
/// bracketed IPv6 address, and an optional decimal port. Anything else is `None`.
fn parse_authority(s: &str) -> Option<(HostName, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (HostName::Ip(IpAddr::V6(ip)), port)
    } else {
        let (h, p) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        let name_byte = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
        if h.is_empty() || !h.bytes().all(name_byte) {
            return None;
        }
        let host = match h.parse::<Ipv4Addr>() {
            Ok(ip) => HostName::Ip(IpAddr::V4(ip)),
            Err(_) => HostName::Name(h.to_ascii_lowercase()),
        };
        (host, p)
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    Some((host, port))
}

/// One `serve --allowed-hosts` entry: a name (or IP) the server also answers to, e.g. the
/// public name a reverse proxy forwards. `name` allows it on any port; `name:port` only on
/// that port (a `Host` without a port then matches when the port is 80 or 443, the default
/// ports a client omits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    host: HostName,
    port: Option<u16>,
}

impl FromStr for AllowedHost {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (host, port) = parse_authority(s.trim()).ok_or_else(|| {
            format!("{s:?} is not a host name or IP address with an optional :port")
        })?;
        Ok(AllowedHost { host, port })
    }
}

impl AllowedHost {
    /// `port` is the request's: `None` when its `Host` carries none.
    fn matches(&self, host: &HostName, port: Option<u16>) -> bool {
        self.host == *host
            && match (self.port, port) {
                (None, _) => true,
                (Some(want), Some(got)) => want == got,
                (Some(want), None) => want == 80 || want == 443,
            }
    }
}

/// The names a server answers to: those of its listener, and the operator's extra ones.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    listen: SocketAddr,
    allowed: Vec<AllowedHost>,
}

impl HostPolicy {
    pub(crate) fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            allowed: Vec::new(),
        }
    }

    pub(crate) fn allow(&mut self, hosts: impl IntoIterator<Item = AllowedHost>) {
        self.allowed.extend(hosts);
    }

    /// The same names, for another listener of the same server (the metrics one).
    pub(crate) fn rebound(&self, listen: SocketAddr) -> Self {
        Self {
            listen,
            allowed: self.allowed.clone(),
        }
    }

    /// Whether `host` (with the port the request names, `None` when it names none) is this
    /// server. Its own names need the listener's port: another port on localhost is another
    /// server (a page served from there is another origin).
    fn answers_to(&self, host: &HostName, port: Option<u16>) -> bool {
        if self.allowed.iter().any(|a| a.matches(host, port)) {
            return true;
        }
        // Plain HTTP: a missing port is 80.
        if port.unwrap_or(80) != self.listen.port() {
            return false;
        }
        match host {
            // Browsers resolve `localhost` themselves, to loopback: no page can rebind it.
            HostName::Name(n) => n == "localhost",
            // An IP literal cannot be rebound either: a page whose origin is that IP is
            // served by whoever answers there. Loopback always reaches this machine; the
            // listener's own address is this server; a wildcard listener (0.0.0.0, ::) has
            // addresses that cannot all be known, so any IP literal on its port is its own.
            HostName::Ip(ip) => {
                let ip = ip.to_canonical();
                ip.is_loopback()
                    || ip == self.listen.ip().to_canonical()
                    || self.listen.ip().is_unspecified()
            }
        }
    }

    /// The names the server answers to, for a refusal's message.
    fn describe(&self) -> String {
        let port = self.listen.port();
        let mut names = vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        let ip = self.listen.ip();
        if ip.is_unspecified() {
            names.push(format!("any IP address of this machine with port {port}"));
        } else if !ip.is_loopback() {
            names.push(self.listen.to_string());
        }
        names.extend(self.allowed.iter().map(|a| match a.port {
            Some(p) => format!("{}:{p}", a.host),
            None => a.host.to_string(),
        }));
        names.join(", ")
    }

    /// Refuses a request that names another host, or that changes state on behalf of a page
    /// of another origin.
    fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        self.check_host(uri, headers)?;
        // Reads are not refused: without CORS headers a page of another origin cannot read
        // the reply, and a GET changes nothing. Except on `/mcp`, where MCP's transport
        // (streamable HTTP, "Security Warning") requires every request's `Origin` checked:
        // its GET opens a session's event stream.
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) && uri.path() != "/mcp" {
            return Ok(());
        }
        self.check_origin(headers)
    }

    fn check_host(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        let mut hosts = headers.get_all(header::HOST).iter();
        let host = match (hosts.next(), hosts.next()) {
            (Some(_), Some(_)) => {
                return Err(ApiError::forbidden(
                    "the request has more than one Host header",
                ))
            }
            (Some(h), None) => Some(
                h.to_str()
                    .map_err(|_| ApiError::forbidden("the request's Host header is not text"))?,
            ),
            (None, _) => None,
        };
        // HTTP/2 names the host in `:authority`; an absolute-form HTTP/1.1 target names it in
        // the URI, which then wins over `Host` (RFC 9112 §3.2.2): both must be this server.
        let authority = uri.authority().map(|a| a.as_str());
        if host.is_none() && authority.is_none() {
            return Err(ApiError::forbidden(
                "the request has no Host header: this server answers only to its own names \
                 (add one with --allowed-hosts)",
            ));
        }
        for name in [host, authority].into_iter().flatten() {
            let ok = parse_authority(name).is_some_and(|(h, p)| self.answers_to(&h, p));
            if !ok {
                tracing::warn!(host = %shown(name), "refused a request for another host (DNS rebinding?)");
                return Err(ApiError::forbidden(self.host_refusal(name)));
            }
        }
        Ok(())
    }

    fn host_refusal(&self, name: &str) -> String {
        let hint = match parse_authority(name) {
            Some((h, _)) => format!("--allowed-hosts {h}"),
            None => "--allowed-hosts NAME".to_owned(),
        };
        format!(
            "this server does not answer to the host {:?} (it answers to {}); to serve it \
             under that name, behind a reverse proxy say, start it with {hint}",
            shown(name),
            self.describe()
        )
    }

    fn check_origin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let text = origin.to_str().unwrap_or("");
            if !self.own_origin(text) {
                tracing::warn!(origin = %shown(text), "refused a cross-origin request");
                return Err(ApiError::forbidden(format!(
                    "cross-origin request refused: Origin {:?} is not this server's own \
                     origin, and only its own page may change anything here (a reverse \
                     proxy's public name is allowed with --allowed-hosts NAME)",
                    shown(text)
                )));
            }
        }
        // Browsers send it on every request; anything but a request from the page itself
        // (`same-origin`) or one the user typed (`none`) came from another page.
        if let Some(site) = headers.get("sec-fetch-site") {
            let text = site.to_str().unwrap_or("");
            if !matches!(text, "same-origin" | "none") {
                tracing::warn!(sec_fetch_site = %shown(text), "refused a cross-site request");
                return Err(ApiError::forbidden(format!(
                    "cross-site request refused (Sec-Fetch-Site: {:?}): only this server's \
                     own page may change anything here",
                    shown(text)
                )));
            }
        }
        Ok(())
    }

    /// Whether `origin` (`scheme://host[:port]`) is one of this server's: `null` (sandboxed
    /// frames, `file:` pages) and every other scheme are not.
    fn own_origin(&self, origin: &str) -> bool {
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        let default = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return false,
        };
        parse_authority(authority)
            .is_some_and(|(h, p)| self.answers_to(&h, Some(p.unwrap_or(default))))
    }
}

/// A header value as a message shows it: bounded, so a refusal cannot be made huge.
fn shown(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The middleware in front of every route: 403 `forbidden` before any handler runs.
pub(crate) async fn guard(
    State(hosts): State<Arc<HostPolicy>>,
    req: Request,
    next: Next,
) -> Response {
    match hosts.check(req.method(), req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => crate::vendor::refusal(req.uri().path(), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(listen: &str, allowed: &[&str]) -> HostPolicy {
        let mut p = HostPolicy::new(listen.parse().expect("addr"));
        p.allow(allowed.iter().map(|a| a.parse().expect("allowed host")));
        p
    }

    fn host_ok(p: &HostPolicy, host: &str) -> bool {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().expect("header"));
        p.check_host(&Uri::from_static("/"), &h).is_ok()
    }

    #[test]
    fn mcp_checks_the_origin_of_reads_too() {
        let p = policy("127.0.0.1:8080", &[]);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().expect("header"));
        h.insert(
            header::ORIGIN,
            "http://evil.example".parse().expect("header"),
        );
        let get = |path: &'static str| p.check(&Method::GET, &Uri::from_static(path), &h);
        assert!(get("/mcp").is_err(), "GET /mcp opens an MCP event stream");
        assert!(get("/v1/sessions").is_ok(), "other reads are answered");
        h.insert(
            header::ORIGIN,
            "http://127.0.0.1:8080".parse().expect("header"),
        );
        assert!(p.check(&Method::GET, &Uri::from_static("/mcp"), &h).is_ok());
    }

    #[test]
    fn own_names_need_the_listeners_port() {
        let p = policy("127.0.0.1:8080", &[]);
        for ok in [
            "localhost:8080",
            "LOCALHOST:8080",
            "127.0.0.1:8080",
            "127.3.4.5:8080",
            "[::1]:8080",
        ] {
            assert!(host_ok(&p, ok), "{ok}");
        }
        for bad in [
            "localhost:8081",
            "localhost",
            "127.0.0.1",
            "evil.example:8080",
            "localhost.evil.example:8080",
            "10.0.0.1:8080",
            "[::1]",
            "localhost:",
            "localhost:80:80",
            "user@localhost:8080",
            "localhost:99999",
            "",
        ] {
            assert!(!host_ok(&p, bad), "{bad}");
        }
        assert!(host_ok(&policy("127.0.0.1:80", &[]), "localhost"));
    }

    #[test]
    fn listener_addresses_and_allowed_names() {
        let p = policy(
            "10.1.2.3:8080",
            &["runcell.example.com", "proxy.example:8443"],
        );
        assert!(host_ok(&p, "10.1.2.3:8080"));
        assert!(!host_ok(&p, "10.1.2.4:8080"));
        assert!(host_ok(&p, "runcell.example.com"));
        assert!(host_ok(&p, "Runcell.Example.Com:9999"));
        assert!(host_ok(&p, "proxy.example:8443"));
        assert!(!host_ok(&p, "proxy.example:8444"));
        assert!(!host_ok(&p, "proxy.example"));
        assert!(host_ok(
            &policy("127.0.0.1:1", &["p.example:443"]),
            "p.example"
        ));
        let any = policy("0.0.0.0:8080", &[]);
        assert!(host_ok(&any, "192.168.7.7:8080"));
        assert!(!host_ok(&any, "192.168.7.7:8081"));
        assert!(!host_ok(&any, "evil.example:8080"));
        assert!("a b".parse::<AllowedHost>().is_err());
        assert!("host:port".parse::<AllowedHost>().is_err());
    }

    #[test]
    fn origins_are_the_servers_own_or_refused() {
        let p = policy("127.0.0.1:8080", &["runcell.example.com"]);
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "https://runcell.example.com",
        ] {
            assert!(p.own_origin(ok), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example",
            "http://127.0.0.1:8081",
            "http://localhost",
            "file://",
            "chrome-extension://abc",
            "http://127.0.0.1:8080/path",
            "",
        ] {
            assert!(!p.own_origin(bad), "{bad}");
        }
    }
}
