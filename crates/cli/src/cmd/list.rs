//! `anelm list`: the models in the Hugging Face cache, Ollama's store and anelm's directory.

use anelm_hub::inventory::list;
use anelm_hub::Settings;
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// One JSON array (name, path, size, format, quant, store) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `bytes` as people read sizes (1000-based, as `huggingface-cli scan-cache` and `ollama list`).
fn human(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

pub fn run(a: Args) -> Result<()> {
    let entries = list(&Settings::from_env(), true);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    if entries.is_empty() {
        let s = Settings::from_env();
        eprintln!(
            "no models in {}, {} or {}",
            s.hf_cache.display(),
            s.ollama_root.display(),
            s.anelm_models.display()
        );
        return Ok(());
    }
    let width = entries
        .iter()
        .map(|e| e.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:width$}  {:>9}  {:11}  {:10}  STORE",
        "NAME", "SIZE", "FORMAT", "QUANT"
    );
    for e in &entries {
        println!(
            "{:width$}  {:>9}  {:11}  {:10}  {}",
            e.name,
            human(e.size),
            e.format,
            e.quant.as_deref().unwrap_or("-"),
            e.store.name()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(super::human(999), "999 B");
        assert_eq!(super::human(868_192), "868.2 kB");
        assert_eq!(super::human(4_920_000_000), "4.9 GB");
    }
}
