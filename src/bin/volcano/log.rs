//! The SDK's log lines, on standard error in the CLI's own format: in text,
//! `volcano: warning: lock at risk: ... (key=report, remaining_ms=4000)`;
//! with `--output json`, one object a line (`{"level":"warn","message":..,
//! "fields":{..}}`), so that standard error stays JSON lines too.
//!
//! The level is WARN by default (`locks run`: INFO unless `--quiet`, for
//! the line that names the holder at acquire); `VOLCANO_LOG`, else
//! `RUST_LOG`, replaces it (`VOLCANO_LOG=volcano=debug`, `RUST_LOG=error`). Lines are written with
//! `output::say`: a closed or broken standard error loses them and
//! changes nothing else.

use std::fmt::Debug;

use serde_json::{json, Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::args::Output;
use crate::output::say;

/// Routes the SDK's events at `default` or above to standard error, or
/// what `VOLCANO_LOG` says, else `RUST_LOG` (which `locks run`'s command
/// sees too: `VOLCANO_LOG` sets the CLI's level apart from it). One that
/// cannot be read is said, and the default used.
pub(crate) fn install(output: Output, default: &str) {
    let default = EnvFilter::new(default);
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let chosen = ["VOLCANO_LOG", "RUST_LOG"]
        .into_iter()
        .find_map(|name| set(name).map(|text| (name, text)));
    let filter = match chosen {
        Some((name, text)) => EnvFilter::try_new(&text).unwrap_or_else(|err| {
            crate::output::warn(format_args!(
                "{name}={text:?} ignored ({err}); logging at the default level"
            ));
            default
        }),
        None => default,
    };
    // Only fails if a subscriber is already set: nothing else sets one.
    let _ = tracing_subscriber::registry()
        .with(Lines { output }.with_filter(filter))
        .try_init();
}

/// The layer that writes each event as one line.
struct Lines {
    output: Output,
}

impl<S: Subscriber> Layer<S> for Lines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = *event.metadata().level();
        match self.output {
            Output::Text => say(text_line(level, &fields)),
            Output::Json => say(json!({
                "level": level.as_str().to_ascii_lowercase(),
                "message": fields.message,
                "fields": fields.pairs.iter().cloned().collect::<Map<String, Value>>(),
            })),
        };
    }
}

/// `volcano: warning: MESSAGE (name=value, ...)`, as the CLI's own lines.
fn text_line(level: Level, fields: &Fields) -> String {
    let level = match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    };
    let mut line = format!("volcano: {level}: {}", fields.message);
    if !fields.pairs.is_empty() {
        let pairs: Vec<String> = fields
            .pairs
            .iter()
            .map(|(name, value)| match value {
                Value::String(text) => format!("{name}={text}"),
                other => format!("{name}={other}"),
            })
            .collect();
        line.push_str(&format!(" ({})", pairs.join(", ")));
    }
    line
}

/// An event's message and its other fields, in the order logged.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
        } else {
            self.pairs.push((field.name().to_owned(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_reads_as_the_clis_own_lines() {
        let fields = Fields {
            message: "lock at risk".into(),
            pairs: vec![
                ("key".into(), "report".into()),
                ("remaining_ms".into(), 4000.into()),
            ],
        };
        assert_eq!(
            text_line(Level::WARN, &fields),
            "volcano: warning: lock at risk (key=report, remaining_ms=4000)"
        );
    }
}
