//! CORS from vLLM's flags (`--allowed-origins`, `--allowed-methods`, `--allowed-headers`,
//! `--allow-credentials`), whose defaults allow everything, as Starlette's middleware does in
//! vLLM.

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, Any, CorsLayer};

/// Checked CORS settings; `None` in a list means `"*"` (anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsConfig {
    origins: Option<Vec<HeaderValue>>,
    methods: Option<Vec<Method>>,
    headers: Option<Vec<HeaderName>>,
    allow_credentials: bool,
}

impl Default for CorsConfig {
    /// vLLM's defaults: any origin, method and header, no credentials.
    fn default() -> Self {
        CorsConfig {
            origins: None,
            methods: None,
            headers: None,
            allow_credentials: false,
        }
    }
}

impl CorsConfig {
    /// Parses the flags' lists; `"*"` anywhere in a list allows anything. Errors name the
    /// flag and the value.
    pub fn new(
        origins: &[String],
        methods: &[String],
        headers: &[String],
        allow_credentials: bool,
    ) -> Result<CorsConfig, String> {
        Ok(CorsConfig {
            origins: parse_list("--allowed-origins", origins, |v| {
                HeaderValue::from_str(v).map_err(|e| e.to_string())
            })?,
            methods: parse_list("--allowed-methods", methods, |v| {
                Method::from_bytes(v.to_ascii_uppercase().as_bytes()).map_err(|e| e.to_string())
            })?,
            headers: parse_list("--allowed-headers", headers, |v| {
                HeaderName::from_bytes(v.as_bytes()).map_err(|e| e.to_string())
            })?,
            allow_credentials,
        })
    }

    /// The layer. With credentials a wildcard cannot be sent (browsers refuse it), so `"*"`
    /// mirrors the request's origin, method and headers, as Starlette does.
    pub(crate) fn layer(&self) -> CorsLayer {
        let mirror = self.allow_credentials;
        let origin = match (&self.origins, mirror) {
            (Some(list), _) => AllowOrigin::list(list.clone()),
            (None, true) => AllowOrigin::mirror_request(),
            (None, false) => AllowOrigin::from(Any),
        };
        let methods = match (&self.methods, mirror) {
            (Some(list), _) => AllowMethods::list(list.clone()),
            (None, true) => AllowMethods::mirror_request(),
            (None, false) => AllowMethods::from(Any),
        };
        let headers = match (&self.headers, mirror) {
            (Some(list), _) => AllowHeaders::list(list.clone()),
            (None, true) => AllowHeaders::mirror_request(),
            (None, false) => AllowHeaders::from(Any),
        };
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(headers)
            .allow_credentials(self.allow_credentials)
    }
}

fn parse_list<T>(
    flag: &str,
    values: &[String],
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<Vec<T>>, String> {
    if values.iter().any(|value| value.trim() == "*") {
        return Ok(None);
    }
    values
        .iter()
        .map(|value| parse(value.trim()).map_err(|e| format!("{flag}: `{value}`: {e}")))
        .collect::<Result<Vec<T>, String>>()
        .map(Some)
}
