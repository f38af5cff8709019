//! `brig forward SANDBOX [LOCALPORT:]PORT`: the sandbox's PORT on this
//! machine's `127.0.0.1:LOCALPORT` for as long as the command runs, each
//! connection carried as raw TCP through the daemon's API
//! (`GET /v1/sandboxes/{id}/tcp/{port}`, `Upgrade: tcp`, with the key) —
//! how a port of a sandbox on another machine's daemon is reached, where
//! `brig create --publish` would bind on the daemon's host.

use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::Arc;

use anyhow::Context;

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct ForwardArgs {
    /// The sandbox: its id, a unique start of it, or its name.
    sandbox: String,
    /// The sandbox's PORT on 127.0.0.1:LOCALPORT here (PORT alone: any
    /// free local port, printed).
    #[arg(value_name = "[LOCALPORT:]PORT", value_parser = brig_net::publish::parse)]
    ports: (u16, u16),
}

pub fn run(args: ForwardArgs) -> anyhow::Result<i32> {
    let client = Arc::new(Client::from_env()?);
    let id = client.resolve(&args.sandbox)?;
    let (local, port) = args.ports;
    let path = format!("/v1/sandboxes/{id}/tcp/{port}");
    // One connection first: a sandbox that is gone or not running is said
    // now, not at the first client.
    drop(client.tcp(&path)?);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, local))
        .with_context(|| format!("cannot listen on 127.0.0.1:{local}"))?;
    let addr = listener.local_addr()?;
    eprintln!("brig: {addr} -> port {port} of sandbox {id} (Ctrl-C stops)");
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (client, path) = (Arc::clone(&client), path.clone());
        std::thread::spawn(move || match client.tcp(&path) {
            Ok(upstream) => relay(conn, upstream),
            Err(e) => eprintln!("brig: {e:#}"),
        });
    }
    Ok(0)
}

/// Copy both ways until each side has ended, passing each EOF on as a
/// half-close.
fn relay(a: TcpStream, b: TcpStream) {
    let _ = a.set_nodelay(true);
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let one = std::thread::spawn(move || copy(a2, b2));
    copy(b, a);
    let _ = one.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}
