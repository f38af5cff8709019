//! `brig keys create|ls|revoke|e2b`: API keys.
//!
//! `create` prints the new key once — the daemon keeps only its hash, so it
//! can never be shown again. A tenant key manages its own tenant's tenant
//! keys; an admin key (the one `brig serve` wrote to local.key) also
//! `--tenant NAME` and `--admin` keys. `revoke` refuses (409 from the
//! daemon) a tenant's last active key and the last admin key.
//!
//! `e2b` prints a key's spelling for E2B's clients (`e2b_` and hex: some
//! of their releases refuse any other shape); either spelling is the key.
//!
//! `create --local` is the way back in for an operator locked out (the
//! local key revoked, lost or expired): run as root on the daemon's host,
//! it opens the daemon's store directly — no key needed — makes a new
//! admin key and writes it to `$BRIG_HOME/local.key`.

use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};

use super::client::{ago, home_dir, Client, LOCAL_KEY_FILE};
use crate::exit;

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, clap::Subcommand)]
enum KeysCommand {
    /// Create a key and print it; it is shown this once only.
    Create {
        /// A label to recognise the key by in `brig keys ls`.
        #[arg(long)]
        name: Option<String>,
        /// A key of this tenant (admin keys only; default: your tenant).
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// An admin key: it manages tenants and every key (admin keys only).
        #[arg(long)]
        admin: bool,
        /// It stops working after this long, e.g. 30d, 12h.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        /// Recovery, as root on the daemon's host: make an admin key in the
        /// daemon's store directly (no key needed) and write it to
        /// $BRIG_HOME/local.key.
        #[arg(long, conflicts_with_all = ["tenant", "admin", "expires"])]
        local: bool,
        /// Print `{"id": …, "key": …, …}` instead of the bare key.
        #[arg(long)]
        json: bool,
    },
    /// List active keys (ids, names, roles; never secrets).
    Ls {
        /// Another tenant's keys, or `all` (admin keys only).
        #[arg(long, value_name = "NAME|all")]
        tenant: Option<String>,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print a key's spelling for E2B's clients (`e2b_` and hex digits;
    /// the same key): `export E2B_API_KEY=$(brig keys e2b)`.
    E2b {
        /// The key (default: the one this CLI uses, $BRIG_API_KEY or
        /// $BRIG_HOME/local.key).
        key: Option<String>,
    },
    /// Revoke a key: every request with it is refused from then on.
    Revoke {
        /// The key's id (the 12 hex digits after `brig_`, as `ls` shows).
        id: String,
    },
}

pub fn run(args: KeysArgs) -> anyhow::Result<i32> {
    if let KeysCommand::Create {
        local: true,
        name,
        json,
        ..
    } = &args.command
    {
        return create_local(&home_dir(), name.as_deref(), *json);
    }
    if let KeysCommand::E2b { key } = &args.command {
        return e2b(key.as_deref());
    }
    let client = Client::from_env()?;
    match args.command {
        KeysCommand::Create {
            name,
            tenant,
            admin,
            expires,
            json,
            ..
        } => {
            if let Some(e) = &expires {
                brig_core::parse_duration(e).context("--expires")?;
            }
            let mut body = json!({});
            for (k, v) in [("name", name), ("tenant", tenant), ("expires", expires)] {
                if let Some(v) = v {
                    body[k] = v.into();
                }
            }
            if admin {
                body["role"] = "admin".into();
            }
            let created = client.json("POST", "/v1/keys", Some(&body))?;
            if json {
                println!("{created}");
            } else {
                println!("{}", created["key"].as_str().unwrap_or_default());
                eprintln!(
                    "brig: created {} key {} for tenant {}; store it now, it is not shown again\n\
                     brig: the same key for E2B's clients (E2B_API_KEY): {}",
                    created["role"].as_str().unwrap_or("api"),
                    created["id"].as_str().unwrap_or_default(),
                    created["tenant"].as_str().unwrap_or_default(),
                    created["e2b_key"].as_str().unwrap_or_default(),
                );
            }
        }
        KeysCommand::Ls { tenant, json } => {
            let path = match &tenant {
                Some(t)
                    if t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) =>
                {
                    format!("/v1/keys?tenant={t}")
                }
                Some(t) => anyhow::bail!("invalid tenant name {t:?}"),
                None => "/v1/keys".to_string(),
            };
            let list = client.json("GET", &path, None)?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            println!(
                "{:<12}  {:<20}  {:<6}  {:<12}  {:<12}  {:<12}  LAST_USED",
                "ID", "NAME", "ROLE", "TENANT", "CREATED", "EXPIRES"
            );
            let now = super::client::now_millis();
            for k in &items {
                println!(
                    "{:<12}  {:<20}  {:<6}  {:<12}  {:<12}  {:<12}  {}",
                    k["id"].as_str().unwrap_or("?"),
                    k["name"].as_str().unwrap_or("-"),
                    k["role"].as_str().unwrap_or("-"),
                    k["tenant"].as_str().unwrap_or("-"),
                    k["created_at"].as_i64().map_or("-".into(), ago),
                    k["expires_at"]
                        .as_i64()
                        .map_or("never".into(), |at| format!(
                            "in {}",
                            super::client::span(at - now)
                        )),
                    k["last_used_at"].as_i64().map_or("never".into(), ago),
                );
            }
        }
        KeysCommand::E2b { .. } => unreachable!("handled without a daemon above"),
        KeysCommand::Revoke { id } => {
            // The path segment is the user's text: refuse what is not an id
            // rather than send `/` or `?` into the URL.
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                anyhow::bail!(
                    "invalid key id {id:?}: use the ID column of `brig keys ls` (12 hex digits)"
                );
            }
            client.send(client.request("DELETE", &format!("/v1/keys/{id}")), None)?;
        }
    }
    Ok(0)
}

/// `brig keys e2b [KEY]`: the E2B spelling, worked out here (it is the
/// key itself, re-encoded), so it needs no daemon.
fn e2b(key: Option<&str>) -> anyhow::Result<i32> {
    let key = match key {
        Some(k) => k.trim().to_string(),
        None => super::client::api_key()?,
    };
    let spelling = brig_runtime::e2b_spelling(&key).with_context(|| {
        format!(
            "{} is not a brig key (brig_<id>_<secret>, as brig keys create prints it)",
            if key.starts_with("e2b_") {
                "this is already an E2B spelling; it"
            } else {
                "this"
            }
        )
    })?;
    println!("{spelling}");
    Ok(0)
}

/// `brig keys create --local`: a new admin key straight into the store of
/// the daemon of `home`, written to its local.key. SQLite lets this run
/// beside a live daemon.
fn create_local(home: &Path, name: Option<&str>, json: bool) -> anyhow::Result<i32> {
    exit::require_root()?;
    let db = home.join(brig_runtime::DB_FILE);
    if !db.exists() {
        anyhow::bail!(
            "no brig store at {}: run this on the daemon's host, with BRIG_HOME set to the \
             daemon's --home",
            db.display()
        );
    }
    let store = brig_runtime::Store::open_in(home)?;
    let (info, key) = store.create_admin_key(Some(name.unwrap_or("local.key (recovered)")))?;
    let path = home.join(LOCAL_KEY_FILE);
    super::serve::write_key(&path, &key)?;
    if json {
        println!(
            "{}",
            json!({ "id": info.id, "key": key, "e2b_key": brig_runtime::e2b_spelling(&key),
                    "role": "admin", "path": path })
        );
    } else {
        println!("{key}");
        eprintln!(
            "brig: created admin key {} and wrote it to {} (the CLI on this host uses it)",
            info.id,
            path.display()
        );
    }
    Ok(0)
}
