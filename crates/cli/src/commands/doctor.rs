//! `brig doctor`: report which kernel features and isolation tiers this
//! host offers, and what to do about anything missing.
//!
//! The probing lives in [`brig_host::probe`]; this file only presents the
//! [`HostReport`] — as a table for people, or as JSON for scripts — and
//! turns it into an exit code: 0 if the process tier is usable, 1 if not.

use std::io::Write as _;

use anyhow::Context as _;
use brig_host::probe::{self, Accel, Feature, HostReport, Status};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The validated form of [`DoctorArgs`].
#[derive(Debug, Clone, Copy)]
enum Format {
    Table,
    Json,
}

impl From<DoctorArgs> for Format {
    fn from(args: DoctorArgs) -> Self {
        if args.json {
            Format::Json
        } else {
            Format::Table
        }
    }
}

pub fn run(args: DoctorArgs) -> anyhow::Result<i32> {
    let format = Format::from(args);
    let report = probe::probe();

    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut out, &report).context("writing the report")?;
            writeln!(out).context("writing the report")?;
        }
        Format::Table => out
            .write_all(render(&report).as_bytes())
            .context("writing the report")?,
    }
    Ok(if report.tiers.process { 0 } else { 1 })
}

/// The human report: one row per feature (required ones marked `*`), a
/// `fix:` line under each that is not ok, then one line per tier.
fn render(report: &HostReport) -> String {
    let name_width = report
        .features
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(0);
    let status_width = "degraded".len();
    // Where the detail column starts, so fix lines line up under it.
    let detail_column = 2 + name_width + 2 + status_width + 2;

    let mut s = String::new();
    s.push_str(&format!(
        "  {:name_width$}  {:status_width$}  DETAIL\n",
        "FEATURE", "STATUS"
    ));
    for feature in &report.features {
        let marker = if feature.required { '*' } else { ' ' };
        s.push_str(&format!(
            "{marker} {:name_width$}  {:status_width$}  {}\n",
            feature.name,
            status_word(feature.status),
            feature.detail
        ));
        if let (Some(fix), false) = (&feature.fix, feature.status == Status::Ok) {
            s.push_str(&format!("{:detail_column$}fix: {fix}\n", ""));
        }
    }
    s.push_str("\n* required by the process tier\n\ntiers:\n");
    s.push_str(&format!("  process: {}\n", process_line(report)));
    s.push_str(&format!("  gvisor:  {}\n", gvisor_line(report)));
    s.push_str(&format!("  vm:      {}\n", vm_line(report)));
    s
}

fn status_word(status: Status) -> &'static str {
    match status {
        Status::Ok => "ok",
        Status::Missing => "missing",
        Status::Degraded => "degraded",
    }
}

/// "name: fix" for the feature a tier is waiting on.
fn because(feature: Option<&Feature>, fallback: &str) -> String {
    match feature {
        Some(f) => format!("{}: {}", f.name, f.fix.as_deref().unwrap_or(&f.detail)),
        None => fallback.to_owned(),
    }
}

fn process_line(report: &HostReport) -> String {
    match report.process_blocker() {
        None => "available".to_owned(),
        blocker => format!("not available — {}", because(blocker, "")),
    }
}

fn gvisor_line(report: &HostReport) -> String {
    if report.tiers.gvisor {
        return format!("available — {}", report.tiers.gvisor_detail);
    }
    match report.feature("runsc").filter(|f| f.status != Status::Ok) {
        Some(runsc) => format!(
            "not available — install runsc: {}",
            runsc.fix.as_deref().unwrap_or(&runsc.detail)
        ),
        // runsc is fine; brig's privileges or runsc's platforms are not.
        None => format!("not available — {}", report.tiers.gvisor_detail),
    }
}

fn vm_line(report: &HostReport) -> String {
    match report.tiers.vm.accel {
        Accel::Kvm => "available (KVM)".to_owned(),
        Accel::PvmKvm => {
            "available (TCG emulation, slow; /dev/kvm is PVM and cannot boot a stock guest)"
                .to_owned()
        }
        Accel::Tcg => "available (TCG emulation, slow)".to_owned(),
        Accel::Unavailable => {
            "not available — install qemu: apt-get install qemu-system-x86".to_owned()
        }
    }
}
