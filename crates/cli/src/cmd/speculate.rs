//! The speculative decoding flags of `run`, `chat` and `serve`: a draft model of the same
//! vocabulary, or prompt lookup (no second model). Either keeps the target's output law.

use anelm_engine::{DraftModel, LoadedModel, PromptLookup, SpecStats, Speculation};
use anyhow::{Context, Result};

use super::common::ModelArgs;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpeculateArgs {
    /// Speculative decoding with this draft model (same vocabulary, run on the same device):
    /// greedy output is exactly the target's, sampled output keeps the target's distribution.
    #[arg(long, value_name = "MODEL", conflicts_with = "lookup")]
    pub draft: Option<String>,
    /// Speculative decoding by prompt lookup: the tokens that followed the latest earlier
    /// occurrence of the last few tokens are drafted (no second model; strong when the answer
    /// repeats its input: summaries, edits, code).
    #[arg(long)]
    pub lookup: bool,
    /// Tokens drafted per target pass [default: 4 with --draft, 8 with --lookup].
    #[arg(long, value_name = "K")]
    pub draft_k: Option<usize>,
    /// The longest n-gram prompt lookup matches (it tries shorter ones down to 1).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub lookup_ngram: usize,
}

impl SpeculateArgs {
    pub fn enabled(&self) -> bool {
        self.draft.is_some() || self.lookup
    }

    /// Tokens drafted per pass.
    pub fn k(&self) -> usize {
        self.draft_k.unwrap_or(if self.lookup { 8 } else { 4 })
    }

    /// A prompt lookup drafter with these settings (None without --lookup); refuses k = 0.
    pub fn lookup(&self) -> Result<Option<Speculation>> {
        if !self.lookup {
            return Ok(None);
        }
        if self.lookup_ngram == 0 {
            anyhow::bail!("--lookup-ngram must be at least 1");
        }
        let drafter = PromptLookup {
            min_ngram: 1,
            max_ngram: self.lookup_ngram,
        };
        Ok(Some(Speculation::new(Box::new(drafter), self.k())?))
    }

    /// The speculation the flags ask for, for a target `target` loaded with `model` and a
    /// context of `capacity` positions: the draft model is loaded, checked to share the
    /// target's vocabulary, and put on the same device.
    /// `serve --draft`: the draft model loaded once (its vocabulary checked against the
    /// target's), and a maker of drafters on it, one per generation in progress.
    pub fn draft_maker(
        &self,
        model: &ModelArgs,
        target: &LoadedModel,
        capacity: usize,
    ) -> Result<Option<anelm_server::DraftConfig>> {
        let Some(path) = &self.draft else {
            return Ok(None);
        };
        let draft_args = ModelArgs {
            model: Some(path.clone()),
            ..model.clone()
        };
        let draft = draft_args.load()?;
        anelm_engine::same_vocabulary(target, &draft).with_context(|| format!("--draft {path}"))?;
        if self.k() == 0 {
            anyhow::bail!("--draft-k must be at least 1");
        }
        let capacity = capacity.min(draft.model.max_positions());
        let draft = std::sync::Arc::new(draft);
        let make = move || -> Result<Box<dyn anelm_engine::Drafter>> {
            let exec = draft_args.executor(&draft, capacity)?;
            Ok(Box::new(DraftModel::new(exec, capacity)?))
        };
        Ok(Some(anelm_server::DraftConfig {
            k: self.k(),
            make: std::sync::Arc::new(make),
        }))
    }

    pub fn build(
        &self,
        model: &ModelArgs,
        target: &LoadedModel,
        capacity: usize,
    ) -> Result<Option<Speculation>> {
        let Some(path) = &self.draft else {
            return self.lookup();
        };
        let draft_args = ModelArgs {
            model: Some(path.clone()),
            ..model.clone()
        };
        let draft = draft_args.load()?;
        anelm_engine::same_vocabulary(target, &draft).with_context(|| format!("--draft {path}"))?;
        let capacity = capacity.min(draft.model.max_positions());
        let exec = draft_args.executor(&draft, capacity)?;
        let drafter = DraftModel::new(exec, capacity)?;
        Ok(Some(Speculation::new(Box::new(drafter), self.k())?))
    }
}

/// Logs what a speculative generation achieved.
pub fn report(stats: &SpecStats) {
    if stats.target_passes > 0 {
        tracing::info!(
            drafted = stats.drafted,
            accepted = stats.accepted,
            target_passes = stats.target_passes,
            "speculative: {:.0} % of drafted tokens accepted",
            100.0 * stats.acceptance()
        );
    }
}
