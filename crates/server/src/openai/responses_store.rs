//! Responses kept in memory for `GET /v1/responses/{id}` and `previous_response_id`: each with
//! its conversation, so a response that continues an earlier one needs only its new input.
//! The store holds a bounded number; past it the oldest goes.

use std::collections::{HashMap, VecDeque};

use anelm_engine::Message;
use parking_lot::Mutex;
use serde_json::Value;

/// How many responses a server keeps.
pub const KEPT: usize = 256;

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
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
}

impl ResponseStore {
    pub fn new(keep: usize) -> ResponseStore {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            keep,
        }
    }

    pub fn put(&self, id: String, stored: Stored) {
        let mut inner = self.inner.lock();
        if inner.by_id.insert(id.clone(), stored).is_none() {
            inner.order.push_back(id);
        }
        while inner.order.len() > self.keep {
            if let Some(old) = inner.order.pop_front() {
                inner.by_id.remove(&old);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().by_id.get(id).cloned()
    }

    /// Whether there was such a response.
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        let found = inner.by_id.remove(id).is_some();
        if found {
            inner.order.retain(|k| k != id);
        }
        found
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
        let store = ResponseStore::new(2);
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
}
