//! `vllm:lora_requests_info`: which adapters run and wait, as vLLM exposes it. One series
//! per distinct label set, its value the Unix time it was last set; a router reads the
//! series with the newest timestamp. As in vLLM the gauge has no `model_name`/`engine`
//! labels, and an old label set keeps its last timestamp rather than disappearing.

use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoraInfoLabels {
    max_lora: String,
    waiting_lora_adapters: String,
    running_lora_adapters: String,
}

/// The gauge family and the `max_lora` label value (`--max-loras`).
#[derive(Debug)]
pub(crate) struct LoraInfo {
    family: Family<LoraInfoLabels, Gauge<f64, AtomicU64>>,
    max_lora: String,
}

impl LoraInfo {
    pub fn register(registry: &mut Registry, max_loras: usize) -> LoraInfo {
        let family = Family::<LoraInfoLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "vllm:lora_requests_info",
            "Running stats on lora requests",
            family.clone(),
        );
        LoraInfo {
            family,
            max_lora: max_loras.to_string(),
        }
    }

    /// Sets the series of these adapter names (comma-joined, vLLM's spelling) to now.
    pub fn record(&self, running: &[String], waiting: &[String]) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |elapsed| elapsed.as_secs_f64());
        self.family
            .get_or_create(&LoraInfoLabels {
                max_lora: self.max_lora.clone(),
                waiting_lora_adapters: waiting.join(","),
                running_lora_adapters: running.join(","),
            })
            .set(now);
    }
}

#[cfg(test)]
mod tests {
    use crate::{EngineMetrics, MetricsConfig};

    fn metrics() -> EngineMetrics {
        EngineMetrics::new(MetricsConfig {
            model_name: "base".to_string(),
            max_model_len: 128,
            block_size: 16,
            num_blocks: 10,
            enable_prefix_caching: true,
            cache_dtype: "auto".to_string(),
        })
    }

    #[test]
    fn the_gauge_exists_only_with_lora_on_and_carries_vllms_labels() {
        let plain = metrics();
        plain.record_lora(&["a".to_string()], &[]);
        assert!(!plain.encode().unwrap().contains("lora_requests_info"));

        let mut metrics = metrics();
        metrics.enable_lora(2);
        metrics.record_lora(&["a".to_string(), "c".to_string()], &["b".to_string()]);
        let text = metrics.encode().unwrap();
        let line = text
            .lines()
            .find(|line| line.starts_with("vllm:lora_requests_info{"))
            .unwrap();
        assert!(
            line.starts_with(
                "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"b\",\
                 running_lora_adapters=\"a,c\"} "
            ),
            "{line}"
        );
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value > 1.7e9, "not a Unix time: {value}");
        assert!(
            text.contains("# TYPE vllm:lora_requests_info gauge"),
            "{text}"
        );
    }
}
