//! `create_sandbox`, `list_sandboxes`, `kill_sandbox`, `extend_timeout`,
//! and the session's default sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brig_core::{parse_duration, EnvVar, Isolation, Limits, SandboxId, TemplateRef};
use brig_e2b::control::interpreter;
use brig_runtime::{CreateConfig, ListFilter, SandboxRecord, SandboxState};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use crate::error::ToolError;
use crate::tools::{CreateArgs, ExtendArgs, KillSandboxArgs, ListSandboxesArgs, NetworkMode};
use crate::Structured;
use crate::{lock, Call};

/// What a sandbox's record says, for the model.
fn describe(r: &SandboxRecord, default: Option<&SandboxId>) -> serde_json::Value {
    json!({
        "sandbox_id": r.id.as_str(),
        "template": r.template,
        "state": r.state,
        "expires_at_ms": r.expires_at,
        "default": default == Some(&r.id),
    })
}

/// The create arguments as the runtime takes them: every field checked,
/// an error naming the one that is wrong.
fn config(args: CreateArgs, default_template: &str) -> Result<CreateConfig, ToolError> {
    let bad = |field: &str, e: &dyn std::fmt::Display| {
        ToolError::Invalid(format!("invalid {field}: {e}"))
    };
    // A tier this server does not offer is refused by the runtime, with
    // its reason (`brig doctor`).
    let isolation = match args.isolation.as_deref() {
        None => Isolation::Process,
        Some(t) => t.parse::<Isolation>().map_err(|e| bad("isolation", &e))?,
    };
    let mut limits = Limits::from_request(
        args.memory.as_deref(),
        args.disk.as_deref(),
        args.pids,
        args.cpus,
    )
    .map_err(|(field, e)| bad(field, &e))?;
    let name = args.template.as_deref().unwrap_or(default_template);
    if brig_e2b::control::interpreter::wanted(name) && args.memory.is_none() {
        // Its kernels side by side need more than a plain sandbox's default.
        limits.memory = brig_e2b::control::interpreter::MEMORY;
    }
    let template = TemplateRef::parse(name).map_err(|e| bad("template", &e))?;
    // None given: it lives while it is used (`Call::used`).
    let timeout = args
        .timeout
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| bad("timeout", &e))?
        .or(Some(crate::IDLE_TIMEOUT));
    let env = EnvVar::from_map(&args.env).map_err(|e| bad("env", &e))?;
    let network = network(args.network, &args.allow, &args.deny)?;
    Ok(CreateConfig {
        template,
        limits,
        env,
        timeout,
        isolation,
        network,
        attrs: serde_json::Map::from_iter([("mcp".to_string(), json!({"template": name}))]),
        ..CreateConfig::default()
    })
}

fn network(
    mode: Option<NetworkMode>,
    allow: &[String],
    deny: &[String],
) -> Result<Option<brig_net::Policy>, ToolError> {
    if mode.is_none() && allow.is_empty() && deny.is_empty() {
        return Ok(None);
    }
    let rules = |field: &str, list: &[String]| {
        list.iter()
            .map(|r| {
                r.parse::<brig_net::policy::Rule>()
                    .map_err(|e| ToolError::Invalid(format!("invalid {field} rule {r:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let mut policy = brig_net::Policy {
        mode: match mode {
            Some(NetworkMode::None) => brig_net::policy::Mode::None,
            Some(NetworkMode::Allow) => brig_net::policy::Mode::Allow,
            Some(NetworkMode::Public) => brig_net::policy::Mode::Public,
            None if !allow.is_empty() => brig_net::policy::Mode::Allow,
            None => brig_net::policy::Mode::Public,
        },
        ..brig_net::Policy::default()
    };
    policy.allow = rules("allow", allow)?;
    policy.deny = rules("deny", deny)?;
    Ok(Some(policy))
}

/// The template a client named when it made a sandbox (kept in its
/// `mcp` attribute by `config`), else `resolved`: the runtime's name for it.
pub(crate) fn template_name(
    attrs: &serde_json::Map<String, serde_json::Value>,
    resolved: &str,
) -> String {
    attrs
        .get("mcp")
        .and_then(|a| a.get("template"))
        .and_then(|t| t.as_str())
        .unwrap_or(resolved)
        .to_string()
}

/// Create a sandbox, telling the client every few seconds that it is
/// still being made (a first create of a template builds or pulls it).
/// A code-interpreter sandbox on a tier that keeps warm starts (vm) is
/// restored from one, its server up with ready kernels, when one is kept;
/// when none is, it starts cold (`run_code` starts its server) while the
/// warm start is made in the background for the creates after it.
async fn make(call: &Call<'_>, config: CreateConfig) -> Result<SandboxRecord, ToolError> {
    let (m, t) = (Arc::clone(call.manager()), call.tenant.clone());
    let template = config.template.to_string();
    let envs: BTreeMap<String, String> = config
        .env
        .iter()
        .map(|v| (v.key.clone(), v.value.clone()))
        .collect();
    let mut task = tokio::task::spawn_blocking(move || {
        let name = template_name(&config.attrs, &config.template.to_string());
        let key = interpreter::wanted(&name)
            .then(|| interpreter::warm_key(&m, &name, config.isolation, &config))
            .flatten()
            .filter(|key| interpreter::warm_kept_or_make(&m, &t, key, &config));
        if let Some(key) = key {
            let warm = CreateConfig {
                warm: Some(key),
                ..config.clone()
            };
            match m.create(&t, warm) {
                Ok(record) => return Ok((record, true)),
                // Forgotten by the runtime (a restore that fails is not
                // tried again); this create goes on cold.
                Err(e) => tracing::warn!(
                    "a warm start of {name} did not restore; starting cold: {}",
                    brig_runtime::chain(&e)
                ),
            }
        }
        m.create(&t, config).map(|record| (record, false))
    });
    let started = tokio::time::Instant::now();
    call.progress(0.0, format!("creating a sandbox of {template}"))
        .await;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    loop {
        tokio::select! {
            done = &mut task => {
                let (record, warm) = done
                    .map_err(|e| ToolError::Failed(format!("the create task failed: {e}")))??;
                if warm {
                    crate::code::resumed(call, &record.id, envs).await;
                }
                return Ok(record);
            }
            _ = tick.tick() => {
                let secs = started.elapsed().as_secs();
                call.progress(
                    secs as f64,
                    format!(
                        "still creating a sandbox of {template} ({secs} s; a template's first \
                         use builds or pulls it)"
                    ),
                )
                .await;
            }
        }
    }
}

pub(crate) async fn create(call: &Call<'_>, args: CreateArgs) -> Result<CallToolResult, ToolError> {
    let (persist, make_default) = (args.persist, args.make_default);
    let idle = args.timeout.is_none();
    let config = config(args, &call.shared().default_template)?;
    let record = make(call, config).await?;
    if idle {
        call.keep_alive(&record.id);
    }
    if !persist {
        call.own(&record.id);
    }
    if make_default {
        set_default(call, &record.id).await;
    }
    let default = current_default(call).await;
    let v = describe(&record, default.as_ref());
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "created sandbox {} ({}){}; pass sandbox_id \"{}\" to the other tools to use it",
        record.id,
        record.template,
        if persist {
            ", kept after this session until its timeout"
        } else {
            ", ended with this session"
        },
        record.id
    ))])
    .with_structured_content(v))
}

async fn current_default(call: &Call<'_>) -> Option<SandboxId> {
    if call.sessioned {
        call.session.default.lock().await.clone()
    } else {
        lock(&call.shared().tenant_defaults)
            .get(&call.tenant)
            .cloned()
    }
}

async fn set_default(call: &Call<'_>, id: &SandboxId) {
    if call.sessioned {
        *call.session.default.lock().await = Some(id.clone());
    } else {
        lock(&call.shared().tenant_defaults).insert(call.tenant.clone(), id.clone());
    }
}

/// The session's default sandbox, made on first use (and again if the
/// last one ended).
pub(crate) async fn default_sandbox(call: &Call<'_>) -> Result<SandboxId, ToolError> {
    let template = call.shared().default_template.clone();
    let args = || CreateArgs {
        template: Some(template.clone()),
        ..CreateArgs::default()
    };
    if !call.sessioned {
        // One per tenant; a create racing another may make two, and the
        // later wins: the other lives out its timeout.
        let known = lock(&call.shared().tenant_defaults)
            .get(&call.tenant)
            .cloned();
        if let Some(id) = known.filter(|id| call.manager().is_running(&call.tenant, id)) {
            return Ok(id);
        }
        let record = make(call, config(args(), &template)?).await?;
        call.keep_alive(&record.id);
        set_default(call, &record.id).await;
        return Ok(record.id);
    }
    let mut default = call.session.default.lock().await;
    if let Some(id) = default
        .as_ref()
        .filter(|id| call.manager().is_running(&call.tenant, id))
    {
        return Ok(id.clone());
    }
    let record = make(call, config(args(), &template)?).await?;
    call.keep_alive(&record.id);
    call.own(&record.id);
    *default = Some(record.id.clone());
    Ok(record.id)
}

pub(crate) async fn list(
    call: &Call<'_>,
    args: ListSandboxesArgs,
) -> Result<CallToolResult, ToolError> {
    let (m, t) = (Arc::clone(call.manager()), call.tenant.clone());
    let filter = ListFilter {
        state: (!args.include_ended).then_some(SandboxState::Running),
        ..ListFilter::default()
    };
    let page = tokio::task::spawn_blocking(move || m.list(&t, &filter, None, 1000))
        .await
        .map_err(|e| ToolError::Failed(format!("the list task failed: {e}")))??;
    let default = current_default(call).await;
    let items: Vec<_> = page
        .items
        .iter()
        // The code interpreter's warm-up (see `make`) is brig's, not the
        // client's: it ends by itself once checkpointed.
        .filter(|r| !r.labels.contains_key(interpreter::WARM_UP_LABEL))
        .map(|r| describe(r, default.as_ref()))
        .collect();
    let text = if items.is_empty() {
        "no sandboxes (tools create this session's default sandbox on first use)".to_string()
    } else {
        serde_json::to_string_pretty(&items).unwrap_or_default()
    };
    Ok(CallToolResult::success(vec![ContentBlock::text(text)])
        .with_structured_content(json!({ "sandboxes": items })))
}

pub(crate) async fn kill(
    call: &Call<'_>,
    args: KillSandboxArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.resolve(Some(&args.sandbox_id)).await?;
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let record = tokio::task::spawn_blocking(move || m.delete(&t, &i))
        .await
        .map_err(|e| ToolError::Failed(format!("the delete task failed: {e}")))??;
    call.disown(&id);
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "sandbox {id} ended ({})",
        record.state
    ))]))
}

pub(crate) async fn extend(call: &Call<'_>, args: ExtendArgs) -> Result<CallToolResult, ToolError> {
    let timeout = parse_duration(&args.timeout)
        .map_err(|e| ToolError::Invalid(format!("invalid timeout: {e} (for example \"30m\")")))?;
    let id = call.resolve(args.sandbox_id.as_deref()).await?;
    // From now on its deadline is the one asked for, not one kept by use.
    lock(&call.shared().kept_alive).remove(&id);
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let record = tokio::task::spawn_blocking(move || m.extend(&t, &i, timeout))
        .await
        .map_err(|e| ToolError::Failed(format!("the extend task failed: {e}")))??;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "sandbox {id} now expires in {} s",
        timeout.as_secs()
    ))])
    .with_structured_content(describe(&record, None)))
}
