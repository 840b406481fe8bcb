//! Hidden states (what embeddings pool): the CPU engine's final-normed hidden state of every
//! token, checked through the head — each row times the output matrix gives the logits the
//! same pass gives (and those match transformers, `tests/hf_tiny.rs`) — in one chunk and across
//! chunks, on a fresh state and continuing one.

use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, Logits};
use anelm_testkit::{ids, shared_json, tiny};

#[test]
fn hidden_states_times_the_head_are_the_logits() {
    for arch in ["llama", "gemma3", "qwen3_next"] {
        let m = std::sync::Arc::new(anelm_model::load(&tiny(arch)).unwrap());
        let reference = shared_json(&format!("fixtures/hf-tiny/{arch}/reference.json"));
        let prompt = ids(&reference["cases"]["long"]["input_ids"]);
        let (h, vocab) = (m.config.hidden_size, m.config.vocab_size);
        let mut exec = CpuExecutor::new(m.clone(), 1);
        let mut hidden = Vec::new();
        let mut s = exec.new_state(prompt.len() + 4).unwrap();
        exec.hidden_states(s.as_mut(), &prompt, &mut hidden)
            .unwrap();
        assert_eq!(
            (hidden.len(), s.len()),
            (prompt.len() * h, prompt.len()),
            "{arch}"
        );
        let mut logits = Vec::new();
        let mut s2 = exec.new_state(prompt.len() + 4).unwrap();
        exec.forward(s2.as_mut(), &prompt, Logits::All, &mut logits)
            .unwrap();
        let mut row = vec![0f32; h];
        for t in [0, prompt.len() / 2, prompt.len() - 1] {
            let x = &hidden[t * h..(t + 1) * h];
            let want = &logits[t * vocab..(t + 1) * vocab];
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for v in (0..vocab).step_by(vocab / 37 + 1) {
                m.lm_head.dequantize_row(v, &mut row).unwrap();
                let mut got: f32 = row.iter().zip(x).map(|(w, x)| w * x).sum();
                if let Some(cap) = m.final_softcap {
                    got = cap * (got / cap).tanh();
                }
                assert!(
                    (got - want[v]).abs() <= 2e-3 * scale.max(1.0),
                    "{arch} token {t} logit {v}: {got} vs {}",
                    want[v]
                );
            }
        }
        // Continuing the state: the next token's hidden state is the same as in one pass.
        let mut more = Vec::new();
        exec.hidden_states(s.as_mut(), &[7], &mut more).unwrap();
        let mut s3 = exec.new_state(prompt.len() + 4).unwrap();
        let mut all = Vec::new();
        let mut whole = prompt.clone();
        whole.push(7);
        exec.hidden_states(s3.as_mut(), &whole, &mut all).unwrap();
        let last = &all[prompt.len() * h..];
        let diff = more
            .iter()
            .zip(last)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(diff < 1e-3, "{arch}: continued vs whole differ by {diff}");
    }
}
