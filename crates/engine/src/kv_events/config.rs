//! `--kv-events-config`: vLLM's `KVEventsConfig` keys, defaults and checks.

use serde::Deserialize;

use crate::EngineError;

/// What the flag's JSON holds. Unknown keys are refused, as vLLM's config class does.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Record and publish events at all.
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"` (events recorded nowhere); absent = `"zmq"` when enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// The PUB socket: bound when the host is `*` or an IPv6 wildcard, else connected.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The ROUTER socket answering replay requests (always bound); `None` = no replay.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches (one per engine step with events) kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Batches waiting to go out on the PUB socket beyond which new ones are dropped (and
    /// counted); 0 = no limit, as in ZeroMQ. Dropped batches stay in the replay buffer.
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches waiting between the engine loop and the publisher thread; beyond it the loop
    /// drops (and counts) a batch rather than wait.
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// The first frame of every published message (subscribers filter on its prefix).
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".to_owned()
}

fn default_buffer_steps() -> usize {
    10_000
}

fn default_hwm() -> usize {
    100_000
}

fn default_max_queue_size() -> usize {
    100_000
}

impl KvEventsConfig {
    /// Parses and checks the flag's JSON.
    pub fn parse(json: &str) -> Result<KvEventsConfig, EngineError> {
        let invalid = |reason: String| EngineError::Config(format!("--kv-events-config: {reason}"));
        let config: KvEventsConfig =
            serde_json::from_str(json).map_err(|err| invalid(err.to_string()))?;
        match config.publisher.as_deref() {
            None | Some("zmq" | "null") => {}
            Some(other) => {
                return Err(invalid(format!(
                    "publisher {other:?} is not one of \"zmq\", \"null\""
                )))
            }
        }
        if config.max_queue_size == 0 {
            return Err(invalid("max_queue_size must be at least 1".to_owned()));
        }
        if config.publishes() {
            ZmqEndpoint::parse(&config.endpoint).map_err(invalid)?;
            if let Some(replay) = &config.replay_endpoint {
                ZmqEndpoint::parse(replay).map_err(invalid)?;
            }
        }
        Ok(config)
    }

    /// Whether events go out on ZeroMQ (enabled, and the publisher is `zmq` or unset).
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }
}

/// A `tcp://host:port` endpoint. Only TCP: the pure-Rust ZeroMQ here has no `inproc`, and
/// `ipc` is not built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZmqEndpoint {
    pub host: String,
    pub port: u16,
}

impl ZmqEndpoint {
    pub fn parse(endpoint: &str) -> Result<ZmqEndpoint, String> {
        let bad = || format!("endpoint {endpoint:?} is not tcp://HOST:PORT");
        let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        if host.is_empty() {
            return Err(bad());
        }
        Ok(ZmqEndpoint {
            host: host.to_owned(),
            port,
        })
    }

    /// vLLM's rule: a wildcard host binds, any other connects.
    pub fn binds(&self) -> bool {
        self.host.contains('*') || self.host.contains("::")
    }

    /// The endpoint of data-parallel rank `rank`: the port moved up by the rank (vLLM's
    /// `offset_endpoint_port`).
    pub fn for_rank(&self, rank: usize) -> Result<ZmqEndpoint, String> {
        let port = u16::try_from(usize::from(self.port) + rank)
            .map_err(|_| format!("port {} + rank {rank} is past 65535", self.port))?;
        Ok(ZmqEndpoint {
            host: self.host.clone(),
            port,
        })
    }

    /// The address as the socket library takes it (`*` spelled as the IPv4 wildcard).
    pub fn address(&self) -> String {
        let host = if self.host == "*" {
            "0.0.0.0"
        } else {
            &self.host
        };
        format!("tcp://{host}:{}", self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_vllms() {
        let config = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#).unwrap();
        assert!(config.publishes());
        assert_eq!(config.endpoint, "tcp://*:5557");
        assert_eq!(config.replay_endpoint, None);
        assert_eq!(
            (config.buffer_steps, config.hwm, config.max_queue_size),
            (10_000, 100_000, 100_000)
        );
        assert_eq!(config.topic, "");
        let off = KvEventsConfig::parse("{}").unwrap();
        assert!(!off.publishes());
        let null =
            KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#)
                .unwrap();
        assert!(!null.publishes());
    }

    #[test]
    fn bad_configs_are_refused_by_name() {
        for (json, needle) in [
            (
                r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#,
                "kafka",
            ),
            (r#"{"enable_kv_cache_events": true, "bogus": 1}"#, "bogus"),
            (
                r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///x"}"#,
                "ipc",
            ),
            (
                r#"{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:x"}"#,
                "tcp://*:x",
            ),
            (
                r#"{"enable_kv_cache_events": true, "max_queue_size": 0}"#,
                "max_queue_size",
            ),
            ("not json", "--kv-events-config"),
        ] {
            let err = KvEventsConfig::parse(json).unwrap_err().to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn endpoints_bind_on_wildcards_and_shift_by_rank() {
        let endpoint = ZmqEndpoint::parse("tcp://*:5557").unwrap();
        assert!(endpoint.binds());
        assert_eq!(endpoint.address(), "tcp://0.0.0.0:5557");
        assert_eq!(
            endpoint.for_rank(2).unwrap().address(),
            "tcp://0.0.0.0:5559"
        );
        let remote = ZmqEndpoint::parse("tcp://router.local:6000").unwrap();
        assert!(!remote.binds());
        assert!(ZmqEndpoint::parse("tcp://*:65535")
            .unwrap()
            .for_rank(1)
            .is_err());
    }
}
