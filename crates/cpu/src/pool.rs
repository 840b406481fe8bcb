//! A persistent SPMD thread pool: `run(f)` calls `f` on every thread at once (the caller's thread
//! is thread 0), and the threads synchronise inside `f` with [`Ctx::barrier`] and share work with
//! [`Ctx::chunks`]. One forward pass is one `run`: no thread is spawned and nothing is allocated per
//! op or per token, and an op costs a barrier (a few hundred nanoseconds) instead of a task
//! dispatch — the difference matters at 135M parameters, where a decode matvec lasts microseconds.
//!
//! Waiting spins for a few tens of microseconds, then yields the core a few times, then sleeps on
//! a condition variable: on a quiet machine a barrier completes within the spin; on a busy one
//! the partner it waits for is often descheduled, and yielding lets it run on this core sooner
//! than sleeping would (a wake-up costs a scheduler round trip at every barrier). The pool
//! times the waits that outlast the spin and tells whether the last run was contended
//! ([`Pool::contended`]); a run can also go on the caller's thread alone ([`Pool::run_solo`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Thread `j`'s share of `n_chunks` chunks among `n` threads.
fn share(j: usize, n: usize, n_chunks: usize) -> std::ops::Range<usize> {
    j * n_chunks / n..(j + 1) * n_chunks / n
}

/// `spin_loop` iterations (about 20 ns each) before a waiting thread sleeps.
const SPINS: u32 = 1 << 12;
/// Yields of the core, after the spins, before a waiting thread sleeps.
const YIELDS: u32 = 64;
/// A run was contended when its barriers waited beyond the spin for more than this fraction of
/// its time (on a quiet machine it is under 3 %) and for more than [`MIN_SLOW`] (a time slice
/// of the scheduler, not the tens of microseconds a sleeping worker takes to wake).
const SLOW_SHARE: u32 = 8;
const MIN_SLOW: Duration = Duration::from_millis(1);

/// The job of the current `run`: a type-erased `&dyn Fn(&Ctx)` valid until every thread finished,
/// and the number of the first `chunks` call it makes.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(&Ctx) + Sync),
    call: u32,
}
// SAFETY: the pointee is Sync and `run` keeps it alive until all workers have finished with it.
unsafe impl Send for Job {}

struct Shared {
    n: usize,
    /// Bumped by `run` to start a job; workers remember the last epoch they ran.
    epoch: AtomicUsize,
    job: Mutex<Option<Job>>,
    /// Sleeping waiters (see [`Shared::wait_until`]).
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Workers still running the current job.
    active: AtomicUsize,
    /// The barrier: threads arrived in the current round, and the round number.
    arrived: AtomicUsize,
    round: AtomicUsize,
    /// Nanoseconds the barriers of the current run waited beyond the spin.
    slow_waits_ns: AtomicU64,
    /// The last run of all threads was contended.
    contended: AtomicBool,
    /// Work sharing: each thread's range of unclaimed chunks; see [`Ctx::chunks`].
    slots: Vec<Slot>,
    /// The number the next job's first `chunks` call gets.
    next_call: AtomicUsize,
    stop: AtomicBool,
}

/// Physical cores of the online CPUs (Linux topology files), else the available parallelism.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cores = std::collections::HashSet::new();
    for cpu in 0..logical {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let read = |f: &str| {
            std::fs::read_to_string(format!("{base}/{f}"))
                .ok()
                .map(|s| s.trim().to_string())
        };
        match (read("physical_package_id"), read("core_id")) {
            (Some(p), Some(c)) => {
                cores.insert((p, c));
            }
            _ => return logical,
        }
    }
    cores.len().clamp(1, logical)
}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// What a thread sees of the pool during `run`.
pub struct Ctx<'a> {
    /// This thread's index, `0..n`; 0 is the caller.
    pub ith: usize,
    pub n: usize,
    shared: &'a Shared,
    /// The number of this thread's next `chunks` call.
    call: Cell<u32>,
}

impl Pool {
    /// A pool of `n` threads (at least 1) including the caller's.
    pub fn new(n: usize) -> Pool {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            active: AtomicUsize::new(0),
            arrived: AtomicUsize::new(0),
            round: AtomicUsize::new(0),
            slow_waits_ns: AtomicU64::new(0),
            contended: AtomicBool::new(false),
            slots: (0..n).map(|_| Slot(AtomicU64::new(0))).collect(),
            next_call: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
        });
        let workers = (1..n)
            .map(|ith| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("anelm-cpu-{ith}"))
                    .spawn(move || worker(&s, ith))
                    .expect("spawning a CPU worker thread")
            })
            .collect();
        Pool { shared, workers }
    }

    pub fn threads(&self) -> usize {
        self.shared.n
    }

    /// Whether the last run of all threads was contended: its barriers waited for threads
    /// that were off their cores for much of its time.
    pub fn contended(&self) -> bool {
        self.shared.contended.load(Ordering::Relaxed)
    }

    /// Runs `f` on the caller's thread alone, as a pool of one.
    pub fn run_solo<F: Fn(&Ctx)>(&self, f: F) {
        let s = &*self.shared;
        let ctx = Ctx {
            ith: 0,
            n: 1,
            shared: s,
            call: Cell::new(s.next_call.load(Ordering::Relaxed) as u32),
        };
        f(&ctx);
        s.next_call
            .store(ctx.call.get() as usize, Ordering::Relaxed);
    }

    /// Runs `f` on every thread and returns when all have returned.
    pub fn run<F: Fn(&Ctx) + Sync>(&self, f: F) {
        let s = &*self.shared;
        if s.n == 1 {
            return self.run_solo(f);
        }
        let start = s.next_call.load(Ordering::Relaxed) as u32;
        let ctx = Ctx {
            ith: 0,
            n: s.n,
            shared: s,
            call: Cell::new(start),
        };
        let started = Instant::now();
        let f_ref: &(dyn Fn(&Ctx) + Sync) = &f;
        // SAFETY: erases the lifetime; the pointer is only used until `active` drops to zero below.
        let f_static = unsafe {
            std::mem::transmute::<&(dyn Fn(&Ctx) + Sync), &'static (dyn Fn(&Ctx) + Sync)>(f_ref)
        };
        let job = Job {
            f: f_static,
            call: start,
        };
        s.active.store(s.n - 1, Ordering::Relaxed);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        s.wake_sleepers();
        f(&ctx);
        s.wait_until(|| s.active.load(Ordering::SeqCst) == 0);
        // Every thread made the same calls.
        s.next_call
            .store(ctx.call.get() as usize, Ordering::Relaxed);
        let slow = Duration::from_nanos(s.slow_waits_ns.swap(0, Ordering::Relaxed));
        let contended = slow > MIN_SLOW && slow * SLOW_SHARE > started.elapsed();
        s.contended.store(contended, Ordering::Relaxed);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        self.shared.wake_sleepers();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared, ith: usize) {
    let mut seen = 0usize;
    loop {
        s.wait_until(|| s.epoch.load(Ordering::SeqCst) != seen);
        seen = s.epoch.load(Ordering::SeqCst);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Job { f, call }) = job {
            let ctx = Ctx {
                ith,
                n: s.n,
                shared: s,
                call: Cell::new(call),
            };
            // SAFETY: `run` keeps the closure alive until `active` reaches zero.
            unsafe { (*f)(&ctx) };
        }
        if s.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            s.wake_sleepers();
        }
    }
}

impl Shared {
    /// Returns once `done()` holds: spins, then sleeps until a [`Shared::wake_sleepers`]; says
    /// how long it waited beyond the spin (zero: it held within). The state `done` reads must be
    /// changed with SeqCst before the wake call.
    fn wait_until(&self, done: impl Fn() -> bool) -> Duration {
        for _ in 0..SPINS {
            if done() {
                return Duration::ZERO;
            }
            std::hint::spin_loop();
        }
        let start = Instant::now();
        for _ in 0..YIELDS {
            if done() {
                return start.elapsed();
            }
            std::thread::yield_now();
        }
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        while !done() {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        start.elapsed()
    }

    /// Wakes the sleeping waiters after a change of the state they wait on. A waiter either
    /// registered before the change (and is woken under the lock) or checks the state after it.
    fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
    }
}

impl Ctx<'_> {
    /// Waits until every thread of the run has reached this barrier.
    pub fn barrier(&self) {
        let s = self.shared;
        if self.n == 1 {
            return;
        }
        let round = s.round.load(Ordering::SeqCst);
        if s.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            s.arrived.store(0, Ordering::Relaxed);
            s.round.fetch_add(1, Ordering::SeqCst);
            s.wake_sleepers();
        } else {
            let slow = s.wait_until(|| s.round.load(Ordering::SeqCst) != round);
            if !slow.is_zero() {
                s.slow_waits_ns
                    .fetch_add(slow.as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Shares `n_chunks` pieces of work: calls `f(i)` for the chunks this thread claims. Each
    /// thread owns an equal, contiguous share and claims it from the front; once its own share
    /// is done it steals from the back of the others', so a thread slowed by another process
    /// does less. Claims from one's own share touch only one's own cache line (a shared counter
    /// would move a line between the cores at every claim), so chunks can be small, and each
    /// thread streams through contiguous rows. Every thread must make the same sequence of
    /// `chunks` calls; no barrier is needed between two of them (see [`Slot`]).
    pub fn chunks(&self, n_chunks: usize, mut f: impl FnMut(usize)) {
        let call = self.call.get();
        self.call.set(call.wrapping_add(1));
        assert!(n_chunks < 1 << 24, "at most 2^24 chunks per call");
        let n = self.n;
        let share = |j: usize| {
            let r = share(j, n, n_chunks);
            (r.start, r.end)
        };
        while let Some(c) = self.claim(self.ith, call, share(self.ith), true) {
            f(c);
        }
        for k in 1..n {
            let j = (self.ith + k) % n;
            while let Some(c) = self.claim(j, call, share(j), false) {
                f(c);
            }
        }
    }

    /// The chunks of a [`Ctx::chunks`] call of `n_chunks` that this thread starts with (it
    /// takes them unless another thread steals some first): to prepare their data ahead.
    pub fn own_chunks(&self, n_chunks: usize) -> std::ops::Range<usize> {
        share(self.ith, self.n, n_chunks)
    }

    /// Claims the first (`front`) or last unclaimed chunk of thread `j`'s share of call `call`,
    /// starting the share as `fresh` if nobody has yet; None once it is empty.
    fn claim(&self, j: usize, call: u32, fresh: (usize, usize), front: bool) -> Option<usize> {
        let slot = &self.shared.slots[j].0;
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            let (c, lo, hi) = Slot::unpack(cur);
            // Call numbers wrap; a "negative" difference means an earlier call.
            let ahead = c.wrapping_sub(call as u16) as i16;
            let (lo, hi) = match ahead {
                ..0 => fresh,
                0 => (lo, hi),
                _ => return None,
            };
            if lo >= hi {
                return None;
            }
            let (got, new) = if front {
                (lo, Slot::pack(call, lo + 1, hi))
            } else {
                (hi - 1, Slot::pack(call, lo, hi - 1))
            };
            match slot.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(got),
                Err(seen) => cur = seen,
            }
        }
    }
}

/// One thread's unclaimed chunks of a `chunks` call: the call's number (16 bits, wrapping) and
/// the range `lo..hi` (24 bits each). A slot moves to a later call only once its range for
/// the earlier one is empty: its owner moves on after emptying its own share, and any thread
/// after finding every share empty. A claim that finds the slot at an earlier call starts the
/// share itself; one that finds a later call knows this call's share is done.
#[repr(align(128))]
struct Slot(AtomicU64);

impl Slot {
    fn pack(call: u32, lo: usize, hi: usize) -> u64 {
        (u64::from(call as u16) << 48) | ((lo as u64) << 24) | hi as u64
    }

    fn unpack(v: u64) -> (u16, usize, usize) {
        let mask = (1 << 24) - 1;
        (
            (v >> 48) as u16,
            ((v >> 24) & mask) as usize,
            (v & mask) as usize,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_chunks_split_the_chunks_among_the_threads() {
        for threads in [1, 2, 3, 4] {
            let pool = Pool::new(threads);
            for n_chunks in [0, 1, 3, 7, 64] {
                let owned = Mutex::new(vec![0; n_chunks]);
                pool.run(|ctx| {
                    for c in ctx.own_chunks(n_chunks) {
                        owned.lock().unwrap()[c] += 1;
                    }
                });
                let owned = owned.into_inner().unwrap();
                assert!(
                    owned.iter().all(|&k| k == 1),
                    "{threads} threads: {owned:?}"
                );
            }
        }
    }

    #[test]
    fn calls_without_barriers_between_them_share_each_chunk_once() {
        // Back-to-back calls of different sizes (fewer chunks than threads too), with uneven
        // work so that threads run ahead into later calls and steal from each other.
        for threads in [2, 3, 4] {
            let pool = Pool::new(threads);
            let sizes: Vec<usize> = (0..40).map(|c| (c * 7) % 23).collect();
            for _job in 0..20 {
                let counts: Vec<Vec<AtomicUsize>> = sizes
                    .iter()
                    .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
                    .collect();
                pool.run(|ctx| {
                    for (c, &n) in sizes.iter().enumerate() {
                        ctx.chunks(n, |i| {
                            counts[c][i].fetch_add(1, Ordering::Relaxed);
                            for _ in 0..(i * 31 + ctx.ith * 97) % 200 {
                                std::hint::spin_loop();
                            }
                        });
                    }
                });
                for (c, cs) in counts.iter().enumerate() {
                    for (i, k) in cs.iter().enumerate() {
                        assert_eq!(
                            k.load(Ordering::Relaxed),
                            1,
                            "{threads} threads, call {c}, chunk {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_run_kept_waiting_at_its_barriers_is_contended_and_a_solo_run_is_a_pool_of_one() {
        let pool = Pool::new(2);
        // A partner that keeps the caller waiting far beyond the spin, as a descheduled one does.
        pool.run(|ctx| {
            for _ in 0..4 {
                if ctx.ith == 1 {
                    std::thread::sleep(Duration::from_millis(3));
                }
                ctx.barrier();
            }
        });
        assert!(pool.contended());
        let (n, sum) = (AtomicUsize::new(0), AtomicUsize::new(0));
        pool.run_solo(|ctx| {
            n.store(ctx.n, Ordering::Relaxed);
            ctx.barrier();
            ctx.chunks(5, |i| {
                sum.fetch_add(i + 1, Ordering::Relaxed);
            });
        });
        assert_eq!((n.into_inner(), sum.into_inner()), (1, 15));
    }

    #[test]
    fn every_chunk_runs_once_across_many_jobs_and_barriers() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            for job in 0..50usize {
                let counts: Vec<AtomicUsize> = (0..97).map(|_| AtomicUsize::new(0)).collect();
                let after: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                pool.run(|ctx| {
                    for round in 0..3 {
                        let n = 10 + job % 7 + round * 30;
                        ctx.chunks(n, |i| {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        });
                        ctx.barrier();
                    }
                    // After the barrier, every thread sees all the work of the others.
                    let total: usize = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
                    after[ctx.ith].store(total, Ordering::Relaxed);
                });
                let n: [usize; 3] = std::array::from_fn(|r| 10 + job % 7 + r * 30);
                for (i, c) in counts.iter().enumerate() {
                    let want = n.iter().filter(|&&k| i < k).count();
                    assert_eq!(
                        c.load(Ordering::Relaxed),
                        want,
                        "{threads} threads, job {job}, chunk {i}"
                    );
                }
                for a in &after {
                    assert_eq!(a.load(Ordering::Relaxed), n.iter().sum::<usize>());
                }
            }
        }
    }
}
