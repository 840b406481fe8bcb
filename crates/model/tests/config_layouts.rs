//! A transformers 4.x config.json (top-level rope_theta / rope_scaling / rope_local_base_freq,
//! sliding_window_pattern, torch_dtype, multimodal text_config nesting) must give the same plan
//! as the 5.x config the fixtures were saved with.

use anelm_model::Model;
use anelm_testkit::tiny as fixture;
use serde_json::{json, Value};

/// A copy of the fixture directory with `config.json` replaced.
fn with_config(arch: &str, cfg: &Value) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture(arch).join("model.safetensors"),
        d.path().join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    d
}

fn config(arch: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("config.json")).unwrap())
        .unwrap()
}

fn assert_same_plan(a: &Model, b: &Model) {
    assert_eq!(a.layers.len(), b.layers.len());
    for (i, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        let (p, q) = (x.attention().unwrap(), y.attention().unwrap());
        assert_eq!(p.window, q.window, "layer {i} window");
        assert_eq!(p.scale, q.scale, "layer {i} scale");
        assert_eq!(p.softcap, q.softcap, "layer {i} softcap");
        let (rp, rq) = (p.rope.as_ref().unwrap(), q.rope.as_ref().unwrap());
        assert_eq!(rp.inv_freq, rq.inv_freq, "layer {i} rope");
        assert_eq!(x.attn_norm.weight, y.attn_norm.weight, "layer {i} norm");
    }
    assert_eq!(a.embed_scale, b.embed_scale);
    assert_eq!(a.final_softcap, b.final_softcap);
}

#[test]
fn gemma3_4x_config_gives_the_5x_plan() {
    let v5 = config("gemma3");
    let mut v4 = v5.clone();
    let o = v4.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.remove("layer_types");
    o.remove("_sliding_window_pattern");
    o.remove("dtype");
    o.insert("rope_theta".into(), json!(1_000_000.0));
    o.insert("rope_local_base_freq".into(), json!(10_000.0));
    o.insert("sliding_window_pattern".into(), json!(6));
    o.insert("torch_dtype".into(), json!("float32"));
    let a = anelm_model::load(&fixture("gemma3")).unwrap();
    let d = with_config("gemma3", &v4);
    let b = anelm_model::load(d.path()).unwrap();
    assert_same_plan(&a, &b);
    // The pattern matters: layer 5 is global, with the global RoPE base.
    assert_eq!(b.layers[5].attention().unwrap().window, None);
    assert_eq!(b.layers[4].attention().unwrap().window, Some(32));
    assert_ne!(
        b.layers[5]
            .attention()
            .unwrap()
            .rope
            .as_ref()
            .unwrap()
            .inv_freq,
        b.layers[4]
            .attention()
            .unwrap()
            .rope
            .as_ref()
            .unwrap()
            .inv_freq
    );
}

#[test]
fn gemma2_and_llama_4x_configs_give_the_5x_plans() {
    for arch in ["gemma2", "llama", "qwen3", "mistral"] {
        let v5 = config(arch);
        let mut v4 = v5.clone();
        let o = v4.as_object_mut().unwrap();
        let theta = o["rope_parameters"]["rope_theta"].clone();
        o.remove("rope_parameters");
        o.remove("layer_types");
        o.insert("rope_theta".into(), theta);
        let a = anelm_model::load(&fixture(arch)).unwrap();
        let d = with_config(arch, &v4);
        let b = anelm_model::load(d.path()).unwrap();
        assert_same_plan(&a, &b);
    }
}

#[test]
fn multimodal_text_config_is_read() {
    let inner = config("gemma3");
    let wrapped = json!({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": inner});
    let d = with_config("gemma3", &wrapped);
    let b = anelm_model::load(d.path()).unwrap();
    assert_same_plan(&anelm_model::load(&fixture("gemma3")).unwrap(), &b);
}

#[test]
fn multimodal_checkpoint_tensor_names_are_read() {
    // Rename every `model.` tensor to `model.language_model.` as Gemma3ForConditionalGeneration saves them.
    let src = fixture("gemma3");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n.replacen("model.", "model.language_model.", 1), v))
        .collect();
    let d = tempfile::tempdir().unwrap();
    safetensors::serialize_to_file(renamed, None, &d.path().join("model.safetensors")).unwrap();
    let wrapped = json!({"model_type": "gemma3", "text_config": config("gemma3")});
    std::fs::write(d.path().join("config.json"), wrapped.to_string()).unwrap();
    let b = anelm_model::load(d.path()).unwrap();
    assert_same_plan(&anelm_model::load(&src).unwrap(), &b);
}
