//! The core's types as the wire crate (nsq-wire) sees them: the one place where broker
//! options become IDENTIFY limits and command limits, and core errors become `E_*` texts.

use crate::channel::InFlightError;
use crate::options::Options;
use nsq_wire::errors::InFlightFailure;
use nsq_wire::identify::IdentifyLimits;
use nsq_wire::v2::Limits;

/// The flags IDENTIFY is checked against, so the wire crate's IDENTIFY functions take
/// `&Options` directly.
impl From<&Options> for IdentifyLimits {
    fn from(o: &Options) -> Self {
        o.identify
    }
}

/// The flags commands are checked against as they are decoded (TCP protocol V2 and
/// HTTP `/mpub` bodies).
impl From<&Options> for Limits {
    fn from(o: &Options) -> Self {
        Limits {
            max_msg_size: o.max_msg_size,
            max_body_size: o.max_body_size,
            max_rdy_count: o.identify.max_rdy_count,
            max_req_timeout_ms: i64::try_from(o.max_req_timeout.as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// The core's in-flight errors as the wire crate words them (`E_FIN_FAILED ...`).
impl From<InFlightError> for InFlightFailure {
    fn from(e: InFlightError) -> Self {
        match e {
            InFlightError::NotInFlight => Self::NotInFlight,
            InFlightError::NotOwner => Self::NotOwner,
        }
    }
}
