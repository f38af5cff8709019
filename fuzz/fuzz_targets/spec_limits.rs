//! Sandbox create specs and their limits as clients send them: sizes
//! (`512M`), durations (`1h30m`), cpus, env vars, users, template names,
//! sandbox ids (brig-core), E2B's timestamps (brig-e2b), and the whole
//! JSON body of `POST /v1/sandboxes` through the API's stage-two parse
//! (brig-api).
//!
//! The input is tried both as one string for every parser and, if it is
//! JSON, as a create body. Properties: nothing panics; what parses prints
//! back to something that parses to the same value (sizes within
//! Display's rounding, durations to the whole second as a bare number,
//! env vars, users, templates and ids exactly, RFC 3339 timestamps to the
//! same instant); the create body's limits are exactly what the parsers
//! make of its fields.
#![no_main]

use std::time::Duration;

use brig_api::sandboxes::CreateSandboxConfig;
use brig_core::{parse_duration, parse_size, ByteSize, EnvVar, SandboxId, TemplateRef, UserSpec};
use brig_e2b::control::{parse_rfc3339, rfc3339};
use libfuzzer_sys::fuzz_target;

fn size(s: &str) {
    let Ok(b) = parse_size(s) else { return };
    // Bytes as a bare number are exact.
    assert_eq!(parse_size(&b.0.to_string()), Ok(b), "{s:?}");
    // Display is exact in a whole unit, else rounded to 0.1 MiB.
    let shown = b.to_string();
    let again = parse_size(&shown).unwrap_or_else(|e| panic!("{s:?} shows as {shown:?}: {e}"));
    let slack = if shown.contains('.') {
        ByteSize::MIB / 20 + 1
    } else {
        0
    };
    assert!(
        again.0.abs_diff(b.0) <= slack,
        "{s:?} is {b:?}, shown {shown:?}, which is {again:?}"
    );
}

fn duration(s: &str) {
    let Ok(d) = parse_duration(s) else { return };
    let secs = d.as_secs();
    // A bare number is seconds; f64 is exact below 2^53.
    if secs < 1 << 53 {
        assert_eq!(
            parse_duration(&secs.to_string()),
            Ok(Duration::from_secs(secs)),
            "{s:?}"
        );
        assert_eq!(
            parse_duration(&format!("{secs}s{}ms", d.subsec_millis())),
            Ok(Duration::from_secs(secs) + Duration::from_millis(d.subsec_millis().into())),
            "{s:?}"
        );
    }
}

fn strings(s: &str) {
    size(s);
    duration(s);
    if let Ok(v) = EnvVar::parse(s) {
        assert_eq!(format!("{}={}", v.key, v.value), s);
    }
    match UserSpec::parse(s) {
        Ok(UserSpec::Name(n)) => assert_eq!(n, s),
        Ok(UserSpec::Id { uid, gid }) => {
            let shown = match gid {
                Some(g) => format!("{uid}:{g}"),
                None => uid.to_string(),
            };
            assert_eq!(UserSpec::parse(&shown), Ok(UserSpec::Id { uid, gid }));
        }
        Err(_) => {}
    }
    if let Ok(t) = TemplateRef::parse(s) {
        assert_eq!(TemplateRef::parse(&t.to_string()), Ok(t), "{s:?}");
    }
    if let Some(id) = SandboxId::parse(s) {
        assert_eq!(id.as_str(), s);
    }
    // E2B's `startedAfter` filter: a timestamp prints (as brig prints
    // `startedAt`) to one that parses to the same instant, within the
    // years RFC 3339 writes with four digits.
    if let Some(ms) = parse_rfc3339(s) {
        let shown = rfc3339(ms);
        if shown.len() == 24 && !shown.starts_with('-') {
            assert_eq!(parse_rfc3339(&shown), Some(ms), "{s:?} shown as {shown:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        strings(s);
    }
    let Ok(body) = serde_json::from_slice::<CreateSandboxConfig>(data) else {
        return;
    };
    let (memory, disk, pids, cpus, timeout) = (
        body.memory.clone(),
        body.disk.clone(),
        body.pids,
        body.cpus,
        body.timeout.clone(),
    );
    let Ok(config) = body.validate() else { return };
    let l = &config.limits;
    if let Some(m) = memory {
        assert_eq!(Ok(l.memory), parse_size(&m));
    }
    if let Some(d) = disk {
        assert_eq!(Ok(l.disk), parse_size(&d));
    }
    if let Some(p) = pids {
        assert_eq!(l.pids, p);
    }
    assert_eq!(l.cpus.map(f64::to_bits), cpus.map(f64::to_bits));
    assert_eq!(config.timeout, timeout.map(|t| parse_duration(&t).unwrap()));
    // The limits' own rule never panics, whatever the numbers.
    let _ = l.validate();
});
