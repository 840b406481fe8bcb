//! Which files of a repository make the model: the safetensors set, or the GGUF file that
//! `:QUANT` / `:file.gguf` picks (matched as llama.cpp's `-hf` matches, case-insensitively).

use crate::{HubError, Pick, Result};

/// The quantisation llama.cpp's `-hf` takes when a GGUF repository is named without one.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// Weight formats other than ours: never downloaded.
const OTHER_WEIGHTS: [&str; 12] = [
    ".bin",
    ".pt",
    ".pth",
    ".h5",
    ".msgpack",
    ".onnx",
    ".onnx_data",
    ".ot",
    ".tflite",
    ".ckpt",
    ".npz",
    ".mlmodel",
];

fn lower(s: &str) -> String {
    s.to_ascii_lowercase()
}

fn is_gguf(f: &str) -> bool {
    lower(f).ends_with(".gguf") && !lower(f).contains("mmproj")
}

/// Whether `file`'s name holds `quant` as a whole word: `model.Q4_K_M.gguf` and
/// `m-q4_k_m-00001-of-00002.gguf` hold Q4_K_M, `model-Q4_K_M.gguf` does not hold Q4_K.
pub fn holds_quant(file: &str, quant: &str) -> bool {
    let name = lower(file.rsplit('/').next().unwrap_or(file));
    let q = lower(quant);
    let mut from = 0;
    while let Some(i) = name[from..].find(&q) {
        let (s, e) = (from + i, from + i + q.len());
        let before = name[..s].chars().last();
        let after = name[e..].chars().next();
        let sep = |c: Option<char>| matches!(c, None | Some('-' | '.' | '/'));
        if sep(before) && sep(after) {
            return true;
        }
        from = s + 1;
    }
    false
}

/// Whether `f` is one part of a split GGUF (`-00001-of-00003.gguf`).
fn split_part(f: &str) -> Option<(String, u32)> {
    let l = lower(f);
    let stem = l.strip_suffix(".gguf")?;
    let (head, total) = stem.rsplit_once("-of-")?;
    let (prefix, part) = head.rsplit_once('-')?;
    if part.len() == 5
        && total.len() == 5
        && part
            .bytes()
            .chain(total.bytes())
            .all(|b| b.is_ascii_digit())
    {
        Some((prefix.to_string(), part.parse().ok()?))
    } else {
        None
    }
}

/// The GGUF files `pick` names among `files` (a split model gives all its parts, in order).
pub fn pick_gguf(files: &[String], pick: Option<&Pick>, what: &str) -> Result<Vec<String>> {
    let ggufs: Vec<&String> = files.iter().filter(|f| is_gguf(f)).collect();
    let listing = || {
        let mut names: Vec<&str> = ggufs.iter().map(|s| s.as_str()).collect();
        names.sort();
        if names.is_empty() {
            "it has no GGUF file".to_string()
        } else {
            format!("it has {}", names.join(", "))
        }
    };
    let matched: Vec<&String> = match pick {
        Some(Pick::File(name)) => {
            let found = files
                .iter()
                .find(|f| *f == name)
                .or_else(|| files.iter().find(|f| lower(f) == lower(name)));
            match found {
                Some(f) => return Ok(vec![f.clone()]),
                None => {
                    return Err(HubError::NotFound(format!(
                        "{what} has no file {name}; {}",
                        listing()
                    )))
                }
            }
        }
        Some(Pick::Quant(q)) => ggufs
            .iter()
            .copied()
            .filter(|f| holds_quant(f, q))
            .collect(),
        None => {
            let d: Vec<&String> = ggufs
                .iter()
                .copied()
                .filter(|f| holds_quant(f, DEFAULT_QUANT))
                .collect();
            if d.is_empty() {
                ggufs.clone()
            } else {
                d
            }
        }
    };
    let Some(first) = matched.iter().min_by_key(|f| (f.len(), f.as_str())) else {
        let q = pick.map(|p| p.to_string()).unwrap_or_default();
        return Err(HubError::NotFound(format!(
            "{what} has no GGUF file for {q}; {}",
            listing()
        )));
    };
    // A split model: every part of the first match's set, in part order.
    if let Some((prefix, _)) = split_part(first) {
        let mut parts: Vec<(u32, String)> = files
            .iter()
            .filter_map(|f| {
                split_part(f)
                    .filter(|(p, _)| *p == prefix)
                    .map(|(_, n)| (n, f.clone()))
            })
            .collect();
        parts.sort();
        return Ok(parts.into_iter().map(|(_, f)| f).collect());
    }
    Ok(vec![(*first).clone()])
}

/// Whether the repository's files are a safetensors model.
pub fn has_safetensors(files: &[String]) -> bool {
    files
        .iter()
        .any(|f| !f.contains('/') && lower(f).ends_with(".safetensors"))
}

/// The files to fetch for a safetensors model: the top-level files, less other weight formats,
/// GGUF copies and pictures. `config.json` comes last, so that a snapshot holding it is whole.
pub fn safetensors_set(files: &[String]) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .filter(|f| !f.contains('/') && !f.starts_with('.'))
        .filter(|f| {
            let l = lower(f);
            !l.ends_with(".gguf")
                && !OTHER_WEIGHTS.iter().any(|x| l.ends_with(x))
                && ![".png", ".jpg", ".jpeg", ".gif", ".webp"]
                    .iter()
                    .any(|x| l.ends_with(x))
        })
        .cloned()
        .collect();
    out.sort_by_key(|f| (f == "config.json", f.clone()));
    out
}

/// The files of a repository that make the model `pick` names.
pub fn select(files: &[String], pick: Option<&Pick>, what: &str) -> Result<Vec<String>> {
    if pick.is_some() || !has_safetensors(files) {
        if pick.is_none() && !files.iter().any(|f| is_gguf(f)) {
            return Err(HubError::NotFound(format!(
                "{what} holds neither safetensors weights nor a GGUF file"
            )));
        }
        return pick_gguf(files, pick, what);
    }
    let set = safetensors_set(files);
    if !set.iter().any(|f| f == "config.json") {
        return Err(HubError::NotFound(format!(
            "{what} has safetensors weights but no config.json"
        )));
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn quants_match_as_whole_words_case_insensitively() {
        assert!(holds_quant("SmolLM2-135M-Instruct-Q4_K_M.gguf", "q4_k_m"));
        assert!(holds_quant("model.Q8_0.gguf", "Q8_0"));
        assert!(!holds_quant("model-Q4_K_M.gguf", "Q4_K"));
        assert!(!holds_quant("model-IQ4_XS.gguf", "Q4_XS"));
    }

    #[test]
    fn a_gguf_repository_gives_the_picked_file() {
        let files = v(&[
            "README.md",
            "m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "m-Q4_K_M-imat.gguf",
            "mmproj-m-f16.gguf",
        ]);
        let q = |s: &str| Pick::Quant(s.into());
        assert_eq!(
            select(&files, Some(&q("q8_0")), "r").unwrap(),
            v(&["m-Q8_0.gguf"])
        );
        assert_eq!(
            select(&files, Some(&q("Q4_K_M")), "r").unwrap(),
            v(&["m-Q4_K_M.gguf"])
        );
        assert_eq!(select(&files, None, "r").unwrap(), v(&["m-Q4_K_M.gguf"]));
        assert_eq!(
            select(&files, Some(&Pick::File("M-Q8_0.GGUF".into())), "r").unwrap(),
            v(&["m-Q8_0.gguf"])
        );
        let e = select(&files, Some(&q("Q2_K")), "org/r")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("org/r has no GGUF file for Q2_K") && e.contains("m-Q8_0.gguf"),
            "{e}"
        );
    }

    #[test]
    fn split_ggufs_come_whole_and_in_order() {
        let files = v(&[
            "x-Q4_0-00002-of-00002.gguf",
            "x-Q4_0-00001-of-00002.gguf",
            "x-Q8_0.gguf",
        ]);
        assert_eq!(
            select(&files, Some(&Pick::Quant("Q4_0".into())), "r").unwrap(),
            v(&["x-Q4_0-00001-of-00002.gguf", "x-Q4_0-00002-of-00002.gguf"])
        );
    }

    #[test]
    fn a_safetensors_repository_gives_its_model_files_config_last() {
        let files = v(&[
            ".gitattributes",
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "pytorch_model.bin",
            "onnx/model.onnx",
            "logo.png",
            "m.Q4_0.gguf",
        ]);
        assert_eq!(
            select(&files, None, "r").unwrap(),
            v(&["model.safetensors", "tokenizer.json", "config.json"])
        );
        assert!(select(&v(&["README.md"]), None, "org/r")
            .unwrap_err()
            .to_string()
            .contains("neither"));
    }
}
