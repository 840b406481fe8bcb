//! The Responses API's stream, in the order the official SDK assembles: `response.created`,
//! `response.in_progress`; per output item `response.output_item.added`, its content part
//! (`response.content_part.added`), its deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`), their `…done`
//! events and `response.output_item.done`; then `response.completed` (or `.incomplete`).

use axum::response::sse::Event;
use serde_json::{json, Value};

use super::responses::Turn;
use crate::error::ApiError;
use crate::stream::{Emit, Piece};

pub struct ResponseStream {
    turn: Turn,
    sequence: u64,
    /// The item streaming now, and the text it has had.
    open: Option<Open>,
    /// Items streamed so far (their ids), and those of them already done.
    streamed: Vec<String>,
    closed: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
}

struct Open {
    kind: Kind,
    index: usize,
    text: String,
}

impl ResponseStream {
    pub fn new(turn: Turn) -> ResponseStream {
        ResponseStream {
            turn,
            sequence: 0,
            open: None,
            streamed: Vec::new(),
            closed: Vec::new(),
        }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> Event {
        data["type"] = kind.into();
        data["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        Event::default().event(kind).data(data.to_string())
    }

    fn item_id(&self, kind: Kind) -> String {
        match kind {
            Kind::Reasoning => self.turn.reasoning_id.clone(),
            Kind::Message => self.turn.message_id.clone(),
        }
    }

    /// Opens an item of `kind`, ending the open one (a thought, complete once the answer
    /// begins).
    fn enter(&mut self, kind: Kind) -> Vec<Event> {
        if self.open.as_ref().is_some_and(|o| o.kind == kind) {
            return Vec::new();
        }
        let mut events = Vec::new();
        if let Some(open) = self.open.take() {
            let id = self.item_id(open.kind);
            let item = json!({"id": id, "type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": open.text}],
                              "status": "completed"});
            events.extend(self.ends(open.index, &item));
            self.closed.push(id);
        }
        let index = self.streamed.len();
        let id = self.item_id(kind);
        let (item, part) = match kind {
            Kind::Reasoning => (
                json!({"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}),
                json!({"type": "reasoning_text", "text": ""}),
            ),
            Kind::Message => (
                json!({"id": id, "type": "message", "role": "assistant", "content": [], "status": "in_progress"}),
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
            ),
        };
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        events.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        ));
        self.streamed.push(id);
        self.open = Some(Open {
            kind,
            index,
            text: String::new(),
        });
        events
    }

    fn delta(&mut self, text: String) -> Event {
        let open = self.open.as_mut().expect("an item is open");
        open.text += &text;
        let (kind, index) = (open.kind, open.index);
        let id = self.item_id(kind);
        match kind {
            Kind::Reasoning => self.event(
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
            ),
            Kind::Message => self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
            ),
        }
    }

    /// The events of one final item at `index`: all of them, only its ends (when its text
    /// streamed), or none (when it is done already).
    fn item_events(&mut self, index: usize, item: &Value) -> Vec<Event> {
        let id = item["id"].as_str().unwrap_or_default().to_string();
        if self.closed.contains(&id) {
            return Vec::new();
        }
        let mut events = Vec::new();
        if item["type"] == "function_call" {
            let mut added = item.clone();
            added["arguments"] = "".into();
            added["status"] = "in_progress".into();
            let args = item["arguments"].clone();
            events.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            ));
            events.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": args}),
            ));
            events.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": args}),
            ));
            events.push(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ));
            return events;
        }
        if !self.streamed.contains(&id) {
            let kind = if item["type"] == "reasoning" {
                Kind::Reasoning
            } else {
                Kind::Message
            };
            events.extend(self.enter(kind));
            let text = item["content"][0]["text"].as_str().unwrap_or_default();
            if !text.is_empty() {
                events.push(self.delta(text.to_string()));
            }
        }
        self.open = None;
        events.extend(self.ends(index, item));
        self.closed.push(id);
        events
    }

    /// The `…done` events of a text item (a thought or a message) at `index`.
    fn ends(&mut self, index: usize, item: &Value) -> Vec<Event> {
        let id = item["id"].clone();
        let part = item["content"][0].clone();
        let text = part["text"].clone();
        let done = if item["type"] == "reasoning" {
            self.event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            )
        } else {
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            )
        };
        vec![
            done,
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]
    }
}

impl Emit for ResponseStream {
    fn opening(&mut self) -> Vec<Event> {
        let response = self.turn.response("in_progress", Vec::new(), Value::Null);
        vec![
            self.event("response.created", json!({"response": response.clone()})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        match piece {
            Piece::Reasoning { text, .. } => {
                let mut events = self.enter(Kind::Reasoning);
                events.push(self.delta(text));
                events
            }
            Piece::Text { text, .. } => {
                let mut events = self.enter(Kind::Message);
                events.push(self.delta(text));
                events
            }
            Piece::Finish { whole, .. } => {
                let output = self.turn.output(&whole);
                let mut events = Vec::new();
                for (index, item) in output.iter().enumerate() {
                    events.extend(self.item_events(index, item));
                }
                let response = self.turn.finish(&whole, output);
                let kind = if response["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                events.push(self.event(kind, json!({"response": response})));
                events
            }
            Piece::Done { .. } => Vec::new(),
            Piece::Failed(message) => {
                let mut response = self.turn.response("failed", Vec::new(), Value::Null);
                response["error"] = json!({"code": "server_error", "message": message});
                let error = ApiError::internal(message).body();
                vec![
                    self.event("error", json!({"message": error["error"]["message"], "code": "server_error", "param": null})),
                    self.event("response.failed", json!({"response": response})),
                ]
            }
        }
    }
}
