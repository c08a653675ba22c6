//! Name resolution behind a trait, and which addresses the proxy refuses to reach.
//!
//! The proxy resolves a name only after a rule allowed it, checks every address the
//! resolver returned, and connects to those same addresses: a second lookup could answer
//! differently (DNS rebinding). When any address is not globally routable, the request is
//! refused unless the rule allows private addresses.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;

/// Turns a host name into addresses. Implemented by [`SystemResolver`]; tests use a fake
/// that records what was asked.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses of `host` (a normalised DNS name, never an IP literal).
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The system's resolver (`getaddrinfo` on a blocking thread, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let found = tokio::net::lookup_host((host, 0)).await?;
        let mut addresses: Vec<IpAddr> = Vec::new();
        for address in found {
            if !addresses.contains(&address.ip()) {
                addresses.push(address.ip());
            }
        }
        Ok(addresses)
    }
}

/// Why an address is not globally routable, or `None` when it is. Covers what an attacker
/// would aim at from a sandbox: loopback, the private ranges, link-local (and with it the
/// cloud metadata address 169.254.169.254), carrier-grade NAT, unique-local IPv6 (with
/// `fd00:ec2::254`), and IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64,
/// 6to4), which are judged by the address they embed.
pub fn non_global_reason(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

fn v4_reason(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = address.octets();
    if address == Ipv4Addr::new(169, 254, 169, 254) {
        Some("the cloud metadata address")
    } else if a == 127 {
        Some("a loopback address")
    } else if a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168) {
        Some("a private address")
    } else if a == 169 && b == 254 {
        Some("a link-local address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a carrier-grade NAT address")
    } else if a == 0 {
        Some("an unspecified address")
    } else if a >= 224 {
        Some("a multicast, reserved or broadcast address")
    } else if (a == 192 && b == 0 && (c == 0 || c == 2))
        || (a == 198 && (b == 18 || b == 19))
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        || (a == 192 && b == 88 && c == 99)
    {
        Some("a reserved address")
    } else {
        None
    }
}

fn v6_reason(address: Ipv6Addr) -> Option<&'static str> {
    let segments = address.segments();
    if let Some(v4) = address.to_ipv4_mapped() {
        return v4_reason(v4);
    }
    if address.is_loopback() {
        return Some("a loopback address");
    }
    if address.is_unspecified() {
        return Some("an unspecified address");
    }
    // ::a.b.c.d (IPv4-compatible, deprecated) and 64:ff9b::a.b.c.d (NAT64) reach the
    // embedded IPv4 address.
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if segments[..6] == [0, 0, 0, 0, 0, 0]
        || (segments[0] == 0x64 && segments[1] == 0xff9b && segments[2..6] == [0, 0, 0, 0])
    {
        return v4_reason(embedded(segments[6], segments[7])).or(Some("an IPv4-embedding address"));
    }
    if segments[0] == 0x2002 {
        // 6to4: the next 32 bits are an IPv4 address.
        return v4_reason(embedded(segments[1], segments[2]));
    }
    match segments[0] {
        s if s & 0xfe00 == 0xfc00 => Some("a unique-local address"),
        s if s & 0xffc0 == 0xfe80 => Some("a link-local address"),
        s if s & 0xffc0 == 0xfec0 => Some("a site-local address"),
        s if s & 0xff00 == 0xff00 => Some("a multicast address"),
        0x2001 if segments[1] == 0x0db8 => Some("a documentation address"),
        0x0100 if segments[1..4] == [0, 0, 0] => Some("a discard-only address"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_global_addresses_are_named() {
        for (address, expected) in [
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("2606:4700::1111", None),
            ("127.0.0.1", Some("a loopback address")),
            ("127.255.0.9", Some("a loopback address")),
            ("10.1.2.3", Some("a private address")),
            ("172.16.0.1", Some("a private address")),
            ("172.31.255.255", Some("a private address")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("a private address")),
            ("169.254.169.254", Some("the cloud metadata address")),
            ("169.254.1.1", Some("a link-local address")),
            ("100.64.0.1", Some("a carrier-grade NAT address")),
            ("0.0.0.0", Some("an unspecified address")),
            (
                "255.255.255.255",
                Some("a multicast, reserved or broadcast address"),
            ),
            (
                "224.0.0.1",
                Some("a multicast, reserved or broadcast address"),
            ),
            ("192.0.2.1", Some("a reserved address")),
            ("::1", Some("a loopback address")),
            ("::", Some("an unspecified address")),
            ("::ffff:127.0.0.1", Some("a loopback address")),
            ("::ffff:169.254.169.254", Some("the cloud metadata address")),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some("a loopback address")),
            ("64:ff9b::a9fe:a9fe", Some("the cloud metadata address")),
            ("2002:7f00:1::", Some("a loopback address")),
            ("fd00:ec2::254", Some("a unique-local address")),
            ("fc00::1", Some("a unique-local address")),
            ("fe80::1", Some("a link-local address")),
            ("ff02::1", Some("a multicast address")),
            ("2001:db8::1", Some("a documentation address")),
        ] {
            let parsed: IpAddr = address.parse().unwrap();
            assert_eq!(non_global_reason(parsed), expected, "{address}");
        }
    }
}
