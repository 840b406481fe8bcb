//! Other spellings of ops a machine refused: when `probe --all` finds that an op form fails on
//! this machine, the lowering writes what that op computes with ops that passed.
//!
//! Chosen from the probe's remembered answers ([`crate::dialect::ProbeMemory::failed_ops`]);
//! an op with no alternative here stays as it is (the probe report says so).

use std::collections::BTreeSet;

use anelm_mil::{FunctionBuilder, ValueId};

use crate::error::Result;

/// The ops the lowering writes another way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Alternatives {
    avoid: BTreeSet<String>,
}

/// The ops that have an alternative here.
pub const REPLACEABLE: &[&str] = &["abs", "matmul", "split", "concat"];

impl Alternatives {
    /// Alternatives for those of `ops` that have one.
    pub fn avoiding<S: AsRef<str>>(ops: &[S]) -> Alternatives {
        Alternatives {
            avoid: ops
                .iter()
                .map(|s| s.as_ref())
                .filter(|s| REPLACEABLE.contains(s))
                .map(str::to_string)
                .collect(),
        }
    }

    pub fn avoids(&self, op: &str) -> bool {
        self.avoid.contains(op)
    }

    /// The avoided ops, sorted.
    pub fn ops(&self) -> impl Iterator<Item = &str> {
        self.avoid.iter().map(String::as_str)
    }

    /// `|x|`, named `name`: `abs`, or `maximum(x, -x)` where `abs` is avoided.
    pub fn abs(&self, f: &mut FunctionBuilder, name: &str, x: ValueId) -> Result<ValueId> {
        if !self.avoids("abs") {
            return Ok(f.name_next(name).unary("abs", x)?);
        }
        let neg = f
            .name_next(&format!("{name}_neg"))
            .binary_scalar("mul", x, -1.0)?;
        Ok(f.name_next(name).maximum(x, neg)?)
    }

    /// `x` split along `axis` into parts of `sizes`, named `name`, `name_1`, ...: `split`, or
    /// one `slice_by_size` per part where `split` is avoided.
    pub fn split(
        &self,
        f: &mut FunctionBuilder,
        name: &str,
        x: ValueId,
        axis: usize,
        sizes: &[usize],
    ) -> Result<Vec<ValueId>> {
        let sizes32: Vec<i32> = sizes.iter().map(|&s| s as i32).collect();
        if !self.avoids("split") {
            return Ok(f.name_next(name).split_sizes(x, axis as i32, &sizes32)?);
        }
        let shape: Vec<i32> = f.type_of(x)?.shape.iter().map(|&d| d as i32).collect();
        let mut begin = vec![0i32; shape.len()];
        let mut out = Vec::with_capacity(sizes.len());
        for (i, &s) in sizes32.iter().enumerate() {
            let mut size = shape.clone();
            size[axis] = s;
            let n = if i == 0 {
                name.to_string()
            } else {
                format!("{name}_{i}")
            };
            out.push(f.name_next(&n).slice_by_size(x, &begin, &size)?);
            begin[axis] += s;
        }
        Ok(out)
    }

    /// `values` concatenated along `axis`, named `name`: `concat`, or — where `concat` is
    /// avoided and `axis` is not the channel axis (1, the proven form) — each value transposed
    /// to bring `axis` to 1, a channel concat, and the transpose back.
    pub fn concat(
        &self,
        f: &mut FunctionBuilder,
        name: &str,
        values: &[ValueId],
        axis: usize,
    ) -> Result<ValueId> {
        if !self.avoids("concat") || axis == 1 {
            return Ok(f.name_next(name).concat(values, axis as i32)?);
        }
        let rank = f.type_of(values[0])?.rank();
        let mut perm: Vec<i32> = (0..rank as i32).collect();
        perm.swap(1, axis);
        let mut moved = Vec::with_capacity(values.len());
        for (i, &v) in values.iter().enumerate() {
            moved.push(f.name_next(&format!("{name}_t{i}")).transpose(v, &perm)?);
        }
        let c = f.name_next(&format!("{name}_c1")).concat(&moved, 1)?;
        Ok(f.name_next(name).transpose(c, &perm)?)
    }

    /// `matmul(x, y)` with operands transposed (last two axes) as flagged, named `name`: the
    /// flags, or — where `matmul` is avoided — explicit `transpose` ops (the proven form, MAD's
    /// perm swaps the last two axes) and a matmul without flags.
    pub fn matmul(
        &self,
        f: &mut FunctionBuilder,
        name: &str,
        x: ValueId,
        y: ValueId,
        transpose_x: bool,
        transpose_y: bool,
    ) -> Result<ValueId> {
        if !self.avoids("matmul") || !(transpose_x || transpose_y) {
            return Ok(f.name_next(name).matmul(x, y, transpose_x, transpose_y)?);
        }
        let swap = |f: &mut FunctionBuilder, v: ValueId, tag: &str| -> Result<ValueId> {
            let rank = f.type_of(v)?.rank();
            let mut perm: Vec<i32> = (0..rank as i32).collect();
            perm.swap(rank - 2, rank - 1);
            Ok(f.name_next(&format!("{name}_{tag}t")).transpose(v, &perm)?)
        };
        let x = if transpose_x { swap(f, x, "x")? } else { x };
        let y = if transpose_y { swap(f, y, "y")? } else { y };
        Ok(f.name_next(name).matmul(x, y, false, false)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_mil::sim::{Simulator, Tensor};
    use anelm_mil::{Opset, Program, TensorType};

    fn program(alts: &Alternatives) -> Program {
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, 4, 1, 2])).unwrap();
        let y = alts.abs(&mut f, "y", x).unwrap();
        f.output(y).unwrap();
        Program::single(f.finish().unwrap())
    }

    #[test]
    fn the_alternative_computes_the_same_without_the_op() {
        let x = [-2.0, -0.5, 0.0, 0.25, 3.0, -65504.0, 65504.0, -1e-7];
        let run = |p: &Program| {
            let sim = Simulator::new(&p.functions[0]).unwrap();
            let input = Tensor::fp16([1, 4, 1, 2], x.to_vec()).unwrap();
            let out = sim.run(vec![input]).unwrap();
            format!("{:?}", out[0].data)
        };
        let plain = program(&Alternatives::default());
        let alt = Alternatives::avoiding(&["abs", "no_such_op"]);
        assert_eq!(alt.ops().collect::<Vec<_>>(), ["abs"]);
        assert!(!alt.avoids("matmul"));
        let replaced = program(&alt);
        let ops = |p: &Program| -> Vec<String> {
            p.functions[0]
                .ops()
                .iter()
                .map(|o| o.op_type.clone())
                .collect()
        };
        assert!(ops(&plain).contains(&"abs".to_string()));
        assert!(
            !ops(&replaced).contains(&"abs".to_string()),
            "{:?}",
            ops(&replaced)
        );
        assert_eq!(run(&plain), run(&replaced));
    }

    #[test]
    fn transposed_matmul_is_written_with_explicit_transposes() {
        let build = |alts: &Alternatives| {
            let mut f = FunctionBuilder::new("main", Opset::Ios18);
            let x = f.input("x", TensorType::fp16([2, 3, 4])).unwrap();
            let y = f.input("y", TensorType::fp16([2, 5, 3])).unwrap();
            // x^T [2,4,3] @ y^T [2,3,5] -> [2,4,5]
            let z = alts.matmul(&mut f, "z", x, y, true, true).unwrap();
            f.output(z).unwrap();
            Program::single(f.finish().unwrap())
        };
        let plain = build(&Alternatives::default());
        let alt = build(&Alternatives::avoiding(&["matmul"]));
        let count = |p: &Program, op: &str| {
            p.functions[0]
                .ops()
                .iter()
                .filter(|o| o.op_type == op)
                .count()
        };
        assert_eq!(
            (count(&plain, "transpose"), count(&alt, "transpose")),
            (0, 2)
        );
        let flags = |p: &Program| {
            let f = &p.functions[0];
            let m = f.ops().iter().find(|o| o.op_type == "matmul").unwrap();
            f.operand_literal(m, "transpose_x")
                .and_then(|l| l.to_bool())
        };
        assert_eq!((flags(&plain), flags(&alt)), (Some(true), Some(false)));
        let xs: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
        let ys: Vec<f32> = (0..30).map(|i| 1.0 - i as f32 * 0.125).collect();
        let run = |p: &Program| {
            let sim = Simulator::new(&p.functions[0]).unwrap();
            let out = sim
                .run(vec![
                    Tensor::fp16([2, 3, 4], xs.clone()).unwrap(),
                    Tensor::fp16([2, 5, 3], ys.clone()).unwrap(),
                ])
                .unwrap();
            format!("{:?}", out[0].data)
        };
        assert_eq!(run(&plain), run(&alt));
    }

    #[test]
    fn split_and_concat_are_written_with_proven_forms() {
        let build = |alts: &Alternatives| {
            let mut f = FunctionBuilder::new("main", Opset::Ios18);
            let x = f.input("x", TensorType::fp16([1, 6, 2, 3])).unwrap();
            let y = f.input("y", TensorType::fp16([1, 6, 2, 2])).unwrap();
            let parts = alts.split(&mut f, "p", x, 1, &[1, 2, 3]).unwrap();
            let c = alts.concat(&mut f, "c", &[x, y], 3).unwrap();
            for v in parts.into_iter().chain([c]) {
                f.output(v).unwrap();
            }
            Program::single(f.finish().unwrap())
        };
        let plain = build(&Alternatives::default());
        let alt = build(&Alternatives::avoiding(&["split", "concat"]));
        let ops = |p: &Program| -> Vec<String> {
            let f = &p.functions[0];
            f.ops()
                .iter()
                .filter(|o| !o.is_const())
                .map(|o| {
                    let axis = f.operand_literal(o, "axis").and_then(|l| l.to_i64());
                    format!(
                        "{}{}",
                        o.op_type,
                        axis.map_or(String::new(), |a| a.to_string())
                    )
                })
                .collect()
        };
        assert!(ops(&plain).contains(&"split1".to_string()));
        assert!(ops(&plain).contains(&"concat3".to_string()));
        assert!(
            !ops(&alt).iter().any(|o| o.starts_with("split")),
            "{:?}",
            ops(&alt)
        );
        assert!(
            ops(&alt).contains(&"concat1".to_string())
                && !ops(&alt).contains(&"concat3".to_string())
        );
        let xs: Vec<f32> = (0..36).map(|i| i as f32 * 0.5 - 9.0).collect();
        let ys: Vec<f32> = (0..24).map(|i| 2.0 - i as f32 * 0.25).collect();
        let run = |p: &Program| {
            let sim = Simulator::new(&p.functions[0]).unwrap();
            let out = sim
                .run(vec![
                    Tensor::fp16([1, 6, 2, 3], xs.clone()).unwrap(),
                    Tensor::fp16([1, 6, 2, 2], ys.clone()).unwrap(),
                ])
                .unwrap();
            out.iter()
                .map(|t| (t.shape.clone(), format!("{:?}", t.data)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(&plain), run(&alt));
    }
}
