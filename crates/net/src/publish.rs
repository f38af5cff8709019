//! Publishing a sandbox's port on the host (`brig run --publish`): each
//! connection to a listener on the host's loopback is relayed to the port
//! on the sandbox's own loopback, over a socket opened inside the
//! sandbox's network namespace (a server that listens on 127.0.0.1 there
//! is reached as it is). Bytes move with splice (`relay.rs`). Nothing is
//! added to any firewall; the listener goes with the returned task.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

/// Relay connections to `listener` to `port` inside `netns`, on `runtime`,
/// until the returned handle is aborted (or the runtime ends).
pub fn publish(
    runtime: &tokio::runtime::Handle,
    netns: Arc<OwnedFd>,
    listener: std::net::TcpListener,
    port: u16,
) -> io::Result<tokio::task::AbortHandle> {
    listener.set_nonblocking(true)?;
    let listener = {
        let _in = runtime.enter();
        TcpListener::from_std(listener)?
    };
    let task = runtime.spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                continue;
            };
            let netns = Arc::clone(&netns);
            tokio::spawn(async move {
                // A socket of the sandbox's namespace, connected to its
                // loopback: a refused connect closes the client's.
                let inside = tokio::task::spawn_blocking(move || {
                    crate::sys::in_netns(&netns, move || {
                        std::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port))
                    })
                })
                .await;
                let Ok(Ok(inside)) = inside else { return };
                if inside.set_nonblocking(true).is_err() {
                    return;
                }
                let Ok(inside) = TcpStream::from_std(inside) else {
                    return;
                };
                let _ = crate::relay::relay(&client, &inside).await;
            });
        }
    });
    Ok(task.abort_handle())
}

/// `[HOSTPORT:]PORT`: the host's port (0: any free one) and the sandbox's.
pub fn parse(spec: &str) -> Result<(u16, u16), String> {
    let port = |s: &str| {
        s.parse::<u16>()
            .map_err(|_| format!("--publish {spec:?}: {s:?} is not a port (0 to 65535)"))
    };
    let (host, inside) = match spec.split_once(':') {
        Some((h, p)) => (port(h)?, port(p)?),
        None => (0, port(spec)?),
    };
    if inside == 0 {
        return Err(format!(
            "--publish {spec:?}: the sandbox's port must be 1 to 65535 (HOSTPORT:PORT, or PORT for any free host port)"
        ));
    }
    Ok((host, inside))
}

#[cfg(test)]
mod tests {
    #[test]
    fn publish_specs_parse_or_say_why_not() {
        assert_eq!(super::parse("8000"), Ok((0, 8000)));
        assert_eq!(super::parse("18000:8000"), Ok((18000, 8000)));
        assert_eq!(super::parse("0:65535"), Ok((0, 65535)));
        for bad in ["", "x", "8000:", ":80", "1:2:3", "70000", "80:0", "0"] {
            assert!(super::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
