//! The one place where errors meet the user: a one-line message on stderr
//! and an exit code.

/// Print `err` (with its chain, once) and return the exit code for it.
pub fn report(err: &anyhow::Error) -> i32 {
    eprintln!("brig: {err:#}");
    1
}
