//! The per-process ANE compile budget (FACTS §4, C7): MAD and ORI report compiles failing after
//! ~119 in one process on M4, FG loads 226 on M3 Max and says the limit is on programs loaded
//! at once, OMX keeps a 120-program budget. We count every compile attempt (the conservative
//! reading) and refuse past the limit with a clear error instead of an opaque compiler failure.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::error::MacError;

/// Compiles allowed per process unless `ANELM_ANE_COMPILE_BUDGET` says otherwise.
pub const DEFAULT_LIMIT: u32 = 119;
/// The environment variable that overrides [`DEFAULT_LIMIT`] (for measuring C7 on a Mac).
pub const LIMIT_ENV: &str = "ANELM_ANE_COMPILE_BUDGET";

#[derive(Debug)]
pub struct CompileBudget {
    used: AtomicU32,
    limit: u32,
}

impl CompileBudget {
    pub const fn new(limit: u32) -> CompileBudget {
        CompileBudget {
            used: AtomicU32::new(0),
            limit,
        }
    }

    /// Takes one compile from the budget, or says it is spent.
    pub fn take(&self) -> Result<(), MacError> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u < self.limit).then_some(u + 1)
            })
            .map(|_| ())
            .map_err(|used| MacError::BudgetExhausted {
                used,
                limit: self.limit,
            })
    }

    pub fn used(&self) -> u32 {
        self.used.load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }
}

/// The limit an `ANELM_ANE_COMPILE_BUDGET` value sets.
pub fn limit_from(value: Option<&str>) -> Result<u32, MacError> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_LIMIT),
        Some(v) => v.parse().map_err(|_| {
            MacError::Invalid(format!(
                "{LIMIT_ENV}={v}: a whole number of compiles expected"
            ))
        }),
    }
}

/// The budget of this process.
pub fn process_budget() -> Result<&'static CompileBudget, MacError> {
    static BUDGET: OnceLock<Result<CompileBudget, String>> = OnceLock::new();
    BUDGET
        .get_or_init(|| {
            limit_from(std::env::var(LIMIT_ENV).ok().as_deref())
                .map(CompileBudget::new)
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| MacError::Invalid(e.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit() {
        let b = CompileBudget::new(3);
        for _ in 0..3 {
            b.take().unwrap();
        }
        let e = b.take().unwrap_err();
        assert!(
            matches!(e, MacError::BudgetExhausted { used: 3, limit: 3 }),
            "{e}"
        );
        assert!(
            e.to_string().contains("3 ANE compiles") && e.to_string().contains(LIMIT_ENV),
            "{e}"
        );
        assert_eq!(b.used(), 3, "a refused compile is not counted");
    }

    #[test]
    fn counts_across_threads_without_overshooting() {
        let b = CompileBudget::new(50);
        let ok = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        if b.take().is_ok() {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!((ok.into_inner(), b.used()), (50, 50));
    }

    #[test]
    fn limit_from_the_environment_value() {
        assert_eq!(limit_from(None).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit_from(Some(" 226 ")).unwrap(), 226);
        let e = limit_from(Some("lots")).unwrap_err().to_string();
        assert!(e.contains("ANELM_ANE_COMPILE_BUDGET=lots"), "{e}");
    }
}
