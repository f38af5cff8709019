//! The egress policy of one sandbox, and the decision it makes for each
//! outgoing connection and each DNS question.
//!
//! A policy has a [`Mode`] and two lists of [`Rule`]s. A rule names a target
//! (a domain, every subdomain of a domain, or an IP network) and optionally a
//! port range. The decision for a connection goes, in this order:
//!
//! 1. `none` refuses everything.
//! 2. Addresses in always-refused ranges (loopback, RFC 1918, link-local,
//!    cloud metadata, multicast, ...) are refused whatever the rules say,
//!    because reaching them would expose the host and its LAN rather than the
//!    internet. An IPv4-mapped IPv6 address is treated as its IPv4 address
//!    throughout, so it cannot be used to slip past a range or a rule.
//! 3. A matching deny rule refuses.
//! 4. `public` allows the rest; `allow` allows only what an allow rule matches.
//!
//! UDP (to any port but 53, which the resolver answers) is decided by
//! [`Policy::decide_udp`]: it carries no name, so only IP and CIDR rules
//! count, and brig's own precedence admits it only where an allow rule
//! says so, even in `public` (E2B's precedence keeps E2B's default
//! accept).
//!
//! The network layer only sees addresses, so a domain rule is checked through
//! two facts the caller supplies: the name the client asked for (TLS SNI or
//! HTTP Host, see `peek`), and whether the sandbox's own resolver answered
//! that name with this address. An allow domain rule needs both, so a client
//! cannot reach an arbitrary IP by forging a Host header or by rebinding a
//! name it controls. A deny domain rule is looser on purpose: it refuses when
//! either the claimed name or any name that resolved to the address matches,
//! since refusing too much is the safe failure for a deny rule.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// At most this many `--allow` rules per sandbox: every connection is checked
/// against each of them.
pub const MAX_ALLOW_RULES: usize = 256;
/// At most this many `--deny` rules per sandbox.
pub const MAX_DENY_RULES: usize = 256;
/// At most this many `--add-host` entries per sandbox.
pub const MAX_HOSTS: usize = 64;

/// The forms a rule may take, shown in every rule parsing error.
const RULE_FORMS: &str = "use DOMAIN, *.DOMAIN, IP or CIDR, optionally followed by :PORT or \
     :PORT-PORT (an IPv6 address or CIDR with a port goes in brackets, as in [2001:db8::1]:443)";

/// How much of the network a sandbox may reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No network at all.
    None,
    /// The public internet, minus deny rules.
    #[default]
    Public,
    /// Only what an allow rule matches, minus deny rules.
    Allow,
}

impl Mode {
    /// The name used on the command line and in serialized form.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Public => "public",
            Mode::Allow => "allow",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A network mode name that is not one of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown network mode {0:?}: use none, public or allow")]
pub struct ModeError(pub String);

impl FromStr for Mode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, ModeError> {
        match s {
            "none" => Ok(Mode::None),
            "public" => Ok(Mode::Public),
            "allow" => Ok(Mode::Allow),
            _ => Err(ModeError(s.to_owned())),
        }
    }
}

/// What a rule is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Exactly this name: lower-cased, without a trailing dot.
    Domain(String),
    /// Every subdomain of this name, at any depth, but not the name itself:
    /// `*.example.com` is stored as `example.com`.
    Wildcard(String),
    /// Every address in this network. A bare IP is a /32 or /128; host bits
    /// are cleared, and an IPv4-mapped IPv6 network is stored as IPv4.
    Net(IpNet),
    /// Every name (E2B's `*` in `allowOut`): a connection that names its
    /// destination (TLS SNI, HTTP Host) with a name that resolved to it.
    /// Not accepted from brig's own `--allow` (that is `--network public`);
    /// see [`Rule::any_name`].
    AnyName,
}

/// One `--allow` or `--deny` rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// What the rule is about.
    pub target: Target,
    /// Inclusive port range; `None` is every port.
    pub ports: Option<(u16, u16)>,
}

/// Why a rule string was refused. Every message shows the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Nothing to parse.
    #[error("empty rule: {RULE_FORMS}")]
    Empty,
    /// `*` alone, which would mean every name.
    #[error(
        "rule {0:?} would match every name: use --network public to allow everything, \
         or *.DOMAIN for the subdomains of one domain"
    )]
    BareWildcard(String),
    /// A `*` somewhere other than as the whole first label.
    #[error(
        "rule {0:?} has a misplaced '*': a wildcard may only be the whole first label, \
         as in *.example.com; {RULE_FORMS}"
    )]
    MisplacedWildcard(String),
    /// The domain part is not a valid DNS name.
    #[error("rule {rule:?} is not a valid domain ({reason}); {RULE_FORMS}")]
    InvalidName {
        /// The rule as given.
        rule: String,
        /// What is wrong with the name.
        reason: &'static str,
    },
    /// Something that looked like an address or CIDR but did not parse.
    #[error("rule {rule:?} is not a valid {what}; {RULE_FORMS}")]
    InvalidAddress {
        /// The rule as given.
        rule: String,
        /// What it looked like: "IP address", "CIDR", "IPv6 address or CIDR".
        what: &'static str,
    },
    /// Brackets that are unclosed, hold something other than IPv6, or are
    /// followed by something other than a port.
    #[error("rule {rule:?} has {problem}; {RULE_FORMS}")]
    Brackets {
        /// The rule as given.
        rule: String,
        /// What is wrong with the brackets.
        problem: &'static str,
    },
    /// The port is not a number from 1 to 65535.
    #[error("rule {rule:?} has an invalid port {port:?}: a port is a number from 1 to 65535; {RULE_FORMS}")]
    InvalidPort {
        /// The rule as given.
        rule: String,
        /// The offending port text.
        port: String,
    },
    /// Port 0, which no connection can have.
    #[error("rule {0:?} has port 0, which no connection uses: a port is a number from 1 to 65535")]
    PortZero(String),
    /// A range whose start is past its end.
    #[error("rule {rule:?} has the port range {lo}-{hi} backwards: write it as {hi}-{lo}")]
    ReversedRange {
        /// The rule as given.
        rule: String,
        /// The first port written.
        lo: u16,
        /// The second port written.
        hi: u16,
    },
}

impl Rule {
    fn ports_match(&self, port: u16) -> bool {
        match self.ports {
            None => true,
            Some((lo, hi)) => lo <= port && port <= hi,
        }
    }

    /// Whether this is a domain or wildcard rule that covers `name`.
    /// Case-insensitive, and a trailing dot on `name` is ignored.
    pub fn matches_name(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name).as_bytes();
        match &self.target {
            Target::Domain(d) => name.eq_ignore_ascii_case(d.as_bytes()),
            Target::Wildcard(d) => {
                let d = d.as_bytes();
                // A strict subdomain: at least one label, then a dot, then d.
                name.len() > d.len() + 1
                    && name[name.len() - d.len() - 1] == b'.'
                    && name[name.len() - d.len()..].eq_ignore_ascii_case(d)
            }
            Target::Net(_) => false,
            Target::AnyName => true,
        }
    }

    fn is_name_rule(&self) -> bool {
        matches!(
            self.target,
            Target::Domain(_) | Target::Wildcard(_) | Target::AnyName
        )
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, RuleError> {
        if s.is_empty() {
            return Err(RuleError::Empty);
        }
        let (host, port, bracketed) = split_port(s)?;
        let ports = port.map(|p| parse_ports(s, p)).transpose()?;
        let target = if bracketed {
            match parse_net(host) {
                Some(net @ IpNet::V6(_)) => Target::Net(canonical_net(net)),
                Some(IpNet::V4(_)) => {
                    return Err(RuleError::Brackets {
                        rule: s.to_owned(),
                        problem: "brackets around an IPv4 address: brackets are only for IPv6",
                    })
                }
                None => {
                    return Err(RuleError::InvalidAddress {
                        rule: s.to_owned(),
                        what: "IPv6 address or CIDR inside the brackets",
                    })
                }
            }
        } else {
            parse_target(s, host)?
        };
        Ok(Rule { target, ports })
    }
}

/// Splits a rule into its host part, its port part if any, and whether the
/// host part was in brackets.
fn split_port(s: &str) -> Result<(&str, Option<&str>, bool), RuleError> {
    if let Some(rest) = s.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err(RuleError::Brackets {
                rule: s.to_owned(),
                problem: "an unclosed '['",
            });
        };
        return match after {
            "" => Ok((inside, None, true)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((inside, Some(port), true)),
                None => Err(RuleError::Brackets {
                    rule: s.to_owned(),
                    problem: "something other than :PORT after ']'",
                }),
            },
        };
    }
    match s.matches(':').count() {
        0 => Ok((s, None, false)),
        1 => {
            let (host, port) = s.split_once(':').unwrap_or((s, ""));
            Ok((host, Some(port), false))
        }
        // Only IPv6 has several colons; a port after one needs brackets,
        // otherwise "2001:db8::1:443" would be ambiguous.
        _ => Ok((s, None, false)),
    }
}

fn parse_ports(rule: &str, p: &str) -> Result<(u16, u16), RuleError> {
    let one = |t: &str| -> Result<u16, RuleError> {
        let bad = || RuleError::InvalidPort {
            rule: rule.to_owned(),
            port: p.to_owned(),
        };
        // u16::from_str would take "+80"; only plain digits are a port here.
        if t.is_empty() || t.len() > 5 || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        match t.parse::<u16>() {
            Ok(0) => Err(RuleError::PortZero(rule.to_owned())),
            Ok(n) => Ok(n),
            Err(_) => Err(bad()),
        }
    };
    match p.split_once('-') {
        None => one(p).map(|n| (n, n)),
        Some((lo, hi)) => {
            let (lo, hi) = (one(lo)?, one(hi)?);
            if lo > hi {
                return Err(RuleError::ReversedRange {
                    rule: rule.to_owned(),
                    lo,
                    hi,
                });
            }
            Ok((lo, hi))
        }
    }
}

fn parse_net(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        s.parse::<IpNet>().ok()
    } else {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

/// Clears host bits and turns an IPv4-mapped IPv6 network into IPv4, since
/// decisions see IPv4-mapped addresses as IPv4.
fn canonical_net(net: IpNet) -> IpNet {
    let net = net.trunc();
    if let IpNet::V6(v6) = net {
        let mapped = v6.addr().to_ipv4_mapped();
        if let Some(v4) = mapped.filter(|_| v6.prefix_len() >= 96) {
            if let Ok(v4) = Ipv4Net::new(v4, v6.prefix_len() - 96) {
                return IpNet::V4(v4);
            }
        }
    }
    net
}

fn parse_target(rule: &str, host: &str) -> Result<Target, RuleError> {
    if host.contains(':') || host.contains('/') {
        let what = if host.contains('/') {
            "CIDR"
        } else {
            "IPv6 address or CIDR (with a port it goes in brackets)"
        };
        return parse_net(host)
            .map(|n| Target::Net(canonical_net(n)))
            .ok_or_else(|| RuleError::InvalidAddress {
                rule: rule.to_owned(),
                what,
            });
    }
    if let Ok(addr) = host.parse::<IpAddr>() {
        return Ok(Target::Net(canonical_net(IpNet::from(addr))));
    }
    if !host.is_empty() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(RuleError::InvalidAddress {
            rule: rule.to_owned(),
            what: "IP address",
        });
    }
    if host == "*" || host == "*." {
        return Err(RuleError::BareWildcard(rule.to_owned()));
    }
    let (wild, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.contains('*') {
        return Err(RuleError::MisplacedWildcard(rule.to_owned()));
    }
    let name = check_name(name).map_err(|reason| RuleError::InvalidName {
        rule: rule.to_owned(),
        reason,
    })?;
    Ok(if wild {
        Target::Wildcard(name)
    } else {
        Target::Domain(name)
    })
}

/// Lower-cases `name`, drops one trailing dot, and checks it is a DNS name:
/// labels of 1 to 63 of `a-z 0-9 - _`, at most 253 bytes in all, and not
/// all-digits in the last label (which would be a malformed IPv4 address).
/// Returns `None` for anything else, including IP literals.
pub fn normalize_name(name: &str) -> Option<String> {
    check_name(name).ok()
}

fn check_name(name: &str) -> Result<String, &'static str> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("the name is empty");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    let name = name.to_ascii_lowercase();
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (two dots in a row, or a leading dot)");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-', '_' and dots are allowed");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("it looks like an IP address but is not a valid one");
    }
    Ok(name)
}

struct PortsDisplay((u16, u16));

impl fmt::Display for PortsDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            (lo, hi) if lo == hi => write!(f, "{lo}"),
            (lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Domain(d) => f.write_str(d)?,
            Target::Wildcard(d) => write!(f, "*.{d}")?,
            Target::AnyName => f.write_str("*")?,
            Target::Net(n) => {
                let bracket = n.addr().is_ipv6() && self.ports.is_some();
                if bracket {
                    f.write_str("[")?;
                }
                if n.prefix_len() == n.max_prefix_len() {
                    write!(f, "{}", n.addr())?;
                } else {
                    write!(f, "{n}")?;
                }
                if bracket {
                    f.write_str("]")?;
                }
            }
        }
        match self.ports {
            Some(p) => write!(f, ":{}", PortsDisplay(p)),
            None => Ok(()),
        }
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Deserialized is what was serialized: a kept policy may hold
/// [`Rule::any_name`], which brig's own parser refuses.
impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "*" {
            return Ok(Rule::any_name());
        }
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Rule {
    /// E2B's `*`: every name, on every port.
    pub fn any_name() -> Rule {
        Rule {
            target: Target::AnyName,
            ports: None,
        }
    }
}

/// The egress policy of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// How much of the network the sandbox may reach.
    pub mode: Mode,
    /// `--allow` rules: what [`Mode::Allow`] admits (with
    /// [`Precedence::Allow`], also exceptions to the deny rules).
    pub allow: Vec<Rule>,
    /// `--deny` rules; they beat allow rules and the public mode, unless
    /// `precedence` says otherwise.
    pub deny: Vec<Rule>,
    /// `--add-host NAME:IP` entries, answered by the sandbox's resolver.
    pub hosts: Vec<(String, IpAddr)>,
    /// Which wins when an allow and a deny rule both match.
    #[serde(skip_serializing_if = "Precedence::is_deny")]
    pub precedence: Precedence,
    /// Headers the egress proxy sets on HTTP requests to some hosts, with
    /// values that may name secrets (`inject.rs`). An injection does not
    /// allow anything: the host must be reachable under the rules.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<Injection>,
    /// A SOCKS5 proxy every allowed connection goes through (after the
    /// policy's decision); never around it: if it cannot be reached, the
    /// connection fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<EgressProxy>,
}

/// A SOCKS5 proxy for egress (`--egress-proxy socks5://[USER:PASS@]HOST:PORT`,
/// E2B's `egressProxy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressProxy {
    /// `HOST:PORT`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl EgressProxy {
    /// `socks5://[USER[:PASS]@]HOST:PORT` (or `HOST:PORT`).
    pub fn parse_url(url: &str) -> Result<EgressProxy, String> {
        let rest = url.strip_prefix("socks5://").unwrap_or(url);
        if rest.contains("://") {
            return Err(format!(
                "{url:?}: only SOCKS5 proxies are supported (socks5://[USER:PASS@]HOST:PORT)"
            ));
        }
        let (creds, address) = match rest.rsplit_once('@') {
            Some((c, a)) => (Some(c), a),
            None => (None, rest),
        };
        let (username, password) = match creds {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (Some(u.to_string()), Some(p.to_string())),
                None => (Some(c.to_string()), None),
            },
            None => (None, None),
        };
        let p = EgressProxy {
            address: address.to_string(),
            username,
            password,
        };
        p.check().map_err(|e| format!("{url:?}: {e}"))?;
        Ok(p)
    }

    /// Why this proxy cannot be used, if it cannot (E2B's rules).
    pub fn check(&self) -> Result<(), String> {
        let (host, port) = self
            .address
            .rsplit_once(':')
            .ok_or_else(|| format!("{:?} is not HOST:PORT", self.address))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!(
                "{:?} is not HOST:PORT with a port from 1 to 65535",
                self.address
            ));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            if let Some(range) = special_range(canonical_addr(ip)) {
                return Err(format!(
                    "{ip} is in {range}, which a sandbox may never reach"
                ));
            }
        }
        for (what, v) in [("username", &self.username), ("password", &self.password)] {
            if v.as_ref().is_some_and(|v| v.len() > 255) {
                return Err(format!("the {what} is over 255 bytes"));
            }
        }
        if self.password.is_some() && self.username.is_none() {
            return Err("a password needs a username".into());
        }
        Ok(())
    }
}

/// At most this many `--inject` entries per sandbox.
pub const MAX_INJECTIONS: usize = 64;
/// The longest injected header name and value (E2B's limits).
pub const MAX_HEADER_NAME: usize = 64;
pub const MAX_HEADER_VALUE: usize = 2048;

/// `--inject HOST:HEADER=VALUE`: on HTTP requests to HOST (a domain, or
/// `*.domain` for its subdomains), set HEADER to VALUE, where
/// `${secrets.NAME}` stands for the value of the tenant's secret NAME.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    pub host: Rule,
    pub header: String,
    pub value: String,
}

/// Header names an injection may not set: they frame the message.
const FRAMING_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

impl Injection {
    /// `HOST:HEADER=VALUE`.
    pub fn parse(spec: &str) -> Result<Injection, PolicyError> {
        let bad = |reason: &str| PolicyError::BadInjection {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let (host, rest) = spec
            .split_once(':')
            .ok_or_else(|| bad("expected HOST:HEADER=VALUE"))?;
        let (header, value) = rest
            .split_once('=')
            .ok_or_else(|| bad("expected HOST:HEADER=VALUE"))?;
        let host: Rule = host.parse().map_err(|e: RuleError| bad(&e.to_string()))?;
        let i = Injection {
            host,
            header: header.to_string(),
            value: value.to_string(),
        };
        i.check().map_err(|reason| bad(&reason))?;
        Ok(i)
    }

    /// Why this injection cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.host.target, Target::Domain(_) | Target::Wildcard(_))
            || self.host.ports.is_some()
        {
            return Err(format!(
                "the host {} must be a domain or *.domain, without a port",
                self.host
            ));
        }
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if self.header.is_empty()
            || self.header.len() > MAX_HEADER_NAME
            || !self.header.bytes().all(tchar)
        {
            return Err(format!(
                "{:?} is not a header name (1 to {MAX_HEADER_NAME} letters, digits and !#$%&'*+-.^_`|~)",
                self.header
            ));
        }
        if FRAMING_HEADERS.contains(&self.header.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{} frames the request and cannot be set",
                self.header
            ));
        }
        if self.value.len() > MAX_HEADER_VALUE {
            return Err(format!("the value is over {MAX_HEADER_VALUE} bytes"));
        }
        if self
            .value
            .bytes()
            .any(|b| b == b'\r' || b == b'\n' || b == 0)
        {
            return Err("the value may not hold CR, LF or NUL".into());
        }
        self.secrets().map(drop)
    }

    /// The secrets the value names, in order, or why it is malformed.
    pub fn secrets(&self) -> Result<Vec<String>, String> {
        let mut names = Vec::new();
        let mut rest = self.value.as_str();
        while let Some(at) = rest.find("${secrets.") {
            let after = &rest[at + "${secrets.".len()..];
            let end = after
                .find('}')
                .ok_or_else(|| "an unterminated ${secrets.NAME}".to_string())?;
            let name = &after[..end];
            let ok = !name.is_empty()
                && name.len() <= 128
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                return Err(format!("${{secrets.{name}}} does not name a secret"));
            }
            names.push(name.to_ascii_lowercase());
            rest = &after[end + 1..];
        }
        Ok(names)
    }

    /// The value with each `${secrets.NAME}` replaced by `secret(NAME)`;
    /// the name of the first one that has no value, if one has none.
    pub fn render(
        &self,
        mut secret: impl FnMut(&str) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(self.value.len());
        let mut rest = self.value.as_str();
        while let Some(at) = rest.find("${secrets.") {
            out.extend_from_slice(&rest.as_bytes()[..at]);
            let after = &rest[at + "${secrets.".len()..];
            let end = after.find('}').ok_or_else(|| after.to_string())?;
            let name = after[..end].to_ascii_lowercase();
            out.extend(secret(&name).ok_or(name)?);
            rest = &after[end + 1..];
        }
        out.extend_from_slice(rest.as_bytes());
        Ok(out)
    }
}

impl Policy {
    /// The injections for requests to `name`: those of exactly that
    /// domain if any, else those of the longest matching `*.domain`.
    pub fn injections_for(&self, name: &str) -> Vec<&Injection> {
        let exact: Vec<&Injection> = self
            .inject
            .iter()
            .filter(|i| matches!(i.host.target, Target::Domain(_)) && i.host.matches_name(name))
            .collect();
        if !exact.is_empty() {
            return exact;
        }
        let longest = self
            .inject
            .iter()
            .filter(|i| i.host.matches_name(name))
            .filter_map(|i| match &i.host.target {
                Target::Wildcard(d) => Some(d.len()),
                _ => None,
            })
            .max();
        self.inject
            .iter()
            .filter(|i| {
                i.host.matches_name(name)
                    && matches!(&i.host.target, Target::Wildcard(d) if Some(d.len()) == longest)
            })
            .collect()
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: Mode::Public,
            allow: Vec::new(),
            deny: Vec::new(),
            hosts: Vec::new(),
            precedence: Precedence::Deny,
            inject: Vec::new(),
            egress_proxy: None,
        }
    }
}

impl Policy {
    /// Loopback only: nothing leaves the sandbox.
    pub fn none() -> Policy {
        Policy {
            mode: Mode::None,
            ..Policy::default()
        }
    }
}

/// Which rule wins when an allow rule and a deny rule both match a
/// destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precedence {
    /// brig's own: a deny rule beats every allow rule.
    #[default]
    Deny,
    /// E2B's: an allow rule beats every deny rule, so `allowOut` lists
    /// exceptions to `denyOut` (its `0.0.0.0/0` in `denyOut` is brig's
    /// [`Mode::Allow`]).
    Allow,
}

impl Precedence {
    fn is_deny(&self) -> bool {
        *self == Precedence::Deny
    }
}

/// Why a policy as a whole was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// More rules of one kind than the limit.
    #[error(
        "too many {flag} rules ({count}; at most {max}): merge them into CIDRs or *.DOMAIN wildcards"
    )]
    TooManyRules {
        /// "--allow" or "--deny".
        flag: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// More `--add-host` entries than the limit.
    #[error(
        "too many --add-host entries ({count}; at most {max}): keep the ones the sandbox needs"
    )]
    TooManyHosts {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An `--add-host` name that is not a DNS name.
    #[error(
        "--add-host name {name:?} is not a valid host name ({reason}): use a DNS name such as db.internal"
    )]
    InvalidHostName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `--inject` entry that cannot be used.
    #[error("--inject {spec:?}: {reason}; write HOST:HEADER=VALUE, e.g. 'api.openai.com:Authorization=Bearer ${{secrets.openai}}'")]
    BadInjection {
        /// The entry as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An egress proxy that cannot be used.
    #[error("--egress-proxy: {0}")]
    BadEgressProxy(String),
    /// More `--inject` entries than the limit.
    #[error("too many --inject entries ({0}; at most {MAX_INJECTIONS})")]
    TooManyInjections(usize),
    /// Allow rules with networking off, which would silently do nothing.
    #[error("--allow needs --network allow or public: drop --allow or change --network none")]
    AllowWithoutNetwork,
}

impl Policy {
    /// Checks the limits and the `--add-host` names, and that the rules can
    /// take effect in this mode.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.mode == Mode::None && !self.allow.is_empty() {
            return Err(PolicyError::AllowWithoutNetwork);
        }
        for (flag, rules, max) in [
            ("--allow", &self.allow, MAX_ALLOW_RULES),
            ("--deny", &self.deny, MAX_DENY_RULES),
        ] {
            if rules.len() > max {
                return Err(PolicyError::TooManyRules {
                    flag,
                    count: rules.len(),
                    max,
                });
            }
        }
        if self.hosts.len() > MAX_HOSTS {
            return Err(PolicyError::TooManyHosts {
                count: self.hosts.len(),
                max: MAX_HOSTS,
            });
        }
        for (name, _) in &self.hosts {
            check_name(name).map_err(|reason| PolicyError::InvalidHostName {
                name: name.clone(),
                reason,
            })?;
        }
        if let Some(p) = &self.egress_proxy {
            p.check().map_err(PolicyError::BadEgressProxy)?;
        }
        if self.inject.len() > MAX_INJECTIONS {
            return Err(PolicyError::TooManyInjections(self.inject.len()));
        }
        for i in &self.inject {
            i.check().map_err(|reason| PolicyError::BadInjection {
                spec: format!("{}:{}={}", i.host, i.header, i.value),
                reason,
            })?;
        }
        Ok(())
    }
}

/// The outcome of [`Policy::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The connection may go ahead.
    Allow,
    /// The connection is refused, for this reason.
    Deny(DenyReason),
}

impl Verdict {
    /// Whether this is [`Verdict::Allow`].
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow)
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// The sandbox has `--network none`.
    NetworkNone,
    /// A deny rule matched.
    Denied,
    /// Allow mode, and no allow rule matched.
    NotAllowed,
    /// The address is in an always-refused range, named here.
    Special(&'static str),
    /// A domain rule matched the name, but the sandbox's resolver never
    /// answered that name with this address.
    NameMismatch,
    /// UDP from a sandbox whose egress goes through a SOCKS5 proxy, which
    /// tunnels TCP only (E2B: "UDP (DNS, QUIC) is not tunnelled").
    NotTunnelled,
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::NetworkNone => f.write_str("networking is off for this sandbox"),
            DenyReason::Denied => f.write_str("a --deny rule matches"),
            DenyReason::NotAllowed => f.write_str("no --allow rule matches"),
            DenyReason::Special(range) => write!(f, "{range} addresses are always refused"),
            DenyReason::NameMismatch => {
                f.write_str("the name did not resolve to this address for this sandbox")
            }
            DenyReason::NotTunnelled => {
                f.write_str("the egress proxy does not carry UDP (it is not tunnelled)")
            }
        }
    }
}

/// One outgoing connection, as the network layer sees it.
pub struct Destination<'a> {
    /// The address connected to.
    pub addr: IpAddr,
    /// The port connected to.
    pub port: u16,
    /// The name the client asked for (HTTP Host or TLS SNI), if one was seen.
    pub name: Option<&'a str>,
    /// Whether this sandbox's resolver answered `name` with `addr`. Called
    /// with `name` exactly as given above and with [`canonical_addr`] of
    /// `addr` (IPv4-mapped IPv6 as IPv4).
    pub resolved: &'a dyn Fn(&str, IpAddr) -> bool,
    /// Every name this sandbox's resolver answered with `addr`, so that a
    /// deny domain rule also catches a connection made without a name.
    pub names_of_addr: &'a [String],
}

impl fmt::Debug for Destination<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Destination")
            .field("addr", &self.addr)
            .field("port", &self.port)
            .field("name", &self.name)
            .field("names_of_addr", &self.names_of_addr)
            .finish_non_exhaustive()
    }
}

/// `addr`, with an IPv4-mapped IPv6 address turned into its IPv4 address:
/// the kernel connects `::ffff:10.0.0.1` to `10.0.0.1`, so must the policy.
pub fn canonical_addr(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Always-refused IPv4 ranges, most specific first: (network, prefix, name).
const SPECIAL_V4: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(169, 254, 169, 254), 32, "cloud metadata"),
    (Ipv4Addr::new(0, 0, 0, 0), 32, "unspecified"),
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "this-network (0.0.0.0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (RFC 1918)"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "CGNAT"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (RFC 1918)"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private (RFC 1918)"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignment"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved (240.0.0.0/4)"),
];

/// Always-refused IPv6 ranges, most specific first. IPv4-mapped addresses
/// never get here: they are checked as IPv4.
const SPECIAL_V6: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified"),
    (Ipv6Addr::LOCALHOST, 128, "loopback"),
    (
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
        128,
        "cloud metadata",
    ),
    // Deprecated IPv4-compatible addresses, which some stacks still route.
    (Ipv6Addr::UNSPECIFIED, 96, "IPv4-compatible"),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "unique local",
    ),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "link-local"),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, "site-local"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
];

/// The well-known NAT64 prefix: its addresses carry an IPv4 address that a
/// NAT64 gateway would connect to, so they inherit that address's ranges.
const NAT64: Ipv6Addr = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);

/// The name of the always-refused range `addr` is in, if any.
pub fn special_range(addr: IpAddr) -> Option<&'static str> {
    match canonical_addr(addr) {
        IpAddr::V4(a) => {
            let a = u32::from(a);
            SPECIAL_V4
                .iter()
                .find(|(net, len, _)| prefix_eq32(a, u32::from(*net), *len))
                .map(|(_, _, name)| *name)
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            if prefix_eq128(bits, u128::from(NAT64), 96) {
                // Truncation keeps exactly the embedded low 32 bits.
                return special_range(IpAddr::V4(Ipv4Addr::from(bits as u32)));
            }
            SPECIAL_V6
                .iter()
                .find(|(net, len, _)| prefix_eq128(bits, u128::from(*net), *len))
                .map(|(_, _, name)| *name)
        }
    }
}

fn prefix_eq32(a: u32, net: u32, len: u8) -> bool {
    let shift = 32 - u32::from(len);
    a.checked_shr(shift).unwrap_or(0) == net.checked_shr(shift).unwrap_or(0)
}

fn prefix_eq128(a: u128, net: u128, len: u8) -> bool {
    let shift = 128 - u32::from(len);
    a.checked_shr(shift).unwrap_or(0) == net.checked_shr(shift).unwrap_or(0)
}

impl Policy {
    /// Decides whether the sandbox may open a connection to `dst`.
    pub fn decide(&self, dst: &Destination) -> Verdict {
        if self.mode == Mode::None {
            return Verdict::Deny(DenyReason::NetworkNone);
        }
        let addr = canonical_addr(dst.addr);
        if let Some(range) = special_range(addr) {
            return Verdict::Deny(DenyReason::Special(range));
        }
        let denied = || {
            self.deny.iter().any(|rule| {
                rule.ports_match(dst.port)
                    && match &rule.target {
                        Target::Net(net) => net.contains(&addr),
                        _ => {
                            dst.name.is_some_and(|n| rule.matches_name(n))
                                || dst.names_of_addr.iter().any(|n| rule.matches_name(n))
                        }
                    }
            })
        };
        match self.precedence {
            Precedence::Deny => {
                if denied() {
                    return Verdict::Deny(DenyReason::Denied);
                }
                if self.mode == Mode::Public {
                    return Verdict::Allow;
                }
                self.allowed(dst, addr)
            }
            Precedence::Allow => {
                let allowed = self.allowed(dst, addr);
                if allowed.is_allow() {
                    allowed
                } else if denied() {
                    Verdict::Deny(DenyReason::Denied)
                } else if self.mode == Mode::Public {
                    Verdict::Allow
                } else {
                    allowed
                }
            }
        }
    }

    /// Decides whether the sandbox may send UDP to `addr:port` (any port
    /// but 53, which the resolver answers). A datagram carries no name, so
    /// only IP and CIDR rules (with their ports) admit it:
    ///
    /// - [`Precedence::Deny`] (brig's): an allow rule must match, in
    ///   `public` too — `public` opens the internet to connections a name
    ///   or an address can be checked on, and UDP is opened address by
    ///   address — and no deny rule may. A deny domain rule refuses an
    ///   address one of `names_of_addr` (the names this sandbox resolved
    ///   to it) matches, as it does for TCP.
    /// - [`Precedence::Allow`] (E2B's, its nftables rules for everything
    ///   but TCP): an allow rule admits, else a deny rule refuses, else
    ///   `public` admits and `allow` (E2B's deny-all) refuses. Domain rules
    ///   play no part either way.
    ///
    /// Whatever the precedence, `none` refuses everything, the
    /// always-refused ranges stay refused, and a sandbox whose egress goes
    /// through a SOCKS5 proxy sends no UDP at all: the proxy carries TCP
    /// only, and sending around it would defeat it (fail closed).
    pub fn decide_udp(&self, addr: IpAddr, port: u16, names_of_addr: &[String]) -> Verdict {
        if self.mode == Mode::None {
            return Verdict::Deny(DenyReason::NetworkNone);
        }
        let addr = canonical_addr(addr);
        if let Some(range) = special_range(addr) {
            return Verdict::Deny(DenyReason::Special(range));
        }
        if self.egress_proxy.is_some() {
            return Verdict::Deny(DenyReason::NotTunnelled);
        }
        let by_address = |rule: &Rule| {
            rule.ports_match(port)
                && matches!(&rule.target, Target::Net(net) if net.contains(&addr))
        };
        let allowed = self.allow.iter().any(by_address);
        match self.precedence {
            Precedence::Deny => {
                let denied = self.deny.iter().any(|rule| {
                    by_address(rule)
                        || (rule.is_name_rule()
                            && rule.ports_match(port)
                            && names_of_addr.iter().any(|n| rule.matches_name(n)))
                });
                if denied {
                    Verdict::Deny(DenyReason::Denied)
                } else if allowed {
                    Verdict::Allow
                } else {
                    Verdict::Deny(DenyReason::NotAllowed)
                }
            }
            Precedence::Allow => {
                if allowed {
                    Verdict::Allow
                } else if self.deny.iter().any(by_address) {
                    Verdict::Deny(DenyReason::Denied)
                } else if self.mode == Mode::Public {
                    Verdict::Allow
                } else {
                    Verdict::Deny(DenyReason::NotAllowed)
                }
            }
        }
    }

    /// Whether an allow rule admits `dst` (at `addr`, canonical).
    fn allowed(&self, dst: &Destination, addr: IpAddr) -> Verdict {
        // Resolution is asked at most once, and only if a name rule needs it.
        let mut resolved: Option<bool> = None;
        let mut mismatch = false;
        for rule in &self.allow {
            if !rule.ports_match(dst.port) {
                continue;
            }
            match &rule.target {
                Target::Net(net) => {
                    if net.contains(&addr) {
                        return Verdict::Allow;
                    }
                }
                _ => {
                    let Some(name) = dst.name else { continue };
                    if !rule.matches_name(name) {
                        continue;
                    }
                    if *resolved.get_or_insert_with(|| (dst.resolved)(name, addr)) {
                        return Verdict::Allow;
                    }
                    mismatch = true;
                }
            }
        }
        Verdict::Deny(if mismatch {
            DenyReason::NameMismatch
        } else {
            DenyReason::NotAllowed
        })
    }

    /// Whether the sandbox's resolver may answer `name`. A deny rule limited
    /// to some ports does not stop resolution, since the name may still be
    /// used on the other ports; `--add-host` names are always answered unless
    /// networking is off, because the user named them explicitly.
    pub fn allows_name(&self, name: &str) -> bool {
        if self.mode == Mode::None {
            return false;
        }
        let bare = name.strip_suffix('.').unwrap_or(name);
        if self
            .hosts
            .iter()
            .any(|(h, _)| h.strip_suffix('.').unwrap_or(h).eq_ignore_ascii_case(bare))
        {
            return true;
        }
        let allowed = || {
            self.allow
                .iter()
                .any(|rule| rule.is_name_rule() && rule.matches_name(name))
        };
        if self.precedence == Precedence::Allow && allowed() {
            return true;
        }
        if self
            .deny
            .iter()
            .any(|rule| rule.ports.is_none() && rule.matches_name(name))
        {
            return false;
        }
        match self.mode {
            Mode::None => false,
            Mode::Public => true,
            Mode::Allow => allowed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn err(s: &str) -> String {
        match s.parse::<Rule>() {
            Ok(r) => panic!("{s:?} should be refused, got {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn net(s: &str) -> Target {
        Target::Net(s.parse().unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(mode: Mode, allow: &[&str], deny: &[&str]) -> Policy {
        Policy {
            mode,
            allow: allow.iter().map(|s| rule(s)).collect(),
            deny: deny.iter().map(|s| rule(s)).collect(),
            ..Policy::default()
        }
    }

    /// Decides for a connection to `addr:port` claiming `name`, in a sandbox
    /// whose resolver gave the `(name, addr)` pairs in `dns`.
    fn decide(
        p: &Policy,
        addr: &str,
        port: u16,
        name: Option<&str>,
        dns: &[(&str, &str)],
    ) -> Verdict {
        let a = ip(addr);
        let resolved = |n: &str, x: IpAddr| dns.iter().any(|(dn, da)| *dn == n && ip(da) == x);
        let names: Vec<String> = dns
            .iter()
            .filter(|(_, da)| canonical_addr(ip(da)) == canonical_addr(a))
            .map(|(dn, _)| dn.to_string())
            .collect();
        p.decide(&Destination {
            addr: a,
            port,
            name,
            resolved: &resolved,
            names_of_addr: &names,
        })
    }

    const DENY_NOT_ALLOWED: Verdict = Verdict::Deny(DenyReason::NotAllowed);
    const DENY_DENIED: Verdict = Verdict::Deny(DenyReason::Denied);
    const DENY_MISMATCH: Verdict = Verdict::Deny(DenyReason::NameMismatch);

    #[test]
    fn mode_parses_displays_and_serializes() {
        for m in [Mode::None, Mode::Public, Mode::Allow] {
            assert_eq!(m.to_string().parse::<Mode>().unwrap(), m);
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{m}\""));
            assert_eq!(serde_json::from_str::<Mode>(&json).unwrap(), m);
        }
        let e = "Public".parse::<Mode>().unwrap_err().to_string();
        assert!(e.contains("none, public or allow"), "{e}");
        assert!("".parse::<Mode>().is_err());
        assert_eq!(Mode::default(), Mode::Public);
    }

    #[test]
    fn parses_domains_and_wildcards() {
        assert_eq!(
            rule("Example.COM.").target,
            Target::Domain("example.com".into())
        );
        assert_eq!(
            rule("a_b-c.example.com").target,
            Target::Domain("a_b-c.example.com".into())
        );
        assert_eq!(rule("localhost").target, Target::Domain("localhost".into()));
        assert_eq!(
            rule("*.Example.com").target,
            Target::Wildcard("example.com".into())
        );
        assert_eq!(rule("*.com").target, Target::Wildcard("com".into()));
        assert_eq!(
            rule("*.example.com.").target,
            Target::Wildcard("example.com".into())
        );
        assert_eq!(rule("example.com").ports, None);
        assert_eq!(rule("example.com:443").ports, Some((443, 443)));
        assert_eq!(rule("*.example.com:8000-8080").ports, Some((8000, 8080)));
        assert_eq!(rule("x.com:1").ports, Some((1, 1)));
        assert_eq!(rule("x.com:65535").ports, Some((65535, 65535)));
        assert_eq!(rule("x.com:1-65535").ports, Some((1, 65535)));
        assert_eq!(rule("x.com:80-80").ports, Some((80, 80)));
    }

    #[test]
    fn parses_addresses_and_cidrs() {
        assert_eq!(rule("192.0.2.7").target, net("192.0.2.7/32"));
        assert_eq!(rule("192.0.2.0/24").target, net("192.0.2.0/24"));
        // Host bits are cleared rather than refused.
        assert_eq!(rule("192.0.2.77/24").target, net("192.0.2.0/24"));
        assert_eq!(rule("0.0.0.0/0").target, net("0.0.0.0/0"));
        assert_eq!(rule("192.0.2.7:443").ports, Some((443, 443)));
        assert_eq!(rule("198.51.100.0/24:1000-2000").ports, Some((1000, 2000)));
        assert_eq!(rule("2001:db8::1").target, net("2001:db8::1/128"));
        assert_eq!(rule("2001:DB8::/32").target, net("2001:db8::/32"));
        assert_eq!(rule("::/0").target, net("::/0"));
        let r = rule("[2001:db8::1]:443");
        assert_eq!(
            (r.target, r.ports),
            (net("2001:db8::1/128"), Some((443, 443)))
        );
        let r = rule("[2001:db8::/32]:80-90");
        assert_eq!((r.target, r.ports), (net("2001:db8::/32"), Some((80, 90))));
        assert_eq!(rule("[2001:db8::1]").target, net("2001:db8::1/128"));
        // IPv4-mapped rules become IPv4, as destinations do.
        assert_eq!(rule("::ffff:192.0.2.7").target, net("192.0.2.7/32"));
        assert_eq!(rule("::ffff:192.0.2.0/120").target, net("192.0.2.0/24"));
        assert_eq!(rule("[::ffff:192.0.2.7]:80").target, net("192.0.2.7/32"));
    }

    #[test]
    fn refuses_bad_rules_saying_why() {
        let forms = "DOMAIN, *.DOMAIN, IP or CIDR";
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("*", "every name"),
            ("*.", "every name"),
            ("*:443", "every name"),
            ("a.*.com", "misplaced '*'"),
            ("*example.com", "misplaced '*'"),
            ("example.*", "misplaced '*'"),
            ("*.*.example.com", "misplaced '*'"),
            ("**.example.com", "misplaced '*'"),
            ("exa mple.com", "only letters"),
            ("exa!mple.com", "only letters"),
            ("exämple.com", "only letters"),
            ("a..com", "empty label"),
            (".example.com", "empty label"),
            ("example.com..", "empty label"),
            ("*.", "every name"),
            ("x.com:0", "port 0"),
            ("x.com:0-80", "port 0"),
            ("x.com:", "invalid port"),
            ("x.com:65536", "invalid port"),
            ("x.com:+80", "invalid port"),
            ("x.com:http", "invalid port"),
            ("x.com:80-", "invalid port"),
            ("x.com:-80", "invalid port"),
            ("x.com:1-2-3", "invalid port"),
            ("x.com: 80", "invalid port"),
            ("x.com:9000-8000", "backwards"),
            ("192.0.2.1/33", "CIDR"),
            ("192.0.2/24", "CIDR"),
            ("256.1.1.1", "IP address"),
            ("1.2.3", "IP address"),
            ("1.2.3.4.5", "IP address"),
            ("2001:db8::1:443:zz", "IPv6"),
            ("2001:db8::/129", "CIDR"),
            ("[2001:db8::1", "unclosed"),
            ("[2001:db8::1]443", "after ']'"),
            ("[2001:db8::1]:", "invalid port"),
            ("[192.0.2.1]:80", "only for IPv6"),
            ("[example.com]:80", "inside the brackets"),
            ("[]", "inside the brackets"),
            ("/24", "CIDR"),
            (":443", "empty"),
        ];
        for (input, problem) in cases {
            let e = err(input);
            assert!(
                e.contains(problem),
                "{input:?}: {e:?} should mention {problem:?}"
            );
            assert!(!e.ends_with('.'), "{e}");
            let first = e.chars().next().unwrap();
            assert!(!first.is_uppercase(), "{e}");
            if !matches!(
                *input,
                "*" | "*." | "*:443" | "x.com:0" | "x.com:0-80" | "x.com:9000-8000"
            ) {
                assert!(
                    e.contains(forms),
                    "{input:?}: {e:?} should show the accepted forms"
                );
            }
        }
    }

    #[test]
    fn name_length_limits() {
        let label63 = "a".repeat(63);
        assert!(format!("{label63}.com").parse::<Rule>().is_ok());
        let e = err(&format!("{}a.com", label63));
        assert!(e.contains("63"), "{e}");
        // 4 labels of 63 + 3 dots = 255; trim to exactly 253 and 254.
        let long = [label63.as_str(); 4].join(".");
        assert!(long[..253].parse::<Rule>().is_ok());
        assert!(format!("{}.", &long[..253]).parse::<Rule>().is_ok());
        let e = err(&long[..254]);
        assert!(e.contains("253"), "{e}");
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "example.com",
            "*.example.com",
            "example.com:443",
            "*.example.com:80-90",
            "192.0.2.7",
            "192.0.2.7:22",
            "192.0.2.0/24",
            "192.0.2.0/24:1-1024",
            "2001:db8::1",
            "2001:db8::/32",
            "[2001:db8::1]:443",
            "[2001:db8::/32]:443-444",
        ] {
            let r = rule(s);
            assert_eq!(r.to_string(), s);
            assert_eq!(rule(&r.to_string()), r);
        }
        // Normalised on the way in, stable after.
        for (given, shown) in [
            ("EXAMPLE.com.", "example.com"),
            ("192.0.2.9/24", "192.0.2.0/24"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("x.com:7-7", "x.com:7"),
        ] {
            assert_eq!(rule(given).to_string(), shown);
            assert_eq!(rule(shown), rule(given));
        }
    }

    #[test]
    fn rules_serialize_as_strings() {
        let p = policy(
            Mode::Allow,
            &["*.example.com:443", "[2001:db8::/32]:80"],
            &["192.0.2.0/24"],
        );
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"*.example.com:443\""), "{json}");
        assert!(json.contains("\"[2001:db8::/32]:80\""), "{json}");
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        let e = serde_json::from_str::<Rule>("\"a.*.com\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("misplaced"), "{e}");
        assert_eq!(
            serde_json::from_str::<Policy>("{}").unwrap(),
            Policy::default()
        );
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let r = rule("*.example.com");
        assert!(r.matches_name("a.example.com"));
        assert!(r.matches_name("a.b.c.example.com"));
        assert!(r.matches_name("A.EXAMPLE.COM."));
        assert!(!r.matches_name("example.com"));
        assert!(!r.matches_name("example.com."));
        assert!(!r.matches_name(".example.com"));
        assert!(!r.matches_name("badexample.com"));
        assert!(!r.matches_name("a.example.com.evil"));
        assert!(!r.matches_name("com"));
        assert!(!r.matches_name(""));
        let d = rule("example.com");
        assert!(d.matches_name("EXAMPLE.com."));
        assert!(!d.matches_name("a.example.com"));
        assert!(!d.matches_name("example.co"));
        assert!(!d.matches_name("example.com.."));
        assert!(!rule("192.0.2.1").matches_name("192.0.2.1"));
    }

    #[test]
    fn none_refuses_everything() {
        let p = policy(Mode::None, &[], &[]);
        for a in ["192.0.2.1", "127.0.0.1", "2001:db8::1"] {
            assert_eq!(
                decide(&p, a, 443, None, &[]),
                Verdict::Deny(DenyReason::NetworkNone)
            );
        }
        assert!(!p.allows_name("example.com"));
    }

    #[test]
    fn special_ranges_are_always_refused() {
        let cases: &[(&str, &str)] = &[
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this-network"),
            ("10.0.0.0", "RFC 1918"),
            ("10.255.255.255", "RFC 1918"),
            ("100.64.0.0", "CGNAT"),
            ("100.127.255.255", "CGNAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.0.1", "link-local"),
            ("169.254.169.254", "cloud metadata"),
            ("172.16.0.0", "RFC 1918"),
            ("172.31.255.255", "RFC 1918"),
            ("192.168.1.1", "RFC 1918"),
            ("192.0.0.8", "IETF"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.255", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.1.2.3", "RFC 1918"),
            ("::ffff:169.254.169.254", "cloud metadata"),
            ("::ffff:0.0.0.0", "unspecified"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("::8.8.8.8", "IPv4-compatible"),
            ("64:ff9b::10.0.0.1", "RFC 1918"),
            ("64:ff9b::169.254.169.254", "cloud metadata"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("fd00:ec2::254", "cloud metadata"),
            ("fe80::1", "link-local"),
            ("febf:ffff::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
        ];
        // Rules that would otherwise allow everything must not matter.
        let allow_all = policy(Mode::Allow, &["0.0.0.0/0", "::/0"], &[]);
        let public = policy(Mode::Public, &[], &[]);
        for (a, name) in cases {
            for p in [&allow_all, &public] {
                match decide(p, a, 80, Some("example.com"), &[("example.com", a)]) {
                    Verdict::Deny(DenyReason::Special(r)) => {
                        assert!(r.contains(name), "{a}: {r:?} should name {name:?}")
                    }
                    v => panic!("{a} should be refused as {name}, got {v:?}"),
                }
            }
        }
    }

    #[test]
    fn edges_of_special_ranges_are_public() {
        let p = policy(Mode::Public, &[], &[]);
        for a in [
            "1.0.0.0",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "192.0.1.255",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "223.255.255.255",
            "::ffff:192.0.2.1",
            "::2:0:0",
            "2001:db8::1",
            "64:ff9b::192.0.2.1",
            "fbff:ffff::1",
            "fe00::1",
            "fe7f:ffff::1",
        ] {
            assert_eq!(decide(&p, a, 80, None, &[]), Verdict::Allow, "{a}");
        }
    }

    #[test]
    fn public_mode_honours_deny_rules() {
        let p = policy(
            Mode::Public,
            &[],
            &["192.0.2.0/24", "*.bad.example", "evil.example:443"],
        );
        assert_eq!(decide(&p, "192.0.2.200", 1, None, &[]), DENY_DENIED);
        assert_eq!(decide(&p, "::ffff:192.0.2.200", 1, None, &[]), DENY_DENIED);
        assert_eq!(decide(&p, "198.51.100.1", 1, None, &[]), Verdict::Allow);
        // The claimed name alone is enough for a deny rule.
        assert_eq!(
            decide(&p, "198.51.100.1", 80, Some("x.bad.example"), &[]),
            DENY_DENIED
        );
        // So is any name the address was resolved from, even with no name seen.
        let dns = [("x.bad.example", "198.51.100.1")];
        assert_eq!(decide(&p, "198.51.100.1", 80, None, &dns), DENY_DENIED);
        assert_eq!(
            decide(&p, "198.51.100.1", 80, Some("good.example"), &dns),
            DENY_DENIED
        );
        // Ports restrict deny rules too.
        assert_eq!(
            decide(&p, "203.0.113.1", 443, Some("evil.example"), &[]),
            DENY_DENIED
        );
        assert_eq!(
            decide(&p, "203.0.113.1", 80, Some("EVIL.example."), &[]),
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, "203.0.113.1", 443, Some("bad.example"), &[]),
            Verdict::Allow
        );
    }

    #[test]
    fn allow_mode_needs_a_rule() {
        let p = policy(
            Mode::Allow,
            &[
                "api.example.com:443",
                "*.cdn.example",
                "198.51.100.0/24:8000-8999",
                "[2001:db8::/32]:443",
            ],
            &[],
        );
        let dns = [
            ("api.example.com", "203.0.113.5"),
            ("img.eu.cdn.example", "203.0.113.6"),
        ];
        assert_eq!(
            decide(&p, "203.0.113.5", 443, Some("api.example.com"), &dns),
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, "203.0.113.5", 80, Some("api.example.com"), &dns),
            DENY_NOT_ALLOWED
        );
        assert_eq!(
            decide(&p, "203.0.113.6", 80, Some("img.eu.cdn.example"), &dns),
            Verdict::Allow
        );
        assert_eq!(decide(&p, "203.0.113.6", 80, None, &dns), DENY_NOT_ALLOWED);
        assert_eq!(
            decide(&p, "203.0.113.7", 80, Some("other.example"), &[]),
            DENY_NOT_ALLOWED
        );
        // Ports restrict CIDR rules, at and past both ends.
        for (port, ok) in [
            (7999, false),
            (8000, true),
            (8500, true),
            (8999, true),
            (9000, false),
        ] {
            let v = decide(&p, "198.51.100.9", port, None, &[]);
            assert_eq!(v.is_allow(), ok, "port {port}: {v:?}");
        }
        assert_eq!(
            decide(&p, "198.51.101.9", 8000, None, &[]),
            DENY_NOT_ALLOWED
        );
        assert_eq!(
            decide(&p, "2001:db8:ffff::1", 443, None, &[]),
            Verdict::Allow
        );
        assert_eq!(decide(&p, "2001:db9::1", 443, None, &[]), DENY_NOT_ALLOWED);
        assert_eq!(
            decide(&p, "::ffff:198.51.100.9", 8000, None, &[]),
            Verdict::Allow
        );
    }

    #[test]
    fn allow_rules_match_case_insensitively_and_ignore_trailing_dot() {
        let p = policy(Mode::Allow, &["api.example.com"], &[]);
        let dns = [("API.Example.com.", "203.0.113.5")];
        assert_eq!(
            decide(&p, "203.0.113.5", 443, Some("API.Example.com."), &dns),
            Verdict::Allow
        );
    }

    #[test]
    fn forged_names_are_name_mismatches() {
        let p = policy(Mode::Allow, &["api.example.com", "*.example.org"], &[]);
        let dns = [
            ("api.example.com", "203.0.113.5"),
            ("a.example.org", "203.0.113.8"),
        ];
        // An IP literal with a forged Host.
        assert_eq!(
            decide(&p, "198.51.100.66", 443, Some("api.example.com"), &dns),
            DENY_MISMATCH
        );
        // A name that resolved, but to another address (rebinding).
        assert_eq!(
            decide(&p, "203.0.113.8", 443, Some("api.example.com"), &dns),
            DENY_MISMATCH
        );
        assert_eq!(
            decide(&p, "203.0.113.5", 443, Some("b.example.org"), &dns),
            DENY_MISMATCH
        );
        // A name no rule covers is plainly not allowed.
        assert_eq!(
            decide(&p, "198.51.100.66", 443, Some("evil.example"), &dns),
            DENY_NOT_ALLOWED
        );
        // The apex is not covered by the wildcard.
        assert_eq!(
            decide(
                &p,
                "203.0.113.8",
                443,
                Some("example.org"),
                &[("example.org", "203.0.113.8")]
            ),
            DENY_NOT_ALLOWED
        );
        // A later rule can still allow what an earlier one mismatched.
        let p2 = policy(Mode::Allow, &["api.example.com", "198.51.100.0/24"], &[]);
        assert_eq!(
            decide(&p2, "198.51.100.66", 443, Some("api.example.com"), &dns),
            Verdict::Allow
        );
    }

    #[test]
    fn deny_beats_allow() {
        let p = policy(
            Mode::Allow,
            &["*.example.com", "198.51.100.0/24"],
            &["secret.example.com", "198.51.100.128/25:22"],
        );
        let dns = [
            ("secret.example.com", "203.0.113.9"),
            ("www.example.com", "203.0.113.10"),
        ];
        assert_eq!(
            decide(&p, "203.0.113.9", 443, Some("secret.example.com"), &dns),
            DENY_DENIED
        );
        assert_eq!(decide(&p, "203.0.113.9", 443, None, &dns), DENY_DENIED);
        assert_eq!(
            decide(&p, "203.0.113.10", 443, Some("www.example.com"), &dns),
            Verdict::Allow
        );
        assert_eq!(decide(&p, "198.51.100.200", 22, None, &[]), DENY_DENIED);
        assert_eq!(decide(&p, "198.51.100.200", 23, None, &[]), Verdict::Allow);
        assert_eq!(decide(&p, "198.51.100.100", 22, None, &[]), Verdict::Allow);
    }

    #[test]
    fn resolution_is_asked_for_the_canonical_address() {
        let p = policy(Mode::Allow, &["api.example.com"], &[]);
        let dns = [("api.example.com", "203.0.113.5")];
        assert_eq!(
            decide(&p, "::ffff:203.0.113.5", 443, Some("api.example.com"), &dns),
            Verdict::Allow
        );
    }

    #[test]
    fn validate_limits_at_and_past_the_edge() {
        let many = |n: usize| -> Vec<Rule> {
            (0..n).map(|i| rule(&format!("h{i}.example.com"))).collect()
        };
        let mut p = Policy {
            mode: Mode::Allow,
            allow: many(MAX_ALLOW_RULES),
            deny: many(MAX_DENY_RULES),
            hosts: (0..MAX_HOSTS)
                .map(|i| (format!("h{i}.internal"), ip("192.0.2.1")))
                .collect(),
            ..Policy::default()
        };
        assert_eq!(p.validate(), Ok(()));

        p.allow.push(rule("one.more"));
        let e = p.validate().unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::TooManyRules {
                    flag: "--allow",
                    count: 257,
                    max: 256
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("--allow"), "{e}");
        p.allow.pop();

        p.deny.push(rule("one.more"));
        let e = p.validate().unwrap_err();
        assert!(
            matches!(
                e,
                PolicyError::TooManyRules {
                    flag: "--deny",
                    count: 257,
                    ..
                }
            ),
            "{e:?}"
        );
        p.deny.pop();

        p.hosts.push(("one.more".into(), ip("192.0.2.1")));
        let e = p.validate().unwrap_err();
        assert!(
            matches!(e, PolicyError::TooManyHosts { count: 65, max: 64 }),
            "{e:?}"
        );
        p.hosts.pop();
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn validate_checks_host_names_and_mode() {
        let mut p = Policy::default();
        p.hosts.push(("DB.internal.".into(), ip("192.0.2.1")));
        assert_eq!(p.validate(), Ok(()));
        for bad in ["", "bad host", "*.x", "a..b", "1.2.3.4", "::1"] {
            p.hosts = vec![(bad.into(), ip("192.0.2.1"))];
            let e = p.validate().unwrap_err();
            assert!(
                matches!(e, PolicyError::InvalidHostName { .. }),
                "{bad:?}: {e:?}"
            );
            assert!(e.to_string().contains("db.internal"), "{e}");
        }
        let p = policy(Mode::None, &["example.com"], &[]);
        let e = p.validate().unwrap_err();
        assert_eq!(e, PolicyError::AllowWithoutNetwork);
        assert!(
            e.to_string()
                .starts_with("--allow needs --network allow or public"),
            "{e}"
        );
        assert_eq!(policy(Mode::None, &[], &["example.com"]).validate(), Ok(()));
        assert_eq!(
            policy(Mode::Public, &["example.com"], &[]).validate(),
            Ok(())
        );
    }

    #[test]
    fn allows_name_in_each_mode() {
        let mut p = policy(
            Mode::Public,
            &["api.example.com", "198.51.100.0/24"],
            &["*.bad.example", "ports.example:443"],
        );
        p.hosts.push(("db.internal".into(), ip("192.0.2.1")));
        p.hosts.push(("x.bad.example".into(), ip("192.0.2.2")));

        assert!(p.allows_name("anything.example"));
        assert!(!p.allows_name("a.bad.example"));
        assert!(!p.allows_name("A.BAD.EXAMPLE."));
        assert!(p.allows_name("bad.example"));
        // A deny rule on some ports leaves the name usable on the others.
        assert!(p.allows_name("ports.example"));
        assert!(p.allows_name("DB.internal."));
        assert!(p.allows_name("x.bad.example"));

        p.mode = Mode::Allow;
        assert!(p.allows_name("api.example.com"));
        assert!(p.allows_name("API.example.com."));
        assert!(!p.allows_name("www.example.com"));
        assert!(!p.allows_name("anything.example"));
        assert!(!p.allows_name("198.51.100.1"));
        assert!(!p.allows_name("a.bad.example"));
        assert!(p.allows_name("db.internal"));
        assert!(p.allows_name("x.bad.example"));

        p.mode = Mode::None;
        assert!(!p.allows_name("api.example.com"));
        assert!(!p.allows_name("db.internal"));
    }

    #[test]
    fn deny_reasons_read_as_phrases() {
        for r in [
            DenyReason::NetworkNone,
            DenyReason::Denied,
            DenyReason::NotAllowed,
            DenyReason::Special("loopback"),
            DenyReason::NameMismatch,
            DenyReason::NotTunnelled,
        ] {
            let s = r.to_string();
            assert!(!s.is_empty() && !s.ends_with('.'), "{s}");
            assert!(!s.chars().next().unwrap().is_uppercase(), "{s}");
        }
        assert_eq!(
            DenyReason::Special("loopback").to_string(),
            "loopback addresses are always refused"
        );
    }

    #[test]
    fn normalize_name_accepts_dns_names_only() {
        assert_eq!(
            normalize_name("WWW.Example.COM.").as_deref(),
            Some("www.example.com")
        );
        for bad in [
            "", ".", "a..b", "1.2.3.4", "::1", "[::1]", "a b", "a/b", "*.x", "x.123",
        ] {
            assert_eq!(normalize_name(bad), None, "{bad:?}");
        }
        assert_eq!(
            normalize_name("123.example").as_deref(),
            Some("123.example")
        );
    }

    /// E2B's order: an allow rule is an exception to the deny rules, the
    /// deny rules to the mode; the always-refused ranges stay refused.
    #[test]
    fn with_allow_precedence_an_allow_rule_beats_a_deny_rule() {
        let e2b = |mode, allow: &[&str], deny: &[&str]| Policy {
            precedence: Precedence::Allow,
            ..policy(mode, allow, deny)
        };
        // denyOut ["0.0.0.0/0"], allowOut ["1.1.1.1"]: brig's allow mode.
        let p = e2b(Mode::Allow, &["1.1.1.1"], &[]);
        assert_eq!(decide(&p, "1.1.1.1", 443, None, &[]), Verdict::Allow);
        assert_eq!(decide(&p, "8.8.8.8", 443, None, &[]), DENY_NOT_ALLOWED);
        // denyOut a range, allowOut one address in it: public minus the
        // range, plus the address.
        let p = e2b(Mode::Public, &["1.1.1.1"], &["1.1.1.0/24"]);
        assert_eq!(decide(&p, "1.1.1.1", 80, None, &[]), Verdict::Allow);
        assert_eq!(decide(&p, "1.1.1.2", 80, None, &[]), DENY_DENIED);
        assert_eq!(decide(&p, "8.8.8.8", 80, None, &[]), Verdict::Allow);
        // The same rules in brig's order: the deny wins.
        let p = policy(Mode::Public, &["1.1.1.1"], &["1.1.1.0/24"]);
        assert_eq!(decide(&p, "1.1.1.1", 80, None, &[]), DENY_DENIED);
        // Allowing a private range does not open it.
        let p = e2b(Mode::Allow, &["10.0.0.0/8"], &[]);
        assert!(!decide(&p, "10.1.2.3", 80, None, &[]).is_allow());
        // A name rule still needs the name to have resolved to the address.
        let p = e2b(Mode::Allow, &["example.com"], &["93.184.216.0/24"]);
        let dns = [("example.com", "93.184.216.34")];
        assert_eq!(
            decide(&p, "93.184.216.34", 443, Some("example.com"), &dns),
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, "93.184.216.35", 443, Some("example.com"), &dns),
            DENY_DENIED
        );
        // Names: an allowed name resolves even inside a denied domain.
        let mut p = e2b(Mode::Public, &["api.example.com"], &[]);
        p.deny = vec![rule("*.example.com")];
        assert!(p.allows_name("api.example.com"));
        assert!(!p.allows_name("www.example.com"));
        assert!(p.allows_name("other.org"));
        p.precedence = Precedence::Deny;
        assert!(!p.allows_name("api.example.com"));
    }

    #[test]
    fn any_name_admits_every_name_that_resolved_and_no_bare_address() {
        let p = Policy {
            precedence: Precedence::Allow,
            allow: vec![Rule::any_name()],
            ..policy(Mode::Allow, &[], &[])
        };
        let dns = [("anything.example", "198.51.100.7")];
        assert_eq!(
            decide(&p, "198.51.100.7", 443, Some("anything.example"), &dns),
            Verdict::Allow
        );
        assert_eq!(
            decide(&p, "198.51.100.7", 443, None, &dns),
            DENY_NOT_ALLOWED
        );
        assert_eq!(
            decide(&p, "198.51.100.8", 443, Some("anything.example"), &dns),
            DENY_MISMATCH
        );
        assert!(p.allows_name("whatever.test"));
        // Kept and read back as "*"; brig's own parser still refuses it.
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains(r#""allow":["*"]"#), "{json}");
        assert!(json.contains(r#""precedence":"allow""#), "{json}");
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
        assert!("*".parse::<Rule>().is_err());
        let plain = serde_json::to_string(&Policy::default()).unwrap();
        assert!(!plain.contains("precedence"), "{plain}");
    }

    #[test]
    fn injections_parse_render_and_pick_the_closest_host() {
        let i =
            Injection::parse("api.example.com:Authorization=Bearer ${secrets.OpenAI} x").unwrap();
        assert_eq!(i.secrets().unwrap(), ["openai"]);
        let got = i
            .render(|n| (n == "openai").then(|| b"sk-1".to_vec()))
            .unwrap();
        assert_eq!(got, b"Bearer sk-1 x");
        assert_eq!(i.render(|_| None), Err("openai".to_string()));
        // No placeholder: the value as given.
        let plain = Injection::parse("a.com:X-Team=ml").unwrap();
        assert_eq!(plain.render(|_| None).unwrap(), b"ml");
        for (spec, says) in [
            ("a.com", "HOST:HEADER=VALUE"),
            ("a.com:X", "HOST:HEADER=VALUE"),
            ("a.com:Host=x", "frames the request"),
            ("a.com:Content-Length=1", "frames the request"),
            ("a.com:Bad Header=x", "not a header name"),
            ("a.com:X=${secrets.}", "does not name a secret"),
            ("a.com:X=${secrets.a", "unterminated"),
            ("a.com:X=${secrets.a b}", "does not name a secret"),
            ("10.0.0.0/8:X=y", "domain"),
            ("a.com:443:X=y", "HOST:HEADER=VALUE"),
        ] {
            let e = Injection::parse(spec).unwrap_err().to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let long = format!("a.com:X={}", "v".repeat(MAX_HEADER_VALUE + 1));
        assert!(Injection::parse(&long).is_err());
        assert!(Injection::parse(&format!("a.com:X={}", "v".repeat(MAX_HEADER_VALUE))).is_ok());
        // Exactly the host first, else the longest wildcard.
        let p = Policy {
            inject: [
                "*.example.com:A=1",
                "*.api.example.com:B=2",
                "api.example.com:C=3",
            ]
            .iter()
            .map(|s| Injection::parse(s).unwrap())
            .collect(),
            ..Policy::default()
        };
        let headers = |n: &str| -> Vec<String> {
            p.injections_for(n)
                .iter()
                .map(|i| i.header.clone())
                .collect()
        };
        assert_eq!(headers("api.example.com"), ["C"]);
        assert_eq!(headers("v1.api.example.com"), ["B"]);
        assert_eq!(headers("www.example.com"), ["A"]);
        assert!(headers("example.org").is_empty());
        let too_many = Policy {
            inject: vec![Injection::parse("a.com:X=y").unwrap(); MAX_INJECTIONS + 1],
            ..Policy::default()
        };
        assert!(matches!(
            too_many.validate(),
            Err(PolicyError::TooManyInjections(_))
        ));
    }

    fn udp(p: &Policy, addr: &str, port: u16, names: &[&str]) -> Verdict {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        p.decide_udp(ip(addr), port, &names)
    }

    fn with_proxy(mut p: Policy) -> Policy {
        p.egress_proxy = Some(EgressProxy {
            address: "203.0.113.20:1080".into(),
            username: None,
            password: None,
        });
        p
    }

    /// brig's precedence: UDP needs an address allow rule, in every mode.
    #[test]
    fn udp_under_brigs_precedence_needs_an_address_allow_rule() {
        // Public opens TCP, not UDP.
        let p = policy(Mode::Public, &[], &[]);
        assert_eq!(udp(&p, "192.0.2.1", 443, &[]), DENY_NOT_ALLOWED);
        // An IP or a CIDR admits, in public as in allow.
        for mode in [Mode::Public, Mode::Allow] {
            let p = policy(mode, &["192.0.2.1", "198.51.100.0/24"], &[]);
            assert_eq!(udp(&p, "192.0.2.1", 443, &[]), Verdict::Allow);
            assert_eq!(udp(&p, "198.51.100.77", 5000, &[]), Verdict::Allow);
            assert_eq!(udp(&p, "192.0.2.2", 443, &[]), DENY_NOT_ALLOWED);
        }
        // With its port range.
        let p = policy(Mode::Allow, &["192.0.2.0/24:3478-3479"], &[]);
        assert_eq!(udp(&p, "192.0.2.9", 3478, &[]), Verdict::Allow);
        assert_eq!(udp(&p, "192.0.2.9", 3479, &[]), Verdict::Allow);
        assert_eq!(udp(&p, "192.0.2.9", 3480, &[]), DENY_NOT_ALLOWED);
        // A domain rule never admits, even for an address it resolved to.
        let p = policy(Mode::Allow, &["example.com", "*.example.org"], &[]);
        let names = ["example.com", "www.example.org"];
        assert_eq!(udp(&p, "192.0.2.1", 443, &names), DENY_NOT_ALLOWED);
        // A deny rule wins: by address (within its ports), or by a name
        // that resolved to the address.
        let p = policy(Mode::Allow, &["192.0.2.0/24"], &["192.0.2.1:53-443"]);
        assert_eq!(udp(&p, "192.0.2.1", 443, &[]), DENY_DENIED);
        assert_eq!(udp(&p, "192.0.2.1", 444, &[]), Verdict::Allow);
        let p = policy(Mode::Allow, &["192.0.2.0/24"], &["*.example.com"]);
        assert_eq!(udp(&p, "192.0.2.1", 443, &["a.example.com"]), DENY_DENIED);
        assert_eq!(
            udp(&p, "192.0.2.1", 443, &["a.example.org"]),
            Verdict::Allow
        );
    }

    /// E2B's precedence: its nftables rules for non-TCP traffic.
    #[test]
    fn udp_under_e2bs_precedence_is_allow_then_deny_then_default() {
        let e2b = |mode, allow: &[&str], deny: &[&str]| Policy {
            precedence: Precedence::Allow,
            ..policy(mode, allow, deny)
        };
        // Default accept when the internet is open.
        let p = e2b(Mode::Public, &[], &[]);
        assert_eq!(udp(&p, "192.0.2.1", 443, &[]), Verdict::Allow);
        // A deny CIDR refuses; an allow CIDR inside it is an exception.
        let p = e2b(Mode::Public, &["192.0.2.1"], &["192.0.2.0/24"]);
        assert_eq!(udp(&p, "192.0.2.2", 443, &[]), DENY_DENIED);
        assert_eq!(udp(&p, "192.0.2.1", 443, &[]), Verdict::Allow);
        assert_eq!(udp(&p, "198.51.100.1", 443, &[]), Verdict::Allow);
        // Deny-all (ALL_TRAFFIC in denyOut, brig's allow mode): only what
        // an address allow rule lists.
        let p = e2b(Mode::Allow, &["192.0.2.1", "example.com"], &[]);
        assert_eq!(udp(&p, "192.0.2.1", 443, &[]), Verdict::Allow);
        assert_eq!(
            udp(&p, "192.0.2.2", 443, &["example.com"]),
            DENY_NOT_ALLOWED
        );
        // Domain deny rules are not E2B's: they play no part.
        let mut p = e2b(Mode::Public, &[], &[]);
        p.deny = vec![rule("*.example.com")];
        assert_eq!(
            udp(&p, "192.0.2.1", 443, &["a.example.com"]),
            Verdict::Allow
        );
    }

    /// Whatever the precedence: none, the always-refused ranges, and the
    /// egress proxy.
    #[test]
    fn udp_never_goes_to_special_ranges_nor_around_an_egress_proxy() {
        for precedence in [Precedence::Deny, Precedence::Allow] {
            let p = Policy {
                precedence,
                ..policy(
                    Mode::Public,
                    &[
                        "10.0.0.0/8",
                        "169.254.169.254",
                        "::ffff:127.0.0.1",
                        "192.0.2.1",
                    ],
                    &[],
                )
            };
            assert_eq!(
                udp(&p, "10.1.2.3", 9999, &[]),
                Verdict::Deny(DenyReason::Special("private (RFC 1918)"))
            );
            assert_eq!(
                udp(&p, "169.254.169.254", 9999, &[]),
                Verdict::Deny(DenyReason::Special("cloud metadata"))
            );
            assert_eq!(
                udp(&p, "::ffff:127.0.0.1", 9999, &[]),
                Verdict::Deny(DenyReason::Special("loopback"))
            );
            assert_eq!(udp(&p, "192.0.2.1", 9999, &[]), Verdict::Allow);
            assert_eq!(
                udp(&with_proxy(p.clone()), "192.0.2.1", 9999, &[]),
                Verdict::Deny(DenyReason::NotTunnelled)
            );
            let none = Policy {
                precedence,
                ..Policy::none()
            };
            assert_eq!(
                udp(&none, "192.0.2.1", 9999, &[]),
                Verdict::Deny(DenyReason::NetworkNone)
            );
        }
    }
}
