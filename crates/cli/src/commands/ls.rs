//! `brig ls`: the sandboxes this key's tenant has on the daemon, as `docker
//! ps` shows containers: the live ones by default (`-a`: ended ones too),
//! `-q` for ids only, `--filter` by label, state or template.

use serde_json::Value;

use super::client::{now_millis, span, Client};

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Ended sandboxes too (stopped, dead), not only live ones.
    #[arg(short, long)]
    all: bool,
    /// Only the ids, one per line.
    #[arg(short, long)]
    quiet: bool,
    /// Keep those matching, e.g. `label=team=ml`, `label=team`,
    /// `state=paused`, `template=base` (repeatable: all must match).
    #[arg(long = "filter", short = 'f', value_name = "KEY=VALUE")]
    filters: Vec<String>,
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// One `--filter`.
#[derive(Debug, PartialEq)]
enum Filter {
    Label(String, Option<String>),
    State(String),
    Template(String),
}

impl Filter {
    fn parse(text: &str) -> anyhow::Result<Filter> {
        let bad = || {
            anyhow::anyhow!(
                "invalid --filter {text:?}: use label=KEY[=VALUE], state=STATE or template=NAME"
            )
        };
        let (key, value) = text.split_once('=').ok_or_else(bad)?;
        Ok(match key {
            "label" => match value.split_once('=') {
                Some((k, v)) => Filter::Label(k.to_string(), Some(v.to_string())),
                None => Filter::Label(value.to_string(), None),
            },
            "state" => Filter::State(value.to_string()),
            "template" => Filter::Template(value.to_string()),
            _ => return Err(bad()),
        })
    }

    fn matches(&self, s: &Value) -> bool {
        match self {
            Filter::Label(k, v) => match (&s["labels"][k], v) {
                (Value::String(have), Some(want)) => have == want,
                (Value::String(_), None) => true,
                _ => false,
            },
            Filter::State(state) => s["state"] == state.as_str(),
            Filter::Template(t) => template_name(s["template"].as_str().unwrap_or("")) == t,
        }
    }
}

/// A template as people name it: `base` for a named template's build
/// directory (`…/templates/base/rootfs-3`), else as recorded.
pub fn template_name(recorded: &str) -> &str {
    let path = recorded.strip_prefix("dir:").unwrap_or(recorded);
    let mut parts = path.rsplit('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(build), Some(name), Some("templates")) if build.starts_with("rootfs") => name,
        _ => recorded,
    }
}

fn live(state: &str) -> bool {
    matches!(state, "running" | "paused" | "creating")
}

pub fn run(args: LsArgs) -> anyhow::Result<i32> {
    let filters = args
        .filters
        .iter()
        .map(|f| Filter::parse(f))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let client = Client::from_env()?;
    let mut all = client.sandboxes()?;
    let asked_for_state = filters.iter().any(|f| matches!(f, Filter::State(_)));
    all.retain(|s| {
        (args.all || asked_for_state || live(s["state"].as_str().unwrap_or("")))
            && filters.iter().all(|f| f.matches(s))
    });
    if args.json {
        println!("{}", Value::Array(all));
        return Ok(0);
    }
    if args.quiet {
        for s in &all {
            println!("{}", s["id"].as_str().unwrap_or("?"));
        }
        return Ok(0);
    }
    println!(
        "{:<12}  {:<8}  {:<20}  {:<10}  LABELS",
        "ID", "STATE", "TEMPLATE", "EXPIRES"
    );
    let now = now_millis();
    for s in &all {
        let state = s["state"].as_str().unwrap_or("?");
        let expires = match s["expires_at"].as_i64() {
            Some(at) if live(state) => format!("in {}", span(at - now)),
            _ => "-".to_string(),
        };
        let labels = s["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        println!(
            "{:<12}  {:<8}  {:<20}  {:<10}  {labels}",
            s["id"].as_str().unwrap_or("?"),
            state,
            template_name(s["template"].as_str().unwrap_or("?")),
            expires,
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_parse_and_match() {
        let s = json!({"state": "paused", "labels": {"team": "ml"},
                       "template": "dir:/var/lib/brig/templates/base/rootfs-3"});
        let f = |t: &str| Filter::parse(t).unwrap().matches(&s);
        assert!(f("label=team=ml") && f("label=team") && f("state=paused") && f("template=base"));
        assert!(!f("label=team=web") && !f("label=owner") && !f("state=running"));
        assert!(Filter::parse("colour=red").is_err() && Filter::parse("label").is_err());
    }

    #[test]
    fn templates_read_as_their_names() {
        assert_eq!(
            template_name("dir:/var/lib/brig/templates/base/rootfs-3"),
            "base"
        );
        assert_eq!(template_name("host"), "host");
        assert_eq!(template_name("dir:/srv/my-root"), "dir:/srv/my-root");
    }
}
