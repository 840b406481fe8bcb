//! Draft models for the server's speculative decoding (`serve --draft`): each generation in
//! progress needs a drafter of its own (a draft model holds a session), so finished
//! generations hand theirs back to a pool and the next one continues from its cached tokens.

use std::fmt;
use std::sync::{Arc, Mutex};

use anelm_engine::Drafter;

/// Makes one more drafter (a draft model with its own executor and session).
pub type MakeDrafter = dyn Fn() -> anyhow::Result<Box<dyn Drafter>> + Send + Sync;

/// `serve --draft`: how to make a drafter, and how many tokens it may draft per pass.
#[derive(Clone)]
pub struct DraftConfig {
    pub k: usize,
    pub make: Arc<MakeDrafter>,
}

impl fmt::Debug for DraftConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DraftConfig").field("k", &self.k).finish()
    }
}

/// Drafters not in use. At most one per generation ever runs, so the pool never holds more
/// than the server's `parallel`.
#[derive(Default)]
pub(crate) struct DraftPool {
    idle: Mutex<Vec<Box<dyn Drafter>>>,
}

impl DraftPool {
    /// An idle drafter, else a new one.
    pub(crate) fn take(&self, config: &DraftConfig) -> anyhow::Result<Box<dyn Drafter>> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(d) => Ok(d),
            None => (config.make)(),
        }
    }

    pub(crate) fn give_back(&self, drafter: Box<dyn Drafter>) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(drafter);
    }

    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_engine::PromptLookup;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn drafters_are_reused_and_made_only_when_none_is_idle() {
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let config = DraftConfig {
            k: 4,
            make: Arc::new(move || {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(Box::new(PromptLookup {
                    min_ngram: 1,
                    max_ngram: 2,
                }) as Box<dyn Drafter>)
            }),
        };
        let pool = DraftPool::default();
        let a = pool.take(&config).unwrap();
        let b = pool.take(&config).unwrap();
        assert_eq!(made.load(Ordering::Relaxed), 2);
        pool.give_back(a);
        assert_eq!(pool.idle(), 1);
        let _c = pool.take(&config).unwrap();
        assert_eq!(
            made.load(Ordering::Relaxed),
            2,
            "the idle drafter was reused"
        );
        assert_eq!(pool.idle(), 0);
        drop(b);
    }
}
