//! Gain privileges through exec: copy this program into /tmp, /, /dev/shm
//! and /var/tmp, chown it to root and set the setuid bit (and, separately,
//! a file capability granting CAP_SETUID+CAP_DAC_OVERRIDE), then run it as
//! uid 65534 and have the copy report its real and effective uid and
//! capabilities. Also lists setuid binaries the template ships.
//!
//! Contained where brig sets no_new_privs (`brig run`, daemon sandboxes):
//! exec never raises privileges: the copy runs with euid 65534 and no
//! capabilities (whether or not the filesystem is also nosuid), and
//! `NoNewPrivs: 1` shows in /proc/self/status. Escaped: the copy ran with
//! euid 0 or with capabilities, or no_new_privs is off.
//!
//! In E2B sandboxes setuid works by design (their user has `sudo`), so
//! exec may raise privileges — but only to the sandbox's own root:
//! contained there when every copy's effective capabilities stay within
//! [`ROOT_CAPS`] and host uid 0 stays unmapped (the uid map read by the
//! copy); escaped when a copy holds any capability beyond that set. Destructive if mis-run (it creates
//! setuid-root files): needs `--armed` and a user namespace.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;

use brig_hostile::{
    cstr, errno, errno_name, guard_destructive, status_field, Args, Report, ROOT_CAPS,
};

/// The mode the copy runs in: print ids and capabilities, nothing else.
fn report_ids() -> ! {
    // SAFETY: getuid/geteuid have no preconditions.
    let (ruid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    let capeff = status_field("self", "CapEff").unwrap_or_default();
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let host_root = map.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 3 && f[1] == "0"
    });
    println!("ruid={ruid} euid={euid} host_root_mapped={host_root} capeff={capeff}");
    std::process::exit(0)
}

fn nosuid(dir: &str) -> bool {
    let p = cstr(dir);
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path, valid out-pointer.
    unsafe { libc::statvfs(p.as_ptr(), &mut sv) == 0 && sv.f_flag & libc::ST_NOSUID != 0 }
}

/// vfs_cap_data revision 2 with CAP_DAC_OVERRIDE and CAP_SETUID permitted
/// and the effective bit set.
fn file_caps() -> [u8; 20] {
    let mut v = [0u8; 20];
    v[0..4].copy_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    v[4..8].copy_from_slice(&((1u32 << 1) | (1u32 << 7)).to_le_bytes());
    v
}

/// Run the copy as uid 65534 when we are root (an unprivileged user such
/// as E2B's `user` cannot switch: it runs the copy as itself).
fn run_copy(path: &str) -> Result<String, String> {
    let mut cmd = std::process::Command::new(path);
    cmd.arg("report-ids");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd
        .output()
        .map_err(|e| brig_hostile::errno_name(brig_hostile::io_errno(&e)))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let args = Args::get();
    if args.positional().first().map(String::as_str) == Some("report-ids") {
        report_ids();
    }
    guard_destructive("setuid_escalation", &args);
    let mut report = Report::new("setuid_escalation");
    let mode = args.mode();
    let nnp = status_field("self", "NoNewPrivs").unwrap_or_default();
    if mode.no_new_privs() {
        report.record(nnp != "1", format!("NoNewPrivs: {nnp}"));
    } else {
        report.note(format!("NoNewPrivs: {nnp} (off by design: sudo)"));
    }
    // What a copy that ran may hold: nothing under no_new_privs; with
    // setuid allowed, at most the sandbox root's set, never host root.
    let too_much = |ids: &str| -> bool {
        let capeff = ids
            .rsplit("capeff=")
            .next()
            .and_then(|c| u64::from_str_radix(c.trim(), 16).ok())
            .unwrap_or(u64::MAX);
        if ids.contains("host_root_mapped=true") {
            return true;
        }
        if mode.no_new_privs() {
            !ids.contains("euid=65534") || capeff != 0
        } else {
            capeff & !ROOT_CAPS != 0
        }
    };
    let exe = match std::fs::read("/proc/self/exe") {
        Ok(b) => b,
        Err(e) => {
            report.note(format!("read /proc/self/exe: {e}"));
            report.finish()
        }
    };
    for dir in ["/tmp", "/", "/dev/shm", "/var/tmp"] {
        if std::fs::metadata(dir).is_err() {
            continue;
        }
        let path = format!("{}/brig-hostile-suid", dir.trim_end_matches('/'));
        if let Err(e) = std::fs::write(&path, &exe) {
            report.note(format!("{dir}: copy failed: {e}"));
            continue;
        }
        let p = cstr(&path);
        // SAFETY: NUL-terminated path.
        let chown = unsafe { libc::chown(p.as_ptr(), 0, 0) };
        let chown = if chown == 0 {
            "ok".to_string()
        } else {
            errno_name(errno())
        };
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o4755));
        let mode = std::fs::metadata(&path)
            .map(|m| format!("{:o} uid {}", m.mode(), m.uid()))
            .unwrap_or_default();
        match run_copy(&path) {
            Ok(ids) => {
                report.record(
                    too_much(&ids),
                    format!(
                        "{dir} (nosuid: {}): chown 0: {chown}, mode {mode}, ran as 65534 -> {ids}",
                        nosuid(dir)
                    ),
                );
            }
            Err(e) => report.note(format!("{dir}: running the setuid copy: {e}")),
        }
        // Same again with a file capability instead of the setuid bit.
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755));
        let caps = file_caps();
        let name = cstr("security.capability");
        // SAFETY: NUL-terminated strings; caps is valid for its length.
        let r = unsafe {
            libc::setxattr(
                p.as_ptr(),
                name.as_ptr(),
                caps.as_ptr().cast(),
                caps.len(),
                0,
            )
        };
        if r == 0 {
            match run_copy(&path) {
                Ok(ids) => {
                    report.record(
                        too_much(&ids),
                        format!("{dir}: file capability set, ran as 65534 -> {ids}"),
                    );
                }
                Err(e) => report.note(format!("{dir}: running the file-capability copy: {e}")),
            }
        } else {
            report.note(format!(
                "{dir}: setxattr security.capability: {}",
                errno_name(errno())
            ));
        }
        let _ = std::fs::remove_file(&path);
    }
    let mut shipped = Vec::new();
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.metadata()
                    .map(|m| m.mode() & 0o4000 != 0)
                    .unwrap_or(false)
                {
                    shipped.push(e.path().display().to_string());
                }
            }
        }
    }
    shipped.sort();
    shipped.dedup();
    report.note(format!(
        "setuid binaries in the template (inert under no_new_privs; /usr nosuid: {}): {shipped:?}",
        nosuid("/usr")
    ));
    report.finish()
}
