//! `/v1/sandboxes/{id}/network`: a sandbox's network policy (read and
//! replace) and the connections it tried.
//!
//! The policy's shape is the create body's `network` field:
//! `{"mode": "none"|"public"|"allow", "allow": [RULE…], "deny": [RULE…],
//! "hosts": {"NAME": "IP"}}` with RULE = domain | `*.domain` | IP | CIDR,
//! optionally `:port` or `:port-port`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;

use super::{blocking, sandbox_id, ApiError, AppState, Auth};

/// A network policy as clients write it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// `none` (loopback only), `public` (the internet, never the host or
    /// private ranges) or `allow` (only what `allow` admits). Default:
    /// `public` when any other field is given.
    pub mode: Option<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Extra names the sandbox's resolver answers: name → address.
    #[serde(default)]
    pub hosts: BTreeMap<String, String>,
    /// Headers set on HTTP requests to hosts, values naming secrets as
    /// `${secrets.NAME}` (the sandbox never sees them).
    #[serde(default)]
    pub inject: Vec<InjectConfig>,
    /// A SOCKS5 proxy every allowed connection goes through (never around
    /// it).
    pub egress_proxy: Option<EgressProxyConfig>,
}

/// `egress_proxy`: never shown back with its password.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressProxyConfig {
    /// `HOST:PORT`.
    pub address: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// One header injection.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InjectConfig {
    /// A domain, or `*.domain` for its subdomains.
    pub host: String,
    pub header: String,
    pub value: String,
}

impl NetworkConfig {
    /// Stage two: a validated policy, or a 400 naming the bad part.
    pub fn parse(self) -> Result<brig_net::Policy, ApiError> {
        let bad =
            |e: &dyn std::fmt::Display| ApiError::bad_request(format!("invalid network: {e}"));
        let mode = match self.mode.as_deref() {
            Some(m) => m.parse().map_err(|e| bad(&e))?,
            None => brig_net::Mode::Public,
        };
        let rules = |list: &[String], field: &str| {
            list.iter()
                .map(|r| {
                    r.parse::<brig_net::Rule>().map_err(|e| {
                        ApiError::bad_request(format!("invalid network.{field} rule {r:?}: {e}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let hosts = self
            .hosts
            .iter()
            .map(|(name, ip)| {
                ip.parse::<IpAddr>()
                    .map(|ip| (name.clone(), ip))
                    .map_err(|_| {
                        ApiError::bad_request(format!(
                            "invalid network.hosts entry {name:?}: {ip:?} is not an IP address"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let inject = self
            .inject
            .iter()
            .map(|i| {
                let host = i.host.parse::<brig_net::Rule>().map_err(|e| {
                    ApiError::bad_request(format!("invalid network.inject host {:?}: {e}", i.host))
                })?;
                Ok(brig_net::policy::Injection {
                    host,
                    header: i.header.clone(),
                    value: i.value.clone(),
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let policy = brig_net::Policy {
            mode,
            allow: rules(&self.allow, "allow")?,
            deny: rules(&self.deny, "deny")?,
            hosts,
            inject,
            egress_proxy: self.egress_proxy.map(|p| brig_net::policy::EgressProxy {
                address: p.address,
                username: p.username,
                password: p.password,
            }),
            ..brig_net::Policy::default()
        };
        policy.validate().map_err(|e| bad(&e))?;
        Ok(policy)
    }
}

/// `GET /v1/sandboxes/{id}/network`: the policy, the address and counters.
pub async fn get(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let manager = state.manager.clone();
    let info = blocking(move || manager.network(&tenant, &id)).await?;
    Ok(Json(view(&info)))
}

/// `PUT /v1/sandboxes/{id}/network`: replace the whole policy; new
/// connections and lookups follow it at once.
pub async fn put(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<NetworkConfig>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let policy = body?.0.parse()?;
    let manager = state.manager.clone();
    let info = blocking(move || manager.set_network(&tenant, &id, policy)).await?;
    Ok(Json(view(&info)))
}

/// `GET /v1/sandboxes/{id}/network/connections`: the last 1000
/// connections the sandbox tried, oldest first.
pub async fn connections(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let manager = state.manager.clone();
    let entries = blocking(move || manager.connections(&tenant, &id)).await?;
    Ok(Json(serde_json::json!({ "connections": entries })))
}

/// A policy as the API shows it (the shape it is written in).
pub fn policy_view(policy: &brig_net::Policy) -> serde_json::Value {
    serde_json::json!({
        "mode": policy.mode.as_str(),
        "allow": policy.allow.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "deny": policy.deny.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "hosts": policy.hosts.iter().map(|(n, a)| (n.clone(), serde_json::Value::String(a.to_string()))).collect::<serde_json::Map<_, _>>(),
        // "allow" only for a policy set through E2B's API, whose allow
        // rules are exceptions to its deny rules.
        "inject": policy.inject.iter().map(|i| serde_json::json!({
            "host": i.host.to_string(), "header": i.header, "value": i.value,
        })).collect::<Vec<_>>(),
        "egress_proxy": policy.egress_proxy.as_ref().map(|p| serde_json::json!({
            "address": p.address, "username": p.username,
        })),
        "precedence": match policy.precedence {
            brig_net::policy::Precedence::Deny => "deny",
            brig_net::policy::Precedence::Allow => "allow",
        },
    })
}

fn view(info: &brig_runtime::NetworkInfo) -> serde_json::Value {
    let mut v = policy_view(&info.policy);
    v["address"] = info
        .address
        .map_or(serde_json::Value::Null, |a| a.to_string().into());
    v["bytes_out"] = info.bytes_out.into();
    v["bytes_in"] = info.bytes_in.into();
    v["connections_allowed"] = info.connections_allowed.into();
    v["connections_denied"] = info.connections_denied.into();
    v
}
