//! The KV cache formats on the two real models: with each of f16, q8_0 and q4_0 keys and values,
//! a prompt decoded token by token, a prefix reused after truncation and a batched step give
//! the bits of one prefill (past 512 positions, where attention reads its parts tile by tile);
//! q8_0 changes the logits much less than q4_0; a model whose head dimension is
//! not a whole number of blocks is refused with the reason. Gemma 3's sliding-window layers keep
//! their window and one pass in fixed memory and give the bits of a cache that keeps everything.
//! A state that copies another's prefix continues with the bits of one that computed it.

use std::sync::Arc;

use anelm_cpu::{CpuExecutor, CpuKv, CpuOptions, KvDtype, MAX_BATCH};
use anelm_model::{Executor, KvState, Logits};
use anelm_testkit::{any_tiny, model, tiny, EVERY_LAYER_KIND, GEMMA3, SMOLLM2};

use anelm_testkit::token_ids as ids;

fn exec(m: &Arc<anelm_model::Model>, t: KvDtype) -> CpuExecutor {
    let opts = CpuOptions {
        threads: 2,
        cache_k: Some(t),
        cache_v: Some(t),
        ..CpuOptions::default()
    };
    CpuExecutor::with_options(m.clone(), opts)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The last-row logits of `tokens` in one prefill, checked against decoding the last `tail`
/// tokens one at a time, against a truncated state continued, and against a batched step.
fn check(file: &str, n: usize) {
    let m = Arc::new(anelm_model::load(&model(file)).unwrap());
    let mut out = Vec::new();
    for t in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        let mut e = exec(&m, t);
        let vocab = e.vocab_size();
        let tokens = ids(n, vocab, 5);
        let tail = 3;
        let mut whole = Vec::new();
        let mut s = e.new_state(n + 8).unwrap();
        e.forward(s.as_mut(), &tokens, Logits::Last, &mut whole)
            .unwrap();

        let mut stepped = e.new_state(n + 8).unwrap();
        let mut got = Vec::new();
        e.forward(
            stepped.as_mut(),
            &tokens[..n - tail],
            Logits::None,
            &mut got,
        )
        .unwrap();
        for id in &tokens[n - tail..] {
            e.forward(
                stepped.as_mut(),
                std::slice::from_ref(id),
                Logits::Last,
                &mut got,
            )
            .unwrap();
        }
        assert!(
            same_bits(&got, &whole),
            "{file} {t}: decode differs from prefill"
        );

        // Prefix reuse: the whole prompt's state cut back and the tail fed again — a few
        // tokens, the most a pass takes with decode attention (16), and one more (prefill's).
        for back in [tail, 16, 17] {
            s.truncate(n - back);
            assert_eq!(s.len(), n - back);
            e.forward(s.as_mut(), &tokens[n - back..], Logits::Last, &mut got)
                .unwrap();
            assert!(
                same_bits(&got, &whole),
                "{file} {t}: truncated by {back}, the state differs"
            );
        }

        // A batched step of two sequences: each gets its own step's bits.
        let (mut a, mut b) = (e.new_state(n + 8).unwrap(), e.new_state(n + 8).unwrap());
        let mut rows = Vec::new();
        e.forward(a.as_mut(), &tokens[..n - 1], Logits::None, &mut rows)
            .unwrap();
        e.forward(b.as_mut(), &tokens[..20], Logits::None, &mut rows)
            .unwrap();
        let mut solo_b = Vec::new();
        let mut b2 = e.new_state(n + 8).unwrap();
        e.forward(b2.as_mut(), &tokens[..21], Logits::Last, &mut solo_b)
            .unwrap();
        let mut states: Vec<&mut dyn KvState> = vec![a.as_mut(), b.as_mut()];
        e.forward_batch(&mut states, &[tokens[n - 1], tokens[20]], &mut rows)
            .unwrap();
        assert!(
            same_bits(&rows[..vocab], &whole),
            "{file} {t}: batched row 0"
        );
        assert!(
            same_bits(&rows[vocab..], &solo_b),
            "{file} {t}: batched row 1"
        );
        out.push((t, whole));
    }
    // The formats are used, and q8_0 stays much nearer f16 than q4_0 does (largest logit
    // difference on these random prompts, measured: SmolLM2 0.52 vs 3.46, Gemma 3 1.99 vs 9.00).
    let f16 = &out[0].1;
    let dist = |x: &[f32]| {
        x.iter()
            .zip(f16)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    };
    let (d8, d4) = (dist(&out[1].1), dist(&out[2].1));
    println!("{file}: max |logit - f16| q8_0 {d8:.4}, q4_0 {d4:.4}");
    assert!(d8 > 0.0 && d8 < 0.5 * d4, "{file}: q8_0 {d8} vs q4_0 {d4}");
}

#[test]
fn smollm2_caches_decode_reuse_and_batch_as_prefill() {
    check(SMOLLM2, 600);
}

#[test]
fn gemma3_caches_decode_reuse_and_batch_as_prefill_past_its_window() {
    // Past the 512-position sliding window of its local layers.
    check(GEMMA3, 700);
}

#[test]
fn gemma3_windowed_layers_keep_their_window_and_give_the_bits_of_a_full_cache() {
    let m = Arc::new(anelm_model::load(&model(GEMMA3)).unwrap());
    let windows: Vec<Option<usize>> = m
        .layers
        .iter()
        .map(|l| l.attention().and_then(|a| a.window))
        .collect();
    assert!(windows.iter().filter(|w| w.is_some()).count() > 10);
    let new_exec = |swa_full| {
        let opts = CpuOptions {
            threads: 2,
            swa_full,
            ..CpuOptions::default()
        };
        CpuExecutor::with_options(m.clone(), opts)
    };
    let (mut full, mut win) = (new_exec(true), new_exec(false));
    // Prefill chunks of 512 and a decode that both move the windows on (past 1151 and 1535).
    let n = 1700;
    let (capacity, fed) = (n + 8, 1300);
    let tokens = ids(n, full.vocab_size(), 9);
    let mut want = Vec::new();
    let mut f = full.new_state(capacity).unwrap();
    full.forward(f.as_mut(), &tokens, Logits::Last, &mut want)
        .unwrap();

    let mut got = Vec::new();
    let mut w = win.new_state(capacity).unwrap();
    win.forward(w.as_mut(), &tokens, Logits::Last, &mut got)
        .unwrap();
    assert!(same_bits(&got, &want), "windowed prefill");
    let kv = w.as_any_mut().downcast_mut::<CpuKv>().unwrap();
    for (l, win) in windows.iter().enumerate() {
        // The window, 128 positions to go back to, a pass.
        let held = win.map_or(capacity, |w| w - 1 + 128 + MAX_BATCH);
        assert_eq!(kv.layer_slots(l), held, "layer {l}");
    }

    // Back within the last pass: kept, and the tail fed again gives the same bits.
    w.truncate(n - 3);
    assert_eq!(w.len(), n - 3);
    win.forward(w.as_mut(), &tokens[n - 3..], Logits::Last, &mut got)
        .unwrap();
    assert!(
        same_bits(&got, &want),
        "windowed state truncated and continued"
    );
    // Further back than the windows reach: the windowed state starts over, the full one keeps.
    w.truncate(100);
    assert_eq!(w.len(), 0);
    f.truncate(100);
    assert_eq!(f.len(), 100);

    let mut d = win.new_state(capacity).unwrap();
    win.forward(d.as_mut(), &tokens[..fed], Logits::None, &mut got)
        .unwrap();
    for id in &tokens[fed..] {
        win.forward(d.as_mut(), std::slice::from_ref(id), Logits::Last, &mut got)
            .unwrap();
    }
    assert!(same_bits(&got, &want), "windowed decode");
}

#[test]
fn heads_that_are_not_whole_blocks_are_refused() {
    let m = Arc::new(anelm_model::load(&tiny("llama")).unwrap());
    let e = exec(&m, KvDtype::Q8_0);
    let err = e.new_state(16).err().expect("head_dim 16 cannot hold q8_0");
    assert!(
        err.to_string().contains("16 dimensions") && err.to_string().contains("q8_0"),
        "{err}"
    );
    assert!(exec(&m, KvDtype::F16).new_state(16).is_ok());
}

// A state that takes another state's prefix by copy (`KvState::copy_prefix`, how the server
// shares a system prompt between concurrent requests) continues with the bits of one that
// computed it; states of another model, other formats or a window that moved on are refused,
// unchanged, and a recurrent state is copied only whole.

/// `src` holds `tokens[..held]`; a new state copies `len` of them and is fed the rest of
/// `tokens`: its last logits must be `whole`'s. Returns whether the copy was taken.
fn copy_and_continue(
    e: &mut CpuExecutor,
    tokens: &[u32],
    held: usize,
    len: usize,
    whole: &[f32],
    what: &str,
) -> bool {
    let cap = tokens.len() + 4;
    let mut src = e.new_state(cap).unwrap();
    let mut out = Vec::new();
    e.forward(src.as_mut(), &tokens[..held], Logits::None, &mut out)
        .unwrap();
    // Another capacity than the source's: each head's positions are elsewhere in it.
    let mut dst = e.new_state(cap + 37).unwrap();
    if !dst.copy_prefix(src.as_mut(), len) {
        assert_eq!(dst.len(), 0, "{what}: a refused copy changes nothing");
        return false;
    }
    assert_eq!((dst.len(), src.len()), (len, held), "{what}");
    e.forward(dst.as_mut(), &tokens[len..], Logits::Last, &mut out)
        .unwrap();
    assert!(
        same_bits(&out, whole),
        "{what}: the copy's continuation differs"
    );
    true
}

#[test]
fn a_copied_prefix_continues_with_the_bits_of_a_computed_one_on_the_real_models() {
    for (file, n) in [(SMOLLM2, 300), (GEMMA3, 600)] {
        let m = Arc::new(anelm_model::load(&model(file)).unwrap());
        for t in [KvDtype::F16, KvDtype::Q8_0] {
            let mut e = exec(&m, t);
            let tokens = ids(n, e.vocab_size(), 11);
            let mut whole = Vec::new();
            let mut s = e.new_state(n + 4).unwrap();
            e.forward(s.as_mut(), &tokens, Logits::Last, &mut whole)
                .unwrap();
            for (held, len) in [(n - 1, n - 1), (n - 10, n - 40), (n / 2, 7)] {
                let what = format!("{file} {t}: {len} of {held}");
                assert!(copy_and_continue(&mut e, &tokens, held, len, &whole, &what));
            }
            // Refused: keys of another format, and a state of another executor.
            let mut src = e.new_state(n).unwrap();
            let mut out = Vec::new();
            e.forward(src.as_mut(), &tokens[..20], Logits::None, &mut out)
                .unwrap();
            let other = if t == KvDtype::F16 {
                KvDtype::Q8_0
            } else {
                KvDtype::F16
            };
            let mut dst = exec(&m, other).new_state(n).unwrap();
            assert!(!dst.copy_prefix(src.as_mut(), 10), "{file} {t}: formats");
            let m2 = Arc::new(anelm_model::load(&model(file)).unwrap());
            let mut dst = exec(&m2, t).new_state(n).unwrap();
            assert!(
                !dst.copy_prefix(src.as_mut(), 10),
                "{file} {t}: another executor"
            );
            assert_eq!(dst.len(), 0);
        }
    }
}

#[test]
fn gemma3_refuses_a_prefix_whose_window_moved_on() {
    let m = Arc::new(anelm_model::load(&model(GEMMA3)).unwrap());
    let mut e = exec(&m, KvDtype::F16);
    // Long enough that the windowed layers' memory (window, 128 back and a pass) moved on.
    let n = 1800;
    let tokens = ids(n, e.vocab_size(), 3);
    let mut src = e.new_state(n + 4).unwrap();
    let mut out = Vec::new();
    for chunk in tokens.chunks(256) {
        e.forward(src.as_mut(), chunk, Logits::None, &mut out)
            .unwrap();
    }
    let mut dst = e.new_state(n + 4).unwrap();
    assert!(!dst.copy_prefix(src.as_mut(), 100));
    assert_eq!(dst.len(), 0);
}

#[test]
fn tiny_models_copy_prefixes_and_recurrent_states_only_whole() {
    for arch in EVERY_LAYER_KIND {
        let m =
            Arc::new(anelm_model::load(&any_tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}")));
        let mut e = CpuExecutor::new(m, 2);
        let tokens = ids(40, e.vocab_size(), 5);
        let mut whole = Vec::new();
        let mut s = e.new_state(48).unwrap();
        e.forward(s.as_mut(), &tokens, Logits::Last, &mut whole)
            .unwrap();
        assert!(
            copy_and_continue(&mut e, &tokens, 30, 30, &whole, arch),
            "{arch}: a whole state is copied"
        );
        let recurrent = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "lfm2"].contains(&arch);
        let part = copy_and_continue(&mut e, &tokens, 30, 17, &whole, arch);
        assert_eq!(part, !recurrent, "{arch}: a part of a state");
    }
}
