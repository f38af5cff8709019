//! `brig top ID`: the processes in a sandbox, as `docker top` lists a
//! container's. Read from the sandbox's /proc by a small shell script (any
//! template has `sh`; not every one has `ps`).

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
}

/// PID, user id, state and command line of every process, from /proc.
const SCRIPT: &str = r#"printf '%-7s %-6s %-5s %s\n' PID UID STATE COMMAND
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ -r "$d/status" ] || continue
  # Not this listing itself (the shell and what it runs meanwhile).
  pp=$(sed -n 's/^PPid:[[:space:]]*//p' "$d/status")
  [ "$p" = "$$" ] || [ "$pp" = "$$" ] && continue
  uid=$(sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' "$d/status")
  st=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "$d/status")
  cmd=$(tr '\000' ' ' < "$d/cmdline" 2>/dev/null); cmd=${cmd% }
  [ -n "$cmd" ] || cmd="[$(sed -n 's/^Name:[[:space:]]*//p' "$d/status")]"
  printf '%-7s %-6s %-5s %s\n' "$p" "$uid" "$st" "$cmd"
done"#;

pub fn run(args: TopArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    let body = serde_json::json!({ "argv": ["sh", "-c", SCRIPT] });
    let resp = client.send(
        client.request("POST", &format!("/v1/sandboxes/{id}/exec")),
        Some(&body),
    )?;
    use base64::Engine;
    use std::io::BufRead;
    let mut code = 0;
    for line in std::io::BufReader::new(resp.into_reader()).lines() {
        let event: serde_json::Value = serde_json::from_str(&line?)?;
        match event["type"].as_str() {
            Some("stdout") => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(event["data"].as_str().unwrap_or_default())?;
                print!("{}", String::from_utf8_lossy(&bytes));
            }
            Some("exited") => code = event["code"].as_i64().unwrap_or(1) as i32,
            Some("error") => anyhow::bail!("{}", event["message"].as_str().unwrap_or("failed")),
            _ => {}
        }
    }
    if code != 0 {
        anyhow::bail!("listing the processes failed (status {code})");
    }
    Ok(0)
}
