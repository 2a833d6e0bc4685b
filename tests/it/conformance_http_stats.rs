//! HTTP API: /stats in JSON and text (filters, clients and producers, memory, counts
//! across shards), compared byte for byte with the nsqd 1.3.0 captures where one exists.
//! NSQ_REFERENCE.md §3 and §7 "HTTP". Requests compared with a capture are sent
//! keep-alive, as the capturing client did.

use crate::common;

use common::*;
use std::time::Duration;

// ----------------------------------------------------------------------------------------
// /stats
// ----------------------------------------------------------------------------------------

const AFTER_PUB_TOPICS: &str = r#""topics":[{"topic_name":"t","channels":[],"depth":1,"backend_depth":0,"message_count":1,"message_bytes":5,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;

const CAPTURE_TOPICS: &str = r#""topics":[{"topic_name":"t","channels":[{"channel_name":"c","depth":6,"backend_depth":0,"in_flight_count":0,"deferred_count":1,"message_count":7,"requeue_count":0,"timeout_count":0,"client_count":0,"clients":[],"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],"depth":0,"backend_depth":0,"message_count":7,"message_bytes":33,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;

const CAPTURE_TEXT_TAIL: &str = "\nTopics:\n   [t              ] depth: 0     be-depth: 0     msgs: 7        e2e%: \n      [c                        ] depth: 6     be-depth: 0     inflt: 0    def: 1    re-q: 0     timeout: 0     msgs: 7        e2e%: \n\nProducers: None\n";

const MEMORY_KEYS: [&str; 9] = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
];

/// Checks the layout of a /stats JSON body: the exact prefix up to the topics, the exact
/// topics array, the memory object's keys in order (values vary), then
/// `"producers":<producers>`. Extra keys after producers are tolerated.
fn assert_stats_json(body: &str, topics: &str, with_memory: bool, producers: &str) {
    let prefix = r#"{"version":"1.3.0","health":"OK","start_time":"#;
    assert!(body.starts_with(prefix), "stats prefix: {body}");
    let rest = &body[prefix.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    assert!(digits >= 10, "start_time digits: {body}");
    let rest = &rest[digits..];
    let want_topics = format!(",{topics}");
    assert!(
        rest.starts_with(&want_topics),
        "topics differ.\nwant: {topics}\ngot:  {}",
        &rest[..rest.len().min(topics.len() + 200)]
    );
    let mut rest = &rest[want_topics.len()..];
    if with_memory {
        assert!(
            rest.starts_with(r#","memory":{"#),
            "memory object expected: {rest}"
        );
        rest = &rest[r#","memory":{"#.len()..];
        for (i, k) in MEMORY_KEYS.iter().enumerate() {
            let key = if i == 0 {
                format!("\"{k}\":")
            } else {
                format!(",\"{k}\":")
            };
            assert!(rest.starts_with(&key), "memory key {k} expected at: {rest}");
            rest = &rest[key.len()..];
            let n = rest.bytes().take_while(u8::is_ascii_digit).count();
            assert!(n > 0, "memory value of {k}: {rest}");
            rest = &rest[n..];
        }
        assert!(rest.starts_with('}'), "memory object end: {rest}");
        rest = &rest[1..];
    } else {
        assert!(
            !body.contains(r#""memory""#),
            "memory must be omitted: {body}"
        );
    }
    let want_prod = format!(r#","producers":{producers}"#);
    assert!(
        rest.starts_with(&want_prod),
        "producers: want {want_prod} at: {rest}"
    );
    assert!(body.ends_with('}'));
    serde_json::from_str::<serde_json::Value>(body).expect("valid JSON");
}

#[test]
fn stats_json_empty_broker() {
    let b = Broker::start(1, &[]);
    let raw = b.http_keepalive("GET", "/stats?format=json", b"");
    let body = body_str(&raw);
    assert_stats_json(&body, r#""topics":[]"#, true, "null");
    let hs = v1_json_headers(body.len());
    let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
    assert_http_exact(&raw, "HTTP/1.1 200 OK", &hs, body.as_bytes());
}

/// Rebuilds the state of the capture nsqd_stats_json.body on topic `t`: 7 messages,
/// 33 bytes, channel c created after the first one, one deferred.
fn build_capture_state(b: &Broker) {
    b.http_pub("t", b"hello");
    b.wait_topic_field("t", "depth", 1);
    let raw = b.http_keepalive("GET", "/stats?format=json", b"");
    assert_stats_json(&body_str(&raw), AFTER_PUB_TOPICS, true, "null");
    // nsqd_create_channel.http
    assert_v1_empty_ok(&b.http_keepalive("POST", "/channel/create?topic=t&channel=c", b""));
    let (code, _) = b.http("POST", "/mpub?topic=t", b"m1\nm2\nm3\nm4\nm5");
    assert_eq!(code, 200);
    let (code, _) = b.http("POST", "/pub?topic=t&defer=600000", b"deferred-message-1");
    assert_eq!(code, 200);
    b.wait_topic_field("t", "depth", 0);
    b.wait_channel_field("t", "c", "depth", 6);
    b.wait_channel_field("t", "c", "deferred_count", 1);
}

#[test]
fn stats_json_matches_capture() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        build_capture_state(&b);
        let raw = b.http_keepalive("GET", "/stats?format=json", b"");
        let body = body_str(&raw);
        assert_stats_json(&body, CAPTURE_TOPICS, true, "null");
        let hs = v1_json_headers(body.len());
        let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
        assert_http_exact(&raw, "HTTP/1.1 200 OK", &hs, body.as_bytes());
        // nsqd_stats_json_topic_channel.body: the same with filters.
        let (_, body) = b.http("GET", "/stats?format=json&topic=t&channel=c", b"");
        assert_stats_json(
            &String::from_utf8(body).unwrap(),
            CAPTURE_TOPICS,
            true,
            "null",
        );
    });
}

/// The text stats from "Topics:" on must equal nsqd's output; DESIGN.md allows this
/// implementation to append its own section (e.g. `Shards:`) after nsqd's last line,
/// separated by a blank line.
fn assert_text_tail(got: &str, want: &str) {
    assert!(
        got.starts_with(want),
        "text stats differ.\nwant: {want:?}\ngot:  {got:?}"
    );
    let extra = &got[want.len()..];
    assert!(
        extra.is_empty() || extra.starts_with('\n'),
        "unexpected text after nsqd's output: {extra:?}"
    );
}

/// True when the JSON stats body has `"producers":<want>` as a top-level member right
/// before the end of the object or before extra top-level keys.
fn producers_are(body: &str, want: &str) -> bool {
    let key = format!(r#","producers":{want}"#);
    match body.rfind(&key) {
        Some(i) => {
            let after = &body[i + key.len()..];
            after == "}" || after.starts_with(",\"")
        }
        None => false,
    }
}

#[test]
fn stats_text_matches_capture() {
    let b = Broker::start(1, &[]);
    build_capture_state(&b);
    for q in ["/stats", "/stats?format=text", "/stats?format=xml"] {
        let raw = b.http_keepalive("GET", q, b"");
        let body = body_str(&raw);
        assert_http_exact(
            &raw,
            "HTTP/1.1 200 OK",
            &[
                "X-Nsq-Content-Type: nsq; version=1.0",
                &format!("Content-Length: {}", body.len()),
                "Content-Type: text/plain; charset=utf-8",
            ],
            body.as_bytes(),
        );
        let lines: Vec<&str> = body.split('\n').collect();
        assert!(lines[0].starts_with("nsqd v1.3.0 (built w/"), "{body}");
        assert!(
            lines[1].starts_with("start_time ")
                && lines[1].len() >= "start_time 2026-11-29T19:39:41Z".len(),
            "{body}"
        );
        assert!(lines[2].starts_with("uptime "), "{body}");
        assert_eq!(lines[3], "");
        assert_eq!(lines[4], "Health: OK");
        assert_eq!(lines[5], "");
        assert_eq!(lines[6], "Memory:");
        for (i, k) in MEMORY_KEYS.iter().enumerate() {
            let l = lines[7 + i];
            let prefix = format!("   {k:<25}\t");
            assert!(
                l.starts_with(&prefix),
                "memory line {l:?} should start with {prefix:?}"
            );
            assert!(
                l[prefix.len()..].bytes().all(|c| c.is_ascii_digit()),
                "{l:?}"
            );
        }
        assert_eq!(lines[16], "");
        let tail_start = body.find("\nTopics:").expect("Topics:");
        assert_text_tail(&body[tail_start..], CAPTURE_TEXT_TAIL);
        assert_eq!(body[..tail_start].matches('\n').count(), 16);
    }
}

#[test]
fn stats_text_empty_and_paused() {
    let b = Broker::start(1, &[]);
    let (_, body) = b.http("GET", "/stats", b"");
    let body = String::from_utf8(body).unwrap();
    let tail = body.find("\nTopics:").map(|i| &body[i - 1..]).unwrap_or("");
    assert_text_tail(tail, "\n\nTopics: None\n\nProducers: None\n");
    b.admin("/topic/create?topic=pz");
    b.admin("/channel/create?topic=pz&channel=cz");
    b.admin("/topic/pause?topic=pz");
    b.admin("/channel/pause?topic=pz&channel=cz");
    let (_, body) = b.http("GET", "/stats?include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    let want = "\nTopics:\n*P [pz             ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n   *P [cz                       ] depth: 0     be-depth: 0     inflt: 0    def: 0    re-q: 0     timeout: 0     msgs: 0        e2e%: \n\nProducers: None\n";
    let tail = body.find("\nTopics:").map(|i| &body[i..]).unwrap_or("");
    assert_text_tail(tail, want);
    assert!(
        !body.contains("Memory:"),
        "include_mem=false drops the memory block: {body}"
    );
}

#[test]
fn stats_text_lists_clients_and_producers() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(
        r#"{"hostname":"cons.host","user_agent":"ua/1"}"#,
        "tc",
        "ch",
    );
    send(&mut c, b"RDY 5\n");
    let port = c.local_addr().unwrap().port();
    let mut p = b.connect_v2();
    send(
        &mut p,
        &identify_cmd(r#"{"hostname":"prod.host","user_agent":"pa/2"}"#),
    );
    expect_ok(&mut p);
    send(&mut p, &pub_cmd("tc", b"x"));
    expect_ok(&mut p);
    send(&mut p, &pub_cmd("tc", b"y"));
    expect_ok(&mut p);
    let pport = p.local_addr().unwrap().port();
    let mut body = String::new();
    let ok = wait_until(Duration::from_secs(5), || {
        body = String::from_utf8(b.http("GET", "/stats", b"").1).unwrap();
        body.contains("inflt: 2 ")
    });
    assert!(ok, "{body}");
    let id = format!("cons.host:{port} ua/1");
    let want_client = format!(
        "        [V2 {id:<21}] state: 3 inflt: {:<4} rdy: {:<4} fin: {:<8} re-q: {:<8} msgs: {:<8} connected: ",
        2, 5, 0, 0, 2
    );
    assert!(
        body.contains(&want_client),
        "want line starting {want_client:?} in:\n{body}"
    );
    let pid = format!("prod.host:{pport} pa/2");
    let want_prod = format!(
        "\nProducers:\n   [V2 {pid:<21}] msgs: {:<8} topics: tc=2 connected: ",
        2
    );
    assert!(body.contains(&want_prod), "want {want_prod:?} in:\n{body}");
}

#[test]
fn stats_json_include_mem_and_clients() {
    let b = Broker::start(2, &[]);
    b.admin("/topic/create?topic=im");
    let want_topics = r#""topics":[{"topic_name":"im","channels":[],"depth":0,"backend_depth":0,"message_count":0,"message_bytes":0,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;
    for q in ["include_mem=false", "include_mem=0"] {
        let (_, body) = b.http("GET", &format!("/stats?format=json&{q}"), b"");
        assert_stats_json(
            &String::from_utf8(body).unwrap(),
            want_topics,
            false,
            "null",
        );
    }
    for q in ["include_mem=true", "include_mem=1", "include_mem=maybe"] {
        let (_, body) = b.http("GET", &format!("/stats?format=json&{q}"), b"");
        assert_stats_json(&String::from_utf8(body).unwrap(), want_topics, true, "null");
    }
    // A consumer: include_clients=false gives clients null and client_count 1.
    let _c = b.subscribe("im", "ch");
    let (_, body) = b.http(
        "GET",
        "/stats?format=json&include_clients=false&include_mem=false",
        b"",
    );
    let want_topics = r#""topics":[{"topic_name":"im","channels":[{"channel_name":"ch","depth":0,"backend_depth":0,"in_flight_count":0,"deferred_count":0,"message_count":0,"requeue_count":0,"timeout_count":0,"client_count":1,"clients":null,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],"depth":0,"backend_depth":0,"message_count":0,"message_bytes":0,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;
    assert_stats_json(
        &String::from_utf8(body).unwrap(),
        want_topics,
        false,
        "null",
    );
    let st = b.stats();
    assert_eq!(
        st["topics"][0]["channels"][0]["clients"]
            .as_array()
            .map(|a| a.len()),
        Some(1)
    );
}

#[test]
fn stats_json_client_object_is_exact() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(
        r#"{"client_id":"cid","hostname":"h.example","user_agent":"conformance/2.0","sample_rate":0}"#,
        "cj",
        "ch",
    );
    send(&mut c, b"RDY 7\n");
    b.http_pub("cj", b"m");
    let m = read_msg(&mut c);
    send(&mut c, &line(&format!("FIN {}", m.id)));
    b.wait_channel_field("cj", "ch", "in_flight_count", 0);
    let local = c.local_addr().unwrap();
    let (_, body) = b.http("GET", "/stats?format=json&topic=cj", b"");
    let body = String::from_utf8(body).unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cts = st["topics"][0]["channels"][0]["clients"][0]["connect_ts"]
        .as_i64()
        .expect("connect_ts");
    let want = format!(
        r#""clients":[{{"client_id":"cid","hostname":"h.example","version":"V2","remote_address":"{local}","state":3,"ready_count":7,"in_flight_count":0,"message_count":1,"finish_count":1,"requeue_count":0,"connect_ts":{cts},"sample_rate":0,"deflate":false,"snappy":false,"user_agent":"conformance/2.0","tls":false,"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"","tls_negotiated_protocol_is_mutual":false}}]"#
    );
    assert!(body.contains(&want), "want {want}\nin {body}");
}

#[test]
fn stats_json_producers_and_pub_counts() {
    let b = Broker::start(2, &[]);
    let mut p = b.connect_v2();
    send(
        &mut p,
        &identify_cmd(r#"{"client_id":"prod","hostname":"p.example","user_agent":"pub/1"}"#),
    );
    expect_ok(&mut p);
    // A connection that has not published is not a producer.
    let (_, body) = b.http("GET", "/stats?format=json&include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    assert!(producers_are(&body, "null"), "{body}");
    send(&mut p, &pub_cmd("pc", b"1"));
    expect_ok(&mut p);
    send(&mut p, &mpub_cmd("pc", &[b"2", b"3"]));
    expect_ok(&mut p);
    let local = p.local_addr().unwrap();
    let (_, body) = b.http("GET", "/stats?format=json&include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cts = st["producers"][0]["connect_ts"]
        .as_i64()
        .expect("producer listed");
    let want = format!(
        r#""producers":[{{"client_id":"prod","hostname":"p.example","version":"V2","remote_address":"{local}","state":0,"ready_count":0,"in_flight_count":0,"message_count":0,"finish_count":0,"requeue_count":0,"connect_ts":{cts},"sample_rate":0,"deflate":false,"snappy":false,"user_agent":"pub/1","pub_counts":[{{"topic":"pc","count":3}}],"tls":false,"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"","tls_negotiated_protocol_is_mutual":false}}]"#
    );
    assert!(body.contains(&want), "want {want}\nin {body}");
    // Upstream quirk: only one topic is listed in pub_counts.
    send(&mut p, &pub_cmd("pc2", b"x"));
    expect_ok(&mut p);
    let st = b.stats();
    assert_eq!(
        st["producers"][0]["pub_counts"].as_array().unwrap().len(),
        1,
        "{}",
        st["producers"]
    );
    // include_clients=false: producers null.
    let (_, body) = b.http(
        "GET",
        "/stats?format=json&include_mem=false&include_clients=false",
        b"",
    );
    let body = String::from_utf8(body).unwrap();
    assert!(producers_are(&body, "null"), "{body}");
}

#[test]
fn stats_filters() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let ts = topic_names("filt", 4);
        for t in &ts {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=zz"));
            b.admin(&format!("/channel/create?topic={t}&channel=aa"));
        }
        b.admin(&format!(
            "/channel/create?topic={}&channel=only_here",
            ts[2]
        ));
        // Sorted by name across shards; channels sorted too.
        let st = b.stats();
        let names: Vec<&str> = st["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic_name"].as_str().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "shards={shards}: topics sorted by name");
        assert_eq!(names.len(), 4);
        for t in st["topics"].as_array().unwrap() {
            let chans: Vec<&str> = t["channels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["channel_name"].as_str().unwrap())
                .collect();
            let mut sorted = chans.clone();
            sorted.sort();
            assert_eq!(chans, sorted, "channels sorted by name");
            assert_eq!((chans[0], chans[chans.len() - 1]), ("aa", "zz"));
        }
        // Topic filter.
        let (_, body) = b.http("GET", &format!("/stats?format=json&topic={}", ts[1]), b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["topics"].as_array().unwrap().len(), 1);
        assert_eq!(v["topics"][0]["topic_name"], ts[1].as_str());
        // Channel filter applies to every topic; topics without it are left out.
        let (_, body) = b.http("GET", "/stats?format=json&channel=only_here", b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let topics = v["topics"].as_array().unwrap();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0]["topic_name"], ts[2].as_str());
        assert_eq!(topics[0]["channels"].as_array().unwrap().len(), 1);
        let (_, body) = b.http("GET", "/stats?format=json&channel=aa", b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["topics"].as_array().unwrap().len(), 4);
        for t in v["topics"].as_array().unwrap() {
            assert_eq!(t["channels"].as_array().unwrap().len(), 1);
            assert_eq!(t["channels"][0]["channel_name"], "aa");
        }
        // Unknown topic: "topics":null. Unknown channel: "topics":[].
        let (_, body) = b.http(
            "GET",
            "/stats?format=json&topic=nope&include_mem=false",
            b"",
        );
        let body = String::from_utf8(body).unwrap();
        assert_stats_json(&body, r#""topics":null"#, false, "null");
        let (_, body) = b.http(
            "GET",
            "/stats?format=json&channel=nope&include_mem=false",
            b"",
        );
        let body = String::from_utf8(body).unwrap();
        assert_stats_json(&body, r#""topics":[]"#, false, "null");
    });
}

#[test]
fn stats_counts_across_shards() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let ts = topic_names("cnt", 5);
        let mut p = b.connect_v2();
        for (i, t) in ts.iter().enumerate() {
            for _ in 0..=i {
                send(&mut p, &pub_cmd(t, b"abc"));
                expect_ok(&mut p);
            }
        }
        for (i, t) in ts.iter().enumerate() {
            let st = b
                .topic_stats(t)
                .unwrap_or_else(|| panic!("shards={shards}: {t} missing"));
            assert_eq!(st["message_count"], (i + 1) as u64);
            assert_eq!(st["message_bytes"], 3 * (i + 1) as u64);
            assert_eq!(st["depth"], (i + 1) as u64);
        }
    });
}

/// A message deferred before its topic had a channel is deferred in the channel that
/// comes later (nsqd's topic pump hands it over with PutMessageDeferred): deferred_count
/// 1, depth 0, for a channel made over HTTP or by SUB (measured on nsqd 1.3.0).
#[test]
fn a_message_deferred_before_the_channel_counts_as_deferred() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let (code, _) = b.http("POST", "/pub?topic=early&defer=600000", b"later");
        assert_eq!(code, 200);
        b.wait_topic_field("early", "depth", 1);
        let (code, _) = b.http("POST", "/channel/create?topic=early&channel=c", b"");
        assert_eq!(code, 200);
        b.wait_channel_field("early", "c", "deferred_count", 1);
        b.wait_channel_field("early", "c", "depth", 0);
        b.wait_channel_field("early", "c", "message_count", 1);
        b.wait_topic_field("early", "depth", 0);
    });
}
