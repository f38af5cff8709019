//! Where brig keeps its state: `$BRIG_HOME`, else `/var/lib/brig` for root
//! and `$XDG_DATA_HOME/brig` (or `~/.local/share/brig`) for anyone else.

use std::path::PathBuf;

use anyhow::Context;

pub fn dir() -> anyhow::Result<PathBuf> {
    let dir = if let Some(h) = std::env::var_os("BRIG_HOME").filter(|h| !h.is_empty()) {
        PathBuf::from(h)
    } else if crate::exit::is_root() {
        PathBuf::from("/var/lib/brig")
    } else if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|h| !h.is_empty()) {
        PathBuf::from(x).join("brig")
    } else {
        let home = std::env::var_os("HOME").context("neither BRIG_HOME nor HOME is set; set BRIG_HOME to a directory for brig's state")?;
        PathBuf::from(home).join(".local/share/brig")
    };
    if !dir.is_absolute() {
        anyhow::bail!("BRIG_HOME must be an absolute path, not {}", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create brig's state directory {}", dir.display()))?;
    Ok(dir)
}
