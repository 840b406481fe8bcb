//! `anelm chat`: a terminal conversation with the model. Answers stream as they are generated;
//! each turn reuses the cached keys and values of the conversation so far, and a line after
//! each answer tells the speed and how much of the prompt came from the cache.

use std::io::{BufRead, Write};

use anelm_engine::{
    Event, Finish, FinishReason, GenerateParams, Input, Message, Overflow, Session, Speculation,
};
use anyhow::Result;

use super::common::{FallbackArgs, ModelArgs, TemplateKwargsArgs};
use super::run::SamplingArgs;
use super::speculate::SpeculateArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub fallback: FallbackArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message to start with.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Context size in tokens (default: the model's, at most 4096). When a conversation outgrows
    /// it, the oldest turns are dropped (and the drop is reported).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Stop an answer when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub template_kwargs: TemplateKwargsArgs,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
}

const HELP: &str = "\
commands:
  /reset          forget the conversation (the system message stays)
  /system TEXT    set the system message (empty TEXT removes it)
  /temp X         sampling temperature (0 = greedy)
  /topp P         top-p (1 = off)
  /help           this text
  /quit           leave (so does end of input, Ctrl-D)";

/// Default context when the model allows more: enough for a long chat, modest in memory.
const DEFAULT_CTX: usize = 4096;

struct Chat {
    system: Option<String>,
    /// The conversation without the system message.
    turns: Vec<Message>,
    params: GenerateParams,
    /// The drafter, kept from answer to answer (a loaded draft model stays loaded).
    speculation: Option<Speculation>,
}

impl Chat {
    fn messages(&self) -> Vec<Message> {
        let system = self.system.iter().map(|s| Message::system(s));
        system.chain(self.turns.iter().cloned()).collect()
    }
}

pub fn run(a: Args) -> Result<()> {
    let mut loaded = a.model.load()?;
    a.template_kwargs.apply(&mut loaded);
    // Chat needs text in and out: refuse a model without a tokenizer before the first turn.
    loaded.tokenizer()?;
    let template = loaded.chat_template()?;
    let ctx = a
        .ctx
        .unwrap_or(DEFAULT_CTX)
        .min(loaded.model.max_positions());
    let fallback = a.fallback.resolve(a.model.device);
    let mut exec = a.model.executor_with_fallback(&loaded, ctx, fallback)?.0;
    let mut session = Session::new(exec.as_ref(), ctx)?;
    let mut chat = Chat {
        system: a.system.clone(),
        turns: Vec::new(),
        params: GenerateParams {
            sampling: a.sampling.params(0.8),
            max_tokens: a.max_tokens,
            stop: a.stop.clone(),
            overflow: Overflow::DropOldestTurns,
            ..GenerateParams::default()
        },
        speculation: a.speculate.build(&a.model, &loaded, ctx)?,
    };
    chat.params
        .sampling
        .validate(loaded.model.config.vocab_size)
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "anelm chat: {} ({}), context {ctx} tokens, template: {}. /help for commands.",
        loaded.model.config.name,
        loaded.model.config.family.name(),
        template.origin()
    );
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut line = String::new();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let input = line.trim_end_matches(['\n', '\r']);
        if input.trim().is_empty() {
            continue;
        }
        if let Some(cmd) = input.strip_prefix('/') {
            if !command(cmd, &mut chat, &mut session) {
                return Ok(());
            }
            continue;
        }
        chat.turns.push(Message::user(input));
        match answer(&mut chat, &mut session, exec.as_mut(), &loaded, &mut out) {
            Ok(finish) => report(&finish),
            Err(e) => {
                // The turn did not happen: forget it and carry on.
                chat.turns.pop();
                eprintln!("error: {e:#}");
            }
        }
    }
}

/// Runs a command; false means leave.
fn command(cmd: &str, chat: &mut Chat, session: &mut Session) -> bool {
    let (name, arg) = cmd
        .split_once(' ')
        .map_or((cmd, ""), |(n, a)| (n, a.trim()));
    let number = |what: &str| {
        arg.parse::<f32>()
            .map_err(|_| format!("/{what} needs a number, got '{arg}'"))
    };
    let result = match name {
        "quit" | "exit" => return false,
        "help" => Ok(HELP.to_string()),
        "reset" => {
            chat.turns.clear();
            session.reset();
            Ok("conversation cleared".to_string())
        }
        "system" => {
            chat.system = (!arg.is_empty()).then(|| arg.to_string());
            Ok(if arg.is_empty() {
                "system message removed".into()
            } else {
                "system message set".into()
            })
        }
        "temp" => number("temp").and_then(|t| {
            let mut s = chat.params.sampling.clone();
            s.temperature = t;
            set_sampling(chat, s).map(|()| format!("temperature {t}"))
        }),
        "topp" => number("topp").and_then(|p| {
            let mut s = chat.params.sampling.clone();
            s.top_p = p;
            set_sampling(chat, s).map(|()| format!("top-p {p}"))
        }),
        _ => Err(format!("unknown command /{name}; /help lists them")),
    };
    match result {
        Ok(msg) => eprintln!("[{msg}]"),
        Err(msg) => eprintln!("error: {msg}"),
    }
    true
}

fn set_sampling(chat: &mut Chat, s: anelm_engine::SamplingParams) -> Result<(), String> {
    // The vocabulary size only matters for logit biases, which these commands do not change.
    s.validate(usize::MAX)?;
    chat.params.sampling = s;
    Ok(())
}

/// Generates the answer to the conversation, streaming it to `out`, and records it.
fn answer(
    chat: &mut Chat,
    session: &mut Session,
    exec: &mut dyn anelm_model::Executor,
    loaded: &anelm_engine::LoadedModel,
    out: &mut impl Write,
) -> Result<Finish> {
    let input = Input::Messages(chat.messages());
    let mut text = String::new();
    let mut generation = session.generate(loaded, &input, chat.params.clone())?;
    if let Some(s) = chat.speculation.take() {
        generation.speculate(s)?;
    }
    let finish = loop {
        let event = match generation.next_event(exec) {
            Ok(e) => e.expect("a generation ends with a finish"),
            Err(e) => {
                chat.speculation = generation.take_speculation();
                return Err(e.into());
            }
        };
        match event {
            Event::Text(delta) => {
                text.push_str(&delta);
                // A closed terminal ends the answer.
                if out
                    .write_all(delta.as_bytes())
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    generation.cancel();
                }
            }
            Event::Finish(f) => break f,
            Event::Token { .. } => {}
        }
    };
    chat.speculation = generation.take_speculation();
    writeln!(out)?;
    // Turns the context could not hold are gone for good (a system message is never dropped).
    chat.turns.drain(..finish.usage.dropped_messages);
    chat.turns.push(Message::assistant(&text));
    Ok(finish)
}

fn report(f: &Finish) {
    let mut line = format!(
        "[{} tokens, {:.1} tok/s | prompt {} tokens, {} cached",
        f.usage.completion_tokens,
        f.decode_tokens_per_second(),
        f.usage.prompt_tokens,
        f.usage.cached_tokens
    );
    let s = &f.speculative;
    if s.target_passes > 0 {
        line += &format!(
            " | speculative: {}/{} drafted tokens accepted",
            s.accepted, s.drafted
        );
    }
    if f.usage.dropped_messages > 0 {
        line += &format!(
            " | dropped the {} oldest messages to fit the context",
            f.usage.dropped_messages
        );
    }
    match f.reason {
        FinishReason::Length => line += " | cut at --max-tokens",
        FinishReason::ContextFull => line += " | the context is full: /reset to start over",
        _ => {}
    }
    eprintln!("{line}]");
}
