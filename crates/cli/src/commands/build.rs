//! `brig template build NAME -f Dockerfile [CONTEXT]`: an image from a
//! Dockerfile (brig-image's `build`), each RUN in a one-shot sandbox of the
//! process tier whose root is the image so far and whose writable layer is
//! kept for the next layer. A RUN has the network a `brig run` has (its
//! own gateway, policy public: the internet, never the host, private
//! ranges or metadata), 2 GiB of memory and 1024 tasks; its output goes to
//! this terminal.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use brig_core::{ByteSize, EnvVar, NetworkAttachment, SandboxSpec, TemplateRef, Tier, UserSpec};
use brig_image::build::{Builder, RunStep};
use brig_image::{ImageRecord, ImageStore};
use brig_jail::ProcessTier;

use super::net::OwnNetwork;

pub fn build(
    home: &Path,
    name: &str,
    file: &Path,
    context: &Path,
    build_args: &[String],
) -> anyhow::Result<ImageRecord> {
    crate::exit::require_root()?;
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the Dockerfile {}", file.display()))?;
    let mut args = HashMap::new();
    for a in build_args {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--build-arg {a:?}: expected NAME=VALUE"))?;
        args.insert(k.to_string(), v.to_string());
    }
    let store = Arc::new(ImageStore::open(home)?);
    let tier = ProcessTier::for_commands().context("cannot prepare the process tier")?;
    let mut base = |image: &str| -> Result<ImageRecord, String> {
        // A named template (`base`): its build as a one-layer image.
        if brig_template::recipe(image).is_ok() {
            return brig_template::recipe_image(home, image, brig_template::Progress::Auto)
                .map_err(|e| e.to_string());
        }
        let resolved = brig_template::resolve(
            home,
            TemplateRef::parse(image).map_err(|e| e.to_string())?,
            brig_template::Progress::Auto,
            true,
        )
        .map_err(|e| e.to_string())?;
        let TemplateRef::Layers { .. } = resolved.template else {
            return Err(format!(
                "{image} is not an image: build FROM an image or a named template"
            ));
        };
        store
            .get(image)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{image} is not in the image store"))
    };
    let mut run = |step: &RunStep<'_>| -> Result<(), String> {
        let mut spec = SandboxSpec::new(step.argv.to_vec());
        spec.template = TemplateRef::Layers {
            image: name.to_string(),
            lowers: step.lowers.clone(),
        };
        spec.upper_dir = Some(step.upper_dir.to_path_buf());
        spec.env = step
            .env
            .iter()
            .filter_map(|kv| EnvVar::parse(kv).ok())
            .collect();
        spec.workdir = step.workdir.map(str::to_string);
        spec.user = step
            .user
            .map(UserSpec::parse)
            .transpose()
            .map_err(|e| e.to_string())?;
        spec.limits.memory = ByteSize::mib(2048);
        spec.limits.pids = 1024;
        spec.limits.disk = ByteSize::mib(2048);
        spec.validate().map_err(|e| e.to_string())?;
        let net = OwnNetwork::start(
            &format!("bld{}", std::process::id()),
            brig_net::Policy::default(),
            Vec::new(),
        )
        .map_err(|e| format!("{e:#}"))?;
        let attachment: NetworkAttachment = net.attachment();
        let sandbox = tier.run(&spec, &attachment).map_err(|e| e.to_string())?;
        let ended = sandbox.wait().map_err(|e| e.to_string())?;
        drop(net);
        match ended.code {
            Some(0) => Ok(()),
            _ if ended.oom => Err("it ran out of memory (2 GiB)".into()),
            Some(code) => Err(format!("the command exited with {code}")),
            None => Err("the command's status is unknown".into()),
        }
    };
    let mut say = |line: &str| eprintln!("brig: {line}");
    let mut builder = Builder {
        store: &store,
        context,
        build_args: args,
        base: &mut base,
        run: &mut run,
        say: &mut say,
    };
    Ok(builder.build(&text, name, &format!("dockerfile:{}", file.display()))?)
}
