//! Errors: the typed [`ProtocolError`] that validation returns, and the OpenAI error body
//! ([`ErrorResponse`]) that the server writes for every failed request.
//!
//! The HTTP status travels as a plain `u16` (`ErrorBody::code`, as vLLM does) so that this crate
//! needs no HTTP types; the server turns it into a response status.

use serde::{Deserialize, Serialize};

/// Why a request was rejected before it reached the engine. Every variant is a client error
/// (HTTP 400) and names the offending request parameter where there is one, so the server can
/// fill the `param` field of the error body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// The body is not valid JSON, or a field has the wrong JSON type.
    #[error("{message}")]
    MalformedJson { message: String },
    /// A parameter is present and well-typed but its value is out of range or inconsistent.
    #[error("{message}")]
    InvalidParameter { param: String, message: String },
    /// A parameter asks for something tokenmill does not implement (yet).
    #[error("{message}")]
    Unsupported { param: String, message: String },
    /// The prompt, or the prompt plus the requested completion, does not fit the context.
    #[error("{message}")]
    ContextLengthExceeded { param: String, message: String },
}

impl ProtocolError {
    /// An out-of-range or inconsistent value for `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidParameter {
            param: param.into(),
            message: message.into(),
        }
    }

    /// A feature tokenmill does not implement, requested through `param`.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Unsupported {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The request parameter at fault, if one can be named.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::MalformedJson { .. } => None,
            Self::InvalidParameter { param, .. }
            | Self::Unsupported { param, .. }
            | Self::ContextLengthExceeded { param, .. } => Some(param),
        }
    }

    /// The human-readable explanation sent to the client.
    pub fn message(&self) -> &str {
        match self {
            Self::MalformedJson { message }
            | Self::InvalidParameter { message, .. }
            | Self::Unsupported { message, .. }
            | Self::ContextLengthExceeded { message, .. } => message,
        }
    }

    /// The HTTP status this error maps to (always 400).
    pub fn status(&self) -> u16 {
        400
    }
}

/// The OpenAI error envelope: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// The body of an [`ErrorResponse`]. `code` carries the HTTP status, as vLLM sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub message: String,
    #[serde(rename = "type")]
    pub error_type: String,
    #[serde(default)]
    pub param: Option<String>,
    #[serde(default)]
    pub code: Option<u16>,
}

impl ErrorResponse {
    /// An error with an explicit status and OpenAI error type.
    pub fn new(status: u16, error_type: &str, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                message: message.into(),
                error_type: error_type.to_string(),
                param: None,
                code: Some(status),
            },
        }
    }

    /// Names the request parameter at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    /// 400: malformed body, wrong types, out-of-range values.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }

    /// 401: missing or wrong API key.
    pub fn authentication(message: impl Into<String>) -> Self {
        Self::new(401, "authentication_error", message)
    }

    /// 404: unknown model or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found_error", message)
    }

    /// 404 for a model name that is not served, with the OpenAI wording.
    pub fn model_not_found(model: &str) -> Self {
        Self::not_found(format!("The model `{model}` does not exist.")).with_param("model")
    }

    /// 413: the request body is over the configured size limit.
    pub fn request_too_large(limit_bytes: usize) -> Self {
        Self::new(
            413,
            "request_too_large",
            format!("The request body is larger than the limit of {limit_bytes} bytes."),
        )
    }

    /// 429: too many requests for the server's admission limits.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(429, "rate_limit_error", message)
    }

    /// 503: the server is draining for shutdown or the engine is not running.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(503, "service_unavailable", message)
    }

    /// 500: an internal failure; the message should not leak internals.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal_server_error", message)
    }

    /// The HTTP status to send: the `code` field, 500 if absent.
    pub fn status(&self) -> u16 {
        self.error.code.unwrap_or(500)
    }
}

impl From<&ProtocolError> for ErrorResponse {
    fn from(error: &ProtocolError) -> Self {
        let response = Self::invalid_request(error.message());
        match error.param() {
            Some(param) => response.with_param(param),
            None => response,
        }
    }
}

impl From<ProtocolError> for ErrorResponse {
    fn from(error: ProtocolError) -> Self {
        Self::from(&error)
    }
}

/// Parses a request body, turning serde's error into a [`ProtocolError::MalformedJson`] whose
/// message keeps serde's description (it names the expected type and the position).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    parse_json_noting_ignored(body).map(|(value, _)| value)
}

/// [`parse_json`] that also returns the paths of the fields the request type does not know
/// (e.g. `user`, `metadata.tag`), which serde skips, so the server can warn about them as
/// vLLM does.
pub fn parse_json_noting_ignored<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<(T, Vec<String>), ProtocolError> {
    let mut ignored = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_ignored::deserialize(&mut deserializer, |path| {
        ignored.push(path.to_string());
    })
    .and_then(|value| deserializer.end().map(|()| value))
    .map_err(|error| ProtocolError::MalformedJson {
        message: format!("Invalid request body: {error}"),
    })?;
    Ok((value, ignored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_error_maps_to_400_with_param() {
        let error = ProtocolError::invalid("top_p", "top_p must be in (0, 1], got 0.");
        let response = ErrorResponse::from(error);
        assert_eq!(response.status(), 400);
        assert_eq!(response.error.param.as_deref(), Some("top_p"));
        assert_eq!(response.error.error_type, "invalid_request_error");
        let json = serde_json::to_value(&response).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {
                "message": "top_p must be in (0, 1], got 0.",
                "type": "invalid_request_error",
                "param": "top_p",
                "code": 400
            }})
        );
    }

    #[test]
    fn ignored_fields_are_named_with_their_paths() {
        #[derive(serde::Deserialize)]
        struct Known {
            #[allow(dead_code)]
            model: String,
        }
        let (_, ignored): (Known, _) =
            parse_json_noting_ignored(br#"{"model": "m", "user": "u", "extra": {"a": 1}}"#)
                .unwrap();
        assert_eq!(ignored, ["user", "extra"]);
        assert!(parse_json::<Known>(br#"{"model": "m"} trailing"#).is_err());
    }

    #[test]
    fn constructors_carry_their_status() {
        assert_eq!(ErrorResponse::authentication("no key").status(), 401);
        assert_eq!(ErrorResponse::model_not_found("x").status(), 404);
        assert_eq!(ErrorResponse::request_too_large(10).status(), 413);
        assert_eq!(ErrorResponse::rate_limited("slow down").status(), 429);
        assert_eq!(ErrorResponse::overloaded("draining").status(), 503);
        assert_eq!(ErrorResponse::internal("oops").status(), 500);
    }

    #[test]
    fn malformed_json_has_no_param() {
        let error = parse_json::<serde_json::Value>(b"{not json").unwrap_err();
        assert!(matches!(error, ProtocolError::MalformedJson { .. }));
        let response = ErrorResponse::from(&error);
        assert_eq!(response.error.param, None);
        assert!(response.error.message.starts_with("Invalid request body"));
    }
}
