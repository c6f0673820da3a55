//! Key extractors: which part of a request a [`RateLimitLayer`](super::RateLimitLayer) counts
//! against.

use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::{HeaderName, StatusCode};

use crate::error::{Error, Result};

/// Picks the rate-limit key of a request from its head (a key never needs the body).
///
/// `None` means the request carries no key: it is answered `400` (or the status
/// [`missing_status`](KeyExtractor::missing_status) gives) without a store call. A returned
/// key is validated by the key rules ([`KeyPart`](crate::key::KeyPart): `[A-Za-z0-9._@-]`, at most
/// 64 bytes); one that breaks them is a `400` too.
///
/// Any `Fn(&http::request::Parts) -> Option<String>` is one:
///
/// ```
/// use redguard::http::RateLimitLayer;
///
/// let per_tenant = RateLimitLayer::builder(|parts: &http::request::Parts| {
///     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
/// })
/// .limit("tenant", "1000/min")
/// .build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of this request, or `None` when it has none.
    fn extract(&self, parts: &Parts) -> Option<String>;

    /// The status of a request without a key: `400 Bad Request` unless the extractor says
    /// otherwise (no peer address is the server's fault, not the client's).
    fn missing_status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}

/// One key for every request: a global limit.
///
/// ```
/// let layer = redguard::http::RateLimitLayer::builder(redguard::http::Global)
///     .limit("api", "5000/s")
///     .build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _parts: &Parts) -> Option<String> {
        Some("global".to_owned())
    }
}

/// The value of a request header (an API key, a tenant id). Absent or not visible ASCII:
/// no key (`400`).
///
/// ```
/// use redguard::http::{HeaderKey, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder(HeaderKey::new("x-api-key")?)
///     .limit("api-key", "100/min")
///     .build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey(HeaderName);

impl HeaderKey {
    /// Keys on header `name`; a name that is not a valid header name is
    /// [`Error::Config`].
    pub fn new(name: &str) -> Result<HeaderKey> {
        HeaderName::try_from(name)
            .map(HeaderKey)
            .map_err(|_| Error::Config(format!("`{name}` is not a valid header name")))
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let value = parts.headers.get(&self.0)?.to_str().ok()?;
        Some(value.trim().to_owned())
    }
}

/// The `n`th segment of the request path, counted from 0 (`/users/42/orders`: segment 1 is
/// `42`). Key on ids this way, never on the whole raw path, which would make one limit per
/// URL.
///
/// ```
/// use redguard::http::{PathSegment, RateLimitLayer};
///
/// // `/users/{id}/...`: one limit per user id.
/// let layer = RateLimitLayer::builder(PathSegment(1)).limit("user", "10/s").build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PathSegment(pub usize);

impl KeyExtractor for PathSegment {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let path = parts.uri.path().strip_prefix('/')?;
        let segment = path.split('/').nth(self.0)?;
        (!segment.is_empty()).then(|| segment.to_owned())
    }
}

/// The client's IP address.
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` request
/// extension. A request without one is answered `500`: the server is not set up to tell
/// clients apart, and one shared bucket would let one client lock out all.
///
/// # One key per subscriber
///
/// An IPv4 client is keyed on its address (`192.0.2.1`; an IPv4-mapped IPv6 address counts
/// as its IPv4 address). An IPv6 client is keyed on its **/64** network by default
/// (`2001:db8:0:7::1` is `2001-db8-0-7--_64`): a provider hands one subscriber a whole /64
/// (often a /56 or /48), so keying on the address would let a client pick a fresh bucket
/// per request. [`ClientIp::ipv6_prefix`] changes the prefix.
///
/// # Deployment caveat
///
/// Behind a reverse proxy or load balancer, every request's peer is the proxy: use
/// [`ClientIp::behind`] with the proxies' addresses. It reads `X-Forwarded-For` right to
/// left and stops at the first address that is not a trusted proxy, so a client cannot pick
/// its own key by sending the header itself; never key on the leftmost entry. An entry may
/// carry a port (`192.0.2.1:5678`, `[2001:db8::1]:443`) or brackets; anything else that is
/// not an address (`unknown`, an obfuscated name) ends the walk at the last trusted hop.
/// The `Forwarded` header is not read.
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<Cidr>,
    ipv6_prefix: u8,
}

/// The IPv6 prefix a client is keyed on unless [`ClientIp::ipv6_prefix`] says otherwise: the
/// smallest block a provider hands a subscriber.
const DEFAULT_IPV6_PREFIX: u8 = 64;

impl ClientIp {
    /// The TCP peer: for a service that clients reach directly.
    ///
    /// ```
    /// use redguard::http::{ClientIp, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder(ClientIp::peer()).limit("ip", "60/min").build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn peer() -> ClientIp {
        ClientIp {
            trusted: Vec::new(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// The client in front of trusted proxies: when the peer is one of `proxies` (addresses
    /// or CIDR blocks such as `10.0.0.0/8`), the `X-Forwarded-For` entries are walked right to
    /// left past the trusted ones and the first other address is the client. A request
    /// whose peer is not trusted is keyed on its peer, whatever headers it sends.
    ///
    /// ```
    /// use redguard::http::{ClientIp, RateLimitLayer};
    ///
    /// let ip = ClientIp::behind(["10.0.0.0/8", "fd00::/8", "127.0.0.1"])?;
    /// let layer = RateLimitLayer::builder(ip).limit("ip", "60/min").build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn behind<I, S>(proxies: I) -> Result<ClientIp>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = proxies
            .into_iter()
            .map(|p| Cidr::parse(p.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(ClientIp {
            trusted,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Keys IPv6 clients on their first `bits` bits (1 to 128; default 64): 56 or 48 where a
    /// provider gives each subscriber that much, 128 for one key per address. Another value
    /// is [`Error::Config`].
    ///
    /// ```
    /// use redguard::http::{ClientIp, KeyExtractor, RateLimitLayer};
    ///
    /// let ip = ClientIp::peer().ipv6_prefix(56)?;
    /// let request = http::Request::get("/")
    ///     .extension("[2001:db8:0:ab01::9]:443".parse::<std::net::SocketAddr>().unwrap())
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(ip.extract(&request.into_parts().0).as_deref(), Some("2001-db8-0-ab00--_56"));
    /// let layer = RateLimitLayer::builder(ip).limit("ip", "60/min").build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<ClientIp> {
        if !(1..=128).contains(&bits) {
            return Err(Error::Config(format!(
                "`ipv6_prefix({bits})`: an IPv6 prefix is 1 to 128 bits"
            )));
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// The client address of a request, as [`ClientIp`] describes (the whole address: the
    /// key of an IPv6 client is its network).
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use redguard::http::ClientIp;
    ///
    /// let request = http::Request::get("/")
    ///     .header("x-forwarded-for", "6.6.6.6, 198.51.100.7")
    ///     .extension(SocketAddr::from(([10, 0, 0, 2], 443)))
    ///     .body(())
    ///     .unwrap();
    /// let (parts, ()) = request.into_parts();
    /// let behind = ClientIp::behind(["10.0.0.0/8"])?;
    /// assert_eq!(behind.client(&parts), Some("198.51.100.7".parse::<IpAddr>().unwrap()));
    /// assert_eq!(ClientIp::peer().client(&parts), Some("10.0.0.2".parse::<IpAddr>().unwrap()));
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn client(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(parts)?.ip().to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let mut client = peer;
        // Entries from the nearest hop outward: the rightmost was added by our own proxy.
        let hops = parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .flat_map(|value| {
                let entries: Vec<&str> = value.to_str().unwrap_or("").split(',').collect();
                entries.into_iter().rev()
            });
        for hop in hops {
            let Some(ip) = parse_hop(hop) else {
                // Garbage from beyond the trusted hops: the last trusted hop's client stands.
                break;
            };
            client = ip.to_canonical();
            if !self.is_trusted(client) {
                break;
            }
        }
        Some(client)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|cidr| cidr.contains(ip))
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let client = self.client(parts);
        if client.is_none() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::error!(
                    "ClientIp found no peer address on a request: serve with \
                     `into_make_service_with_connect_info::<SocketAddr>()` or insert a \
                     `SocketAddr` extension; such requests are answered 500"
                );
            });
        }
        Some(match client? {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => {
                let bits = self.ipv6_prefix;
                // `bits` is 1..=128, so the shift is below 128.
                let mask = u128::MAX << (128 - u32::from(bits));
                let net = std::net::Ipv6Addr::from(ip.to_bits() & mask);
                format!("{}_{bits}", net.to_string().replace(':', "-"))
            }
        })
    }

    fn missing_status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

/// One `X-Forwarded-For` entry: an address, optionally bracketed (IPv6) or with a port
/// (`192.0.2.1:5678`, `[2001:db8::1]:443`), as proxies write them.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip().to_canonical());
    }
    let bracketed = hop.strip_prefix('[')?.strip_suffix(']')?;
    bracketed
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0);
    }
    parts.extensions.get::<SocketAddr>().copied()
}

/// An address block: `10.0.0.0/8`, `fd00::/8`, or one address.
#[derive(Debug, Clone, Copy)]
struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Cidr> {
        let bad = || Error::Config(format!("`{text}` is not an IP address or CIDR block"));
        let (addr, bits) = match text.split_once('/') {
            Some((addr, bits)) => (addr, Some(bits.parse::<u8>().map_err(|_| bad())?)),
            None => (text, None),
        };
        let net = addr
            .trim()
            .parse::<IpAddr>()
            .map_err(|_| bad())?
            .to_canonical();
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(bad());
        }
        Ok(Cidr { net, bits })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    (a[whole] & mask) == (b[whole] & mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, xff: &[&str]) -> Parts {
        let mut builder = http::Request::builder();
        for value in xff {
            builder = builder.header("x-forwarded-for", *value);
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        parts.extensions.insert(peer.parse::<SocketAddr>().unwrap());
        parts
    }

    #[test]
    fn peer_ignores_forwarded_headers() {
        let ip = ClientIp::peer();
        assert_eq!(
            ip.extract(&parts("203.0.113.9:5000", &["1.2.3.4"]))
                .unwrap(),
            "203.0.113.9"
        );
    }

    #[test]
    fn behind_walks_right_to_left_through_trusted_proxies_only() {
        let ip = ClientIp::behind(["10.0.0.0/8"]).unwrap();
        // Trusted peer, client appended by our proxy; a spoofed leftmost entry is ignored.
        let p = parts("10.0.0.2:1", &["6.6.6.6, 198.51.100.7, 10.0.0.3"]);
        assert_eq!(ip.extract(&p).unwrap(), "198.51.100.7");
        // Two header lines are one list, in order.
        let p = parts("10.0.0.2:1", &["6.6.6.6", "198.51.100.7"]);
        assert_eq!(ip.extract(&p).unwrap(), "198.51.100.7");
        // An untrusted peer is the client, whatever it claims.
        let p = parts("198.51.100.8:1", &["1.1.1.1"]);
        assert_eq!(ip.extract(&p).unwrap(), "198.51.100.8");
        // Garbage beyond the trusted hops: the last trusted hop stands.
        let p = parts("10.0.0.2:1", &["nonsense, 10.0.0.5"]);
        assert_eq!(ip.extract(&p).unwrap(), "10.0.0.5");
    }

    #[test]
    fn ipv6_keys_follow_the_key_rules() {
        let ip = ClientIp::peer();
        let key = ip.extract(&parts("[2001:db8::1]:80", &[])).unwrap();
        assert_eq!(key, "2001-db8--_64");
        let mapped = ip.extract(&parts("[::ffff:192.0.2.1]:80", &[])).unwrap();
        assert_eq!(mapped, "192.0.2.1");
    }

    #[test]
    fn forwarded_entries_may_carry_ports_and_brackets() {
        for (hop, ip) in [
            ("198.51.100.7", "198.51.100.7"),
            (" 198.51.100.7:5678 ", "198.51.100.7"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("[::ffff:192.0.2.1]:80", "192.0.2.1"),
        ] {
            assert_eq!(parse_hop(hop), Some(ip.parse().unwrap()), "{hop}");
        }
        for junk in [
            "unknown",
            "_hidden",
            "1.2.3.4:",
            "[1.2.3.4]",
            "[2001:db8::1",
            "",
        ] {
            assert_eq!(parse_hop(junk), None, "{junk}");
        }
    }

    #[test]
    fn ipv6_clients_are_keyed_on_their_prefix() {
        let key = |ip: &ClientIp, peer| ip.extract(&parts(peer, &[])).unwrap();
        let peer = ClientIp::peer();
        assert_eq!(key(&peer, "[2001:db8:0:7:aaaa::1]:1"), "2001-db8-0-7--_64");
        assert_eq!(key(&peer, "[2001:db8:0:7:bbbb::2]:1"), "2001-db8-0-7--_64");
        let wide = ClientIp::peer().ipv6_prefix(48).unwrap();
        assert_eq!(key(&wide, "[2001:db8:5:7::1]:1"), "2001-db8-5--_48");
        let exact = ClientIp::peer().ipv6_prefix(128).unwrap();
        assert_eq!(key(&exact, "[2001:db8::1]:1"), "2001-db8--1_128");
        let one = ClientIp::peer().ipv6_prefix(1).unwrap();
        assert_eq!(key(&one, "[ffff::1]:1"), "8000--_1");
        // IPv4 is never masked.
        assert_eq!(key(&wide, "192.0.2.77:1"), "192.0.2.77");
    }

    #[test]
    fn cidr_prefixes() {
        let c = Cidr::parse("10.1.0.0/12").unwrap();
        assert!(c.contains("10.15.255.255".parse().unwrap()));
        assert!(!c.contains("10.16.0.0".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nope").is_err());
        assert!(
            Cidr::parse("fd00::/8")
                .unwrap()
                .contains("fd12::1".parse().unwrap())
        );
    }
}
