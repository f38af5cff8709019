//! The vm tier's line: one virtio-serial port between the host and the
//! guest, carrying one agent connection at a time.
//!
//! A unix socket tells both ends when its peer goes; a virtio-serial port
//! does not, reliably: the guest learns that the host hung up only if it
//! looks while nobody is connected, and a daemon that dies mid-frame and a
//! successor that connects a moment later look, to the guest, like one
//! stream with half a frame in the middle. So the port carries *packets*,
//! delimited SLIP-style (RFC 1055): [`END`] ends every packet and never
//! appears inside one ([`ESC`] escapes it), so whatever a dead host left
//! half-written is cut off at the next [`END`] and dropped.
//!
//! A packet is one kind byte, then its payload:
//!
//! | kind | payload | from | meaning |
//! |---|---|---|---|
//! | [`Packet::Hello`] | 8-byte nonce | host | a new connection: drop the old one, answer with `Ready` |
//! | [`Packet::Ready`] | the same nonce | guest | the agent listens; what follows is this connection's |
//! | [`Packet::Data`] | bytes | both | the agent protocol's bytes, in order |
//! | [`Packet::Close`] | none | both | this connection ended |
//! | [`Packet::Renew`] | nonce, host time, entropy, host name | host | a restored guest's new identity (below); answer `Renewed` |
//! | [`Packet::Renewed`] | the same nonce | guest | done (answers `Renew` and `Readdress`) |
//! | [`Packet::Readdress`] | nonce, address, gateway (4 bytes each, network order) | host | a restored guest's new network address (below); answer `Renewed` |
//!
//! A guest restored from a memory snapshot comes back as its parent was:
//! its host name, machine id, kernel random state and clock. `Renew`
//! gives it its own: the host's time (ns since the epoch) for its clock,
//! 32 random bytes the guest mixes into its kernel's pool before forcing
//! a reseed, and its host name (the guest writes a new machine id too).
//! It belongs to no connection: the host sends it on a line of its own,
//! the current connection (if any) is left alone.
//!
//! A guest with a network device learns its address at boot from the
//! kernel's command line (`brig.ip=`, `brig.gw=`); a restored one lands in
//! a new network namespace with a new address, and `Readdress` gives it
//! that (the guest forgets its gateway's old link-layer address too).
//! Like `Renew`, it travels on a line of its own. A guest that does not
//! know a kind (an older agent, restored from an older snapshot) drops
//! the packet and never answers: the host times out and says so.
//!
//! The host discards everything before the `Ready` carrying its own nonce
//! (output meant for a predecessor), and the guest hands what came before
//! a `Hello` (a dead host's last, perhaps truncated, packet) to the
//! connection the `Hello` replaces: a new connection starts clean on both
//! sides.

/// Ends every packet; never inside one.
pub const END: u8 = 0xC0;
/// Escapes an [`END`] or [`ESC`] inside a packet.
pub const ESC: u8 = 0xDB;
const ESC_END: u8 = 0xDC;
const ESC_ESC: u8 = 0xDD;

/// The largest payload [`Unstuffer`] keeps; longer packets are dropped.
/// [`Packet::Data`] senders cut their bytes to at most this.
pub const MAX_PACKET: usize = 64 * 1024;

const HELLO: u8 = 1;
const READY: u8 = 2;
const DATA: u8 = 3;
const CLOSE: u8 = 4;
const RENEW: u8 = 5;
const RENEWED: u8 = 6;
const READDRESS: u8 = 7;

/// A restored guest's identity ([`Packet::Renew`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    pub nonce: u64,
    /// The host's clock: nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Host randomness for the guest kernel's pool.
    pub entropy: [u8; 32],
    pub hostname: String,
}

/// A restored guest's new place on the network ([`Packet::Readdress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address {
    pub nonce: u64,
    /// The guest's own address (a /32).
    pub addr: std::net::Ipv4Addr,
    /// Its next hop, on-link.
    pub gateway: std::net::Ipv4Addr,
}

/// One packet on the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Hello(u64),
    Ready(u64),
    Data(Vec<u8>),
    Close,
    Renew(Renewal),
    Renewed(u64),
    Readdress(Address),
}

impl Packet {
    /// Append this packet, stuffed and delimited, to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Packet::Hello(n) => encode(HELLO, &n.to_le_bytes(), out),
            Packet::Ready(n) => encode(READY, &n.to_le_bytes(), out),
            Packet::Data(d) => encode(DATA, d, out),
            Packet::Close => encode(CLOSE, &[], out),
            Packet::Renew(r) => {
                let mut p = Vec::with_capacity(48 + r.hostname.len());
                p.extend_from_slice(&r.nonce.to_le_bytes());
                p.extend_from_slice(&r.time_ns.to_le_bytes());
                p.extend_from_slice(&r.entropy);
                p.extend_from_slice(r.hostname.as_bytes());
                encode(RENEW, &p, out)
            }
            Packet::Renewed(n) => encode(RENEWED, &n.to_le_bytes(), out),
            Packet::Readdress(a) => {
                let mut p = Vec::with_capacity(16);
                p.extend_from_slice(&a.nonce.to_le_bytes());
                p.extend_from_slice(&a.addr.octets());
                p.extend_from_slice(&a.gateway.octets());
                encode(READDRESS, &p, out)
            }
        }
    }

    fn parse(raw: &[u8]) -> Option<Packet> {
        let (&kind, payload) = raw.split_first()?;
        let nonce = || Some(u64::from_le_bytes(payload.try_into().ok()?));
        match kind {
            HELLO => Some(Packet::Hello(nonce()?)),
            READY => Some(Packet::Ready(nonce()?)),
            DATA => Some(Packet::Data(payload.to_vec())),
            CLOSE if payload.is_empty() => Some(Packet::Close),
            RENEW if payload.len() >= 48 => Some(Packet::Renew(Renewal {
                nonce: u64::from_le_bytes(payload[..8].try_into().ok()?),
                time_ns: u64::from_le_bytes(payload[8..16].try_into().ok()?),
                entropy: payload[16..48].try_into().ok()?,
                hostname: String::from_utf8(payload[48..].to_vec()).ok()?,
            })),
            RENEWED => Some(Packet::Renewed(nonce()?)),
            READDRESS if payload.len() == 16 => {
                let ip = |at: usize| -> Option<std::net::Ipv4Addr> {
                    let o: [u8; 4] = payload[at..at + 4].try_into().ok()?;
                    Some(o.into())
                };
                Some(Packet::Readdress(Address {
                    nonce: u64::from_le_bytes(payload[..8].try_into().ok()?),
                    addr: ip(8)?,
                    gateway: ip(12)?,
                }))
            }
            _ => None,
        }
    }
}

/// Append a [`Packet::Data`] packet of `bytes` without copying them first.
pub fn encode_data(bytes: &[u8], out: &mut Vec<u8>) {
    encode(DATA, bytes, out);
}

fn encode(kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    // A leading END too: it ends whatever a predecessor left unfinished.
    out.push(END);
    for &b in std::iter::once(&kind).chain(payload) {
        match b {
            END => out.extend_from_slice(&[ESC, ESC_END]),
            ESC => out.extend_from_slice(&[ESC, ESC_ESC]),
            b => out.push(b),
        }
    }
    out.push(END);
}

/// Reads packets back from chunks of any size. Malformed packets (a bad
/// escape, an unknown kind, too long) are dropped, never an error: the
/// line resynchronises at the next [`END`].
#[derive(Debug, Default)]
pub struct Unstuffer {
    raw: Vec<u8>,
    escaped: bool,
    /// The current packet is being dropped (too long or a bad escape).
    bad: bool,
}

impl Unstuffer {
    pub fn new() -> Unstuffer {
        Unstuffer::default()
    }

    /// Feed `bytes`; call `each` for every packet they complete.
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(Packet)) {
        for &b in bytes {
            if b == END {
                if !self.bad && !self.escaped && !self.raw.is_empty() {
                    if let Some(p) = Packet::parse(&self.raw) {
                        each(p);
                    }
                }
                self.raw.clear();
                self.escaped = false;
                self.bad = false;
                continue;
            }
            if self.bad {
                continue;
            }
            let b = if std::mem::take(&mut self.escaped) {
                match b {
                    ESC_END => END,
                    ESC_ESC => ESC,
                    _ => {
                        self.bad = true;
                        continue;
                    }
                }
            } else if b == ESC {
                self.escaped = true;
                continue;
            } else {
                b
            };
            if self.raw.len() > MAX_PACKET {
                self.bad = true;
                self.raw.clear();
                continue;
            }
            self.raw.push(b);
        }
    }
}

/// A volume's path as the guest's kernel command line carries it
/// (`brig.volN=HEX`, beside `brig.ip=`): lowercase hex, so that any byte a
/// path may hold passes and a space never splits it.
pub fn path_to_hex(path: &str) -> String {
    path.bytes().map(|b| format!("{b:02x}")).collect()
}

/// [`path_to_hex`] back; `None` for anything that is not its output.
pub fn path_from_hex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_paths_survive_the_command_line() {
        for p in ["/mnt/data", "/srv/a b/ünï", "/x"] {
            let h = path_to_hex(p);
            assert!(h.bytes().all(|b| b.is_ascii_hexdigit()), "{h}");
            assert_eq!(path_from_hex(&h).as_deref(), Some(p));
        }
        for bad in ["2", "zz", "ff"] {
            assert_eq!(path_from_hex(bad), None, "{bad}");
        }
    }

    fn decode(bytes: &[u8]) -> Vec<Packet> {
        let mut out = Vec::new();
        Unstuffer::new().feed(bytes, |p| out.push(p));
        out
    }

    #[test]
    fn packets_round_trip_through_any_chunking() {
        let packets = vec![
            Packet::Hello(0xC0DB_C0DB_0102_0304),
            Packet::Data(vec![END, ESC, 0, 1, END, END, ESC_END, ESC_ESC]),
            Packet::Ready(7),
            Packet::Data((0..=255).collect()),
            Packet::Close,
            Packet::Renew(Renewal {
                nonce: 9,
                time_ns: 0xC0C0_DBDB,
                entropy: [END; 32],
                hostname: "sbx-1".into(),
            }),
            Packet::Renewed(9),
            Packet::Readdress(Address {
                nonce: 0xC0,
                addr: [10, 88, 0xC0, 0xDB].into(),
                gateway: [10, 87, 0, 1].into(),
            }),
        ];
        let mut wire = Vec::new();
        for p in &packets {
            p.encode_into(&mut wire);
        }
        for chunk in [1, 2, 3, 7, wire.len()] {
            let mut u = Unstuffer::new();
            let mut got = Vec::new();
            for c in wire.chunks(chunk) {
                u.feed(c, |p| got.push(p));
            }
            assert_eq!(got, packets, "chunks of {chunk}");
        }
    }

    #[test]
    fn a_packet_cut_short_ends_before_the_next_one() {
        let mut first = Vec::new();
        Packet::Data(b"half of something".to_vec()).encode_into(&mut first);
        // A dead host's last packet: its END never sent. What arrived of
        // it is still its connection's (the receiver hands it to the old
        // connection, which is being dropped); the Hello after it is read
        // whole and alone.
        let mut wire = first[..first.len() - 5].to_vec();
        Packet::Hello(42).encode_into(&mut wire);
        assert_eq!(
            decode(&wire),
            vec![Packet::Data(b"half of somet".to_vec()), Packet::Hello(42)]
        );
        // Cut inside an escape: dropped.
        let mut wire = vec![END, DATA, b'a', ESC];
        Packet::Hello(43).encode_into(&mut wire);
        assert_eq!(decode(&wire), vec![Packet::Hello(43)]);
    }

    #[test]
    fn malformed_packets_are_dropped() {
        let mut wire = vec![
            END, DATA, ESC, b'x', END, END, 99, 1, END, END, HELLO, 1, 2, END,
        ];
        Packet::Close.encode_into(&mut wire);
        assert_eq!(decode(&wire), vec![Packet::Close]);
    }

    #[test]
    fn an_overlong_packet_is_dropped_without_growing_past_the_limit() {
        let mut wire = vec![END, DATA];
        wire.extend(std::iter::repeat_n(b'a', MAX_PACKET + 10));
        wire.push(END);
        Packet::Ready(1).encode_into(&mut wire);
        let mut u = Unstuffer::new();
        let mut got = Vec::new();
        u.feed(&wire, |p| got.push(p));
        assert_eq!(got, vec![Packet::Ready(1)]);
        assert!(u.raw.capacity() <= 2 * MAX_PACKET + 64);
    }
}
