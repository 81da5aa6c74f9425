//! Building a template: the base's layers, then each step. A `run` step runs
//! once in a build sandbox made of the layers so far; when it succeeds the
//! sandbox is stopped (every process in it dead) and its overlay uppers are
//! captured into a layer keyed by the step's content key. A step whose key
//! is already in the layer store is not run again, so an unchanged template
//! rebuilds without a sandbox, and a changed step rebuilds from there on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mayfly_types::{
    BuildProgress, BuildRequest, BuildStep, CreateRequest, ExecRequest, TemplateInfo, TemplateRef,
    TemplateSpec,
};

use super::Engine;
use crate::image::LayerStore;
use crate::templates::keys::{self, StepConfig};
use crate::templates::{parse_spec, Base, Built, BuiltLayer, Resolved, TemplatesError};
use crate::{Caller, EngineError};

/// Where a build's progress goes (dropped events are fine).
pub type BuildEvents = tokio::sync::mpsc::UnboundedSender<BuildProgress>;

/// How long one `run` step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// Output of a failed step quoted in its error.
const FAILED_TAIL: usize = 2048;
/// Bytes of file data one build step's layer may hold (holes excluded: a
/// sparse file is kept sparse), so a step cannot fill the host's disk by
/// writing a huge file into its upper.
pub(crate) const MAX_LAYER_BYTES: u64 = 64 << 30;

/// The layers built so far, the last one's key and the step settings.
pub(super) struct Chain {
    pub parent: String,
    pub layers: Vec<BuiltLayer>,
    pub cfg: StepConfig,
}

impl Engine {
    /// Builds `req`'s template (admin only) and records it; an unchanged
    /// template is served from the step cache.
    pub async fn build_template(
        &self,
        req: BuildRequest,
        caller: &Caller,
        events: Option<BuildEvents>,
    ) -> Result<TemplateInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden(
                "managing templates needs an admin key".into(),
            ));
        }
        let t0 = Instant::now();
        let file = req.file.clone().unwrap_or_else(|| "<template>".into());
        let spec = parse_spec(&req.spec, &file)?;
        super::spec::template_lifecycle(&spec).map_err(|e| TemplatesError::Spec {
            file: file.clone(),
            field: "services/hooks".into(),
            line: None,
            column: None,
            reason: e.to_string(),
        })?;
        let context = match &req.context {
            Some(c) if Path::new(c).is_absolute() => Some(PathBuf::from(c)),
            Some(c) => {
                return Err(EngineError::Invalid(format!(
                    "context `{}` must be an absolute directory",
                    c.escape_debug()
                )))
            }
            None => None,
        };
        let emit = |p: BuildProgress| {
            if let Some(tx) = &events {
                let _ = tx.send(p);
            }
        };
        let _one = self.inner.templates.build.lock().await;
        let store_root = self.inner.cfg.layers_dir();
        let store = LayerStore::open(&store_root).map_err(TemplatesError::from)?;
        let base = Base::parse(&spec.base).map_err(EngineError::Invalid)?;
        let mut chain = self.base_chain(&base, &store, &req, &emit).await?;
        let mut cached_steps = 0;
        for (index, step) in spec.steps.iter().enumerate() {
            let ts = Instant::now();
            emit(BuildProgress::Step {
                index,
                count: spec.steps.len(),
                text: step_text(step),
            });
            let cached = match step {
                BuildStep::Env(env) => {
                    chain.cfg.env.extend(env.clone());
                    true
                }
                BuildStep::Workdir(w) => {
                    chain.cfg.workdir = Some(w.clone());
                    true
                }
                BuildStep::User(u) => {
                    chain.cfg.user = Some(*u);
                    true
                }
                BuildStep::Copy(c) => {
                    let ctx = context.clone().ok_or_else(|| TemplatesError::Copy {
                        index,
                        reason: "a copy step needs the template's directory (context)".into(),
                    })?;
                    self.copy_step(index, c, &ctx, &store, &mut chain, req.no_cache)
                        .await?
                }
                BuildStep::Run(r) => {
                    let argv = r.argv();
                    let key = keys::run_key(&chain.parent, &argv, &chain.cfg);
                    let hit = !req.no_cache && store.contains(&key);
                    if !hit {
                        self.run_step(index, &spec, &base, &argv, &key, &store, &chain, &emit)
                            .await?;
                    }
                    let tops = top_names(&store.path(&key).map_err(TemplatesError::from)?);
                    chain.layers.push(BuiltLayer {
                        key: key.clone(),
                        tops,
                    });
                    chain.parent = key;
                    hit
                }
            };
            if cached {
                cached_steps += 1;
            }
            emit(BuildProgress::StepDone {
                index,
                cached,
                ms: ts.elapsed().as_secs_f64() * 1000.0,
            });
        }
        let keys: Vec<String> = chain.layers.iter().map(|l| l.key.clone()).collect();
        let spec_json = serde_json::to_string(&spec).unwrap_or_default();
        let info = TemplateInfo {
            name: spec.name.clone(),
            base: spec.base.clone(),
            digest: keys::template_digest(&keys, &chain.cfg, &spec_json),
            size_bytes: keys.iter().map(|k| store.size(k)).sum(),
            layers: keys,
            built_at: super::now_ms(),
            build_ms: t0.elapsed().as_secs_f64() * 1000.0,
            cached_steps,
            steps: spec.steps.len(),
            env: chain.cfg.env.clone(),
            workdir: chain.cfg.workdir.clone(),
            user: chain.cfg.user,
            spec: spec.clone(),
        };
        let unchanged = self
            .registry()
            .load(&spec.name)
            .is_ok_and(|(old, _)| old.info.digest == info.digest);
        let built = Built {
            info: info.clone(),
            base,
            layers: chain.layers,
        };
        self.registry().save(&built)?;
        if !unchanged {
            self.refresh_template_pools(&spec.name);
            drop(_one);
            self.collect_layers().await?;
        }
        if let Some(p) = spec.pool {
            let pool = mayfly_types::PoolSpec {
                template: Some(spec.name.clone()),
                target: Some(p.target),
                max: Some(p.max.unwrap_or(p.target)),
                ..Default::default()
            };
            self.set_pool(&spec.name, pool, caller)?;
        }
        Ok(info)
    }

    /// The chain's start: the base's own layers (an image's) and config.
    async fn base_chain(
        &self,
        base: &Base,
        store: &LayerStore,
        req: &BuildRequest,
        emit: &(dyn Fn(BuildProgress) + Send + Sync),
    ) -> Result<Chain, EngineError> {
        match base {
            Base::Host | Base::Dir(_) => {
                if let Base::Dir(d) = base {
                    super::spec::check_template(&TemplateRef::Dir(d.clone()))?;
                }
                Ok(Chain {
                    parent: keys::base_key(base, None),
                    layers: Vec::new(),
                    cfg: StepConfig::default(),
                })
            }
            Base::Image(s) => self.image_chain(s, store, req, emit).await,
        }
    }

    /// Runs one `run` step in a build sandbox and captures its layer.
    #[allow(clippy::too_many_arguments)]
    async fn run_step(
        &self,
        index: usize,
        spec: &TemplateSpec,
        base: &Base,
        argv: &[String],
        key: &str,
        store: &LayerStore,
        chain: &Chain,
        emit: &(dyn Fn(BuildProgress) + Send + Sync),
    ) -> Result<(), EngineError> {
        // A build sandbox runs the step only: no services, no hooks.
        let partial = Resolved::partial(
            TemplateRef::Named(spec.name.clone()),
            base.clone(),
            &chain.layers,
            store.root(),
        )?;
        // The overlays the captured uppers belong to, in the sandbox's order.
        let targets: Vec<PathBuf> =
            crate::template::plan_layers(&partial, &self.inner.skeleton, &self.inner.host)
                .into_iter()
                .map(|l| l.target)
                .collect();
        let builder = Caller::new("template-build");
        let req = CreateRequest {
            ttl_secs: Some(STEP_TIMEOUT.as_secs() + 60),
            limits: spec.limits.clone(),
            egress: spec.network.clone(),
            labels: BTreeMap::from([("mayfly.build".to_owned(), spec.name.clone())]),
            ..Default::default()
        };
        let info = self
            .create_resolved(req, Arc::new(partial), &builder)
            .await?;
        let id = info.id.clone();
        let exec = ExecRequest {
            argv: argv.to_vec(),
            env: chain.cfg.env.clone(),
            cwd: chain.cfg.workdir.clone().or_else(|| Some("/".into())),
            uid: chain.cfg.user,
            timeout_ms: Some(STEP_TIMEOUT.as_millis() as u64),
            ..Default::default()
        };
        let result = self.exec_collect(&id, exec, &builder, emit).await;
        let sb = match self.lookup(&id) {
            Ok(sb) => sb,
            Err(e) => return Err(e),
        };
        let outcome = match result {
            Ok((status, _)) if status.exit_code == Some(0) => Ok(()),
            Ok((status, tail)) => Err(TemplatesError::StepFailed {
                index,
                text: argv.join(" "),
                reason: format!(
                    "exit status {}{}; its output ended with:\n{}",
                    status.shell_code(),
                    if status.timed_out { " (timed out)" } else { "" },
                    tail
                ),
            }
            .into()),
            Err(e) => Err(e),
        };
        // Every process of the sandbox dies before its uppers are read.
        let stopped = self.stop_sandbox(&sb, "template_build");
        if stopped {
            let _ = tokio::time::timeout(Duration::from_secs(10), sb.pidfd.readable()).await;
        }
        let captured = match outcome {
            Ok(()) => {
                let (dir, uid_base, store, key) =
                    (sb.dir.clone(), sb.uid_base, store.clone(), key.to_owned());
                tokio::task::spawn_blocking(move || {
                    capture(&dir, &targets, uid_base, &store, &key, index)
                })
                .await
                .unwrap_or_else(|e| Err(EngineError::Internal(format!("capture: {e}"))))
            }
            Err(e) => Err(e),
        };
        if stopped {
            let _ = self.finish_destroy(sb, "template_build").await;
        }
        captured
    }

    /// Runs a command to its end, passing its output on as lines; returns
    /// its status and the tail of its output.
    async fn exec_collect(
        &self,
        id: &mayfly_types::SandboxId,
        req: ExecRequest,
        caller: &Caller,
        emit: &(dyn Fn(BuildProgress) + Send + Sync),
    ) -> Result<(mayfly_types::ExitStatus, String), EngineError> {
        use crate::SandboxApi;
        let mut stream = self.exec_stream(id, req, caller).await?;
        let mut tail: Vec<u8> = Vec::new();
        let mut line: Vec<u8> = Vec::new();
        while let Some(ev) = stream.recv().await {
            match ev {
                mayfly_types::ExecEvent::Stdout(b) | mayfly_types::ExecEvent::Stderr(b) => {
                    tail.extend_from_slice(&b);
                    if tail.len() > 2 * FAILED_TAIL {
                        tail.drain(..tail.len() - FAILED_TAIL);
                    }
                    for byte in b {
                        if byte == b'\n' {
                            emit(BuildProgress::Output {
                                line: String::from_utf8_lossy(&line).into_owned(),
                            });
                            line.clear();
                        } else if line.len() < 4096 {
                            line.push(byte);
                        }
                    }
                }
                mayfly_types::ExecEvent::Exit(r) => {
                    if !line.is_empty() {
                        emit(BuildProgress::Output {
                            line: String::from_utf8_lossy(&line).into_owned(),
                        });
                    }
                    let start = tail.len().saturating_sub(FAILED_TAIL);
                    return Ok((
                        r.status,
                        String::from_utf8_lossy(&tail[start..]).into_owned(),
                    ));
                }
            }
        }
        Err(EngineError::Internal(
            "the step's output ended without a status".into(),
        ))
    }
}

/// Copies each overlay's upper of a stopped build sandbox into the layer
/// `key`: the root overlay's at the top, each host directory's under its
/// name.
fn capture(
    dir: &Path,
    targets: &[PathBuf],
    uid_base: u32,
    store: &LayerStore,
    key: &str,
    index: usize,
) -> Result<(), EngineError> {
    let staging = store.begin(key).map_err(TemplatesError::from)?;
    let limits = mayfly_sys::capture::CaptureLimits {
        max_entries: 2_000_000,
        max_depth: 256,
        max_bytes: MAX_LAYER_BYTES,
    };
    for (i, target) in targets.iter().enumerate() {
        let upper = dir.join(format!("upper{i}"));
        let dst = staging.dir().join(target);
        std::fs::create_dir_all(&dst).map_err(|e| TemplatesError::Io {
            path: dst.clone(),
            source: e,
        })?;
        mayfly_sys::capture::capture_upper(&upper, &dst, uid_base, &limits)
            .map_err(|source| TemplatesError::Capture { index, source })?;
    }
    staging.commit().map_err(TemplatesError::from)?;
    Ok(())
}

/// The names at the top of a layer.
pub(crate) fn top_names(layer: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(layer)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// How a step is shown in progress.
fn step_text(step: &BuildStep) -> String {
    let s = match step {
        BuildStep::Run(r) => format!("run {}", r.argv().join(" ")),
        BuildStep::Copy(c) => format!("copy {} {}", c.src, c.dest),
        BuildStep::Env(e) => format!("env {}", e.keys().cloned().collect::<Vec<_>>().join(" ")),
        BuildStep::Workdir(w) => format!("workdir {w}"),
        BuildStep::User(u) => format!("user {u}"),
    };
    s.chars().take(200).collect()
}
