//! How many threads decode steps use when other processes want the cores too. Then a barrier can
//! wait a whole time slice for a thread that is off its core, and the caller's thread alone may
//! go faster than all of them. The pool tells when a run was contended; after [`WINDOW`]
//! contended decode steps in a row (one is a hiccup of the machine) a trial of as many steps on
//! one thread follows, and the faster way is kept, by the measured times. While on one thread,
//! all threads are tried again now and then. How many threads run does not change the results.

use std::time::Duration;

/// Steps of a trial, and of the recent steps it is compared with.
const WINDOW: usize = 4;
/// The other way must be this much faster (time ratio) to be taken.
const GAIN: f64 = 0.9;
/// Steps on one thread between trials of all threads.
const RECHECK: usize = 64;
/// Steps on all threads after a trial before a contended step starts another.
const COOLDOWN: usize = 64;

#[derive(Debug)]
pub struct Adaptive {
    /// The way kept: the caller's thread alone.
    solo: bool,
    /// The last steps of the way kept, oldest first.
    recent: Vec<Duration>,
    /// Contended steps in a row.
    streak: usize,
    /// Steps kept since the last trial (or the start).
    steps: usize,
    /// The trial of the other way under way: its step times.
    trial: Option<Vec<Duration>>,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            solo: false,
            recent: Vec::with_capacity(WINDOW),
            streak: 0,
            steps: COOLDOWN,
            trial: None,
        }
    }
}

fn mean(v: &[Duration]) -> f64 {
    v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len().max(1) as f64
}

impl Adaptive {
    /// Whether the next decode step runs on the caller's thread alone.
    pub fn solo_next(&self) -> bool {
        self.solo != self.trial.is_some()
    }

    /// Takes the time of a decode step run as [`Adaptive::solo_next`] said, and whether the pool
    /// found it contended (only a step on all threads can be).
    pub fn record(&mut self, took: Duration, contended: bool) {
        if let Some(trial) = &mut self.trial {
            trial.push(took);
            if trial.len() == WINDOW {
                if mean(trial) < GAIN * mean(&self.recent) {
                    self.solo = !self.solo;
                    self.recent.clone_from(trial);
                }
                self.trial = None;
                self.steps = 0;
            }
            return;
        }
        if self.recent.len() == WINDOW {
            self.recent.remove(0);
        }
        self.recent.push(took);
        self.steps += 1;
        self.streak = if contended { self.streak + 1 } else { 0 };
        let due = if self.solo {
            self.steps >= RECHECK
        } else {
            self.streak >= WINDOW && self.steps >= COOLDOWN
        };
        if due && self.recent.len() == WINDOW {
            self.trial = Some(Vec::with_capacity(WINDOW));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Runs `steps` decode steps, each taking `all` on all threads or `one` on one; returns how
    /// many ran on one thread.
    fn run(a: &mut Adaptive, steps: usize, all: Duration, one: Duration, contended: bool) -> usize {
        (0..steps)
            .filter(|_| {
                let solo = a.solo_next();
                a.record(if solo { one } else { all }, contended && !solo);
                solo
            })
            .count()
    }

    #[test]
    fn a_quiet_machine_stays_on_all_threads() {
        let mut a = Adaptive::default();
        assert_eq!(run(&mut a, 1000, 3 * MS, 5 * MS, false), 0);
    }

    #[test]
    fn a_hiccup_changes_nothing_and_a_slower_thread_alone_is_not_kept() {
        let mut a = Adaptive::default();
        run(&mut a, 10, 3 * MS, 5 * MS, false);
        run(&mut a, 1, 3 * MS, 5 * MS, true);
        assert_eq!(run(&mut a, 20, 3 * MS, 5 * MS, false), 0);
        // Contended, but one thread is slower still: one trial, then none for the cool-down.
        assert_eq!(run(&mut a, 2 * WINDOW, 5 * MS, 8 * MS, true), WINDOW);
        assert_eq!(run(&mut a, COOLDOWN - 1, 5 * MS, 8 * MS, true), 0);
        assert!(!a.solo_next());
    }

    #[test]
    fn under_contention_one_thread_is_kept_and_all_are_tried_again() {
        let mut a = Adaptive::default();
        run(&mut a, 10, 3 * MS, 5 * MS, false);
        // The machine gets busy: all threads now take 9 ms, one 6 ms.
        run(&mut a, 2 * WINDOW, 9 * MS, 6 * MS, true);
        assert!(a.solo_next());
        // On one thread from then on, but for a trial of all threads every RECHECK steps.
        let n = 10 * (RECHECK + WINDOW);
        assert_eq!(run(&mut a, n, 9 * MS, 6 * MS, true), n - 10 * WINDOW);
        // Quiet again: the next trial goes back to all threads, for good.
        run(&mut a, RECHECK + WINDOW, 3 * MS, 5 * MS, false);
        assert!(!a.solo_next());
        assert_eq!(run(&mut a, 500, 3 * MS, 5 * MS, false), 0);
    }
}
