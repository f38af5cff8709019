//! The daemon's Prometheus metrics, rendered in the OpenMetrics text format
//! (which Prometheus scrapes natively; the native API serves it at
//! `GET /metrics`).
//!
//! | metric | type | what |
//! |---|---|---|
//! | `brig_sandboxes{state}` | gauge | this daemon's live sandboxes, `running` or `paused` |
//! | `brig_sandbox_creates_total` | counter | sandboxes created (answered 201) |
//! | `brig_sandbox_create_seconds` | histogram | time to answer a successful create |
//! | `brig_execs_total` | counter | commands started (exec and background processes) |
//! | `brig_sandbox_ends_total{cause}` | counter | sandboxes this daemon tore down, by cause (`timeout`, `out_of_memory`, `deleted`, …) |
//! | `brig_http_requests_total{code}` | counter | HTTP requests answered, by status class (`2xx`…) |
//! | `brig_exec_timeouts_total` | counter | execs killed at their timeout (`timeout` on exec, pty) |
//! | `brig_build_info{version}` | info | always 1 |
//!
//! And one series per live sandbox, labelled `id` and `tenant` (the
//! tenant's name), read from its tier at scrape time; a sandbox's series
//! go when it ends:
//!
//! | metric | type | what |
//! |---|---|---|
//! | `brig_sandbox_cpu_seconds_total` | counter | CPU time of its processes |
//! | `brig_sandbox_memory_bytes` | gauge | memory in use (page cache included) |
//! | `brig_sandbox_memory_limit_bytes` | gauge | its memory limit |
//! | `brig_sandbox_pids` | gauge | tasks alive (processes and threads) |
//! | `brig_sandbox_oom_kills_total` | counter | processes the OOM killer killed in it |
//! | `brig_sandbox_network_sent_bytes_total` | counter | bytes its allowed connections sent out |
//! | `brig_sandbox_network_received_bytes_total` | counter | bytes they received |
//! | `brig_sandbox_connections_total{verdict}` | counter | connections it tried, `allowed` or `denied` by its policy |
//!
//! The registry knows nothing of HTTP: a front-end reports what it answered
//! ([`Metrics::answered`], [`Metrics::created`], [`Metrics::exec_started`];
//! the native API does it in one middleware, so its handlers do not know
//! about metrics), and the sandbox and pool gauges are read from the
//! [`SandboxManager`] at scrape time ([`Metrics::encode`]).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::SandboxManager;

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TemplateLabel {
    template: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SandboxLabels {
    id: String,
    tenant: String,
}

/// The per-sandbox series, rebuilt at every scrape.
#[derive(Debug, Default)]
struct PerSandbox {
    cpu_seconds: Family<SandboxLabels, Counter<f64, AtomicU64>>,
    memory: Family<SandboxLabels, Gauge>,
    memory_limit: Family<SandboxLabels, Gauge>,
    pids: Family<SandboxLabels, Gauge>,
    oom_kills: Family<SandboxLabels, Counter>,
    net_sent: Family<SandboxLabels, Counter>,
    net_received: Family<SandboxLabels, Counter>,
    connections: Family<VerdictLabels, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    id: String,
    tenant: String,
    verdict: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

/// The registry and the metrics the daemon keeps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    sandboxes: Family<StateLabel, Gauge>,
    pool_idle: Family<TemplateLabel, Gauge>,
    pool_claims: Counter,
    /// Scrapes copy the manager's numbers into the registry one at a time.
    scrape: std::sync::Mutex<()>,
    creates: Counter,
    create_seconds: Histogram,
    execs: Counter,
    http_requests: Family<CodeLabel, Counter>,
    ends: Family<CauseLabel, Counter>,
    exec_timeouts: Counter,
    per_sandbox: PerSandbox,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let sandboxes = Family::<StateLabel, Gauge>::default();
        registry.register(
            "brig_sandboxes",
            "Live sandboxes of this daemon, by state",
            sandboxes.clone(),
        );
        let pool_idle = Family::<TemplateLabel, Gauge>::default();
        registry.register(
            "brig_pool_idle",
            "Pre-made sandboxes waiting to be claimed, by template",
            pool_idle.clone(),
        );
        let pool_claims = Counter::default();
        registry.register(
            "brig_pool_claims",
            "Creates served from the pool of pre-made sandboxes",
            pool_claims.clone(),
        );
        let creates = Counter::default();
        registry.register("brig_sandbox_creates", "Sandboxes created", creates.clone());
        // A create is a spawn plus the agent's handshake: milliseconds on a
        // warm host, seconds when the host is loaded.
        let create_seconds = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        registry.register(
            "brig_sandbox_create_seconds",
            "Time to create a sandbox, until its agent answered",
            create_seconds.clone(),
        );
        let execs = Counter::default();
        registry.register(
            "brig_execs",
            "Commands started in sandboxes (exec and background processes)",
            execs.clone(),
        );
        let http_requests = Family::<CodeLabel, Counter>::default();
        registry.register(
            "brig_http_requests",
            "HTTP requests answered, by status class",
            http_requests.clone(),
        );
        let ends = Family::<CauseLabel, Counter>::default();
        registry.register(
            "brig_sandbox_ends",
            "Sandboxes this daemon tore down, by why they ended",
            ends.clone(),
        );
        let exec_timeouts = Counter::default();
        registry.register(
            "brig_exec_timeouts",
            "Execs killed at their timeout",
            exec_timeouts.clone(),
        );
        let per_sandbox = PerSandbox::default();
        registry.register(
            "brig_sandbox_cpu_seconds",
            "CPU time of a live sandbox's processes",
            per_sandbox.cpu_seconds.clone(),
        );
        registry.register(
            "brig_sandbox_memory_bytes",
            "Memory a live sandbox uses",
            per_sandbox.memory.clone(),
        );
        registry.register(
            "brig_sandbox_memory_limit_bytes",
            "A live sandbox's memory limit",
            per_sandbox.memory_limit.clone(),
        );
        registry.register(
            "brig_sandbox_pids",
            "Tasks alive in a live sandbox",
            per_sandbox.pids.clone(),
        );
        registry.register(
            "brig_sandbox_oom_kills",
            "Processes the OOM killer killed in a live sandbox",
            per_sandbox.oom_kills.clone(),
        );
        registry.register(
            "brig_sandbox_network_sent_bytes",
            "Bytes a live sandbox's allowed connections sent",
            per_sandbox.net_sent.clone(),
        );
        registry.register(
            "brig_sandbox_network_received_bytes",
            "Bytes a live sandbox's allowed connections received",
            per_sandbox.net_received.clone(),
        );
        registry.register(
            "brig_sandbox_connections",
            "Connections a live sandbox tried, by its policy's verdict",
            per_sandbox.connections.clone(),
        );
        registry.register(
            "brig_build",
            "The running brig's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics {
            registry,
            sandboxes,
            pool_idle,
            pool_claims,
            scrape: std::sync::Mutex::new(()),
            creates,
            create_seconds,
            execs,
            http_requests,
            ends,
            exec_timeouts,
            per_sandbox,
        }
    }

    /// The text exposition of every metric, with the sandbox gauges read
    /// from `manager` now.
    pub fn encode(&self, manager: &SandboxManager) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        let counts = manager.live_counts();
        for (state, n) in [("running", counts.running), ("paused", counts.paused)] {
            self.sandboxes
                .get_or_create(&StateLabel { state })
                .set(n as i64);
        }
        for (template, idle, _) in manager.pool_sizes() {
            self.pool_idle
                .get_or_create(&TemplateLabel { template })
                .set(idle as i64);
        }
        // A counter only goes up: add what was served since the last scrape.
        let served = manager.pool_claims();
        let seen = self.pool_claims.get();
        if served > seen {
            self.pool_claims.inc_by(served - seen);
        }
        for (cause, n) in manager.end_counts() {
            let counter = self.ends.get_or_create(&CauseLabel { cause });
            let seen = counter.get();
            if n > seen {
                counter.inc_by(n - seen);
            }
        }
        let timeouts = manager.exec_timeouts();
        if timeouts > self.exec_timeouts.get() {
            self.exec_timeouts
                .inc_by(timeouts - self.exec_timeouts.get());
        }
        self.sample_sandboxes(manager);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Rebuild the per-sandbox series from the live sandboxes now, so an
    /// ended sandbox's series are gone.
    fn sample_sandboxes(&self, manager: &SandboxManager) {
        let p = &self.per_sandbox;
        p.cpu_seconds.clear();
        p.memory.clear();
        p.memory_limit.clear();
        p.pids.clear();
        p.oom_kills.clear();
        p.net_sent.clear();
        p.net_received.clear();
        p.connections.clear();
        let names: std::collections::HashMap<String, String> = manager
            .store()
            .list_tenants()
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.id.0, t.name))
            .collect();
        for (id, tenant, usage) in manager.live_usage() {
            let labels = SandboxLabels {
                id: id.to_string(),
                tenant: names.get(&tenant.0).cloned().unwrap_or(tenant.0),
            };
            if let Some(ns) = usage.cpu_ns {
                p.cpu_seconds.get_or_create(&labels).inc_by(ns as f64 / 1e9);
            }
            let as_gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            p.memory
                .get_or_create(&labels)
                .set(as_gauge(usage.memory_bytes));
            p.memory_limit
                .get_or_create(&labels)
                .set(as_gauge(usage.memory_limit_bytes));
            p.pids.get_or_create(&labels).set(as_gauge(usage.pids));
            if let Some(n) = usage.oom_kills {
                p.oom_kills.get_or_create(&labels).inc_by(n);
            }
        }
        for (id, tenant, [sent, received, allowed, denied]) in manager.live_network() {
            let labels = SandboxLabels {
                id: id.to_string(),
                tenant: names.get(&tenant.0).cloned().unwrap_or(tenant.0),
            };
            p.net_sent.get_or_create(&labels).inc_by(sent);
            p.net_received.get_or_create(&labels).inc_by(received);
            for (verdict, n) in [("allowed", allowed), ("denied", denied)] {
                let v = VerdictLabels {
                    id: labels.id.clone(),
                    tenant: labels.tenant.clone(),
                    verdict,
                };
                p.connections.get_or_create(&v).inc_by(n);
            }
        }
    }

    /// An HTTP answer with this status was sent (any front-end).
    pub fn answered(&self, status: u16) {
        let code = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_requests.get_or_create(&CodeLabel { code }).inc();
    }

    /// A create was answered successfully, `took` after it arrived.
    pub fn created(&self, took: Duration) {
        self.creates.inc();
        self.create_seconds.observe(took.as_secs_f64());
    }

    /// A command was started (an exec or a background process).
    pub fn exec_started(&self) {
        self.execs.inc();
    }
}
