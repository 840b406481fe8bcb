//! The `anelm` command line.

mod cmd;
mod models;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "anelm",
    version,
    about = "Run decoder LLMs on the Apple Neural Engine, with a fast CPU engine beside it"
)]
struct Cli {
    /// More log output (-v info, -vv debug); ANELM_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt.
    Run(cmd::run::Args),
    /// Chat with the model in the terminal.
    Chat(cmd::chat::Args),
    /// Serve the OpenAI and Anthropic APIs and a web chat over HTTP.
    Serve(cmd::serve::Args),
    /// Download a model from the Hugging Face Hub into the Hugging Face cache.
    Pull(cmd::pull::Args),
    /// The models in the Hugging Face cache, Ollama's store and anelm's model directory.
    List(cmd::list::Args),
    /// Remove a model from the Hugging Face cache or anelm's model directory.
    Rm(cmd::rm::Args),
    /// Print the prompt a conversation (a JSON messages file) becomes under the chat template.
    Template(cmd::template::Args),
    /// Evaluate a prompt: argmax at every position, the last logits, greedy tokens (JSON).
    Eval(cmd::eval::Args),
    /// Embed texts: an embedding model (BERT) as its configuration pools, or a chat model's
    /// pooled hidden states; one JSON array per text.
    Embed(cmd::embed::Args),
    /// Tokenize text with the model's tokenizer.
    Tokenize(cmd::tokenize::Args),
    /// Perplexity of a text file, computed as llama.cpp's llama-perplexity does.
    Perplexity(cmd::perplexity::Args),
    /// Inspect MIL programs: print (canonical form) or check (parse + ANE lint).
    Mil(cmd::mil::Args),
    /// Prompt-processing and generation speed (tok/s), weight bandwidth and peak RSS.
    Bench(cmd::bench::Args),
    /// What this machine offers the ANE path: libraries, classes, chip, and why not if not.
    Info(cmd::info::Args),
    /// Compile one 1×1 conv, run it on the ANE through a driver, compare with the CPU.
    Probe(cmd::probe::Args),
    Compile(cmd::compile::Args),
    Check(cmd::check::Args),
    Verify(cmd::verify::Args),
    Layers(cmd::layers::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("ANELM_LOG").unwrap_or_else(|_| level.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::List(a) => cmd::list::run(a),
        Command::Rm(a) => cmd::rm::run(a),
        Command::Template(a) => cmd::template::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Eval(a) => cmd::eval::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Mil(a) => cmd::mil::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Compile(a) => cmd::compile::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Layers(a) => cmd::layers::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
