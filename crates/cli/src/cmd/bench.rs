//! `anelm bench`: prompt-processing and generation speed, as llama.cpp's llama-bench measures
//! them: `pp N` runs an N-token prompt through a fresh state in one forward pass, `tg N` decodes
//! N tokens one at a time from an empty state; each is repeated and reported as median, min and
//! max tokens/s, with the weight bandwidth generation achieves and the process's peak RSS.
//! `-d N` runs both on top of an N-token prompt already in the KV cache, as llama-bench's `-d`:
//! the depth is filled once, untimed, and the cache is cut back to it before every run.
//! Beside generation it measures the limit: a streaming read of a buffer beyond the caches by as
//! many threads, alternated with the runs so that both see the same machine load.

use std::time::Instant;

use std::sync::Arc;

use anelm_cpu::membw::{StreamBuffer, STREAM_BYTES};
use anelm_engine::session::PREFILL_CHUNK;
use anelm_engine::LoadedModel;
use anelm_model::{Executor, KvState, Logits};
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
    /// Prompt tokens in the KV cache before each test (llama-bench's `-d`): filled once,
    /// untimed; pp and tg are measured on top of them.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Streaming reads of a 256 MiB buffer after each generation run: the bandwidth limit
    /// generation is compared with (0 skips them).
    #[arg(long, default_value_t = 3)]
    pub stream_reads: usize,
    /// Also decode this many sequences at once, each step one batched pass over all of them
    /// (comma-separated, e.g. `1,2,4,8`): aggregate tokens/s of `-n` steps, the runs
    /// alternating with the single-stream ones and reported against their median.
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// With --lookup or --draft: measure speculative against plain greedy decoding of `-n`
    /// tokens answering this file's text as a chat message (e.g. a text and "summarise it");
    /// with --json-schema, the question the constrained reply answers.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub speculate: super::speculate::SpeculateArgs,
    /// With --json-schema or --grammar: decoding held to it against plain decoding (runs
    /// alternating; `--prompt-file` gives the question).
    #[command(flatten)]
    pub constrain: super::constrain::ConstrainArgs,
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

/// The KV cache the runs start from: `depth` positions of prompt, filled once (untimed, in
/// prefill chunks) and restored before each run by cutting the cache back to them, as
/// llama-bench restores its saved depth state.
struct Prefix {
    state: Box<dyn KvState>,
    ids: Vec<u32>,
}

impl Prefix {
    fn new(exec: &dyn Executor, depth: usize, capacity: usize, vocab: usize) -> Result<Prefix> {
        Ok(Prefix {
            state: exec.new_state(depth + capacity)?,
            ids: tokens(depth, vocab, 3),
        })
    }

    /// The state at the depth, refilled if it could not be cut back (a recurrent state).
    fn restore(
        &mut self,
        exec: &mut dyn Executor,
        logits: &mut Vec<f32>,
    ) -> Result<&mut dyn KvState> {
        let depth = self.ids.len();
        self.state.truncate(depth);
        if self.state.len() != depth {
            self.state.truncate(0);
            for chunk in self.ids.chunks(PREFILL_CHUNK) {
                exec.forward(self.state.as_mut(), chunk, Logits::None, logits)
                    .with_context(|| format!("filling the KV cache to depth {depth}"))?;
            }
        }
        Ok(self.state.as_mut())
    }

    /// A state with no positions (the warm-up runs), forgetting the depth until the next restore.
    fn empty(&mut self) -> &mut dyn KvState {
        self.state.truncate(0);
        self.state.as_mut()
    }
}

/// The one-line refusal when the depth and the longer test do not fit the model's positions.
fn check_fit(max: usize, depth: usize, prompt: usize, gen: usize) -> Result<()> {
    let need = depth + prompt.max(gen);
    if need <= max {
        return Ok(());
    }
    let test = if prompt >= gen {
        format!("-p {prompt}")
    } else {
        format!("-n {gen}")
    };
    if depth == 0 {
        bail!("the model holds {max} positions; {test} does not fit");
    }
    bail!("the model holds {max} positions; -d {depth} + {test} needs {need}")
}

/// llama-bench's name of a test: `pp512`, `tg128`, with ` @ d2048` at a depth.
fn test_name(kind: &str, n: usize, depth: usize) -> String {
    match depth {
        0 => format!("{kind}{n}"),
        d => format!("{kind}{n} @ d{d}"),
    }
}

/// Seconds of one prompt-processing run: the prompt in one forward pass on top of `state`.
fn prompt_run(
    exec: &mut dyn Executor,
    state: &mut dyn KvState,
    ids: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    let start = Instant::now();
    exec.forward(state, ids, Logits::Last, logits)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds of one generation run on top of `state`: each token is fed alone, as in decoding.
fn gen_run(
    exec: &mut dyn Executor,
    state: &mut dyn KvState,
    ids: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    let start = Instant::now();
    for id in ids {
        exec.forward(state, std::slice::from_ref(id), Logits::Last, logits)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds of one batched generation run: `ids.len() / states.len()` steps, each feeding one
/// token to every state in one batched pass.
fn batch_run(
    exec: &mut dyn Executor,
    states: &mut [Box<dyn KvState>],
    ids: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    states.iter_mut().for_each(|s| s.truncate(0));
    let mut refs: Vec<&mut dyn KvState> = states.iter_mut().map(|s| s.as_mut()).collect();
    let start = Instant::now();
    for step in ids.chunks_exact(refs.len()) {
        exec.forward_batch(&mut refs, step, logits)?;
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

pub fn run(mut a: Args) -> Result<()> {
    if a.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    if a.constrain.enabled() {
        if a.speculate.enabled() {
            bail!("--json-schema/--grammar and --lookup/--draft are separate benchmarks");
        }
        return super::bench_schema::run(
            &a.model,
            &a.constrain,
            a.prompt_file.as_deref(),
            a.gen,
            a.repetitions,
            a.json,
        );
    }
    match (&a.prompt_file, a.speculate.enabled()) {
        (Some(file), true) => {
            return super::bench_spec::run(
                &a.model,
                &a.speculate,
                file,
                a.gen,
                a.repetitions,
                a.json,
            )
        }
        (None, false) => {}
        _ => bail!("--prompt-file and --lookup/--draft go together (a speculative benchmark)"),
    }
    if a.prompt == 0 && a.gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    if let Some(&n) = a
        .batch
        .iter()
        .find(|&&n| n == 0 || n > anelm_cpu::MAX_BATCH)
    {
        bail!(
            "--batch {n}: each batch holds 1 to {} sequences",
            anelm_cpu::MAX_BATCH
        );
    }
    if !a.batch.is_empty() && (a.gen == 0 || a.depth > 0) {
        bail!("--batch measures generation from an empty cache: it needs -n > 0 and -d 0");
    }
    // The weights only: the benchmark feeds token ids, so the tokenizer would only add memory.
    let path = models::resolve(a.model.model.as_deref())?;
    let model =
        Arc::new(anelm_model::load(&path).with_context(|| format!("loading {}", path.display()))?);
    let loaded = LoadedModel {
        model: model.clone(),
        tokenizer: None,
        template_kwargs: Default::default(),
    };
    let max = model.max_positions();
    check_fit(max, a.depth, a.prompt, a.gen)
        .with_context(|| model.source.path().display().to_string())?;
    let longest = a.prompt.max(a.gen).max(1);
    a.model
        .default_decode_batch(a.batch.iter().copied().max().unwrap_or(1));
    let mut exec = a.model.executor(&loaded, a.depth + longest)?;
    // The KV cache's formats (the CPU engine's; the device path keeps its own f16 cache).
    let (cache_k, cache_v) = match a.model.device {
        super::common::Device::Cpu => {
            let (k, v) = a.model.cpu_options(&model)?.cache_types(&model);
            (k.name(), v.name())
        }
        _ => ("f16", "f16"),
    };
    let vocab = exec.vocab_size();
    let mut logits = Vec::new();
    let mut prefix = Prefix::new(exec.as_ref(), a.depth, longest, vocab)?;

    // Warm-up, as llama-bench does: page in the weights, size the buffers.
    if a.prompt > 0 {
        let ids = tokens(a.prompt, vocab, 1);
        prompt_run(exec.as_mut(), prefix.empty(), &ids, &mut logits)
            .context("warm-up prompt run")?;
    }
    if a.gen > 0 {
        gen_run(
            exec.as_mut(),
            prefix.empty(),
            &tokens(1, vocab, 2),
            &mut logits,
        )
        .context("warm-up generation run")?;
    }

    let threads = match a.model.threads {
        0 => anelm_cpu::pool::physical_cores(),
        t => t,
    };
    let (mut pp, mut tg, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    let mut batch_states = Vec::new();
    for &n in &a.batch {
        let mut states = (0..n)
            .map(|_| exec.new_state(a.gen))
            .collect::<Result<Vec<_>, _>>()?;
        // Warm-up: sizes the buffers for this width.
        batch_run(
            exec.as_mut(),
            &mut states,
            &tokens(n, vocab, 4),
            &mut logits,
        )
        .context("warm-up batched run")?;
        batch_states.push((n, states, Vec::new()));
    }
    let (mut stream, mut limit, mut rss) = (None, Vec::new(), None);
    for r in 0..a.repetitions {
        if a.prompt > 0 {
            let ids = tokens(a.prompt, vocab, 10 + r as u64);
            let state = prefix.restore(exec.as_mut(), &mut logits)?;
            let s = prompt_run(exec.as_mut(), state, &ids, &mut logits)?;
            pp.push(a.prompt as f64 / s);
            runs.push(json!({"test": test_name("pp", a.prompt, a.depth), "seconds": s, "tok_s": a.prompt as f64 / s}));
        }
        if a.gen > 0 {
            // The single stream and each batch width, in an order rotating from round to round:
            // of two identical runs back to back the second was 2–4 % slower (2 vCPU EPYC, seven
            // pairs in each order), which a fixed order would charge to the same width each time.
            let widths = batch_states.len() + 1;
            for i in (0..widths).map(|i| (i + r) % widths) {
                if i == 0 {
                    let ids = tokens(a.gen, vocab, 100 + r as u64);
                    let state = prefix.restore(exec.as_mut(), &mut logits)?;
                    let s = gen_run(exec.as_mut(), state, &ids, &mut logits)?;
                    tg.push(a.gen as f64 / s);
                    runs.push(json!({"test": test_name("tg", a.gen, a.depth), "seconds": s, "tok_s": a.gen as f64 / s}));
                    continue;
                }
                let (n, states, rates) = &mut batch_states[i - 1];
                let ids = tokens(a.gen * *n, vocab, 200 + r as u64);
                let s = batch_run(exec.as_mut(), states, &ids, &mut logits)?;
                let tok_s = (a.gen * *n) as f64 / s;
                rates.push(tok_s);
                runs.push(
                    json!({"test": format!("tg{} x{n}", a.gen), "seconds": s, "tok_s": tok_s}),
                );
            }
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
    // Batched decode: aggregate tokens/s per width, and its ratio to the single stream.
    let batched: Vec<(usize, Stats, f64)> = batch_states
        .iter()
        .filter_map(|(n, _, rates)| {
            let st = stats(rates)?;
            let ratio = st.median / tg_s.as_ref()?.median;
            Some((*n, st, ratio))
        })
        .collect();

    if a.json {
        let out = json!({
            "depth": a.depth,
            "context": max,
            "cache_type_k": cache_k,
            "cache_type_v": cache_v,
            "pp_tok_s": pp_s.as_ref().map(|s| s.median),
            "tg_tok_s": tg_s.as_ref().map(|s| s.median),
            "tg_gb_s": tg_gbs,
            "stream_gb_s": limit_gbs,
            "tg_of_limit": of_limit,
            "peak_rss_bytes": rss,
            "batch": batched.iter().map(|(n, st, ratio)| json!({
                "n": n, "tok_s": st.median, "per_stream_tok_s": st.median / *n as f64,
                "of_single_stream": ratio,
            })).collect::<Vec<_>>(),
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
        "| {:<40} | {:>9} | {:>7} | {:>9} | {:>15} | {:>9} | {:>9} | {:>9} | {:>6} |",
        "model", "weights", "threads", "type_k/v", "test", "t/s", "min", "max", "GB/s"
    );
    println!(
        "| {:-<40} | {:->9} | {:->7} | {:->9} | {:->15} | {:->9} | {:->9} | {:->9} | {:->6} |",
        "", "", "", "", "", "", "", "", ""
    );
    let kv = format!("{cache_k}/{cache_v}");
    let size = format!("{:.1} MiB", bytes / (1u64 << 20) as f64);
    for (test, s, gbs) in [
        (test_name("pp", a.prompt, a.depth), pp_s, false),
        (test_name("tg", a.gen, a.depth), tg_s, true),
    ] {
        if let Some(s) = s {
            let bw = if gbs {
                format!("{:.1}", s.median * bytes / 1e9)
            } else {
                String::new()
            };
            println!("| {name:<40} | {size:>9} | {threads:>7} | {kv:>9} | {test:>15} | {:>9.1} | {:>9.1} | {:>9.1} | {bw:>6} |", s.median, s.min, s.max);
        }
    }
    for (n, st, _) in &batched {
        let test = format!("{} x{n}", test_name("tg", a.gen, a.depth));
        println!("| {name:<40} | {size:>9} | {threads:>7} | {kv:>9} | {test:>15} | {:>9.1} | {:>9.1} | {:>9.1} | {:>6} |", st.median, st.min, st.max, "");
    }
    if !batched.is_empty() {
        let ratios: Vec<String> = batched
            .iter()
            .map(|(n, st, ratio)| {
                format!(
                    "x{n} {:.1} tok/s ({:.2}x, {:.1} per stream)",
                    st.median,
                    ratio,
                    st.median / *n as f64
                )
            })
            .collect();
        println!(
            "\nbatched decode, aggregate against the single stream's median (tg, same runs): {}",
            ratios.join("; ")
        );
    }
    if let (Some(l), Some(f)) = (limit_s, of_limit) {
        println!(
            "\nlimit: a {threads}-thread streaming read of {} MiB, {:.1} GB/s (median; {:.1}-{:.1}) \
             = {:.1} tok/s; generation at {:.0} % of it{}",
            STREAM_BYTES >> 20,
            l.median,
            l.min,
            l.max,
            l.median * 1e9 / bytes,
            100.0 * f,
            if a.depth > 0 {
                " (weights only: the KV cache read at depth is not counted)"
            } else {
                ""
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_cpu::CpuExecutor;

    #[test]
    fn fit_allows_exactly_the_context_and_names_the_overflow() {
        assert!(check_fit(8192, 8192 - 512, 512, 128).is_ok());
        assert!(check_fit(8192, 0, 8192, 0).is_ok());
        let e = check_fit(8192, 8000, 512, 128).unwrap_err().to_string();
        assert_eq!(
            e,
            "the model holds 8192 positions; -d 8000 + -p 512 needs 8512"
        );
        let e = check_fit(8192, 8190, 0, 16).unwrap_err().to_string();
        assert_eq!(
            e,
            "the model holds 8192 positions; -d 8190 + -n 16 needs 8206"
        );
        let e = check_fit(8192, 9000, 0, 0).unwrap_err().to_string();
        assert!(e.contains("-d 9000"), "{e}");
        let e = check_fit(64, 0, 65, 1).unwrap_err().to_string();
        assert_eq!(e, "the model holds 64 positions; -p 65 does not fit");
    }

    #[test]
    fn test_names_follow_llama_bench() {
        assert_eq!(test_name("pp", 512, 0), "pp512");
        assert_eq!(test_name("tg", 128, 2048), "tg128 @ d2048");
    }

    /// After any run, restoring gives the depth's state: the next token's logits equal those of
    /// one fresh pass over the depth's prompt and that token. Run on an attention model (the
    /// cache is cut back) and a recurrent one (the cache is refilled).
    #[test]
    fn restore_returns_the_depth_prompt_state() {
        for arch in ["llama", "qwen3_next"] {
            let model = Arc::new(anelm_model::load(&anelm_testkit::tiny(arch)).unwrap());
            let mut exec = CpuExecutor::new(model, 1);
            let vocab = exec.vocab_size();
            let depth = PREFILL_CHUNK + 3; // more than one fill chunk
            let mut prefix = Prefix::new(&exec, depth, 8, vocab).unwrap();
            let mut logits = Vec::new();
            let next = tokens(1, vocab, 7);

            let mut whole = prefix.ids.clone();
            whole.extend(&next);
            let mut fresh = exec.new_state(whole.len()).unwrap();
            let mut want = Vec::new();
            exec.forward(fresh.as_mut(), &whole, Logits::Last, &mut want)
                .unwrap();

            for round in 0..2 {
                let state = prefix.restore(&mut exec, &mut logits).unwrap();
                assert_eq!(state.len(), depth, "{arch} round {round}");
                gen_run(&mut exec, state, &next, &mut logits).unwrap();
                let err = logits
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(err < 1e-3, "{arch} round {round}: logits differ by {err}");
                // Leave more than the depth behind for the next restore to cut back.
                let more = tokens(5, vocab, 9 + round as u64);
                gen_run(&mut exec, state, &more, &mut logits).unwrap();
                assert_eq!(state.len(), depth + 6);
            }
            assert_eq!(prefix.empty().len(), 0);
        }
    }
}
