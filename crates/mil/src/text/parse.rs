//! MIL text parser. Reads both dialects and the variants public projects have run on hardware
//! (FACTS §1): `program(1.3)`/`program(1.0)`/`program(1)`, optional buildInfo, several
//! functions, `<ios18>` or `<CoreML8>` tags, short (`int32(1)`) and tensor (`tensor<int32, []>(1)`)
//! scalar spellings, statements with or without `[name = ...]`, constexpr ops with all operands
//! in the bracket list, `BLOBFILE` literals passed inline as arguments, tuples, hex floats.
//!
//! Every statement of a known op is type-checked (declared output types must equal inference);
//! ops not in the table are accepted with their declared types. Errors carry line and column.

use super::lex::{tokenize, Tok, Token};
use super::number::parse_float;
use crate::builder::{FunctionBuilder, Outputs};
use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{
    Argument, Binding, Dialect, Function, Operation, Opset, OpsetSpelling, Program, ScalarSpelling,
    ValueId,
};
use crate::literal::{BlobSource, Elements, Literal};
use crate::types::{TensorType, ValueType};
use half::f16;
use std::collections::HashMap;

/// Parses MIL text into a [`Program`].
pub fn parse_program(src: &str) -> Result<Program> {
    let toks = tokenize(src)?;
    let mut p = Parser {
        toks,
        pos: 0,
        scalars: None,
        dict: None,
    };
    p.program()
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// Scalar spelling seen first in statements / in the buildInfo dict type.
    scalars: Option<ScalarSpelling>,
    dict: Option<ScalarSpelling>,
}

/// A parsed function, where it starts, and how its deployment tag was spelled.
struct ParsedFunction {
    function: Function,
    at: (usize, usize),
    spelling: OpsetSpelling,
}

/// A parsed type, remembering whether a scalar was spelled `tensor<T, []>`.
struct ParsedType {
    ty: ValueType,
    spelled_as_tensor: bool,
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].tok
    }

    fn here(&self) -> (usize, usize) {
        let t = &self.toks[self.pos];
        (t.line, t.col)
    }

    fn err_at(&self, (line, col): (usize, usize), msg: impl Into<String>) -> MilError {
        MilError::Parse {
            line,
            col,
            msg: msg.into(),
        }
    }

    fn err(&self, msg: impl Into<String>) -> MilError {
        self.err_at(self.here(), msg)
    }

    fn describe(t: &Tok) -> String {
        match t {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Num(s) => format!("number {s}"),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Arrow => "`->`".into(),
            Tok::Eof => "end of input".into(),
        }
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].tok.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn expect(&mut self, c: char) -> Result<()> {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            Ok(())
        } else {
            Err(self.err(format!(
                "expected `{c}`, found {}",
                Self::describe(self.peek())
            )))
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Result<String> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.next();
                Ok(s)
            }
            t => Err(self.err(format!("expected a name, found {}", Self::describe(&t)))),
        }
    }

    fn keyword(&mut self, kw: &str) -> Result<()> {
        match self.peek() {
            Tok::Ident(s) if s == kw => {
                self.next();
                Ok(())
            }
            t => Err(self.err(format!("expected `{kw}`, found {}", Self::describe(t)))),
        }
    }

    fn string(&mut self) -> Result<String> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            t => Err(self.err(format!("expected a string, found {}", Self::describe(&t)))),
        }
    }

    fn program(&mut self) -> Result<Program> {
        self.keyword("program")?;
        self.expect('(')?;
        let version = match self.next() {
            Tok::Num(v) => v,
            t => {
                return Err(self.err(format!(
                    "expected a program version, found {}",
                    Self::describe(&t)
                )))
            }
        };
        self.expect(')')?;
        let mut build_info = Vec::new();
        if self.eat('[') {
            self.keyword("buildInfo")?;
            self.expect('=')?;
            build_info = self.build_info()?;
            self.expect(']')?;
        }
        self.expect('{')?;
        let mut functions = Vec::new();
        let mut opset_names = None;
        while *self.peek() != Tok::Punct('}') {
            let f = self.function()?;
            opset_names.get_or_insert(f.spelling);
            functions.push(f);
        }
        self.expect('}')?;
        if *self.peek() != Tok::Eof {
            return Err(self.err(format!(
                "unexpected {} after the program",
                Self::describe(self.peek())
            )));
        }
        let scalars = self.scalars.or(self.dict).unwrap_or(if version == "1.0" {
            ScalarSpelling::Tensor
        } else {
            ScalarSpelling::Short
        });
        let dialect = Dialect {
            version,
            scalars,
            dict: self.dict.unwrap_or(scalars),
            opset_names: opset_names.unwrap_or(OpsetSpelling::Ios),
        };
        let mut program = Program::new(dialect);
        program.build_info = build_info;
        for f in functions {
            program
                .add_function(f.function)
                .map_err(|e| self.err_at(f.at, e.to_string()))?;
        }
        Ok(program)
    }

    /// `dict<string, string>({{"k", "v"}, ...})` or with `tensor<string, []>` key types.
    fn build_info(&mut self) -> Result<Vec<(String, String)>> {
        self.keyword("dict")?;
        self.expect('<')?;
        let k = self.parse_type()?;
        self.expect(',')?;
        self.parse_type()?;
        self.expect('>')?;
        self.dict = Some(if k.spelled_as_tensor {
            ScalarSpelling::Tensor
        } else {
            ScalarSpelling::Short
        });
        self.expect('(')?;
        self.expect('{')?;
        let mut pairs = Vec::new();
        if !self.eat('}') {
            loop {
                self.expect('{')?;
                let k = self.string()?;
                self.expect(',')?;
                let v = self.string()?;
                self.expect('}')?;
                pairs.push((k, v));
                if self.eat('}') {
                    break;
                }
                self.expect(',')?;
            }
        }
        self.expect(')')?;
        Ok(pairs)
    }

    fn parse_type(&mut self) -> Result<ParsedType> {
        let at = self.here();
        let head = self.ident()?;
        match head.as_str() {
            "tensor" => {
                self.expect('<')?;
                let d = self.ident()?;
                let dtype = DType::from_name(&d)
                    .ok_or_else(|| self.err_at(at, format!("unknown dtype {d}")))?;
                self.expect(',')?;
                self.expect('[')?;
                let mut shape = Vec::new();
                if !self.eat(']') {
                    loop {
                        let dat = self.here();
                        match self.next() {
                            Tok::Num(n) => shape.push(
                                n.parse::<usize>().map_err(|_| self.err_at(dat, format!("bad dimension {n}")))?,
                            ),
                            t => {
                                return Err(self.err_at(
                                    dat,
                                    format!("expected a static dimension, found {} (symbolic shapes are not supported)", Self::describe(&t)),
                                ))
                            }
                        }
                        if self.eat(']') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
                self.expect('>')?;
                let scalar = shape.is_empty();
                let t = TensorType::new(dtype, shape);
                t.check_size().map_err(|e| self.err_at(at, e.to_string()))?;
                Ok(ParsedType {
                    ty: ValueType::Tensor(t),
                    spelled_as_tensor: scalar,
                })
            }
            "state" => {
                self.expect('<')?;
                let inner = self.parse_type()?;
                self.expect('>')?;
                match inner.ty {
                    ValueType::Tensor(t) => Ok(ParsedType {
                        ty: ValueType::State(t),
                        spelled_as_tensor: false,
                    }),
                    ValueType::State(_) => Err(self.err_at(at, "nested state type")),
                }
            }
            d => {
                let dtype = DType::from_name(d)
                    .ok_or_else(|| self.err_at(at, format!("unknown type {d}")))?;
                Ok(ParsedType {
                    ty: ValueType::Tensor(TensorType::scalar(dtype)),
                    spelled_as_tensor: false,
                })
            }
        }
    }

    fn note_scalar_spelling(&mut self, t: &ParsedType) {
        if t.ty.tensor().is_scalar() && self.scalars.is_none() {
            self.scalars = Some(if t.spelled_as_tensor {
                ScalarSpelling::Tensor
            } else {
                ScalarSpelling::Short
            });
        }
    }

    /// `func name<tag>(T a, ...) { stmts } -> (outs);`
    fn function(&mut self) -> Result<ParsedFunction> {
        let start = self.here();
        self.keyword("func")?;
        let name = self.ident()?;
        self.expect('<')?;
        let tag_at = self.here();
        let tag = self.ident()?;
        let opset = Opset::from_name(&tag)
            .ok_or_else(|| self.err_at(tag_at, format!("unknown deployment target {tag}")))?;
        let spelling = if tag.starts_with("CoreML") {
            OpsetSpelling::CoreMl
        } else {
            OpsetSpelling::Ios
        };
        self.expect('>')?;
        let mut b = FunctionBuilder::new(name, opset);
        let mut scope: HashMap<String, ValueId> = HashMap::new();
        self.expect('(')?;
        if !self.eat(')') {
            loop {
                let at = self.here();
                let t = self.parse_type()?;
                self.note_scalar_spelling(&t);
                let n = self.ident()?;
                let id = b
                    .add_input(&n, t.ty)
                    .map_err(|e| self.err_at(at, e.to_string()))?;
                scope.insert(n, id);
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        self.expect('{')?;
        while *self.peek() != Tok::Punct('}') {
            self.statement(&mut b, &mut scope)?;
        }
        self.expect('}')?;
        if *self.peek() != Tok::Arrow {
            return Err(self.err(format!(
                "expected `->`, found {}",
                Self::describe(self.peek())
            )));
        }
        self.next();
        self.expect('(')?;
        if !self.eat(')') {
            loop {
                let at = self.here();
                let n = self.ident()?;
                let id = *scope
                    .get(&n)
                    .ok_or_else(|| self.err_at(at, format!("output {n} is not defined")))?;
                b.output(id).map_err(|e| self.err_at(at, e.to_string()))?;
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        self.expect(';')?;
        let f = b.finish().map_err(|e| self.err_at(start, e.to_string()))?;
        Ok(ParsedFunction {
            function: f,
            at: start,
            spelling,
        })
    }

    /// `T a[, T b] = op(args)[attrs];`
    fn statement(
        &mut self,
        b: &mut FunctionBuilder,
        scope: &mut HashMap<String, ValueId>,
    ) -> Result<()> {
        let start = self.here();
        let mut outs = Vec::new();
        loop {
            let t = self.parse_type()?;
            self.note_scalar_spelling(&t);
            let n = self.ident()?;
            outs.push((n, t.ty));
            if self.eat('=') {
                break;
            }
            self.expect(',')?;
        }
        let op_type = self.ident()?;
        self.expect('(')?;
        let mut inputs = Vec::new();
        if !self.eat(')') {
            loop {
                let k = self.ident()?;
                self.expect('=')?;
                let a = if *self.peek() == Tok::Punct('(') {
                    self.next();
                    let mut items = Vec::new();
                    if !self.eat(')') {
                        loop {
                            items.push(self.binding(scope)?);
                            if self.eat(')') {
                                break;
                            }
                            self.expect(',')?;
                        }
                    }
                    Argument::Tuple(items)
                } else {
                    Argument::Single(self.binding(scope)?)
                };
                if inputs.iter().any(|(e, _): &(String, Argument)| *e == k) {
                    return Err(self.err(format!("parameter {k} given twice")));
                }
                inputs.push((k, a));
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let mut attributes = Vec::new();
        let mut name = None;
        if self.eat('[') {
            loop {
                let k = self.ident()?;
                self.expect('=')?;
                let l = self.literal()?;
                if k == "name" {
                    name = Some(
                        l.as_str()
                            .ok_or_else(|| self.err("the name attribute must be a string"))?
                            .to_string(),
                    );
                } else {
                    attributes.push((k, l));
                }
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        self.expect(';')?;
        let names: Vec<String> = outs.iter().map(|(n, _)| n.clone()).collect();
        let op = Operation {
            op_type,
            inputs,
            attributes,
            name,
            outputs: Vec::new(),
        };
        let ids = b
            .push(op, Outputs::Declared(outs))
            .map_err(|e| self.err_at(start, e.to_string()))?;
        for (n, id) in names.into_iter().zip(ids) {
            scope.insert(n, id);
        }
        Ok(())
    }

    /// A reference to an earlier value, or a literal in place.
    fn binding(&mut self, scope: &HashMap<String, ValueId>) -> Result<Binding> {
        let at = self.here();
        if let Tok::Ident(n) = self.peek().clone() {
            let literal_follows = match self.peek_at(1) {
                Tok::Punct('(') => DType::from_name(&n).is_some(),
                Tok::Punct('<') => n == "tensor",
                _ => false,
            };
            if !literal_follows {
                self.next();
                return scope
                    .get(&n)
                    .map(|&id| Binding::Value(id))
                    .ok_or_else(|| self.err_at(at, format!("{n} is not defined")));
            }
        }
        Ok(Binding::Literal(self.literal()?))
    }

    /// `int32(1)`, `tensor<int32, []>(1)`, `tensor<int32, [2]>([1, 1])`, `tensor<...>(BLOBFILE(...))`.
    fn literal(&mut self) -> Result<Literal> {
        let at = self.here();
        let t = self.parse_type()?;
        self.note_scalar_spelling(&t);
        let ty = match t.ty {
            ValueType::Tensor(t) => t,
            ValueType::State(_) => return Err(self.err_at(at, "a literal cannot be a state")),
        };
        self.expect('(')?;
        let lit = if matches!(self.peek(), Tok::Ident(s) if s == "BLOBFILE") {
            self.next();
            self.expect('(')?;
            let mut path = None;
            let mut offset = None;
            loop {
                let k_at = self.here();
                let k = self.ident()?;
                self.expect('=')?;
                let v = self.literal()?;
                match k.as_str() {
                    "path" => {
                        path = Some(
                            v.as_str()
                                .ok_or_else(|| self.err_at(k_at, "BLOBFILE path must be a string"))?
                                .to_string(),
                        )
                    }
                    "offset" => {
                        offset = Some(v.to_i64().filter(|&o| o >= 0).ok_or_else(|| {
                            self.err_at(k_at, "BLOBFILE offset must be a non-negative integer")
                        })? as u64)
                    }
                    other => {
                        return Err(self.err_at(k_at, format!("unknown BLOBFILE field {other}")))
                    }
                }
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
            let (Some(path), Some(offset)) = (path, offset) else {
                return Err(self.err_at(at, "BLOBFILE needs path and offset"));
            };
            Literal::Blob {
                ty,
                source: BlobSource::File { path, offset },
            }
        } else {
            let mut raw = Vec::new();
            if ty.is_scalar() && *self.peek() != Tok::Punct('[') {
                raw.push(self.scalar_token()?);
            } else {
                self.flat_list(&mut raw)?;
            }
            let data = self.elements(ty.dtype, raw)?;
            Literal::immediate(ty, data).map_err(|e| self.err_at(at, e.to_string()))?
        };
        self.expect(')')?;
        Ok(lit)
    }

    fn scalar_token(&mut self) -> Result<(Tok, (usize, usize))> {
        let at = self.here();
        match self.next() {
            t @ (Tok::Num(_) | Tok::Str(_) | Tok::Ident(_)) => Ok((t, at)),
            t => Err(self.err_at(
                at,
                format!("expected a value, found {}", Self::describe(&t)),
            )),
        }
    }

    /// `[a, b, [c, d]]` flattened row-major.
    fn flat_list(&mut self, out: &mut Vec<(Tok, (usize, usize))>) -> Result<()> {
        self.expect('[')?;
        if self.eat(']') {
            return Ok(());
        }
        loop {
            if *self.peek() == Tok::Punct('[') {
                self.flat_list(out)?;
            } else {
                out.push(self.scalar_token()?);
            }
            if self.eat(']') {
                return Ok(());
            }
            self.expect(',')?;
        }
    }

    fn elements(&self, dtype: DType, raw: Vec<(Tok, (usize, usize))>) -> Result<Elements> {
        fn ints<T: TryFrom<i128>>(
            p: &Parser,
            raw: &[(Tok, (usize, usize))],
            d: DType,
        ) -> Result<Vec<T>> {
            raw.iter()
                .map(|(t, at)| match t {
                    Tok::Num(s) => s
                        .parse::<i128>()
                        .ok()
                        .and_then(|v| T::try_from(v).ok())
                        .ok_or_else(|| p.err_at(*at, format!("{s} is not a valid {d}"))),
                    t => Err(p.err_at(
                        *at,
                        format!("expected a {d} number, found {}", Parser::describe(t)),
                    )),
                })
                .collect()
        }
        let floats = |raw: &[(Tok, (usize, usize))]| -> Result<Vec<f64>> {
            raw.iter()
                .map(|(t, at)| {
                    let s = match t {
                        Tok::Num(s) | Tok::Ident(s) => s,
                        t => {
                            return Err(self.err_at(
                                *at,
                                format!("expected a number, found {}", Self::describe(t)),
                            ))
                        }
                    };
                    parse_float(s).ok_or_else(|| self.err_at(*at, format!("{s} is not a number")))
                })
                .collect()
        };
        Ok(match dtype {
            DType::Fp16 => Elements::F16(floats(&raw)?.into_iter().map(f16::from_f64).collect()),
            DType::Fp32 => Elements::F32(floats(&raw)?.into_iter().map(|v| v as f32).collect()),
            DType::Fp64 => Elements::F64(floats(&raw)?),
            DType::Int8 => Elements::I8(ints(self, &raw, dtype)?),
            DType::Int16 => Elements::I16(ints(self, &raw, dtype)?),
            DType::Int32 => Elements::I32(ints(self, &raw, dtype)?),
            DType::Int64 => Elements::I64(ints(self, &raw, dtype)?),
            DType::Uint8 => Elements::U8(ints(self, &raw, dtype)?),
            DType::Uint16 => Elements::U16(ints(self, &raw, dtype)?),
            DType::Uint32 => Elements::U32(ints(self, &raw, dtype)?),
            DType::Uint64 => Elements::U64(ints(self, &raw, dtype)?),
            DType::Bool => Elements::Bool(
                raw.iter()
                    .map(|(t, at)| match t {
                        Tok::Ident(s) if s == "true" => Ok(true),
                        Tok::Ident(s) if s == "false" => Ok(false),
                        t => Err(self.err_at(
                            *at,
                            format!("expected true or false, found {}", Self::describe(t)),
                        )),
                    })
                    .collect::<Result<_>>()?,
            ),
            DType::String => Elements::Str(
                raw.into_iter()
                    .map(|(t, at)| match t {
                        Tok::Str(s) => Ok(s),
                        t => Err(self.err_at(
                            at,
                            format!("expected a string, found {}", Self::describe(&t)),
                        )),
                    })
                    .collect::<Result<_>>()?,
            ),
            other => {
                let at = raw.first().map(|r| r.1).unwrap_or_else(|| self.here());
                return Err(self.err_at(
                    at,
                    format!("inline {other} literals are not supported; store them in a blob"),
                ));
            }
        })
    }
}
