//! Where a resolved name may lead: never the host's loopback, link-local (the cloud metadata
//! address 169.254.169.254), private or otherwise special ranges, or the host's own addresses,
//! unless the operator allows a range (`serve --egress-allow-cidr`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address range, `10.0.0.0/8` or `fd00::/8` (a bare address is its /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address range {0:?}: expected ADDRESS/PREFIX, e.g. 127.0.0.0/8")]
pub struct CidrError(pub String);

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = || CidrError(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(err)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, unmap(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(u32::from(net).into(), u32::from(ip).into(), self.prefix, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), self.prefix, 128)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u32) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = bits - u32::from(prefix);
    (a >> shift) == (b >> shift)
}

/// `::ffff:a.b.c.d` is a.b.c.d: a mapped address reaches the same host.
fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why the proxy will not connect to `ip`, or `None` when it may: the operator's ranges first,
/// then the special ranges, then the host's own addresses (`own`).
pub(crate) fn refusal(ip: IpAddr, allowed: &[Cidr], own: &[IpAddr]) -> Option<&'static str> {
    let ip = unmap(ip);
    if allowed.iter().any(|c| c.contains(ip)) {
        return None;
    }
    let special = match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    };
    special.or_else(|| {
        own.contains(&ip)
            .then_some("one of the host's own addresses")
    })
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_link_local() {
        "a link-local address (cloud metadata lives there)"
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        "a private address"
    } else if ip.is_unspecified() || a == 0 {
        "the unspecified address"
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        "a multicast or reserved address"
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 || a == 198 && (18..20).contains(&b) {
        "a special-purpose address"
    } else {
        return None;
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_unspecified() {
        "the unspecified address"
    } else if first & 0xffc0 == 0xfe80 {
        "a link-local address"
    } else if first & 0xfe00 == 0xfc00 {
        "a private (unique local) address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if let Some(v4) = ip.to_ipv4() {
        // IPv4-compatible (::a.b.c.d) and NAT64 forms lead to IPv4 hosts: judge those.
        return special_v4(v4);
    } else if first == 0x64 && ip.segments()[1] == 0xff9b {
        return special_v4(Ipv4Addr::from(u128::from(ip) as u32));
    } else {
        return None;
    })
}

/// The host's own addresses (every interface's), read from /proc: `LOCAL` host routes in
/// `/proc/net/fib_trie` (IPv4) and `/proc/net/if_inet6`. Best effort; the special ranges above
/// already cover the usual ones (loopback, private).
pub(crate) fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        let mut last: Option<Ipv4Addr> = None;
        for line in trie.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix("|-- ").or_else(|| t.strip_prefix("+-- ")) {
                last = rest.split('/').next().and_then(|a| a.parse().ok());
            } else if t.starts_with("/32 host LOCAL") {
                if let Some(ip) = last {
                    out.push(IpAddr::V4(ip));
                }
            }
        }
    }
    if let Ok(v6) = std::fs::read_to_string("/proc/net/if_inet6") {
        for line in v6.lines() {
            if let Some(hex) = line.split_whitespace().next() {
                if let Ok(n) = u128::from_str_radix(hex, 16) {
                    out.push(IpAddr::V6(Ipv6Addr::from(n)));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect(s)
    }

    #[test]
    fn special_ranges_are_refused_unless_allowed() {
        for bad in [
            "127.0.0.1",
            "127.5.6.7",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "224.0.0.1",
        ] {
            assert!(refusal(ip(bad), &[], &[]).is_some(), "{bad}");
        }
        for good in ["151.101.0.223", "2a04:4e42::223", "8.8.8.8"] {
            assert_eq!(refusal(ip(good), &[], &[]), None, "{good}");
        }
        let lo: Cidr = "127.0.0.0/8".parse().expect("cidr");
        assert_eq!(refusal(ip("127.0.0.1"), &[lo], &[]), None);
        assert_eq!(refusal(ip("::ffff:127.0.0.1"), &[lo], &[]), None);
        assert!(refusal(ip("169.254.169.254"), &[lo], &[]).is_some());
        assert!(refusal(ip("8.8.8.8"), &[], &[ip("8.8.8.8")]).is_some());
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let c: Cidr = "10.0.0.0/8".parse().expect("cidr");
        assert!(c.contains(ip("10.255.0.1")) && !c.contains(ip("11.0.0.1")));
        let all: Cidr = "0.0.0.0/0".parse().expect("cidr");
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::2")));
        assert_eq!("::1".parse::<Cidr>().expect("bare").to_string(), "::1/128");
        for bad in ["10.0.0.0/33", "x/8", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_host_has_addresses() {
        assert!(host_addresses().contains(&ip("127.0.0.1")));
    }
}
