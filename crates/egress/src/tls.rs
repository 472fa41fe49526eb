//! The server name a TLS client asks for, read from its ClientHello before a byte of it is
//! forwarded: inside a `CONNECT` tunnel it must be the name the tunnel was allowed for.

/// What the first bytes of a tunnel are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// Not enough bytes yet for the whole first record.
    Partial,
    /// Not a TLS handshake record (plain TCP through the tunnel).
    NotTls,
    /// A ClientHello, with the `server_name` it carries (none for an IP literal).
    Client { sni: Option<String> },
    /// A TLS record that is not a well-formed ClientHello.
    Malformed,
}

/// A record is at most 2^14 bytes plus its 5-byte header; a ClientHello larger than one record
/// (post-quantum key shares can be) is read across records up to this much.
pub(crate) const MAX_HELLO: usize = 64 * 1024;

pub(crate) fn parse(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Partial;
    }
    if buf[0] != 0x16 {
        return Hello::NotTls;
    }
    // The handshake message may span records: join their payloads.
    let mut payload = Vec::new();
    let mut at = 0;
    loop {
        if buf.len() < at + 5 {
            return Hello::Partial;
        }
        if buf[at] != 0x16 {
            return Hello::Malformed;
        }
        let len = usize::from(u16::from_be_bytes([buf[at + 3], buf[at + 4]]));
        if buf.len() < at + 5 + len {
            return Hello::Partial;
        }
        payload.extend_from_slice(&buf[at + 5..at + 5 + len]);
        at += 5 + len;
        if payload.len() >= 4 {
            let want = 4
                + (usize::from(payload[1]) << 16
                    | usize::from(payload[2]) << 8
                    | usize::from(payload[3]));
            if payload.len() >= want {
                return client_hello(&payload[..want]);
            }
        }
    }
}

fn client_hello(msg: &[u8]) -> Hello {
    let mut r = Reader(msg);
    let parsed = (|| {
        if r.u8()? != 1 {
            return None;
        }
        r.take(3)?; // length
        r.take(2 + 32)?; // legacy version, random
        let sid = usize::from(r.u8()?);
        r.take(sid)?;
        let suites = usize::from(r.u16()?);
        r.take(suites)?;
        let comp = usize::from(r.u8()?);
        r.take(comp)?;
        if r.0.is_empty() {
            return Some(None);
        }
        let ext_len = usize::from(r.u16()?);
        let mut exts = Reader(r.take(ext_len)?);
        while !exts.0.is_empty() {
            let kind = exts.u16()?;
            let len = usize::from(exts.u16()?);
            let body = exts.take(len)?;
            if kind == 0 {
                let mut list = Reader(body);
                let list_len = usize::from(list.u16()?);
                let mut names = Reader(list.take(list_len)?);
                while !names.0.is_empty() {
                    let name_type = names.u8()?;
                    let len = usize::from(names.u16()?);
                    let name = names.take(len)?;
                    if name_type == 0 {
                        return std::str::from_utf8(name).ok().map(|s| Some(s.to_owned()));
                    }
                }
                return None;
            }
        }
        Some(None)
    })();
    match parsed {
        Some(sni) => Hello::Client { sni },
        None => Hello::Malformed,
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
pub(crate) fn client_hello_for(sni: Option<&str>) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
    body.extend_from_slice(&[1, 0]); // null compression
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut list = vec![0u8];
        list.extend_from_slice(&(n.len() as u16).to_be_bytes());
        list.extend_from_slice(n);
        let mut ext = (list.len() as u16).to_be_bytes().to_vec();
        ext.extend_from_slice(&list);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        exts.extend_from_slice(&ext);
    }
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_server_name() {
        let hello = client_hello_for(Some("pypi.org"));
        assert_eq!(
            parse(&hello),
            Hello::Client {
                sni: Some("pypi.org".into())
            }
        );
        assert_eq!(parse(&hello[..hello.len() - 1]), Hello::Partial);
        assert_eq!(parse(&client_hello_for(None)), Hello::Client { sni: None });
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let mut bad = hello.clone();
        bad[5] = 2; // a ServerHello
        assert_eq!(parse(&bad), Hello::Malformed);
    }
}
