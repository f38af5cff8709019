//! `GET /healthz` (no key needed) and `GET /v1/info`.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState, Auth};

pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Version, the isolation tiers this host offers, and the server's limits.
pub async fn info(State(state): State<AppState>, _auth: Auth) -> Result<Json<Value>, ApiError> {
    let tiers = match state.tiers.get() {
        Some(t) => t.clone(),
        None => {
            // The probe reads /proc and /sys for a few milliseconds; once.
            let t = tokio::task::spawn_blocking(|| {
                serde_json::to_value(brig_host::probe().tiers).unwrap_or(Value::Null)
            })
            .await?;
            state.tiers.get_or_init(|| t).clone()
        }
    };
    let config = state.manager.config();
    Ok(Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "tiers": tiers,
        // What this daemon runs (a tier the host has but the daemon could
        // not start says why in its log).
        "offered": state.manager.tiers(),
        "limits": {
            "default_timeout_secs": config.default_timeout.as_secs(),
            "max_timeout_secs": config.max_timeout.as_secs(),
        },
        "pool": state.manager.pool_sizes().into_iter().map(|(template, idle, target)| {
            json!({ "template": template, "idle": idle, "target": target })
        }).collect::<Vec<_>>(),
    })))
}
