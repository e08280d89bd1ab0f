//! Where a webhook may deliver. A delivery target is an absolute `http` or `https` URL whose
//! host is not an address inside the platform's own network: loopback, private, link-local,
//! shared (carrier-grade NAT), cloud metadata and other special-purpose addresses are refused
//! (server-side request forgery). The rule is applied to the URL when a webhook is created or
//! updated, and again to every address the host resolves to when a delivery connects, so a
//! name that later resolves inward (DNS rebinding) is refused too. Loopback can be allowed
//! for local development and tests.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why a target is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotAbsoluteHttp,
    Loopback,
    Private,
    LinkLocal,
    SharedAddressSpace,
    CloudMetadata,
    SpecialPurpose,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::NotAbsoluteHttp => "must be an absolute http or https URL with a host",
            Refusal::Loopback => {
                "must not point at a loopback address (for local development, an operator can allow \
                 loopback targets with APP__WEBHOOKS__ALLOW_LOOPBACK=true)"
            }
            Refusal::Private => "must not point at a private network address",
            Refusal::LinkLocal => "must not point at a link-local address",
            Refusal::SharedAddressSpace => "must not point at a shared (carrier-grade NAT) address",
            Refusal::CloudMetadata => "must not point at a cloud metadata service",
            Refusal::SpecialPurpose => "must not point at a special-purpose address",
        }
    }
}

/// The longest delivery URL accepted.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// Checks a delivery URL as written (its host may be a name, checked again at connect time by
/// [`address_refusal`]).
pub fn url_refusal(url: &str, allow_loopback: bool) -> Option<Refusal> {
    if url.len() > MAX_URL_LEN {
        return Some(Refusal::NotAbsoluteHttp);
    }
    let Ok(parsed) = url::Url::parse(url) else { return Some(Refusal::NotAbsoluteHttp) };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Some(Refusal::NotAbsoluteHttp);
    }
    match parsed.host() {
        None => Some(Refusal::NotAbsoluteHttp),
        Some(url::Host::Ipv4(address)) => address_refusal(IpAddr::V4(address), allow_loopback),
        Some(url::Host::Ipv6(address)) => address_refusal(IpAddr::V6(address), allow_loopback),
        Some(url::Host::Domain(name)) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            let local = name == "localhost" || name.ends_with(".localhost");
            (local && !allow_loopback).then_some(Refusal::Loopback)
        }
    }
}

/// Checks one address a delivery would connect to.
pub fn address_refusal(address: IpAddr, allow_loopback: bool) -> Option<Refusal> {
    let refusal = match address {
        IpAddr::V4(v4) => v4_refusal(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => v4_refusal(v4),
            None => v6_refusal(v6),
        },
    };
    match refusal {
        Some(Refusal::Loopback) if allow_loopback => None,
        other => other,
    }
}

fn v4_refusal(address: Ipv4Addr) -> Option<Refusal> {
    let [a, b, c, _] = address.octets();
    if address == Ipv4Addr::new(169, 254, 169, 254) || address == Ipv4Addr::new(100, 100, 100, 200) {
        // AWS, GCP, Azure and others; Alibaba Cloud.
        return Some(Refusal::CloudMetadata);
    }
    Some(if address.is_loopback() {
        Refusal::Loopback
    } else if address.is_private() {
        Refusal::Private
    } else if address.is_link_local() {
        Refusal::LinkLocal
    } else if a == 100 && (64..128).contains(&b) {
        Refusal::SharedAddressSpace
    } else if a == 0
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_documentation()
        || a >= 240
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
    {
        Refusal::SpecialPurpose
    } else {
        return None;
    })
}

fn v6_refusal(address: Ipv6Addr) -> Option<Refusal> {
    let segments = address.segments();
    if segments[..4] == [0xfd00, 0x0ec2, 0, 0] && address.segments()[4..] == [0, 0, 0, 0x254] {
        return Some(Refusal::CloudMetadata);
    }
    Some(if address.is_loopback() {
        Refusal::Loopback
    } else if segments[0] & 0xfe00 == 0xfc00 {
        Refusal::Private
    } else if segments[0] & 0xffc0 == 0xfe80 || segments[0] & 0xffc0 == 0xfec0 {
        Refusal::LinkLocal
    } else if address.is_unspecified() || address.is_multicast() || segments[0] == 0x2001 && segments[1] == 0x0db8 {
        Refusal::SpecialPurpose
    } else {
        return None;
    })
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`)
/// or NAT64 (`64:ff9b::a.b.c.d`) IPv6 address, which reach IPv4 hosts.
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = address.to_ipv4_mapped() {
        return Some(v4);
    }
    let segments = address.segments();
    let tail = Ipv4Addr::from(((u32::from(segments[6])) << 16) | u32::from(segments[7]));
    let compatible = segments[..6] == [0; 6] && !address.is_loopback() && !address.is_unspecified();
    let nat64 = segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then_some(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> Option<Refusal> {
        url_refusal(url, false)
    }

    #[test]
    fn public_http_targets_pass() {
        assert_eq!(refusal("https://hooks.example.com/in?x=1"), None);
        assert_eq!(refusal("http://93.184.216.34:8080/hook"), None);
        assert_eq!(refusal("https://[2606:2800:220:1:248:1893:25c8:1946]/"), None);
    }

    #[test]
    fn malformed_or_other_schemes_are_refused() {
        for url in ["", "hooks.example.com/in", "/relative", "ftp://example.com/", "mailto:a@example.com", "https://"] {
            assert_eq!(refusal(url), Some(Refusal::NotAbsoluteHttp), "{url}");
        }
        assert_eq!(
            refusal(&format!("https://example.com/{}", "a".repeat(MAX_URL_LEN))),
            Some(Refusal::NotAbsoluteHttp)
        );
    }

    #[test]
    fn inward_addresses_are_refused() {
        let cases = [
            ("http://127.0.0.1/", Refusal::Loopback),
            ("http://127.9.9.9/", Refusal::Loopback),
            ("http://localhost:8080/", Refusal::Loopback),
            ("http://api.localhost/", Refusal::Loopback),
            ("http://[::1]/", Refusal::Loopback),
            ("http://10.1.2.3/", Refusal::Private),
            ("http://172.16.0.1/", Refusal::Private),
            ("http://192.168.1.1/", Refusal::Private),
            ("http://[fd12::1]/", Refusal::Private),
            ("http://169.254.1.1/", Refusal::LinkLocal),
            ("http://[fe80::1]/", Refusal::LinkLocal),
            ("http://169.254.169.254/latest/meta-data/", Refusal::CloudMetadata),
            ("http://[fd00:ec2::254]/", Refusal::CloudMetadata),
            ("http://100.100.100.200/", Refusal::CloudMetadata),
            ("http://100.64.0.1/", Refusal::SharedAddressSpace),
            ("http://0.0.0.0/", Refusal::SpecialPurpose),
            ("http://[::]/", Refusal::SpecialPurpose),
            ("http://255.255.255.255/", Refusal::SpecialPurpose),
            ("http://224.0.0.1/", Refusal::SpecialPurpose),
            ("http://[::ffff:127.0.0.1]/", Refusal::Loopback),
            ("http://[::ffff:10.0.0.1]/", Refusal::Private),
            ("http://[64:ff9b::a9fe:a9fe]/", Refusal::CloudMetadata),
            // Numeric forms the URL parser normalises to 127.0.0.1.
            ("http://2130706433/", Refusal::Loopback),
            ("http://0x7f.1/", Refusal::Loopback),
        ];
        for (url, expected) in cases {
            assert_eq!(refusal(url), Some(expected), "{url}");
        }
    }

    #[test]
    fn the_loopback_refusal_names_the_setting_that_allows_it() {
        let message = Refusal::Loopback.message();
        assert!(message.starts_with("must not point at a loopback address"), "{message}");
        assert!(message.contains("APP__WEBHOOKS__ALLOW_LOOPBACK=true"), "{message}");
        assert!(!Refusal::Private.message().contains("APP__"), "only loopback can be allowed");
    }

    #[test]
    fn loopback_can_be_allowed_and_nothing_else_with_it() {
        assert_eq!(url_refusal("http://127.0.0.1:9000/", true), None);
        assert_eq!(url_refusal("http://localhost/", true), None);
        assert_eq!(address_refusal("::1".parse().expect("address"), true), None);
        assert_eq!(url_refusal("http://10.0.0.1/", true), Some(Refusal::Private));
        assert_eq!(url_refusal("http://169.254.169.254/", true), Some(Refusal::CloudMetadata));
    }

    #[test]
    fn resolved_addresses_are_checked_the_same_way() {
        assert_eq!(address_refusal("192.168.0.10".parse().expect("address"), false), Some(Refusal::Private));
        assert_eq!(address_refusal("8.8.8.8".parse().expect("address"), false), None);
        assert_eq!(address_refusal("2001:4860:4860::8888".parse().expect("address"), false), None);
    }
}
