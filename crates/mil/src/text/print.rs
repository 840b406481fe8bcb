//! MIL text printer (FACTS §1). One canonical form per dialect:
//!
//! - the program header: the byte-exact dialect A or B header when the buildInfo is the
//!   dialect's default (emitted from raw literals, FACTS §1.1's Rust pitfall), else the same
//!   shape spelled out;
//! - `func name<ios18>(inputs) {`, 4-space indent, statements at 8 spaces;
//! - `<type> <name> = <op>(<param> = <ref>, ...)[<attributes and name, sorted>];`;
//! - `} -> (outputs);`.

use super::number::{format_f16, format_f32, format_f64};
use crate::blob::{blob_location, BlobLayout};
use crate::error::Result;
use crate::ir::{
    Argument, Binding, Dialect, Function, Operation, OpsetSpelling, Program, ScalarSpelling,
};
use crate::literal::{Elements, Literal};
use crate::types::{TensorType, ValueType};
use std::fmt::Write;

/// Dialect A header, byte-exact (FACTS §1.1; MAD `stories_mil.h` MIL_HDR). A raw literal, not a
/// format string: `{{` here is two literal braces.
pub const HEADER_A: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
"#;

/// Dialect B header, byte-exact (FACTS §1.1; ALM `core/ane_runtime.cpp` MIL_HEADER).
pub const HEADER_B: &str = r#"program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
{
"#;

/// Prints `program`; in-memory weights get their `BLOBFILE` references from `layout`.
pub fn print_program(program: &Program, layout: &BlobLayout) -> Result<String> {
    let mut p = Printer {
        out: String::new(),
        dialect: &program.dialect,
        layout,
    };
    p.header(program);
    for (i, f) in program.functions.iter().enumerate() {
        if i > 0 {
            p.out.push('\n');
        }
        p.function(f)?;
    }
    p.out.push_str("}\n");
    Ok(p.out)
}

struct Printer<'a> {
    out: String,
    dialect: &'a Dialect,
    layout: &'a BlobLayout,
}

fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

impl Printer<'_> {
    fn header(&mut self, program: &Program) {
        let d = self.dialect;
        if program.build_info == d.default_build_info() {
            if *d == Dialect::a() {
                self.out.push_str(HEADER_A);
                return;
            }
            if *d == Dialect::b() {
                self.out.push_str(HEADER_B);
                return;
            }
        }
        let _ = writeln!(self.out, "program({})", d.version);
        if !program.build_info.is_empty() {
            let s = self.scalar_type_name(d.dict, "string");
            let pairs: Vec<String> = program
                .build_info
                .iter()
                .map(|(k, v)| format!("{{{}, {}}}", quote(k), quote(v)))
                .collect();
            let _ = writeln!(
                self.out,
                "[buildInfo = dict<{s}, {s}>({{{}}})]",
                pairs.join(", ")
            );
        }
        self.out.push_str("{\n");
    }

    fn scalar_type_name(&self, spelling: ScalarSpelling, dtype: &str) -> String {
        match spelling {
            ScalarSpelling::Short => dtype.to_string(),
            ScalarSpelling::Tensor => format!("tensor<{dtype}, []>"),
        }
    }

    fn tensor_type(&self, t: &TensorType) -> String {
        if t.is_scalar() {
            return self.scalar_type_name(self.dialect.scalars, t.dtype.name());
        }
        t.to_string()
    }

    fn value_type(&self, t: &ValueType) -> String {
        match t {
            ValueType::Tensor(t) => self.tensor_type(t),
            ValueType::State(t) => format!("state<{t}>"),
        }
    }

    fn function(&mut self, f: &Function) -> Result<()> {
        f.check_opset(f.opset)?;
        let tag = match self.dialect.opset_names {
            OpsetSpelling::Ios => f.opset.ios_name(),
            OpsetSpelling::CoreMl => f.opset.coreml_name(),
        };
        let inputs: Vec<String> = f
            .inputs()
            .iter()
            .map(|&id| format!("{} {}", self.value_type(f.type_of(id)), f.name_of(id)))
            .collect();
        let _ = writeln!(
            self.out,
            "    func {}<{tag}>({}) {{",
            f.name,
            inputs.join(", ")
        );
        for op in f.ops() {
            self.statement(f, op)?;
        }
        let outs: Vec<&str> = f.outputs().iter().map(|&id| f.name_of(id)).collect();
        let _ = writeln!(self.out, "    }} -> ({});", outs.join(", "));
        Ok(())
    }

    fn statement(&mut self, f: &Function, op: &Operation) -> Result<()> {
        let outs: Vec<String> = op
            .outputs
            .iter()
            .map(|&id| format!("{} {}", self.value_type(f.type_of(id)), f.name_of(id)))
            .collect();
        let mut args = Vec::with_capacity(op.inputs.len());
        for (k, a) in &op.inputs {
            let v = match a {
                Argument::Single(b) => self.binding(f, b)?,
                Argument::Tuple(bs) => {
                    let items: Vec<String> = bs
                        .iter()
                        .map(|b| self.binding(f, b))
                        .collect::<Result<_>>()?;
                    format!("({})", items.join(", "))
                }
            };
            args.push(format!("{k} = {v}"));
        }
        let mut attrs: Vec<(String, String)> = op
            .attributes
            .iter()
            .map(|(k, l)| Ok((k.clone(), self.literal(l)?)))
            .collect::<Result<_>>()?;
        if let Some(n) = &op.name {
            attrs.push(("name".into(), self.literal(&Literal::string(n.as_str()))?));
        }
        attrs.sort_by(|a, b| a.0.cmp(&b.0));
        let _ = write!(
            self.out,
            "        {} = {}({})",
            outs.join(", "),
            op.op_type,
            args.join(", ")
        );
        if !attrs.is_empty() {
            let list: Vec<String> = attrs
                .into_iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            let _ = write!(self.out, "[{}]", list.join(", "));
        }
        self.out.push_str(";\n");
        Ok(())
    }

    fn binding(&self, f: &Function, b: &Binding) -> Result<String> {
        match b {
            Binding::Value(id) => Ok(f.name_of(*id).to_string()),
            Binding::Literal(l) => self.literal(l),
        }
    }

    /// `int32(1)` / `tensor<int32, []>(1)` / `tensor<int32, [2]>([1, 1])` / `tensor<...>(BLOBFILE(...))`.
    fn literal(&self, l: &Literal) -> Result<String> {
        let ty = self.tensor_type(l.ty());
        match l {
            Literal::Blob { .. } => {
                let (path, offset) = blob_location(l, self.layout)?;
                let path = self.literal(&Literal::string(path))?;
                let offset = self.literal(&Literal::u64(offset))?;
                Ok(format!("{ty}(BLOBFILE(path = {path}, offset = {offset}))"))
            }
            Literal::Immediate { ty: t, data } => {
                let items = elements(data);
                if t.is_scalar() {
                    Ok(format!("{ty}({})", items.join(", ")))
                } else {
                    Ok(format!("{ty}({})", nested(&items, &t.shape)))
                }
            }
        }
    }
}

/// Row-major items bracketed per dimension: `[[1, 2], [3, 4]]` for `[2, 2]` (the form of
/// compiled `model.mil` constants; the parser also reads flat lists).
fn nested(items: &[String], shape: &[usize]) -> String {
    match shape {
        [] | [_] => format!("[{}]", items.join(", ")),
        [d, rest @ ..] => {
            let chunk = rest.iter().product::<usize>();
            let rows: Vec<String> = (0..*d)
                .map(|i| nested(&items[i * chunk..(i + 1) * chunk], rest))
                .collect();
            format!("[{}]", rows.join(", "))
        }
    }
}

/// Every element spelled for MIL text.
fn elements(e: &Elements) -> Vec<String> {
    fn each<T>(v: &[T], f: impl Fn(&T) -> String) -> Vec<String> {
        v.iter().map(f).collect()
    }
    match e {
        Elements::Bool(v) => each(v, |b| b.to_string()),
        Elements::Str(v) => each(v, |s| quote(s)),
        Elements::F16(v) => each(v, |x| format_f16(*x)),
        Elements::F32(v) => each(v, |x| format_f32(*x)),
        Elements::F64(v) => each(v, |x| format_f64(*x)),
        Elements::I8(v) => each(v, |x| x.to_string()),
        Elements::I16(v) => each(v, |x| x.to_string()),
        Elements::I32(v) => each(v, |x| x.to_string()),
        Elements::I64(v) => each(v, |x| x.to_string()),
        Elements::U8(v) => each(v, |x| x.to_string()),
        Elements::U16(v) => each(v, |x| x.to_string()),
        Elements::U32(v) => each(v, |x| x.to_string()),
        Elements::U64(v) => each(v, |x| x.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_of_rank_two_and_more_are_nested() {
        let items: Vec<String> = (1..=8).map(|i| i.to_string()).collect();
        assert_eq!(nested(&items[..3], &[3]), "[1, 2, 3]");
        assert_eq!(
            nested(&items, &[2, 2, 2]),
            "[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]"
        );
        assert_eq!(nested(&items[..6], &[2, 3]), "[[1, 2, 3], [4, 5, 6]]");
        assert_eq!(nested(&[], &[0, 3]), "[]");
        assert_eq!(nested(&[], &[2, 0]), "[[], []]");
    }

    #[test]
    fn headers_are_balanced_and_exact() {
        // FACTS §1.1: exactly `({{` ... `}})` around the list, single braces around pairs.
        let a = concat!(
            "program(1.3)\n",
            "[buildInfo = dict<string, string>({{\"coremlc-component-MIL\", \"3510.2.1\"}, ",
            "{\"coremlc-version\", \"3505.4.1\"}, {\"coremltools-component-milinternal\", \"\"}, ",
            "{\"coremltools-version\", \"9.0\"}})]\n{\n"
        );
        assert_eq!(HEADER_A, a);
        let line = HEADER_A.lines().nth(1).unwrap();
        assert_eq!(line.matches('{').count(), line.matches('}').count());
        assert_eq!(line.matches("{{").count(), 1);
        assert_eq!(line.matches("}}").count(), 1);
        assert_eq!(
            HEADER_B,
            "program(1.0)\n[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{\"coremlc-version\", \"3505.4.1\"}})]\n{\n"
        );
    }

    #[test]
    fn generic_header_spelling_equals_the_raw_literals() {
        // The spelled-out header for the default entries must match the raw literal exactly,
        // so a program whose dialect differs only in one flag still prints sensibly.
        for (d, raw) in [(Dialect::a(), HEADER_A), (Dialect::b(), HEADER_B)] {
            let mut p = Program::new(d.clone());
            p.dialect.opset_names = OpsetSpelling::CoreMl; // defeats the raw-literal shortcut
            let layout = BlobLayout::default();
            let mut pr = Printer {
                out: String::new(),
                dialect: &p.dialect,
                layout: &layout,
            };
            pr.header(&p);
            assert_eq!(pr.out, raw);
        }
    }
}
