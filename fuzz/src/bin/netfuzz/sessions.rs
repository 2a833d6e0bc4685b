//! Valid sessions, before mutation: V2 (magic, IDENTIFY, SUB, RDY, PUB, MPUB, DPUB, FIN,
//! REQ, TOUCH, NOP, CLS, AUTH) and HTTP/1.1 keep-alive requests, chosen from a seed.

use nsq_fuzz::mutate::Rng;

// ------------------------------------------------------------------ sessions

/// A seed session: its parts (commands or requests), each with the offset of its 4-byte
/// size field if it has one.
pub(super) struct Session {
    pub(super) parts: Vec<(Vec<u8>, Option<usize>)>,
    pub(super) http: bool,
}

impl Session {
    pub(super) fn bytes(&self) -> Vec<u8> {
        self.parts
            .iter()
            .flat_map(|(b, _)| b.iter().copied())
            .collect()
    }
}

pub(super) fn pick<'a>(rng: &mut Rng, xs: &[&'a str]) -> &'a str {
    xs[rng.below(xs.len())]
}

fn topic(rng: &mut Rng) -> String {
    format!("fz.{}", rng.below(4))
}

fn channel(rng: &mut Rng) -> String {
    if rng.below(6) == 0 {
        format!("ch{}#ephemeral", rng.below(2))
    } else {
        format!("ch{}", rng.below(3))
    }
}

fn body(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => 0,
        1 => rng.below(64 * 1024),
        _ => 1 + rng.below(200),
    };
    (0..len)
        .map(|i| b'a' + ((i + rng.below(3)) % 26) as u8)
        .collect()
}

fn hex_id(rng: &mut Rng) -> Vec<u8> {
    format!("{:016x}", rng.next_u64()).into_bytes()
}

fn sized(prefix: String, payload: &[u8]) -> (Vec<u8>, Option<usize>) {
    let mut v = prefix.into_bytes();
    let at = v.len();
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    (v, Some(at))
}

const IDENTIFY_JSON: &[&str] = &[
    r#"{"client_id":"fz","hostname":"fz","feature_negotiation":true}"#,
    r#"{"heartbeat_interval":1000,"output_buffer_size":16384,"output_buffer_timeout":5}"#,
    r#"{"heartbeat_interval":-1,"output_buffer_timeout":-1,"msg_timeout":2000}"#,
    r#"{"sample_rate":50,"user_agent":"netfuzz/1.0"}"#,
    r#"{"feature_negotiation":true,"snappy":true}"#,
    r#"{"feature_negotiation":true,"deflate":true,"deflate_level":3}"#,
    r#"{"tls_v1":false,"long_id":"a","short_id":"b","msg_timeout":1000}"#,
    r#"{}"#,
];

fn v2_session(rng: &mut Rng) -> Session {
    let mut parts = vec![(b"  V2".to_vec(), None)];
    if rng.below(10) < 6 {
        parts.push(sized(
            "IDENTIFY\n".into(),
            pick(rng, IDENTIFY_JSON).as_bytes(),
        ));
    }
    let subscribed = rng.below(2) == 0;
    if subscribed {
        parts.push((
            format!("SUB {} {}\n", topic(rng), channel(rng)).into_bytes(),
            None,
        ));
        parts.push((format!("RDY {}\n", rng.below(50)).into_bytes(), None));
    }
    for _ in 0..1 + rng.below(12) {
        let p = match rng.below(12) {
            0..=2 => sized(format!("PUB {}\n", topic(rng)), &body(rng)),
            3 => {
                let bodies: Vec<Vec<u8>> = (0..1 + rng.below(5)).map(|_| body(rng)).collect();
                let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
                for b in &bodies {
                    inner.extend_from_slice(&(b.len() as u32).to_be_bytes());
                    inner.extend_from_slice(b);
                }
                sized(format!("MPUB {}\n", topic(rng)), &inner)
            }
            4 => sized(
                format!("DPUB {} {}\n", topic(rng), rng.below(5000)),
                &body(rng),
            ),
            5 => (
                [b"FIN ".to_vec(), hex_id(rng), b"\n".to_vec()].concat(),
                None,
            ),
            6 => (
                [
                    b"REQ ".to_vec(),
                    hex_id(rng),
                    format!(" {}\n", rng.below(2000)).into_bytes(),
                ]
                .concat(),
                None,
            ),
            7 => (
                [b"TOUCH ".to_vec(), hex_id(rng), b"\n".to_vec()].concat(),
                None,
            ),
            8 => (b"NOP\n".to_vec(), None),
            9 => (format!("RDY {}\n", rng.below(3000)).into_bytes(), None),
            10 => sized("AUTH\n".into(), b"secret"),
            _ => (
                format!("SUB {} {}\n", topic(rng), channel(rng)).into_bytes(),
                None,
            ),
        };
        parts.push(p);
    }
    if rng.below(3) == 0 {
        parts.push((b"CLS\n".to_vec(), None));
    }
    Session { parts, http: false }
}

fn http_request(rng: &mut Rng, last: bool) -> (Vec<u8>, Option<usize>) {
    let t = topic(rng);
    let c = channel(rng);
    let (method, path, body): (&str, String, Vec<u8>) = match rng.below(14) {
        0..=2 => ("POST", format!("/pub?topic={t}"), body(rng)),
        3 => (
            "POST",
            format!("/pub?topic={t}&defer={}", rng.below(3000)),
            body(rng),
        ),
        4 => {
            let lines: Vec<Vec<u8>> = (0..1 + rng.below(6)).map(|_| body(rng)).collect();
            ("POST", format!("/mpub?topic={t}"), lines.join(&b'\n'))
        }
        5 => {
            let bodies: Vec<Vec<u8>> = (0..1 + rng.below(4)).map(|_| body(rng)).collect();
            let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
            for b in &bodies {
                inner.extend_from_slice(&(b.len() as u32).to_be_bytes());
                inner.extend_from_slice(b);
            }
            ("POST", format!("/mpub?topic={t}&binary=true"), inner)
        }
        6 => (
            "GET",
            pick(
                rng,
                &[
                    "/stats?format=json",
                    "/stats",
                    "/stats?format=json&include_clients=false",
                ],
            )
            .to_string(),
            vec![],
        ),
        7 => (
            "GET",
            format!("/stats?format=json&topic={t}&channel={c}"),
            vec![],
        ),
        8 => (
            "POST",
            format!(
                "/topic/{}?topic={t}",
                pick(rng, &["create", "pause", "unpause", "empty"])
            ),
            vec![],
        ),
        9 | 10 => (
            "POST",
            format!(
                "/channel/{}?topic={t}&channel={c}",
                pick(rng, &["create", "pause", "unpause", "empty", "delete"])
            ),
            vec![],
        ),
        11 => (
            "GET",
            pick(rng, &["/ping", "/info", "/config/nsqlookupd_tcp_addresses"]).to_string(),
            vec![],
        ),
        12 => ("HEAD", "/ping".to_string(), vec![]),
        _ => ("POST", format!("/topic/delete?topic={t}"), vec![]),
    };
    let conn = if last && rng.below(2) == 0 {
        "Connection: close\r\n"
    } else {
        ""
    };
    if method == "POST" && rng.below(5) == 0 {
        // Chunked body.
        let mut v = format!(
            "{method} {path} HTTP/1.1\r\nHost: fz\r\n{conn}Transfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        for chunk in body.chunks(1 + rng.below(64)) {
            v.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            v.extend_from_slice(chunk);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(b"0\r\n\r\n");
        return (v, None);
    }
    let mut v = format!(
        "{method} {path} HTTP/1.1\r\nHost: fz\r\n{conn}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(&body);
    (v, None)
}

fn http_session(rng: &mut Rng) -> Session {
    let n = 1 + rng.below(4);
    Session {
        parts: (0..n).map(|i| http_request(rng, i + 1 == n)).collect(),
        http: true,
    }
}

pub(super) fn session(rng: &mut Rng) -> Session {
    if rng.below(3) == 0 {
        http_session(rng)
    } else {
        v2_session(rng)
    }
}
