//! Responses kept in memory for `GET /v1/responses/{id}` and `previous_response_id`: each with
//! its conversation, so a response that continues an earlier one needs only its new input.
//! The store is bounded in count and in bytes; past either bound the oldest go.

use std::collections::{HashMap, VecDeque};

use anelm_engine::Message;
use parking_lot::Mutex;
use serde_json::Value;

/// How many responses a server keeps.
pub const KEPT: usize = 256;
/// How many bytes of responses and conversations (as JSON) a server keeps.
pub const KEPT_BYTES: usize = 64 << 20;

#[derive(Clone, Debug)]
pub struct Stored {
    /// The response object, as the API returned it.
    pub response: Value,
    /// Its conversation (the input and the reply, without the instructions).
    pub conversation: Vec<Message>,
}

pub struct ResponseStore {
    inner: Mutex<Inner>,
    keep: usize,
    keep_bytes: usize,
}

#[derive(Default)]
struct Inner {
    /// Each response with its size in bytes.
    by_id: HashMap<String, (Stored, usize)>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

impl Stored {
    /// Its size as JSON text, roughly what it holds in memory.
    fn bytes(&self) -> usize {
        let conversation: usize = self
            .conversation
            .iter()
            .map(|m| m.content.to_string().len() + Value::Object(m.extra.clone()).to_string().len())
            .sum();
        self.response.to_string().len() + conversation
    }
}

impl ResponseStore {
    /// A store of up to `keep` responses and `keep_bytes` bytes.
    pub fn new(keep: usize, keep_bytes: usize) -> ResponseStore {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            keep,
            keep_bytes,
        }
    }

    /// Keeps a response (one larger than the byte bound is not kept).
    pub fn put(&self, id: String, stored: Stored) {
        let size = stored.bytes();
        if size > self.keep_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some((_, old)) = inner.by_id.insert(id.clone(), (stored, size)) {
            inner.bytes -= old;
            inner.order.retain(|k| *k != id);
        }
        inner.order.push_back(id);
        inner.bytes += size;
        while inner.order.len() > self.keep || inner.bytes > self.keep_bytes {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some((_, n)) = inner.by_id.remove(&old) {
                inner.bytes -= n;
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().by_id.get(id).map(|(s, _)| s.clone())
    }

    /// Whether there was such a response.
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let Some((_, n)) = inner.by_id.remove(id) else {
            return false;
        };
        inner.bytes -= n;
        inner.order.retain(|k| k != id);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: i64) -> Stored {
        Stored {
            response: Value::from(n),
            conversation: Vec::new(),
        }
    }

    #[test]
    fn the_oldest_goes_past_the_bound() {
        let store = ResponseStore::new(2, usize::MAX);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            store.put(id.to_string(), stored(i as i64));
        }
        assert!(store.get("a").is_none());
        assert_eq!(store.get("c").unwrap().response, 2);
        assert!(store.remove("b"));
        assert!(!store.remove("b"));
        store.put("d".into(), stored(3));
        assert!(store.get("c").is_some() && store.get("d").is_some());
    }

    #[test]
    fn the_oldest_go_past_the_byte_bound() {
        let big = |text: &str| Stored {
            response: Value::from(text),
            conversation: vec![Message::user(text)],
        };
        let one = big(&"x".repeat(100)).bytes();
        let store = ResponseStore::new(100, one * 2);
        store.put("a".into(), big(&"x".repeat(100)));
        store.put("b".into(), big(&"y".repeat(100)));
        assert!(store.get("a").is_some(), "two fit");
        store.put("c".into(), big(&"z".repeat(100)));
        assert!(store.get("a").is_none() && store.get("b").is_some() && store.get("c").is_some());
        store.put("huge".into(), big(&"w".repeat(1000)));
        assert!(
            store.get("huge").is_none(),
            "larger than the bound: not kept"
        );
        assert!(
            store.get("b").is_some() && store.get("c").is_some(),
            "nor did it push the others out"
        );
    }
}
