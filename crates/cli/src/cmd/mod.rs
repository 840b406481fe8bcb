//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod common;
pub mod eval;
pub mod info;
pub mod mil;
pub mod perplexity;
pub mod probe;
pub mod run;
pub mod template;
pub mod tokenize;
