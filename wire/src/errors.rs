//! NSQ's error codes and the texts of the broker's (not the codec's) error frames, in one
//! place (nsqd: nsqd/protocol_v2.go, internal/protocol/errors.go). The codec's own errors
//! are [`crate::v2::ProtocolError`]s; the broker core's error types map onto
//! [`InFlightFailure`] here (nsq-shards implements `From` for its `InFlightError`).
//!
//! ```text
//! error frame data: "<code> <text>"      e.g. "E_FIN_FAILED FIN 0a1b... failed ID not in flight"
//! ```

/// A command that is not valid here (fatal).
pub const E_INVALID: &str = "E_INVALID";
/// A body that cannot be read or decoded (fatal).
pub const E_BAD_BODY: &str = "E_BAD_BODY";
/// An invalid topic name (fatal).
pub const E_BAD_TOPIC: &str = "E_BAD_TOPIC";
/// An invalid channel name (fatal).
pub const E_BAD_CHANNEL: &str = "E_BAD_CHANNEL";
/// A message over --max-msg-size or empty (fatal).
pub const E_BAD_MESSAGE: &str = "E_BAD_MESSAGE";
/// Not `  V2` (the connection closes).
pub const E_BAD_PROTOCOL: &str = "E_BAD_PROTOCOL";
/// PUB refused by the broker (fatal).
pub const E_PUB_FAILED: &str = "E_PUB_FAILED";
/// MPUB refused by the broker (fatal).
pub const E_MPUB_FAILED: &str = "E_MPUB_FAILED";
/// DPUB refused by the broker (fatal).
pub const E_DPUB_FAILED: &str = "E_DPUB_FAILED";
/// FIN of a message not in flight for this client (not fatal).
pub const E_FIN_FAILED: &str = "E_FIN_FAILED";
/// REQ of a message not in flight for this client (not fatal).
pub const E_REQ_FAILED: &str = "E_REQ_FAILED";
/// TOUCH of a message not in flight for this client (not fatal).
pub const E_TOUCH_FAILED: &str = "E_TOUCH_FAILED";
/// SUB refused (fatal).
pub const E_SUB_FAILED: &str = "E_SUB_FAILED";
/// IDENTIFY refused, e.g. a TLS or compression upgrade failed (fatal).
pub const E_IDENTIFY_FAILED: &str = "E_IDENTIFY_FAILED";
/// AUTH with no auth server configured (fatal).
pub const E_AUTH_DISABLED: &str = "E_AUTH_DISABLED";
/// The auth server refused the secret (fatal).
pub const E_AUTH_FAILED: &str = "E_AUTH_FAILED";
/// A command before AUTH on a broker that requires it (fatal).
pub const E_AUTH_FIRST: &str = "E_AUTH_FIRST";
/// The authorization does not cover this topic/channel (fatal).
pub const E_UNAUTHORIZED: &str = "E_UNAUTHORIZED";

/// The commands that act on an in-flight message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightOp {
    /// FIN: finish.
    Fin,
    /// REQ: requeue.
    Req,
    /// TOUCH: reset the timeout.
    Touch,
}

impl InFlightOp {
    /// The command name as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            InFlightOp::Fin => "FIN",
            InFlightOp::Req => "REQ",
            InFlightOp::Touch => "TOUCH",
        }
    }

    /// Its `E_*_FAILED` code.
    pub fn failed_code(self) -> &'static str {
        match self {
            InFlightOp::Fin => E_FIN_FAILED,
            InFlightOp::Req => E_REQ_FAILED,
            InFlightOp::Touch => E_TOUCH_FAILED,
        }
    }
}

/// Why FIN, REQ or TOUCH failed (nsqd: channel.go popInFlightMessage / TouchMessage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightFailure {
    /// `ID not in flight`.
    NotInFlight,
    /// `client does not own message`.
    NotOwner,
}

impl InFlightFailure {
    /// nsqd's wording.
    pub fn text(self) -> &'static str {
        match self {
            InFlightFailure::NotInFlight => "ID not in flight",
            InFlightFailure::NotOwner => "client does not own message",
        }
    }
}

/// The non-fatal error frame's data `E_FIN_FAILED FIN <id> failed <why>` (id as sent).
pub fn in_flight_failed(op: InFlightOp, id: &[u8], why: InFlightFailure) -> String {
    format!(
        "{} {} {} failed {}",
        op.failed_code(),
        op.name(),
        String::from_utf8_lossy(id),
        why.text()
    )
}

/// The publishing commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOp {
    /// PUB.
    Pub,
    /// MPUB.
    Mpub,
    /// DPUB.
    Dpub,
}

impl PublishOp {
    /// The command name as on the wire.
    pub fn name(self) -> &'static str {
        match self {
            PublishOp::Pub => "PUB",
            PublishOp::Mpub => "MPUB",
            PublishOp::Dpub => "DPUB",
        }
    }

    /// Its `E_*_FAILED` code.
    pub fn failed_code(self) -> &'static str {
        match self {
            PublishOp::Pub => E_PUB_FAILED,
            PublishOp::Mpub => E_MPUB_FAILED,
            PublishOp::Dpub => E_DPUB_FAILED,
        }
    }
}

/// The fatal error frame's data `E_PUB_FAILED PUB failed <reason>` (reason: e.g.
/// `exiting` or the disk error's text).
pub fn publish_failed(op: PublishOp, reason: &str) -> String {
    format!("{} {} failed {reason}", op.failed_code(), op.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_as_nsqd() {
        assert_eq!(
            in_flight_failed(
                InFlightOp::Fin,
                b"0123456789abcdef",
                InFlightFailure::NotInFlight
            ),
            "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
        );
        assert_eq!(
            in_flight_failed(InFlightOp::Touch, b"x", InFlightFailure::NotOwner),
            "E_TOUCH_FAILED TOUCH x failed client does not own message"
        );
        assert_eq!(
            publish_failed(PublishOp::Mpub, "exiting"),
            "E_MPUB_FAILED MPUB failed exiting"
        );
    }
}
