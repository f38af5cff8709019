//! The gateway's links, made over rtnetlink: the kernel's own interface for
//! links, addresses, routes and rules, one socket per network namespace (a
//! netlink socket acts in the namespace it was opened in). Requests are
//! built with the `netlink-packet-route` crate and sent synchronously, each
//! acknowledged before the next; a refusal comes back as the kernel's errno.
//!
//! It replaces two runs of iproute2's `ip` per sandbox (a process start
//! each, most of a millisecond on this machine) with a few system calls.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::RawFd;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The main routing table.
pub const MAIN_TABLE: u32 = 254;

/// A route to add.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub via: Option<Ipv4Addr>,
    pub oif: u32,
    pub table: u32,
    /// `local`: every address in it is this host's (the gateway's
    /// catch-all); otherwise unicast.
    pub local: bool,
}

/// An rtnetlink socket on the namespace of the thread that opened it.
#[derive(Debug)]
pub struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    /// A socket acting in the calling thread's network namespace.
    pub fn open() -> io::Result<Rtnl> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Send `msg`, wait for the kernel's answer; what it sent back besides
    /// the acknowledgement (a link, for a query).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Option<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        let mut answer = None;
        loop {
            let (bytes, _) = self.socket.recv_from_full()?;
            let mut at = 0;
            while at < bytes.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[at..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = msg.header.length as usize;
                if msg.header.sequence_number == self.seq {
                    match msg.payload {
                        // An acknowledgement, or the kernel's errno.
                        NetlinkPayload::Error(e) => {
                            return match e.code {
                                None => Ok(answer),
                                Some(_) => Err(e.to_io()),
                            };
                        }
                        NetlinkPayload::InnerMessage(inner) => answer = Some(inner),
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                at += len;
            }
        }
    }

    /// The index of link `name`.
    pub fn index(&mut self, name: &str) -> io::Result<u32> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(msg), 0)? {
            Some(RouteNetlinkMessage::NewLink(link)) => Ok(link.header.index),
            _ => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no link {name}"),
            )),
        }
    }

    /// Set link `index` up.
    pub fn up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(msg), 0).map(drop)
    }

    /// Set link `index` up with `flags` besides (`Noarp`: it answers no
    /// ARP for the addresses of the namespace).
    pub fn up_with(&mut self, index: u32, flags: LinkFlags) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up | flags;
        msg.header.change_mask = LinkFlags::Up | flags;
        self.request(RouteNetlinkMessage::SetLink(msg), 0).map(drop)
    }

    /// A bridge named `name` (no spanning tree: its ports forward at once).
    pub fn add_bridge(&mut self, name: &str) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Bridge,
            )]));
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
    }

    /// Make link `index` a port of bridge `bridge`.
    pub fn set_controller(&mut self, index: u32, bridge: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Controller(bridge));
        self.request(RouteNetlinkMessage::SetLink(msg), 0).map(drop)
    }

    /// A veth pair: `name` here, `peer` in the namespace of `peer_ns`.
    pub fn add_veth(&mut self, name: &str, peer: &str, peer_ns: RawFd) -> io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        peer_msg.attributes.push(LinkAttribute::NetNsFd(peer_ns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
    }

    /// Address `addr`/`prefix` on link `index`.
    pub fn add_address(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix;
        msg.header.index = index;
        msg.attributes
            .push(AddressAttribute::Local(IpAddr::V4(addr)));
        msg.attributes
            .push(AddressAttribute::Address(IpAddr::V4(addr)));
        self.request(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// Add `route`, as `ip route add` would.
    pub fn add_route(&mut self, route: Route) -> io::Result<()> {
        self.new_route(route, NLM_F_CREATE | NLM_F_EXCL)
    }

    /// [`Rtnl::add_route`], taking the destination over from a route
    /// that already leads it elsewhere.
    pub fn replace_route(&mut self, route: Route) -> io::Result<()> {
        self.new_route(route, NLM_F_CREATE | NLM_F_REPLACE)
    }

    fn new_route(&mut self, route: Route, flags: u16) -> io::Result<()> {
        let mut msg = RouteMessage::default();
        let h = &mut msg.header;
        h.address_family = AddressFamily::Inet;
        h.destination_prefix_length = route.prefix;
        h.table = u8::try_from(route.table).unwrap_or(0);
        h.protocol = RouteProtocol::Boot;
        (h.kind, h.scope) = match (route.local, route.via) {
            (true, _) => (RouteType::Local, RouteScope::Host),
            (false, Some(_)) => (RouteType::Unicast, RouteScope::Universe),
            (false, None) => (RouteType::Unicast, RouteScope::Link),
        };
        if route.prefix > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(route.dst)));
        }
        if let Some(via) = route.via {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(via)));
        }
        msg.attributes.push(RouteAttribute::Oif(route.oif));
        msg.attributes.push(RouteAttribute::Table(route.table));
        self.request(RouteNetlinkMessage::NewRoute(msg), flags)
            .map(drop)
    }

    /// A policy-routing rule: packets from `from`/`prefix` look up `table`.
    pub fn add_rule(
        &mut self,
        from: Ipv4Addr,
        prefix: u8,
        table: u32,
        pref: u32,
    ) -> io::Result<()> {
        let mut msg = RuleMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.src_len = prefix;
        msg.header.table = u8::try_from(table).unwrap_or(0);
        msg.header.action = RuleAction::ToTable;
        msg.attributes.push(RuleAttribute::Source(IpAddr::V4(from)));
        msg.attributes.push(RuleAttribute::Priority(pref));
        msg.attributes.push(RuleAttribute::Table(table));
        self.request(RouteNetlinkMessage::NewRule(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
    }
}
