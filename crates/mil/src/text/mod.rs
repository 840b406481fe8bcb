//! MIL text: the form the private in-memory path compiles (FACTS §1).
mod lex;
mod number;
mod parse;
mod print;

pub use parse::parse_program;
pub use print::{print_program, HEADER_A, HEADER_B};
