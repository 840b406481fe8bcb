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

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
