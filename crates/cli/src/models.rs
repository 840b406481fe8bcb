//! Finding and loading models: references through anelm-hub (with a bar per downloaded file),
//! the default model in the cache, a progress spinner for slow loads.

use std::io::IsTerminal;
use std::path::PathBuf;
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
    anelm_hub::anelm_models_dir()
}

/// The variable that names the compiled-program cache.
pub const PROGRAMS_ENV: &str = "ANELM_PROGRAMS";

/// Compiled ANE programs: `$ANELM_PROGRAMS`, else `~/.cache/anelm/programs`.
pub fn programs_dir() -> PathBuf {
    cache_subdir(PROGRAMS_ENV, "programs")
}

/// `--model` if given (any reference anelm-hub takes), else the default model from the cache
/// (with a hint when it is missing).
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    Ok(resolve_named(model)?.path)
}

/// [`resolve`], with the name the reference gives the model.
pub fn resolve_named(model: Option<&str>) -> Result<anelm_hub::Resolved> {
    if let Some(m) = model {
        return Ok(anelm_hub::Resolver::from_env().resolve_str(m, &Bars::new())?);
    }
    let p = cache_dir().join(DEFAULT_MODEL);
    if !p.exists() {
        bail!(
            "the default model {} is not in {}; fetch it with `python3 scripts/fetch-models.py` or pass --model",
            DEFAULT_MODEL,
            cache_dir().display()
        );
    }
    Ok(anelm_hub::Resolved {
        path: p,
        name: DEFAULT_MODEL.to_string(),
    })
}

/// Download progress: a bar per file on a terminal, one line per file otherwise.
pub struct Bars {
    terminal: bool,
}

impl Bars {
    pub fn new() -> Bars {
        Bars {
            terminal: std::io::stderr().is_terminal(),
        }
    }
}

struct FileBar {
    bar: Option<ProgressBar>,
    name: String,
    done: u64,
}

impl anelm_hub::Progress for Bars {
    fn file(&self, name: &str, total: Option<u64>, done: u64) -> Box<dyn anelm_hub::FileProgress> {
        let bar = self.terminal.then(|| {
            let bar = ProgressBar::new(total.unwrap_or(0));
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                )
                .expect("static template"),
            );
            bar.set_message(name.to_string());
            bar.set_position(done);
            bar
        });
        if !self.terminal {
            let resumed = if done > 0 {
                format!(", resuming at {done} bytes")
            } else {
                String::new()
            };
            let size = total
                .map(|t| format!(" ({t} bytes{resumed})"))
                .unwrap_or_default();
            eprintln!("downloading {name}{size}");
        }
        Box::new(FileBar {
            bar,
            name: name.to_string(),
            done,
        })
    }
}

impl anelm_hub::FileProgress for FileBar {
    fn advance(&mut self, done: u64) {
        self.done = done;
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    fn finish(&mut self) {
        match &self.bar {
            Some(b) => b.finish(),
            None => tracing::info!("{}: {} bytes, checked", self.name, self.done),
        }
    }
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
