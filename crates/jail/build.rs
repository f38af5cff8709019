//! Compiles the sandbox's seccomp policy (`resources/seccomp/sandbox.json`)
//! into one classic-BPF program at build time, so a spawn never parses JSON
//! or runs a compiler: it hands the kernel a `static` array.
//!
//! The policy file is plain seccompiler JSON: a map of filters, one per
//! errno (`deny` answers EPERM, `hide` answers ENOSYS). seccompiler compiles
//! each group; brig then puts them into one program in two steps.
//!
//! 1. **Link** (the reference). seccompiler gives a filter one match action,
//!    so the groups' programs are chained: a seccompiler program whose
//!    syscall number matches no rule falls through to its final
//!    `RET allow` with the number still in the accumulator, and replacing
//!    that `RET` with the next group's chains answers exactly as running
//!    the groups one after another would. This is sound because every
//!    group is a default-allow deny-list over disjoint syscalls (checked).
//!
//! 2. **Dispatch by binary search** (what ships). The linked program tests
//!    syscall numbers one after another, and the kernel pays for that at
//!    install time: it pre-computes an allow-cache by running the filter
//!    for every syscall number, so the cost is (syscalls x path length);
//!    about 210 µs for the linked program on the dev machine. The shipped
//!    program keeps seccompiler's code for each rule and only replaces the
//!    linear number tests with a binary search, which cut install to about
//!    45 µs there. Before it is written, the build runs both programs in
//!    an interpreter for every syscall number, x32 number and argument
//!    value the policy mentions, and fails if they ever answer differently.
//!
//! The shipped program, top to bottom:
//!
//! ```text
//! arch check (seccompiler's)     a foreign ABI (i386 via int 0x80) -> kill
//! load nr
//! nr >= HORIZON -> ENOSYS        x32 (nr | 0x40000000) and syscalls newer
//!                                 than this policy was reviewed against
//! binary search on nr            -> shared `RET errno` for whole-syscall
//!                                    rules, or seccompiler's argument checks
//! allow
//! ```
//!
//! The layout of seccompiler's output is checked instruction by instruction;
//! a seccompiler upgrade that changes it fails the build here.
//!
//! Outputs, in `OUT_DIR`:
//! - `seccomp_sandbox.rs`: the program as a `static [libc::sock_filter; N]`
//!   plus the denial table, included by `src/seccomp.rs`;
//! - `seccomp_sandbox.bpf`: the same program as raw `struct sock_filter`s
//!   (8 bytes each, little endian) for disassemblers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::{env, fs};

use seccompiler::{sock_filter, BpfProgram, SeccompAction, TargetArch};
use serde_json::{json, Map, Value};

/// Relative to this crate's manifest.
const POLICY: &str = "../../resources/seccomp/sandbox.json";

/// The newest syscall this policy was reviewed against. Every syscall number
/// above it answers ENOSYS, as on a kernel that predates it, so a syscall
/// added to Linux later cannot slip past a deny-list that has never heard
/// of it (runc's "patchbpf" does the same). It is also the last name
/// seccompiler 0.5 knows. Review the syscalls after it before moving it.
const REVIEWED_THROUGH: &str = "mseal";

/// Architectures seccompiler has syscall tables for. A policy name that
/// exists on none of them is a typo and fails the build; one that exists on
/// some but not the target cannot be called there and is left out.
const ARCHES: [&str; 3] = ["x86_64", "aarch64", "riscv64"];

const ENOSYS: u32 = 38;
/// x32 syscalls are x86_64 numbers with this bit set, under the same
/// AUDIT_ARCH_X86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Syscall numbers a leaf of the binary search tests one by one (4 gave
/// the shortest program and the cheapest install of 2 to 6).
const LEAF_SPAN: usize = 4;

// Classic BPF opcodes (linux/bpf_common.h) the build emits or interprets.
const LD_W_ABS: u16 = 0x20;
const ALU_AND_K: u16 = 0x54;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGT_K: u16 = 0x25;
const JMP_JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;
/// The arch a 64-bit x86 process reports for an `int 0x80` syscall.
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
/// The kernel refuses longer programs (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;

fn main() {
    if let Err(e) = run() {
        panic!("seccomp policy {POLICY}: {e}");
    }
}

/// One syscall the policy refuses, as emitted into `DENIALS`.
struct Denial {
    group: String,
    nr: u32,
    errno: u32,
    conditional: bool,
    reasons: Vec<String>,
}

fn run() -> Result<(), String> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let path = manifest.join(POLICY);
    println!("cargo:rerun-if-changed={}", path.display());
    println!("cargo:rerun-if-changed=build.rs");

    // seccompiler only targets little-endian arches (and only builds on
    // little-endian hosts); the raw .bpf output is written that way.
    let arch_name = env::var("CARGO_CFG_TARGET_ARCH").map_err(|e| e.to_string())?;
    if env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() != Ok("little") {
        return Err("only little-endian targets are supported".into());
    }
    let arch = TargetArch::try_from(arch_name.as_str())
        .map_err(|_| format!("target arch {arch_name} has no seccompiler syscall table"))?;

    let text = fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let policy: Value = serde_json::from_str(&text).map_err(|e| format!("parse: {e}"))?;
    let horizon = syscall_nr(REVIEWED_THROUGH, arch)
        .ok_or_else(|| format!("{REVIEWED_THROUGH} is unknown on {arch_name}"))?
        + 1;
    let Resolved { groups, denials } = resolve(&policy, arch, horizon)?;

    let compiled =
        seccompiler::compile_from_json(Value::Object(groups.clone()).to_string().as_bytes(), arch)
            .map_err(|e| format!("seccompiler: {e}"))?;
    // Group order does not change the answers (the groups are disjoint) nor
    // the shipped program (the search sorts by number).
    let programs: Vec<(&str, &BpfProgram)> =
        groups.keys().map(|g| (g.as_str(), &compiled[g])).collect();

    let linked = link(&programs, horizon)?;
    validate(&linked)?;
    let program = bisect(&programs, horizon)?;
    validate(&program)?;
    check_equivalent(&linked, &program, horizon)?;

    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let mut raw = Vec::with_capacity(program.len() * 8);
    for i in &program {
        raw.extend_from_slice(&i.code.to_le_bytes());
        raw.push(i.jt);
        raw.push(i.jf);
        raw.extend_from_slice(&i.k.to_le_bytes());
    }
    fs::write(out.join("seccomp_sandbox.bpf"), raw).map_err(|e| e.to_string())?;
    let source = render(&arch_name, horizon, &program, &denials);
    fs::write(out.join("seccomp_sandbox.rs"), source).map_err(|e| e.to_string())?;
    Ok(())
}

/// The policy for one arch.
struct Resolved {
    /// The policy's groups without the rules for syscalls the arch lacks.
    groups: Map<String, Value>,
    /// The denial table, by syscall name.
    denials: BTreeMap<String, Denial>,
}

/// Checks the policy's shape and resolves its names for `arch`.
fn resolve(policy: &Value, arch: TargetArch, horizon: u32) -> Result<Resolved, String> {
    let groups = policy
        .as_object()
        .ok_or("the top level must be an object of filters")?;
    let mut kept_groups = Map::new();
    let mut denials: BTreeMap<String, Denial> = BTreeMap::new();
    for (group, filter) in groups {
        let errno = group_errno(group, filter)?;
        let rules = filter["filter"]
            .as_array()
            .ok_or_else(|| format!("{group}: `filter` must be a list"))?;
        let mut kept = Vec::new();
        for rule in rules {
            let name = rule["syscall"]
                .as_str()
                .ok_or_else(|| format!("{group}: a rule without `syscall`"))?;
            let reason = rule["comment"]
                .as_str()
                .filter(|c| !c.trim().is_empty())
                .ok_or_else(|| {
                    format!("{group}/{name}: every rule needs a `comment` saying why")
                })?;
            let Some(nr) = syscall_nr(name, arch) else {
                let elsewhere = ARCHES.iter().any(|a| {
                    TargetArch::try_from(*a)
                        .ok()
                        .and_then(|a| syscall_nr(name, a))
                        .is_some()
                });
                if elsewhere {
                    continue;
                }
                return Err(format!("{group}: unknown syscall {name}"));
            };
            if nr >= horizon {
                return Err(format!(
                    "{name} ({nr}) is newer than REVIEWED_THROUGH ({REVIEWED_THROUGH}); \
                     review the syscalls in between and move it in build.rs"
                ));
            }
            let conditional = rule.get("args").is_some();
            match denials.get_mut(name) {
                // A later group naming the same syscall would never be
                // reached for it: the first group's chain answers `allow`
                // when its arguments do not match.
                Some(d) if d.group != *group => {
                    return Err(format!("{name} is in more than one group"))
                }
                Some(d) if d.conditional != conditional => {
                    return Err(format!(
                        "{name}: mixes a whole-syscall rule with argument rules"
                    ))
                }
                Some(d) => d.reasons.push(reason.to_owned()),
                None => {
                    let reasons = vec![reason.to_owned()];
                    let d = Denial {
                        group: group.clone(),
                        nr,
                        errno,
                        conditional,
                        reasons,
                    };
                    denials.insert(name.to_owned(), d);
                }
            }
            kept.push(rule.clone());
        }
        if !kept.is_empty() {
            let mut f = filter.clone();
            f["filter"] = Value::Array(kept);
            kept_groups.insert(group.clone(), f);
        }
    }
    if kept_groups.is_empty() {
        return Err("the policy has no rules".into());
    }
    Ok(Resolved {
        groups: kept_groups,
        denials,
    })
}

/// A group must be default-allow with an errno match action; returns the errno.
fn group_errno(group: &str, filter: &Value) -> Result<u32, String> {
    let default = filter
        .get("default_action")
        .or_else(|| filter.get("mismatch_action"));
    if default != Some(&json!("allow")) {
        return Err(format!(
            "{group}: `default_action` must be \"allow\" (the policy is a deny-list)"
        ));
    }
    let action = filter
        .get("filter_action")
        .or_else(|| filter.get("match_action"));
    action
        .and_then(|a| a.get("errno"))
        .and_then(Value::as_u64)
        .and_then(|e| u32::try_from(e).ok())
        .filter(|e| (1..4096).contains(e))
        .ok_or_else(|| format!("{group}: `filter_action` must be {{\"errno\": N}}"))
}

/// The number of `name` on `arch`, read back from a one-rule program
/// compiled by seccompiler itself (its syscall table is not public).
fn syscall_nr(name: &str, arch: TargetArch) -> Option<u32> {
    let probe = json!({ "p": {
        "default_action": "allow", "filter_action": "trap", "filter": [{ "syscall": name }]
    }});
    let map = seccompiler::compile_from_json(probe.to_string().as_bytes(), arch).ok()?;
    // arch check (3), load nr (1), then the chain's `jeq nr`.
    let jeq = map.get("p")?.get(4)?;
    (jeq.code == JMP_JEQ_K).then_some(jeq.k)
}

/// seccompiler's prologue and epilogue around a group's chains, checked.
/// Returns the arch check (3 instructions) and the chains.
fn split(
    group: &str,
    prog: &[sock_filter],
) -> Result<(Vec<sock_filter>, Vec<sock_filter>), String> {
    let allow: u32 = SeccompAction::Allow.into();
    let n = prog.len();
    let ok = n >= 6
        && is(&prog[0], LD_W_ABS, DATA_ARCH)
        && (prog[1].code, prog[1].jt, prog[1].jf) == (JMP_JEQ_K, 1, 0)
        && prog[2].code == RET_K
        && is(&prog[3], LD_W_ABS, DATA_NR)
        && is(&prog[n - 1], RET_K, allow);
    if !ok {
        return Err(format!(
            "{group}: unexpected seccompiler layout; re-check build.rs"
        ));
    }
    let chains = prog[4..n - 1].to_vec();
    // Every jump must land inside the chains or on the final `allow`
    // (index chains.len()), which is where a non-matching number goes.
    for (at, i) in chains.iter().enumerate() {
        if jump_targets(at, i).into_iter().any(|t| t > chains.len()) {
            return Err(format!("{group}: a jump leaves its chains at {at}"));
        }
    }
    Ok((prog[..3].to_vec(), chains))
}

/// The common head of every program built here: arch check, load the
/// syscall number, refuse everything at or above the horizon.
fn prologue(arch_check: &[sock_filter], horizon: u32) -> Vec<sock_filter> {
    let mut out = arch_check.to_vec();
    out.push(stmt(LD_W_ABS, DATA_NR));
    out.push(jump(JMP_JGE_K, horizon, 0, 1));
    out.push(stmt(RET_K, SeccompAction::Errno(ENOSYS).into()));
    out
}

/// Step 1 of the module docs: the groups' chains one after another.
fn link(programs: &[(&str, &BpfProgram)], horizon: u32) -> Result<Vec<sock_filter>, String> {
    let mut out = Vec::new();
    for (group, prog) in programs {
        let (arch_check, chains) = split(group, prog)?;
        if out.is_empty() {
            out = prologue(&arch_check, horizon);
        } else if out[..3] != arch_check[..] {
            return Err(format!("{group}: a different arch check"));
        }
        out.extend(chains);
    }
    out.push(stmt(RET_K, SeccompAction::Allow.into()));
    Ok(out)
}

/// What a syscall number leads to once the search has found it.
enum Leaf {
    /// A whole-syscall rule: this action, whatever the arguments.
    Ret(u32),
    /// seccompiler's argument checks for the syscall, entered with its
    /// number already matched; each path ends in a `RET`.
    Checks(Vec<sock_filter>),
}

/// Cuts a group's chains into one leaf per syscall number.
fn leaves(group: &str, chains: &[sock_filter]) -> Result<Vec<(u32, Leaf)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < chains.len() {
        let head = &chains[at];
        if (head.code, head.jt, head.jf) != (JMP_JEQ_K, 0, 1) {
            return Err(format!("{group}: expected a syscall test at {at}"));
        }
        // seccompiler's path for a different number: `jf` to the first
        // rule's second instruction, then `ja` hops to the next chain.
        let mut next = at + 2;
        while next < chains.len() && chains[next].code == JMP_JA {
            next += 1 + chains[next].k as usize;
        }
        if next > chains.len() || (next < chains.len() && chains[next].code != JMP_JEQ_K) {
            return Err(format!(
                "{group}: the chain at {at} does not end at the next one"
            ));
        }
        let body = &chains[at + 1..next];
        let leaf = match body {
            [a, b, ret, _]
                if *a == stmt(JMP_JA, 1) && *b == stmt(JMP_JA, 2) && ret.code == RET_K =>
            {
                Leaf::Ret(ret.k)
            }
            _ => Leaf::Checks(body.to_vec()),
        };
        out.push((head.k, leaf));
        at = next;
    }
    Ok(out)
}

/// Jump targets of the assembler in [`bisect`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Label {
    Node(usize),
    Ret(u32),
    Checks(u32),
}

enum Asm {
    Insn(sock_filter),
    /// `jeq k` / `jge k`: to the label if true, else fall through.
    JumpIf(u16, u32, Label),
    Here(Label),
}

/// Step 2 of the module docs: the same leaves behind a binary search.
fn bisect(programs: &[(&str, &BpfProgram)], horizon: u32) -> Result<Vec<sock_filter>, String> {
    let allow: u32 = SeccompAction::Allow.into();
    let mut arch_check = Vec::new();
    let mut all = Vec::new();
    for (group, prog) in programs {
        let (check, chains) = split(group, prog)?;
        arch_check = check;
        all.extend(leaves(group, &chains)?);
    }
    all.sort_by_key(|(nr, _)| *nr);
    if all.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err("a syscall has chains in two groups".into());
    }

    fn search(items: &[(u32, Leaf)], asm: &mut Vec<Asm>, nodes: &mut usize, allow: u32) {
        if items.len() <= LEAF_SPAN {
            for (nr, leaf) in items {
                let to = match leaf {
                    Leaf::Ret(k) => Label::Ret(*k),
                    Leaf::Checks(_) => Label::Checks(*nr),
                };
                asm.push(Asm::JumpIf(JMP_JEQ_K, *nr, to));
            }
            asm.push(Asm::Insn(stmt(RET_K, allow)));
            return;
        }
        let mid = items.len() / 2;
        *nodes += 1;
        let upper = Label::Node(*nodes);
        asm.push(Asm::JumpIf(JMP_JGE_K, items[mid].0, upper));
        search(&items[..mid], asm, nodes, allow);
        asm.push(Asm::Here(upper));
        search(&items[mid..], asm, nodes, allow);
    }
    let mut asm = Vec::new();
    search(&all, &mut asm, &mut 0, allow);
    let rets: BTreeSet<u32> = all
        .iter()
        .filter_map(|(_, l)| match l {
            Leaf::Ret(k) => Some(*k),
            Leaf::Checks(_) => None,
        })
        .collect();
    for k in rets {
        asm.push(Asm::Here(Label::Ret(k)));
        asm.push(Asm::Insn(stmt(RET_K, k)));
    }
    for (nr, leaf) in &all {
        if let Leaf::Checks(body) = leaf {
            asm.push(Asm::Here(Label::Checks(*nr)));
            asm.extend(body.iter().cloned().map(Asm::Insn));
        }
    }
    // The checks keep seccompiler's hops to "the next chain", unreachable
    // here (the number already matched) but still jumps the kernel checks:
    // give the last one somewhere to land.
    asm.push(Asm::Insn(stmt(RET_K, allow)));

    let mut out = prologue(&arch_check, horizon);
    let mut at = BTreeMap::new();
    let mut pc = out.len();
    for a in &asm {
        match a {
            Asm::Here(l) => {
                at.insert(*l, pc);
            }
            _ => pc += 1,
        }
    }
    for a in asm {
        match a {
            Asm::Here(_) => {}
            Asm::Insn(i) => out.push(i),
            Asm::JumpIf(code, k, to) => {
                let offset = at[&to] - out.len() - 1;
                let jt = u8::try_from(offset).map_err(|_| {
                    format!("the search jumps {offset} instructions to {to:?}; add trampolines")
                })?;
                out.push(jump(code, k, jt, 0));
            }
        }
    }
    Ok(out)
}

/// Runs both programs on every syscall number below the horizon and a
/// margin above it, the same numbers as x32 calls and from a foreign arch,
/// each with arguments built from every constant either program compares
/// against (and its neighbours). Any difference fails the build.
fn check_equivalent(
    reference: &[sock_filter],
    shipped: &[sock_filter],
    horizon: u32,
) -> Result<(), String> {
    let arch = reference[1].k;
    let mut values: BTreeSet<u32> = [0, 1, u32::MAX].into();
    for i in reference.iter().chain(shipped) {
        values.extend([i.k.wrapping_sub(1), i.k, i.k.wrapping_add(1)]);
    }
    let mut arg_sets: Vec<[u64; 6]> = Vec::new();
    for v in values {
        arg_sets.push([u64::from(v); 6]);
        arg_sets.push([u64::from(v) | 1 << 32; 6]);
    }
    let numbers = (0..horizon + 64)
        .chain((0..horizon + 64).map(|n| n | X32_SYSCALL_BIT))
        .chain([u32::MAX]);
    for nr in numbers {
        for arch in [arch, AUDIT_ARCH_I386] {
            for a in &arg_sets {
                let (want, want_args) = interpret(reference, nr, arch, a)?;
                let (got, got_args) = interpret(shipped, nr, arch, a)?;
                if want != got {
                    return Err(format!(
                        "binary search answers {got:#x} for syscall {nr:#x} args {a:x?}, \
                         the linked program {want:#x}"
                    ));
                }
                // Neither looked at an argument: every branch depended on
                // the number and arch alone, so other arguments take the
                // same paths.
                if !want_args && !got_args {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// A classic-BPF interpreter for the instructions seccompiler emits, over
/// a little-endian `struct seccomp_data`. Returns the program's answer and
/// whether it loaded any syscall argument on the way.
fn interpret(
    prog: &[sock_filter],
    nr: u32,
    arch: u32,
    args: &[u64; 6],
) -> Result<(u32, bool), String> {
    let mut words = [0u32; 16];
    words[0] = nr;
    words[1] = arch;
    for (i, a) in args.iter().enumerate() {
        words[4 + 2 * i] = *a as u32;
        words[5 + 2 * i] = (*a >> 32) as u32;
    }
    let (mut acc, mut pc, mut read_args) = (0u32, 0usize, false);
    loop {
        let i = prog.get(pc).ok_or("ran off the end")?;
        let cond = |c: bool| pc + 1 + usize::from(if c { i.jt } else { i.jf });
        pc = match i.code {
            LD_W_ABS => {
                acc = *words
                    .get(i.k as usize / 4)
                    .ok_or("load out of seccomp_data")?;
                read_args |= i.k >= DATA_ARGS;
                pc + 1
            }
            ALU_AND_K => {
                acc &= i.k;
                pc + 1
            }
            JMP_JA => pc + 1 + i.k as usize,
            JMP_JEQ_K => cond(acc == i.k),
            JMP_JGT_K => cond(acc > i.k),
            JMP_JGE_K => cond(acc >= i.k),
            RET_K => return Ok((i.k, read_args)),
            code => return Err(format!("opcode {code:#x} at {pc} is not interpreted here")),
        };
    }
}

/// Program-level sanity, as the kernel checks it: length, every jump in
/// bounds, ends in a return.
fn validate(program: &[sock_filter]) -> Result<(), String> {
    if program.len() >= MAX_INSNS {
        return Err(format!(
            "{} instructions exceed the kernel's limit",
            program.len()
        ));
    }
    for (at, i) in program.iter().enumerate() {
        if jump_targets(at, i).into_iter().any(|t| t >= program.len()) {
            return Err(format!("jump out of the program at {at}"));
        }
    }
    match program.last() {
        Some(i) if i.code == RET_K => Ok(()),
        _ => Err("the program does not end in a return".into()),
    }
}

/// Absolute targets of a jump at `at`; none for other instructions.
fn jump_targets(at: usize, i: &sock_filter) -> Vec<usize> {
    let next = at + 1;
    match i.code {
        JMP_JA => vec![next + i.k as usize],
        JMP_JEQ_K | JMP_JGT_K | JMP_JGE_K => {
            vec![next + usize::from(i.jt), next + usize::from(i.jf)]
        }
        _ => vec![],
    }
}

fn is(i: &sock_filter, code: u16, k: u32) -> bool {
    i.code == code && i.k == k
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn render(
    arch: &str,
    horizon: u32,
    program: &[sock_filter],
    denials: &BTreeMap<String, Denial>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// @generated by crates/jail/build.rs from resources/seccomp/sandbox.json \
         for {arch}. Do not edit."
    );
    let _ = writeln!(s, "pub(super) const TARGET_ARCH: &str = {arch:?};");
    let _ = writeln!(s, "pub(super) const SYSCALL_HORIZON: u32 = {horizon};");
    let _ = writeln!(
        s,
        "pub(super) static PROGRAM: [libc::sock_filter; {}] = [",
        program.len()
    );
    for i in program {
        let _ = writeln!(
            s,
            "    libc::sock_filter {{ code: {:#06x}, jt: {}, jf: {}, k: {:#010x} }},",
            i.code, i.jt, i.jf, i.k
        );
    }
    let _ = writeln!(s, "];");
    let _ = writeln!(s, "pub(super) const DENIALS: &[super::Denial] = &[");
    for (name, d) in denials {
        let _ = writeln!(
            s,
            "    super::Denial {{ syscall: {name:?}, nr: {}, errno: {}, conditional: {}, reason: {:?} }},",
            d.nr,
            d.errno,
            d.conditional,
            d.reasons.join(" | ")
        );
    }
    let _ = writeln!(s, "];");
    let _ = writeln!(s, "pub(super) const DENIED: &[&str] = &[");
    for name in denials.keys() {
        let _ = writeln!(s, "    {name:?},");
    }
    let _ = writeln!(s, "];");
    s
}
