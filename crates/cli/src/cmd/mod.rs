//! One module per subcommand.

pub mod bench;
pub mod bench_schema;
pub mod bench_spec;
pub mod chat;
pub mod check;
pub mod common;
pub mod compile;
pub mod constrain;
pub mod embed;
pub mod eval;
pub mod info;
pub mod layers;
pub mod list;
pub mod mil;
pub mod perplexity;
pub mod probe;
pub mod probe_all;
pub mod pull;
pub mod rm;
pub mod run;
pub mod serve;
pub mod speculate;
pub mod template;
pub mod tokenize;
pub mod verify;
