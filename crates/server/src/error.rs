//! One error type for every handler, with one mapping to an OpenAI-style HTTP response.

use axum::http::HeaderValue;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokenmill_protocol::{anthropic_request_id, AnthropicError, ErrorResponse, ProtocolError};

/// Anything a handler can fail with; the response body is always OpenAI's error object.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("{}", .0.error.message)]
    Response(Box<ErrorResponse>),
    /// Details are logged, not shown to clients.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::Response(Box::new(ErrorResponse::invalid_request(message)))
    }

    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::Protocol(ProtocolError::invalid(param, message))
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::Response(Box::new(ErrorResponse::overloaded(message)))
    }

    pub fn to_error_response(&self) -> ErrorResponse {
        match self {
            ApiError::Protocol(err) => ErrorResponse::from(err.clone()),
            ApiError::Response(response) => (**response).clone(),
            ApiError::Internal(detail) => {
                tracing::error!("internal error: {detail}");
                ErrorResponse::internal("The server had an error while processing your request.")
            }
        }
    }
}

impl From<ErrorResponse> for ApiError {
    fn from(response: ErrorResponse) -> ApiError {
        ApiError::Response(Box::new(response))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.to_error_response())
    }
}

/// Serializes an OpenAI error body with its status.
pub fn error_response(body: ErrorResponse) -> Response {
    let status = StatusCode::from_u16(body.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // Overloaded or draining: tell well-behaved clients (and the openai client's retry
        // loop) when to come back.
        return (
            status,
            [(header::RETRY_AFTER, RETRY_AFTER_SECONDS)],
            Json(body),
        )
            .into_response();
    }
    (status, Json(body)).into_response()
}

/// `Retry-After` of a 503.
const RETRY_AFTER_SECONDS: &str = "1";

/// Anthropic's `request-id` response header.
pub(crate) const REQUEST_ID: &str = "request-id";

/// A failed request of the Anthropic routes: the same errors, in Anthropic's shape
/// (`{"type": "error", "error": {"type", "message"}}`) and status codes.
#[derive(Debug)]
pub(crate) struct AnthropicApiError(pub ApiError);

impl<E: Into<ApiError>> From<E> for AnthropicApiError {
    fn from(error: E) -> Self {
        AnthropicApiError(error.into())
    }
}

impl IntoResponse for AnthropicApiError {
    fn into_response(self) -> Response {
        anthropic_error_response(self.0.to_error_response())
    }
}

/// An error in Anthropic's shape with its status (a 503 is Anthropic's 529, which its SDKs
/// retry), `Retry-After` when overloaded, and a `request-id`.
pub(crate) fn anthropic_error_response(body: ErrorResponse) -> Response {
    let (status, body) = AnthropicError::from_openai(&body);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(body)).into_response();
    let headers = response.headers_mut();
    if status.as_u16() == tokenmill_protocol::OVERLOADED_STATUS {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    if let Ok(id) = HeaderValue::from_str(&anthropic_request_id()) {
        headers.insert(REQUEST_ID, id);
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use serde_json::Value;

    use super::*;

    async fn status_and_body(error: ApiError) -> (StatusCode, Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn protocol_errors_are_400_with_their_param() {
        let (status, body) =
            status_and_body(ApiError::invalid_param("top_p", "top_p must be in (0, 1]")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["param"], "top_p");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["message"], "top_p must be in (0, 1]");
    }

    #[tokio::test]
    async fn response_errors_keep_their_status() {
        for (error, expected) in [
            (ApiError::invalid("bad"), StatusCode::BAD_REQUEST),
            (
                ApiError::unavailable("draining"),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                ApiError::from(ErrorResponse::model_not_found("x")),
                StatusCode::NOT_FOUND,
            ),
            (
                ApiError::from(ErrorResponse::request_too_large(10)),
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                ApiError::from(ErrorResponse::authentication("no key")),
                StatusCode::UNAUTHORIZED,
            ),
        ] {
            let (status, body) = status_and_body(error).await;
            assert_eq!(status, expected);
            assert_eq!(body["error"]["code"], expected.as_u16());
        }
    }

    #[tokio::test]
    async fn anthropic_errors_have_its_shape_status_and_request_id() {
        let response = AnthropicApiError(ApiError::unavailable("busy")).into_response();
        assert_eq!(response.status().as_u16(), 529);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let id = response.headers()[REQUEST_ID].to_str().unwrap().to_string();
        assert!(id.starts_with("req_"), "{id}");
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        );
        let response =
            AnthropicApiError::from(ProtocolError::invalid("x", "bad x")).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn internal_errors_hide_their_details() {
        let (status, body) =
            status_and_body(ApiError::Internal("secret stack detail".into())).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.contains("secret"), "{message}");
    }

    #[tokio::test]
    async fn an_error_body_without_a_code_is_a_500() {
        let mut response = ErrorResponse::invalid_request("x");
        response.error.code = None;
        let (status, _) = status_and_body(ApiError::from(response)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
