//! `anelm bench`: prompt-processing and generation speed, as llama.cpp's llama-bench measures
//! them: `pp N` runs an N-token prompt through a fresh state in one forward pass, `tg N` decodes
//! N tokens one at a time from an empty state; each is repeated and reported as median, min and
//! max tokens/s, with the weight bandwidth generation achieves and the process's peak RSS.
//! Beside generation it measures the limit: a streaming read of a buffer beyond the caches by as
//! many threads, alternated with the runs so that both see the same machine load.

use std::time::Instant;

use std::sync::Arc;

use anelm_cpu::membw::{StreamBuffer, STREAM_BYTES};
use anelm_engine::LoadedModel;
use anelm_model::{Executor, Logits};
use anyhow::{bail, Context, Result};
use serde_json::json;

use super::common::ModelArgs;
use crate::models;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the prompt-processing test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub prompt: usize,
    /// Tokens of the generation test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub gen: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Streaming reads of a 256 MiB buffer after each generation run: the bandwidth limit
    /// generation is compared with (0 skips them).
    #[arg(long, default_value_t = 3)]
    pub stream_reads: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Deterministic token ids spread over the vocabulary (the content does not change the cost).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Seconds of one prompt-processing run.
fn prompt_run(exec: &mut dyn Executor, ids: &[u32], logits: &mut Vec<f32>) -> Result<f64> {
    let mut state = exec.new_state(ids.len())?;
    let start = Instant::now();
    exec.forward(state.as_mut(), ids, Logits::Last, logits)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds of one generation run: each token is fed alone, as in decoding.
fn gen_run(exec: &mut dyn Executor, ids: &[u32], logits: &mut Vec<f32>) -> Result<f64> {
    let mut state = exec.new_state(ids.len())?;
    let start = Instant::now();
    for id in ids {
        exec.forward(
            state.as_mut(),
            std::slice::from_ref(id),
            Logits::Last,
            logits,
        )?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The process's peak resident set (VmHWM), where /proc tells it.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn stats(v: &[f64]) -> Option<Stats> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = match n {
        0 => return None,
        _ if n % 2 == 1 => s[n / 2],
        _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    };
    Some(Stats {
        median,
        min: s[0],
        max: s[n - 1],
    })
}

pub fn run(a: Args) -> Result<()> {
    if a.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    if a.prompt == 0 && a.gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    // The weights only: the benchmark feeds token ids, so the tokenizer would only add memory.
    let path = models::resolve(a.model.model.as_deref())?;
    let model =
        Arc::new(anelm_model::load(&path).with_context(|| format!("loading {}", path.display()))?);
    let loaded = LoadedModel {
        model: model.clone(),
        tokenizer: None,
    };
    let max = model.max_positions();
    if a.prompt.max(a.gen) > max {
        bail!(
            "{}: the model holds {max} positions; -p {} / -n {} do not fit",
            model.source.path().display(),
            a.prompt,
            a.gen
        );
    }
    let mut exec = a.model.executor(&loaded, a.prompt.max(a.gen).max(1))?;
    let vocab = exec.vocab_size();
    let mut logits = Vec::new();

    // Warm-up, as llama-bench does: page in the weights, size the buffers.
    if a.prompt > 0 {
        prompt_run(exec.as_mut(), &tokens(a.prompt, vocab, 1), &mut logits)
            .context("warm-up prompt run")?;
    }
    if a.gen > 0 {
        gen_run(exec.as_mut(), &tokens(1, vocab, 2), &mut logits)
            .context("warm-up generation run")?;
    }

    let threads = match a.model.threads {
        0 => anelm_cpu::pool::physical_cores(),
        t => t,
    };
    let (mut pp, mut tg, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut stream, mut limit, mut rss) = (None, Vec::new(), None);
    for r in 0..a.repetitions {
        if a.prompt > 0 {
            let s = prompt_run(
                exec.as_mut(),
                &tokens(a.prompt, vocab, 10 + r as u64),
                &mut logits,
            )?;
            pp.push(a.prompt as f64 / s);
            runs.push(json!({"test": format!("pp{}", a.prompt), "seconds": s, "tok_s": a.prompt as f64 / s}));
        }
        if a.gen > 0 {
            let s = gen_run(
                exec.as_mut(),
                &tokens(a.gen, vocab, 100 + r as u64),
                &mut logits,
            )?;
            tg.push(a.gen as f64 / s);
            runs.push(
                json!({"test": format!("tg{}", a.gen), "seconds": s, "tok_s": a.gen as f64 / s}),
            );
            if a.stream_reads > 0 {
                // The peak RSS is the model's: read it before the buffer exists.
                let buf = stream.get_or_insert_with(|| {
                    rss = peak_rss();
                    StreamBuffer::new(STREAM_BYTES, true)
                });
                for _ in 0..a.stream_reads {
                    let gbs = buf.gb_s(threads);
                    limit.push(gbs);
                    runs.push(json!({"test": "stream", "threads": threads, "gb_s": gbs}));
                }
            }
        }
    }
    if stream.is_none() {
        rss = peak_rss();
    }
    let bytes = model.bytes_per_token() as f64;
    let (pp_s, tg_s, limit_s) = (stats(&pp), stats(&tg), stats(&limit));
    let tg_gbs = tg_s.as_ref().map(|s| s.median * bytes / 1e9);
    let limit_gbs = limit_s.as_ref().map(|s| s.median);
    let of_limit = tg_gbs.zip(limit_gbs).map(|(t, l)| t / l);

    if a.json {
        let out = json!({
            "pp_tok_s": pp_s.as_ref().map(|s| s.median),
            "tg_tok_s": tg_s.as_ref().map(|s| s.median),
            "tg_gb_s": tg_gbs,
            "stream_gb_s": limit_gbs,
            "tg_of_limit": of_limit,
            "peak_rss_bytes": rss,
            "runs": runs,
        });
        println!("{out}");
        return Ok(());
    }
    let name = model.source.path().file_name().map_or_else(
        || model.config.name.clone(),
        |f| f.to_string_lossy().into_owned(),
    );
    println!(
        "| {:<40} | {:>9} | {:>7} | {:>6} | {:>9} | {:>9} | {:>9} | {:>6} |",
        "model", "weights", "threads", "test", "t/s", "min", "max", "GB/s"
    );
    println!(
        "| {:-<40} | {:->9} | {:->7} | {:->6} | {:->9} | {:->9} | {:->9} | {:->6} |",
        "", "", "", "", "", "", "", ""
    );
    let size = format!("{:.1} MiB", bytes / (1u64 << 20) as f64);
    for (test, s, gbs) in [
        (format!("pp{}", a.prompt), pp_s, false),
        (format!("tg{}", a.gen), tg_s, true),
    ] {
        if let Some(s) = s {
            let bw = if gbs {
                format!("{:.1}", s.median * bytes / 1e9)
            } else {
                String::new()
            };
            println!("| {name:<40} | {size:>9} | {threads:>7} | {test:>6} | {:>9.1} | {:>9.1} | {:>9.1} | {bw:>6} |", s.median, s.min, s.max);
        }
    }
    if let (Some(l), Some(f)) = (limit_s, of_limit) {
        println!(
            "\nlimit: a {threads}-thread streaming read of {} MiB, {:.1} GB/s (median; {:.1}-{:.1}) \
             = {:.1} tok/s; generation at {:.0} % of it",
            STREAM_BYTES >> 20,
            l.median,
            l.min,
            l.max,
            l.median * 1e9 / bytes,
            100.0 * f
        );
    }
    match rss {
        Some(b) => println!(
            "\npeak RSS {:.1} MiB; weights read per generated token {size}",
            b as f64 / (1u64 << 20) as f64
        ),
        None => println!(
            "\npeak RSS unknown (no /proc/self/status); weights read per generated token {size}"
        ),
    }
    Ok(())
}
