//! Generation: a prompt in, a stream of events out — every token, every piece of text that is
//! complete UTF-8 and clear of stop strings, and a finish with its reason, the usage and the
//! timings.
//!
//! A [`Generation`] borrows (or owns) its session but not the executor: each [`Generation::next_event`]
//! call takes the executor, so one executor can step several generations in turn, and a caller
//! can stop between any two tokens ([`Generation::cancel`]).

use std::collections::VecDeque;
use std::ops::{ControlFlow, Range};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anelm_model::{Executor, Logits, Run};
use anelm_tokenize::Tokenizer;

use crate::constraint::Constraint;
use crate::error::{EngineError, Result};
use crate::loaded::LoadedModel;
use crate::prompt::{prepare, Input, Overflow};
use crate::sampler::{logprobs, Sampler, SamplingParams, TokenLogprob};
use crate::session::{PrefillStep, Session};
use crate::speculative::{Beside, SpecStats, Speculation};
use crate::stop::{StopScan, StopStrings};
use crate::utf8_stream::Utf8Stream;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    /// Most tokens to generate (the end-of-generation token included).
    pub max_tokens: usize,
    /// Strings that end the generation; none of their text is emitted.
    pub stop: Vec<String>,
    /// Report each token's log-probability and this many most likely alternatives (OpenAI's
    /// `logprobs` / `top_logprobs`), taken after logit bias and penalties, before temperature
    /// and truncation.
    pub logprobs: Option<usize>,
    pub overflow: Overflow,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            logprobs: None,
            overflow: Overflow::Error,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Stop,
    /// A stop string appeared in the text.
    StopString,
    /// `max_tokens` were generated.
    Length,
    /// The session's context is full.
    ContextFull,
    /// The caller cancelled.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::StopString => "stop_string",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }

    /// The reason as OpenAI names it: `stop` or `length` (`cancelled` has no OpenAI name).
    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Tokens generated, the end-of-generation token included.
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values the session already held (not recomputed).
    pub cached_tokens: usize,
    /// Messages dropped from the front of the conversation to fit the context.
    pub dropped_messages: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Forward passes over the prompt tokens that were not cached.
    pub prefill: Duration,
    pub prefilled_tokens: usize,
    /// Everything after the prefill: forward passes, sampling, detokenisation.
    pub decode: Duration,
}

impl Timings {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prefilled_tokens, self.prefill)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    /// What speculative decoding drafted and kept (zeros without it).
    pub speculative: SpecStats,
    /// The sampler's seed (the given one, or the one taken from the clock).
    pub seed: u64,
}

impl Finish {
    /// Generated tokens per second of decoding.
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.usage.completion_tokens, self.timings.decode)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token (every one, the final end-of-generation token included).
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    /// Text that became complete: whole UTF-8 characters, clear of any stop string. Special
    /// tokens (end of turn, ...) have no text.
    Text(String),
    /// The last event.
    Finish(Finish),
}

/// What a generation feeds to a batched pass ([`crate::Batch::step`]).
pub(crate) enum Feed {
    Nothing,
    /// The token drawn last, to decode.
    Token(u32),
    /// The next chunk of the prompt (a range of it), and how it stands.
    Prompt {
        chunk: Range<usize>,
        step: PrefillStep,
    },
    /// A speculative step's run: the token drawn last and the drafted ones
    /// ([`Generation::verify_tokens`]), to verify.
    Verify(Run),
}

enum Phase {
    Prefill,
    /// Decoding; the token to feed before the next draw (none right after the prefill).
    Decode(Option<u32>),
    Done,
}

/// The session of a generation: borrowed, or owned by a generation that must outlive the
/// caller's frame (a server's loop keeps its generations between steps).
pub(crate) enum Held<'s> {
    Borrowed(&'s mut Session),
    Owned(Box<Session>),
}

impl std::ops::Deref for Held<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        match self {
            Held::Borrowed(s) => s,
            Held::Owned(s) => s,
        }
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        match self {
            Held::Borrowed(s) => s,
            Held::Owned(s) => s,
        }
    }
}

/// One generation in progress over a session.
pub struct Generation<'s> {
    pub(crate) session: Held<'s>,
    tokenizer: Option<Arc<Tokenizer>>,
    stop_ids: Vec<u32>,
    prompt: Vec<u32>,
    /// The model's vocabulary size (a drafter must have the same).
    vocab: usize,
    pub(crate) max_tokens: usize,
    pub(crate) top_logprobs: Option<usize>,
    pub(crate) sampler: Sampler,
    pub(crate) logits: Vec<f32>,
    utf8: Utf8Stream,
    stops: StopStrings,
    pending: VecDeque<Event>,
    phase: Phase,
    pub(crate) usage: Usage,
    timings: Timings,
    /// The drafter, when decoding speculatively, and what it achieved.
    pub(crate) speculation: Option<Speculation>,
    pub(crate) spec_stats: SpecStats,
    /// When the decode step in progress began (its time counts even if it ends the generation).
    step_started: Option<Instant>,
    /// Whether a prefill chunk has run (the first one tells how much was cached).
    prefill_started: bool,
    /// A batched step in progress will draw a token for this generation.
    drawing: bool,
    /// Tokens the next draws take instead of sampling ([`Generation::force`]).
    forced: VecDeque<u32>,
    /// What the drawn tokens are held to ([`Generation::constrain`]).
    constraint: Option<Box<dyn Constraint>>,
}

/// A checked prompt and parameters, before a session is attached.
struct Start {
    prompt: Vec<u32>,
    usage: Usage,
}

impl Start {
    fn new(
        model: &LoadedModel,
        input: &Input,
        params: &GenerateParams,
        capacity: usize,
    ) -> Result<Start> {
        params
            .sampling
            .validate(model.model.config.vocab_size)
            .map_err(EngineError::BadParams)?;
        if params.max_tokens == 0 {
            return Err(EngineError::BadParams(
                "max_tokens must be at least 1".into(),
            ));
        }
        let prompt = prepare(model, input, capacity, params.max_tokens, params.overflow)?;
        let usage = Usage {
            prompt_tokens: prompt.ids.len(),
            dropped_messages: prompt.dropped_messages,
            ..Usage::default()
        };
        Ok(Start {
            prompt: prompt.ids,
            usage,
        })
    }

    fn generation<'s>(
        self,
        session: Held<'s>,
        model: &LoadedModel,
        params: GenerateParams,
    ) -> Generation<'s> {
        Generation {
            session,
            tokenizer: model.tokenizer.clone(),
            stop_ids: model.stop_ids(),
            prompt: self.prompt,
            vocab: model.model.config.vocab_size,
            max_tokens: params.max_tokens,
            top_logprobs: params.logprobs,
            sampler: Sampler::new(params.sampling),
            logits: Vec::new(),
            utf8: Utf8Stream::new(),
            stops: StopStrings::new(&params.stop),
            pending: VecDeque::new(),
            phase: Phase::Prefill,
            usage: self.usage,
            timings: Timings::default(),
            step_started: None,
            prefill_started: false,
            drawing: false,
            speculation: None,
            spec_stats: SpecStats::default(),
            forced: VecDeque::new(),
            constraint: None,
        }
    }
}

impl Session {
    /// Starts a generation: prepares the prompt (tokenizing or rendering the template, and the
    /// overflow policy) and checks the parameters. The work happens in
    /// [`Generation::next_event`]; the prompt reuses whatever prefix the session holds.
    pub fn generate<'s>(
        &'s mut self,
        model: &LoadedModel,
        input: &Input,
        params: GenerateParams,
    ) -> Result<Generation<'s>> {
        let start = Start::new(model, input, &params, self.capacity())?;
        Ok(start.generation(Held::Borrowed(self), model, params))
    }

    /// [`Session::generate`] on a session the generation takes with it (and gives back with
    /// [`Generation::into_session`]); on an error the session comes back with it.
    pub fn into_generation(
        self,
        model: &LoadedModel,
        input: &Input,
        params: GenerateParams,
    ) -> std::result::Result<Generation<'static>, (EngineError, Session)> {
        match Start::new(model, input, &params, self.capacity()) {
            Ok(start) => Ok(start.generation(Held::Owned(Box::new(self)), model, params)),
            Err(e) => Err((e, self)),
        }
    }

    /// Runs a whole generation, handing each event to `on_event`; `ControlFlow::Break` cancels
    /// (the finish still comes, with reason `Cancelled`). Returns the finish.
    pub fn generate_with(
        &mut self,
        exec: &mut dyn Executor,
        model: &LoadedModel,
        input: &Input,
        params: GenerateParams,
        mut on_event: impl FnMut(&Event) -> ControlFlow<()>,
    ) -> Result<Finish> {
        let mut generation = self.generate(model, input, params)?;
        while let Some(event) = generation.next_event(exec)? {
            let flow = on_event(&event);
            if let Event::Finish(f) = event {
                return Ok(f);
            }
            if flow.is_break() {
                generation.cancel();
            }
        }
        unreachable!("a generation always ends with a finish event")
    }
}

impl Generation<'_> {
    /// The prompt's tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Decodes speculatively from now on: `speculation`'s drafter proposes, the target verifies
    /// several tokens per pass ([`crate::speculative`]). The output keeps the target's law
    /// (greedy: its exact tokens).
    /// A drafter of another vocabulary size is refused.
    pub fn speculate(&mut self, mut speculation: Speculation) -> Result<()> {
        if self.constraint.is_some() {
            return Err(EngineError::BadParams(
                "a constrained generation decodes one token at a time: it cannot speculate".into(),
            ));
        }
        if let Some(n) = speculation.drafter.vocab_size() {
            if n != self.vocab {
                return Err(EngineError::BadParams(format!(
                    "the draft's vocabulary has {n} tokens, the target's {}: they must be the same",
                    self.vocab
                )));
            }
        }
        let params = self.sampler.params();
        speculation.drafter.start(params);
        // Seeded draws keep a schedule that depends on nothing but the tokens.
        speculation.timed = speculation.may_time() && (params.is_greedy() || params.seed.is_none());
        self.speculation = Some(speculation);
        Ok(())
    }

    /// Holds every token drawn from now on to `constraint` (a JSON schema, a grammar). A
    /// constrained generation does not speculate: an attached speculation is given back.
    pub fn constrain(&mut self, constraint: Box<dyn Constraint>) -> Option<Speculation> {
        self.constraint = Some(constraint);
        self.speculation.take()
    }

    /// Whether the constraint (if any) is satisfied by the text so far.
    pub fn constraint_complete(&self) -> Option<bool> {
        self.constraint.as_ref().map(|c| c.complete())
    }

    /// Takes the speculation back (to reuse its drafter, e.g. a loaded draft model, for the
    /// next generation).
    pub fn take_speculation(&mut self) -> Option<Speculation> {
        self.speculation.take()
    }

    /// The next event, computing as much as it takes (the prefill, or one token); None after
    /// the finish.
    pub fn next_event(&mut self, exec: &mut dyn Executor) -> Result<Option<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let start = Instant::now();
            match self.phase {
                Phase::Done => return Ok(None),
                Phase::Prefill => {
                    self.prefill_step(exec)?;
                }
                Phase::Decode(feed) => {
                    self.step_started = Some(start);
                    self.step(exec, feed)?;
                    self.step_done();
                }
            }
        }
    }

    /// Advances the prefill by one chunk of at most [`crate::session::PREFILL_CHUNK`] tokens;
    /// true once the prompt is in (and always after it). Optional: [`Generation::next_event`]
    /// runs whatever prefill remains. Calling this first lets a caller cancel, or lend the
    /// executor to other generations, between the chunks of a long prompt.
    pub fn prefill_step(&mut self, exec: &mut dyn Executor) -> Result<bool> {
        if !matches!(self.phase, Phase::Prefill) {
            return Ok(true);
        }
        let start = Instant::now();
        let step = self
            .session
            .prefill_chunk(exec, &self.prompt, &mut self.logits)?;
        self.prefilled(step, start);
        Ok(step.done)
    }

    /// Books a prefill chunk that began at `start`; the last one moves on to decoding.
    fn prefilled(&mut self, step: PrefillStep, start: Instant) {
        if !self.prefill_started {
            self.prefill_started = true;
            self.usage.cached_tokens = step.reused;
            self.timings.prefilled_tokens = self.prompt.len() - step.reused;
        }
        self.timings.prefill += start.elapsed();
        if step.done {
            self.phase = Phase::Decode(None);
        }
    }

    /// Ends the generation now: the text held back so far and the finish (reason `Cancelled`)
    /// are the remaining events.
    pub fn cancel(&mut self) {
        if !matches!(self.phase, Phase::Done) {
            self.finish(FinishReason::Cancelled);
        }
    }

    /// The session of a generation made by [`Session::into_generation`] (None for a borrowed
    /// one). It holds the prompt and the tokens generated so far.
    pub fn into_session(self) -> Option<Session> {
        match self.session {
            Held::Owned(s) => Some(*s),
            Held::Borrowed(_) => None,
        }
    }

    /// The session the generation runs in: the prompt's tokens it holds so far, then the
    /// generated ones.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Whether the generation has ended (events may still be queued).
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Makes the next draws take `tokens`, in order, instead of sampling (a server ends a
    /// thought that ran past its budget this way). They count, stop and limit as drawn ones do.
    pub fn force(&mut self, tokens: &[u32]) {
        self.forced.extend(tokens);
    }

    /// Whether forced tokens are waiting ([`Generation::force`]).
    pub(crate) fn has_forced(&self) -> bool {
        !self.forced.is_empty()
    }

    /// The next event already computed, computing nothing ([`crate::Batch::step`] computes).
    pub fn pop_event(&mut self) -> Option<Event> {
        self.pending.pop_front()
    }

    /// Whether the next batched step verifies drafted tokens (decoding speculatively).
    pub(crate) fn drafting(&self) -> bool {
        self.speculation.is_some() && matches!(self.phase, Phase::Decode(Some(_)))
    }

    /// Whether the generation is still taking its prompt.
    pub(crate) fn prefilling(&self) -> bool {
        matches!(self.phase, Phase::Prefill)
    }

    /// The first half of a batched step: a prefill chunk (at most `chunk` tokens), a drafted
    /// run to verify, or the check that the context has room. Returns what this generation
    /// feeds to the batched pass, if anything.
    pub(crate) fn batch_begin(
        &mut self,
        start: Instant,
        chunk: usize,
        beside: Beside,
    ) -> Result<Feed> {
        self.drawing = false;
        match self.phase {
            Phase::Done => Ok(Feed::Nothing),
            Phase::Prefill => {
                let (chunk, step) = self.session.next_chunk(&self.prompt, chunk)?;
                self.step_started = Some(start);
                Ok(Feed::Prompt { chunk, step })
            }
            Phase::Decode(Some(feed)) if self.speculation.is_some() => {
                self.step_started = Some(start);
                Ok(self
                    .batch_draft(feed, beside)?
                    .map_or(Feed::Nothing, Feed::Verify))
            }
            Phase::Decode(feed) => {
                self.step_started = Some(start);
                if feed.is_some() && !self.room() {
                    return Ok(Feed::Nothing);
                }
                self.drawing = true;
                Ok(feed.map_or(Feed::Nothing, Feed::Token))
            }
        }
    }

    /// The prompt tokens of a [`Feed::Prompt`].
    pub(crate) fn prompt_tokens(&self, chunk: Range<usize>) -> &[u32] {
        &self.prompt[chunk]
    }

    /// The state a batched pass appends the fed token to.
    pub(crate) fn state_mut(&mut self) -> &mut dyn anelm_model::KvState {
        self.session.state_mut()
    }

    /// The second half of a batched step: draws the next token from the logits after the fed
    /// token (`fed`: the token and its row, which the draw may change — it is not copied), or
    /// from the prefill's.
    pub(crate) fn batch_end(&mut self, fed: Option<(u32, &mut [f32])>) {
        let drawing = std::mem::take(&mut self.drawing);
        match fed {
            Some((token, row)) => {
                self.session.appended(&[token]);
                if drawing {
                    self.draw_from(row);
                }
            }
            None if drawing => self.draw(),
            None => {}
        }
        self.step_done();
    }

    /// The second half of a batched step that fed a prompt chunk (`row`: the logits after its
    /// last token, kept when the chunk ends the prompt).
    pub(crate) fn batch_end_prompt(&mut self, chunk: Range<usize>, step: PrefillStep, row: &[f32]) {
        let start = self.step_started.take().unwrap_or_else(Instant::now);
        self.session.appended(&self.prompt[chunk]);
        if step.done {
            self.logits.clear();
            self.logits.extend_from_slice(row);
        }
        self.prefilled(step, start);
    }

    /// Counts the decode step in progress, if any, into the timings.
    pub(crate) fn step_done(&mut self) {
        if let Some(s) = self.step_started.take() {
            self.timings.decode += s.elapsed();
        }
    }

    /// Whether the session has room for one more token; finishes the generation if not.
    pub(crate) fn room(&mut self) -> bool {
        let full = self.session.tokens().len() >= self.session.capacity();
        if full {
            self.finish(FinishReason::ContextFull);
        }
        !full
    }

    /// Feeds the previous token (if any) and draws the next one.
    fn step(&mut self, exec: &mut dyn Executor, feed: Option<u32>) -> Result<()> {
        if let (Some(token), true) = (feed, self.speculation.is_some()) {
            return self.speculative_step(exec, token);
        }
        if let Some(token) = feed {
            if !self.room() {
                return Ok(());
            }
            self.session
                .run(exec, &[token], Logits::Last, &mut self.logits)?;
        }
        self.draw();
        Ok(())
    }

    /// Draws the next token from the logits (or takes the next forced one).
    pub(crate) fn draw(&mut self) {
        let mut logits = std::mem::take(&mut self.logits);
        self.draw_from(&mut logits);
        self.logits = logits;
    }

    /// Draws the next token from `logits` (which the sampler adjusts in place), or takes the
    /// next forced one.
    pub(crate) fn draw_from(&mut self, logits: &mut [f32]) {
        let id = match self.forced.pop_front() {
            Some(id) => id,
            None => {
                if let Some(c) = &mut self.constraint {
                    c.mask(logits);
                }
                self.sampler.adjust(logits, self.session.tokens());
                self.sampler.choose(logits)
            }
        };
        let logprob = self.top_logprobs.map(|n| logprobs(logits, id, n));
        self.emit(id, logprob);
    }

    /// Emits a chosen token: its events, and the end of the generation when it stops,
    /// completes a stop string or reaches the limit. True when the generation ended.
    pub(crate) fn emit(&mut self, id: u32, logprob: Option<TokenLogprob>) -> bool {
        self.sampler.accept(id);
        if let Some(c) = &mut self.constraint {
            c.accept(id);
        }
        self.usage.completion_tokens += 1;
        self.pending.push_back(Event::Token { id, logprob });
        if self.stop_ids.contains(&id) {
            self.finish(FinishReason::Stop);
            return true;
        }
        if let Some(tok) = self.tokenizer.as_ref().filter(|t| !t.is_special(id)) {
            let text = self.utf8.push(&tok.token_to_piece(id));
            if !text.is_empty() && self.scan_text(&text) {
                self.finish(FinishReason::StopString);
                return true;
            }
        }
        if self.usage.completion_tokens >= self.max_tokens {
            self.finish(FinishReason::Length);
            return true;
        }
        self.phase = Phase::Decode(Some(id));
        false
    }

    /// Passes text through the stop strings; true when one of them ended the stream.
    fn scan_text(&mut self, text: &str) -> bool {
        let (out, stopped) = match self.stops.push(text) {
            StopScan::Continue(t) => (t, false),
            StopScan::Stopped(t) => (t, true),
        };
        if !out.is_empty() {
            self.pending.push_back(Event::Text(out));
        }
        stopped
    }

    fn finish(&mut self, mut reason: FinishReason) {
        if reason != FinishReason::StopString {
            // An incomplete character at the very end comes out as U+FFFD; what the stop
            // strings held back is released, unless the last bytes complete a stop string.
            let rest = self.utf8.finish();
            if self.scan_text(&rest) {
                reason = FinishReason::StopString;
            } else {
                let held = self.stops.finish();
                if !held.is_empty() {
                    self.pending.push_back(Event::Text(held));
                }
            }
        }
        self.step_done();
        self.pending.push_back(Event::Finish(Finish {
            reason,
            usage: self.usage,
            timings: self.timings,
            speculative: self.spec_stats,
            seed: self.sampler.seed(),
        }));
        self.phase = Phase::Done;
    }
}
