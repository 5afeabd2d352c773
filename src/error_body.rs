//! An error answer's body, read for the caller: the JSON envelope's
//! message and code when it is one, else a few words about what came
//! instead (a proxy's or a wrong URL's HTML page is named by its title, not
//! copied). The status is always kept.

use std::time::Duration;

use serde_json::Value;

use crate::error::ApiError;
use crate::ops::json_object;

/// Most characters of a JSON error body's message kept.
const MAX_ERROR_TEXT: usize = 512;
/// Most characters of a non-JSON error body quoted in the message: a proxy's
/// or a wrong URL's error page is named, not copied.
const MAX_EXCERPT: usize = 100;

/// Builds the API error from an error body: the JSON envelope's `error` and
/// `code` when it is one, else a few words about what came instead
/// ([`excerpt`]). The status is always kept.
pub(crate) fn api_error(
    status: u16,
    body: &[u8],
    request_id: &str,
    retry_after: Option<Duration>,
) -> ApiError {
    let (message, code, from_service) = match json_object(body) {
        Some(map) => {
            // The service's envelope, positively: its `error` string and a
            // code it defines (a gateway's JSON has neither, or others).
            let from_service = map.get("error").is_some_and(Value::is_string)
                && map
                    .get("code")
                    .and_then(Value::as_str)
                    .is_some_and(|code| crate::codes::ALL.contains(&code));
            let message = ["error", "message"]
                .iter()
                .find_map(|name| map.get(*name).and_then(Value::as_str))
                .map(|m| truncate(m, MAX_ERROR_TEXT))
                .unwrap_or_else(|| "the error body has no message".to_owned());
            let code = match map.get("code") {
                Some(Value::String(code)) => Some(truncate(code, MAX_ERROR_TEXT)),
                Some(Value::Number(code)) => Some(code.to_string()),
                _ => None,
            };
            (message, code, from_service)
        }
        None if body.iter().all(u8::is_ascii_whitespace) => {
            ("the error body is empty".to_owned(), None, false)
        }
        None => (excerpt(&String::from_utf8_lossy(body)), None, false),
    };
    ApiError {
        status: Some(status),
        code,
        message,
        request_id: Some(request_id.to_owned()),
        retry_after,
        after_uncertain: false,
        first_may_land_late: false,
        from_service,
    }
}

/// A non-JSON error body, in a few words: an HTML page by its title (or
/// its text), anything else by its start, whitespace collapsed.
fn excerpt(body: &str) -> String {
    const NOT: &str = "not a JSON error object";
    let html = body.trim_start().starts_with('<');
    if html {
        if let Some(title) = between(body, "<title>", "</title>").map(collapse) {
            if !title.is_empty() {
                return format!("{NOT}: an HTML page, \"{title}\"");
            }
        }
    }
    let text = collapse(&if html {
        strip_tags(body)
    } else {
        body.to_owned()
    });
    let kind = if html { "an HTML page" } else { "a body" };
    if text.is_empty() {
        format!("{NOT}: {kind} with no text")
    } else {
        format!("{NOT}: {kind} beginning \"{text}\"")
    }
}

/// `text` on one line, at most [`MAX_EXCERPT`] characters.
fn collapse(text: &str) -> String {
    truncate(
        &text.split_whitespace().collect::<Vec<_>>().join(" "),
        MAX_EXCERPT,
    )
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let lower = text.to_ascii_lowercase();
    let start = lower.find(open)? + open.len();
    let end = start + lower[start..].find(close)?;
    text.get(start..end)
}

fn strip_tags(html: &str) -> String {
    let mut text = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

fn truncate(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_json_error_body_keeps_status_and_an_excerpt() {
        let body = "x".repeat(2000);
        let api = api_error(502, body.as_bytes(), "rid", None);
        assert_eq!(api.status, Some(502));
        let quoted = format!("\"{}…\"", "x".repeat(MAX_EXCERPT));
        assert_eq!(
            api.message,
            format!("not a JSON error object: a body beginning {quoted}")
        );
        assert!(api.code.is_none());
    }

    #[test]
    fn an_html_page_is_named_by_its_title_or_its_text() {
        let named = |body: &str| api_error(404, body.as_bytes(), "rid", None).message;
        assert_eq!(
            named("<html><head><title> Not\n Found </title></head></html>"),
            "not a JSON error object: an HTML page, \"Not Found\""
        );
        // An empty title, or none: the page's text.
        assert_eq!(
            named("<html><title> </title><h1>Bad\ngateway</h1></html>"),
            "not a JSON error object: an HTML page beginning \"Bad gateway\""
        );
        // Tags only.
        assert_eq!(
            named("<html><body></body></html>"),
            "not a JSON error object: an HTML page with no text"
        );
        // Multi-byte text is cut on a character boundary.
        let long = format!("<p>{}</p>", "é".repeat(300));
        assert!(named(&long).ends_with("é…\""));
        // JSON that is not an object is not an error envelope.
        assert_eq!(
            named("[1, 2]"),
            "not a JSON error object: a body beginning \"[1, 2]\""
        );
    }

    #[test]
    fn only_the_services_own_envelope_says_it_handled_the_request() {
        let from_service = |body: &str| api_error(503, body.as_bytes(), "rid", None).from_service;
        assert!(from_service(
            r#"{"error":"Lock service unavailable","code":"lock_service_unavailable"}"#
        ));
        // Gateways send JSON too: Envoy's shape, a numeric code, a message
        // member, an unknown code, a code without the `error` string.
        assert!(!from_service(
            r#"{"code":504,"message":"upstream request timeout"}"#
        ));
        assert!(!from_service(
            r#"{"error":"upstream timeout","code":"504"}"#
        ));
        assert!(!from_service(r#"{"error":"Gateway Timeout"}"#));
        assert!(!from_service(
            r#"{"message":"x","code":"lock_service_unavailable"}"#
        ));
        assert!(!from_service(
            r#"{"error":7,"code":"lock_service_unavailable"}"#
        ));
        assert!(!from_service("<html><title>504</title></html>"));
        assert!(!from_service(""));
    }

    #[test]
    fn envelope_falls_back_to_message_member() {
        let api = api_error(400, br#"{"message":"bad ttl","code":7}"#, "rid", None);
        assert_eq!(api.message, "bad ttl");
        assert_eq!(api.code.as_deref(), Some("7"));
    }
}
