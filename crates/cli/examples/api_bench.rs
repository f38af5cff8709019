//! Load generator for the daemon benchmarks (`bench/daemon.py`): drives
//! `brig serve` over its HTTP API, or runs a peer's command, from N threads
//! and prints one JSON object with the latency percentiles and the
//! throughput.
//!
//! It is Rust, with blocking HTTP (one keep-alive `ureq::Agent` per
//! thread), so that on a 2-core machine the client takes as little of the
//! CPU the daemon is measured on as it can; and the peers are driven by the
//! same code with the same concurrency, so the ratios compare like with like.
//!
//! Modes (every one needs `--url` and `--key` except `spawn`):
//!
//! - `cycle`: create a sandbox, exec `/bin/true` in it, delete it; times
//!   each phase and the whole cycle.
//! - `exec`: one sandbox, `/bin/true` run in it again and again (the exec
//!   round trip: request, process start and exit, the `exited` event).
//! - `create`: the create request alone, one at a time with `--gap-ms`
//!   before it so a pre-made pool has refilled; the deletes happen outside
//!   the timed part. A `GET /healthz` after the same idle time is timed
//!   too, as the floor any request to an idle daemon pays.
//! - `spawn -- ARGV...`: start ARGV and wait for it (the peers: one
//!   `bwrap ... /bin/true` per cycle, `crun exec`, `nsenter`).
//! - `fill`: create `--count` sandboxes and leave them running; prints
//!   their ids. `drain`: delete the ids given on stdin (one a line).
//!
//! Errors (an HTTP error status, a failed exec, a peer's non-zero exit)
//! end the run with exit status 1 and a message: a benchmark that failed
//! must not print numbers.
//!
//! Usage: `cargo run --release -p brig --example api_bench -- cycle --url
//! http://127.0.0.1:PORT --key KEY --clients 8 --count 2000`.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "Load generator for bench/daemon.py")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(clap::Args, Clone)]
struct Target {
    /// The daemon's base URL, e.g. http://127.0.0.1:7777.
    #[arg(long)]
    url: String,
    /// The API key (the daemon writes it to HOME/local.key).
    #[arg(long)]
    key: String,
    /// The created sandboxes' network mode (`none`, `public`, `allow`);
    /// the daemon's default when not given.
    #[arg(long)]
    network: Option<String>,
}

#[derive(clap::Args, Clone, Copy)]
struct Load {
    /// Threads, each with its own keep-alive connection.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Timed operations, over all threads.
    #[arg(long, default_value_t = 500)]
    count: usize,
    /// Untimed operations first [default: count/10, at least one per thread].
    #[arg(long)]
    warmup: Option<usize>,
    /// Also print every sample (ms), for pooling several runs.
    #[arg(long)]
    samples: bool,
}

#[derive(Subcommand)]
enum Mode {
    /// Create, exec /bin/true, delete, per cycle.
    Cycle {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        load: Load,
    },
    /// Exec /bin/true round trips in one existing sandbox.
    Exec {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        load: Load,
    },
    /// Create latency alone, spaced so the pool refills; deletes untimed.
    Create {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        load: Load,
        /// Idle time before each create (and before each `GET /healthz`
        /// timed for comparison); the pool refills meanwhile.
        #[arg(long, default_value_t = 25)]
        gap_ms: u64,
    },
    /// Run a command and wait for it, per cycle (the peers).
    Spawn {
        #[command(flatten)]
        load: Load,
        #[arg(required = true, last = true)]
        argv: Vec<String>,
    },
    /// Create COUNT sandboxes with CLIENTS threads and leave them running.
    Fill {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 8)]
        clients: usize,
        #[arg(long)]
        count: usize,
        /// The sandboxes' timeout.
        #[arg(long, default_value = "30m")]
        timeout: String,
    },
    /// Delete the sandbox ids read from stdin, one a line.
    Drain {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 8)]
        clients: usize,
    },
}

/// One thread's connection to the daemon.
struct Client {
    agent: ureq::Agent,
    base: String,
    auth: String,
    network: Option<String>,
}

impl Client {
    fn new(t: &Target) -> Client {
        Client {
            // Idle connections are kept per agent; one agent per thread
            // keeps each thread on its own connection.
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .build(),
            base: t.url.trim_end_matches('/').to_string(),
            auth: format!("Bearer {}", t.key),
            network: t.network.clone(),
        }
    }

    /// Send a request and read its whole body (so the connection can be
    /// reused); an error status is an error naming the body.
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<String> {
        let req = self
            .agent
            .request(method, &format!("{}{path}", self.base))
            .set("Authorization", &self.auth);
        let res = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(b),
            None => req.call(),
        };
        match res {
            Ok(r) => r
                .into_string()
                .with_context(|| format!("{method} {path}: cannot read the response")),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                bail!("{method} {path}: HTTP {code}: {text}")
            }
            Err(e) => Err(e).with_context(|| format!("{method} {path}")),
        }
    }

    fn create(&self, timeout: &str) -> anyhow::Result<String> {
        let mut spec = json!({ "timeout": timeout });
        if let Some(network) = &self.network {
            spec["network"] = json!({ "mode": network });
        }
        let body = self.call("POST", "/v1/sandboxes", Some(&spec.to_string()))?;
        let v: Value = serde_json::from_str(&body).context("create: not JSON")?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("create: no id in {body}"))
    }

    /// Exec /bin/true and read the NDJSON stream to its end; the last
    /// event must be `exited` with code 0.
    fn exec_true(&self, id: &str) -> anyhow::Result<()> {
        let path = format!("/v1/sandboxes/{id}/exec");
        let body = self.call("POST", &path, Some(r#"{"argv":["/bin/true"]}"#))?;
        let last = body.lines().last().unwrap_or_default();
        let v: Value = serde_json::from_str(last)
            .with_context(|| format!("exec: last event is not JSON: {last:?}"))?;
        if v["type"] != "exited" || v["code"] != 0 {
            bail!("exec /bin/true in {id}: expected exited with code 0, got {last}");
        }
        Ok(())
    }

    fn delete(&self, id: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/v1/sandboxes/{id}"), None)
            .map(drop)
    }
}

/// Latencies of the named phases of one operation, in the order given.
type Sample = Vec<Duration>;

/// Run `op` `warmup` then `count` times, spread over `clients` threads,
/// each thread with its own state from `setup`. Returns the timed samples
/// and the wall time of the timed part.
fn drive<S, F>(
    load: Load,
    setup: impl Fn() -> anyhow::Result<S> + Sync,
    op: F,
) -> anyhow::Result<(Vec<Sample>, Duration)>
where
    F: Fn(&mut S) -> anyhow::Result<Sample> + Sync,
{
    let clients = load.clients.max(1);
    let warmup = load.warmup.unwrap_or((load.count / 10).max(clients));
    let (warm_left, left) = (AtomicUsize::new(warmup), AtomicUsize::new(load.count));
    // Every thread waits here after its warm-up, and so does the clock.
    let barrier = Barrier::new(clients + 1);
    let take = |n: &AtomicUsize| {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    };
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    let warm = || -> anyhow::Result<S> {
                        let mut state = setup()?;
                        while take(&warm_left) {
                            op(&mut state)?;
                        }
                        Ok(state)
                    };
                    let warmed = warm();
                    if warmed.is_err() {
                        // The others stop at their next operation.
                        warm_left.store(0, Ordering::SeqCst);
                        left.store(0, Ordering::SeqCst);
                    }
                    // Every thread reaches the barrier, failed or not, so
                    // none waits on it forever.
                    barrier.wait();
                    let r = warmed.and_then(|mut state| {
                        let mut out = Vec::new();
                        while take(&left) {
                            out.push(op(&mut state)?);
                        }
                        Ok(out)
                    });
                    if r.is_err() {
                        left.store(0, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut samples = Vec::with_capacity(load.count);
        let mut first_err = None;
        let finished: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        let elapsed = start.elapsed();
        for r in finished {
            match r.expect("bench thread panicked") {
                Ok(mut v) => samples.append(&mut v),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok((samples, elapsed))
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50/p90/p99 and friends of one phase, in ms (nearest rank).
fn stats(mut v: Vec<Duration>, with_samples: bool) -> Value {
    v.sort();
    let pct = |p: f64| ms(v[((v.len() as f64 - 1.0) * p).round() as usize]);
    let mean = v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    let mut s = json!({
        "n": v.len(),
        "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
        "min_ms": ms(v[0]), "max_ms": ms(v[v.len() - 1]), "mean_ms": mean,
    });
    if with_samples {
        s["samples_ms"] = v.iter().map(|d| ms(*d)).collect();
    }
    s
}

fn report(
    mode: &str,
    load: Load,
    phases: &[&str],
    samples: Vec<Sample>,
    elapsed: Duration,
) -> Value {
    if samples.is_empty() {
        return json!({ "mode": mode, "clients": load.clients, "n": 0 });
    }
    let mut by_phase = serde_json::Map::new();
    for (i, name) in phases.iter().enumerate() {
        let v: Vec<Duration> = samples.iter().map(|s| s[i]).collect();
        by_phase.insert(name.to_string(), stats(v, load.samples));
    }
    json!({
        "mode": mode,
        "clients": load.clients,
        "n": samples.len(),
        "elapsed_s": elapsed.as_secs_f64(),
        "per_s": samples.len() as f64 / elapsed.as_secs_f64(),
        "phases": by_phase,
    })
}

/// Time `f`, returning its result and how long it took.
fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(T, Duration)> {
    let t = Instant::now();
    let r = f()?;
    Ok((r, t.elapsed()))
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("api_bench: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let out = match args.mode {
        Mode::Cycle { target, load } => {
            let (samples, elapsed) = drive(
                load,
                || Ok(Client::new(&target)),
                |c| {
                    let t0 = Instant::now();
                    let (id, create) = timed(|| c.create("10m"))?;
                    let ((), exec) = timed(|| c.exec_true(&id))?;
                    let ((), delete) = timed(|| c.delete(&id))?;
                    Ok(vec![create, exec, delete, t0.elapsed()])
                },
            )?;
            let phases = ["create", "exec", "delete", "cycle"];
            report("cycle", load, &phases, samples, elapsed)
        }
        Mode::Exec { target, load } => {
            let owner = Client::new(&target);
            let id = owner.create("30m")?;
            let result = drive(
                load,
                || Ok(Client::new(&target)),
                |c| Ok(vec![timed(|| c.exec_true(&id))?.1]),
            );
            owner.delete(&id)?;
            let (samples, elapsed) = result?;
            report("exec", load, &["exec"], samples, elapsed)
        }
        Mode::Create {
            target,
            load,
            gap_ms,
        } => {
            let gap = Duration::from_millis(gap_ms);
            let (samples, elapsed) = drive(
                load,
                || Ok(Client::new(&target)),
                |c| {
                    // The floor for a request to a daemon left idle as
                    // long: on this VM waking its threads costs about as
                    // much as a create from the pool.
                    std::thread::sleep(gap);
                    let ((), healthz) = timed(|| c.call("GET", "/healthz", None).map(drop))?;
                    std::thread::sleep(gap);
                    let (id, create) = timed(|| c.create("10m"))?;
                    c.delete(&id)?;
                    Ok(vec![create, healthz])
                },
            )?;
            report("create", load, &["create", "healthz"], samples, elapsed)
        }
        Mode::Spawn { load, argv } => {
            let run = || -> anyhow::Result<Sample> {
                let t0 = Instant::now();
                let status = Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .status()
                    .with_context(|| format!("cannot start {}", argv[0]))?;
                let took = t0.elapsed();
                if !status.success() {
                    bail!("`{}` failed: {status}", argv.join(" "));
                }
                Ok(vec![took])
            };
            let (samples, elapsed) = drive(load, || Ok(()), |_| run())?;
            report("spawn", load, &["cycle"], samples, elapsed)
        }
        Mode::Fill {
            target,
            clients,
            count,
            timeout,
        } => {
            let load = Load {
                clients,
                count,
                warmup: Some(0),
                samples: false,
            };
            let ids = std::sync::Mutex::new(Vec::with_capacity(count));
            let result = drive(
                load,
                || Ok(Client::new(&target)),
                |c| {
                    let (id, create) = timed(|| c.create(&timeout))?;
                    ids.lock().expect("ids lock").push(id);
                    Ok(vec![create])
                },
            );
            let ids = ids.into_inner().expect("ids lock");
            // The ids go out even after an error, so the caller can delete
            // what was made.
            let mut out = match result {
                Ok((samples, elapsed)) => report("fill", load, &["create"], samples, elapsed),
                Err(e) => json!({ "mode": "fill", "error": format!("{e:#}") }),
            };
            out["ids"] = json!(ids);
            println!("{out}");
            if out.get("error").is_some() {
                std::process::exit(1);
            }
            return Ok(());
        }
        Mode::Drain { target, clients } => {
            let ids: Vec<String> = std::io::stdin()
                .lock()
                .lines()
                .map_while(Result::ok)
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect();
            let ids = Arc::new(ids);
            let next = Arc::new(AtomicUsize::new(0));
            let load = Load {
                clients,
                count: ids.len(),
                warmup: Some(0),
                samples: false,
            };
            let (samples, elapsed) = drive(
                load,
                || Ok(Client::new(&target)),
                |c| {
                    let id = &ids[next.fetch_add(1, Ordering::SeqCst)];
                    Ok(vec![timed(|| c.delete(id))?.1])
                },
            )?;
            report("drain", load, &["delete"], samples, elapsed)
        }
    };
    println!("{out}");
    Ok(())
}
