//! A state that takes another state's prefix by copy (`KvState::copy_prefix`, how the server
//! shares a system prompt between concurrent requests) continues with the bits of one that
//! computed it: on the two real models with f16 and q8_0 caches (Gemma 3 past its 512-position
//! sliding window), and on tiny models of every layer kind, where a recurrent state is copied
//! only whole. States of another model, other formats or a window that moved on are refused,
//! unchanged.

use std::sync::Arc;

use anelm_cpu::{CpuExecutor, CpuOptions, KvDtype};
use anelm_model::{Executor, Logits};
use anelm_testkit::{any_tiny, model, token_ids as ids, EVERY_LAYER_KIND, GEMMA3, SMOLLM2};

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
    let mut dst = e.new_state(cap).unwrap();
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
