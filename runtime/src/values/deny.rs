//! Deny lists: the rate-limit keys an operator refused outright (`redguard::admin`,
//! `redguard deny add`), whatever their limit would say. A denied call is refused before its
//! limit is read: it consumes nothing and writes nothing.
//!
//! An exact key's entry is a companion of its state key, `<state key>:deny`, inside the
//! limit's own hash tag (as a quota override's `:quota` is): the deciding script reads it
//! with one `GET` per check, in the same slot as the limit, so exact keys are denied on a
//! Redis Cluster too. Its value is `<expires_at_ms> x <reason>` and its TTL the entry's; an
//! entry is never kept for good (every key the library writes has a TTL): a "permanent" one
//! is kept the longest TTL, [`MAX_QUOTA_TTL`](crate::admin::MAX_QUOTA_TTL) (365 days),
//! and renewed by adding it again.
//!
//! Prefixes and networks name keys in every slot, so no companion can hold them: they live
//! in one hash per handle prefix, `<prefix>:rate:deny-list`, beside the prefix overrides,
//! read whole (`HGETALL`) once per call and walked per check (`deny.lua`); on a Cluster
//! (where that hash is in another slot than the keys) they are refused. A field per entry:
//! `<prefix>:rate:{<scope>:` and the entry's text as written back (a prefix with its `*`);
//! its value `<expires_at_ms, 0: permanent> <kind> <reason>`, the kind `p` (prefix) or
//! `c<4|6>:<scope prefix length>:<network bits>` (CIDR, the network as `0`/`1` text, which
//! Lua compares with one `string.sub`).
//!
//! Cost per call, measured with `INFO commandstats` (`usec_per_call` of one GCRA check,
//! rate_gcra.lua, redis 7.0, 2 shared cores): about 11-13 µs with no deny entries (a `GET`
//! of the absent `:deny` companion and an `HGETALL` of the absent pattern hash, within the
//! noise of the `HGET` it replaced); with [`MAX_DENY_PATTERNS`] prefixes about 65 µs, with
//! as many networks about 140 µs: patterns cost about 1 µs (prefix) or 2 µs (network) each
//! on every call while they are set, so deny many single keys exactly and keep patterns few.

use std::net::IpAddr;

use crate::error::{Error, Result};
use crate::key::{Key, KeyBuilder};

/// Suffix, after `<prefix>:rate:`, of a handle's hash of denied prefixes and networks.
pub(crate) const DENY_HASH: &str = "deny-list";

/// Suffix of a rate limit's exact-key deny entry (`<state key>:deny`).
pub(crate) const DENY_SUFFIX: &str = "deny";

/// The most prefix and network entries a handle's deny lists hold together (every scope's):
/// the deciding script walks them all on every call, so their number bounds its cost.
pub const MAX_DENY_PATTERNS: usize = 64;

/// The longest reason text, in bytes.
pub const MAX_DENY_REASON: usize = 200;

/// The pattern deny hash of the handle a rate-limit state key `key` belongs to.
pub(crate) fn deny_hash(key: &Key) -> Option<Key> {
    let at = key.as_str().find(":rate:{")?;
    let base = &key.as_str()[..at];
    Some(Key::stored(crate::key::join(&[base, ":rate:", DENY_HASH])))
}

/// The reason of an exact-key entry's stored value (`<expires_at_ms> x <reason>`) when it is
/// live at `now_ms`; `None` when it lapsed or is not an entry (denies nothing, as deny.lua).
pub(crate) fn exact_reason(value: &str, now_ms: u64) -> Option<&str> {
    let (at, rest) = value.split_once(' ')?;
    let at: u64 = at.parse().ok()?;
    let reason = match rest.strip_prefix('x')? {
        "" => "",
        more => more.strip_prefix(' ')?,
    };
    (at == 0 || at > now_ms).then_some(reason)
}

/// What one deny entry matches, parsed from an operator's text.
///
/// ```
/// use redguard::admin::DenyPattern;
///
/// assert!(matches!(DenyPattern::parse("tenant:acme")?, DenyPattern::Key(_)));
/// assert!(matches!(DenyPattern::parse("tenant:*")?, DenyPattern::Prefix(_)));
/// assert!(matches!(DenyPattern::parse("10.0.0.0/8")?, DenyPattern::Cidr { bits: 8, .. }));
/// assert!(matches!(DenyPattern::parse("2001:db8::/32")?, DenyPattern::Cidr { bits: 32, .. }));
/// assert!(DenyPattern::parse("10.0.0.0/33").is_err());
/// assert!(DenyPattern::parse("tenant acme").is_err()); // the key rules
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenyPattern {
    /// One rendered key (`tenant:acme`).
    Key(String),
    /// Every key starting with this text (written `tenant:*`; `*` alone is every key).
    Prefix(String),
    /// Every key whose last `:`-separated part is an address in this network (the http
    /// layer's `ClientIp` keys: `192.0.2.7`, or an IPv6 block `2001-db8--_64`, denied when
    /// the whole block lies in the network).
    Cidr {
        /// The network's address, its host bits zero.
        net: IpAddr,
        /// The prefix length.
        bits: u8,
    },
}

impl DenyPattern {
    /// Parses an entry: a key, a `prefix*` or a CIDR, each by the guards' key rules.
    pub fn parse(text: &str) -> Result<DenyPattern> {
        if let Some((addr, bits)) = text.split_once('/')
            && let Ok(addr) = addr.parse::<IpAddr>()
        {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = bits
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "`{text}`: a prefix length of 0 to {max} is expected"
                    ))
                })?;
            return Ok(DenyPattern::Cidr {
                net: mask(addr, bits),
                bits,
            });
        }
        if let Some(prefix) = text.strip_suffix('*') {
            if !prefix.is_empty() {
                KeyBuilder::new().text(prefix).finish()?;
            }
            return Ok(DenyPattern::Prefix(prefix.to_owned()));
        }
        KeyBuilder::new().text(text).finish()?;
        Ok(DenyPattern::Key(text.to_owned()))
    }

    /// The entry as written back (a CIDR with its host bits cleared).
    pub fn text(&self) -> String {
        match self {
            DenyPattern::Key(key) => key.clone(),
            DenyPattern::Prefix(prefix) => format!("{prefix}*"),
            DenyPattern::Cidr { net, bits } => format!("{net}/{bits}"),
        }
    }

    /// The kind token of the stored value, for a field whose scope prefix is `scope_len`
    /// bytes long.
    pub(crate) fn kind(&self, scope_len: usize) -> String {
        match self {
            DenyPattern::Key(_) => "x".to_owned(),
            DenyPattern::Prefix(_) => "p".to_owned(),
            DenyPattern::Cidr { net, bits } => {
                let (family, all) = address_bits(*net);
                format!("c{family}:{scope_len}:{}", &all[..usize::from(*bits)])
            }
        }
    }
}

/// Checks an operator's reason text: it reaches logs and HTTP bodies.
pub(crate) fn check_reason(reason: &str) -> Result<()> {
    if reason.len() > MAX_DENY_REASON {
        return Err(Error::Config(format!(
            "a deny reason is {} bytes long, the limit is {MAX_DENY_REASON}",
            reason.len()
        )));
    }
    if let Some(c) = reason.chars().find(|c| c.is_control()) {
        return Err(Error::Config(format!(
            "a deny reason contains {c:?}: control characters are not allowed"
        )));
    }
    Ok(())
}

fn mask(addr: IpAddr, bits: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// The family (4 or 6) and the address as `0`/`1` text.
fn address_bits(addr: IpAddr) -> (u8, String) {
    match addr {
        IpAddr::V4(a) => (4, format!("{:032b}", u32::from(a))),
        IpAddr::V6(a) => (6, format!("{:0128b}", u128::from(a))),
    }
}

/// The address a key body's last `:`-separated part names, with its own prefix length (an
/// IPv6 key of the http layer is a block, `2001-db8--_64`), as deny.lua reads it.
fn key_address(body: &str) -> Option<(IpAddr, u8)> {
    let last = body.rsplit(':').next()?;
    if let Ok(v4) = last.parse::<std::net::Ipv4Addr>() {
        return Some((IpAddr::V4(v4), 32));
    }
    let (addr, bits) = match last.split_once('_') {
        Some((addr, bits)) => (addr, bits.parse::<u8>().ok().filter(|b| *b <= 128)?),
        None => (last, 128),
    };
    let v6 = addr.replace('-', ":").parse::<std::net::Ipv6Addr>().ok()?;
    Some((IpAddr::V6(v6), bits))
}

/// The reason of `value` (a stored value less its expiry, `<kind> <reason>`) if the entry at
/// `field` denies the state key `key`: the memory store's reading of deny.lua.
pub(crate) fn denies(field: &str, value: &str, key: &str) -> Option<String> {
    let (kind, reason) = value.split_once(' ').unwrap_or((value, ""));
    let hit = match kind {
        "x" => key.strip_suffix('}') == Some(field),
        "p" => field
            .strip_suffix('*')
            .is_some_and(|prefix| key.starts_with(prefix)),
        _ => {
            let mut parts = kind.split(':');
            let family = parts.next()?;
            let scope_len: usize = parts.next()?.parse().ok()?;
            let net = parts.next()?;
            let scope = field.get(..scope_len)?;
            let body = key.strip_prefix(scope)?.strip_suffix('}')?;
            let (addr, own) = key_address(body)?;
            let (f, all) = address_bits(addr);
            family == format!("c{f}") && usize::from(own) >= net.len() && all.starts_with(net)
        }
    };
    hit.then(|| reason.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(entry: &str, body: &str) -> bool {
        let scope = "rg:rate:{api:";
        let p = DenyPattern::parse(entry).unwrap();
        let field = format!("{scope}{}", p.text());
        let value = format!("{} why", p.kind(scope.len()));
        denies(&field, &value, &format!("{scope}{body}}}")).is_some()
    }

    #[test]
    fn entries_match_as_written() {
        assert!(hit("tenant:acme", "tenant:acme"));
        assert!(!hit("tenant:acme", "tenant:acmex"));
        assert!(hit("tenant:*", "tenant:acmex"));
        assert!(hit("*", "anything"));
        assert!(hit("10.0.0.0/8", "ip:10.2.3.4"));
        assert!(hit("10.0.0.0/8", "10.2.3.4"));
        assert!(!hit("10.0.0.0/8", "11.2.3.4"));
        assert!(hit("2001:db8::/32", "2001-db8-0-7--_64"));
        assert!(!hit("2001:db8::/32", "2001-db9-0-7--_64"));
        // A block wider than the network is not all in it.
        assert!(!hit("2001:db8:0:7::/64", "2001-db8--_48"));
        assert!(hit("2001:db8::1/128", "2001-db8--1_128"));
        assert!(!hit("10.0.0.0/8", "2001-db8--_64"));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in ["", "a b", "10.0.0.0/33", "::/129", "x{y", "ten*ant"] {
            assert!(DenyPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(check_reason("line\nbreak").is_err());
        assert!(check_reason(&"x".repeat(201)).is_err());
    }
}
