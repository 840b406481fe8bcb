//! The weight reports of a lowered model summed up: per file type and encoding, in total, and
//! every tensor held as fp16 against the policy, with its reason — what `compile` prints.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::TensorReport;

/// Weights and bytes of a set of tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub tensors: usize,
    pub weights: u64,
    /// Bytes the programs hold.
    pub bytes: u64,
    /// Bytes the same weights take as fp16.
    pub fp16_bytes: u64,
    /// Tensors whose every weight is the file's bit for bit.
    pub exact: usize,
    /// Largest error relative to the tensor's largest weight.
    pub max_rel_err: f32,
}

impl Totals {
    fn add(&mut self, r: &TensorReport) {
        self.tensors += 1;
        self.weights += r.weights;
        self.bytes += r.bytes;
        self.fp16_bytes += 2 * r.weights;
        self.exact += usize::from(r.exact);
        if r.max_abs > 0.0 {
            self.max_rel_err = self.max_rel_err.max(r.max_abs_err / r.max_abs);
        }
    }

    /// The programs' bytes as a share of fp16's.
    pub fn ratio(&self) -> f64 {
        self.bytes as f64 / self.fp16_bytes.max(1) as f64
    }
}

/// The totals of `reports`.
pub fn totals<'a>(reports: impl IntoIterator<Item = &'a TensorReport>) -> Totals {
    let mut t = Totals::default();
    for r in reports {
        t.add(r);
    }
    t
}

/// A table per (file type, encoding), the total, and the tensors kept at fp16 with reasons.
pub fn table(reports: &[TensorReport]) -> String {
    let mut groups: BTreeMap<(&str, &str), Totals> = BTreeMap::new();
    for r in reports {
        groups
            .entry((r.source.as_str(), r.encoding.as_str()))
            .or_default()
            .add(r);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:<18} {:>7} {:>9} {:>9} {:>6} {:>7} {:>11}",
        "file", "held as", "tensors", "Mweights", "MB", "x fp16", "exact", "max rel err"
    );
    let line = |s: &mut String, a: &str, b: &str, t: &Totals| {
        let _ = writeln!(
            s,
            "{a:<8} {b:<18} {:>7} {:>9.2} {:>9.2} {:>6.3} {:>7} {:>11.1e}",
            t.tensors,
            t.weights as f64 / 1e6,
            t.bytes as f64 / 1e6,
            t.ratio(),
            format!("{}/{}", t.exact, t.tensors),
            t.max_rel_err
        );
    };
    for ((src, enc), t) in &groups {
        line(&mut s, src, enc, t);
    }
    line(&mut s, "total", "", &totals(reports));
    for r in reports {
        if let Some(why) = &r.kept_fp16 {
            let _ = writeln!(s, "fp16: {} ({}): {why}", r.name, r.source);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, source: &str, encoding: &str, weights: u64, bytes: u64) -> TensorReport {
        TensorReport {
            name: name.into(),
            source: source.into(),
            encoding: encoding.into(),
            weights,
            bytes,
            exact: encoding != "fp16",
            max_abs_err: if encoding == "fp16" { 0.0 } else { 0.01 },
            max_abs: 2.0,
            kept_fp16: (encoding == "fp16").then(|| "f32 is not integers".to_string()),
        }
    }

    #[test]
    fn sums_groups_and_lists_fp16() {
        let rs = [
            r("a", "q8_0", "int8/32", 64, 68),
            r("b", "q8_0", "int8/32", 64, 68),
            r("c", "f32", "fp16", 32, 64),
        ];
        let t = totals(&rs);
        assert_eq!(
            (t.tensors, t.weights, t.bytes, t.fp16_bytes),
            (3, 160, 200, 320)
        );
        assert_eq!(t.exact, 2);
        assert!((t.max_rel_err - 0.005).abs() < 1e-7);
        assert!((t.ratio() - 0.625).abs() < 1e-12);
        let s = table(&rs);
        assert!(s.contains("int8/32"), "{s}");
        assert!(s.lines().any(|l| l.starts_with("total")), "{s}");
        assert!(s.contains("fp16: c (f32): f32 is not integers"), "{s}");
    }
}
