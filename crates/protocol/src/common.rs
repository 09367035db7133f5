//! Wire pieces shared by the completion and chat endpoints: `stop`, `stream_options`,
//! `response_format`, `usage`, finish and stop reasons, and response id helpers.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `stop`: one string or a list of strings. vLLM puts no limit on the count (OpenAI allows 4).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StopInput {
    Single(String),
    Many(Vec<String>),
}

impl StopInput {
    /// The stop strings as a list, in request order.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::Single(stop) => vec![stop.clone()],
            Self::Many(stops) => stops.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for StopInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const EXPECTED: &str = "`stop` must be a string or an array of strings";
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(stop) => Ok(Self::Single(stop)),
            serde_json::Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    serde_json::Value::String(stop) => Ok(stop),
                    _ => Err(D::Error::custom(EXPECTED)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Many),
            _ => Err(D::Error::custom(EXPECTED)),
        }
    }
}

/// `stream_options`: only meaningful (and only allowed) with `stream: true`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with empty `choices` and the request's `usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// vLLM extra: attach the running `usage` to every chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuous_usage_stats: Option<bool>,
}

/// `response_format`: `text`, `json_object` or `json_schema` (with its `json_schema` body).
/// `json_object` and `json_schema` constrain the output (structured outputs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub format_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
}

/// The checked kind of a [`ResponseFormat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormatKind {
    Text,
    JsonObject,
    JsonSchema,
}

/// Token accounting, present on every non-streaming response and on the final usage chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// Serialized only when the engine reported how much of the prompt came from the cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage with `total_tokens` computed; `cached_tokens` when the engine knows it.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32>) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        }
    }
}

/// Why a choice finished. `abort` is vLLM's value for a cancelled request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    Error,
    ToolCalls,
    ContentFilter,
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended the choice; `null` when it
/// ended for another reason (EOS included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopReason {
    TokenId(u32),
    Text(String),
}

/// JSON has no infinities: serde_json would write `-inf` as `null`, which clients read as
/// "no logprob". A masked or underflowed token gets vLLM's floor of -9999 instead.
pub fn wire_logprob(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else if logprob.is_nan() || logprob < 0.0 {
        -9999.0
    } else {
        0.0
    }
}

/// 32 random lowercase hex digits, the shape of vLLM's `random_uuid()`.
pub fn random_hex_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// `cmpl-` + the request id the client sent (vLLM's `request_id`), or random hex.
pub fn completion_id(request_id: Option<&str>) -> String {
    format!(
        "cmpl-{}",
        request_id.map_or_else(random_hex_id, str::to_string)
    )
}

/// `chatcmpl-` + the request id the client sent, or random hex.
pub fn chat_completion_id(request_id: Option<&str>) -> String {
    format!(
        "chatcmpl-{}",
        request_id.map_or_else(random_hex_id, str::to_string)
    )
}

/// An ordered `token → logprob` JSON object (legacy completions `top_logprobs` entries).
/// Kept as a list so the most likely token is written first, as OpenAI and vLLM do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, &wire_logprob(*logprob))?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> serde::de::Visitor<'de> for MapVisitor {
            type Value = TopLogprobMap;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("an object mapping tokens to logprobs")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some((token, logprob)) = access.next_entry::<String, f32>()? {
                    entries.push((token, logprob));
                }
                Ok(TopLogprobMap(entries))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

/// Integer request fields accept a float with no fractional part (`16.0`), as vLLM's pydantic
/// models do: Python clients that compute a length as a float send it that way.
pub(crate) fn lenient_integer<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    struct IntegerVisitor;
    impl<'de> serde::de::Visitor<'de> for IntegerVisitor {
        type Value = Option<i64>;
        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("an integer")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, inner: D2) -> Result<Self::Value, D2::Error> {
            inner.deserialize_any(self)
        }
        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Self::Value, E> {
            Ok(Some(value))
        }
        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Self::Value, E> {
            i64::try_from(value)
                .map(Some)
                .map_err(|_| E::custom(format!("integer {value} is out of range")))
        }
        fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Self::Value, E> {
            // 2^63 is the first float past i64::MAX.
            let in_range = (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&value);
            if value.fract() == 0.0 && in_range {
                Ok(Some(value as i64))
            } else {
                Err(E::invalid_type(serde::de::Unexpected::Float(value), &self))
            }
        }
    }
    deserializer.deserialize_option(IntegerVisitor)
}

/// An optional object field that refuses a JSON array: serde's derived structs also read a
/// sequence of their fields in order (`"reasoning": [null, null]`), which the API's schema
/// does not allow.
pub(crate) fn object_only<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value @ serde_json::Value::Object(_)) => serde_json::from_value(value)
            .map(Some)
            .map_err(D::Error::custom),
        Some(other) => Err(D::Error::invalid_type(
            match &other {
                serde_json::Value::Array(_) => serde::de::Unexpected::Seq,
                serde_json::Value::Bool(b) => serde::de::Unexpected::Bool(*b),
                serde_json::Value::String(s) => serde::de::Unexpected::Str(s),
                _ => serde::de::Unexpected::Other("a number"),
            },
            &"an object",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stop_accepts_string_and_list_and_rejects_others() {
        let single: StopInput = serde_json::from_value(json!("\n")).unwrap();
        assert_eq!(single.to_vec(), vec!["\n"]);
        let many: StopInput = serde_json::from_value(json!(["a", "b"])).unwrap();
        assert_eq!(many.to_vec(), vec!["a", "b"]);
        let error = serde_json::from_value::<StopInput>(json!([1])).unwrap_err();
        assert!(error.to_string().contains("`stop` must be a string"));
        assert!(serde_json::from_value::<StopInput>(json!(3)).is_err());
    }

    #[derive(Deserialize)]
    struct WithInteger {
        #[serde(default, deserialize_with = "lenient_integer")]
        value: Option<i64>,
    }

    #[test]
    fn integers_accept_whole_floats_only() {
        let parse = |text: &str| serde_json::from_str::<WithInteger>(text).map(|with| with.value);
        assert_eq!(parse(r#"{"value": 16}"#).unwrap(), Some(16));
        assert_eq!(parse(r#"{"value": 16.0}"#).unwrap(), Some(16));
        assert_eq!(parse(r#"{"value": -1}"#).unwrap(), Some(-1));
        assert_eq!(parse(r#"{"value": null}"#).unwrap(), None);
        assert_eq!(parse(r#"{}"#).unwrap(), None);
        assert!(parse(r#"{"value": 1.5}"#).is_err());
        assert!(parse(r#"{"value": "3"}"#).is_err());
        assert!(parse(r#"{"value": 1e30}"#).is_err());
        assert!(parse(r#"{"value": 18446744073709551615}"#).is_err());
    }

    #[test]
    fn usage_omits_details_unless_known() {
        let plain = serde_json::to_value(Usage::new(5, 7, None)).unwrap();
        assert_eq!(
            plain,
            json!({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12})
        );
        let cached = serde_json::to_value(Usage::new(5, 7, Some(4))).unwrap();
        assert_eq!(cached["prompt_tokens_details"], json!({"cached_tokens": 4}));
    }

    #[test]
    fn finish_and_stop_reasons_use_vllm_spelling() {
        assert_eq!(
            serde_json::to_value(FinishReason::Abort).unwrap(),
            json!("abort")
        );
        assert_eq!(
            serde_json::to_value(FinishReason::ToolCalls).unwrap(),
            json!("tool_calls")
        );
        assert_eq!(
            serde_json::to_value(StopReason::TokenId(2)).unwrap(),
            json!(2)
        );
        assert_eq!(
            serde_json::to_value(StopReason::Text("###".into())).unwrap(),
            json!("###")
        );
    }

    #[test]
    fn ids_have_prefix_and_hex_body() {
        let id = completion_id(None);
        assert!(id.starts_with("cmpl-"));
        let body = &id["cmpl-".len()..];
        assert_eq!(body.len(), 32);
        assert!(body.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(completion_id(None), completion_id(None));
        assert_eq!(chat_completion_id(Some("abc")), "chatcmpl-abc");
    }

    #[test]
    fn top_logprob_map_keeps_order_and_floors_infinity() {
        let map = TopLogprobMap(vec![("b".into(), -0.1), ("a".into(), f32::NEG_INFINITY)]);
        let text = serde_json::to_string(&map).unwrap();
        assert_eq!(text, r#"{"b":-0.1,"a":-9999.0}"#);
        let back: TopLogprobMap = serde_json::from_str(&text).unwrap();
        assert_eq!(back.0[0].0, "b");
        assert_eq!(back.0[1], ("a".to_string(), -9999.0));
    }
}
