//! Idle sessions kept between requests, so that a conversation that continues (the same
//! messages and the reply, then a new one) prefills only what is new. A session is lent to one
//! job at a time and comes back afterwards; the least recently used idle session goes first.

use parking_lot::Mutex;

use anelm_engine::{Result, Session};

pub struct SessionPool {
    idle: Mutex<Idle>,
    keep: usize,
}

struct Idle {
    /// Sessions with the time they were given back.
    sessions: Vec<(Session, u64)>,
    clock: u64,
}

impl SessionPool {
    /// A pool keeping up to `keep` idle sessions.
    pub fn new(keep: usize) -> SessionPool {
        SessionPool {
            idle: Mutex::new(Idle {
                sessions: Vec::new(),
                clock: 0,
            }),
            keep,
        }
    }

    /// The idle session sharing the longest prefix with `prompt`; failing any, the least
    /// recently used one when the pool is full (it would be dropped anyway), else a new one.
    pub fn take(&self, prompt: &[u32], new: impl FnOnce() -> Result<Session>) -> Result<Session> {
        let mut idle = self.idle.lock();
        let best = idle
            .sessions
            .iter()
            .enumerate()
            .map(|(i, (s, used))| (common_prefix(s.tokens(), prompt), *used, i))
            .max();
        let pick = match best {
            Some((shared, _, i)) if shared > 0 => Some(i),
            _ if idle.sessions.len() >= self.keep => oldest(&idle.sessions),
            _ => None,
        };
        match pick {
            Some(i) => Ok(idle.sessions.swap_remove(i).0),
            None => {
                drop(idle);
                new()
            }
        }
    }

    /// The most tokens of `prompt` an idle session holds at its start.
    pub fn longest_prefix(&self, prompt: &[u32]) -> usize {
        let idle = self.idle.lock();
        idle.sessions
            .iter()
            .map(|(s, _)| common_prefix(s.tokens(), prompt))
            .max()
            .unwrap_or(0)
    }

    /// Returns a session to the pool, dropping the least recently used one past the limit.
    pub fn give_back(&self, session: Session) {
        let mut idle = self.idle.lock();
        idle.clock += 1;
        let now = idle.clock;
        idle.sessions.push((session, now));
        while idle.sessions.len() > self.keep {
            let Some(i) = oldest(&idle.sessions) else {
                break;
            };
            idle.sessions.swap_remove(i);
        }
    }
}

fn oldest(sessions: &[(Session, u64)]) -> Option<usize> {
    (0..sessions.len()).min_by_key(|&i| sessions[i].1)
}

/// How many tokens `a` and `b` share at their start.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use anelm_testkit::FnExec;

    use super::*;

    /// An executor whose logits are zeros.
    fn exec() -> FnExec {
        FnExec::new(32, |_, _| {})
    }

    /// A session holding `tokens`.
    fn holding(tokens: &[u32]) -> Session {
        let mut e = exec();
        let mut s = Session::new(&e, 64).unwrap();
        s.prefill(&mut e, tokens, &mut Vec::new()).unwrap();
        s
    }

    fn fresh() -> Result<Session> {
        Session::new(&exec(), 64)
    }

    #[test]
    fn the_longest_shared_prefix_wins() {
        let pool = SessionPool::new(4);
        pool.give_back(holding(&[1, 2, 3]));
        pool.give_back(holding(&[1, 2, 3, 4, 5]));
        pool.give_back(holding(&[1, 9]));
        let s = pool
            .take(&[1, 2, 3, 4, 6], || panic!("no new session needed"))
            .unwrap();
        assert_eq!(s.tokens(), [1, 2, 3, 4, 5]);
        let s = pool
            .take(&[1, 9, 9], || panic!("no new session needed"))
            .unwrap();
        assert_eq!(s.tokens(), [1, 9]);
    }

    #[test]
    fn nothing_shared_gives_a_new_session_until_the_pool_is_full() {
        let pool = SessionPool::new(2);
        pool.give_back(holding(&[1, 2]));
        let s = pool.take(&[7, 7], fresh).unwrap();
        assert!(s.tokens().is_empty(), "a new session");
        pool.give_back(holding(&[3, 4]));
        // Full (two idle): the least recently used one is reused rather than a third made.
        let s = pool.take(&[8], || panic!("the pool is full")).unwrap();
        assert_eq!(s.tokens(), [1, 2]);
    }

    #[test]
    fn giving_back_past_the_limit_drops_the_least_recently_used() {
        let pool = SessionPool::new(2);
        pool.give_back(holding(&[1]));
        pool.give_back(holding(&[2]));
        pool.give_back(holding(&[3]));
        assert_eq!(pool.take(&[2], fresh).unwrap().tokens(), [2]);
        assert_eq!(pool.take(&[3], fresh).unwrap().tokens(), [3]);
        assert!(
            pool.take(&[1], fresh).unwrap().tokens().is_empty(),
            "[1] was dropped"
        );
    }

    #[test]
    fn a_pool_of_none_keeps_nothing() {
        let pool = SessionPool::new(0);
        pool.give_back(holding(&[1, 2]));
        assert!(pool.take(&[1, 2], fresh).unwrap().tokens().is_empty());
    }
}
