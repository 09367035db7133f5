//! `--runner` and `--task`: which engine serves the model (vLLM ≥ 0.10's `--runner
//! generate|pooling`, and the older `--task` spelling), picked from the model's config when
//! neither is given, as vLLM does.

use anyhow::bail;
use clap::{Args, ValueEnum};
use tokenmill_engine::{EngineConfig, PoolingEngine, PoolingEngineConfig};
use tokenmill_models::{
    is_pooling_model, ConvertOption, ModelDtype, PoolerConfig, PoolingOptions, PoolingTask,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunnerArg {
    /// From the model: encoders (BERT) pool, everything else generates.
    Auto,
    Generate,
    Pooling,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    Auto,
    Generate,
    /// Embeddings (`/v1/embeddings`, `/pooling`; `/score` and `/rerank` by cosine).
    #[value(alias = "embedding")]
    Embed,
    /// A cross-encoder's relevance (`/score`, `/rerank`).
    Score,
    /// Sequence classification (`/classify`).
    Classify,
}

#[derive(Debug, Clone, Args)]
pub struct RunnerArgs {
    /// Which engine serves the model: generate (text) or pooling (embeddings, scores,
    /// classes); auto picks pooling for encoder models.
    #[arg(long, value_enum, default_value_t = RunnerArg::Auto, help_heading = "Model")]
    pub runner: RunnerArg,
    /// vLLM's older spelling of --runner: embed, score and classify mean pooling (and must
    /// match what the model does), generate means generate.
    #[arg(long, value_enum, default_value_t = TaskArg::Auto, help_heading = "Model")]
    pub task: TaskArg,
    #[command(flatten)]
    pub pooler: PoolerArgs,
}

/// vLLM's pooling start-up options, shared by `serve` and `embed`.
#[derive(Debug, Clone, Default, Args)]
pub struct PoolerArgs {
    /// How a model without a pooling head becomes one (vLLM's `--convert`): auto (decoders
    /// become embedders under the pooling runner), none, or embed (implies --runner
    /// pooling). classify and reward are refused.
    #[arg(long, value_name = "auto|none|embed", help_heading = "Model")]
    pub convert: Option<String>,
    /// JSON overriding the model's pooling defaults, e.g. '{"pooling_type": "LAST",
    /// "normalize": true}' (pooling_type LAST, MEAN or CLS; other keys are refused).
    #[arg(long, visible_alias = "override-pooler-config", help_heading = "Model")]
    pub pooler_config: Option<String>,
}

impl PoolerArgs {
    /// The parsed options; a bad value is an error naming the flag.
    pub fn options(&self) -> anyhow::Result<PoolingOptions> {
        Ok(PoolingOptions {
            convert: match &self.convert {
                Some(value) => ConvertOption::parse(value)?,
                None => ConvertOption::Auto,
            },
            pooler: match &self.pooler_config {
                Some(text) => PoolerConfig::from_json(text)?,
                None => PoolerConfig::default(),
            },
            dtype: ModelDtype::Auto,
        })
    }

    fn given(&self) -> bool {
        self.convert.is_some() || self.pooler_config.is_some()
    }
}

impl RunnerArgs {
    /// Whether the pooling runner serves `config`'s model.
    pub fn pooling(&self, config: &EngineConfig) -> anyhow::Result<bool> {
        let from_task = match self.task {
            TaskArg::Auto => None,
            TaskArg::Generate => Some(false),
            TaskArg::Embed | TaskArg::Score | TaskArg::Classify => Some(true),
        };
        let options = self.pooler.options()?;
        let from_runner = match self.runner {
            // vLLM: converting to an embedder means the pooling runner.
            RunnerArg::Auto if options.convert == ConvertOption::Embed => Some(true),
            RunnerArg::Auto => None,
            RunnerArg::Generate => Some(false),
            RunnerArg::Pooling => Some(true),
        };
        let pooling = match (from_runner, from_task) {
            (Some(runner), Some(task)) if runner != task => {
                bail!(
                    "--runner {:?} contradicts --task {:?}",
                    self.runner,
                    self.task
                )
            }
            (Some(pooling), _) | (None, Some(pooling)) => pooling,
            (None, None) => is_pooling_model(&config.model),
        };
        if !pooling && self.pooler.given() {
            bail!(
                "--convert and --pooler-config apply to the pooling runner; the model is served \
                 by the generate runner (add --runner pooling)"
            );
        }
        Ok(pooling)
    }

    /// Starts the pooling engine for `config` and checks the model does what `--task` says.
    pub fn start_pooling(&self, config: &EngineConfig) -> anyhow::Result<PoolingEngine> {
        let mut pooling = PoolingEngineConfig::new(config.model.clone());
        pooling.tokenizer = config.tokenizer.clone();
        pooling.num_threads = config.num_threads;
        // Without --max-num-batched-tokens the pooling runner keeps its own larger default:
        // a step of whole short inputs, not 512 tokens of chunks.
        if let Some(budget) = config.max_num_batched_tokens {
            pooling.max_num_batched_tokens = budget;
        }
        pooling.max_num_seqs = config.max_num_seqs;
        pooling.max_model_len = config.max_model_len;
        pooling.served_model_name = config.served_model_name.clone();
        pooling.options = PoolingOptions {
            dtype: config.dtype,
            ..self.pooler.options()?
        };
        let engine = PoolingEngine::start(&pooling)?;
        let task = engine.model().info.task;
        let wanted = match self.task {
            TaskArg::Embed => Some(PoolingTask::Embed),
            TaskArg::Classify => Some(PoolingTask::Classify),
            _ => None,
        };
        if let Some(wanted) = wanted.filter(|&wanted| wanted != task) {
            bail!(
                "--task {:?}: the model is a {} model (task {}), not a {} one",
                self.task,
                engine.model().info.architecture,
                task.name(),
                wanted.name()
            );
        }
        Ok(engine)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tokenmill_models::{ModelSource, PoolingMethod};

    use super::*;

    fn args(runner: RunnerArg, convert: Option<&str>, pooler: Option<&str>) -> RunnerArgs {
        RunnerArgs {
            runner,
            task: TaskArg::Auto,
            pooler: PoolerArgs {
                convert: convert.map(str::to_string),
                pooler_config: pooler.map(str::to_string),
            },
        }
    }

    fn decoder() -> EngineConfig {
        // A path that is no BERT model: the auto runner generates.
        EngineConfig::new(ModelSource::Gguf(PathBuf::from(
            "/nonexistent/decoder.gguf",
        )))
    }

    #[test]
    fn convert_embed_picks_the_pooling_runner() {
        let config = decoder();
        assert!(!args(RunnerArg::Auto, None, None).pooling(&config).unwrap());
        assert!(args(RunnerArg::Auto, Some("embed"), None)
            .pooling(&config)
            .unwrap());
        assert!(args(
            RunnerArg::Pooling,
            None,
            Some(r#"{"pooling_type": "MEAN"}"#)
        )
        .pooling(&config)
        .unwrap());
        let options = args(
            RunnerArg::Pooling,
            Some("embed"),
            Some(r#"{"pooling_type": "MEAN"}"#),
        )
        .pooler
        .options()
        .unwrap();
        assert_eq!(options.convert, ConvertOption::Embed);
        assert_eq!(options.pooler.pooling_type, Some(PoolingMethod::Mean));
    }

    #[test]
    fn pooling_flags_are_refused_where_they_cannot_apply() {
        let config = decoder();
        for (runner, convert, pooler, named) in [
            (RunnerArg::Generate, None, Some("{}"), "--pooler-config"),
            (RunnerArg::Generate, Some("embed"), None, "--convert"),
            (RunnerArg::Pooling, Some("classify"), None, "classify"),
            (
                RunnerArg::Pooling,
                None,
                Some(r#"{"pooling_type": "ALL"}"#),
                "ALL",
            ),
        ] {
            let error = args(runner, convert, pooler)
                .pooling(&config)
                .unwrap_err()
                .to_string();
            assert!(error.contains(named), "{error}");
        }
    }
}
