//! IDENTIFY: the JSON body, its validation and the feature-negotiation reply
//! (nsqd: nsqd/protocol_v2.go IDENTIFY, nsqd/client_v2.go Identify / Set*).
//!
//! The broker's flags reach this module as a plain [`IdentifyLimits`] (the broker fills
//! it from its options), so the codec knows nothing of the broker.

use crate::errors::E_BAD_BODY;
use crate::gojson;
use crate::v2::ProtocolError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The nsqd flags IDENTIFY is checked against and answers with (nsqd: nsqd/options.go).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdentifyLimits {
    /// `--msg-timeout`: the default msg_timeout.
    pub msg_timeout: Duration,
    /// `--max-msg-timeout`: the longest msg_timeout a client may ask for.
    pub max_msg_timeout: Duration,
    /// `--max-rdy-count`, reported in the negotiation reply.
    pub max_rdy_count: i64,
    /// `--max-heartbeat-interval`: the longest heartbeat_interval.
    pub max_heartbeat_interval: Duration,
    /// `--output-buffer-timeout`: the default output_buffer_timeout.
    pub output_buffer_timeout: Duration,
    /// `--min-output-buffer-timeout`.
    pub min_output_buffer_timeout: Duration,
    /// `--max-output-buffer-timeout`.
    pub max_output_buffer_timeout: Duration,
    /// `--max-output-buffer-size`, bytes.
    pub max_output_buffer_size: i64,
    /// Client timeout; the default heartbeat interval is half of it.
    pub client_timeout: Duration,
    /// `--max-deflate-level` (1-9).
    pub max_deflate_level: i64,
    /// `--snappy`: snappy may be negotiated.
    pub snappy: bool,
    /// `--deflate`: deflate may be negotiated.
    pub deflate: bool,
}

/// Settings a client negotiates with IDENTIFY, plus its identity strings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientSettings {
    /// IDENTIFY client_id (default: the peer's IP).
    pub client_id: String,
    /// IDENTIFY hostname (default: the peer's IP).
    pub hostname: String,
    /// IDENTIFY user_agent.
    pub user_agent: String,
    /// None when heartbeats are disabled (heartbeat_interval -1).
    pub heartbeat_interval: Option<Duration>,
    /// Bytes buffered before a forced flush (1 = unbuffered).
    pub output_buffer_size: usize,
    /// Longest a message waits in the buffer; zero = flush at the end of each delivery round.
    pub output_buffer_timeout: Duration,
    /// 0 = off, else percent of messages delivered (nsqd: rand(100) <= rate).
    pub sample_rate: u32,
    /// How long a delivered message may stay in flight.
    pub msg_timeout: Duration,
    /// True once any IDENTIFY was accepted.
    pub identified: bool,
    /// What nsqd's messagePump took from the first IDENTIFY (it takes no later one):
    /// the heartbeats and output-buffer timer it runs, the sample rate and msg_timeout
    /// of each delivery. The fields above follow every IDENTIFY (the reply, TOUCH, the
    /// read deadline).
    pub pump: PumpSettings,
    /// IDENTIFY's topology fields and the rank the broker gave them.
    #[serde(default)]
    pub topology: ClientTopology,
}

/// The settings nsqd's messagePump runs with ([`ClientSettings::pump`]).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct PumpSettings {
    /// None when heartbeats are disabled.
    pub heartbeat_interval: Option<Duration>,
    /// Zero: no output-buffer timer.
    pub output_buffer_timeout: Duration,
    /// 0 = off, else percent of messages delivered.
    pub sample_rate: u32,
    /// How long a delivered message may stay in flight.
    pub msg_timeout: Duration,
}

impl ClientSettings {
    /// These settings, with the pump running on them (as after a first IDENTIFY).
    pub fn with_current_pump(mut self) -> ClientSettings {
        self.pump = PumpSettings::of(&self);
        self
    }
}

impl PumpSettings {
    /// The pump settings `s` holds now.
    pub fn of(s: &ClientSettings) -> PumpSettings {
        PumpSettings {
            heartbeat_interval: s.heartbeat_interval,
            output_buffer_timeout: s.output_buffer_timeout,
            sample_rate: s.sample_rate,
            msg_timeout: s.msg_timeout,
        }
    }
}

/// The fields nsqd reads from an IDENTIFY body ([`decode_identify`]), one field per key (a
/// flat wire shape on purpose). Unknown keys
/// (`short_id`, `long_id`, ...) are ignored; a value of the wrong JSON type fails the
/// whole decode, as in Go.
#[derive(Debug, Default)]
pub struct IdentifyRequest {
    /// Client identifier (default: the peer's IP).
    pub client_id: Option<String>,
    /// Client hostname (default: the peer's IP).
    pub hostname: Option<String>,
    /// Client library and version, e.g. `go-nsq/1.1.0`.
    pub user_agent: Option<String>,
    /// ms; -1 disables heartbeats, 0 = half the client timeout.
    pub heartbeat_interval: Option<i64>,
    /// Bytes; -1 disables output buffering, 0 = 16 KiB.
    pub output_buffer_size: Option<i64>,
    /// ms; -1 disables the timeout, 0 = --output-buffer-timeout.
    pub output_buffer_timeout: Option<i64>,
    /// Answer with the JSON [`IdentifyResponse`] instead of `OK`.
    pub feature_negotiation: Option<bool>,
    /// Upgrade the connection to TLS after the reply.
    pub tls_v1: Option<bool>,
    /// Switch to snappy framing after the reply.
    pub snappy: Option<bool>,
    /// Switch to raw DEFLATE after the reply.
    pub deflate: Option<bool>,
    /// DEFLATE level 1-9 (capped by --max-deflate-level).
    pub deflate_level: Option<i64>,
    /// Percent of messages to deliver, 0-99 (0 = all).
    pub sample_rate: Option<i64>,
    /// ms a delivered message may stay in flight; 0 = --msg-timeout.
    pub msg_timeout: Option<i64>,
    /// nsqd master's `topology_region` and `topology_zone`.
    pub topology: ClientTopology,
}

/// Where a client says it is (nsqd master's IDENTIFY `topology_region` and
/// `topology_zone`, "" when not sent), and the delivery rank the broker gave it for that
/// (topology-aware consumption: lower ranks are served first; 0 for every client when
/// the broker does not rank them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientTopology {
    /// IDENTIFY `topology_region`.
    pub region: String,
    /// IDENTIFY `topology_zone`.
    pub zone: String,
    /// Set by the broker after IDENTIFY; 0 = unranked.
    pub rank: u8,
}

/// The feature-negotiation reply, keys in nsqd 1.3.0's order, one field per key (a flat
/// wire shape on purpose). Durations in ms.
#[derive(Debug, Serialize)]
pub struct IdentifyResponse<'a> {
    /// --max-rdy-count.
    pub max_rdy_count: i64,
    /// The broker's version ([`VERSION`]).
    pub version: &'static str,
    /// --max-msg-timeout, ms.
    pub max_msg_timeout: i64,
    /// The connection's msg_timeout, ms.
    pub msg_timeout: i64,
    /// TLS granted.
    pub tls_v1: bool,
    /// DEFLATE granted.
    pub deflate: bool,
    /// The DEFLATE level in use.
    pub deflate_level: i64,
    /// --max-deflate-level.
    pub max_deflate_level: i64,
    /// Snappy granted.
    pub snappy: bool,
    /// The connection's sample rate, percent.
    pub sample_rate: i64,
    /// AUTH must come before SUB/PUB (an auth server is configured).
    pub auth_required: bool,
    /// The connection's output buffer, bytes.
    pub output_buffer_size: i64,
    /// The connection's output buffer timeout, ms.
    pub output_buffer_timeout: i64,
    /// nsqd master: the broker's `--topology-region`; shown only when the broker has a
    /// region or zone (so a broker without either answers exactly as nsqd 1.3.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_region: Option<&'a str>,
    /// nsqd master: the broker's `--topology-zone` (shown as `topology_region` is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_zone: Option<&'a str>,
}

/// The version this broker reports everywhere (nsqjs needs >= 0.3.0 for RDY semantics).
pub const VERSION: &str = "1.3.0";

fn bad(text: String) -> ProtocolError {
    ProtocolError::new(E_BAD_BODY, format!("IDENTIFY {text}"))
}

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// What an accepted IDENTIFY asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// `feature_negotiation`: answer with the JSON reply instead of `OK`.
    pub negotiate: bool,
    /// `tls_v1` asked for (granted only by a broker with a certificate; in the reply,
    /// as granted).
    pub tls_v1: bool,
    /// Switch the connection to the snappy framing format after the reply.
    pub snappy: bool,
    /// Deflate asked for and allowed by `--deflate`.
    pub deflate: bool,
    /// nsqd's deflateLevel: the client's level if > 0 (and deflate is on), else 6, capped
    /// by `--max-deflate-level`.
    pub deflate_level: i64,
}

/// Decodes an IDENTIFY body as Go's json.Unmarshal into nsqd's identifyDataV2
/// ([`crate::gojson`]): `null` leaves every field unset, another non-object is an
/// error; keys match case-insensitively and the last of repeated keys wins; a `null`
/// value leaves its field; a value of the wrong type (or an integer out of the field's
/// range: `sample_rate` is an int32) fails the decode. The error is Go's text.
pub fn decode_identify(body: &[u8]) -> Result<IdentifyRequest, gojson::DecodeError> {
    use crate::gojson::{bool_field, field_for, int_field, string_field};
    // identifyDataV2's JSON fields in declaration order.
    const FIELDS: [&str; 15] = [
        "client_id",
        "hostname",
        "heartbeat_interval",
        "output_buffer_size",
        "output_buffer_timeout",
        "feature_negotiation",
        "tls_v1",
        "deflate",
        "deflate_level",
        "snappy",
        "sample_rate",
        "user_agent",
        "msg_timeout",
        // nsqd master.
        "topology_region",
        "topology_zone",
    ];
    let members = gojson::object_members(body)?.unwrap_or_default();
    let mut r = IdentifyRequest::default();
    let mut first_err = None;
    for (key, v) in &members {
        let Some(field) = field_for(&FIELDS, key) else {
            continue;
        };
        let set_str =
            |slot: &mut Option<String>| string_field(field, v).map(|s| *slot = s.or(slot.take()));
        let set_int =
            |slot: &mut Option<i64>, bits| int_field(field, v, bits).map(|n| *slot = n.or(*slot));
        let set_bool = |slot: &mut Option<bool>| bool_field(field, v).map(|b| *slot = b.or(*slot));
        let res = match field {
            "client_id" => set_str(&mut r.client_id),
            "hostname" => set_str(&mut r.hostname),
            "user_agent" => set_str(&mut r.user_agent),
            "heartbeat_interval" => set_int(&mut r.heartbeat_interval, 64),
            "output_buffer_size" => set_int(&mut r.output_buffer_size, 64),
            "output_buffer_timeout" => set_int(&mut r.output_buffer_timeout, 64),
            "deflate_level" => set_int(&mut r.deflate_level, 64),
            "sample_rate" => set_int(&mut r.sample_rate, 32),
            "msg_timeout" => set_int(&mut r.msg_timeout, 64),
            "topology_region" => string_field(field, v).map(|s| {
                if let Some(s) = s {
                    r.topology.region = s;
                }
            }),
            "topology_zone" => string_field(field, v).map(|s| {
                if let Some(s) = s {
                    r.topology.zone = s;
                }
            }),
            "feature_negotiation" => set_bool(&mut r.feature_negotiation),
            "tls_v1" => set_bool(&mut r.tls_v1),
            "snappy" => set_bool(&mut r.snappy),
            _ => set_bool(&mut r.deflate),
        };
        if let Err(e) = res {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(r),
    }
}

/// Default settings of a connection before IDENTIFY (nsqd newClientV2): client_id and
/// hostname are the peer's IP.
pub fn default_settings(peer_ip: &str, opts: impl Into<IdentifyLimits>) -> ClientSettings {
    let opts = opts.into();
    let mut s = ClientSettings {
        client_id: peer_ip.to_string(),
        hostname: peer_ip.to_string(),
        user_agent: String::new(),
        heartbeat_interval: Some(opts.client_timeout / 2),
        output_buffer_size: 16 * 1024,
        output_buffer_timeout: opts.output_buffer_timeout,
        sample_rate: 0,
        msg_timeout: opts.msg_timeout,
        identified: false,
        pump: PumpSettings::default(),
        topology: ClientTopology::default(),
    };
    s.pump = PumpSettings::of(&s);
    s
}

/// Decodes and validates an IDENTIFY body against `opts` (the broker's limits), applying it to `settings`.
/// Returns what was negotiated. Errors are nsqd's fatal
/// `E_BAD_BODY IDENTIFY ...` texts, checked in nsqd's order: heartbeat, output buffer
/// timeout, output buffer size, sample rate, msg timeout.
pub fn apply_identify(
    body: &[u8],
    settings: &mut ClientSettings,
    opts: impl Into<IdentifyLimits>,
) -> Result<Negotiated, ProtocolError> {
    let opts = opts.into();
    let req = decode_identify(body).map_err(|_| bad("failed to decode JSON body".into()))?;
    let mut s = settings.clone();
    s.client_id = req.client_id.unwrap_or_default();
    s.hostname = req.hostname.unwrap_or_default();
    s.user_agent = req.user_agent.unwrap_or_default();
    // nsqd master: every IDENTIFY sets them (the rank is the broker's, kept).
    s.topology.region = req.topology.region;
    s.topology.zone = req.topology.zone;

    let hb = req.heartbeat_interval.unwrap_or(0);
    s.heartbeat_interval = match hb {
        -1 => None,
        // 0 keeps the current value (nsqd's "do nothing (use default)": a second
        // IDENTIFY leaves what the first one set).
        0 => s.heartbeat_interval,
        n if n >= 1000 && n <= ms(opts.max_heartbeat_interval) => {
            Some(Duration::from_millis(n as u64))
        }
        n => return Err(bad(format!("heartbeat interval ({n}) is invalid"))),
    };

    let obt = req.output_buffer_timeout.unwrap_or(0);
    s.output_buffer_timeout = match obt {
        -1 => Duration::ZERO,
        0 => s.output_buffer_timeout,
        n if n >= ms(opts.min_output_buffer_timeout) && n <= ms(opts.max_output_buffer_timeout) => {
            Duration::from_millis(n as u64)
        }
        n => return Err(bad(format!("output buffer timeout ({n}) is invalid"))),
    };
    let obs = req.output_buffer_size.unwrap_or(0);
    s.output_buffer_size = match obs {
        -1 => {
            s.output_buffer_timeout = Duration::ZERO;
            1
        }
        0 => s.output_buffer_size,
        n if n >= 64 && n <= opts.max_output_buffer_size => n as usize,
        n => return Err(bad(format!("output buffer size ({n}) is invalid"))),
    };

    let sr = req.sample_rate.unwrap_or(0);
    if !(0..=99).contains(&sr) {
        return Err(bad(format!("sample rate ({sr}) is invalid")));
    }
    s.sample_rate = sr as u32;

    let mt = req.msg_timeout.unwrap_or(0);
    s.msg_timeout = match mt {
        0 => s.msg_timeout,
        n if n >= 1000 && n <= ms(opts.max_msg_timeout) => Duration::from_millis(n as u64),
        n => return Err(bad(format!("msg timeout ({n}) is invalid"))),
    };
    if !s.identified {
        s.pump = PumpSettings::of(&s);
    }
    s.identified = true;
    *settings = s;
    let negotiate = req.feature_negotiation.unwrap_or(false);
    // Compression is only switched on by a negotiating IDENTIFY (nsqd).
    let deflate = negotiate && opts.deflate && req.deflate.unwrap_or(false);
    let mut deflate_level = 6;
    if deflate && req.deflate_level.unwrap_or(0) > 0 {
        deflate_level = req.deflate_level.unwrap_or(6);
    }
    Ok(Negotiated {
        negotiate,
        tls_v1: negotiate && req.tls_v1.unwrap_or(false),
        snappy: negotiate && opts.snappy && req.snappy.unwrap_or(false),
        deflate,
        deflate_level: deflate_level.min(opts.max_deflate_level),
    })
}

/// The JSON reply to a negotiating IDENTIFY: `tls_v1`, `snappy` and `deflate` as granted;
/// `auth_required` when an auth server is configured
/// (nsqd: IsAuthEnabled).
pub fn identify_response(
    settings: &ClientSettings,
    opts: impl Into<IdentifyLimits>,
    n: &Negotiated,
    auth_required: bool,
) -> Vec<u8> {
    identify_response_at(settings, opts, n, auth_required, ("", ""))
}

/// [`identify_response`] of a broker at `(region, zone)` (`--topology-region`,
/// `--topology-zone`): when either is set the reply ends with nsqd master's
/// `topology_region` and `topology_zone`.
pub fn identify_response_at(
    settings: &ClientSettings,
    opts: impl Into<IdentifyLimits>,
    n: &Negotiated,
    auth_required: bool,
    (region, zone): (&str, &str),
) -> Vec<u8> {
    let opts = opts.into();
    let placed = !region.is_empty() || !zone.is_empty();
    let r = IdentifyResponse {
        max_rdy_count: opts.max_rdy_count,
        version: VERSION,
        max_msg_timeout: ms(opts.max_msg_timeout),
        msg_timeout: ms(settings.msg_timeout),
        tls_v1: n.tls_v1,
        deflate: n.deflate,
        deflate_level: n.deflate_level,
        max_deflate_level: opts.max_deflate_level,
        snappy: n.snappy,
        sample_rate: settings.sample_rate as i64,
        auth_required,
        output_buffer_size: settings.output_buffer_size as i64,
        output_buffer_timeout: ms(settings.output_buffer_timeout),
        topology_region: placed.then_some(region),
        topology_zone: placed.then_some(zone),
    };
    crate::json::to_vec_go(&r)
}
