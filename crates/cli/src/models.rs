//! Finding and loading models: the default model in the cache, a progress spinner for slow loads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// The model `anelm` uses when `--model` is not given.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$<var>`, else `~/.cache/anelm/<name>`.
fn cache_subdir(var: &str, name: &str) -> PathBuf {
    if let Some(d) = std::env::var_os(var) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/anelm").join(name)
}

/// The model cache: `$ANELM_MODELS`, else `~/.cache/anelm/models`.
pub fn cache_dir() -> PathBuf {
    cache_subdir("ANELM_MODELS", "models")
}

/// The variable that names the compiled-program cache.
pub const PROGRAMS_ENV: &str = "ANELM_PROGRAMS";

/// Compiled ANE programs: `$ANELM_PROGRAMS`, else `~/.cache/anelm/programs`.
pub fn programs_dir() -> PathBuf {
    cache_subdir(PROGRAMS_ENV, "programs")
}

/// `--model` if given, else the default model from the cache (with a hint when it is missing).
pub fn resolve(model: Option<&Path>) -> Result<PathBuf> {
    if let Some(m) = model {
        if !m.exists() {
            bail!("{}: no such file or directory", m.display());
        }
        return Ok(m.to_path_buf());
    }
    let p = cache_dir().join(DEFAULT_MODEL);
    if !p.exists() {
        bail!(
            "the default model {} is not in {}; fetch it with `python3 scripts/fetch-models.py` or pass --model PATH",
            DEFAULT_MODEL,
            cache_dir().display()
        );
    }
    Ok(p)
}

/// Runs `f`, showing a spinner with `msg` if it takes longer than a second.
pub fn with_spinner<T>(msg: &str, f: impl FnOnce() -> T) -> T {
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("static template"),
    );
    bar.set_message(msg.to_string());
    let shown = bar.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watcher = std::thread::spawn(move || {
        if done_rx.recv_timeout(Duration::from_secs(1)).is_err() {
            shown.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown.enable_steady_tick(Duration::from_millis(100));
            let _ = done_rx.recv();
        }
        shown.finish_and_clear();
    });
    let out = f();
    let _ = done_tx.send(());
    let _ = watcher.join();
    out
}

/// Parses `1,2,3` into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("'{t}' is not a token id"))
        })
        .collect()
}
