//! `brig-agent --vm-init`: the agent as a vm-tier guest's first process,
//! run by the kernel from the initramfs brig assembled (crate brig-vm).
//!
//! The bring-up ([`run`]), top to bottom: the kernel's own file systems;
//! the modules the guest's devices need; the sandbox's root (the
//! template's read-only disk under a writable disk, an overlay); a switch
//! into it; then the agent serves, as in every tier, on a socket of its
//! own, and a relay joins that socket to the virtio-serial port the host
//! talks through (`brig_protocol::serial` says why the port carries
//! packets and not the agent's bytes alone).
//!
//! ```text
//! initramfs:  /init (this program)  /brig/modules/*.ko  /brig/modules.order
//! disks:      serial brig-root  ext4, read-only: the template
//!             serial brig-disk  ext4, writable, the --disk limit: upper/ work/
//!             serial brig-vol-N  ext4: volume N, mounted at the path brig.volN= names
//! guest root: overlay(lower = brig-root, upper = brig-disk/upper)
//! agent:      /run/brig-agent/agent.sock (0700 directory), relay ↔ the port
//!             named org.brig.agent
//! network:    lo up; eth0 (virtio-net, if the host gave one) at brig.ip=/32,
//!             brig.gw= on-link and the default route (kernel command line;
//!             `Readdress` after a restore)
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use brig_protocol::serial::{self, Packet, Unstuffer, MAX_PACKET};

use crate::session::Session;
use crate::sys;

/// The name the host gives the agent's virtio-serial port.
pub const PORT_NAME: &str = "org.brig.agent";
/// The serial numbers the host gives the two disks.
const ROOT_SERIAL: &str = "brig-root";
const DISK_SERIAL: &str = "brig-disk";
const SOCKET_DIR: &str = "/run/brig-agent";
const SOCKET: &str = "/run/brig-agent/agent.sock";
/// How long the devices may take to appear once their drivers loaded.
const DEVICES: Duration = Duration::from_secs(20);

/// Bring the guest up and serve; returns only on failure (the caller
/// reports it on the console and powers the machine off).
pub fn run() -> Result<(), String> {
    // 1. The kernel's file systems: devices appear in /dev (devtmpfs) as
    //    their drivers bind; /sys names them.
    for (fs, at) in [("devtmpfs", "/dev"), ("proc", "/proc"), ("sysfs", "/sys")] {
        sys::mount(fs, at, Some(fs), 0, None).map_err(|e| format!("mount {fs} at {at}: {e}"))?;
    }
    // 2. The drivers: Debian's cloud kernel builds virtio, its transports,
    //    disks, console and overlayfs as modules. The host wrote them in
    //    dependency order.
    load_modules().map_err(|e| format!("load modules: {e}"))?;
    // 3. The devices, found by what the host named them (disk serials,
    //    the port's name), not by probe order.
    let deadline = Instant::now() + DEVICES;
    let root_dev = wait_for(deadline, || disk_by_serial(ROOT_SERIAL))?;
    let disk_dev = wait_for(deadline, || disk_by_serial(DISK_SERIAL))?;
    let port = wait_for(deadline, port_by_name)?;
    // 4. The sandbox's root: the template read-only, the writable disk
    //    over it (what the sandbox writes stays within --disk).
    let ro = libc::MS_RDONLY | libc::MS_NODEV;
    sys::mount(&root_dev, "/lower", Some("ext4"), ro, Some("noload"))
        .map_err(|e| format!("mount the template ({root_dev}): {e}"))?;
    sys::mount(&disk_dev, "/disk", Some("ext4"), libc::MS_NODEV, None)
        .map_err(|e| format!("mount the writable disk ({disk_dev}): {e}"))?;
    for d in ["/disk/upper", "/disk/work"] {
        fs::create_dir_all(d).map_err(|e| format!("create {d}: {e}"))?;
    }
    sys::mount(
        "overlay",
        "/newroot",
        Some("overlay"),
        0,
        Some("lowerdir=/lower,upperdir=/disk/upper,workdir=/disk/work"),
    )
    .map_err(|e| format!("mount the root overlay: {e}"))?;
    // 4½. Its volumes: disk `brig-vol-N` (ext4, the volume's own file
    //     system) at the path `brig.volN=` names (hex), its mount point
    //     made on the way; as the process tier mounts them, nosuid and
    //     nodev, over everything else.
    mount_volumes(deadline)?;
    // 5. The kernel's file systems move with it; a terminal file system and
    //    shared memory as any Linux system has.
    for at in ["/dev", "/proc", "/sys"] {
        let target = format!("/newroot{at}");
        fs::create_dir_all(&target).map_err(|e| format!("create {target}: {e}"))?;
        sys::mount(at, &target, None, libc::MS_MOVE, None)
            .map_err(|e| format!("move {at}: {e}"))?;
    }
    for (fs, at, data) in [
        (
            "devpts",
            "/newroot/dev/pts",
            "newinstance,ptmxmode=0666,mode=620",
        ),
        ("tmpfs", "/newroot/dev/shm", "mode=1777"),
        ("tmpfs", "/newroot/run", "mode=755"),
    ] {
        fs::create_dir_all(at).map_err(|e| format!("create {at}: {e}"))?;
        sys::mount(fs, at, Some(fs), libc::MS_NOSUID, Some(data))
            .map_err(|e| format!("mount {fs} at {at}: {e}"))?;
    }
    // 6. Into it: the initramfs (a rootfs, which cannot be pivoted away)
    //    stays below, unreachable.
    std::env::set_current_dir("/newroot").map_err(|e| format!("enter the root: {e}"))?;
    sys::mount(".", "/", None, libc::MS_MOVE, None).map_err(|e| format!("move the root: {e}"))?;
    sys::chroot(".").map_err(|e| format!("chroot: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("enter /: {e}"))?;
    if let Some(name) = cmdline_value("brig.hostname") {
        let _ = sys::sethostname(&name);
    }
    // 6½. Its network: loopback always; `eth0` where the host gave the
    //     machine a network device (and named its address).
    network(deadline)?;
    // 7. The agent's socket, in a directory only the guest's root enters;
    //    then the relay to the host, and the agent serves.
    fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(SOCKET_DIR)
        .map_err(|e| format!("create {SOCKET_DIR}: {e}"))?;
    let listener = UnixListener::bind(SOCKET).map_err(|e| format!("bind {SOCKET}: {e}"))?;
    sys::cloexec_above_stderr().map_err(|e| format!("cannot set up descriptors: {e}"))?;
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("open {}: {e}", port.display()))?;
    sys::set_cloexec(std::os::fd::AsRawFd::as_raw_fd(&port))
        .map_err(|e| format!("cannot set up descriptors: {e}"))?;
    // The session first: it blocks SIGCHLD (for its signalfd) in this
    // thread, and the relay's threads inherit the mask. A thread made
    // before would take the children's SIGCHLDs and drop them (pid 1
    // ignores signals it has no handler for), and no exit would be seen.
    let mut session =
        Session::listen(listener).map_err(|e| format!("cannot set up the event loop: {e}"))?;
    let relay = Relay::new(port).map_err(|e| format!("start the relay: {e}"))?;
    thread::spawn(move || relay.serve_host());
    let end = session.run();
    Err(format!("the agent ended: {end:?}"))
}

/// What to do after [`run`] failed: say why on the console (the host
/// keeps it, and shows its tail) and end the machine.
pub fn fail(message: &str) -> ! {
    eprintln!("brig-agent (vm init): {message}");
    let e = sys::power_off();
    eprintln!("brig-agent (vm init): cannot power off: {e}");
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// The guest's links: loopback up; with `brig.ip=` and `brig.gw=` on the
/// command line (the host attached a network device), `eth0` at that
/// address, everything routed via the gateway, and a resolver the
/// gateway answers for.
fn network(deadline: Instant) -> Result<(), String> {
    sys::link_up("lo").map_err(|e| format!("set loopback up: {e}"))?;
    let ip = |key: &str| cmdline_value(key).and_then(|v| v.parse::<Ipv4Addr>().ok());
    let (Some(addr), Some(gateway)) = (ip("brig.ip"), ip("brig.gw")) else {
        return Ok(());
    };
    wait_for(deadline, || {
        Path::new(&format!("/sys/class/net/{NIC}"))
            .exists()
            .then_some(())
    })?;
    sys::set_ipv4(NIC, addr, gateway).map_err(|e| format!("configure {NIC}: {e}"))?;
    resolver(gateway);
    Ok(())
}

/// The guest's network device (the kernel's first ethernet name: no udev
/// renames it).
const NIC: &str = "eth0";

/// A resolv.conf that names a nameserver off the guest's loopback: the
/// template's own if it does (the gateway answers DNS sent to any
/// address), else one naming the gateway (a loopback stub such as
/// systemd-resolved's 127.0.0.53 would be the guest's own, and nobody
/// answers there).
fn resolver(gateway: Ipv4Addr) {
    resolver_at(Path::new("/etc/resolv.conf"), gateway);
}

fn resolver_at(file: &Path, gateway: Ipv4Addr) {
    let usable = fs::read_to_string(file).is_ok_and(|text| {
        text.lines().any(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("nameserver")
                && w.next()
                    .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                    .is_some_and(|a| !a.is_loopback())
        })
    });
    if !usable {
        // A symlink (to a stub's file under /run) is replaced, not
        // followed.
        let _ = fs::remove_file(file);
        if let Err(e) = fs::write(file, format!("nameserver {gateway}\n")) {
            eprintln!("brig-agent (vm init): cannot write {}: {e}", file.display());
        }
    }
}

fn load_modules() -> io::Result<()> {
    let order = fs::read_to_string("/brig/modules.order")?;
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = Path::new("/brig/modules").join(name);
        let file = File::open(&path)?;
        sys::finit_module(&file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

fn wait_for<T>(deadline: Instant, mut find: impl FnMut() -> Option<T>) -> Result<T, String> {
    loop {
        if let Some(found) = find() {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "a device did not appear within {DEVICES:?} (block: {:?}, ports: {:?})",
                list("/sys/block"),
                list("/sys/class/virtio-ports")
            ));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

fn list(dir: &str) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every `brig.volN=` of the command line, in order, mounted under
/// /newroot.
fn mount_volumes(deadline: Instant) -> Result<(), String> {
    for i in 0.. {
        let Some(hex) = cmdline_value(&format!("brig.vol{i}")) else {
            return Ok(());
        };
        let path = serial::path_from_hex(&hex)
            .filter(|p| p.starts_with('/') && !p.split('/').any(|c| c == ".."))
            .ok_or_else(|| format!("brig.vol{i}: not a volume path: {hex}"))?;
        let serial = format!("brig-vol-{i}");
        let dev = wait_for(deadline, || disk_by_serial(&serial))?;
        let target = format!("/newroot{path}");
        fs::create_dir_all(&target).map_err(|e| format!("create {target}: {e}"))?;
        sys::mount(
            &dev,
            &target,
            Some("ext4"),
            libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )
        .map_err(|e| format!("mount volume {i} ({dev}) at {path}: {e}"))?;
    }
    Ok(())
}

/// `/dev/vdX` of the virtio disk whose serial is `serial`.
fn disk_by_serial(serial: &str) -> Option<String> {
    list("/sys/block").into_iter().find_map(|name| {
        let s = fs::read_to_string(format!("/sys/block/{name}/serial")).ok()?;
        (s.trim() == serial && Path::new(&format!("/dev/{name}")).exists())
            .then(|| format!("/dev/{name}"))
    })
}

/// `/dev/vportNpM` of the port named [`PORT_NAME`] (no udev here to make
/// `/dev/virtio-ports/NAME`).
fn port_by_name() -> Option<PathBuf> {
    list("/sys/class/virtio-ports").into_iter().find_map(|p| {
        let name = fs::read_to_string(format!("/sys/class/virtio-ports/{p}/name")).ok()?;
        let dev = PathBuf::from(format!("/dev/{p}"));
        (name.trim() == PORT_NAME && dev.exists()).then_some(dev)
    })
}

fn cmdline_value(key: &str) -> Option<String> {
    let cmdline = fs::read_to_string("/proc/cmdline").ok()?;
    cmdline.split_whitespace().find_map(|w| {
        let (k, v) = w.split_once('=')?;
        (k == key && !v.is_empty()).then(|| v.to_owned())
    })
}

/// A restored guest's own identity (`brig_protocol::serial`'s `Renew`):
/// the host's clock, fresh randomness, its host name and a new machine
/// id. What fails is said on the console; the rest is still done.
fn renew(r: &serial::Renewal) {
    let steps: [(&str, io::Result<()>); 4] = [
        ("set the clock", sys::set_realtime(r.time_ns)),
        (
            "reseed the kernel's random generator",
            sys::add_entropy_and_reseed(&r.entropy),
        ),
        ("set the host name", sys::set_hostname(&r.hostname)),
        ("write a new /etc/machine-id", crate::write_machine_id()),
    ];
    for (what, done) in steps {
        if let Err(e) = done {
            eprintln!("brig-agent (vm init): cannot {what} after a restore: {e}");
        }
    }
}

/// Joins the host's connection (packets on the port) to the agent's socket.
/// One host connection at a time: a `Hello` replaces the current one,
/// exactly as a new connection to a listening agent does.
#[derive(Clone)]
struct Relay {
    port: Arc<File>,
    /// Writes to the port, one packet at a time.
    writer: Arc<Mutex<File>>,
    /// The current connection's number; a connection's output is sent
    /// only while it is current.
    current: Arc<AtomicU64>,
    conn: Arc<Mutex<Option<UnixStream>>>,
}

impl Relay {
    fn new(port: File) -> io::Result<Relay> {
        let writer = port.try_clone()?;
        Ok(Relay {
            port: Arc::new(port),
            writer: Arc::new(Mutex::new(writer)),
            current: Arc::new(AtomicU64::new(0)),
            conn: Arc::new(Mutex::new(None)),
        })
    }

    /// Read the port for ever. A read of 0 bytes means no host is
    /// connected (virtio-console's EOF): the current connection ends, as
    /// a host's hang-up ends it on a socket; the port is read again
    /// shortly, for the next host.
    fn serve_host(self) {
        let mut unstuffer = Unstuffer::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match (&*self.port).read(&mut buf) {
                Ok(0) => {
                    self.end_current();
                    thread::sleep(Duration::from_millis(10));
                }
                Ok(n) => unstuffer.feed(&buf[..n], |p| self.packet(p)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("brig-agent (vm init): the host's port failed: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn packet(&self, packet: Packet) {
        match packet {
            Packet::Hello(nonce) => self.connect(nonce),
            Packet::Data(bytes) => {
                let mut conn = lock(&self.conn);
                let failed = conn.as_mut().is_some_and(|c| c.write_all(&bytes).is_err());
                if failed {
                    drop(conn);
                    self.end_current();
                    self.send(self.current.load(Ordering::SeqCst), &Packet::Close);
                }
            }
            Packet::Close => self.end_current(),
            Packet::Renew(r) => {
                renew(&r);
                let mut out = Vec::new();
                Packet::Renewed(r.nonce).encode_into(&mut out);
                let _ = lock(&self.writer).write_all(&out);
            }
            Packet::Readdress(a) => match sys::set_ipv4(NIC, a.addr, a.gateway) {
                Ok(()) => {
                    // A guest booted without an address (a boot snapshot's)
                    // names no resolver yet.
                    resolver(a.gateway);
                    let mut out = Vec::new();
                    Packet::Renewed(a.nonce).encode_into(&mut out);
                    let _ = lock(&self.writer).write_all(&out);
                }
                // Unanswered: the host gives up and says why.
                Err(e) => eprintln!("brig-agent (vm init): cannot readdress {NIC}: {e}"),
            },
            Packet::Ready(_) | Packet::Renewed(_) => {}
        }
    }

    /// A new host: the old connection ends, a new one to the agent
    /// begins, and the host hears `Ready` once the agent's socket took it.
    fn connect(&self, nonce: u64) {
        let stream = match UnixStream::connect(SOCKET) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("brig-agent (vm init): cannot reach the agent: {e}");
                return;
            }
        };
        let reader = match stream.try_clone() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("brig-agent (vm init): {e}");
                return;
            }
        };
        let number = {
            // Under the writer's lock: no packet of the old connection
            // can follow the `Ready`.
            let mut w = lock(&self.writer);
            let number = self.current.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(old) = lock(&self.conn).replace(stream) {
                let _ = old.shutdown(std::net::Shutdown::Both);
            }
            let mut out = Vec::new();
            Packet::Ready(nonce).encode_into(&mut out);
            let _ = w.write_all(&out);
            number
        };
        let relay = self.clone();
        thread::spawn(move || relay.forward_to_host(reader, number));
    }

    /// Connection `number`'s output, to the host while it is current.
    fn forward_to_host(self, mut agent: UnixStream, number: u64) {
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            match agent.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut out = Vec::with_capacity(n + n / 64 + 4);
                    serial::encode_data(&buf[..n], &mut out);
                    if !self.send_raw(number, &out) {
                        return;
                    }
                }
            }
        }
        if self.current.load(Ordering::SeqCst) == number {
            self.end_current();
            self.send(number, &Packet::Close);
        }
    }

    fn send(&self, number: u64, packet: &Packet) {
        let mut out = Vec::new();
        packet.encode_into(&mut out);
        self.send_raw(number, &out);
    }

    /// Write `bytes` if connection `number` is still current.
    fn send_raw(&self, number: u64, bytes: &[u8]) -> bool {
        let mut w = lock(&self.writer);
        if self.current.load(Ordering::SeqCst) != number {
            return false;
        }
        w.write_all(bytes).is_ok()
    }

    fn end_current(&self) {
        if let Some(old) = lock(&self.conn).take() {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GW: Ipv4Addr = Ipv4Addr::new(10, 87, 0, 1);

    /// The guest's resolv.conf after `resolver_at`, given what the
    /// template had (`None`: no file).
    fn after(template: Option<&str>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("resolv.conf");
        if let Some(text) = template {
            fs::write(&file, text).unwrap();
        }
        resolver_at(&file, GW);
        fs::read_to_string(&file).unwrap()
    }

    #[test]
    fn a_loopback_stub_or_no_nameserver_is_replaced_by_the_gateway() {
        let gw = "nameserver 10.87.0.1\n";
        // systemd-resolved's stub: the guest's own loopback, where nobody
        // answers.
        assert_eq!(after(Some("nameserver 127.0.0.53\noptions edns0\n")), gw);
        assert_eq!(after(Some("nameserver ::1\n")), gw);
        assert_eq!(after(Some("# nothing\nsearch example\n")), gw);
        assert_eq!(after(Some("nameserver not-an-address\n")), gw);
        assert_eq!(after(None), gw);
    }

    #[test]
    fn a_template_nameserver_off_loopback_is_kept() {
        let own = "search example\nnameserver 127.0.0.53\nnameserver 192.0.2.53\n";
        assert_eq!(after(Some(own)), own);
    }

    #[test]
    fn a_symlink_is_replaced_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("stub-resolv.conf");
        fs::write(&target, "nameserver 127.0.0.53\n").unwrap();
        let file = dir.path().join("resolv.conf");
        std::os::unix::fs::symlink(&target, &file).unwrap();
        resolver_at(&file, GW);
        assert!(!fs::symlink_metadata(&file).unwrap().is_symlink());
        assert_eq!(fs::read_to_string(&file).unwrap(), "nameserver 10.87.0.1\n");
        assert_eq!(
            fs::read_to_string(&target).unwrap(),
            "nameserver 127.0.0.53\n"
        );
    }
}
