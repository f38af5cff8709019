//! The in-sandbox code interpreter (resources/code-interpreter/server.py):
//! runs its Python test suite, test_server.py, which starts the server on a
//! free port and drives real ipykernel and bash_kernel kernels through the
//! E2B protocol (state, streaming, errors, rich results, env vars, contexts,
//! interrupt on disconnect, timeouts).
//!
//! Needs a python3 with Debian's python3-ipykernel, python3-jupyter-client,
//! python3-matplotlib, python3-pexpect and python3-filetype
//! (tests/support/install-deps.sh); bash_kernel is pip-installed by the suite
//! into the test cache. Skips with a printed reason when they are missing, and
//! fails instead under BRIG_TEST_STRICT=1.

use std::path::Path;
use std::process::Command;

/// Modules the server and its kernels import.
const NEEDED: &str = "import ipykernel, jupyter_client, zmq, matplotlib, pexpect, filetype";

/// The first python3 that has the kernel packages: Debian's own first, since
/// a pyenv or venv python3 earlier on PATH does not see Debian's packages.
fn python_with_kernels() -> Result<&'static str, String> {
    let mut tried = Vec::new();
    for candidate in ["/usr/bin/python3", "python3"] {
        match Command::new(candidate).args(["-c", NEEDED]).output() {
            Ok(out) if out.status.success() => return Ok(candidate),
            Ok(out) => tried.push(format!(
                "{candidate}: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Err(e) => tried.push(format!("{candidate}: {e}")),
        }
    }
    Err(tried.join("; "))
}

#[test]
fn code_interpreter_server_suite() {
    let python = match python_with_kernels() {
        Ok(p) => p,
        Err(why) => {
            let msg = format!(
                "no python3 with the Jupyter kernel packages ({why}); \
                 run tests/support/install-deps.sh"
            );
            brig_test_support::skip(&msg);
            return;
        }
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("resources/code-interpreter");
    let out = Command::new(python)
        .args(["-m", "unittest", "-v", "test_server"])
        .current_dir(&dir)
        // No __pycache__ in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3 -m unittest");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "test_server.py failed ({})",
        out.status
    );
    // unittest prints "Ran N tests"; make sure the suite did run, not skip.
    assert!(
        stderr.contains("Ran ") && !stderr.contains("Ran 0 tests"),
        "the Python suite ran no tests"
    );
}
