//! What the private path hands the framework and writes to disk before compiling (FACTS §2 end,
//! §3.3): the weights dictionary (key = the exact `BLOBFILE` path string of the MIL text, value
//! `{offset: 0, data: <whole file>}`), and the staging directory
//! `NSTemporaryDirectory()/<hexStringIdentifier>` holding `model.mil` and every weight file at
//! its key minus `@model_path/`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::error::{MacError, Result};

/// What `@model_path` stands for in the MIL text: the staging directory.
pub const MODEL_PATH_PREFIX: &str = "@model_path/";
/// The MIL text's file name in the staging directory.
pub const MIL_FILE: &str = "model.mil";
/// The inner keys of a weights-dictionary value (FACTS §2: every project).
pub const WEIGHT_OFFSET_KEY: &str = "offset";
pub const WEIGHT_DATA_KEY: &str = "data";
/// The `offset` value every project passes except one; no report says it matters.
pub const WEIGHT_OFFSET: i64 = 0;

/// One program as the private path takes it.
#[derive(Clone, Copy, Debug)]
pub struct ModelFiles<'a> {
    /// The unit's name, for the files saved next to the staged program (`saved.rs`).
    pub name: &'a str,
    /// MIL text (dialect A or B, FACTS §1.1); passed as UTF-8 `NSData` (FACTS §3.2, ORI #9).
    pub mil_text: &'a str,
    /// Weight blob files: (`@model_path/weights/w.bin`, storage-v2 bytes).
    pub weights: &'a [(&'a str, &'a [u8])],
}

/// The `BLOBFILE` paths the MIL text names, in order of first use (both dialects: the path is
/// the first string literal after `BLOBFILE(`).
pub fn blobfile_paths(mil_text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for (at, _) in mil_text.match_indices("BLOBFILE(") {
        let rest = &mil_text[at..];
        let path = rest
            .split_once('"')
            .and_then(|(_, tail)| tail.split_once('"'))
            .map(|(p, _)| p);
        if let Some(p) = path.filter(|p| !out.contains(p)) {
            out.push(p);
        }
    }
    out
}

/// Checks the weights against the MIL text: every key under `@model_path/`, a relative path
/// without `..`, named once, and the set of keys equal to the set of `BLOBFILE` paths.
pub fn check(files: &ModelFiles) -> Result<()> {
    let mut keys = BTreeSet::new();
    for (key, _) in files.weights {
        relative_path(key)?;
        if !keys.insert(*key) {
            return Err(MacError::Invalid(format!(
                "weight file {key} is given twice"
            )));
        }
    }
    let named: BTreeSet<&str> = blobfile_paths(files.mil_text).into_iter().collect();
    if let Some(missing) = named.difference(&keys).next() {
        return Err(MacError::Invalid(format!(
            "the MIL text names {missing}, which no weight file provides"
        )));
    }
    if let Some(unused) = keys.difference(&named).next() {
        return Err(MacError::Invalid(format!(
            "weight file {unused} is not named by the MIL text"
        )));
    }
    Ok(())
}

/// The path of weight key `key` relative to the staging directory.
pub fn relative_path(key: &str) -> Result<PathBuf> {
    let rel = key.strip_prefix(MODEL_PATH_PREFIX).ok_or_else(|| {
        MacError::Invalid(format!(
            "weight path {key} does not start with {MODEL_PATH_PREFIX}"
        ))
    })?;
    let p = Path::new(rel);
    if rel.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(MacError::Invalid(format!("weight path {key} must name a file below {MODEL_PATH_PREFIX} (no '..', no absolute path)")));
    }
    Ok(p.to_path_buf())
}

/// `tmp/<hex>`: where the framework looks for the model's files (FACTS §3.3). The identifier
/// comes from the framework; it must be one plain path component.
pub fn staging_dir(tmp: &Path, hex: &str) -> Result<PathBuf> {
    if hex.is_empty()
        || !hex
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(MacError::Invalid(format!(
            "hexStringIdentifier {hex:?} is not a plain identifier"
        )));
    }
    Ok(tmp.join(hex))
}

/// Writes `model.mil` and every weight file into `dir` (FACTS §3.3: every project does this
/// itself, since the framework writes the inner dictionary's first value to a file named after
/// its key).
pub fn stage(dir: &Path, files: &ModelFiles) -> Result<()> {
    check(files)?;
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MacError::Staging { path, source }
    };
    std::fs::create_dir_all(dir).map_err(fail(dir))?;
    let mil = dir.join(MIL_FILE);
    std::fs::write(&mil, files.mil_text).map_err(fail(&mil))?;
    for (key, bytes) in files.weights {
        let path = dir.join(relative_path(key)?);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(fail(parent))?;
        }
        std::fs::write(&path, bytes).map_err(fail(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT_A: &str = r#"tensor<fp16, [4, 4, 1, 1]> W = const()[name = string("W"), val = tensor<fp16, [4, 4, 1, 1]>(BLOBFILE(path = string("@model_path/weights/w.bin"), offset = uint64(64)))];
tensor<fp16, [4, 1, 1, 1]> s = const()[name = string("s"), val = tensor<fp16, [4, 1, 1, 1]>(BLOBFILE(path = string("@model_path/weights/s.bin"), offset = uint64(64)))];
tensor<fp16, [4, 4, 1, 1]> W2 = const()[name = string("W2"), val = tensor<fp16, [4, 4, 1, 1]>(BLOBFILE(path = string("@model_path/weights/w.bin"), offset = uint64(128)))];"#;
    const TEXT_B: &str = r#"tensor<fp16, [4, 4, 1, 1]> W = const()[name = tensor<string, []>("W"), val = tensor<fp16, [4, 4, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/masks/causal.bin"), offset = tensor<uint64, []>(64)))];"#;

    #[test]
    fn blobfile_paths_of_both_dialects() {
        assert_eq!(
            blobfile_paths(TEXT_A),
            ["@model_path/weights/w.bin", "@model_path/weights/s.bin"]
        );
        assert_eq!(blobfile_paths(TEXT_B), ["@model_path/masks/causal.bin"]);
        assert!(blobfile_paths("program(1.3) {}").is_empty());
    }

    #[test]
    fn weight_keys_must_match_the_text_exactly() {
        let (w, s) = (&b"w"[..], &b"s"[..]);
        check(&ModelFiles {
            name: "t",
            mil_text: TEXT_A,
            weights: &[
                ("@model_path/weights/w.bin", w),
                ("@model_path/weights/s.bin", s),
            ],
        })
        .unwrap();
        let e = check(&ModelFiles {
            name: "t",
            mil_text: TEXT_A,
            weights: &[("@model_path/weights/w.bin", w)],
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("names @model_path/weights/s.bin"), "{e}");
        let e = check(&ModelFiles {
            name: "t",
            mil_text: TEXT_B,
            weights: &[
                ("@model_path/masks/causal.bin", w),
                ("@model_path/weights/x.bin", s),
            ],
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.bin is not named"), "{e}");
        let e = check(&ModelFiles {
            name: "t",
            mil_text: TEXT_B,
            weights: &[
                ("@model_path/masks/causal.bin", w),
                ("@model_path/masks/causal.bin", w),
            ],
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn relative_paths_stay_inside_the_staging_dir() {
        assert_eq!(
            relative_path("@model_path/weights/w.bin").unwrap(),
            Path::new("weights/w.bin")
        );
        for bad in [
            "weights/w.bin",
            "@model_path/../w.bin",
            "@model_path//etc/passwd",
            "@model_path/",
            "@model_path/./..",
        ] {
            assert!(relative_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn staging_dir_is_tmp_slash_identifier() {
        let hex = "3A1F_9c0B-77";
        assert_eq!(
            staging_dir(Path::new("/var/folders/x/T"), hex).unwrap(),
            Path::new("/var/folders/x/T/3A1F_9c0B-77")
        );
        for bad in ["", "..", "a/b", "a b"] {
            assert!(staging_dir(Path::new("/tmp"), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stage_writes_the_text_and_the_weights_where_model_path_points() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = staging_dir(tmp.path(), "ABC123").unwrap();
        let files = ModelFiles {
            name: "t",
            mil_text: TEXT_B,
            weights: &[("@model_path/masks/causal.bin", &[1, 2, 3])],
        };
        stage(&dir, &files).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("model.mil")).unwrap(),
            TEXT_B
        );
        assert_eq!(
            std::fs::read(dir.join("masks/causal.bin")).unwrap(),
            [1, 2, 3]
        );
        // A file where a directory must go: the error names the path.
        let blocked = tmp.path().join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let e = stage(&blocked, &files).unwrap_err().to_string();
        assert!(e.starts_with("staging ") && e.contains("blocked"), "{e}");
    }
}
