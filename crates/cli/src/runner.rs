//! `--runner` and `--task`: which engine serves the model (vLLM ≥ 0.10's `--runner
//! generate|pooling`, and the older `--task` spelling), picked from the model's config when
//! neither is given, as vLLM does.

use anyhow::bail;
use clap::{Args, ValueEnum};
use tokenmill_engine::{EngineConfig, PoolingEngine, PoolingEngineConfig};
use tokenmill_models::{is_pooling_model, PoolingTask};

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
}

impl RunnerArgs {
    /// Whether the pooling runner serves `config`'s model.
    pub fn pooling(&self, config: &EngineConfig) -> anyhow::Result<bool> {
        let from_task = match self.task {
            TaskArg::Auto => None,
            TaskArg::Generate => Some(false),
            TaskArg::Embed | TaskArg::Score | TaskArg::Classify => Some(true),
        };
        let from_runner = match self.runner {
            RunnerArg::Auto => None,
            RunnerArg::Generate => Some(false),
            RunnerArg::Pooling => Some(true),
        };
        match (from_runner, from_task) {
            (Some(runner), Some(task)) if runner != task => {
                bail!(
                    "--runner {:?} contradicts --task {:?}",
                    self.runner,
                    self.task
                )
            }
            (Some(pooling), _) | (None, Some(pooling)) => Ok(pooling),
            (None, None) => Ok(is_pooling_model(&config.model)),
        }
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
