//! `brig run`: one command in a fresh sandbox, which is removed when the
//! command exits.
//!
//! Two stages, as every subcommand: [`RunArgs`] (clap) becomes a validated
//! [`SandboxSpec`] before anything touches the system; then [`run`] asks
//! the tier for the sandbox (through the same [`Tier`] boundary as the
//! daemon: [`Tier::run`]) and [`supervise`]s it: forwarding a terminal if
//! asked, and turning timeouts, OOM kills and signals to brig into a
//! torn-down sandbox and the right exit status.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::Context;
use brig_core::{
    parse_duration, parse_size, EnvVar, Isolation, NetworkAttachment, OneShot, SandboxSpec,
    TemplateRef, Tier, TierError, TierErrorKind, UserSpec,
};
use brig_host::probe;
use brig_jail::ProcessTier;

use super::client::home_dir;
use super::net::{NetworkFlags, OwnNetwork};
use crate::exit::{self, Outcome};
use crate::tty::{self, RawTerminal};

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Root filesystem: `host` (read-only view of the host's /usr, /etc,
    /// /bin, /sbin, /lib*), a named template (`base`, `code-interpreter-v1`:
    /// built on first use, see `brig template`), an image (`python:3.12-slim`,
    /// `REGISTRY/PATH:TAG`, a name given at import: pulled on first use) or
    /// `dir:PATH` (any unpacked root filesystem).
    #[arg(long, default_value = "host", value_name = "NAME|IMAGE|dir:PATH")]
    template: String,
    /// Isolation tier: process (the default), gvisor (gVisor's
    /// application kernel; needs runsc) or vm (a QEMU virtual machine with
    /// its own kernel; needs QEMU). `brig
    /// doctor` says which this host offers.
    #[arg(long, default_value = "process", value_name = "TIER", value_parser = super::create::parse_isolation)]
    isolation: brig_core::Isolation,
    /// Run this instead of the image's entrypoint (`--entrypoint ''`: none;
    /// the command is then the whole argv).
    #[arg(long, value_name = "CMD")]
    entrypoint: Option<String>,
    /// Memory limit; going over it kills the sandbox (exit 137).
    #[arg(long, default_value = "512M", value_name = "SIZE")]
    memory: String,
    /// CPU quota in cores, e.g. 0.5 or 2 (default: unlimited).
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// Most processes and threads alive at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pids: u32,
    /// Size of the writable layer, /tmp included, and separately of /dev
    /// (memory-backed: counts towards --memory).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    disk: String,
    /// Wall-clock limit, e.g. 30s, 5m, 1h30m; on expiry everything in the
    /// sandbox dies and brig exits with 124.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Set an environment variable (repeatable); `-e KEY` passes KEY's
    /// value here through.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    /// Read environment variables from a file of KEY=VALUE lines.
    #[arg(long = "env-file", value_name = "FILE")]
    env_file: Vec<std::path::PathBuf>,
    /// Working directory inside the sandbox (created if missing).
    #[arg(long, short = 'w', value_name = "DIR")]
    workdir: Option<String>,
    /// Run as this user: a name from the template's /etc/passwd, a UID, or UID:GID.
    #[arg(long, short = 'u', value_name = "NAME|UID")]
    user: Option<String>,
    /// Pass standard input through to the command.
    #[arg(short = 'i', long = "interactive")]
    interactive: bool,
    /// Give the command a pseudo-terminal.
    #[arg(short = 't', long = "tty")]
    tty: bool,
    #[command(flatten)]
    network: NetworkFlags,
    /// A resolver the sandbox's DNS questions are forwarded to, for the
    /// names its policy allows (repeatable) [default: the nameservers of
    /// /etc/resolv.conf].
    #[arg(long = "dns-upstream", value_name = "IP[:PORT]", value_parser = super::net::parse_upstream)]
    dns_upstream: Vec<std::net::SocketAddr>,
    /// Relay 127.0.0.1:HOSTPORT on this host to PORT on the sandbox's
    /// loopback while it runs (repeatable); PORT alone: any free host port,
    /// printed on stderr.
    #[arg(long = "publish", short = 'p', value_name = "[HOSTPORT:]PORT", value_parser = brig_net::publish::parse)]
    publish: Vec<(u16, u16)>,
    /// A secret for --inject's ${secrets.NAME} (repeatable): NAME=VALUE, or
    /// NAME alone to take the value of $NAME here (kept out of `ps`). The
    /// sandbox never sees it.
    #[arg(long = "secret", value_name = "NAME[=VALUE]")]
    secret: Vec<String>,
    /// The command and its arguments (after `--`); for an image, after its
    /// entrypoint, and its default command when none is given.
    #[arg(value_name = "CMD")]
    command: Vec<String>,
}

impl RunArgs {
    /// Stage two: every flag parsed and checked, or one clear error.
    fn into_spec(self) -> anyhow::Result<(SandboxSpec, RunNetwork, brig_core::Isolation)> {
        let policy = self.network.policy()?;
        let secrets = run_secrets(&self.secret, &policy)?;
        let network = RunNetwork {
            policy,
            asked: self.network.given(),
            upstream: self.dns_upstream,
            publish: self.publish,
            secrets,
        };
        // Built (minutes, once), or pulled, under $BRIG_HOME if missing; the
        // jail gets a rootfs or an image's layers.
        let resolved = brig_template::resolve(
            &home_dir(),
            TemplateRef::parse(&self.template)?,
            brig_template::Progress::Auto,
            true,
        )?;
        let image = resolved.image.unwrap_or_default();
        // As docker runs an image: its entrypoint, then the command given
        // or else its cmd.
        let entrypoint = match &self.entrypoint {
            Some(e) if e.is_empty() => Vec::new(),
            Some(e) => vec![e.clone()],
            None => image.entrypoint.clone(),
        };
        let args = if self.command.is_empty() && self.entrypoint.is_none() {
            image.cmd.clone()
        } else {
            self.command
        };
        let mut spec = SandboxSpec::new(entrypoint.into_iter().chain(args).collect());
        spec.template = resolved.template;
        spec.limits.memory = parse_size(&self.memory).context("--memory")?;
        spec.limits.disk = parse_size(&self.disk).context("--disk")?;
        spec.limits.pids = self.pids;
        spec.limits.cpus = self.cpus;
        spec.limits.timeout = self
            .timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .context("--timeout")?;
        // The image's environment, then the files, then -e (a later value
        // wins), as `brig create`.
        let given: Vec<EnvVar> = super::client::env_pairs(&self.env, &self.env_file)?
            .iter()
            .map(|(k, v)| EnvVar::parse(&format!("{k}={}", v.as_str().unwrap_or_default())))
            .collect::<Result<_, _>>()?;
        let mut env: Vec<EnvVar> = image
            .env
            .iter()
            .filter_map(|kv| EnvVar::parse(kv).ok())
            .filter(|e| !given.iter().any(|g| g.key == e.key))
            .collect();
        env.extend(given);
        spec.env = env;
        spec.workdir = self.workdir.or(image.working_dir);
        spec.user = self
            .user
            .or(image.user)
            .as_deref()
            .map(UserSpec::parse)
            .transpose()?;
        spec.stdin = self.interactive || self.tty;
        spec.tty = self.tty;
        spec.validate()?;
        Ok((spec, network, self.isolation))
    }
}

/// The network `brig run` gives its sandbox.
struct RunNetwork {
    policy: brig_net::Policy,
    /// Whether a network flag was given (not just the default).
    asked: bool,
    upstream: Vec<std::net::SocketAddr>,
    /// (host port, sandbox port) pairs to relay.
    publish: Vec<(u16, u16)>,
    /// `--secret`s, by lower-cased name.
    secrets: HashMap<String, Vec<u8>>,
}

/// `--secret`s (see [`super::net::secret_flags`]), checked against what
/// the injections name: each named secret given, each given one used.
fn run_secrets(
    given: &[String],
    policy: &brig_net::Policy,
) -> anyhow::Result<HashMap<String, Vec<u8>>> {
    let secrets: HashMap<String, Vec<u8>> = super::net::secret_flags(given)?
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    let mut named = Vec::new();
    for i in &policy.inject {
        named.extend(
            i.secrets()
                .map_err(|e| anyhow::anyhow!("--inject {}: {e}", i.host))?,
        );
    }
    if let Some(missing) = named.iter().find(|n| !secrets.contains_key(*n)) {
        anyhow::bail!(
            "--inject names ${{secrets.{missing}}}: give it with --secret {missing}=VALUE (or --secret {missing} to take ${missing} from here)"
        );
    }
    if let Some(unused) = secrets.keys().find(|k| !named.contains(k)) {
        anyhow::bail!("--secret {unused} is not named by any --inject (as ${{secrets.{unused}}})");
    }
    Ok(secrets)
}

impl RunNetwork {
    /// The sandbox's link to a gateway of this process, or `None` for
    /// loopback only. The default network is given where it can be: on a
    /// host that cannot (no `ip`, no BPF), a run that did not ask for one
    /// goes on with loopback only, and says so.
    fn start(self, spec: &mut SandboxSpec) -> anyhow::Result<Option<OwnNetwork>> {
        let injects = !self.policy.inject.is_empty();
        // A published port needs the sandbox's namespace to be this
        // process's: with `none` too (egress is then refused at the gateway).
        if self.policy.mode == brig_net::Mode::None && self.publish.is_empty() {
            return Ok(None);
        }
        let link = format!("run{}", std::process::id());
        let asked = self.asked || !self.publish.is_empty();
        match OwnNetwork::start(&link, self.policy, self.upstream) {
            Ok(net) => {
                for (host, port) in self.publish {
                    let bound = net.publish(host, port)?;
                    eprintln!("brig: {bound} -> port {port} of the sandbox");
                }
                if injects {
                    // The sandbox trusts the CA its TLS to injected hosts
                    // is ended with; the command's own variables win.
                    let files = net.trust(self.secrets)?;
                    spec.run_files.extend(files);
                    for &(k, v) in &brig_net::tls::CA_ENV {
                        if !spec.env.iter().any(|e| e.key == k) {
                            spec.env.push(EnvVar::parse(&format!("{k}={v}"))?);
                        }
                    }
                    spec.validate()?;
                }
                Ok(Some(net))
            }
            Err(e) if !asked => {
                eprintln!(
                    "brig: warning: the sandbox has no network ({e:#}); pass --network none to run without one quietly"
                );
                Ok(None)
            }
            Err(e) => Err(
                e.context("cannot give the sandbox its network (--network none runs without one)")
            ),
        }
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let (mut spec, network, isolation) = args.into_spec()?;
    if spec.tty {
        tty::require_terminal_input()?;
    }
    exit::require_root()?;
    let tier: Box<dyn Tier> = match isolation {
        Isolation::Process => Box::new(ProcessTier::for_commands().map_err(explain)?),
        Isolation::Gvisor => {
            let runsc = brig_gvisor::find_runsc().ok_or_else(|| {
                anyhow::anyhow!(
                    "the gvisor tier needs runsc, which is not installed: apt-get install runsc \
                     (brig doctor says what this host offers)"
                )
            })?;
            // brig's runtime directory, as the process tier prepares it.
            let run_dir = ProcessTier::for_commands()
                .map_err(explain)?
                .options()
                .run_dir
                .clone();
            Box::new(brig_gvisor::GvisorTier::for_commands(runsc, run_dir)?)
        }
        Isolation::Vm => {
            let qemu = brig_vm::find_qemu().ok_or_else(|| {
                anyhow::anyhow!(
                    "the vm tier needs QEMU, which is not installed: apt-get install \
                     qemu-system-x86 (brig doctor says what this host offers)"
                )
            })?;
            let run_dir = ProcessTier::for_commands()
                .map_err(explain)?
                .options()
                .run_dir
                .clone();
            let home = std::env::var_os("BRIG_VM_HOME").map_or_else(
                || super::client::home_dir().join("vm"),
                std::path::PathBuf::from,
            );
            Box::new(brig_vm::VmTier::for_commands(
                qemu,
                run_dir,
                home,
                crate::agent::path()?,
            )?)
        }
    };

    // Signals to brig become a sandbox teardown. They are blocked before
    // the spawn so none is lost in between, and read from a signalfd; the
    // sandbox's command starts with a clean mask and default handlers.
    let signals = tty::SignalFd::new(&[
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGWINCH,
    ])?;
    // Without -t the sandbox gets brig's stdout and stderr as they are —
    // the caller's terminal, in an interactive shell. Whatever it does to
    // that terminal (termios, window size, exclusive mode, stopped output)
    // is undone when it has ended (dropped last, after the sandbox).
    let _terminals = tty::CallerTerminals::save();
    // The network before the sandbox; dropped only after it has ended.
    let net = network.start(&mut spec)?;
    let attachment = net
        .as_ref()
        .map_or(NetworkAttachment::Loopback, OwnNetwork::attachment);
    let mut sandbox = tier.run(&spec, &attachment).map_err(explain)?;
    let pty = sandbox.take_pty();
    let outcome = supervise(sandbox.as_ref(), &signals, pty, spec.limits.timeout)?;
    let ended = sandbox.wait()?;
    drop(net);
    Ok(exit::finish(outcome, &ended, spec.limits.memory))
}

/// A sandbox that could not be set up, explained: if the host lacks a
/// kernel feature the process tier needs, name it and its fix (the probe
/// runs only on this failure path; it costs a few milliseconds).
fn explain(err: TierError) -> anyhow::Error {
    let host_side = err.kind() == TierErrorKind::Unavailable;
    let err = anyhow::Error::from(err);
    if host_side {
        if let Err(feature) = probe::check_process_tier() {
            let fix = feature
                .fix
                .as_deref()
                .map(|f| format!("; fix: {f}"))
                .unwrap_or_default();
            return anyhow::anyhow!(
                "{err:#} (this host lacks {}: {}{fix})",
                feature.name,
                feature.detail
            );
        }
    }
    err
}

/// Watch the sandbox until it ends: the pidfd, signals to brig, the OOM
/// notification (cgroup v1), the timeout, and terminal traffic with -t.
fn supervise(
    sandbox: &dyn OneShot,
    signals: &tty::SignalFd,
    pty: Option<OwnedFd>,
    timeout: Option<Duration>,
) -> anyhow::Result<Outcome> {
    let deadline = timeout.map(|t| (Instant::now() + t, t));
    let mut term = match &pty {
        Some(master) => Some(tty::Forwarder::new(master.as_raw_fd())?),
        None => None,
    };
    // Raw mode only while a terminal is attached to brig, restored on drop.
    let _raw = match &term {
        Some(_) => RawTerminal::enter(0),
        None => None,
    };
    if let Some(t) = &term {
        t.sync_window_size();
        resize(sandbox);
    }
    loop {
        let mut fds: Vec<libc::pollfd> = vec![
            poll_in(sandbox.exit_fd().as_raw_fd()),
            poll_in(signals.fd()),
        ];
        let oom_at = sandbox.oom_fd().map(|fd| {
            fds.push(poll_in(fd.as_raw_fd()));
            fds.len() - 1
        });
        let term_at = term.as_ref().map(|t| {
            let at = fds.len();
            fds.extend(t.poll_fds());
            at
        });
        let wait_ms = match deadline {
            Some((at, _)) => at
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as i32,
            None => -1,
        };
        // SAFETY: fds is a live array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(std::io::Error::last_os_error()).context("wait for the sandbox");
        }
        if let (Some(t), Some(at)) = (term.as_mut(), term_at) {
            t.pump(&fds[at..]);
        }
        if fds[0].revents != 0 {
            if let Some(t) = term.as_mut() {
                t.drain();
            }
            return Ok(Outcome::Exited);
        }
        if let Some(sig) = signals.read_ready(fds[1].revents) {
            if sig == libc::SIGWINCH {
                if let Some(t) = &term {
                    t.sync_window_size();
                    resize(sandbox);
                }
                continue;
            }
            sandbox.kill();
            return Ok(Outcome::Signalled(sig));
        }
        if oom_at.is_some_and(|i| fds[i].revents != 0) {
            sandbox.kill();
            return Ok(Outcome::OutOfMemory);
        }
        if let Some((at, limit)) = deadline {
            if Instant::now() >= at {
                sandbox.kill();
                return Ok(Outcome::TimedOut(limit));
            }
        }
    }
}

/// The caller's terminal size to a tier that keeps its own terminal.
fn resize(sandbox: &dyn OneShot) {
    if let Some((rows, cols)) = tty::window_size() {
        sandbox.resize(rows, cols);
    }
}

fn poll_in(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> anyhow::Result<SandboxSpec> {
        let cli = crate::commands::Cli::try_parse_from(args)?;
        match cli.command {
            crate::commands::Command::Run(r) => (*r).into_spec().map(|(spec, _, _)| spec),
            _ => unreachable!(),
        }
    }

    fn network(args: &[&str]) -> anyhow::Result<RunNetwork> {
        let cli = crate::commands::Cli::try_parse_from(args)?;
        match cli.command {
            crate::commands::Command::Run(r) => (*r).into_spec().map(|(_, net, _)| net),
            _ => unreachable!(),
        }
    }

    #[test]
    fn flags_become_a_spec() {
        let s = parse(&[
            "brig",
            "run",
            "--memory",
            "64M",
            "--pids",
            "9",
            "--timeout",
            "2s",
            "-e",
            "A=1",
            "-t",
            "--",
            "sh",
            "-c",
            "x",
        ])
        .unwrap();
        assert_eq!(s.limits.memory.bytes(), 64 << 20);
        assert_eq!(s.limits.pids, 9);
        assert_eq!(s.limits.timeout, Some(Duration::from_secs(2)));
        assert_eq!(s.command, vec!["sh", "-c", "x"]);
        assert!(s.tty && s.stdin);
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let e = parse(&["brig", "run", "--memory", "lots", "--", "true"]).unwrap_err();
        assert!(
            format!("{e:#}").starts_with("--memory: invalid size \"lots\""),
            "{e:#}"
        );
        let e = parse(&["brig", "run", "--timeout", "soon", "--", "true"]).unwrap_err();
        assert!(format!("{e:#}").contains("--timeout"), "{e:#}");
        // A name of no possible shape (a known shape would be resolved,
        // which touches the disk or a registry: tests/run.rs covers it).
        let e = parse(&["brig", "run", "--template", "Ubuntu!", "--", "true"]).unwrap_err();
        assert!(
            format!("{e:#}").contains("unknown template \"Ubuntu!\""),
            "{e:#}"
        );
        let e = parse(&["brig", "run", "-e", "1X=2", "--", "true"]).unwrap_err();
        assert!(
            format!("{e:#}").contains("invalid environment variable"),
            "{e:#}"
        );
    }

    #[test]
    fn env_comes_from_files_flags_and_the_callers_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vars");
        std::fs::write(&file, "# comment\nA=from-file\nB=file\n").unwrap();
        let file = file.to_str().unwrap();
        // PATH is set in every test environment.
        let s = parse(&[
            "brig",
            "run",
            "--env-file",
            file,
            "-e",
            "B=flag",
            "-e",
            "PATH",
            "-e",
            "NO_SUCH_VAR_X",
            "--",
            "true",
        ])
        .unwrap();
        let env: Vec<String> = s
            .env
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        assert!(env.contains(&"A=from-file".to_string()), "{env:?}");
        assert!(env.contains(&"B=flag".to_string()), "{env:?}");
        assert!(env.iter().any(|e| e.starts_with("PATH=/")), "{env:?}");
        assert!(
            !env.iter().any(|e| e.starts_with("NO_SUCH_VAR_X")),
            "{env:?}"
        );
        let e = parse(&["brig", "run", "--env-file", "/no/such", "--", "true"]).unwrap_err();
        assert!(
            format!("{e:#}").contains("cannot read --env-file /no/such"),
            "{e:#}"
        );
    }

    #[test]
    fn arguments_after_the_command_are_not_flags() {
        let s = parse(&["brig", "run", "--", "ls", "--memory", "-l"]).unwrap();
        assert_eq!(s.command, vec!["ls", "--memory", "-l"]);
        assert_eq!(s.limits.memory.bytes(), 512 << 20);
        // Without `--` too, once the command has started.
        let s = parse(&["brig", "run", "ls", "-l", "--memory"]).unwrap();
        assert_eq!(s.command, vec!["ls", "-l", "--memory"]);
        // A command that starts with a dash needs `--`.
        let s = parse(&["brig", "run", "--", "-weird"]).unwrap();
        assert_eq!(s.command, vec!["-weird"]);
    }

    #[test]
    fn an_unknown_flag_before_the_command_is_a_usage_error() {
        let e = parse(&["brig", "run", "--networking", "host", "--", "true"]).unwrap_err();
        let e = e.downcast::<clap::Error>().expect("a usage error");
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(e.to_string().contains("--networking"), "{e}");
    }

    #[test]
    fn the_network_is_public_unless_asked_otherwise_and_bad_rules_are_named() {
        let n = network(&["brig", "run", "true"]).unwrap();
        assert_eq!(n.policy, brig_net::Policy::default());
        assert_eq!(n.policy.mode, brig_net::Mode::Public);
        assert!(!n.asked);
        let n = network(&[
            "brig",
            "run",
            "--network",
            "allow",
            "--allow",
            "*.example.com:443",
            "--add-host",
            "db.internal:192.0.2.7",
            "--dns-upstream",
            "192.0.2.53",
            "true",
        ])
        .unwrap();
        assert!(n.asked);
        assert_eq!(n.policy.mode, brig_net::Mode::Allow);
        assert_eq!(n.policy.allow[0].to_string(), "*.example.com:443");
        assert_eq!(n.policy.hosts[0].0, "db.internal");
        assert_eq!(n.upstream, vec!["192.0.2.53:53".parse().unwrap()]);
        for (args, expect) in [
            (&["--network", "host"][..], "none, public or allow"),
            (&["--allow", "a.*.com"][..], "--allow \"a.*.com\""),
            (&["--deny", "300.1.1.1"][..], "--deny"),
            (&["--add-host", "db"][..], "expected NAME:IP"),
            (&["--network", "none", "--allow", "x.com"][..], "--network"),
        ] {
            let mut argv = vec!["brig", "run"];
            argv.extend_from_slice(args);
            argv.push("true");
            let e = match network(&argv) {
                Ok(_) => panic!("{args:?} was accepted"),
                Err(e) => format!("{e:#}"),
            };
            assert!(e.contains(expect), "{args:?}: {e}");
        }
        let e = parse(&["brig", "run", "--dns-upstream", "nowhere", "true"]).unwrap_err();
        assert!(e.to_string().contains("not IP or IP:PORT"), "{e}");
    }
}
