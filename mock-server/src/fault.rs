//! Fault specs: what a test asks the server to do wrong ([`Fault`], its
//! [`FaultKind`] and [`Operation`] scope), as built in Rust or parsed from
//! the JSON of `POST /__mock/faults`, and the check that one can take
//! effect ([`InvalidFault`]). Storing and matching them is `fault_store`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A lock operation, for scoping faults and reading the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Operation {
    /// `POST /locks/{key}/lease`
    Acquire,
    /// `PATCH /locks/{key}/lease`
    Renew,
    /// `DELETE /locks/{key}/lease`
    Release,
    /// `GET /locks/{key}`
    Get,
    /// `DELETE /locks/{key}`
    ForceRelease,
    /// Every operation (faults only).
    Any,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FaultKind {
    /// Answer with this status and the documented error body, without
    /// applying the request.
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// Apply the request, then close the connection without answering.
    DropResponse,
    /// Close the connection before applying the request.
    Reset,
    /// Wait this long, then handle the request normally.
    Delay {
        /// Milliseconds to wait (`ms` is accepted too, as for
        /// `delay_response`).
        #[serde(alias = "ms")]
        delay_ms: u64,
    },
    /// Apply the request at once, then hold the answer this long.
    DelayResponse {
        /// Milliseconds to hold the answer.
        ms: u64,
    },
    /// Apply the request, then answer with its status and a body that is
    /// not JSON (a proxy's page). A `204` has no body to garble.
    GarbledResponse,
    /// A gateway in front of the service: it answers `status` (a 5xx, its
    /// own HTML page, not the service's error envelope) after
    /// `patience_ms`, while the request goes on and is applied
    /// `apply_after_ms` after it arrived, whether or not its client is
    /// still there (either may come first).
    Gateway {
        /// The gateway's answer (500..=599: 502, 503 or 504 typically).
        status: u16,
        /// Milliseconds until the gateway answers.
        patience_ms: u64,
        /// Milliseconds until the service applies the request.
        apply_after_ms: u64,
    },
}

/// A fault to inject with `MockServer::inject`.
///
/// ```
/// use std::time::Duration;
/// # use volcano_mock_server::{Fault, Operation};
/// let fault = Fault::status(503).on(Operation::Renew).times(2);
/// let slow = Fault::delay(Duration::from_millis(1500)).on(Operation::Any);
/// // Applied at once, answered two seconds later: a client that gives up
/// // first does not know it holds the lock.
/// let late = Fault::delay_response(Duration::from_secs(2))
///     .on(Operation::Acquire)
///     .times(1);
/// # let _ = (fault, slow, late);
/// ```
///
/// Read from JSON (as `POST /__mock/faults` does), a member it does not
/// know is refused by name: a misspelt `"time": 1` must not become a fault
/// that fails every request for ever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Fault {
    /// What happens.
    #[serde(flatten)]
    pub kind: FaultKind,
    /// Which operation it applies to (default: any).
    pub operation: Operation,
    /// Only requests for this key (default: every key).
    pub key: Option<String>,
    /// How many matching requests it affects (default: all, until reset).
    pub times: Option<u32>,
    /// Affect only every n-th matching request (default: each one).
    pub every: Option<u32>,
    /// Matching requests seen so far (for `every`; counted by the fault
    /// store).
    #[serde(skip)]
    pub(crate) seen: u32,
}

fn any() -> Operation {
    Operation::Any
}

/// A fault as JSON writes it, read without checking its members (serde
/// cannot refuse unknown members beside a flattened enum).
#[derive(Deserialize)]
struct Members {
    #[serde(flatten)]
    kind: FaultKind,
    #[serde(default = "any")]
    operation: Operation,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    times: Option<u32>,
    #[serde(default)]
    every: Option<u32>,
}

/// The members every fault may have, beside those of its kind.
const COMMON_MEMBERS: [&str; 5] = ["kind", "operation", "key", "times", "every"];

/// The members of the kind named `kind`.
fn kind_members(kind: Option<&str>) -> &'static [&'static str] {
    match kind {
        Some("status") => &["status"],
        Some("delay") => &["delay_ms", "ms"],
        Some("delay_response") => &["ms"],
        Some("gateway") => &["status", "patience_ms", "apply_after_ms"],
        _ => &[],
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let object = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let kind = kind_members(object.get("kind").and_then(serde_json::Value::as_str));
        if let Some(unknown) = object
            .keys()
            .find(|name| !COMMON_MEMBERS.contains(&name.as_str()) && !kind.contains(&name.as_str()))
        {
            let known: Vec<&str> = COMMON_MEMBERS.iter().chain(kind).copied().collect();
            return Err(D::Error::custom(format!(
                "unknown member {unknown:?}; a fault of this kind has {}",
                known.join(", ")
            )));
        }
        let members =
            Members::deserialize(serde_json::Value::Object(object)).map_err(D::Error::custom)?;
        Ok(Fault {
            kind: members.kind,
            operation: members.operation,
            key: members.key,
            times: members.times,
            every: members.every.map(|n| n.max(1)),
            seen: 0,
        })
    }
}

/// Whole milliseconds of `duration`, saturating (as faults and the journal
/// count them).
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Fault {
    fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            operation: Operation::Any,
            key: None,
            times: None,
            every: None,
            seen: 0,
        }
    }

    /// Answer with `status` (e.g. 503, 429, 500) without applying the request.
    pub fn status(status: u16) -> Self {
        Self::new(FaultKind::Status { status })
    }

    /// Apply the request, then close the connection without an answer: the
    /// client cannot know that it succeeded.
    pub fn drop_response() -> Self {
        Self::new(FaultKind::DropResponse)
    }

    /// Close the connection before applying the request.
    pub fn reset() -> Self {
        Self::new(FaultKind::Reset)
    }

    /// Hold the request for `delay`, then handle it normally (the state
    /// change happens after the delay, as on a slow network: also when the
    /// client has given up and closed the connection meanwhile).
    pub fn delay(delay: Duration) -> Self {
        Self::new(FaultKind::Delay {
            delay_ms: millis(delay),
        })
    }

    /// Apply the request at once (the state change and the journal entry
    /// happen before the wait), then hold the answer for `delay`. With a
    /// status fault it is that answer that waits; with `drop_response` or
    /// `reset` the connection closes after the wait.
    pub fn delay_response(delay: Duration) -> Self {
        Self::new(FaultKind::DelayResponse { ms: millis(delay) })
    }

    /// Apply the request, then answer with its status and an HTML page
    /// for a body, as a proxy in the way might: the client learns the
    /// outcome's status but cannot read it. A `204` (a release) is sent
    /// as it is.
    pub fn garbled_response() -> Self {
        Self::new(FaultKind::GarbledResponse)
    }

    /// Play a gateway that gives up on the service: the client gets
    /// `status` (a 5xx: 502, 503 or 504) with the gateway's own HTML page
    /// after `patience`, while the request goes on and is applied
    /// `applied_after` after it arrived (journaled then, with the status
    /// the service answered, which nobody receives), whether or not its
    /// client is still there. With `applied_after` under `patience` it is
    /// applied first and the gateway still answers `status`. An acquire
    /// answered 504 can so take the key after its client has undone it.
    ///
    /// ```
    /// use std::time::Duration;
    /// # use volcano_mock_server::{Fault, Operation};
    /// // 504 after 400 ms; the acquire takes the key 1.5 s after it arrived.
    /// let fault = Fault::gateway(504, Duration::from_millis(400), Duration::from_millis(1500))
    ///     .on(Operation::Acquire)
    ///     .times(1);
    /// # let _ = fault;
    /// ```
    pub fn gateway(status: u16, patience: Duration, applied_after: Duration) -> Self {
        Self::new(FaultKind::Gateway {
            status,
            patience_ms: millis(patience),
            apply_after_ms: millis(applied_after),
        })
    }

    /// Limit the fault to one operation.
    pub fn on(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// Limit the fault to one key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Affect only the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Affect only every `n`-th matching request: `every(20)` is 5 %.
    pub fn every(mut self, n: u32) -> Self {
        self.every = Some(n.max(1));
        self
    }
}

/// Most faults pending at once; past it an inject is refused. A fault
/// without `times` stays until reset, so a test (or a fuzzer) posting them
/// in a loop would otherwise grow the server without bound.
pub const MAX_FAULTS: usize = 1024;

/// Why a fault was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidFault {
    /// A status fault's status is not a final HTTP status.
    Status(u16),
    /// A gateway fault's status is not a server error (5xx).
    GatewayStatus(u16),
    /// The fault's key is not a lock key, so no lock request could match it.
    Key(String),
    /// [`MAX_FAULTS`] faults are pending.
    TooMany,
    /// `times` is 0: the fault would never apply, yet hold a slot.
    NeverApplies,
}

impl std::fmt::Display for InvalidFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidFault::Status(status) => write!(
                f,
                "fault status {status} is not a final HTTP status: use 200..=599"
            ),
            InvalidFault::GatewayStatus(status) => write!(
                f,
                "gateway status {status} is not a server error: a gateway answers 500..=599 \
                 (502, 503 or 504)"
            ),
            InvalidFault::Key(key) => write!(
                f,
                "fault key {key:?} can never match: lock keys match \
                 ^[A-Za-z0-9][A-Za-z0-9._:-]{{0,127}}$"
            ),
            InvalidFault::NeverApplies => write!(
                f,
                "a fault with times 0 never applies: give times 1 or more, or leave it out \
                 for a fault that stays until cleared"
            ),
            InvalidFault::TooMany => write!(
                f,
                "{MAX_FAULTS} faults are pending; clear them (DELETE /__mock/faults or \
                 POST /__mock/reset) before injecting more"
            ),
        }
    }
}

impl std::error::Error for InvalidFault {}

impl Fault {
    /// Checks that the fault can take effect as asked.
    pub fn validate(&self) -> Result<(), InvalidFault> {
        match self.kind {
            FaultKind::Status { status } if !(200..=599).contains(&status) => {
                return Err(InvalidFault::Status(status));
            }
            FaultKind::Gateway { status, .. } if !(500..=599).contains(&status) => {
                return Err(InvalidFault::GatewayStatus(status));
            }
            _ => {}
        }
        if self.times == Some(0) {
            return Err(InvalidFault::NeverApplies);
        }
        match &self.key {
            Some(key) if !crate::state::valid_key(key) => {
                let mut shown: String = key.chars().take(140).collect();
                if shown.len() < key.len() {
                    shown.push_str("...");
                }
                Err(InvalidFault::Key(shown))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_json_shape() {
        let json =
            serde_json::to_value(Fault::status(503).on(Operation::Acquire).times(1)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "status", "status": 503, "operation": "acquire", "key": null, "times": 1, "every": null})
        );
        let parsed: Fault = serde_json::from_str(r#"{"kind":"delay","delay_ms":1500}"#).unwrap();
        assert_eq!(parsed, Fault::delay(Duration::from_millis(1500)));
        let parsed: Fault = serde_json::from_str(r#"{"kind":"delay","ms":1500}"#).unwrap();
        assert_eq!(parsed, Fault::delay(Duration::from_millis(1500)));
        let parsed: Fault = serde_json::from_str(
            r#"{"kind":"delay_response","ms":250,"operation":"acquire","times":1}"#,
        )
        .unwrap();
        assert_eq!(
            parsed,
            Fault::delay_response(Duration::from_millis(250))
                .on(Operation::Acquire)
                .times(1)
        );
        assert_eq!(
            serde_json::to_value(FaultKind::DelayResponse { ms: 250 }).unwrap(),
            serde_json::json!({"kind": "delay_response", "ms": 250})
        );
        let parsed: Fault = serde_json::from_str(
            r#"{"kind":"gateway","status":504,"patience_ms":400,"apply_after_ms":1500,"operation":"acquire","times":1}"#,
        )
        .unwrap();
        assert_eq!(
            parsed,
            Fault::gateway(504, Duration::from_millis(400), Duration::from_millis(1500))
                .on(Operation::Acquire)
                .times(1)
        );
        let unknown = serde_json::from_str::<Fault>(
            r#"{"kind":"gateway","status":504,"patience_ms":400,"apply_after":1500}"#,
        )
        .unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown member \"apply_after\""),
            "{unknown}"
        );
    }

    #[test]
    fn a_gateway_answers_only_with_a_server_error() {
        let at = |status| Fault::gateway(status, Duration::ZERO, Duration::ZERO).validate();
        for status in [200, 204, 409, 429, 499, 600] {
            let refused = at(status).unwrap_err();
            assert_eq!(refused, InvalidFault::GatewayStatus(status));
            assert!(refused.to_string().contains("500..=599"), "{refused}");
        }
        for status in [500, 502, 503, 504, 599] {
            assert_eq!(at(status), Ok(()));
        }
    }
}
