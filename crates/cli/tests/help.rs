//! The CLI's help, its manual and the README agree: every `brig SUBCOMMAND`
//! the README or docs/server.md shows exists, every subcommand is shown
//! there, and `brig man` writes a page for each (from the same definitions
//! as `--help`, so those cannot drift).

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use support::BRIG;

/// The subcommands `brig --help` lists.
fn subcommands() -> BTreeSet<String> {
    let out = Command::new(BRIG).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let list = help
        .split("Commands:")
        .nth(1)
        .expect("a Commands: section")
        .split("Options:")
        .next()
        .unwrap();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// The code in a Markdown doc: fenced blocks and `inline` spans.
fn code_of(doc: &str) -> Vec<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(doc),
    )
    .unwrap();
    let mut code = Vec::new();
    for (i, part) in text.split("```").enumerate() {
        if i % 2 == 1 {
            code.push(part.to_string());
        } else {
            code.extend(part.split('`').skip(1).step_by(2).map(str::to_string));
        }
    }
    code
}

/// Every subcommand a doc's code runs: the word after `brig` where `brig`
/// starts a command (line start, after `sudo`, `$`, `;`, `|`, `(`, `&&`).
fn mentioned(doc: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for code in code_of(doc) {
        for (at, _) in code.match_indices("brig ") {
            let before = code[..at].trim_end();
            let starts = before.is_empty()
                || before.ends_with('\n')
                || ["sudo", "$", ";", "|", "(", "&&", "xargs"]
                    .iter()
                    .any(|p| before.ends_with(p));
            let line_start = code[..at]
                .rsplit('\n')
                .next()
                .unwrap_or("")
                .trim()
                .is_empty();
            if !(starts || line_start) {
                continue;
            }
            let word: String = code[at + 5..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            if word.len() > 1 && !word.starts_with('-') {
                words.insert(word);
            }
        }
    }
    words
}

#[test]
fn the_readme_and_the_cli_name_the_same_subcommands() {
    let real = subcommands();
    assert!(real.contains("logs") && real.contains("man"), "{real:?}");
    let mut shown = mentioned("README.md");
    shown.extend(mentioned("docs/server.md"));
    let unknown: Vec<_> = shown.iter().filter(|w| !real.contains(*w)).collect();
    assert!(
        unknown.is_empty(),
        "the docs show `brig {unknown:?}`, which `brig --help` does not list ({real:?})"
    );
    let undocumented: Vec<_> = real.iter().filter(|c| !shown.contains(*c)).collect();
    assert!(
        undocumented.is_empty(),
        "README.md and docs/server.md never show `brig {undocumented:?}`"
    );
}

#[test]
fn brig_man_writes_a_page_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BRIG)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for sub in subcommands() {
        let page = dir.path().join(format!("brig-{sub}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(
            text.contains(".TH") && text.contains(&format!("brig-{sub}")),
            "{sub}"
        );
    }
    // The top page names every subcommand and the global options.
    let out = Command::new(BRIG).arg("man").output().unwrap();
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.starts_with(".ie") && page.contains("BRIG_HOME") && page.contains("brig\\-logs"));
}

/// A client command whose reader goes away (`brig completion bash | head`)
/// ends by SIGPIPE, quietly, as other tools do: no panic on stderr.
#[test]
fn output_cut_short_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_brig"))
        .args(["completion", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its script is larger than a pipe holds: it blocks, then gets EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
