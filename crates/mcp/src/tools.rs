//! The tools: each one's arguments (a struct whose doc comments become the
//! JSON schema an LLM reads), its description, and [`list`] of them all.
//!
//! Arguments are checked by [`parse`] against the same structs the schemas
//! are made from (`deny_unknown_fields`), so a bad argument is refused with
//! the field named, as a tool error the model can act on.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ToolError;

/// `create_sandbox`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Template: `code-interpreter-v1` (Debian with Python, Jupyter kernels, numpy, pandas,
    /// matplotlib; needed by run_code), `base` (plain Debian), `host` (a read-only view of
    /// the host's system, starts instantly), or an OCI image reference such as
    /// `python:3.12-slim` (pulled on first use). Default: the server's default template.
    pub template: Option<String>,
    /// Isolation tier: `process` (namespaces, seccomp, cgroups; the default), `gvisor` (the
    /// same under gVisor's application kernel, where the server has runsc; slower to start).
    /// `vm` is refused by servers that do not offer it.
    pub isolation: Option<String>,
    /// Memory limit, e.g. `512M` or `2G`.
    pub memory: Option<String>,
    /// CPU quota in cores, e.g. 0.5 or 2.
    pub cpus: Option<f64>,
    /// Most processes (and threads) at once.
    pub pids: Option<u32>,
    /// Size of the writable disk, e.g. `1G`.
    pub disk: Option<String>,
    /// How long the sandbox lives unless extended, e.g. `30m` or `2h`. Default: while it
    /// is used, until an hour after its last use by a tool. extend_timeout prolongs it.
    pub timeout: Option<String>,
    /// Environment variables every command in the sandbox gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Network access: `none` (loopback only), `public` (the internet, never the host or
    /// private ranges; the default where the server has a network) or `allow` (only the
    /// hosts in `allow`).
    pub network: Option<NetworkMode>,
    /// With network `allow` (or as exceptions to `deny`): domains, `*.domain`, IPs or
    /// CIDRs, optionally with `:port`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Hosts never reachable, in the same syntax as `allow`.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Keep the sandbox after this MCP session ends (until its timeout). Default false: a
    /// sandbox created over MCP ends with the session.
    #[serde(default)]
    pub persist: bool,
    /// Make this the session's default sandbox (the one tools use when sandbox_id is
    /// omitted). Default false.
    #[serde(default)]
    pub make_default: bool,
}

/// A sandbox's network mode.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    None,
    Public,
    Allow,
}

/// `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// A shell command line, run with `sh -c` (pipes, redirections and `&&` work).
    pub command: String,
    /// The sandbox; omit to use this session's default sandbox (created on first use).
    pub sandbox_id: Option<String>,
    /// Working directory (default: the user's home).
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user to run as (default: the template's default user, `user` or `root`).
    pub user: Option<String>,
    /// Kill the command after this many seconds (default 300). For servers or anything
    /// that should keep running, use start_process instead.
    pub timeout_seconds: Option<u64>,
    /// Text written to the command's standard input.
    pub stdin: Option<String>,
}

/// `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The code to run. State (variables, imports, functions) persists between calls of
    /// the same language in the same sandbox, as in a Jupyter notebook; the value of the
    /// last expression is returned, and plots (matplotlib `plt.show()`) come back as
    /// images.
    pub code: String,
    /// `python` (default), `javascript`/`typescript` (Deno), `bash`, or another kernel the
    /// template has installed.
    pub language: Option<String>,
    /// The sandbox (a code-interpreter-v1 one); omit to use this session's default sandbox.
    pub sandbox_id: Option<String>,
    /// Stop (interrupt) the execution after this many seconds (default 300).
    pub timeout_seconds: Option<u64>,
}

/// `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path in the sandbox, absolute or relative to the user's home.
    pub path: String,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path in the sandbox, absolute or relative to the user's home; missing parent
    /// directories are created; an existing file is replaced.
    pub path: String,
    /// The file's text content.
    pub content: String,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// `upload_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadFileArgs {
    /// Path in the sandbox, absolute or relative to the user's home; missing parent
    /// directories are created; an existing file is replaced.
    pub path: String,
    /// The file's bytes, base64-encoded (standard alphabet, padding optional).
    pub data_base64: String,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Directory in the sandbox (default: the user's home).
    pub path: Option<String>,
    /// How many levels down to list (1: the directory's own entries; at most 5).
    pub depth: Option<u32>,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// `start_process`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessArgs {
    /// A shell command line, run with `sh -c` in the background (a server, a watcher, a
    /// long build). Its output is kept; read it with read_process_output.
    pub command: String,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
    /// Working directory (default: the user's home).
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user to run as (default: the template's default user).
    pub user: Option<String>,
}

/// `read_process_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadProcessArgs {
    /// The pid start_process returned.
    pub pid: i32,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
    /// Wait up to this many seconds for the process to exit (default 0: return what it
    /// has printed so far at once; at most 600).
    pub wait_seconds: Option<u64>,
}

/// `kill_process`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillProcessArgs {
    /// The pid to kill (with everything it started).
    pub pid: i32,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// `list_sandboxes`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {
    /// Also list sandboxes that have ended. Default false.
    #[serde(default)]
    pub include_ended: bool,
}

/// `kill_sandbox`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillSandboxArgs {
    /// The sandbox to end; everything in it is lost.
    pub sandbox_id: String,
}

/// `extend_timeout`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendArgs {
    /// The sandbox's new time to live from now, e.g. `30m` or `2h`.
    pub timeout: String,
    /// The sandbox; omit for this session's default sandbox.
    pub sandbox_id: Option<String>,
}

/// Decode a tool's arguments into its struct, naming the field that does
/// not fit.
pub fn parse<T: DeserializeOwned>(tool: &str, args: Option<JsonObject>) -> Result<T, ToolError> {
    let value = serde_json::Value::Object(args.unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // serde names a missing or unknown field in its message, at the
        // path of the object that lacks or has it.
        let field = field_in(&inner).map_or(path.clone(), |f| {
            if path == "." {
                f
            } else {
                format!("{path}.{f}")
            }
        });
        ToolError::Arguments {
            tool: tool.to_string(),
            field,
            reason: inner,
        }
    })
}

/// The field a serde message names: "missing field `x`", "unknown field `x`".
fn field_in(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("missing field `")
        .or_else(|| message.strip_prefix("unknown field `"))?;
    rest.split('`').next().map(str::to_string)
}

/// A tool from its name, description and argument struct.
fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, schema::<T>())
}

fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    let mut settings = schemars::generate::SchemaSettings::draft07();
    // No `$ref`s: some clients do not follow them.
    settings.inline_subschemas = true;
    let schema = settings.into_generator().root_schema_for::<T>();
    match serde_json::to_value(schema) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.remove("$schema");
            o.remove("title");
            if let Some(serde_json::Value::Object(props)) = o.get_mut("properties") {
                props.values_mut().for_each(not_nullable);
            }
            Arc::new(o)
        }
        _ => Arc::new(JsonObject::new()),
    }
}

/// An optional argument is one a model leaves out, not one it sets to
/// null: `"type": ["string", "null"]` (schemars' `Option`) becomes
/// `"type": "string"`, and `anyOf: [X, null]` becomes X. A single `type`
/// is what clients that map schemas onto narrower dialects (Gemini's
/// function declarations) take; `null` is still accepted.
fn not_nullable(p: &mut serde_json::Value) {
    use serde_json::Value;
    let Value::Object(o) = p else { return };
    if let Some(Value::Array(types)) = o.get("type") {
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if rest.len() == 1 {
            o.insert("type".into(), rest[0].clone());
        }
    }
    if let Some(Value::Array(branches)) = o.get("anyOf") {
        let rest: Vec<Value> = branches
            .iter()
            .filter(|b| b.get("type") != Some(&Value::from("null")))
            .cloned()
            .collect();
        if let [Value::Object(only)] = rest.as_slice() {
            let only = only.clone();
            o.remove("anyOf");
            for (k, v) in only {
                o.entry(k).or_insert(v);
            }
        }
    }
    if let Some(Value::Array(values)) = o.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}

/// Every tool, in the order a model is shown them.
pub fn list() -> Vec<Tool> {
    static TOOLS: LazyLock<Vec<Tool>> = LazyLock::new(build);
    TOOLS.clone()
}

fn read_only() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .open_world(false)
}

fn build() -> Vec<Tool> {
    vec![
        tool::<RunCodeArgs>(
            "run_code",
            "Run code in a stateful Jupyter kernel inside an isolated sandbox and return its \
             output: stdout, stderr, the value of the last expression, errors with their \
             traceback, and plots as images. Variables and imports persist between calls. \
             Python has numpy, pandas and matplotlib. Without sandbox_id it uses this \
             session's default sandbox, created on first use.",
        ),
        tool::<RunCommandArgs>(
            "run_command",
            "Run a shell command in an isolated sandbox and wait for it to finish; returns \
             its exit code, stdout and stderr. Long output is truncated (the full text is \
             saved to a file in the sandbox, whose path is given). Without sandbox_id it uses \
             this session's default sandbox, created on first use. For servers or long \
             background jobs use start_process.",
        ),
        tool::<CreateArgs>(
            "create_sandbox",
            "Create a new isolated sandbox (a Linux environment) and return its id. Usually \
             unnecessary: every tool uses this session's default sandbox when sandbox_id is \
             omitted. Create one for a different template, limits, network policy, or to run \
             things side by side. It ends with the MCP session unless persist is true.",
        ),
        tool::<ReadFileArgs>(
            "read_file",
            "Read a file from a sandbox. Text comes back as text, images as images, other \
             binary files base64-encoded.",
        )
        .annotate(read_only()),
        tool::<WriteFileArgs>(
            "write_file",
            "Write a text file in a sandbox (replacing it; parent directories are created).",
        ),
        tool::<UploadFileArgs>(
            "upload_file",
            "Upload a binary file into a sandbox from base64-encoded bytes (replacing it; \
             parent directories are created).",
        ),
        tool::<ListFilesArgs>(
            "list_files",
            "List a directory in a sandbox: each entry's path, type and size.",
        )
        .annotate(read_only()),
        tool::<StartProcessArgs>(
            "start_process",
            "Start a shell command in the background in a sandbox (a web server, a watcher, \
             a long job) and return its pid at once. Read what it printed later with \
             read_process_output; stop it with kill_process.",
        ),
        tool::<ReadProcessArgs>(
            "read_process_output",
            "Read what a background process (from start_process) has printed so far, and \
             whether it is still running or its exit code. Can wait for it to finish.",
        )
        .annotate(read_only()),
        tool::<KillProcessArgs>(
            "kill_process",
            "Kill a process in a sandbox (and the processes it started).",
        ),
        tool::<ListSandboxesArgs>(
            "list_sandboxes",
            "List the sandboxes this client can use: id, template, state, when each expires, \
             and which is this session's default.",
        )
        .annotate(read_only()),
        tool::<KillSandboxArgs>(
            "kill_sandbox",
            "End a sandbox now; its processes and files are gone.",
        ),
        tool::<ExtendArgs>(
            "extend_timeout",
            "Give a sandbox more time: it now expires the given duration from now.",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_with_descriptions() {
        for t in list() {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&"object".into()),
                "{}",
                t.name
            );
            assert!(t.description.as_deref().is_some_and(|d| d.len() > 40));
            if let Some(serde_json::Value::Object(props)) = t.input_schema.get("properties") {
                for (name, p) in props {
                    assert!(
                        p.get("description").is_some() || p.get("$ref").is_some(),
                        "{}.{name} has no description",
                        t.name
                    );
                }
            }
        }
    }

    #[test]
    fn optional_arguments_have_one_type() {
        for t in list() {
            let props = t.input_schema["properties"].as_object().unwrap();
            for (name, p) in props {
                assert!(
                    p.get("type").is_some_and(|t| t.is_string()),
                    "{}.{name}: {p}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn bad_arguments_name_the_field() {
        let args = |v: serde_json::Value| v.as_object().cloned();
        let e = parse::<RunCommandArgs>("run_command", args(serde_json::json!({})))
            .unwrap_err()
            .to_string();
        assert!(e.contains("command"), "{e}");
        let e = parse::<RunCommandArgs>(
            "run_command",
            args(serde_json::json!({"command": "x", "timeout_seconds": "soon"})),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("timeout_seconds"), "{e}");
        let e = parse::<RunCommandArgs>(
            "run_command",
            args(serde_json::json!({"command": "x", "bogus": 1})),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
