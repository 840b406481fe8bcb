//! Who generates when. One engine thread owns the executor and runs every job in progress —
//! up to `parallel` at once — in lockstep: each step advances all of them together, their
//! decode tokens in one batched executor pass that reads the weights once for all ([`Batch`]);
//! a prompt goes in a chunk per step, beside the others' tokens. A job that arrives joins at
//! the next step; jobs beyond `parallel` wait in a bounded queue, and a job that does not fit
//! is refused at once ([`Busy`]).
//!
//! Each job owns a [`Session`] while it runs, so no two requests ever share KV state; between
//! requests the sessions wait in the [`SessionPool`], where a conversation that continues finds
//! its prefix again; a job whose prompt begins as a running job's does takes a copy of that
//! prefix's keys and values instead of prefilling it. A job whose client went away (its update
//! channel closed) is cancelled before the next step, or skipped if it is still queued. A
//! constrained reply (a JSON schema, a forced tool call) steps in the same batch, its draws held
//! to its grammar by the engine.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use anelm_constrain::Constrained;
use anelm_engine::{
    Batch, Event, Finish, GenerateParams, Generation, Input, LoadedModel, PromptLookup, Session,
    Speculation, TokenLogprob,
};
use anelm_model::Executor;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::drafts::{DraftConfig, DraftPool};
use crate::embeddings::EmbedJob;
use crate::metrics::Metrics;
use crate::reasoning::Budget;
use crate::sessions::{common_prefix, SessionPool};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Jobs in progress at once (each step advances all of them together).
    pub parallel: usize,
    /// Jobs that may wait when every slot is busy; more are refused.
    pub queue: usize,
    /// Idle sessions kept for prefix reuse.
    pub cached_sessions: usize,
    /// Prompt lookup speculative decoding for every plain (not JSON-mode) generation.
    pub lookup: Option<LookupConfig>,
    /// Speculative decoding with a draft model instead (`serve --draft`).
    pub draft: Option<DraftConfig>,
}

/// Prompt lookup settings (`serve --lookup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupConfig {
    /// Most tokens drafted per verifying pass.
    pub k: usize,
    /// The longest n-gram matched.
    pub max_ngram: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            queue: 32,
            cached_sessions: 4,
            lookup: None,
            draft: None,
        }
    }
}

/// A request for the engine: one prompt, one or more independent choices (OpenAI's `n`), each
/// with its own parameters.
pub struct Job {
    pub prompt: Vec<u32>,
    pub choices: Vec<GenerateParams>,
    /// What every reply is held to (a JSON object or schema, a forced tool call); each choice
    /// starts from a fresh copy.
    pub constraint: Option<Constrained>,
    /// Each choice's thought ends after this many tokens ([`crate::reasoning::Budget`]).
    pub thinking: Option<Budget>,
}

/// What a job reports, in order; every choice ends with `Finish`, unless `Failed` ends the job.
#[derive(Debug)]
pub enum Update {
    Token {
        choice: usize,
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Text {
        choice: usize,
        text: String,
    },
    Finish {
        choice: usize,
        finish: Finish,
    },
    /// The engine failed; the message is for the client.
    Failed(String),
}

/// The queue is full.
#[derive(Debug)]
pub struct Busy;

/// A snapshot of the scheduler, for `/health` and the tests.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub slots: usize,
    /// Slots running a job.
    pub busy: usize,
    /// Jobs waiting for a slot.
    pub waiting: usize,
    pub queue_capacity: usize,
    /// Jobs run to their end.
    pub completed: u64,
    /// Jobs stopped or skipped because the client went away.
    pub cancelled: u64,
    /// Jobs refused because the queue was full.
    pub refused: u64,
    pub failed: u64,
    /// The most generations one step has advanced together.
    pub widest_step: usize,
}

struct Queued {
    job: Job,
    updates: UnboundedSender<Update>,
    /// When the job arrived, for the time to its first token.
    arrived: Instant,
}

struct Queue {
    jobs: VecDeque<Queued>,
    /// Embedding requests, run between steps ([`crate::embeddings`]).
    embeds: VecDeque<EmbedJob>,
    closed: bool,
}

struct Shared {
    model: Arc<LoadedModel>,
    sessions: SessionPool,
    ctx: usize,
    queue: Mutex<Queue>,
    ready: Condvar,
    config: SchedulerConfig,
    busy: AtomicUsize,
    completed: AtomicU64,
    cancelled: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    widest_step: AtomicUsize,
    /// Draft models not in use (`serve --draft`).
    drafters: DraftPool,
    metrics: Arc<Metrics>,
}

pub struct Scheduler {
    shared: Arc<Shared>,
    slots: usize,
    /// Taken by [`Scheduler::join`].
    engine: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// Starts the engine thread. `ctx` is the capacity of every session.
    pub fn new(
        model: Arc<LoadedModel>,
        exec: Box<dyn Executor>,
        ctx: usize,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> Scheduler {
        let shared = Arc::new(Shared {
            model,
            sessions: SessionPool::new(config.cached_sessions),
            ctx,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                embeds: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            busy: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            widest_step: AtomicUsize::new(0),
            config: config.clone(),
            drafters: DraftPool::default(),
            metrics,
        });
        let engine = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("anelm-engine".into())
                .spawn(move || shared.engine_loop(exec))
                .expect("spawning the engine thread")
        };
        Scheduler {
            shared,
            slots: config.parallel.max(1),
            engine: Mutex::new(Some(engine)),
        }
    }

    /// Queues a job; its updates arrive on the receiver. Dropping the receiver cancels it.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Update>, Busy> {
        let (updates, rx) = unbounded_channel();
        let mut q = lock(&self.shared.queue);
        // The engine takes jobs (and counts them busy) under this lock, so the count is exact.
        let idle = self.slots - self.shared.busy.load(Ordering::Relaxed);
        if q.closed || q.jobs.len() >= self.shared.config.queue + idle {
            self.shared.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Busy);
        }
        q.jobs.push_back(Queued {
            job,
            updates,
            arrived: Instant::now(),
        });
        drop(q);
        self.shared.ready.notify_one();
        Ok(rx)
    }

    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            slots: self.slots,
            busy: s.busy.load(Ordering::Relaxed),
            waiting: lock(&s.queue).jobs.len(),
            queue_capacity: s.config.queue,
            completed: s.completed.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            widest_step: s.widest_step.load(Ordering::Relaxed),
        }
    }

    /// Queues an embedding request; it runs between steps, on the engine thread. Refused when
    /// as many wait as jobs may.
    pub fn embed(&self, job: EmbedJob) -> Result<(), Busy> {
        let mut q = lock(&self.shared.queue);
        if q.closed || q.embeds.len() >= self.shared.config.queue.max(1) {
            self.shared.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Busy);
        }
        q.embeds.push_back(job);
        drop(q);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Refuses new jobs and lets the engine thread end once the queue is empty.
    pub fn close(&self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
    }

    /// Waits for the engine thread to end (after [`Scheduler::close`]); its executor and model
    /// are dropped by then.
    pub fn join(&self) {
        let engine = self.engine.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(engine) = engine {
            let _ = engine.join();
        }
    }
}

/// The queue's lock; a panic elsewhere never leaves it inconsistent (every critical section is
/// a single push, pop or read), so a poisoned lock is still good.
fn lock(q: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a job ended.
enum Outcome {
    Completed,
    Cancelled,
    Failed,
}

/// A job in progress: the generation of its current choice (which holds the job's session),
/// the choices still to come, and where its updates go.
struct Running {
    generation: Option<Generation<'static>>,
    choice: usize,
    rest: VecDeque<GenerateParams>,
    input: Input,
    constraint: Option<Constrained>,
    /// The thinking budget of each choice, and of the current one.
    thinking: Option<Budget>,
    budget: Option<Budget>,
    updates: UnboundedSender<Update>,
    /// Why the last step failed this job.
    error: Option<String>,
    /// When the job arrived and when its last token went out (the latency metrics).
    arrived: Instant,
    last_token: Option<Instant>,
}

impl Shared {
    fn engine_loop(&self, mut exec: Box<dyn Executor>) {
        let mut running: Vec<Running> = Vec::new();
        let mut deferred: VecDeque<Queued> = VecDeque::new();
        let mut batch = Batch::new();
        let copies = copies_prefixes(exec.as_ref());
        loop {
            let embeds = std::mem::take(&mut lock(&self.queue).embeds);
            for e in embeds {
                e.run(exec.as_mut());
            }
            // Jobs join between steps while there is room; with none running, wait for one. A
            // job whose prompt begins as one that a running job is still prefilling waits for
            // that prefix (a step, or one per chunk of a long prompt), then copies it.
            let mut waiting = std::mem::take(&mut deferred);
            while running.len() + deferred.len() < self.config.parallel.max(1) {
                let next = match waiting.pop_front() {
                    Some(q) => Some(q),
                    None => self.next_job(running.is_empty() && deferred.is_empty()),
                };
                let Some(queued) = next else {
                    break;
                };
                if copies && self.waits_for_prefix(&queued, &mut running) {
                    deferred.push_back(queued);
                    continue;
                }
                let started = self.start(exec.as_ref(), queued, &mut running);
                running.extend(started);
            }
            deferred.extend(waiting);
            if running.is_empty() {
                if lock(&self.queue).closed {
                    return;
                }
                continue;
            }
            running.retain_mut(|r| {
                if !r.updates.is_closed() {
                    return true;
                }
                let mut g = r.generation.take().expect("a running job has a generation");
                g.cancel();
                self.recycle(&mut g);
                self.end(g.into_session(), Outcome::Cancelled);
                false
            });
            // A panic in the engine must not take the server down with it: the jobs of the
            // step fail, their sessions are dropped, and the engine carries on.
            let stepped = catch_unwind(AssertUnwindSafe(|| {
                self.step(exec.as_mut(), &mut batch, &mut running)
            }));
            if stepped.is_err() {
                for r in running.drain(..) {
                    let _ = r
                        .updates
                        .send(Update::Failed("internal error in the engine".into()));
                    self.end(None, Outcome::Failed);
                }
                continue;
            }
            running.retain_mut(|r| self.deliver(r));
        }
    }

    /// One step of every running job, all in one batch.
    fn step(&self, exec: &mut dyn Executor, batch: &mut Batch, running: &mut [Running]) {
        let mut gens: Vec<&mut Generation<'static>> = Vec::new();
        let mut errors: Vec<&mut Option<String>> = Vec::new();
        for r in running.iter_mut() {
            gens.extend(r.generation.as_mut());
            errors.push(&mut r.error);
        }
        self.widest_step.fetch_max(gens.len(), Ordering::Relaxed);
        if let Err(e) = batch.step(exec, &mut gens) {
            errors
                .into_iter()
                .for_each(|slot| *slot = Some(e.to_string()));
        }
    }

    /// Sends a job's new events; a finished choice makes way for the next one. False when the
    /// job is over.
    fn deliver(&self, r: &mut Running) -> bool {
        if let Some(e) = r.error.take() {
            let _ = r.updates.send(Update::Failed(e));
            let g = r.generation.take().expect("a running job has a generation");
            self.end(g.into_session(), Outcome::Failed);
            return false;
        }
        let g = r
            .generation
            .as_mut()
            .expect("a running job has a generation");
        let choice = r.choice;
        let mut finished = false;
        while let Some(event) = g.pop_event() {
            match (&mut r.budget, &event) {
                (Some(b), Event::Token { .. }) => b.token(),
                (Some(b), Event::Text(text)) => b.text(text),
                _ => {}
            }
            let update = match event {
                Event::Token { id, logprob } => {
                    let now = Instant::now();
                    match r.last_token.replace(now) {
                        None => self.metrics.first_token(now - r.arrived),
                        Some(prev) => self.metrics.next_token(now - prev),
                    }
                    Update::Token {
                        choice,
                        id,
                        logprob,
                    }
                }
                Event::Text(text) => Update::Text { choice, text },
                Event::Finish(finish) => {
                    finished = true;
                    self.metrics.finished(&finish);
                    Update::Finish { choice, finish }
                }
            };
            // A send fails only when the client is gone; the next step notices.
            let _ = r.updates.send(update);
        }
        if !finished {
            if let Some(close) = r.budget.as_mut().and_then(Budget::due) {
                g.force(close);
            }
            return true;
        }
        let session = r
            .generation
            .take()
            .and_then(|mut g| {
                self.recycle(&mut g);
                g.into_session()
            })
            .expect("the scheduler's generations own their sessions");
        let Some(params) = r.rest.pop_front() else {
            self.end(Some(session), Outcome::Completed);
            return false;
        };
        r.choice += 1;
        r.budget = r.thinking.clone();
        match session.into_generation(&self.model, &r.input, params) {
            Ok(g) => {
                r.generation = Some(self.speculating(g, r.constraint.as_ref()));
                true
            }
            Err((e, session)) => {
                let _ = r.updates.send(Update::Failed(e.to_string()));
                self.end(Some(session), Outcome::Failed);
                false
            }
        }
    }

    /// A generation with its constraint, or with a drafter attached when the server speculates
    /// (a constrained one decodes one token at a time).
    fn speculating(
        &self,
        mut g: Generation<'static>,
        constraint: Option<&Constrained>,
    ) -> Generation<'static> {
        if let Some(c) = constraint {
            g.constrain(Box::new(c.fork()));
            return g;
        }
        if let Some(l) = self.config.lookup {
            let drafter = PromptLookup {
                min_ngram: 1,
                max_ngram: l.max_ngram,
            };
            // k ≥ 1 and the drafter has no vocabulary of its own: attaching cannot fail.
            if let Ok(s) = Speculation::new(Box::new(drafter), l.k) {
                let _ = g.speculate(s);
            }
        } else if let Some(d) = &self.config.draft {
            // The draft's vocabulary was checked when the server started; a drafter that cannot
            // be made (memory) leaves this generation plain rather than failing it.
            match self.drafters.take(d) {
                Ok(drafter) => match Speculation::new(drafter, d.k) {
                    Ok(s) => {
                        if let Err(e) = g.speculate(s) {
                            tracing::warn!("draft model not attached: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("draft model not attached: {e}"),
                },
                Err(e) => tracing::warn!("no draft model for this generation: {e:#}"),
            }
        }
        g
    }

    /// Hands a finished generation's draft model back for the next one.
    fn recycle(&self, g: &mut Generation<'static>) {
        if self.config.draft.is_some() {
            if let Some(s) = g.take_speculation() {
                self.drafters.give_back(s.drafter);
            }
        }
    }

    /// Whether `queued` should wait a step for a running job that is prefilling a longer prefix
    /// of its prompt than any session could give it now (not when its client has left).
    fn waits_for_prefix(&self, queued: &Queued, running: &mut [Running]) -> bool {
        let prompt = &queued.job.prompt;
        let want = prompt.len().saturating_sub(1);
        if queued.updates.is_closed() || want < SHARE_AT_LEAST {
            return false;
        }
        let mut now = self.sessions.longest_prefix(prompt).min(want);
        let mut coming = 0;
        for g in running.iter_mut().filter_map(|r| r.generation.as_mut()) {
            if g.is_finished() {
                continue;
            }
            let will = common_prefix(g.prompt(), prompt).min(want);
            let held = g.session_mut().common_prefix(prompt).min(want);
            now = now.max(held);
            coming = coming.max(will);
        }
        coming >= now + SHARE_AT_LEAST
    }

    /// Starts a job taken from the queue: its session (with the longest cached prefix, or the
    /// longer prefix a running job's session shares with it, copied) and its first choice's
    /// generation. None when it ends at once.
    fn start(
        &self,
        exec: &dyn Executor,
        queued: Queued,
        running: &mut [Running],
    ) -> Option<Running> {
        let Queued {
            job,
            updates,
            arrived,
        } = queued;
        if updates.is_closed() {
            self.end(None, Outcome::Cancelled);
            return None;
        }
        let session = self
            .sessions
            .take(&job.prompt, || Session::new(exec, self.ctx));
        let mut session = match session {
            Ok(s) => s,
            Err(e) => {
                let _ = updates.send(Update::Failed(e.to_string()));
                self.end(None, Outcome::Failed);
                return None;
            }
        };
        share_prefix(&mut session, &job.prompt, running);
        let mut rest: VecDeque<GenerateParams> = job.choices.into();
        let Some(params) = rest.pop_front() else {
            self.end(Some(session), Outcome::Completed);
            return None;
        };
        let input = Input::Ids(job.prompt);
        match session.into_generation(&self.model, &input, params) {
            Ok(g) => Some(Running {
                generation: Some(self.speculating(g, job.constraint.as_ref())),
                choice: 0,
                rest,
                input,
                constraint: job.constraint,
                budget: job.thinking.clone(),
                thinking: job.thinking,
                updates,
                error: None,
                arrived,
                last_token: None,
            }),
            Err((e, session)) => {
                let _ = updates.send(Update::Failed(e.to_string()));
                self.end(Some(session), Outcome::Failed);
                None
            }
        }
    }

    /// A job is over: its session goes back to the pool (if it has one to give), the counts.
    fn end(&self, session: Option<Session>, outcome: Outcome) {
        if let Some(s) = session {
            self.sessions.give_back(s);
        }
        self.busy.fetch_sub(1, Ordering::Relaxed);
        match outcome {
            Outcome::Completed => &self.completed,
            Outcome::Cancelled => &self.cancelled,
            Outcome::Failed => &self.failed,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// The next job, counted busy from the moment it is taken; with `wait`, waits for one
    /// (None: the queue is closed and empty), else None when none is waiting.
    fn next_job(&self, wait: bool) -> Option<Queued> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                self.busy.fetch_add(1, Ordering::Relaxed);
                return Some(job);
            }
            if q.closed || !wait || !q.embeds.is_empty() {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Fewest more prompt tokens a running job's session must share with a new prompt than the
/// new job's own session does for its keys and values to be copied (a copy is a memory copy of
/// a few kilobytes per position per layer; a prefill of that many tokens costs far more).
const SHARE_AT_LEAST: usize = 8;

/// Concurrent requests that begin alike (a system prompt, an agent's tools) share their
/// prefill: when a running job's session holds a longer prefix of `prompt` than `session` does,
/// `session` takes it as a copy (all but the prompt's last token, which gives the logits).
fn share_prefix(session: &mut Session, prompt: &[u32], running: &mut [Running]) {
    let want = prompt.len().saturating_sub(1);
    let own = session.common_prefix(prompt).min(want);
    let best = running
        .iter_mut()
        .filter_map(|r| r.generation.as_mut())
        .map(|g| {
            let shared = g.session_mut().common_prefix(prompt).min(want);
            (shared, g)
        })
        .max_by_key(|(shared, _)| *shared);
    if let Some((shared, g)) = best {
        if shared >= own + SHARE_AT_LEAST {
            session.adopt_prefix(g.session_mut(), shared);
        }
    }
}

/// Whether the executor's states take prefixes by copy (waiting for one is pointless where
/// they cannot: the job would prefill it anyway).
fn copies_prefixes(exec: &dyn Executor) -> bool {
    match (exec.new_state(1), exec.new_state(1)) {
        (Ok(mut a), Ok(mut b)) => b.copy_prefix(a.as_mut(), 0),
        _ => false,
    }
}
