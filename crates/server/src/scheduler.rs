//! Who generates when. One executor serves every request: `parallel` slot threads each run one
//! job at a time and take turns on the executor one step (a prefill or one token) at a time,
//! through a fair lock, so concurrent streams advance together. Jobs beyond the busy slots wait
//! in a bounded queue; a job that does not fit is refused at once ([`Busy`]).
//!
//! Each job owns a [`Session`] while it runs, so no two requests ever share KV state; between
//! requests the sessions wait in the [`SessionPool`], where a conversation that continues finds
//! its prefix again. A job whose client went away (its update channel closed) is cancelled
//! before its next step, or skipped if it is still queued.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use anelm_engine::{Event, Finish, GenerateParams, Input, LoadedModel, Session, TokenLogprob};
use anelm_model::Executor;
use parking_lot::FairMutex;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::json_mode::{Constrained, JsonPrefix, Vocabulary};
use crate::metrics::Metrics;
use crate::sessions::SessionPool;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Generations in progress at once (they share the executor token by token).
    pub parallel: usize,
    /// Jobs that may wait when every slot is busy; more are refused.
    pub queue: usize,
    /// Idle sessions kept for prefix reuse.
    pub cached_sessions: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            queue: 32,
            cached_sessions: 4,
        }
    }
}

/// A request for the engine: one prompt, one or more independent choices (OpenAI's `n`), each
/// with its own parameters.
pub struct Job {
    pub prompt: Vec<u32>,
    pub choices: Vec<GenerateParams>,
    /// Every reply must be a JSON object ([`crate::json_mode`]).
    pub json: bool,
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
#[derive(Clone, Copy, Debug, serde::Serialize)]
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
}

struct Queued {
    job: Job,
    updates: UnboundedSender<Update>,
    /// When the job arrived, for the time to its first token.
    arrived: Instant,
}

struct Queue {
    jobs: VecDeque<Queued>,
    closed: bool,
}

struct Shared {
    model: Arc<LoadedModel>,
    exec: FairMutex<Box<dyn Executor>>,
    sessions: SessionPool,
    /// Built on the first JSON-mode request.
    vocabulary: OnceLock<Vocabulary>,
    ctx: usize,
    queue: Mutex<Queue>,
    ready: Condvar,
    config: SchedulerConfig,
    busy: AtomicUsize,
    completed: AtomicU64,
    cancelled: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    metrics: Arc<Metrics>,
}

pub struct Scheduler {
    shared: Arc<Shared>,
    slots: Vec<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the slot threads. `ctx` is the capacity of every session.
    pub fn new(
        model: Arc<LoadedModel>,
        exec: Box<dyn Executor>,
        ctx: usize,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> Scheduler {
        let shared = Arc::new(Shared {
            model,
            exec: FairMutex::new(exec),
            sessions: SessionPool::new(config.cached_sessions),
            vocabulary: OnceLock::new(),
            ctx,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            busy: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            config: config.clone(),
            metrics,
        });
        let slots = (0..config.parallel.max(1))
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("anelm-slot-{i}"))
                    .spawn(move || shared.slot_loop())
                    .expect("spawning a slot thread")
            })
            .collect();
        Scheduler { shared, slots }
    }

    /// Queues a job; its updates arrive on the receiver. Dropping the receiver cancels it.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Update>, Busy> {
        let (updates, rx) = unbounded_channel();
        let mut q = lock(&self.shared.queue);
        // Slots take jobs (and count themselves busy) under this lock, so the count is exact.
        let idle = self.slots.len() - self.shared.busy.load(Ordering::Relaxed);
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
            slots: self.slots.len(),
            busy: s.busy.load(Ordering::Relaxed),
            waiting: lock(&s.queue).jobs.len(),
            queue_capacity: s.config.queue,
            completed: s.completed.load(Ordering::Relaxed),
            cancelled: s.cancelled.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
        }
    }

    /// Refuses new jobs and lets the slots end once the queue is empty.
    pub fn close(&self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
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

impl Shared {
    fn slot_loop(&self) {
        while let Some(Queued {
            job,
            updates,
            arrived,
        }) = self.next_job()
        {
            if updates.is_closed() {
                self.busy.fetch_sub(1, Ordering::Relaxed);
                self.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A panic in the engine must not take the slot down with it: the job fails, its
            // session is dropped, and the slot carries on.
            let outcome = catch_unwind(AssertUnwindSafe(|| self.run(job, &updates, arrived)))
                .unwrap_or_else(|_| {
                    let _ = updates.send(Update::Failed("internal error in the engine".into()));
                    Outcome::Failed
                });
            self.busy.fetch_sub(1, Ordering::Relaxed);
            match outcome {
                Outcome::Completed => &self.completed,
                Outcome::Cancelled => &self.cancelled,
                Outcome::Failed => &self.failed,
            }
            .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn vocabulary(&self) -> &Vocabulary {
        self.vocabulary.get_or_init(|| {
            let pieces = match &self.model.tokenizer {
                Some(t) => (0..self.model.model.config.vocab_size as u32)
                    .map(|id| (!t.is_special(id)).then(|| t.token_to_piece(id)))
                    .collect(),
                None => Vec::new(),
            };
            Vocabulary {
                pieces,
                stop_ids: self.model.stop_ids(),
            }
        })
    }

    /// The next job, the slot counted busy from the moment it takes it.
    fn next_job(&self) -> Option<Queued> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(job) = q.jobs.pop_front() {
                self.busy.fetch_add(1, Ordering::Relaxed);
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn run(&self, job: Job, updates: &UnboundedSender<Update>, arrived: Instant) -> Outcome {
        let session = self.sessions.take(&job.prompt, || {
            Session::new(self.exec.lock().as_ref(), self.ctx)
        });
        let mut session = match session {
            Ok(s) => s,
            Err(e) => {
                let _ = updates.send(Update::Failed(e.to_string()));
                return Outcome::Failed;
            }
        };
        let input = Input::Ids(job.prompt);
        let mut outcome = Outcome::Completed;
        for (choice, params) in job.choices.into_iter().enumerate() {
            let json = job.json.then(JsonPrefix::default);
            outcome = self.generate(&mut session, &input, choice, params, json, updates, arrived);
            if !matches!(outcome, Outcome::Completed) {
                break;
            }
        }
        self.sessions.give_back(session);
        outcome
    }

    /// One choice, step by step, the executor taken for each step only. With a JSON prefix,
    /// the tokens are held to a JSON object. `arrived` (the job's arrival) times its first token.
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        session: &mut Session,
        input: &Input,
        choice: usize,
        params: GenerateParams,
        mut json: Option<JsonPrefix>,
        updates: &UnboundedSender<Update>,
        arrived: Instant,
    ) -> Outcome {
        let mut generation = match session.generate(&self.model, input, params) {
            Ok(g) => g,
            Err(e) => {
                let _ = updates.send(Update::Failed(e.to_string()));
                return Outcome::Failed;
            }
        };
        // The prompt goes in chunk by chunk, so a long one neither holds the executor from the
        // other slots nor outlives its client by more than a chunk.
        loop {
            if updates.is_closed() {
                generation.cancel();
                return Outcome::Cancelled;
            }
            match self.with_executor(json.as_ref(), |exec| generation.prefill_step(exec)) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    let _ = updates.send(Update::Failed(e.to_string()));
                    return Outcome::Failed;
                }
            }
        }
        let mut last_token: Option<Instant> = None;
        loop {
            if updates.is_closed() {
                generation.cancel();
                return Outcome::Cancelled;
            }
            let event = self.with_executor(json.as_ref(), |exec| generation.next_event(exec));
            if let (Some(prefix), Ok(Some(Event::Token { id, .. }))) = (&mut json, &event) {
                // The mask allowed only tokens that continue the object.
                prefix.push_all(self.vocabulary().piece(*id));
            }
            let update = match event {
                Ok(Some(Event::Token { id, logprob })) => {
                    let now = Instant::now();
                    match last_token.replace(now) {
                        None => self.metrics.first_token(now - arrived),
                        Some(prev) => self.metrics.next_token(now - prev),
                    }
                    Update::Token {
                        choice,
                        id,
                        logprob,
                    }
                }
                Ok(Some(Event::Text(text))) => Update::Text { choice, text },
                Ok(Some(Event::Finish(finish))) => {
                    self.metrics.finished(&finish);
                    let _ = updates.send(Update::Finish { choice, finish });
                    return Outcome::Completed;
                }
                Ok(None) => return Outcome::Completed,
                Err(e) => {
                    let _ = updates.send(Update::Failed(e.to_string()));
                    return Outcome::Failed;
                }
            };
            // A send fails only when the client is gone; the next turn notices.
            let _ = updates.send(update);
        }
    }

    /// Runs `step` with the executor locked, its logits held to the JSON prefix if there is one.
    fn with_executor<T>(
        &self,
        json: Option<&JsonPrefix>,
        step: impl FnOnce(&mut dyn Executor) -> T,
    ) -> T {
        let mut exec = self.exec.lock();
        match json {
            Some(prefix) => step(&mut Constrained {
                inner: exec.as_mut(),
                vocabulary: self.vocabulary(),
                prefix,
            }),
            None => step(exec.as_mut()),
        }
    }
}
