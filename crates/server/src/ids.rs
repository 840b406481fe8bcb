//! Response ids (`chatcmpl-…`, `msg_…`, `call_…`) and timestamps. Ids only need to be unique
//! within a server's life: a counter mixed with the start time, so they do not look sequential.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub fn new_id(prefix: &str) -> String {
    static START: OnceLock<u64> = OnceLock::new();
    let start = *START.get_or_init(now_nanos);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}{:016x}",
        splitmix64(start ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    )
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A bijective mixer: distinct inputs give distinct ids.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_unique() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| super::new_id("x-")).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() == 18 && id.starts_with("x-")));
    }
}
