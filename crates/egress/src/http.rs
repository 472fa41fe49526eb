//! The request heads a proxy client sends: `CONNECT host:port` or an absolute-form plain HTTP
//! request (`GET http://host/path`), and the answers the proxy gives of its own.

/// The longest request head the proxy reads.
pub(crate) const MAX_HEAD: usize = 32 * 1024;
const MAX_HEADERS: usize = 100;

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub method: String,
    /// The destination as the request names it (a name or an IP literal, unbracketed).
    pub host: String,
    pub port: u16,
    /// `None` for `CONNECT`; the origin-form target (`/path?query`) otherwise.
    pub path: Option<String>,
    pub headers: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("the request head is not complete yet")]
    Partial,
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("not a proxy request: {0}")]
    NotProxy(&'static str),
}

/// Parses a complete head from `buf`; returns it and its length.
pub(crate) fn parse(buf: &[u8]) -> Result<(Head, usize), HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(HeadError::Partial),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let method = req.method.unwrap_or_default().to_owned();
    let target = req.path.unwrap_or_default();
    let headers: Vec<(String, Vec<u8>)> = req
        .headers
        .iter()
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect();
    let (host, port, path) = if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None).ok_or_else(|| {
            HeadError::Malformed(format!("CONNECT target {target:?} is not host:port"))
        })?;
        (host, port, None)
    } else {
        let rest =
            match target.get(..7) {
                Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &target[7..],
                _ if target.starts_with('/') => return Err(HeadError::NotProxy(
                    "an origin-form request: send absolute-form (GET http://host/path) or CONNECT",
                )),
                _ => {
                    return Err(HeadError::NotProxy(
                        "only http:// URLs in absolute form; https goes through CONNECT",
                    ))
                }
            };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err(HeadError::Malformed("credentials in the URL".into()));
        }
        let (host, port) = split_authority(authority, Some(80))
            .ok_or_else(|| HeadError::Malformed(format!("URL authority {authority:?}")))?;
        (host, port, Some(path))
    };
    let chunked = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"));
    let length = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-length"));
    if chunked && length {
        return Err(HeadError::Malformed(
            "both Transfer-Encoding and Content-Length".into(),
        ));
    }
    Ok((
        Head {
            method,
            host,
            port,
            path,
            headers,
        },
        len,
    ))
}

/// `host:port`, `[v6]:port`, or (with a default port) `host`.
fn split_authority(s: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return None,
        };
        (h, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
        None => default_port?,
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

impl Head {
    pub(crate) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The head sent upstream: origin-form, the client's headers less the hop-by-hop ones and
    /// any the secrets replace, the secrets, and `Connection: close` (one request per
    /// connection: a second request on it cannot be a second, unchecked destination).
    pub(crate) fn upstream(&self, added: &[(&str, &str)]) -> Vec<u8> {
        let mut out = format!(
            "{} {} HTTP/1.1\r\n",
            self.method,
            self.path.as_deref().unwrap_or("/")
        )
        .into_bytes();
        let listed: Vec<String> = self
            .header("connection")
            .map(|v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            if FORWARD_DROPS.contains(&lower.as_str())
                || listed.contains(&lower)
                || added.iter().any(|(a, _)| a.eq_ignore_ascii_case(name))
            {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if self.header("host").is_none() {
            out.extend_from_slice(format!("Host: {}\r\n", self.authority()).as_bytes());
        }
        for (name, value) in added {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }

    fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Hop-by-hop headers, not forwarded (the body's framing, Transfer-Encoding and Content-Length,
/// is, with the body as it comes).
const FORWARD_DROPS: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "upgrade",
];

/// The proxy's own answer, `status` with a plain-text body; the connection ends after it.
pub(crate) fn response(status: u16, reason: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\nX-Runcell-Egress: refused\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<Head, HeadError> {
        parse(s.as_bytes()).map(|(h, _)| h)
    }

    #[test]
    fn parses_connect_and_absolute_form() {
        let h =
            head("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").expect("connect");
        assert_eq!((h.host.as_str(), h.port, h.path), ("pypi.org", 443, None));
        let h = head("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").expect("v6");
        assert_eq!((h.host.as_str(), h.port), ("::1", 8443));
        let h = head("GET http://Example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\n\r\n")
            .expect("get");
        assert_eq!((h.host.as_str(), h.port), ("Example.com", 80));
        assert_eq!(h.path.as_deref(), Some("/a?b=1"));
        let h = head("GET http://h:8080?q HTTP/1.1\r\n\r\n").expect("query");
        assert_eq!((h.port, h.path.as_deref()), (8080, Some("/?q")));
        assert_eq!(head("GET http://h:8").map(|_| ()), Err(HeadError::Partial));
        for bad in [
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET https://x/ HTTP/1.1\r\n\r\n",
            "CONNECT pypi.org HTTP/1.1\r\n\r\n",
            "CONNECT a:b:443 HTTP/1.1\r\n\r\n",
            "GET http://u:p@x/ HTTP/1.1\r\n\r\n",
            "POST http://x/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            assert!(head(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_upstream_head_drops_hop_headers_and_adds_secrets() {
        let h = head(
            "GET http://x.test:81/p HTTP/1.1\r\nProxy-Authorization: a\r\nConnection: keep-alive, X-Drop\r\n\
             X-Drop: 1\r\nAuthorization: mine\r\nAccept: */*\r\n\r\n",
        )
        .expect("head");
        let up = String::from_utf8(h.upstream(&[("Authorization", "Bearer s")])).expect("utf8");
        assert_eq!(
            up,
            "GET /p HTTP/1.1\r\nAccept: */*\r\nHost: x.test:81\r\nAuthorization: Bearer s\r\nConnection: close\r\n\r\n"
        );
    }
}
