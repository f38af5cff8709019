//! The name a client connection is for, read from its first bytes.
//!
//! A sandbox's outgoing TCP connection is held while its first bytes are
//! read: a TLS ClientHello carries the server name (SNI), a plain HTTP/1
//! request carries a Host header. That name is what domain rules are checked
//! against (see `policy`), so it is parsed strictly: anything ambiguous or
//! malformed (two SNI host names, two Host headers, a Host that disagrees
//! with an absolute request URI, a name that is not a DNS name) gives
//! [`Peeked::NoName`] rather than a guess, and no input can make the parser
//! panic. The caller reads until it gets an answer other than
//! [`Peeked::NeedMore`], or until [`PEEK_LIMIT`] bytes, and then treats the
//! connection as [`Peeked::NoName`].

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::policy::normalize_name;

/// Callers stop reading after this many bytes and treat the connection as
/// [`Peeked::NoName`]; a real ClientHello or request head is far smaller.
pub const PEEK_LIMIT: usize = 16 * 1024;

/// What the first bytes of a client stream say about where it is going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peeked {
    /// The name asked for: lower-cased, with no port and no trailing dot.
    Name(String),
    /// A complete TLS ClientHello without a usable SNI, or a complete HTTP
    /// request head without a usable Host.
    NoName,
    /// Not enough bytes yet to tell.
    NeedMore,
    /// Neither TLS nor HTTP/1.
    NotRecognised,
}

/// Tries TLS, then HTTP/1, and applies [`PEEK_LIMIT`]: the one call a proxy
/// needs per read.
pub fn peek(buf: &[u8]) -> Peeked {
    let found = match tls_sni(buf) {
        Peeked::NotRecognised => http_host(buf),
        other => other,
    };
    match found {
        Peeked::NeedMore if buf.len() >= PEEK_LIMIT => Peeked::NoName,
        other => other,
    }
}

const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;
/// The largest plaintext record TLS allows (RFC 8446, 5.1).
const MAX_RECORD: usize = 1 << 14;

/// The server name of a TLS ClientHello at the start of `buf`, which may be
/// split over several handshake records. A ClientHello that says it is
/// longer than [`PEEK_LIMIT`] gives [`Peeked::NoName`] at once, since the
/// caller would give up on it anyway.
pub fn tls_sni(buf: &[u8]) -> Peeked {
    match client_hello(buf) {
        Ok(body) => server_name(&body).map_or(Peeked::NoName, Peeked::Name),
        Err(p) => p,
    }
}

/// Reassembles the ClientHello body from the handshake records at the start
/// of `buf`. Borrowed when it fits in one record, the common case.
fn client_hello(buf: &[u8]) -> Result<Cow<'_, [u8]>, Peeked> {
    let mut rest = buf;
    let mut msg: Cow<'_, [u8]> = Cow::Borrowed(&[]);
    loop {
        let first = msg.is_empty();
        // Until the first record proves this is TLS, a mismatch means it is
        // something else; after that, it is broken TLS.
        let broken = if first {
            Peeked::NotRecognised
        } else {
            Peeked::NoName
        };
        match rest {
            [] => return Err(Peeked::NeedMore),
            [t, ..] if *t != CONTENT_HANDSHAKE => return Err(broken),
            [_, major, ..] if *major != 3 => return Err(broken),
            [_, _, minor, ..] if *minor > 4 => return Err(broken),
            _ => {}
        }
        let [_, _, _, hi, lo, ..] = *rest else {
            return Err(Peeked::NeedMore);
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        // Empty handshake fragments are forbidden (RFC 8446, 5.1).
        if len == 0 || len > MAX_RECORD {
            return Err(broken);
        }
        let Some(fragment) = rest.get(5..5 + len) else {
            if first && rest.len() > 5 && rest[5] != HANDSHAKE_CLIENT_HELLO {
                return Err(Peeked::NotRecognised);
            }
            return Err(Peeked::NeedMore);
        };
        rest = &rest[5 + len..];
        if first {
            if fragment[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(Peeked::NotRecognised);
            }
            msg = Cow::Borrowed(fragment);
        } else {
            msg.to_mut().extend_from_slice(fragment);
        }
        if let [_, a, b, c, ..] = *msg {
            let body_len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            if body_len > PEEK_LIMIT {
                return Err(Peeked::NoName);
            }
            if msg.len() >= 4 + body_len {
                return Ok(match msg {
                    Cow::Borrowed(m) => Cow::Borrowed(&m[4..4 + body_len]),
                    Cow::Owned(m) => Cow::Owned(m[4..4 + body_len].to_vec()),
                });
            }
        }
    }
}

/// A cursor over TLS wire data; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The SNI host name of a ClientHello body, if it has exactly one and it is
/// a DNS name. Any length that does not add up gives `None`.
fn server_name(hello: &[u8]) -> Option<String> {
    let mut r = Reader(hello);
    let [major, _] = *r.take(2)? else {
        return None;
    };
    if major != 3 {
        return None;
    }
    r.take(32)?; // random
    if r.vec8()?.len() > 32 {
        return None; // session id
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return None;
    }
    if r.vec8()?.is_empty() {
        return None; // compression methods
    }
    let mut exts = Reader(r.vec16()?);
    if !r.is_empty() {
        return None;
    }
    let mut sni = None;
    while !exts.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind == EXT_SERVER_NAME {
            // Two SNI extensions could steer the proxy and the server apart.
            if sni.replace(data).is_some() {
                return None;
            }
        }
    }
    let mut ext = Reader(sni?);
    let mut list = Reader(ext.vec16()?);
    if !ext.is_empty() || list.is_empty() {
        return None;
    }
    let mut host = None;
    while !list.is_empty() {
        let kind = list.u8()?;
        let name = list.vec16()?;
        if kind == NAME_TYPE_HOST && host.replace(name).is_some() {
            return None;
        }
    }
    normalize_name(std::str::from_utf8(host?).ok()?)
}

/// Headers read from a request head; more than this is not a real client.
const MAX_HEADERS: usize = 128;

/// The Host of an HTTP/1 request at the start of `buf`, without its port.
/// An IP literal host is returned as the address in its usual text form.
pub fn http_host(buf: &[u8]) -> Peeked {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Peeked::NeedMore,
        Err(httparse::Error::TooManyHeaders) => return Peeked::NoName,
        Err(_) => return Peeked::NotRecognised,
    }
    let mut hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        // None, or two that a server might pick between differently.
        return Peeked::NoName;
    };
    let Some(name) = std::str::from_utf8(host.value)
        .ok()
        .and_then(|v| authority_host(v.trim()))
    else {
        return Peeked::NoName;
    };
    // An absolute URI's authority overrides Host (RFC 9112, 3.2.2), so the
    // two must agree or the name checked would not be the one used.
    if let Some(uri) = req.path.and_then(absolute_authority) {
        if authority_host(uri).as_deref() != Some(name.as_str()) {
            return Peeked::NoName;
        }
    }
    Peeked::Name(name)
}

/// The authority of an absolute-form request target, such as
/// `http://user@example.com:8080/x`, without any user info.
fn absolute_authority(target: &str) -> Option<&str> {
    let (scheme, rest) = target.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    Some(
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host),
    )
}

/// The host of `host[:port]` or `[v6]:port`, normalised; `None` if it is
/// neither a DNS name nor an IP literal, or the port is not digits.
fn authority_host(value: &str) -> Option<String> {
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port = match after {
            "" => "",
            _ => after.strip_prefix(':')?,
        };
        let addr: Ipv6Addr = v6.parse().ok()?;
        (IpAddr::V6(addr).to_string(), port)
    } else {
        let (host, port) = value.split_once(':').unwrap_or((value, ""));
        // An unbracketed IPv6 literal ends up here split at its first colon,
        // and is refused as a name: it is not a valid Host.
        let host = match host.parse::<Ipv4Addr>() {
            Ok(v4) => v4.to_string(),
            Err(_) => normalize_name(host)?,
        };
        (host, port)
    };
    // RFC 3986 allows an empty port; anything else must be a real port.
    if !port.is_empty()
        && (port.len() > 5
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port.parse::<u16>().is_err())
    {
        return None;
    }
    Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16be(n: usize) -> [u8; 2] {
        u16::try_from(n).unwrap().to_be_bytes()
    }

    fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut v = kind.to_be_bytes().to_vec();
        v.extend(u16be(data.len()));
        v.extend(data);
        v
    }

    fn sni_ext(names: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in names {
            list.push(*kind);
            list.extend(u16be(name.len()));
            list.extend(*name);
        }
        let mut data = u16be(list.len()).to_vec();
        data.extend(list);
        ext(EXT_SERVER_NAME, &data)
    }

    /// A ClientHello handshake message (header included) with these
    /// extensions, shaped like a TLS 1.3 one from a real client.
    fn hello_message(exts: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![3, 3]; // legacy_version TLS 1.2
        body.extend((0u8..32).map(|i| i.wrapping_mul(7))); // random
        body.push(32); // session id
        body.extend([0xab; 32]);
        let suites = [0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2f];
        body.extend(u16be(suites.len()));
        body.extend(suites);
        body.extend([1, 0]); // compression: null only
        let all: Vec<u8> = exts.concat();
        body.extend(u16be(all.len()));
        body.extend(all);
        let mut msg = vec![HANDSHAKE_CLIENT_HELLO];
        msg.extend(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
        msg.extend(body);
        msg
    }

    /// `msg` split into handshake records of at most `chunk` bytes.
    fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend([CONTENT_HANDSHAKE, 3, 1]);
            out.extend(u16be(part.len()));
            out.extend(part);
        }
        out
    }

    fn supported_versions() -> Vec<u8> {
        ext(43, &[4, 3, 4, 3, 3])
    }

    fn key_share() -> Vec<u8> {
        let mut share = vec![0, 0x1d, 0, 32];
        share.extend([0x42; 32]);
        let mut data = u16be(share.len()).to_vec();
        data.extend(share);
        ext(51, &data)
    }

    fn client_hello_with(exts: &[Vec<u8>]) -> Vec<u8> {
        records(&hello_message(exts), MAX_RECORD)
    }

    fn example_hello() -> Vec<u8> {
        client_hello_with(&[sni_ext(&[(0, b"Example.COM")]), supported_versions()])
    }

    #[test]
    fn finds_sni_first_or_after_other_extensions() {
        assert_eq!(
            tls_sni(&example_hello()),
            Peeked::Name("example.com".into())
        );
        let late = client_hello_with(&[
            supported_versions(),
            key_share(),
            sni_ext(&[(0, b"api.example.com.")]),
        ]);
        assert_eq!(tls_sni(&late), Peeked::Name("api.example.com".into()));
    }

    #[test]
    fn no_sni_is_no_name() {
        assert_eq!(
            tls_sni(&client_hello_with(&[supported_versions(), key_share()])),
            Peeked::NoName
        );
        assert_eq!(tls_sni(&client_hello_with(&[])), Peeked::NoName);
        // No extensions block at all (TLS 1.0 style).
        let mut msg = hello_message(&[]);
        msg.truncate(msg.len() - 2);
        let n = msg.len() - 4;
        msg[1..4].copy_from_slice(&u32::try_from(n).unwrap().to_be_bytes()[1..]);
        assert_eq!(tls_sni(&records(&msg, MAX_RECORD)), Peeked::NoName);
    }

    #[test]
    fn unusable_sni_is_no_name() {
        let cases: Vec<Vec<Vec<u8>>> = vec![
            vec![sni_ext(&[(0, b"bad name.com")])],
            vec![sni_ext(&[(0, b"192.0.2.1")])],
            vec![sni_ext(&[(0, b"")])],
            vec![sni_ext(&[(0, b"\xff\xfe.com")])],
            vec![sni_ext(&[(0, b"a.com"), (0, b"b.com")])],
            vec![sni_ext(&[(0, b"a.com")]), sni_ext(&[(0, b"b.com")])],
            vec![sni_ext(&[(1, b"a.com")])],
            vec![sni_ext(&[])],
            vec![ext(EXT_SERVER_NAME, &[])],
            vec![ext(
                EXT_SERVER_NAME,
                &[0, 9, 0, 0, 5, b'a', b'.', b'c', b'o', b'm'],
            )],
        ];
        for exts in cases {
            assert_eq!(
                tls_sni(&client_hello_with(&exts)),
                Peeked::NoName,
                "{exts:?}"
            );
        }
        // An unknown name type alongside a host name is skipped.
        let ok = client_hello_with(&[sni_ext(&[(7, b"xx"), (0, b"a.com")])]);
        assert_eq!(tls_sni(&ok), Peeked::Name("a.com".into()));
    }

    #[test]
    fn spans_several_records() {
        let msg = hello_message(&[
            supported_versions(),
            key_share(),
            sni_ext(&[(0, b"split.example")]),
        ]);
        for chunk in [1, 2, 3, 4, 5, 40, 100] {
            let buf = records(&msg, chunk);
            assert_eq!(
                tls_sni(&buf),
                Peeked::Name("split.example".into()),
                "chunk {chunk}"
            );
            assert_eq!(
                tls_sni(&buf[..buf.len() - 1]),
                Peeked::NeedMore,
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn every_prefix_needs_more() {
        let buf = client_hello_with(&[
            supported_versions(),
            key_share(),
            sni_ext(&[(0, b"example.com")]),
        ]);
        for n in 0..buf.len() {
            assert_eq!(tls_sni(&buf[..n]), Peeked::NeedMore, "prefix of {n}");
            assert_eq!(peek(&buf[..n]), Peeked::NeedMore, "prefix of {n}");
        }
        // Bytes after the ClientHello (say, early data) do not matter.
        let mut more = buf.clone();
        more.extend([23, 3, 3, 0, 1, 0]);
        assert_eq!(tls_sni(&more), Peeked::Name("example.com".into()));
    }

    #[test]
    fn broken_framing() {
        let good = example_hello();
        // Not TLS at all.
        assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n"), Peeked::NotRecognised);
        assert_eq!(tls_sni(&[0x80, 0x2e, 0x01]), Peeked::NotRecognised); // SSLv2
        assert_eq!(tls_sni(&[22, 2]), Peeked::NotRecognised);
        assert_eq!(tls_sni(&[22, 3, 9]), Peeked::NotRecognised);
        assert_eq!(tls_sni(&[22, 3, 1, 0, 0]), Peeked::NotRecognised);
        assert_eq!(tls_sni(&[22, 3, 1, 0x40, 1]), Peeked::NotRecognised);
        assert_eq!(tls_sni(&[22, 3, 1, 0, 9, 2, 0]), Peeked::NotRecognised); // ServerHello
        let mut alert = good.clone();
        alert[0] = 21;
        assert_eq!(tls_sni(&alert), Peeked::NotRecognised);
        // TLS, but the second record is not a handshake record.
        let msg = hello_message(&[sni_ext(&[(0, b"a.com")])]);
        let mut two = records(&msg, 50);
        two[55] = 23;
        assert_eq!(tls_sni(&two), Peeked::NoName);
        // Lengths inside that do not add up.
        let mut inner = good.clone();
        let last = inner.len() - 1;
        inner[last] ^= 0xff;
        let mut short = good.clone();
        short[5 + 4 + 2 + 32] = 33; // session id length past its bytes
        let mut trailing = hello_message(&[sni_ext(&[(0, b"a.com")])]);
        trailing.push(0);
        let n = trailing.len() - 4;
        trailing[1..4].copy_from_slice(&u32::try_from(n).unwrap().to_be_bytes()[1..]);
        for bad in [short, records(&trailing, MAX_RECORD)] {
            assert_eq!(tls_sni(&bad), Peeked::NoName);
        }
        assert!(matches!(tls_sni(&inner), Peeked::NoName | Peeked::Name(_)));
        // A ClientHello claiming more than PEEK_LIMIT is never worth waiting for.
        assert_eq!(tls_sni(&[22, 3, 1, 0, 4, 1, 0x01, 0, 0]), Peeked::NoName);
    }

    /// A small deterministic generator, so failures can be replayed.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn byte(&mut self) -> u8 {
            self.next().to_le_bytes()[0]
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let hello = client_hello_with(&[
            supported_versions(),
            key_share(),
            sni_ext(&[(0, b"example.com")]),
        ]);
        for round in 0..20_000 {
            let buf: Vec<u8> = match round % 3 {
                0 => {
                    let len = usize::from(rng.byte()) * 2;
                    (0..len).map(|_| rng.byte()).collect()
                }
                1 => {
                    // Random bytes behind a plausible record header.
                    let mut b = vec![22, 3, 1, rng.byte() % 2, rng.byte(), 1];
                    b.extend((0..usize::from(rng.byte())).map(|_| rng.byte()));
                    b
                }
                _ => {
                    // A real ClientHello with a few bytes flipped.
                    let mut b = hello.clone();
                    for _ in 0..=rng.next() % 4 {
                        let at = usize::try_from(rng.next() % b.len() as u64).unwrap();
                        b[at] = rng.byte();
                    }
                    b
                }
            };
            let _ = tls_sni(&buf);
            let _ = http_host(&buf);
            let _ = peek(&buf);
        }
    }

    #[test]
    fn http_host_forms() {
        let cases: &[(&[u8], Peeked)] = &[
            (
                b"GET / HTTP/1.1\r\nHost: Example.COM\r\n\r\n",
                Peeked::Name("example.com".into()),
            ),
            (
                b"GET / HTTP/1.1\r\nhost: example.com:8080\r\n\r\n",
                Peeked::Name("example.com".into()),
            ),
            (
                b"GET / HTTP/1.1\r\nHOST:  example.com.  \r\n\r\n",
                Peeked::Name("example.com".into()),
            ),
            (
                b"POST /x HTTP/1.0\r\nA: b\r\nHost: a.b.example:\r\n\r\nbody",
                Peeked::Name("a.b.example".into()),
            ),
            (
                b"GET / HTTP/1.1\r\nHost: 192.0.2.1:80\r\n\r\n",
                Peeked::Name("192.0.2.1".into()),
            ),
            (
                b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
                Peeked::Name("::1".into()),
            ),
            (
                b"GET / HTTP/1.1\r\nHost: [2001:DB8::1]\r\n\r\n",
                Peeked::Name("2001:db8::1".into()),
            ),
            (
                b"GET http://user@Example.com:80/p?q HTTP/1.1\r\nHost: example.com\r\n\r\n",
                Peeked::Name("example.com".into()),
            ),
            (
                b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
                Peeked::Name("example.com".into()),
            ),
        ];
        for (buf, want) in cases {
            assert_eq!(&http_host(buf), want, "{}", String::from_utf8_lossy(buf));
            assert_eq!(&peek(buf), want, "{}", String::from_utf8_lossy(buf));
        }
    }

    #[test]
    fn http_without_a_usable_host() {
        for buf in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.0\r\nAccept: */*\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.com\r\nhost: a.com\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: bad name\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.com:http\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.com:65536\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: ::1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [example.com]\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: \xff.com\r\n\r\n",
            b"GET http://evil.example/ HTTP/1.1\r\nHost: good.example\r\n\r\n",
            b"GET http://good.example@evil.example/ HTTP/1.1\r\nHost: good.example\r\n\r\n",
        ] {
            assert_eq!(
                http_host(buf),
                Peeked::NoName,
                "{}",
                String::from_utf8_lossy(buf)
            );
        }
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend(format!("X-{i}: y\r\n").bytes());
        }
        many.extend(b"Host: a.com\r\n\r\n");
        assert_eq!(http_host(&many), Peeked::NoName);
    }

    #[test]
    fn http_partial_and_foreign() {
        let full = b"GET /index.html HTTP/1.1\r\nUser-Agent: t\r\nHost: example.com\r\n\r\n";
        for n in 0..full.len() {
            assert_eq!(http_host(&full[..n]), Peeked::NeedMore, "prefix of {n}");
        }
        assert_eq!(http_host(full), Peeked::Name("example.com".into()));
        assert_eq!(
            http_host(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            Peeked::NotRecognised
        );
        assert_eq!(http_host(b"SSH-2.0-OpenSSH_9.6\r\n"), Peeked::NotRecognised);
        assert_eq!(http_host(&example_hello()), Peeked::NotRecognised);
        assert_eq!(peek(b"SSH-2.0-OpenSSH_9.6\r\n"), Peeked::NotRecognised);
    }

    #[test]
    fn peek_gives_up_at_the_limit() {
        let mut slow = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
        slow.resize(PEEK_LIMIT - 1, b'a');
        assert_eq!(peek(&slow), Peeked::NeedMore);
        slow.push(b'a');
        assert_eq!(peek(&slow), Peeked::NoName);
        assert_eq!(peek(&example_hello()), Peeked::Name("example.com".into()));
        assert_eq!(peek(b""), Peeked::NeedMore);
    }
}
