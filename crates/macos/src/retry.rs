//! Retrying a call whose failure may be transient, with exponential backoff (FACTS §3.6: a port
//! retries `loadWithQoS:` after 100 ms; the daemon may still be reclaiming an unloaded program,
//! FACTS §4 "unload reclaims it").

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in all, the first included (1 = no retry).
    pub attempts: u32,
    /// Wait before the second call.
    pub first_delay: Duration,
    /// Each later wait is the previous one times this.
    pub factor: u32,
    /// No wait is longer than this.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// Four calls, waiting 100, 200 and 400 ms between them.
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            first_delay: Duration::from_millis(100),
            factor: 2,
            max_delay: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The waits between consecutive calls (`attempts - 1` of them).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + '_ {
        let mut next = self.first_delay;
        (1..self.attempts.max(1)).map(move |_| {
            let d = next.min(self.max_delay);
            next = next.saturating_mul(self.factor);
            d
        })
    }

    /// Calls `op` until it succeeds, fails with an error `transient` rejects, or the attempts
    /// are used up; `sleep` waits between calls. Returns the last result.
    pub fn run<T, E>(
        &self,
        mut op: impl FnMut() -> Result<T, E>,
        transient: impl Fn(&E) -> bool,
        mut sleep: impl FnMut(Duration),
    ) -> Result<T, E> {
        let mut delays = self.delays();
        loop {
            match op() {
                Err(e) if transient(&e) => match delays.next() {
                    Some(d) => sleep(d),
                    None => return Err(e),
                },
                done => return done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let p = RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(100),
            factor: 2,
            max_delay: Duration::from_millis(500),
        };
        let ms: Vec<u128> = p.delays().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 500, 500]);
        assert_eq!(
            RetryPolicy {
                attempts: 1,
                ..p.clone()
            }
            .delays()
            .count(),
            0
        );
        assert_eq!(RetryPolicy { attempts: 0, ..p }.delays().count(), 0);
    }

    #[test]
    fn retries_transient_errors_only() {
        let p = RetryPolicy::default();
        let mut slept = Vec::new();
        let mut calls = 0;
        let r: Result<u32, &str> = p.run(
            || {
                calls += 1;
                if calls < 3 {
                    Err("busy")
                } else {
                    Ok(calls)
                }
            },
            |e| *e == "busy",
            |d| slept.push(d.as_millis()),
        );
        assert_eq!(r, Ok(3));
        assert_eq!(slept, [100, 200]);

        let mut calls = 0;
        let r: Result<(), &str> = p.run(
            || {
                calls += 1;
                Err("broken")
            },
            |e| *e == "busy",
            |_| panic!("a permanent error is not retried"),
        );
        assert_eq!((r, calls), (Err("broken"), 1));
    }

    #[test]
    fn gives_up_after_the_last_attempt_with_its_error() {
        let p = RetryPolicy {
            attempts: 3,
            ..RetryPolicy::default()
        };
        let mut calls = 0;
        let mut sleeps = 0;
        let r: Result<(), u32> = p.run(
            || {
                calls += 1;
                Err(calls)
            },
            |_| true,
            |_| sleeps += 1,
        );
        assert_eq!((r, calls, sleeps), (Err(3), 3, 2));
    }
}
