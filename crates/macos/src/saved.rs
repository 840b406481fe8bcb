//! What a compile leaves on disk for whoever has to find out why a unit failed: the program's
//! `modelAttributes` as JSON after every load, and its MIL text after any failure, next to the
//! staged program (`NSTemporaryDirectory()`, FACTS §3.3) but outside its directory, which
//! `unloadWithQoS:` deletes ([DEC]). Errors name these files ([`MacError::Saved`]).
//!
//! Also the conversion of an Objective-C property list ([`Plain`], what `ffi::foundation` reads
//! an `NSDictionary` into) to JSON, kept here so it is tested without a Mac.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{MacError, Result};

/// Suffixes of the saved files.
pub const ATTRIBUTES_SUFFIX: &str = ".attributes.json";
pub const MIL_SUFFIX: &str = ".mil";

/// An Objective-C object graph as plain data: what the attribute dictionaries hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Plain {
    Nil,
    /// An `NSDictionary`, keys in enumeration order.
    Dict(Vec<(Plain, Plain)>),
    Array(Vec<Plain>),
    String(String),
    Integer(i64),
    Float(f64),
    /// Anything else (or deeper than the reader goes): its `-description`.
    Other(String),
}

impl Plain {
    /// JSON for the attributes file: dictionaries become objects whose keys are the string keys
    /// (other keys by their description; a key seen twice gets `#2`, `#3`, … so nothing is
    /// lost), non-finite floats become strings, and `nil` null.
    pub fn to_json(&self) -> Value {
        match self {
            Plain::Nil => Value::Null,
            Plain::Dict(entries) => {
                let mut map = serde_json::Map::new();
                for (k, v) in entries {
                    let base = k.key();
                    let mut key = base.clone();
                    let mut n = 1;
                    while map.contains_key(&key) {
                        n += 1;
                        key = format!("{base}#{n}");
                    }
                    map.insert(key, v.to_json());
                }
                Value::Object(map)
            }
            Plain::Array(items) => Value::Array(items.iter().map(Plain::to_json).collect()),
            Plain::String(s) | Plain::Other(s) => Value::String(s.clone()),
            Plain::Integer(i) => Value::from(*i),
            Plain::Float(f) => serde_json::Number::from_f64(*f)
                .map_or_else(|| Value::String(f.to_string()), Value::Number),
        }
    }

    fn key(&self) -> String {
        match self {
            Plain::String(s) | Plain::Other(s) => s.clone(),
            Plain::Nil => "nil".into(),
            other => other.to_json().to_string(),
        }
    }
}

/// Where one program's files go: `<dir>/anelm-<unit>-<id>.attributes.json` and `….mil`, `id`
/// the framework's `hexStringIdentifier` (or, before there is one, a hash of the MIL text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedFiles {
    dir: PathBuf,
    stem: String,
}

/// FNV-1a, 64 bit: a stable name for a program the framework has not named yet.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `s` as one safe file-name component.
fn component(s: &str) -> String {
    let c: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let c = c.trim_matches('.');
    if c.is_empty() {
        "unit".into()
    } else {
        c.chars().take(80).collect()
    }
}

impl SavedFiles {
    pub fn new(dir: &Path, unit: &str, hex: Option<&str>, mil_text: &str) -> SavedFiles {
        let id = hex.map_or_else(|| format!("text-{:016x}", fnv1a(mil_text)), component);
        SavedFiles {
            dir: dir.to_path_buf(),
            stem: format!("anelm-{}-{id}", component(unit)),
        }
    }

    pub fn attributes_path(&self) -> PathBuf {
        self.dir.join(format!("{}{ATTRIBUTES_SUFFIX}", self.stem))
    }

    pub fn mil_path(&self) -> PathBuf {
        self.dir.join(format!("{}{MIL_SUFFIX}", self.stem))
    }

    /// Writes the attributes, pretty-printed.
    pub fn save_attributes(&self, attributes: &Value) -> Result<PathBuf> {
        let text = serde_json::to_string_pretty(attributes)
            .map_err(|e| MacError::Invalid(format!("modelAttributes as JSON: {e}")))?;
        self.write(self.attributes_path(), text.as_bytes())
    }

    /// Writes the MIL text.
    pub fn save_mil(&self, mil_text: &str) -> Result<PathBuf> {
        self.write(self.mil_path(), mil_text.as_bytes())
    }

    fn write(&self, path: PathBuf, bytes: &[u8]) -> Result<PathBuf> {
        let fail = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MacError::Staging { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(fail(&self.dir))?;
        std::fs::write(&path, bytes).map_err(fail(&path))?;
        Ok(path)
    }

    /// `error`, naming what was saved: the MIL text (written now) and the attributes file when
    /// an earlier step wrote it. A file that could not be written is named with its reason.
    pub fn fail(&self, error: MacError, mil_text: &str) -> MacError {
        let attributes = self.attributes_path();
        let attributes = attributes.is_file().then_some(Ok(attributes));
        with_saved(
            error,
            attributes.into_iter().chain([self.save_mil(mil_text)]),
        )
    }
}

/// `error` with the files saved for it (or the reasons they could not be).
pub fn with_saved(error: MacError, saved: impl IntoIterator<Item = Result<PathBuf>>) -> MacError {
    let (mut files, mut unsaved) = (Vec::new(), Vec::new());
    for s in saved {
        match s {
            Ok(p) => files.push(p),
            Err(e) => unsaved.push(e.to_string()),
        }
    }
    match error {
        // Already wrapped: add to it.
        MacError::Saved {
            error,
            files: mut f,
            unsaved: mut u,
        } => {
            f.append(&mut files);
            u.append(&mut unsaved);
            MacError::Saved {
                error,
                files: f,
                unsaved: u,
            }
        }
        error => MacError::Saved {
            error: Box::new(error),
            files,
            unsaved,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn property_lists_convert_to_json_without_losing_entries() {
        let s = |v: &str| Plain::String(v.into());
        let p = Plain::Dict(vec![
            (s("Name"), s("x")),
            (s("Channels"), Plain::Integer(64)),
            (Plain::Integer(7), Plain::Float(0.5)),
            (s("Name"), s("again")),
            (s("Bad"), Plain::Float(f64::NAN)),
            (
                s("List"),
                Plain::Array(vec![Plain::Nil, Plain::Other("<IOSurface 0x1>".into())]),
            ),
        ]);
        assert_eq!(
            p.to_json(),
            json!({"Name": "x", "Channels": 64, "7": 0.5, "Name#2": "again", "Bad": "NaN",
                   "List": [null, "<IOSurface 0x1>"]})
        );
    }

    #[test]
    fn file_names_are_one_component_per_program() {
        let dir = Path::new("/var/folders/x/T");
        let f = SavedFiles::new(dir, "layer0/ffn up", Some("3A1F_9c"), "program(1.3)");
        assert_eq!(
            f.attributes_path(),
            dir.join("anelm-layer0_ffn_up-3A1F_9c.attributes.json")
        );
        assert_eq!(f.mil_path(), dir.join("anelm-layer0_ffn_up-3A1F_9c.mil"));
        // Before the framework names it: a stable hash of the text, different per text.
        let a = SavedFiles::new(dir, "u", None, "program(1.3) a");
        let b = SavedFiles::new(dir, "u", None, "program(1.3) b");
        assert_ne!(a.mil_path(), b.mil_path());
        assert_eq!(a, SavedFiles::new(dir, "u", None, "program(1.3) a"));
        assert!(a.mil_path().to_string_lossy().contains("anelm-u-text-"));
        assert_eq!(
            SavedFiles::new(dir, "..", Some("../x"), "").mil_path(),
            dir.join("anelm-unit-_x.mil"),
            "nothing escapes the directory"
        );
    }

    #[test]
    fn a_failure_names_the_saved_files() {
        let tmp = tempfile::tempdir().unwrap();
        let f = SavedFiles::new(tmp.path(), "qkv", Some("ABC"), "");
        let attrs = f
            .save_attributes(&json!({"NetworkStatusList": []}))
            .unwrap();
        let back: Value = serde_json::from_str(&std::fs::read_to_string(&attrs).unwrap()).unwrap();
        assert_eq!(back, json!({"NetworkStatusList": []}));
        let e = f.fail(
            MacError::Layout("function main: bad".into()),
            "program(1.3) {}",
        );
        let msg = e.to_string();
        assert_eq!(
            msg,
            format!(
                "modelAttributes: function main: bad (saved {}, {})",
                attrs.display(),
                f.mil_path().display()
            )
        );
        assert_eq!(
            std::fs::read_to_string(f.mil_path()).unwrap(),
            "program(1.3) {}"
        );
        // A directory that cannot be made: the error still comes through, with the reason.
        let blocked = tmp.path().join("file");
        std::fs::write(&blocked, b"").unwrap();
        let g = SavedFiles::new(&blocked, "qkv", None, "t");
        let msg = g
            .fail(MacError::Invalid("compile failed".into()), "t")
            .to_string();
        assert!(
            msg.starts_with("compile failed (could not save: staging ") && msg.contains("file"),
            "{msg}"
        );
    }
}
