//! QEMU's command line for one guest, and the accelerator it runs on.
//!
//! The machine is `q35` with nothing QEMU would add by default: no NIC,
//! display, USB, floppy or CD-ROM. `microvm` (no firmware, no PCI) would
//! boot faster, and did once here in 2.2 s against q35's 3.4 s, but under
//! TCG on a busy host its guest cannot calibrate its TSC (microvm has no
//! HPET and no ACPI PM timer to measure against; "Unable to calibrate
//! against PIT"), its clock never ticks, and the boot hangs. q35's HPET
//! makes the boot reliable; its firmware (SeaBIOS) costs about a second
//! of emulated real-mode code under TCG, a few milliseconds under KVM.

use std::ffi::OsString;
use std::path::Path;

use brig_host::probe::Accel;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accelerator {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's emulator.
    Tcg,
}

impl Accelerator {
    /// From brig-host's probe (the one `brig doctor` reports): KVM only
    /// where /dev/kvm is backed by VT-x/AMD-V. A PVM /dev/kvm (these
    /// machines') fails on a stock kernel's instructions, so TCG.
    /// `BRIG_VM_ACCEL=tcg` forces the emulator.
    pub fn detect(probed: Accel) -> Option<Accelerator> {
        let forced = std::env::var("BRIG_VM_ACCEL").ok();
        match (probed, forced.as_deref()) {
            (Accel::Unavailable, _) => None,
            (_, Some("tcg")) => Some(Accelerator::Tcg),
            (Accel::Kvm, _) => Some(Accelerator::Kvm),
            _ => Some(Accelerator::Tcg),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Accelerator::Kvm => "kvm",
            Accelerator::Tcg => "tcg",
        }
    }

    /// What QEMU itself takes beyond the guest's memory, for its cgroup:
    /// under TCG its translation cache (bounded by `tb-size`) and
    /// emulation state.
    pub fn overhead_bytes(self) -> u64 {
        match self {
            Accelerator::Kvm => 96 << 20,
            Accelerator::Tcg => (TB_SIZE_MIB << 20) + (128 << 20),
        }
    }
}

/// TCG's translation cache, in MiB (QEMU's default is 1 GiB per guest).
const TB_SIZE_MIB: u64 = 64;

/// Everything one guest's command line names.
#[derive(Debug)]
pub struct Machine<'a> {
    pub name: &'a str,
    pub accel: Accelerator,
    pub memory_mib: u64,
    pub cpus: u32,
    /// Paths QEMU opens (the shared read-only ones as /proc/self/fd/N: it
    /// runs as a uid that could not reach them by name).
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    pub root_image: &'a Path,
    pub disk: &'a Path,
    /// The sandbox's directory: QEMU's sockets, console and pid file.
    pub dir: &'a Path,
    pub hostname: &'a str,
    /// Start paused, waiting for a saved machine's state
    /// (`migrate-incoming` over QMP) instead of booting.
    pub incoming: bool,
    pub network: Network,
    /// Where the guest's RAM lives.
    pub ram: Ram,
    /// The vCPUs' model under TCG (KVM's are the host's).
    pub cpu: TcgCpu,
    /// Where each volume appears in the guest; volume `i`'s image is
    /// open read-write as descriptor [`VOLUME_FD`] + 2`i` and read-only as
    /// the next.
    pub volumes: &'a [String],
}

/// The descriptor of the guest's RAM file ([`Ram::Shared`],
/// [`Ram::CopyOnWrite`]), after the tap's 8.
pub const RAM_FD: i32 = 9;
/// The descriptor of the first volume's image (after the RAM's).
pub const VOLUME_FD: i32 = 10;
/// The RAM's memory backend: its id names the RAM in a saved machine's
/// state, so a restore's must be the same.
const RAM_ID: &str = "brig-ram";

/// The CPU model a guest has under TCG.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum TcgCpu {
    /// QEMU's default, qemu64 (SSE3 at most): the machines brig made
    /// before, whose restores must have it again.
    #[default]
    Qemu64,
    /// Every feature QEMU's emulator implements (SSSE3 to AVX2): programs
    /// built for today's x86-64 need them. On qemu64, OpenBLAS (numpy's)
    /// picks a kernel qemu64 does not have and dies of an invalid opcode.
    Max,
}

/// Where a guest's RAM lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ram {
    /// QEMU's own anonymous memory (`-m` alone): the machines brig made
    /// before it kept RAM in a file, which their checkpoints' streams
    /// name, so restoring one makes the same.
    Anonymous,
    /// A memory file brig made (a memfd at [`RAM_FD`]), mapped shared: a
    /// checkpoint copies the RAM from it while the machine is stopped and
    /// migrates only the devices' state (`x-ignore-shared`).
    Shared,
    /// A checkpoint's RAM file at [`RAM_FD`], opened read-only and mapped
    /// private and writable (`readonly=on,rom=off`, QEMU 8.2 or later):
    /// forks of one checkpoint share its pages until each writes them.
    CopyOnWrite,
}

/// The serial number the guest finds volume `i`'s disk by.
pub fn volume_serial(i: usize) -> String {
    format!("brig-vol-{i}")
}

/// The most bytes of volume paths a guest's command line carries (hex:
/// twice as many), well inside the kernel's 2048.
pub const MAX_VOLUME_PATHS: usize = 768;

/// The guest's network device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// None at all: the guest has loopback only.
    None,
    /// A virtio-net device on the tap at descriptor 8 (`net.rs`), the
    /// guest at `addr`, routed via `gateway`.
    Tap {
        addr: std::net::Ipv4Addr,
        gateway: std::net::Ipv4Addr,
    },
    /// The device on a tap in an empty namespace (`net::unplugged`),
    /// leading nowhere: a machine saved with one, restored with no network
    /// (its devices must be the saved ones).
    Unplugged,
}

/// The kernel's command line: the console on the first serial port (kept
/// in the sandbox's directory), quiet; a panic ends the machine at once;
/// what follows `--` is the init's (brig-agent's) arguments.
fn kernel_cmdline(m: &Machine) -> String {
    let net = match m.network {
        Network::Tap { addr, gateway } => format!(" brig.ip={addr} brig.gw={gateway}"),
        Network::None | Network::Unplugged => String::new(),
    };
    // Paths in hex: any byte a path may hold, never a space.
    let volumes: String = m
        .volumes
        .iter()
        .enumerate()
        .map(|(i, p)| format!(" brig.vol{i}={}", brig_protocol::serial::path_to_hex(p)))
        .collect();
    format!(
        "console=ttyS0 quiet panic=-1 reboot=t brig.hostname={}{net}{volumes} -- --vm-init",
        m.hostname
    )
}

/// The arguments after `qemu-system-x86_64`.
pub fn args(m: &Machine) -> Vec<OsString> {
    let dir = |f: &str| m.dir.join(f).display().to_string();
    let ram = |share: &str| {
        format!(
            "memory-backend-file,id={RAM_ID},size={}M,mem-path=/proc/self/fd/{RAM_FD},{share}",
            m.memory_mib
        )
    };
    let (machine, backend) = match m.ram {
        Ram::Anonymous => ("q35".to_owned(), None),
        Ram::Shared => (
            format!("q35,memory-backend={RAM_ID}"),
            Some(ram("share=on")),
        ),
        Ram::CopyOnWrite => (
            format!("q35,memory-backend={RAM_ID}"),
            Some(ram("share=off,readonly=on,rom=off")),
        ),
    };
    let mut a: Vec<String> = vec![
        "-name".into(),
        format!("brig-{}", m.name),
        // Nothing QEMU would add on its own: no NIC, display, USB, floppy,
        // CD-ROM, parallel port, config files.
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-nographic".into(),
        "-machine".into(),
        machine,
        "-accel".into(),
        match m.accel {
            Accelerator::Kvm => "kvm".into(),
            Accelerator::Tcg => format!("tcg,tb-size={TB_SIZE_MIB}"),
        },
    ];
    match (m.accel, m.cpu) {
        (Accelerator::Kvm, _) => a.extend(["-cpu".into(), "host".into()]),
        (Accelerator::Tcg, TcgCpu::Max) => a.extend(["-cpu".into(), "max".into()]),
        (Accelerator::Tcg, TcgCpu::Qemu64) => {}
    }
    if let Some(backend) = backend {
        a.extend(["-object".into(), backend]);
    }
    a.extend([
        "-m".into(),
        format!("{}M", m.memory_mib),
        "-smp".into(),
        m.cpus.to_string(),
        // QEMU's own seccomp filter: no obsolete syscalls, no setuid or
        // privilege changes, no fork or exec, no scheduler or resource
        // calls. (It is why brig detaches QEMU itself: QEMU 7.2's
        // -daemonize forks after the filter is in place, and fails.)
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        "-kernel".into(),
        m.kernel.display().to_string(),
        "-initrd".into(),
        m.initramfs.display().to_string(),
        "-append".into(),
        kernel_cmdline(m),
        // A guest that powers off or reboots ends its QEMU.
        "-no-reboot".into(),
        "-chardev".into(),
        format!("file,id=console,path={}", dir("console.log")),
        "-serial".into(),
        "chardev:console".into(),
        // The template, read-only, and the writable disk, named by serial
        // (the guest finds them so, whatever order they probe in).
        "-drive".into(),
        format!(
            "if=none,id=root,format=raw,readonly=on,file={}",
            m.root_image.display()
        ),
        "-device".into(),
        "virtio-blk-pci,drive=root,serial=brig-root".into(),
        "-drive".into(),
        format!(
            "if=none,id=disk,format=raw,cache=unsafe,file={}",
            m.disk.display()
        ),
        "-device".into(),
        "virtio-blk-pci,drive=disk,serial=brig-disk".into(),
        // The agent's line: a virtio-serial port, a socket on the host.
        "-device".into(),
        "virtio-serial-pci,max_ports=2".into(),
        "-chardev".into(),
        format!(
            "socket,id=agent,path={},server=on,wait=off",
            dir("agent.sock")
        ),
        "-device".into(),
        "virtserialport,chardev=agent,name=org.brig.agent".into(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", dir("qmp.sock")),
        // Written early (before the sockets): who QEMU is, for brig, which
        // does not parent it.
        "-pidfile".into(),
        dir("qemu.pid"),
    ]);
    let nic = format!("virtio-net-pci,mac={}", crate::net::GUEST_MAC);
    if m.network != Network::None {
        a.extend([
            "-netdev".into(),
            "tap,id=net0,fd=8".into(),
            "-device".into(),
            format!("{nic},netdev=net0"),
        ]);
    }
    // Each volume's image, handed over as a descriptor QEMU uses as it is
    // (an fd set: it runs as a uid that could not open the image).
    // QEMU opens the image read-only too (its probe and lock), and takes
    // from the set the descriptor of the access it asks for.
    for i in 0..m.volumes.len() {
        let (fd, set) = (VOLUME_FD + 2 * i as i32, i + 1);
        a.extend([
            "-add-fd".into(),
            format!("fd={fd},set={set}"),
            "-add-fd".into(),
            format!("fd={},set={set}", fd + 1),
            "-drive".into(),
            format!("if=none,id=vol{i},format=raw,file=/dev/fdset/{set}"),
            "-device".into(),
            format!("virtio-blk-pci,drive=vol{i},serial={}", volume_serial(i)),
        ]);
    }
    if m.incoming {
        // Stays paused once the state is in, until brig says `cont`.
        a.extend(["-incoming".into(), "defer".into(), "-S".into()]);
    }
    a.into_iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A machine in `dir` with `network`.
    fn machine<'a>(dir: &'a Path, disk: &'a Path, cpus: u32, network: Network) -> Machine<'a> {
        Machine {
            name: "x",
            accel: Accelerator::Tcg,
            memory_mib: 384,
            cpus,
            kernel: Path::new("/proc/self/fd/3"),
            initramfs: Path::new("/proc/self/fd/4"),
            root_image: Path::new("/proc/self/fd/5"),
            disk,
            dir,
            hostname: "x",
            incoming: false,
            network,
            ram: Ram::Shared,
            cpu: TcgCpu::Max,
            volumes: &[],
        }
    }

    #[test]
    fn a_machine_of_before_keeps_qemus_default_cpu_and_kvm_the_hosts() {
        let dir = PathBuf::from("/run/brig/vm/x");
        let disk = dir.join("disk.ext4");
        let cpu = |m: &Machine| {
            let a: Vec<String> = args(m)
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect();
            a.iter().position(|x| x == "-cpu").map(|i| a[i + 1].clone())
        };
        let mut m = machine(&dir, &disk, 1, Network::None);
        m.cpu = TcgCpu::Qemu64;
        assert_eq!(cpu(&m), None);
        m.accel = Accelerator::Kvm;
        assert_eq!(cpu(&m).as_deref(), Some("host"));
        m.cpu = TcgCpu::Max;
        assert_eq!(cpu(&m).as_deref(), Some("host"));
    }

    #[test]
    fn the_command_line_names_the_limits_the_disks_and_no_default_devices() {
        let dir = PathBuf::from("/run/brig/vm/x");
        let disk = dir.join("disk.ext4");
        let m = machine(&dir, &disk, 2, Network::None);
        let a: Vec<String> = args(&m)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let after = |flag: &str| {
            a.iter()
                .position(|x| x == flag)
                .map(|i| a[i + 1].clone())
                .unwrap()
        };
        assert_eq!(after("-m"), "384M");
        assert_eq!(after("-smp"), "2");
        assert_eq!(after("-accel"), "tcg,tb-size=64");
        assert!(after("-append").ends_with("-- --vm-init"));
        assert!(after("-sandbox").contains("spawn=deny"));
        assert!(a.contains(&"-nodefaults".to_owned()));
        assert!(a
            .iter()
            .any(|x| x.contains("readonly=on,file=/proc/self/fd/5")));
        assert_eq!(after("-cpu"), "max");
        assert!(!a.iter().any(|x| x.contains("virtio-net")), "no NIC");
        assert_eq!(after("-machine"), "q35,memory-backend=brig-ram");
        assert_eq!(
            after("-object"),
            "memory-backend-file,id=brig-ram,size=384M,mem-path=/proc/self/fd/9,share=on"
        );
    }

    #[test]
    fn a_fork_maps_its_checkpoints_ram_private_and_an_old_machine_has_none() {
        let dir = PathBuf::from("/run/brig/vm/x");
        let disk = dir.join("disk.ext4");
        let mut m = machine(&dir, &disk, 1, Network::None);
        m.ram = Ram::CopyOnWrite;
        let a: Vec<String> = args(&m)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let object = &a[a.iter().position(|x| x == "-object").unwrap() + 1];
        assert!(
            object.ends_with("mem-path=/proc/self/fd/9,share=off,readonly=on,rom=off"),
            "{object}"
        );
        m.ram = Ram::Anonymous;
        let a: Vec<String> = args(&m)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert!(!a.contains(&"-object".to_owned()));
        assert_eq!(
            a[a.iter().position(|x| x == "-machine").unwrap() + 1],
            "q35"
        );
    }

    #[test]
    fn a_networked_guest_has_a_nic_on_the_tap_and_learns_its_address() {
        let dir = PathBuf::from("/run/brig/vm/x");
        let disk = dir.join("disk.ext4");
        let tap = Network::Tap {
            addr: [10, 88, 0, 7].into(),
            gateway: [10, 87, 0, 1].into(),
        };
        let mut m = machine(&dir, &disk, 1, tap);
        let strings = |m: &Machine| -> Vec<String> {
            args(m)
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        let a = strings(&m);
        assert!(a.contains(&"tap,id=net0,fd=8".to_owned()));
        assert!(a
            .iter()
            .any(|x| x.starts_with("virtio-net-pci,") && x.ends_with("netdev=net0")));
        let cmdline = &a[a.iter().position(|x| x == "-append").unwrap() + 1];
        assert!(
            cmdline.contains(" brig.ip=10.88.0.7 brig.gw=10.87.0.1 "),
            "{cmdline}"
        );
        m.network = Network::Unplugged;
        let a = strings(&m);
        assert!(
            a.contains(&"tap,id=net0,fd=8".to_owned()),
            "the same device"
        );
        let cmdline = &a[a.iter().position(|x| x == "-append").unwrap() + 1];
        assert!(!cmdline.contains("brig.ip"), "{cmdline}");
    }
}
