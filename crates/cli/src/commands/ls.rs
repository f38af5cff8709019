//! `brig ls`: the sandboxes this key's tenant has on the daemon, as `docker
//! ps` shows containers: the live ones by default (`-a`: ended ones too),
//! `-q` for ids only, `--filter` by label, state, template or name,
//! `--format` to print chosen fields (`{{.ID}} {{.Name}}`, or `json`).

use serde_json::Value;

use super::client::{ago, now_millis, span, Client};

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
    /// Print each sandbox through a template: `{{.ID}}`, `{{.Name}}`,
    /// `{{.State}}`, `{{.Template}}`, `{{.Isolation}}`, `{{.Expires}}`,
    /// `{{.Created}}`, `{{.Labels}}`, `{{.Label "KEY"}}`; `\t` is a tab.
    /// `json`: one JSON object per line.
    #[arg(long, value_name = "TEMPLATE", conflicts_with_all = ["json", "quiet"])]
    format: Option<String>,
}

/// One `--filter`.
#[derive(Debug, PartialEq)]
enum Filter {
    Label(String, Option<String>),
    State(String),
    Template(String),
    Name(String),
}

impl Filter {
    fn parse(text: &str) -> anyhow::Result<Filter> {
        let bad = || {
            anyhow::anyhow!(
                "invalid --filter {text:?}: use label=KEY[=VALUE], state=STATE, template=NAME or \
                 name=NAME"
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
            "name" => Filter::Name(value.to_string()),
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
            Filter::Name(n) => s["name"] == n.as_str(),
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
    let now = now_millis();
    match args.format.as_deref() {
        Some("json") => {
            for s in &all {
                println!("{s}");
            }
        }
        Some(template) => {
            let template = Format::parse(template)?;
            for s in &all {
                println!("{}", template.render(s, now));
            }
        }
        None => {
            println!(
                "{:<12}  {:<16}  {:<8}  {:<20}  {:<10}  LABELS",
                "ID", "NAME", "STATE", "TEMPLATE", "EXPIRES"
            );
            for s in &all {
                println!(
                    "{:<12}  {:<16}  {:<8}  {:<20}  {:<10}  {}",
                    field(s, "ID", now),
                    field(s, "Name", now),
                    field(s, "State", now),
                    field(s, "Template", now),
                    field(s, "Expires", now),
                    field(s, "Labels", now),
                );
            }
        }
    }
    Ok(0)
}

/// The fields `--format` knows, as the table shows them.
const FIELDS: [&str; 8] = [
    "ID",
    "Name",
    "State",
    "Template",
    "Isolation",
    "Expires",
    "Created",
    "Labels",
];

fn field(s: &Value, name: &str, now: i64) -> String {
    let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
    let state = s["state"].as_str().unwrap_or("?");
    match name {
        "ID" => text("id"),
        "Name" => text("name"),
        "State" => state.to_string(),
        "Template" => template_name(s["template"].as_str().unwrap_or("?")).to_string(),
        "Isolation" => text("isolation"),
        "Expires" => match s["expires_at"].as_i64() {
            Some(at) if live(state) => format!("in {}", span(at - now)),
            _ => "-".to_string(),
        },
        "Created" => s["created_at"].as_i64().map_or("-".into(), ago),
        "Labels" => s["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// A `--format` template, parsed once: text and `{{.Field}}` /
/// `{{.Label "KEY"}}` placeholders (the part of Go's templates docker users
/// write in `--format`).
#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Field(&'static str),
    Label(String),
}

#[derive(Debug)]
struct Format(Vec<Piece>);

impl Format {
    fn parse(template: &str) -> anyhow::Result<Format> {
        let template = template.replace("\\t", "\t").replace("\\n", "\n");
        let mut pieces = Vec::new();
        let mut rest = template.as_str();
        while let Some(open) = rest.find("{{") {
            pieces.push(Piece::Text(rest[..open].to_string()));
            let Some(close) = rest[open..].find("}}") else {
                anyhow::bail!("invalid --format: a {{{{ has no }}}} after it");
            };
            let inner = rest[open + 2..open + close].trim();
            pieces.push(Self::placeholder(inner)?);
            rest = &rest[open + close + 2..];
        }
        pieces.push(Piece::Text(rest.to_string()));
        Ok(Format(pieces))
    }

    fn placeholder(inner: &str) -> anyhow::Result<Piece> {
        if let Some(key) = inner.strip_prefix(".Label ") {
            let key = key.trim().trim_matches('"');
            return Ok(Piece::Label(key.to_string()));
        }
        let name = inner.strip_prefix('.').unwrap_or(inner);
        match FIELDS.iter().find(|f| f.eq_ignore_ascii_case(name)) {
            Some(f) => Ok(Piece::Field(f)),
            None => anyhow::bail!(
                "invalid --format: no field {inner:?}; use {}, or {{{{.Label \"KEY\"}}}}",
                FIELDS.map(|f| format!("{{{{.{f}}}}}")).join(", ")
            ),
        }
    }

    fn render(&self, s: &Value, now: i64) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::Field(f) => field(s, f, now),
                Piece::Label(k) => s["labels"][k].as_str().unwrap_or("").to_string(),
            })
            .collect()
    }
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
        assert!(!f("name=dev"));
        assert!(!f("label=team=web") && !f("label=owner") && !f("state=running"));
        assert!(Filter::parse("colour=red").is_err() && Filter::parse("label").is_err());
    }

    #[test]
    fn formats_render_fields_and_labels() {
        let s = json!({"id": "0123456789ab", "name": "dev", "state": "running",
                       "labels": {"team": "ml"}, "template": "host"});
        let f = |t: &str| Format::parse(t).unwrap().render(&s, 0);
        assert_eq!(f("{{.ID}}\\t{{.Name}}"), "0123456789ab\tdev");
        assert_eq!(
            f("{{ .state }}/{{.Label \"team\"}}/{{.Label \"x\"}}"),
            "running/ml/"
        );
        assert_eq!(f("plain"), "plain");
        let err = Format::parse("{{.Colour}}").unwrap_err().to_string();
        assert!(
            err.contains("no field") && err.contains("{{.Name}}"),
            "{err}"
        );
        assert!(Format::parse("{{.ID").is_err());
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
