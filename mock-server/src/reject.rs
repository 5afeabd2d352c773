//! [`Reject`], a refused request as the service answers it: the JSON error
//! envelope `{"error": ...}`, plus `code` and a header where the contract
//! has them. Every refusal of the server (routing, auth, validation, the
//! quota, conflicts, injected statuses, the controls) is one.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// A refused request: the JSON error envelope plus, where the contract has
/// one, a header.
pub(crate) struct Reject {
    status: StatusCode,
    message: Cow<'static, str>,
    code: Option<&'static str>,
    header: Option<(header::HeaderName, HeaderValue)>,
}

impl Reject {
    /// A refusal with this status and message, without `code` or header.
    pub(crate) fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Reject {
            status,
            message: message.into(),
            code: None,
            header: None,
        }
    }

    /// Adds the contract's error `code` to the body.
    pub(crate) fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Adds a header to the answer (`Allow`, `Retry-After`).
    pub(crate) fn header(mut self, name: header::HeaderName, value: HeaderValue) -> Self {
        self.header = Some((name, value));
        self
    }
}

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(code) = self.code {
            body["code"] = code.into();
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some((name, value)) = self.header {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

/// A 400 with this message.
pub(crate) fn bad_request(message: impl Into<Cow<'static, str>>) -> Reject {
    Reject::new(StatusCode::BAD_REQUEST, message)
}
