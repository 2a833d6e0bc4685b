//! SUB, pause and delete through the shard (no store, no runtime needed).

use super::*;
use crate::client::{Client, ClientSettings, ClientState};
use crate::mesh::{AdminError, AdminOp};
use crate::message::MessageId;
use crate::topic::PublishError;
use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;

fn client(shard: &Shard) -> Rc<Client> {
    let c = Rc::new(Client::new(
        shard.new_client_id(),
        "127.0.0.1:1".into(),
        ClientSettings {
            client_id: "c".into(),
            hostname: "h".into(),
            user_agent: String::new(),
            heartbeat_interval: None,
            output_buffer_size: 16384,
            output_buffer_timeout: Duration::from_millis(250),
            sample_rate: 0,
            msg_timeout: Duration::from_secs(60),
            identified: false,
            pump: Default::default(),
            topology: Default::default(),
        }
        .with_current_pump(),
    ));
    shard.register_client(&c);
    c
}

fn shard(max_channel_consumers: usize) -> Shard {
    Shard::new(
        0,
        1,
        None,
        Options {
            max_channel_consumers,
            ..Options::default()
        },
    )
}

fn in_flight(s: &Shard, t: &str, c: &str) -> usize {
    s.topics.borrow()[t].channels[c].in_flight_count()
}

#[test]
fn sub_beyond_max_channel_consumers_is_refused_with_nsqds_text() {
    let s = shard(1);
    let (a, b) = (client(&s), client(&s));
    s.subscribe(&a, "t", "c").unwrap();
    assert_eq!(a.state(), ClientState::Subscribed);
    assert_eq!(a.subscription(), Some(("t".into(), "c".into())));
    let e = s.subscribe(&b, "t", "c").unwrap_err();
    assert_eq!(
        e,
        SubError::TooManyConsumers {
            topic: "t".into(),
            channel: "c".into(),
            max: 1
        }
    );
    assert_eq!(e.to_string(), "consumers for t:c exceeds limit of 1");
    assert_eq!(b.state(), ClientState::Init);
    assert_eq!(b.subscription(), None);
    // Another channel of the topic is not affected.
    s.subscribe(&b, "t", "d").unwrap();
}

/// Runs `body` on a glommio executor with a one-shard `Shard` whose data path is
/// `dir` (the caller makes and removes it), given the path too.
fn on_durable_shard<F, Fut>(dir: &std::path::Path, body: F)
where
    F: FnOnce(Shard, std::path::PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    on_durable_shard_with(dir, Options::default(), body)
}

/// [`on_durable_shard`] with `opts` (its data path set to `dir`).
/// An empty directory under the system's temporary one, named for the test (`tag`) and
/// this process.
fn fresh_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nsq-shards-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn on_durable_shard_with<F, Fut>(dir: &std::path::Path, opts: Options, body: F)
where
    F: FnOnce(Shard, std::path::PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let d = dir.to_path_buf();
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let s = Shard::new(
                0,
                1,
                None,
                Options {
                    data_path: Some(d.clone()),
                    ..opts
                },
            );
            body(s, d).await
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_checkpoint_looks_only_at_the_topics_that_changed() {
    // 300 durable topics with a channel and a message each; once their metadata is
    // written, an idle checkpoint looks at none of them and a change to one topic
    // costs a look at that topic only.
    let dir = fresh_dir("changed");
    on_durable_shard(&dir, |s, d2| async move {
        for i in 0..300 {
            let t = format!("t{i}");
            s.publish_local(&t, vec![Bytes::from_static(b"a")], None)
                .unwrap();
            s.admin(AdminOp::CreateChannel(t, "c".into())).unwrap();
        }
        assert_eq!(s.checkpoint().await, 300);
        assert_eq!(s.checkpoint().await, 0, "nothing changed");
        s.admin(AdminOp::CreateChannel("t7".into(), "d".into()))
            .unwrap();
        assert_eq!(s.checkpoint().await, 1, "one topic changed");
        let meta = nsq_storage::topic_dir(&d2, "t7").join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("\"d\""), "{text}");
        s.publish_local("t9", vec![Bytes::from_static(b"b")], None)
            .unwrap();
        assert_eq!(s.checkpoint().await, 1, "one topic published to");
        s.shutdown.set();
        s.close_stores().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_answer_under_the_default_policy_writes_the_metadata_and_the_next_checkpoint_syncs_it() {
    // `persist_changes` (what `/channel/create` waits for) writes meta.json without an
    // fsync under the default policy: the file says so at once, and the topic stays
    // marked until a synced checkpoint has written it; after that an idle checkpoint
    // looks at nothing.
    let dir = fresh_dir("unsynced");
    on_durable_shard(&dir, |s, d2| async move {
        assert!(s.opts.sync_every > 1, "the default policy");
        s.publish_local("t", vec![Bytes::from_static(b"a")], None)
            .unwrap();
        s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
            .unwrap();
        s.persist_changes().await;
        let meta = nsq_storage::topic_dir(&d2, "t").join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("\"c\""), "{text}");
        assert!(!s.topics.borrow()["t"].meta_synced());
        assert_eq!(s.checkpoint().await, 1, "the unsynced write is synced");
        assert!(s.topics.borrow()["t"].meta_synced());
        assert_eq!(s.checkpoint().await, 0, "nothing left to sync");
        // More topics than SYNCFS_FROM: one syncfs covers them all.
        let n = crate::persist::SYNCFS_FROM + 5;
        for i in 0..n {
            let t = format!("u{i}");
            s.publish_local(&t, vec![Bytes::from_static(b"a")], None)
                .unwrap();
            s.admin(AdminOp::CreateChannel(t, "c".into())).unwrap();
            s.persist_changes().await;
        }
        assert!((0..n).all(|i| !s.topics.borrow()[&format!("u{i}")].meta_synced()));
        assert_eq!(s.checkpoint().await, n);
        assert!((0..n).all(|i| s.topics.borrow()[&format!("u{i}")].meta_synced()));
        assert_eq!(s.checkpoint().await, 0, "nothing left to sync");
        s.shutdown.set();
        s.close_stores().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_dropped_mid_write_does_not_stop_the_next_ones() {
    // A connection's task that answers after the metadata is written runs the
    // checkpoint itself; when its client goes away mid-write, the future is dropped.
    // Later checkpoints (the shutdown's included) must still run.
    let dir = fresh_dir("ckpt");
    on_durable_shard(&dir, |s, d2| async move {
        s.publish_local("t", vec![Bytes::from_static(b"a")], None)
            .unwrap();
        s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
            .unwrap();
        {
            let mut fut = std::pin::pin!(s.run_checkpoint());
            assert!(
                futures::poll!(fut.as_mut()).is_pending(),
                "the metadata write waits for the disk"
            );
            assert!(s.meta.running.get());
        }
        assert!(!s.meta.running.get(), "released when dropped");
        let next = glommio::timer::timeout(Duration::from_secs(10), async {
            s.persist_changes().await;
            Ok(())
        })
        .await;
        assert!(next.is_ok(), "a later checkpoint ran");
        let meta = nsq_storage::topic_dir(&d2, "t").join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("\"c\""), "{text}");
        s.shutdown.set();
        s.close_stores().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (yielding to the executor) until `cond` holds, for at most 10 s.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[test]
fn deferred_messages_hold_no_body_and_are_read_back_from_disk_when_due() {
    // A durable topic's deferred messages keep their bodies in the log only once
    // the store has written them: then, out of the memory tail, falling due reads them
    // back from the store and delivers them with their bodies. After a restart they come back without a
    // read of any body, and are delivered when due the same way.
    let dir = fresh_dir("defer");
    let opts = Options {
        mem_queue_size: 10,
        ..Options::default()
    };
    on_durable_shard_with(&dir, opts, |s, d2| async move {
        let s = Rc::new(s);
        *s.me.borrow_mut() = Rc::downgrade(&s);
        let bodies = |from: usize| -> Vec<Bytes> {
            (from..from + 100)
                .map(|i| Bytes::from(format!("body-{i:04}")))
                .collect()
        };
        let delivered = |c: &Client, from: usize| {
            let out = c.outbox().buf();
            (from..from + 100)
                .filter(|i| {
                    let b = format!("body-{i:04}");
                    out.windows(b.len()).any(|w| w == b.as_bytes())
                })
                .count()
        };
        s.publish_local("t", vec![Bytes::from_static(b"first")], None)
            .unwrap();
        s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
            .unwrap();
        let due = Instant::now() + Duration::from_millis(300);
        s.publish_local("t", bodies(0), Some(due)).unwrap();
        {
            let topics = s.topics.borrow();
            let ch = &topics["t"].channels["c"];
            assert_eq!(ch.deferred_count(), 100);
            assert_eq!(ch.deferred_bodies_count(), 100, "held until written");
        }
        // Written, then (90 of them) out of the memory tail.
        s.pump_stores(true);
        until("the deferred records leave memory", || {
            let mut topics = s.topics.borrow_mut();
            let t = topics.get_mut("t").unwrap();
            t.trim(s.opts.mem_queue_size);
            // All but the newest --mem-queue-size (10).
            t.log.base() + 10 == t.log.head()
        })
        .await;
        assert!(
            s.topics.borrow()["t"].channels["c"].deferred_bodies_count() == 0,
            "no body held once written"
        );
        let c = client(&s);
        s.subscribe(&c, "t", "c").unwrap();
        c.set_ready_count(500);
        s.client_ready_changed(&c);
        until("the undeferred one is read back and delivered", || {
            in_flight(&s, "t", "c") == 1
        })
        .await;
        assert_eq!(delivered(&c, 0), 0, "none is due yet");
        glommio::timer::sleep(due.saturating_duration_since(Instant::now())).await;
        s.process_timers(Instant::now());
        until("every deferred message is in flight", || {
            in_flight(&s, "t", "c") == 101
        })
        .await;
        assert_eq!(delivered(&c, 0), 100, "bodies read back from disk");

        // Deferred again, held across a clean restart.
        let due = Instant::now() + Duration::from_millis(400);
        s.publish_local("t", bodies(100), Some(due)).unwrap();
        s.shutdown.set();
        s.close_stores().await;
        drop(c);
        let s2 = Rc::new(Shard::new(
            0,
            1,
            None,
            Options {
                data_path: Some(d2.clone()),
                mem_queue_size: 10,
                ..Options::default()
            },
        ));
        *s2.me.borrow_mut() = Rc::downgrade(&s2);
        s2.recover().await;
        {
            let topics = s2.topics.borrow();
            let t = &topics["t"];
            let ch = &t.channels["c"];
            assert_eq!(ch.deferred_count(), 100);
            assert_eq!(ch.deferred_bodies_count(), 0, "no body read at start");
            // The 101 in flight before the restart are ready again, bodies unread.
            assert_eq!(ch.requeued_count(), 101);
            assert_eq!(ch.ready_unread_count(), 101);
        }
        let c2 = client(&s2);
        s2.subscribe(&c2, "t", "c").unwrap();
        c2.set_ready_count(500);
        s2.client_ready_changed(&c2);
        until(
            "the recovered in-flight messages are delivered again",
            || in_flight(&s2, "t", "c") == 101,
        )
        .await;
        assert_eq!(delivered(&c2, 0), 100);
        assert_eq!(delivered(&c2, 100), 0, "not due yet");
        glommio::timer::sleep(due.saturating_duration_since(Instant::now())).await;
        s2.process_timers(Instant::now());
        until("the recovered deferred messages are delivered", || {
            in_flight(&s2, "t", "c") == 201
        })
        .await;
        assert_eq!(delivered(&c2, 100), 100);
        s2.shutdown.set();
        s2.close_stores().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sub_while_exiting_is_refused() {
    let s = shard(0);
    let c = client(&s);
    s.shutdown.set();
    let e = s.subscribe(&c, "t", "c").unwrap_err();
    assert_eq!(
        (e.clone(), e.to_string()),
        (SubError::Exiting, "exiting".into())
    );
    assert!(s.topics.borrow().is_empty(), "nothing created");
}

#[test]
fn pause_channel_stops_delivery_and_unpause_resumes_it() {
    let s = shard(0);
    let c = client(&s);
    s.subscribe(&c, "t", "c").unwrap();
    c.set_ready_count(10);
    s.admin(AdminOp::PauseChannel("t".into(), "c".into(), true))
        .unwrap();
    s.publish_local("t", vec![Bytes::from_static(b"a")], None)
        .unwrap();
    assert_eq!(in_flight(&s, "t", "c"), 0);
    s.client_ready_changed(&c);
    assert_eq!(in_flight(&s, "t", "c"), 0, "still paused");
    s.admin(AdminOp::PauseChannel("t".into(), "c".into(), false))
        .unwrap();
    assert_eq!(in_flight(&s, "t", "c"), 1, "unpause delivers");
    assert_eq!(c.message_count(), 1);
}

#[test]
fn delete_channel_closes_its_consumers_and_forgets_its_messages() {
    let s = shard(0);
    let c = client(&s);
    s.subscribe(&c, "t", "c").unwrap();
    c.set_ready_count(10);
    s.publish_local("t", vec![Bytes::from_static(b"a")], None)
        .unwrap();
    assert_eq!(in_flight(&s, "t", "c"), 1);
    s.admin(AdminOp::DeleteChannel("t".into(), "c".into()))
        .unwrap();
    assert!(c.is_closed());
    assert_eq!(c.state(), ClientState::Closing);
    assert!(!s.topics.borrow()["t"].channels.contains_key("c"));
    assert_eq!(
        s.admin(AdminOp::DeleteChannel("t".into(), "c".into())),
        Err(AdminError::ChannelNotFound)
    );
    // FIN of what was in flight fails now.
    let id = MessageId(0);
    assert!(s.finish(&c, id).is_err());
}

#[test]
fn ephemeral_channel_and_topic_go_with_their_last_client() {
    let s = shard(0);
    let c = client(&s);
    s.subscribe(&c, "t#ephemeral", "c#ephemeral").unwrap();
    s.client_gone(&c);
    assert!(s.topics.borrow().is_empty());
}

#[test]
fn a_topic_that_failed_to_load_is_unhealthy_and_keeps_its_data() {
    // Recovery at start-up could not load the topic (`Shard::recover` records it):
    // `/ping` reports it, and a publish to it is refused rather than starting a new
    // store over the segments still in its directory.
    let dir = std::env::temp_dir().join(format!("nsq-shards-failed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let topic_dir = nsq_storage::topic_dir(&dir, "t");
    std::fs::create_dir_all(&topic_dir).unwrap();
    let seg = topic_dir.join("00000000000000000000.seg");
    std::fs::write(&seg, b"old data").unwrap();
    on_durable_shard(&dir, |s, _| async move {
        assert_eq!(s.health(), None);
        let e = "TOPIC(t): recovery failed - Too many open files (os error 24)";
        s.meta.recovery_failed("t", e.into());
        assert_eq!(s.health().as_deref(), Some(e));
        let r = s.publish_local("t", vec![Bytes::from_static(b"new")], None);
        assert!(
            matches!(&r, Err(PublishError::Disk(m)) if m == e),
            "{:?}",
            r.err()
        );
        s.retry_missing_stores();
        assert!(
            s.topics.borrow()["t"].store().is_none(),
            "no store made afresh"
        );
        assert_eq!(s.health().as_deref(), Some(e));
    });
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        b"old data",
        "the old data is kept"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// While the node drains (crate::node): publishes and new topics and channels are
/// refused, an existing channel can still be subscribed to, and `drain_left` counts
/// what channels still hold (a topic without channels apart).
#[test]
fn draining_refuses_publishes_and_creations_and_counts_what_is_left() {
    use crate::node::NodeUpdate;
    let s = shard(0);
    let a = client(&s);
    s.subscribe(&a, "t", "c").unwrap();
    s.publish_local("t", vec![Bytes::from_static(b"x"); 3], None)
        .unwrap();
    s.publish_local("orphan", vec![Bytes::from_static(b"y"); 2], None)
        .unwrap();
    assert_eq!(
        s.drain_left(),
        DrainLeft {
            messages: 3,
            without_channels: 2
        }
    );

    s.node.apply(&NodeUpdate::Drain);
    let refused = s.publish_local("t", vec![Bytes::from_static(b"z")], None);
    assert_eq!(refused.err(), Some(PublishError::Draining));
    assert_eq!(PublishError::Draining.text(), "draining");
    let b = client(&s);
    let e = s.subscribe(&b, "t", "new").unwrap_err();
    assert_eq!(
        e.to_string(),
        "E_NSQD_DRAINING SUB create channel t:new failed. nsqd is draining"
    );
    assert!(s.subscribe(&b, "fresh", "c").is_err());
    s.subscribe(&b, "t", "c").unwrap();
    assert_eq!(
        s.admin(AdminOp::CreateTopic("fresh".into())),
        Err(AdminError::Draining)
    );
    assert_eq!(
        s.admin(AdminOp::CreateChannel("t".into(), "new".into())),
        Err(AdminError::Draining)
    );
    assert_eq!(s.admin(AdminOp::CreateTopic("t".into())), Ok(()));
    assert_eq!(
        s.admin(AdminOp::CreateChannel("t".into(), "c".into())),
        Ok(())
    );
    assert!(!s.topics.borrow().contains_key("fresh"));
    // Emptying the channel is what is left to do here.
    s.admin(AdminOp::EmptyChannel("t".into(), "c".into()))
        .unwrap();
    assert_eq!(s.drain_left().messages, 0);
}

#[test]
fn dead_letters_are_taken_from_the_shard_and_finished_once_published() {
    let s = Shard::new(
        0,
        1,
        None,
        Options {
            max_attempts: 1,
            ..Options::default()
        },
    );
    let c = client(&s);
    s.subscribe(&c, "t", "c").unwrap();
    s.admin(AdminOp::CreateChannel("t".into(), "own".into()))
        .unwrap();
    s.admin(AdminOp::ChannelMaxAttempts(
        "t".into(),
        "own".into(),
        Some(0),
    ))
    .unwrap();
    assert_eq!(
        s.admin(AdminOp::ChannelMaxAttempts("t".into(), "x".into(), None)),
        Err(AdminError::ChannelNotFound)
    );
    {
        let topics = s.topics.borrow();
        let chs = &topics["t"].channels;
        assert_eq!((chs["c"].max_attempts(), chs["own"].max_attempts()), (1, 0));
    }
    c.set_ready_count(10);
    s.publish_local("t", vec![Bytes::from_static(b"body")], None)
        .unwrap();
    // The delivered frame: size, type, timestamp, attempts, then the 16-byte id.
    let id = {
        let out = c.outbox().buf_mut();
        MessageId::from_hex(&out[18..34]).unwrap()
    };
    s.requeue(&c, id, Duration::ZERO).unwrap();
    assert_eq!(in_flight(&s, "t", "c"), 0, "not delivered again");
    let batches = s.take_dead_letters();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(
        (b.topic.as_str(), b.channel.as_str(), b.dead_topic.as_str()),
        ("t", "c", "t.dead")
    );
    assert_eq!(b.messages.len(), 1);
    assert_eq!(
        (b.messages[0].id, &b.messages[0].body[..]),
        (id, &b"body"[..])
    );
    assert!(s.take_dead_letters().is_empty(), "taken once");
    assert_eq!(s.topics.borrow()["t"].channels["c"].pending_count(), 1);
    s.dead_lettered("t", "c", &[id]);
    let topics = s.topics.borrow();
    let ch = &topics["t"].channels["c"];
    assert_eq!((ch.pending_count(), ch.dead_count()), (0, 1));
    assert_eq!(topics["t"].channels["own"].dead_count(), 0);
}

#[test]
fn messages_ready_again_below_the_cursor_stay_in_memory_until_the_store_wrote_them() {
    // A channel state taken over from a leader (`set_channel_position`) holds messages
    // ready again below its cursor, whose bodies come from the log. Their records stay
    // in memory until the store has written them, so a consumer gets them at once
    // instead of after the store's write.
    let dir = fresh_dir("unread");
    let opts = Options {
        mem_queue_size: 5,
        ..Options::default()
    };
    on_durable_shard_with(&dir, opts, |s, _| async move {
        let s = Rc::new(s);
        *s.me.borrow_mut() = Rc::downgrade(&s);
        s.admin(AdminOp::CreateTopic("t".into())).unwrap();
        s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
            .unwrap();
        let bodies: Vec<Bytes> = (0..20)
            .map(|i| Bytes::from(format!("body-{i:02}")))
            .collect();
        s.publish_local("t", bodies, None).unwrap();
        let head = s.topics.borrow()["t"].log.head();
        let first = head - 20;
        // The leader's state: everything delivered, the first ten unfinished.
        let pending: Vec<(u64, u16, i64)> = (first..first + 10).map(|q| (q, 1, 0)).collect();
        assert!(s.set_channel_position("t", "c", head, &pending));
        // Handed to the store, which has not written them yet; then trimmed.
        s.pump_stores(true);
        {
            let mut topics = s.topics.borrow_mut();
            let t = topics.get_mut("t").unwrap();
            t.trim(s.opts.mem_queue_size);
            assert!(
                t.log.base() <= first,
                "records of messages ready again left memory before they were written: base {} first {first}",
                t.log.base()
            );
        }
        let c = client(&s);
        s.subscribe(&c, "t", "c").unwrap();
        c.set_ready_count(20);
        s.client_ready_changed(&c);
        assert_eq!(
            in_flight(&s, "t", "c"),
            10,
            "all delivered at once, from memory"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}
