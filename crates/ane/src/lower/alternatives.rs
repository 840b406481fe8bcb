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
pub const REPLACEABLE: &[&str] = &["abs"];

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
}
