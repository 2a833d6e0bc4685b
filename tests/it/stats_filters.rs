//! `/stats` `topic=` and `channel=` filters give nsqd 1.3.0's shapes (nsqd: stats.go
//! GetStats), which nsqadmin and nsq_stat depend on:
//! - an unknown topic: `"topics":null` and `"producers":null` (GetStats returns early);
//! - a known topic without the channel, or a channel no topic has: `"topics":[]`;
//! - otherwise the topics that have the channel, each listing only that channel.
//!
//! The expected shapes were taken from nsqd 1.3.0 with the same topics.

use crate::common;

use common::*;
use serde_json::Value;
use std::io::Write;

/// (topic, [channel]) pairs of a /stats JSON `topics` value, or None for `null`.
type Shape = Option<Vec<(String, Vec<String>)>>;

fn shape(v: &Value) -> Shape {
    let topics = v.as_array()?;
    Some(
        topics
            .iter()
            .map(|t| {
                let channels = t["channels"]
                    .as_array()
                    .map(|cs| {
                        cs.iter()
                            .map(|c| c["channel_name"].as_str().unwrap_or("").to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                (t["topic_name"].as_str().unwrap_or("").to_string(), channels)
            })
            .collect(),
    )
}

fn owned(v: &[(&str, &[&str])]) -> Shape {
    Some(
        v.iter()
            .map(|(t, cs)| (t.to_string(), cs.iter().map(|c| c.to_string()).collect()))
            .collect(),
    )
}

#[test]
fn filter_combinations_match_nsqd() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        // A TCP producer, so `producers` is not null when nsqd lists it.
        let mut p = b.connect_v2();
        p.write_all(&pub_cmd("t", b"hi")).unwrap();
        assert_eq!(read_frame(&mut p).unwrap(), (0, b"OK".to_vec()));
        assert_eq!(
            b.http("POST", "/channel/create?topic=t&channel=c", b"").0,
            200
        );
        assert_eq!(b.http("POST", "/topic/create?topic=u", b"").0, 200);

        let with_c: &[(&str, &[&str])] = &[("t", &["c"])];
        let cases: &[(&str, Shape, bool)] = &[
            ("", owned(&[("t", &["c"]), ("u", &[])]), true),
            ("topic=t", owned(with_c), true),
            ("topic=nope", None, false),
            ("channel=c", owned(with_c), true),
            ("channel=nope", Some(vec![]), true),
            ("topic=t&channel=c", owned(with_c), true),
            ("topic=t&channel=nope", Some(vec![]), true),
            ("topic=nope&channel=c", None, false),
            ("topic=u&channel=c", Some(vec![]), true),
        ];
        for (q, want, has_producers) in cases {
            let (code, body) = b.http("GET", &format!("/stats?format=json&{q}"), b"");
            assert_eq!(code, 200);
            let v: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(&shape(&v["topics"]), want, "shards={shards} {q}: {v}");
            assert_eq!(
                v["producers"].is_array(),
                *has_producers,
                "shards={shards} {q}: {v}"
            );
            let (_, text) = b.http("GET", &format!("/stats?include_mem=false&{q}"), b"");
            let text = String::from_utf8_lossy(&text);
            let none = want.as_ref().is_none_or(|t| t.is_empty());
            assert_eq!(text.contains("\nTopics: None\n"), none, "{q}: {text}");
            assert_eq!(
                text.contains("\nProducers: None"),
                !has_producers,
                "{q}: {text}"
            );
        }
        // Without clients, producers are null for every filter.
        let (_, body) = b.http(
            "GET",
            "/stats?format=json&include_clients=false&topic=t",
            b"",
        );
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert!(v["producers"].is_null(), "{v}");
        drop(p);
    });
}
