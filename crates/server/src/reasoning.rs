//! Thinking kept apart from the answer: a reasoning model writes its thought between markers
//! (`<think>…</think>`, or its template's own pair), and the APIs give that text apart from the
//! reply (`reasoning_content`, `thinking` blocks, reasoning items). The [`Splitter`] works on the
//! text as it streams, so a marker split across tokens is still found.

use anelm_engine::{ChatTemplate, Message, RenderOptions};
use anelm_tokenize::Tokenizer;
use serde_json::Value;

use crate::error::ApiError;

/// The markers a model's thought sits between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Markers {
    pub open: String,
    pub close: String,
}

/// The pairs chat templates use (Qwen3, SmolLM3, DeepSeek-R1 and most others: `<think>`).
const KNOWN: [(&str, &str); 5] = [
    ("<think>", "</think>"),
    ("<seed:think>", "</seed:think>"),
    ("<mm:think>", "</mm:think>"),
    ("[THINK]", "[/THINK]"),
    ("<thinking>", "</thinking>"),
];

impl Markers {
    /// The model's markers: the first known pair its chat template writes, or whose closing
    /// marker is one token of its vocabulary. None: the model does not think in text, and its
    /// replies are left whole.
    pub fn detect(template: &ChatTemplate, tokenizer: &Tokenizer) -> Option<Markers> {
        Markers::of_template(template).or_else(|| {
            KNOWN
                .iter()
                .find(|(_, close)| tokenizer.token_id(close).is_some())
                .map(|&(open, close)| Markers::new(open, close))
        })
    }

    /// The first known pair the template writes: around an earlier thought
    /// (`reasoning_content`, as transformers passes it), or in the generation prompt with
    /// thinking on or off (DeepSeek-R1 opens the thought there, Qwen3 writes an empty one).
    pub fn of_template(template: &ChatTemplate) -> Option<Markers> {
        let (question, probe) = ("anelm-probe-question", "anelm-probe-thought");
        let mut answer = Message::assistant("anelm-probe-answer");
        answer
            .extra
            .insert("reasoning_content".into(), Value::String(probe.into()));
        let earlier = template
            .render(
                &[Message::user(question), answer],
                &RenderOptions::default(),
            )
            .unwrap_or_default();
        let prompts: Vec<String> = [true, false]
            .into_iter()
            .filter_map(|on| {
                let mut variables = serde_json::Map::new();
                variables.insert("enable_thinking".into(), on.into());
                let opts = RenderOptions {
                    add_generation_prompt: true,
                    variables,
                    ..RenderOptions::default()
                };
                template.render(&[Message::user(question)], &opts).ok()
            })
            .collect();
        let written = |open: &str, close: &str| {
            let around = earlier
                .find(probe)
                .is_some_and(|at| earlier[..at].contains(open) && earlier[at..].contains(close));
            // After the user's message: the generation prompt.
            let prompted = prompts
                .iter()
                .any(|p| p.rfind(question).is_some_and(|at| p[at..].contains(open)));
            around || prompted
        };
        KNOWN
            .iter()
            .find(|(open, close)| written(open, close))
            .map(|&(open, close)| Markers::new(open, close))
    }

    fn new(open: &str, close: &str) -> Markers {
        Markers {
            open: open.into(),
            close: close.into(),
        }
    }

    /// Whether a prompt's text ends inside a thought (DeepSeek-R1's template opens it for the
    /// model): its last marker is an opening one.
    pub fn open_at_end(&self, prompt_text: &str) -> bool {
        match (
            prompt_text.rfind(&self.open),
            prompt_text.rfind(&self.close),
        ) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// A piece of a reply: thought or answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the reply may open a thought.
    Start,
    /// In the thought; `fresh` until its first visible character.
    Thinking { fresh: bool },
    /// The thought closed; the whitespace before the answer is dropped.
    AfterThought,
    /// The answer: everything else is passed on.
    Answer,
}

/// Splits a streamed reply into thought and answer. A thought opens only at the start of the
/// reply (or is open from the prompt); the whitespace around it is dropped. Text that may be
/// the start of a marker is held until the next piece tells.
#[derive(Clone, Debug)]
pub struct Splitter {
    markers: Markers,
    state: State,
    held: String,
}

impl Splitter {
    /// `inside`: the prompt opened the thought.
    pub fn new(markers: Markers, inside: bool) -> Splitter {
        Splitter {
            markers,
            state: if inside {
                State::Thinking { fresh: true }
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Whether the reply is in its thought now.
    pub fn thinking(&self) -> bool {
        matches!(self.state, State::Thinking { .. })
    }

    /// The pieces `text` completes, in order.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        loop {
            match self.state {
                State::Answer => {
                    emit(&mut out, Piece::Answer(buf));
                    return out;
                }
                State::Start => {
                    let trimmed = buf.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(self.markers.open.as_str()) {
                        buf = rest.to_string();
                        self.state = State::Thinking { fresh: true };
                    } else if self.markers.open.starts_with(trimmed) {
                        self.held = buf;
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking { fresh } => {
                    let body = if fresh { buf.trim_start() } else { &buf[..] };
                    if fresh && !body.is_empty() {
                        self.state = State::Thinking { fresh: false };
                    }
                    if let Some(at) = body.find(self.markers.close.as_str()) {
                        emit(
                            &mut out,
                            Piece::Reasoning(body[..at].trim_end().to_string()),
                        );
                        buf = body[at + self.markers.close.len()..].to_string();
                        self.state = State::AfterThought;
                        continue;
                    }
                    // Hold what may begin the closing marker, and trailing whitespace (dropped
                    // if the marker follows).
                    let keep = partial_suffix(body, &self.markers.close);
                    let visible = body[..body.len() - keep].trim_end();
                    emit(&mut out, Piece::Reasoning(visible.to_string()));
                    self.held = body[visible.len()..].to_string();
                    return out;
                }
                State::AfterThought => {
                    let trimmed = buf.trim_start();
                    if trimmed.is_empty() {
                        return out;
                    }
                    buf = trimmed.to_string();
                    self.state = State::Answer;
                }
            }
        }
    }

    /// The end of the reply: what was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Start | State::Answer => emit(&mut out, Piece::Answer(held)),
            State::Thinking { .. } => emit(&mut out, Piece::Reasoning(held.trim_end().to_string())),
            State::AfterThought => {}
        }
        out
    }
}

fn emit(out: &mut Vec<Piece>, piece: Piece) {
    let empty = match &piece {
        Piece::Reasoning(t) | Piece::Answer(t) => t.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

/// The length of the longest end of `text` that begins `marker` (whole characters).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            let at = text.len() - k;
            text.is_char_boundary(at) && marker.starts_with(&text[at..])
        })
        .unwrap_or(0)
}

/// A thinking budget at work: counts the tokens drawn in the thought and, once they reach the
/// limit, gives the tokens that close it (once).
#[derive(Clone, Debug)]
pub struct Budget {
    splitter: Splitter,
    limit: usize,
    close: Vec<u32>,
    thought: usize,
    forced: bool,
}

impl Budget {
    /// `splitter` as the reply starts; `close`: the closing marker's tokens.
    pub fn new(splitter: Splitter, limit: usize, close: Vec<u32>) -> Budget {
        Budget {
            splitter,
            limit,
            close,
            thought: 0,
            forced: false,
        }
    }

    /// A token was drawn.
    pub fn token(&mut self) {
        if self.splitter.thinking() {
            self.thought += 1;
        }
    }

    /// Text came out.
    pub fn text(&mut self, text: &str) {
        self.splitter.push(text);
    }

    /// The tokens to force now, if the thought just reached its limit.
    pub fn due(&mut self) -> Option<&[u32]> {
        if self.forced || !self.splitter.thinking() || self.thought < self.limit {
            return None;
        }
        self.forced = true;
        Some(&self.close)
    }
}

/// A request's thinking budget: `max_thinking_tokens` (OpenAI-style requests) or Anthropic's
/// `thinking.budget_tokens`; at least 1.
pub fn budget(param: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::bad_param(
            param,
            format!("{param} must be at least 1, got {n}"),
        )),
    }
}

/// Anthropic's `thinking.budget_tokens`, when thinking is enabled.
pub fn anthropic_budget(thinking: Option<&Value>) -> Result<Option<usize>, ApiError> {
    let Some(t) = thinking.filter(|t| t.get("type").and_then(Value::as_str) == Some("enabled"))
    else {
        return Ok(None);
    };
    match t.get("budget_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) => budget("thinking.budget_tokens", Some(n)),
            None => Err(ApiError::bad_param(
                "thinking.budget_tokens",
                "thinking.budget_tokens must be an integer",
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think() -> Markers {
        Markers {
            open: "<think>".into(),
            close: "</think>".into(),
        }
    }

    /// Feeds `pieces` one after another; the thought and the answer, each joined.
    fn split(inside: bool, pieces: &[&str]) -> (String, String) {
        let mut s = Splitter::new(think(), inside);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| s.push(p)).collect();
        out.extend(s.finish());
        let mut reasoning = String::new();
        let mut answer = String::new();
        for p in out {
            match p {
                Piece::Reasoning(t) => reasoning += &t,
                Piece::Answer(t) => answer += &t,
            }
        }
        (reasoning, answer)
    }

    /// Every way of cutting `text` into two or three pieces gives the same split.
    fn every_cut(inside: bool, text: &str) -> (String, String) {
        let whole = split(inside, &[text]);
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            assert_eq!(
                split(inside, &[&text[..i], &text[i..]]),
                whole,
                "cut at {i}"
            );
            for &j in bounds.iter().filter(|&&j| j >= i) {
                let three = [&text[..i], &text[i..j], &text[j..]];
                assert_eq!(split(inside, &three), whole, "cuts at {i}, {j}");
            }
        }
        whole
    }

    #[test]
    fn a_thought_at_the_start_is_kept_apart_however_the_text_is_cut() {
        let (r, a) = every_cut(false, "<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4.");
        assert_eq!((r.as_str(), a.as_str()), ("Let me see: 2 + 2.", "It is 4."));
        let (r, a) = every_cut(false, "  <think>é ü </think>ß");
        assert_eq!((r.as_str(), a.as_str()), ("é ü", "ß"));
    }

    #[test]
    fn a_prompt_that_opens_the_thought() {
        let (r, a) = every_cut(true, "\nhmm </thi nk> still\n</think>\n\nDone.");
        assert_eq!((r.as_str(), a.as_str()), ("hmm </thi nk> still", "Done."));
    }

    #[test]
    fn replies_without_a_thought_stay_whole() {
        for text in [
            "Hello <think>x</think>",
            "  <thin",
            "<",
            "\n\n",
            "Plain text.",
            "<b>",
        ] {
            assert_eq!(
                every_cut(false, text),
                (String::new(), text.to_string()),
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_unclosed_thought_is_all_reasoning() {
        assert_eq!(
            every_cut(false, "<think> cut off </thi"),
            ("cut off </thi".to_string(), String::new())
        );
        assert_eq!(every_cut(false, "<think>"), (String::new(), String::new()));
    }

    #[test]
    fn markers_inside_the_answer_are_text() {
        let (r, a) = every_cut(false, "<think>a</think>b <think>c</think>");
        assert_eq!((r.as_str(), a.as_str()), ("a", "b <think>c</think>"));
    }

    #[test]
    fn the_state_follows_the_text() {
        let mut s = Splitter::new(think(), false);
        assert!(!s.thinking());
        s.push("<thi");
        assert!(!s.thinking(), "not yet: the marker is incomplete");
        s.push("nk>x");
        assert!(s.thinking());
        s.push("</think>");
        assert!(!s.thinking());
    }

    #[test]
    fn other_markers_work_the_same() {
        let markers = Markers {
            open: "[THINK]".into(),
            close: "[/THINK]".into(),
        };
        let mut s = Splitter::new(markers, false);
        let mut out = s.push("[THI");
        out.extend(s.push("NK]a[/TH"));
        out.extend(s.push("INK]b"));
        out.extend(s.finish());
        assert_eq!(
            out,
            [Piece::Reasoning("a".into()), Piece::Answer("b".into())]
        );
    }

    #[test]
    fn the_prompt_tells_whether_a_thought_is_open() {
        let m = think();
        assert!(m.open_at_end("<|Assistant|><think>\n"));
        assert!(!m.open_at_end("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!m.open_at_end("<|im_start|>assistant\n"));
    }

    #[test]
    fn a_budget_closes_the_thought_once_when_it_is_spent() {
        let mut b = Budget::new(Splitter::new(think(), false), 2, vec![7, 8]);
        b.token();
        b.text("<think>");
        assert_eq!(b.due(), None, "the opening token does not count");
        b.token();
        b.text("a");
        assert_eq!(b.due(), None);
        b.token();
        b.text("b");
        assert_eq!(b.due(), Some(&[7, 8][..]));
        b.token();
        assert_eq!(b.due(), None, "only once");
        let mut quick = Budget::new(Splitter::new(think(), true), 5, vec![7]);
        quick.token();
        quick.text("x</think>answer");
        for _ in 0..10 {
            quick.token();
        }
        assert_eq!(quick.due(), None, "the thought ended on its own");
    }

    /// The real templates of the tokenize crate's fixtures (as their models publish them).
    fn real_template(name: &str) -> ChatTemplate {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tokenize/tests/fixtures/real_templates/templates")
            .join(format!("{name}.jinja"));
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        ChatTemplate::new(
            &source,
            anelm_tokenize::TemplateOrigin::HfFile(path),
            Some("<s>".into()),
            Some("</s>".into()),
        )
        .unwrap()
    }

    #[test]
    fn real_templates_name_their_markers() {
        for (name, open) in [
            ("Qwen-Qwen3-0.6B", "<think>"),
            ("HuggingFaceTB-SmolLM3-3B", "<think>"),
            ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<think>"),
            ("Qwen-QwQ-32B", "<think>"),
            ("ByteDance-Seed-OSS", "<seed:think>"),
            ("GLM-4.6", "<think>"),
            ("Qwen3.5-4B", "<think>"),
            ("deepseek-ai-DeepSeek-V3.1", "<think>"),
        ] {
            let found = Markers::of_template(&real_template(name));
            assert_eq!(found.map(|m| m.open), Some(open.to_string()), "{name}");
        }
        for name in [
            "Qwen-Qwen2.5-7B-Instruct",
            "meta-llama-Llama-3.1-8B-Instruct",
            "google-gemma-2-2b-it",
            "microsoft-Phi-3.5-mini-instruct",
        ] {
            assert_eq!(Markers::of_template(&real_template(name)), None, "{name}");
        }
    }

    #[test]
    fn budgets_are_positive() {
        assert_eq!(budget("max_thinking_tokens", Some(5)).unwrap(), Some(5));
        assert!(budget("max_thinking_tokens", Some(0)).is_err());
        let on = serde_json::json!({"type": "enabled", "budget_tokens": 64});
        assert_eq!(anthropic_budget(Some(&on)).unwrap(), Some(64));
        let off = serde_json::json!({"type": "disabled", "budget_tokens": 64});
        assert_eq!(anthropic_budget(Some(&off)).unwrap(), None);
        let bad = serde_json::json!({"type": "enabled", "budget_tokens": "x"});
        assert_eq!(
            anthropic_budget(Some(&bad)).unwrap_err().param.as_deref(),
            Some("thinking.budget_tokens")
        );
    }
}
