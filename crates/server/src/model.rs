//! The served model: its name, its tokenizer and chat template (compiled once), its context, and
//! how requests become prompt tokens.

use std::sync::{Arc, OnceLock};

use anelm_constrain::{CallFormat, Constrained, Grammars, Spec};
use anelm_engine::{ChatTemplate, LoadedModel, Message, RenderOptions, TemplateKwargs};
use anelm_tokenize::Tokenizer;
use serde_json::Value;

use crate::error::ApiError;
use crate::reasoning::{Budget, Markers, Splitter};
use crate::ServerError;

pub struct ServedModel {
    pub id: String,
    pub loaded: Arc<LoadedModel>,
    pub tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    /// Positions in each conversation's context.
    pub ctx: usize,
    /// Whether the chat template writes tool descriptions into the prompt.
    pub tools_supported: bool,
    /// When the server started (OpenAI's `created` of the model).
    pub created: u64,
    /// The markers the model thinks between, if it does ([`Markers::detect`]).
    pub markers: Option<Markers>,
    /// How the template writes a tool call (what a forced call is generated as).
    pub call_format: CallFormat,
    /// The grammar engine over the vocabulary, built on the first constrained request.
    grammars: OnceLock<Result<Grammars, String>>,
}

/// Default context when the model allows more: long chats, modest KV memory per session.
const DEFAULT_CTX: usize = 4096;

/// The context each conversation gets: `requested`, else the default the model allows.
pub fn context_size(requested: Option<usize>, max_positions: usize) -> usize {
    requested.unwrap_or(DEFAULT_CTX.min(max_positions))
}

impl ServedModel {
    pub fn new(
        loaded: LoadedModel,
        id: Option<String>,
        ctx: Option<usize>,
    ) -> Result<ServedModel, ServerError> {
        let path = loaded.model.source.path().to_path_buf();
        let tokenizer = loaded
            .tokenizer()
            .map_err(|e| ServerError::Model(e.to_string()))?
            .clone();
        let template = loaded
            .chat_template()
            .map_err(|e| ServerError::Model(e.to_string()))?;
        let max = loaded.model.max_positions();
        let ctx = context_size(ctx, max);
        if ctx < 2 || ctx > max {
            return Err(ServerError::Model(format!(
                "{}: a context of {ctx} tokens is not possible; the model allows 2 to {max}",
                path.display()
            )));
        }
        let id = id.unwrap_or_else(|| {
            let name = path
                .file_name()
                .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned());
            name.strip_suffix(".gguf").unwrap_or(&name).to_string()
        });
        let (tools_supported, call_format) = describes_tools(&template);
        let markers = Markers::detect(&template, &tokenizer);
        Ok(ServedModel {
            id,
            loaded: Arc::new(loaded),
            tokenizer,
            template,
            ctx,
            tools_supported,
            created: crate::ids::unix_seconds(),
            markers,
            call_format,
            grammars: OnceLock::new(),
        })
    }

    /// A conversation's prompt: the chat template's text ending with the assistant's header,
    /// its special-token text read as special tokens, nothing added (templates write their own
    /// BOS) — as the engine renders `Input::Messages`, with the tools and the request's template
    /// variables (`crate::template_kwargs::for_request`) added. `prefill` is the start of the
    /// reply, which the model continues.
    pub fn chat_prompt(
        &self,
        messages: &[Message],
        tools: Option<Vec<Value>>,
        prefill: Option<&str>,
        kwargs: TemplateKwargs,
    ) -> Result<Vec<u32>, ApiError> {
        let opts = RenderOptions {
            add_generation_prompt: true,
            tools,
            variables: kwargs,
            ..RenderOptions::default()
        };
        let mut text = self
            .template
            .render(messages, &opts)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        text.push_str(prefill.unwrap_or(""));
        self.checked(self.tokenizer.encode(&text, false, true), "messages")
    }

    /// The splitter of a chat reply to `prompt` into thought and answer, when the model thinks
    /// in marked text; the thought is open from the start when the prompt opened it.
    pub fn splitter(&self, prompt: &[u32]) -> Option<Splitter> {
        let markers = self.markers.clone()?;
        let tail = self.text_of(&prompt[prompt.len().saturating_sub(64)..]);
        let inside = markers.open_at_end(&tail);
        Some(Splitter::new(markers, inside))
    }

    /// A request's thinking budget at work: `limit` tokens of thought, then the closing marker
    /// (on a line of its own, as templates write it) is forced. None without a limit or markers.
    pub fn thinking_budget(
        &self,
        splitter: Option<&Splitter>,
        limit: Option<usize>,
    ) -> Option<Budget> {
        let (splitter, limit, markers) = (splitter?, limit?, self.markers.as_ref()?);
        let close = self
            .tokenizer
            .encode(&format!("\n{}\n\n", markers.close), false, true)
            .ok()?;
        Some(Budget::new(splitter.clone(), limit, close))
    }

    /// A fresh constraint holding a reply to `spec`; 400 naming `param` when the schema or
    /// grammar is invalid. Slow the first time (the vocabulary's trie): call off the runtime.
    pub fn constraint(&self, spec: &Spec, param: &str) -> Result<Constrained, ApiError> {
        let grammars = self
            .grammars
            .get_or_init(|| {
                Grammars::for_tokenizer(
                    self.tokenizer.clone(),
                    self.vocab_size(),
                    &self.loaded.stop_ids(),
                )
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ApiError::bad_param(param, e.clone()))?;
        grammars
            .compile(spec)
            .map_err(|e| ApiError::bad_param(param, format!("cannot be enforced: {e}")))
    }

    /// Whether the chat template reads variable `name` (e.g. `enable_thinking`).
    pub fn template_uses(&self, name: &str) -> bool {
        self.template.uses_variable(name)
    }

    /// A plain-text prompt, tokenized as llama.cpp tokenizes one (BOS as the model says).
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.checked(self.tokenizer.encode(text, true, true), "prompt")
    }

    /// Token ids given by the client, checked against the vocabulary.
    pub fn id_prompt(&self, ids: Vec<u32>) -> Result<Vec<u32>, ApiError> {
        let vocab = self.loaded.model.config.vocab_size;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad_param(
                "prompt",
                format!("token id {bad} is outside the vocabulary (size {vocab})"),
            ));
        }
        self.checked(Ok(ids), "prompt")
    }

    /// A prompt must leave room for at least one generated token; `param` is the request
    /// field it came from.
    fn checked(
        &self,
        ids: anelm_tokenize::Result<Vec<u32>>,
        param: &str,
    ) -> Result<Vec<u32>, ApiError> {
        let ids = ids.map_err(|e| ApiError::bad_param(param, e.to_string()))?;
        if ids.is_empty() {
            return Err(ApiError::bad_param(param, "The prompt is empty"));
        }
        if ids.len() >= self.ctx {
            return Err(ApiError::context_exceeded(param, ids.len(), self.ctx));
        }
        Ok(ids)
    }

    /// The text of generated tokens (special tokens have none), for finding which stop string
    /// ended a generation.
    pub fn text_of(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter(|&&id| !self.tokenizer.is_special(id))
            .flat_map(|&id| self.tokenizer.token_to_piece(id))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A token as text, and its bytes (OpenAI's logprobs `token` and `bytes`).
    pub fn piece(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_to_piece(id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    pub fn vocab_size(&self) -> usize {
        self.loaded.model.config.vocab_size
    }
}

/// A template describes tools when giving it one changes what it writes; the way it writes a
/// call (in a conversation that holds one) tells the call format.
fn describes_tools(template: &ChatTemplate) -> (bool, CallFormat) {
    let chat = [Message::user("hello")];
    let probe = serde_json::json!({
        "type": "function",
        "function": {"name": "anelm_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}
    });
    let with = |messages: &[Message]| {
        template.render(
            messages,
            &RenderOptions {
                tools: Some(vec![probe.clone()]),
                ..RenderOptions::default()
            },
        )
    };
    let plain = template.render(&chat, &RenderOptions::default());
    let with_tools = with(&chat);
    let supported = matches!((&plain, &with_tools), (Ok(a), Ok(b)) if a != b);
    let mut call = Message::assistant("");
    call.content = Value::Null;
    call.extra.insert(
        "tool_calls".into(),
        serde_json::json!([{"id": "call_0", "type": "function",
            "function": {"name": "anelm_probe_tool", "arguments": {}}}]),
    );
    let called = with(&[chat[0].clone(), call]).unwrap_or_default();
    let format = CallFormat::detect(&format!("{called}\n{}", with_tools.unwrap_or_default()));
    (supported, format)
}
