//! One module per subcommand. Each parses its clap struct into a validated
//! config before doing any work, then returns the process exit code.
//! `client.rs` is what the daemon's client subcommands share.

use clap::{Parser, Subcommand};

pub mod build;
pub mod client;
pub mod completion;
pub mod cp;
pub mod create;
pub mod doctor;
pub mod exec;
pub mod extend;
pub mod fork;
pub mod forward;
pub mod inspect;
pub mod keys;
pub mod kill;
pub mod logs;
pub mod ls;
pub mod man;
pub mod mcp;
pub mod net;
pub mod pause;
pub mod resume;
pub mod rm;
pub mod run;
pub mod secrets;
pub mod serve;
pub mod snapshot;
pub mod stats;
pub mod template;
pub mod tenants;
pub mod top;
pub mod volume;

/// brig runs untrusted code in fast, strongly isolated sandboxes.
#[derive(Debug, Parser)]
#[command(name = "brig", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// The daemon's home: its state, keys and templates [default:
    /// /var/lib/brig].
    #[arg(long, global = true, value_name = "DIR", env = "BRIG_HOME")]
    pub home: Option<std::path::PathBuf>,
    /// The daemon to talk to [default: the running daemon of the home, else
    /// http://127.0.0.1:7777].
    #[arg(long, global = true, value_name = "URL", env = "BRIG_URL")]
    pub url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a fresh sandbox and remove the sandbox when it exits.
    Run(Box<run::RunArgs>),
    /// Report which kernel features and isolation tiers this host offers.
    Doctor(doctor::DoctorArgs),
    /// Run the daemon: the HTTP API for long-lived sandboxes.
    Serve(serve::ServeArgs),
    /// Serve the Model Context Protocol over stdio (what MCP clients launch).
    ///
    /// An MCP client (a desktop assistant, an IDE agent, an agent framework)
    /// gets brig's sandboxes as tools: run_code (stateful Python and other
    /// Jupyter kernels, plots as images), run_command, files, background
    /// processes, sandboxes. Client configuration: {"command": "brig",
    /// "args": ["mcp"]}.
    ///
    /// With a daemon running for the home (or --url / BRIG_URL), brig mcp
    /// relays to its /mcp (start it with `brig serve --mcp`), presenting
    /// BRIG_API_KEY or the local key. Without one, it starts an embedded
    /// runtime for the session (as root); its sandboxes end when stdin
    /// closes. Sandboxes a session creates end with it unless created with
    /// persist. Logs go to stderr. See docs/mcp.md.
    Mcp(Box<mcp::McpArgs>),
    /// Create a sandbox on the daemon and print its id.
    Create(create::CreateArgs),
    /// Show or change a sandbox's network policy, or list its connections.
    Net(net::NetArgs),
    /// Run a command in a sandbox on the daemon; exits with its status.
    Exec(exec::ExecArgs),
    /// List your sandboxes on the daemon.
    Ls(ls::LsArgs),
    /// End a sandbox on the daemon.
    Kill(kill::KillArgs),
    /// Show one sandbox on the daemon.
    Inspect(inspect::InspectArgs),
    /// Freeze every process of a sandbox on the daemon.
    Pause(pause::PauseArgs),
    /// Thaw a paused sandbox on the daemon.
    Resume(resume::ResumeArgs),
    /// Copy a file between this host and a sandbox (either side ID:/path).
    Cp(cp::CpArgs),
    /// Reach a sandbox's port on a local port, through the daemon's API.
    Forward(forward::ForwardArgs),
    /// Create, list and revoke API keys (`create --local`: recover a
    /// locked-out operator's admin key, as root on the daemon's host).
    Keys(keys::KeysArgs),
    /// Create, list and remove tenants (admin keys only).
    Tenants(tenants::TenantsArgs),
    /// Set, list and remove secrets (write-only: no command shows a value).
    Secrets(secrets::SecretsArgs),
    /// Snapshot a sandbox (its files; on gvisor and vm its memory too),
    /// list and remove snapshots (start from one with `brig create
    /// --from-snapshot`).
    Snapshot(snapshot::SnapshotArgs),
    /// Create, list and remove persistent volumes (mount one with `brig
    /// create --volume NAME:/path`).
    Volume(volume::VolumeArgs),
    /// New sandboxes from a sandbox's files as they are now; it runs on.
    Fork(fork::ForkArgs),
    /// Give a live sandbox more time, counted from now.
    Extend(extend::ExtendArgs),
    /// Forget ended sandboxes (`-f`: end live ones first).
    Rm(rm::RmArgs),
    /// Live CPU, memory, disk and pids of sandboxes (all live ones by default).
    Stats(stats::StatsArgs),
    /// The processes in a sandbox.
    Top(top::TopArgs),
    /// What a sandbox's background processes printed (`-f`: follow).
    Logs(logs::LogsArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(completion::CompletionArgs),
    /// Print the manual page (`--dir`: write one per subcommand).
    Man(man::ManArgs),
    /// Build and list the named templates (`base`, `code-interpreter-v1`).
    Template(template::TemplateArgs),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    client::set_location(cli.home.filter(|h| !h.as_os_str().is_empty()), cli.url);
    match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Doctor(args) => doctor::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Mcp(args) => mcp::run(*args),
        Command::Create(args) => create::run(args),
        Command::Net(args) => net::run(args),
        Command::Exec(args) => exec::run(args),
        Command::Ls(args) => ls::run(args),
        Command::Kill(args) => kill::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Pause(args) => pause::run(args),
        Command::Resume(args) => resume::run(args),
        Command::Cp(args) => cp::run(args),
        Command::Forward(args) => forward::run(args),
        Command::Keys(args) => keys::run(args),
        Command::Tenants(args) => tenants::run(args),
        Command::Secrets(args) => secrets::run(args),
        Command::Snapshot(args) => snapshot::run(args),
        Command::Volume(args) => volume::run(args),
        Command::Fork(args) => fork::run(args),
        Command::Extend(args) => extend::run(args),
        Command::Rm(args) => rm::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Top(args) => top::run(args),
        Command::Logs(args) => logs::run(args),
        Command::Completion(args) => completion::run(args),
        Command::Man(args) => man::run(args),
        Command::Template(args) => template::run(args),
    }
}
