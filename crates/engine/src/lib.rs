//! anelm's engine: sessions (KV cache ownership, prefix reuse), sampling and generation, above
//! any [`anelm_model::Executor`] — CPU, ANE simulator or ANE.
//!
//! ```no_run
//! # fn demo(exec: &mut dyn anelm_model::Executor) -> anelm_engine::Result<()> {
//! use anelm_engine::{Event, GenerateParams, Input, LoadedModel, Message, Session};
//!
//! let model = LoadedModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref()).expect("model");
//! let mut session = Session::new(exec, 4096)?;
//! let input = Input::Messages(vec![Message::user("Name a prime number.")]);
//! let mut generation = session.generate(&model, &input, GenerateParams::default())?;
//! while let Some(event) = generation.next_event(exec)? {
//!     match event {
//!         Event::Token { .. } => {}
//!         Event::Text(delta) => print!("{delta}"),
//!         Event::Finish(f) => println!("\n[{}: {} tokens]", f.reason.as_str(), f.usage.completion_tokens),
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod batch;
pub mod constraint;
pub mod error;
pub mod generate;
pub mod loaded;
pub mod prompt;
mod rng;
pub mod sampler;
pub mod session;
pub mod speculative;
pub mod stop;
pub mod text_side;
pub mod utf8_stream;

pub use anelm_tokenize::{template_kwargs, ChatTemplate, Message, RenderOptions, TemplateKwargs};
pub use batch::Batch;
pub use constraint::Constraint;
pub use error::{EngineError, Result};
pub use generate::{Event, Finish, FinishReason, GenerateParams, Generation, Timings, Usage};
pub use loaded::{LoadError, LoadedModel};
pub use prompt::{Input, Overflow};
pub use sampler::{argmax, logprobs, Prob, Sampler, SamplingParams, TokenLogprob};
pub use session::{PrefillStep, Session};
pub use speculative::{
    same_vocabulary, DraftModel, Drafter, PromptLookup, Proposal, SpecStats, Speculation,
};
pub use stop::{StopScan, StopStrings};
pub use text_side::TextSide;
pub use utf8_stream::Utf8Stream;
