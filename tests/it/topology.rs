//! Topology-aware consumption (nsqd master's `--enable-experiment=topology-aware-consumption`,
//! `--topology-region`, `--topology-zone`; IDENTIFY `topology_region` and `topology_zone`;
//! docs/compatibility.md): the fields are accepted with the experiment off (and change
//! nothing), and with it on a channel delivers to a consumer in the node's zone while it
//! has RDY, over real TCP.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::net::TcpStream;

/// IDENTIFY with feature negotiation: the JSON reply.
fn identify(s: &mut TcpStream, json: &str) -> serde_json::Value {
    send(s, &identify_cmd(json));
    let (ft, data) = read_frame_skip_hb(s).unwrap();
    assert_eq!(ft, 0, "{}", show(&data));
    serde_json::from_slice(&data).unwrap()
}

/// The clients of `topic`/`channel` in /stats (none while the channel does not exist).
fn clients(b: &Broker, topic: &str, channel: &str) -> Vec<serde_json::Value> {
    b.channel_stats(topic, channel)
        .and_then(|c| c["clients"].as_array().cloned())
        .unwrap_or_default()
}

fn channel(b: &Broker, topic: &str, ch: &str) -> serde_json::Value {
    b.channel_stats(topic, ch)
        .unwrap_or_else(|| panic!("no channel {topic}/{ch} in /stats"))
}

/// Without the experiment or a topology the fields are accepted and ignored: the reply
/// has nsqd 1.3.0's keys only, and /stats shows what the client sent.
#[test]
fn identify_fields_accepted_without_the_experiment() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    let r = identify(
        &mut s,
        r#"{"feature_negotiation":true,"topology_region":"r1","topology_zone":"z1"}"#,
    );
    assert!(
        r.get("topology_region").is_none() && r.get("topology_zone").is_none(),
        "{r}"
    );
    send(&mut s, b"SUB t c\n");
    expect_ok(&mut s);
    let c = clients(&b, "t", "c");
    assert_eq!(
        (
            c[0]["topology_zone"].as_str(),
            c[0]["topology_region"].as_str()
        ),
        (Some("z1"), Some("r1"))
    );
    // A wrong type fails as Go's json.Unmarshal does.
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"topology_zone":1}"#));
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY failed to decode JSON body");
    // A client that sends none: no topology keys in /stats.
    let mut s = b.connect_v2();
    identify(&mut s, r#"{"feature_negotiation":true}"#);
    send(&mut s, b"SUB t d\n");
    expect_ok(&mut s);
    let c = clients(&b, "t", "d");
    assert!(c[0].get("topology_zone").is_none(), "{}", c[0]);
    let ch = channel(&b, "t", "d");
    assert!(ch.get("zone_local_msg_count").is_none(), "{ch}");
}

/// A broker with a region and zone tells them in the negotiation reply (nsqd master).
#[test]
fn identify_reply_names_the_node_topology() {
    let b = Broker::start(1, &["--topology-region=r1", "--topology-zone=z1"]);
    let mut s = b.connect_v2();
    let r = identify(&mut s, r#"{"feature_negotiation":true}"#);
    assert_eq!(r["topology_region"], "r1");
    assert_eq!(r["topology_zone"], "z1");
    assert_eq!(
        b.http("GET", "/config/topology_zone", b""),
        (200, b"z1".to_vec())
    );
}

/// A subscribed consumer at `zone`/`region` with RDY `rdy`.
fn consumer(b: &Broker, topic: &str, region: &str, zone: &str, rdy: u32) -> TcpStream {
    let mut s = b.connect_v2();
    identify(
        &mut s,
        &format!(
            r#"{{"feature_negotiation":true,"topology_region":"{region}","topology_zone":"{zone}"}}"#
        ),
    );
    send(&mut s, format!("SUB {topic} c\nRDY {rdy}\n").as_bytes());
    expect_ok(&mut s);
    s
}

/// With the experiment on, every message goes to the zone-local consumer while it has
/// RDY (the far one, subscribed first, gets none); with the zone-local one at RDY 0 the
/// far one gets them. /stats counts deliveries by rank.
#[test]
fn same_zone_consumer_gets_the_messages_while_it_has_rdy() {
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(
            shards,
            &[
                "--topology-region=r1",
                "--topology-zone=z1",
                "--enable-experiment=topology-aware-consumption",
            ],
        );
        let mut far = consumer(&b, "t", "r2", "z9", 100);
        let mut near = consumer(&b, "t", "r1", "z1", 100);
        wait_for("both consumers ready", || {
            let c = clients(&b, "t", "c");
            c.len() == 2 && c.iter().all(|c| c["ready_count"] == 100)
        });
        let mut p = b.connect_v2();
        for i in 0..50 {
            send(&mut p, &pub_cmd("t", format!("m{i}").as_bytes()));
            expect_ok(&mut p);
        }
        for _ in 0..50 {
            let (ft, data) = read_frame_skip_hb(&mut near).unwrap();
            assert_eq!(ft, 2);
            let (_, _, id, _) = parse_message(&data);
            send(&mut near, format!("FIN {id}\n").as_bytes());
        }
        let ch = channel(&b, "t", "c");
        assert_eq!(ch["zone_local_msg_count"], 50, "{ch}");
        assert!(ch.get("global_msg_count").is_none(), "{ch}");
        let far_count = |b: &Broker| {
            clients(b, "t", "c")
                .iter()
                .find(|c| c["topology_zone"] == "z9")
                .map(|c| c["message_count"].as_u64().unwrap())
        };
        assert_eq!(far_count(&b), Some(0));

        // The near consumer stops taking: the far one gets the next ones.
        send(&mut near, b"RDY 0\n");
        wait_for("the near consumer at RDY 0", || {
            clients(&b, "t", "c")
                .iter()
                .any(|c| c["topology_zone"] == "z1" && c["ready_count"] == 0)
        });
        for i in 0..5 {
            send(&mut p, &pub_cmd("t", format!("late{i}").as_bytes()));
            expect_ok(&mut p);
        }
        for _ in 0..5 {
            let (ft, data) = read_frame_skip_hb(&mut far).unwrap();
            assert_eq!(ft, 2);
            assert!(parse_message(&data).3.starts_with(b"late"));
        }
        let ch = channel(&b, "t", "c");
        assert_eq!(ch["global_msg_count"], 5, "{ch}");
    });
}
