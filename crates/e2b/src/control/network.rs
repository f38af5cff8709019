//! E2B's sandbox network over brig's policy: create's
//! `allow_internet_access` and `network`, `PUT /sandboxes/{id}/network`,
//! with E2B's semantics (reference `e2b-network.md` §2), which differ from
//! brig's own in three ways:
//!
//! - **an allow rule beats a deny rule**: `allowOut` lists exceptions to
//!   `denyOut` ([`Precedence::Allow`]);
//! - **`0.0.0.0/0` in `denyOut` is "deny all"** (brig's [`Mode::Allow`]);
//!   `allow_internet_access: false` adds it;
//! - `denyOut` holds only IPs and CIDRs, and a domain in `allowOut` needs
//!   the deny-all (domains only narrow it).
//!
//! What E2B always refuses (private, link-local, loopback ranges) brig
//! refuses too, whatever the rules. brig is stricter in one place: a
//! domain rule admits a connection only to an address the name resolved to
//! for this sandbox through brig's resolver (E2B's proxy resolves the name
//! itself); the effect for a client is the same.
//!
//! `rules` (`{host: [{transform: {headers: {NAME: VALUE}}}]}`) become
//! brig's header injections (`brig_net::inject`), `${e2b.secrets.NAME}` the
//! tenant's secret NAME; like E2B's, a rule allows nothing by itself.
//!
//! `egressProxy` (`{address, username?, password?}`) tunnels every allowed
//! connection through that SOCKS5 proxy, failing closed.
//!
//! Not yet supported, refused with 400 rather than ignored: `egressProxy.tls`,
//! `httpsPorts`, workload-identity placeholders (`${e2b.identity.…}`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use brig_net::policy::Precedence;
use brig_net::{Mode, Policy, Rule, Target};

use super::wire::{self, E2bError, NetworkConfig, NetworkUpdate};
use super::{lookup, ApiKey};
use crate::E2bState;

/// E2B's `ALL_TRAFFIC`.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// What an E2B sandbox whose settings restrict nothing gets: the internet
/// under E2B's precedence, so UDP too goes out by default (E2B: "CIDR sets
/// only, allow before deny, default accept"), where brig's own default
/// admits UDP only by an address rule.
pub fn open() -> Policy {
    Policy {
        precedence: Precedence::Allow,
        ..Policy::default()
    }
}

/// The brig policy of E2B's egress settings, or a 400 naming what is
/// wrong. `None`: nothing restricts egress ([`open`] where the daemon gives
/// sandboxes a network).
pub fn policy(
    allow_internet_access: Option<bool>,
    allow_out: &[String],
    deny_out: &[String],
    rules: Option<&serde_json::Map<String, serde_json::Value>>,
    egress_proxy: Option<&serde_json::Value>,
) -> Result<Option<Policy>, E2bError> {
    let inject = injections(rules)?;
    let egress_proxy = socks(egress_proxy)?;
    let mut deny_all = allow_internet_access == Some(false);
    let mut deny = Vec::new();
    for entry in deny_out {
        if entry.trim() == ALL_TRAFFIC {
            deny_all = true;
            continue;
        }
        let rule = net_rule(entry).ok_or_else(|| {
            E2bError::bad_request(format!(
                "invalid denyOut entry {entry:?}: denyOut takes IP addresses and CIDR ranges \
                 (use {ALL_TRAFFIC:?} to deny all traffic; domains go in allowOut)"
            ))
        })?;
        if let Target::Net(net) = &rule.target {
            if net.addr().is_unspecified() {
                return Err(E2bError::bad_request(format!(
                    "invalid denyOut entry {entry:?}: an unspecified address; use {ALL_TRAFFIC:?} \
                     to deny all traffic"
                )));
            }
        }
        deny.push(rule);
    }
    let mut allow = Vec::new();
    let mut domains = Vec::new();
    for entry in allow_out {
        let trimmed = entry.trim();
        let rule = if trimmed == "*" {
            Rule::any_name()
        } else if let Some(rule) = net_rule(trimmed) {
            rule
        } else {
            trimmed.parse::<Rule>().map_err(|e| {
                E2bError::bad_request(format!(
                    "invalid allowOut entry {entry:?}: {e} (allowOut takes IPs, CIDRs and domains: \
                     a.com, *.a.com or *)"
                ))
            })?
        };
        if !matches!(rule.target, Target::Net(_)) {
            domains.push(trimmed.to_string());
        }
        allow.push(rule);
    }
    // E2B's check reads denyOut alone (allow_internet_access does not count).
    if !domains.is_empty() && !deny_out.iter().any(|d| d.trim() == ALL_TRAFFIC) {
        return Err(E2bError::bad_request(format!(
            "allowOut has domains ({}): denyOut must include ALL_TRAFFIC ({ALL_TRAFFIC:?}), as \
             domain rules only make exceptions to a deny-all",
            domains.join(", ")
        )));
    }
    if !deny_all && deny.is_empty() && inject.is_empty() && egress_proxy.is_none() {
        return Ok(None);
    }
    if deny_all && allow.is_empty() && inject.is_empty() && egress_proxy.is_none() {
        return Ok(Some(Policy::none()));
    }
    let policy = Policy {
        mode: if deny_all { Mode::Allow } else { Mode::Public },
        allow,
        deny,
        hosts: Vec::new(),
        precedence: Precedence::Allow,
        inject,
        egress_proxy,
    };
    policy
        .validate()
        .map_err(|e| E2bError::bad_request(format!("invalid network: {e}")))?;
    Ok(Some(policy))
}

/// An IP or CIDR (no port) as a rule; `None` for anything else.
fn net_rule(entry: &str) -> Option<Rule> {
    entry
        .trim()
        .parse::<Rule>()
        .ok()
        .filter(|r| matches!(r.target, Target::Net(_)) && r.ports.is_none())
}

/// E2B's limits on `rules` (infra's `validateNetworkRules`).
const MAX_RULE_DOMAINS: usize = 10;
const MAX_RULE_HEADERS: usize = 20;

/// `rules` as brig's injections, or a 400 naming what is wrong.
fn injections(
    rules: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Vec<brig_net::policy::Injection>, E2bError> {
    let Some(rules) = rules else {
        return Ok(Vec::new());
    };
    let bad = |m: String| E2bError::bad_request(format!("invalid network rules: {m}"));
    if rules.len() > MAX_RULE_DOMAINS {
        return Err(bad(format!(
            "{} domains (at most {MAX_RULE_DOMAINS})",
            rules.len()
        )));
    }
    let mut out = Vec::new();
    for (host, list) in rules {
        let list = list
            .as_array()
            .ok_or_else(|| bad(format!("{host:?}: a list of rules is expected")))?;
        if list.len() > 1 {
            return Err(bad(format!("{host:?}: one rule per domain")));
        }
        let rule: brig_net::Rule = host
            .parse()
            .map_err(|e| bad(format!("{host:?} is not a domain: {e}")))?;
        let headers = list
            .first()
            .and_then(|r| r.get("transform"))
            .and_then(|t| t.get("headers"))
            .and_then(|h| h.as_object());
        let Some(headers) = headers else { continue };
        if headers.len() > MAX_RULE_HEADERS {
            return Err(bad(format!(
                "{host:?}: {} headers (at most {MAX_RULE_HEADERS})",
                headers.len()
            )));
        }
        for (name, value) in headers {
            let value = value
                .as_str()
                .ok_or_else(|| bad(format!("{host:?}: the value of {name} must be a string")))?;
            if value.contains("${e2b.identity.") {
                return Err(bad(format!(
                    "{host:?}: {name}: workload-identity tokens are not supported by this brig \
                     server yet"
                )));
            }
            let injection = brig_net::policy::Injection {
                host: rule.clone(),
                header: name.clone(),
                value: value.replace("${e2b.secrets.", "${secrets."),
            };
            injection
                .check()
                .map_err(|e| bad(format!("{host:?}: {name}: {e}")))?;
            out.push(injection);
        }
    }
    Ok(out)
}

/// `egressProxy` as brig's, or a 400.
fn socks(
    proxy: Option<&serde_json::Value>,
) -> Result<Option<brig_net::policy::EgressProxy>, E2bError> {
    let Some(p) = proxy.filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let bad = |m: String| E2bError::bad_request(format!("invalid egressProxy: {m}"));
    if p.get("tls")
        .is_some_and(|t| t.get("enabled") == Some(&serde_json::Value::Bool(true)))
    {
        return Err(bad(
            "TLS to the proxy is not supported by this brig server yet".to_string(),
        ));
    }
    let text = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let proxy = brig_net::policy::EgressProxy {
        address: text("address").ok_or_else(|| bad("address is required (host:port)".into()))?,
        username: text("username"),
        password: text("password"),
    };
    proxy.check().map_err(bad)?;
    Ok(Some(proxy))
}

/// What brig cannot do yet, refused rather than ignored.
pub fn check_supported(https_ports: Option<&[u16]>) -> Result<(), E2bError> {
    if https_ports.is_some_and(|p| !p.is_empty()) {
        return Err(E2bError::bad_request(
            "httpsPorts is not supported by this brig server: the data plane reaches sandbox \
             ports over plain HTTP",
        ));
    }
    Ok(())
}

/// Create's ingress settings, checked: `allowPublicTraffic: false` needs
/// `secure`; `maskRequestHost` must be a `host[:port]` (with `${PORT}`).
pub fn check_ingress(network: &NetworkConfig, secure: Option<bool>) -> Result<(), E2bError> {
    if network.allow_public_traffic == Some(false) && secure == Some(false) {
        return Err(E2bError::bad_request(
            "allowPublicTraffic false needs a secure sandbox: create it with secure true",
        ));
    }
    if let Some(mask) = &network.mask_request_host {
        let host = mask.replace("${PORT}", "1");
        let ok = !host.is_empty()
            && host.is_ascii()
            && host.parse::<axum::http::uri::Authority>().is_ok()
            && !host.contains(['/', '@', '?', '#']);
        if !ok {
            return Err(E2bError::bad_request(format!(
                "invalid maskRequestHost {mask:?}: give host or host:port (ASCII), optionally \
                 with ${{PORT}}"
            )));
        }
    }
    if let Some(servers) = &network.dns_servers {
        check_dns_servers(servers)?;
    }
    Ok(())
}

fn check_dns_servers(servers: &[String]) -> Result<(), E2bError> {
    if servers.len() > 10 {
        return Err(E2bError::bad_request(format!(
            "too many dnsServers ({}; at most 10)",
            servers.len()
        )));
    }
    if let Some(bad) = servers
        .iter()
        .find(|s| s.parse::<std::net::Ipv4Addr>().is_err())
    {
        return Err(E2bError::bad_request(format!(
            "invalid dnsServers entry {bad:?}: an IPv4 address is expected"
        )));
    }
    Ok(())
}

/// `PUT /sandboxes/{id}/network`: replace the egress configuration as a
/// whole (an absent field is cleared; `{}` opens egress again); 204.
pub async fn update(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let req: NetworkUpdate = wire::body(&body)?;
    let sb = lookup(&state, &tenant, &id)?;

    if let Some(servers) = &req.dns_servers {
        check_dns_servers(servers)?;
    }
    let policy = policy(
        req.allow_internet_access,
        req.allow_out.as_deref().unwrap_or_default(),
        req.deny_out.as_deref().unwrap_or_default(),
        req.rules.as_ref(),
        req.egress_proxy.as_ref(),
    )?
    .unwrap_or_else(open);
    let manager = Arc::clone(&state.manager);
    let registry = Arc::clone(&state.sandboxes);
    tokio::task::spawn_blocking(move || -> Result<(), E2bError> {
        manager.set_network(&tenant, &sb.id, policy)?;
        // What GET shows: the egress part as given now, the ingress part as
        // created; `allow_internet_access` changes only when given (E2B's
        // own behaviour).
        let mut kept = (*sb).clone();
        let ingress = kept.network.take().unwrap_or_default();
        kept.network = Some(NetworkConfig {
            allow_out: req.allow_out,
            deny_out: req.deny_out,
            rules: req.rules,
            // As E2B shows it: never the password.
            egress_proxy: req.egress_proxy.map(without_password),
            dns_servers: req.dns_servers,
            ..ingress
        });
        if req.allow_internet_access.is_some() {
            kept.allow_internet_access = req.allow_internet_access;
        }
        crate::keep(&manager, &kept);
        registry.insert(kept);
        Ok(())
    })
    .await
    .map_err(E2bError::from)??;
    Ok(StatusCode::NO_CONTENT)
}

/// An `egressProxy` as `get_info` shows it.
pub fn without_password(mut p: serde_json::Value) -> serde_json::Value {
    if let Some(o) = p.as_object_mut() {
        o.remove("password");
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    fn got(aia: Option<bool>, allow: &[&str], deny: &[&str]) -> Result<Option<Policy>, String> {
        policy(aia, &strings(allow), &strings(deny), None, None).map_err(|e| e.message)
    }

    #[test]
    fn e2b_settings_become_brig_policies() {
        // Nothing restricts: the daemon's default.
        assert_eq!(got(Some(true), &[], &[]), Ok(None));
        assert_eq!(got(None, &["1.1.1.1"], &[]), Ok(None));
        // Deny-all, by either spelling, with nothing allowed: none.
        assert_eq!(got(Some(false), &[], &[]), Ok(Some(Policy::none())));
        assert_eq!(got(None, &[], &[ALL_TRAFFIC]), Ok(Some(Policy::none())));
        // Deny-all with exceptions: allow mode, allow rules winning.
        let p = got(Some(false), &["1.1.1.1", "10.0.0.0/8"], &[])
            .unwrap()
            .unwrap();
        assert_eq!(p.mode, Mode::Allow);
        assert_eq!(p.precedence, Precedence::Allow);
        assert_eq!(p.allow.len(), 2);
        // Some ranges denied: public minus them.
        let p = got(None, &["8.8.8.8"], &["8.8.8.0/24"]).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Public);
        assert_eq!(p.deny[0].to_string(), "8.8.8.0/24");
        // Domains, `*.` and `*`, with the deny-all E2B requires.
        let p = got(None, &["example.com", "*.example.org", "*"], &[ALL_TRAFFIC])
            .unwrap()
            .unwrap();
        assert_eq!(p.mode, Mode::Allow);
        assert!(p.allow.iter().any(|r| r.target == Target::AnyName));
    }

    #[test]
    fn bad_e2b_settings_are_a_clear_400() {
        for (aia, allow, deny, expect) in [
            (
                None,
                &["example.com"][..],
                &[][..],
                "must include ALL_TRAFFIC",
            ),
            // allow_internet_access false does not count for that check.
            (Some(false), &["example.com"][..], &[][..], "ALL_TRAFFIC"),
            (None, &[][..], &["example.com"][..], "denyOut takes IP"),
            (None, &[][..], &["0.0.0.0"][..], "unspecified"),
            (None, &[][..], &["::/0"][..], "unspecified"),
            (None, &[][..], &["1.2.3.4:80"][..], "denyOut takes IP"),
            (
                None,
                &["a.*.com"][..],
                &[ALL_TRAFFIC][..],
                "invalid allowOut entry",
            ),
        ] {
            let e = got(aia, allow, deny).expect_err(expect);
            assert!(e.contains(expect), "{allow:?} {deny:?}: {e}");
        }
        assert!(check_supported(Some(&[443])).is_err());
        assert!(check_supported(None).is_ok());
        // egressProxy: a SOCKS5 proxy, E2B's rules.
        let p = policy(None, &[], &[], None, Some(&serde_json::json!({"address": "proxy.example:1080", "username": "u", "password": "p"})))
            .unwrap()
            .unwrap();
        assert_eq!(p.egress_proxy.unwrap().username.as_deref(), Some("u"));
        for (bad, says) in [
            (serde_json::json!({"address": "proxy"}), "HOST:PORT"),
            (serde_json::json!({"address": "proxy:0"}), "HOST:PORT"),
            (
                serde_json::json!({"address": "10.0.0.1:1080"}),
                "may never reach",
            ),
            (
                serde_json::json!({"address": "p:1", "password": "x"}),
                "needs a username",
            ),
            (
                serde_json::json!({"address": "p:1", "tls": {"enabled": true}}),
                "TLS",
            ),
            (serde_json::json!({}), "address is required"),
        ] {
            let e = policy(None, &[], &[], None, Some(&bad))
                .unwrap_err()
                .message;
            assert!(e.contains(says), "{bad}: {e}");
        }
        // rules: transforms become injections; E2B's limits hold.
        let rules = |v: serde_json::Value| v.as_object().cloned().unwrap();
        let p = policy(
            None,
            &[],
            &[],
            Some(&rules(
                serde_json::json!({"api.example.com": [{"transform": {"headers": {
                "Authorization": "Bearer ${e2b.secrets.openai}"}}}]}),
            )),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.mode, Mode::Public);
        assert_eq!(p.inject.len(), 1);
        assert_eq!(p.inject[0].value, "Bearer ${secrets.openai}");
        assert_eq!(p.inject[0].secrets().unwrap(), ["openai"]);
        for (bad, says) in [
            (
                serde_json::json!({"a.com": [{}, {}]}),
                "one rule per domain",
            ),
            (
                serde_json::json!({"a.com": [{"transform": {"headers": {"Host": "x"}}}]}),
                "frames",
            ),
            (
                serde_json::json!({"a.com": [{"transform": {"headers": {"X": "${e2b.secrets.}"}}}]}),
                "secret",
            ),
            (
                serde_json::json!({"a.com": [{"transform": {"headers": {"X": "${e2b.identity.tokens.t}"}}}]}),
                "workload-identity",
            ),
            (serde_json::json!({"a b": [{}]}), "not a domain"),
        ] {
            let e = policy(None, &[], &[], Some(&rules(bad.clone())), None)
                .unwrap_err()
                .message;
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many: serde_json::Map<String, serde_json::Value> = (0..11)
            .map(|i| (format!("h{i}.com"), serde_json::json!([{}])))
            .collect();
        assert!(policy(None, &[], &[], Some(&many), None).is_err());
        let net = NetworkConfig {
            allow_public_traffic: Some(false),
            ..NetworkConfig::default()
        };
        assert!(check_ingress(&net, Some(false)).is_err());
        assert!(check_ingress(&net, Some(true)).is_ok());
        for (mask, ok) in [
            ("localhost:${PORT}", true),
            ("example.com", true),
            ("exa mple", false),
            ("a/b", false),
            ("", false),
            ("ünï.com", false),
        ] {
            let net = NetworkConfig {
                mask_request_host: Some(mask.into()),
                ..NetworkConfig::default()
            };
            assert_eq!(check_ingress(&net, None).is_ok(), ok, "{mask}");
        }
        let many = NetworkConfig {
            dns_servers: Some(vec!["8.8.8.8".into(); 11]),
            ..NetworkConfig::default()
        };
        assert!(check_ingress(&many, None).is_err());
        let v6 = NetworkConfig {
            dns_servers: Some(vec!["::1".into()]),
            ..NetworkConfig::default()
        };
        assert!(check_ingress(&v6, None).is_err());
    }
}
