//! The rules of a channel with an injected clock: every method that reads the time takes
//! `now`, so a test moves a base `Instant` forward by hand and never sleeps. Topics here
//! have no store (as with no `--data-path`): everything stays in memory.
//!
//! Groups: timers (registration in the shard's timer queue), msg timeout, TOUCH, REQ,
//! deferred delivery, RDY windows, the topic backlog, #ephemeral overflow, empty, delete,
//! pause, FIN errors, client disconnect, attempts, ordering, depth and counters.

use super::*;
use crate::client::ClientSettings;
use crate::topic::Topic;
use bytes::Bytes;

/// `--mem-queue-size` for the tests that do not test it.
const MQ: u64 = 10_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A test clock: a base instant plus the offsets a test passes in.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn new() -> Clock {
        Clock(Instant::now())
    }
    /// `n` ms after the base.
    fn at(self, n: u64) -> Instant {
        self.0 + ms(n)
    }
}

/// A subscribed client with RDY `rdy` and a msg_timeout of `timeout_ms`.
fn client_with(id: u64, rdy: i64, timeout_ms: u64) -> Rc<Client> {
    let c = Client::new(
        id,
        "test".into(),
        ClientSettings {
            client_id: "c".into(),
            hostname: "h".into(),
            user_agent: String::new(),
            heartbeat_interval: None,
            output_buffer_size: 16384,
            output_buffer_timeout: ms(250),
            sample_rate: 0,
            msg_timeout: ms(timeout_ms),
            identified: false,
            pump: Default::default(),
            topology: Default::default(),
        }
        .with_current_pump(),
    );
    c.set_state(ClientState::Subscribed);
    c.set_ready_count(rdy);
    Rc::new(c)
}

/// A subscribed client with RDY 100 and a msg_timeout of 1 s.
fn client(id: u64) -> Rc<Client> {
    client_with(id, 100, 1000)
}

/// A memory-only topic "t" with channel `name`.
fn topic_with(name: &str) -> Topic {
    let mut t = Topic::new("t", 1);
    t.create_channel(name, MQ);
    t
}

/// Publishes bodies "m<first>".."m<first + n - 1>".
fn publish(t: &mut Topic, first: usize, n: usize) {
    t.publish(
        (first..first + n).map(|i| Bytes::from(format!("m{i}"))),
        None,
        MQ,
    );
}

/// Subscribes `c` to channel `ch` of `t`.
fn sub(t: &mut Topic, ch: &str, c: &Rc<Client>) {
    t.channels
        .get_mut(ch)
        .unwrap()
        .add_client(c.clone(), 0)
        .unwrap();
}

fn chan<'a>(t: &'a mut Topic, ch: &str) -> &'a mut Channel {
    t.channels.get_mut(ch).unwrap()
}

/// Delivers what channel `ch` can deliver at `now`.
fn dispatch(t: &mut Topic, ch: &str, now: Instant) -> u64 {
    let ch = t.channels.get_mut(ch).unwrap();
    ch.dispatch(&t.log, now)
}

fn depth(t: &Topic, ch: &str) -> u64 {
    t.channels[ch].depth(&t.log)
}

/// A message frame as the client would read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    attempts: u16,
    id: MessageId,
    body: String,
}

/// Takes the message frames buffered for `c`.
fn frames(c: &Client) -> Vec<Frame> {
    let out = std::mem::take(&mut *c.outbox().buf_mut());
    let mut v = Vec::new();
    let mut p = 0;
    while p < out.len() {
        let size = u32::from_be_bytes(out[p..p + 4].try_into().unwrap()) as usize;
        let f = &out[p + 4..p + 4 + size];
        assert_eq!(&f[..4], &2u32.to_be_bytes(), "a message frame");
        let attempts = u16::from_be_bytes(f[12..14].try_into().unwrap());
        let id = MessageId::from_hex(&f[14..30]).unwrap();
        let body = String::from_utf8(f[30..].to_vec()).unwrap();
        v.push(Frame { attempts, id, body });
        p += 4 + size;
    }
    v
}

fn bodies(fs: &[Frame]) -> Vec<&str> {
    fs.iter().map(|f| f.body.as_str()).collect()
}

/// Topic "t" with channel "ch" and `n` messages delivered to one client at `t0`.
fn delivered(n: usize, t0: Instant) -> (Topic, Rc<Client>, Vec<MessageId>) {
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, n);
    assert_eq!(dispatch(&mut t, "ch", t0), n as u64);
    let ids = frames(&c).iter().map(|f| f.id).collect();
    (t, c, ids)
}

// ----------------------------------------------------------------- timer registration

#[test]
fn idle_channel_has_no_timer() {
    let mut ch = Channel::new("ch", 0);
    assert_eq!(ch.next_timer(), None);
    assert_eq!(ch.timer_to_schedule(), None);
}

#[test]
fn in_flight_timeout_is_registered_once_and_fires_at_the_deadline() {
    let t0 = Instant::now();
    let (mut t, c, ids) = delivered(2, t0);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(1000)));
    // Registered already at that instant: nothing new to register.
    assert_eq!(ch.timer_to_schedule(), None);
    ch.finish(&c, ids[0]).unwrap();
    assert_eq!(ch.timer_to_schedule(), None);
    assert_eq!(ch.process_timers(t0 + ms(999)), 0);
    ch.timer_fired(t0 + ms(1000));
    assert_eq!(
        ch.process_timers(t0 + ms(1000)),
        1,
        "only the unfinished one"
    );
    assert_eq!(ch.timeout_count(), 1);
    assert_eq!(c.in_flight_count(), 0);
    assert_eq!(ch.requeued_count(), 1);
    assert_eq!(ch.timer_to_schedule(), None, "nothing left in flight");
    // Delivered again at 1.5 s: a new deadline at 2.5 s is registered.
    assert_eq!(dispatch(&mut t, "ch", t0 + ms(1500)), 1);
    assert_eq!(chan(&mut t, "ch").timer_to_schedule(), Some(t0 + ms(2500)));
}

#[test]
fn finished_messages_leave_no_timer_behind() {
    let t0 = Instant::now();
    let (mut t, c, ids) = delivered(3, t0);
    let ch = chan(&mut t, "ch");
    for id in ids {
        ch.finish(&c, id).unwrap();
    }
    assert_eq!(ch.timer_to_schedule(), None);
    assert_eq!(ch.next_timer(), None, "stale heap entries pruned");
}

#[test]
fn touch_moves_the_deadline_and_a_visit_reregisters_it() {
    let t0 = Instant::now();
    let (mut t, c, ids) = delivered(1, t0);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(1000)));
    ch.touch(&c, ids[0], t0 + ms(800), ms(15 * 60 * 1000))
        .unwrap();
    // Still registered at 1 s, earlier than the new deadline: nothing to add.
    assert_eq!(ch.timer_to_schedule(), None);
    ch.timer_fired(t0 + ms(1000));
    assert_eq!(ch.process_timers(t0 + ms(1000)), 0);
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(1800)));
    ch.timer_fired(t0 + ms(1800));
    assert_eq!(ch.process_timers(t0 + ms(1800)), 1);
}

#[test]
fn deferred_message_registers_an_earlier_instant() {
    let t0 = Instant::now();
    let (mut t, c, ids) = delivered(2, t0);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(1000)));
    // REQ with 300 ms at 100 ms: due at 400 ms, before the in-flight deadline.
    ch.requeue(&c, ids[0], ms(300), t0 + ms(100)).unwrap();
    assert_eq!(ch.deferred_count(), 1);
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(400)));
    ch.timer_fired(t0 + ms(400));
    assert_eq!(ch.process_timers(t0 + ms(399)), 0);
    assert_eq!(ch.process_timers(t0 + ms(400)), 1);
    assert_eq!(ch.requeued_count(), 1);
    // The channel tracks only its earliest registration, so the in-flight deadline
    // at 1 s is registered again (the queue pops a key once per pass).
    assert_eq!(ch.timer_to_schedule(), Some(t0 + ms(1000)));
    ch.timer_fired(t0 + ms(1000));
    assert_eq!(ch.process_timers(t0 + ms(1000)), 1);
    assert_eq!(ch.timer_to_schedule(), None);
}

#[test]
fn dpub_goes_to_the_deferred_heap_with_its_due_time() {
    let t0 = Instant::now();
    let mut t = topic_with("ch");
    let due = t0 + ms(60_000);
    t.publish([Bytes::from_static(b"later")], Some(due), MQ);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.deferred_count(), 1);
    assert_eq!(ch.timer_to_schedule(), Some(due));
    assert_eq!(ch.process_timers(due - ms(1)), 0);
    assert_eq!(ch.process_timers(due), 1);
}

// ------------------------------------------------------------------------ msg timeout

#[test]
fn timed_out_message_is_requeued_and_redelivered_with_attempts_incremented() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    assert_eq!(
        chan(&mut t, "ch").in_flight(ids[0]).unwrap().msg.attempts,
        1
    );
    assert_eq!(
        chan(&mut t, "ch").process_timers(clk.at(999)),
        0,
        "not before"
    );
    assert_eq!(chan(&mut t, "ch").in_flight_count(), 1);
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(1000)), 1);
    let ch = chan(&mut t, "ch");
    assert_eq!((ch.in_flight_count(), ch.requeued_count()), (0, 1));
    assert_eq!(ch.timeout_count(), 1);
    assert_eq!(c.in_flight_count(), 0, "the owner's in_flight goes down");
    assert_eq!(dispatch(&mut t, "ch", clk.at(1001)), 1);
    let f = frames(&c);
    assert_eq!(
        (f[0].id, f[0].attempts, f[0].body.as_str()),
        (ids[0], 2, "m0")
    );
}

#[test]
fn msg_timeout_is_the_clients_own() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 10, 5000);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 1);
    dispatch(&mut t, "ch", clk.at(0));
    let id = frames(&c)[0].id;
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.in_flight(id).unwrap().deadline, clk.at(5000));
    assert_eq!(ch.process_timers(clk.at(4999)), 0);
    assert_eq!(ch.process_timers(clk.at(5000)), 1);
}

#[test]
fn a_timeout_is_not_a_requeue() {
    let clk = Clock::new();
    let (mut t, c, _) = delivered(2, clk.at(0));
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.process_timers(clk.at(1000)), 2);
    assert_eq!((ch.timeout_count(), ch.requeue_count()), (2, 0));
    assert_eq!(c.requeue_count(), 0);
    assert_eq!(
        ch.message_count(),
        2,
        "timeouts do not add to message_count"
    );
}

#[test]
fn timed_out_messages_are_requeued_in_deadline_order() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 1);
    dispatch(&mut t, "ch", clk.at(200));
    publish(&mut t, 1, 1);
    dispatch(&mut t, "ch", clk.at(100));
    // m1 was delivered "earlier" (100 ms), so its deadline comes first.
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(1150)), 1);
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(1200)), 1);
    frames(&c);
    dispatch(&mut t, "ch", clk.at(1300));
    assert_eq!(bodies(&frames(&c)), ["m1", "m0"]);
}

// ------------------------------------------------------------------------------ TOUCH

#[test]
fn touch_resets_the_deadline_to_now_plus_msg_timeout() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.touch(&c, ids[0], clk.at(800), ms(900_000)).unwrap();
    assert_eq!(ch.in_flight(ids[0]).unwrap().deadline, clk.at(1800));
    assert_eq!(
        ch.process_timers(clk.at(1000)),
        0,
        "the old deadline is gone"
    );
    assert_eq!(ch.process_timers(clk.at(1799)), 0);
    assert_eq!(ch.process_timers(clk.at(1800)), 1);
    assert_eq!(ch.timeout_count(), 1);
}

#[test]
fn touch_never_extends_past_delivery_plus_max_msg_timeout() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    // max-msg-timeout 1.5 s: a TOUCH at 0.9 s would give 1.9 s, capped at 1.5 s.
    ch.touch(&c, ids[0], clk.at(900), ms(1500)).unwrap();
    assert_eq!(ch.in_flight(ids[0]).unwrap().deadline, clk.at(1500));
    // Touching again later gains nothing more.
    ch.touch(&c, ids[0], clk.at(1400), ms(1500)).unwrap();
    assert_eq!(ch.process_timers(clk.at(1499)), 0);
    assert_eq!(ch.process_timers(clk.at(1500)), 1);
}

#[test]
fn touch_of_a_message_not_in_flight_fails() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    assert_eq!(
        ch.touch(&c, MessageId(ids[0].0 + 99), clk.at(10), ms(900_000)),
        Err(InFlightError::NotInFlight)
    );
    // Timed out: no longer in flight either.
    ch.process_timers(clk.at(1000));
    assert_eq!(
        ch.touch(&c, ids[0], clk.at(1001), ms(900_000)),
        Err(InFlightError::NotInFlight)
    );
}

#[test]
fn touch_of_another_clients_message_fails_and_keeps_its_deadline() {
    let clk = Clock::new();
    let (mut t, _c, ids) = delivered(1, clk.at(0));
    let other = client(2);
    let ch = chan(&mut t, "ch");
    assert_eq!(
        ch.touch(&other, ids[0], clk.at(500), ms(900_000)),
        Err(InFlightError::NotOwner)
    );
    assert_eq!(ch.in_flight(ids[0]).unwrap().deadline, clk.at(1000));
}

// -------------------------------------------------------------------------------- REQ

#[test]
fn req_zero_puts_the_message_back_at_once() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(10)).unwrap();
    assert_eq!((ch.in_flight_count(), ch.deferred_count()), (0, 0));
    assert_eq!(depth(&t, "ch"), 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(10)), 1);
    let f = frames(&c);
    assert_eq!((f[0].id, f[0].attempts), (ids[0], 2));
}

#[test]
fn req_with_a_delay_defers_until_due_and_not_before() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    chan(&mut t, "ch")
        .requeue(&c, ids[0], ms(5000), clk.at(100))
        .unwrap();
    assert_eq!(chan(&mut t, "ch").deferred_count(), 1);
    assert_eq!(depth(&t, "ch"), 0, "deferred messages are not in depth");
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(5099)), 0);
    assert_eq!(
        dispatch(&mut t, "ch", clk.at(5099)),
        0,
        "not before it is due"
    );
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(5100)), 1);
    assert_eq!(chan(&mut t, "ch").deferred_count(), 0);
    assert_eq!(dispatch(&mut t, "ch", clk.at(5100)), 1);
    assert_eq!(frames(&c)[0].attempts, 2);
}

#[test]
fn deferred_messages_come_due_in_due_order() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(3, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], ms(3000), clk.at(0)).unwrap();
    ch.requeue(&c, ids[1], ms(1000), clk.at(0)).unwrap();
    ch.requeue(&c, ids[2], ms(2000), clk.at(0)).unwrap();
    assert_eq!(ch.process_timers(clk.at(1000)), 1);
    assert_eq!(ch.process_timers(clk.at(2500)), 1);
    assert_eq!(ch.process_timers(clk.at(3000)), 1);
    dispatch(&mut t, "ch", clk.at(3000));
    assert_eq!(bodies(&frames(&c)), ["m1", "m2", "m0"]);
}

#[test]
fn req_counts_on_channel_and_client_delayed_or_not() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(2, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(0)).unwrap();
    ch.requeue(&c, ids[1], ms(100), clk.at(0)).unwrap();
    assert_eq!(ch.requeue_count(), 2);
    assert_eq!(ch.timeout_count(), 0);
    assert_eq!((c.requeue_count(), c.in_flight_count()), (2, 0));
}

#[test]
fn req_of_a_message_not_in_flight_or_not_owned_fails_and_changes_nothing() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let other = client(2);
    let ch = chan(&mut t, "ch");
    assert_eq!(
        ch.requeue(&c, MessageId(12345), Duration::ZERO, clk.at(0)),
        Err(InFlightError::NotInFlight)
    );
    assert_eq!(
        ch.requeue(&other, ids[0], Duration::ZERO, clk.at(0)),
        Err(InFlightError::NotOwner)
    );
    assert_eq!((ch.in_flight_count(), ch.requeue_count()), (1, 0));
    assert_eq!((c.in_flight_count(), other.requeue_count()), (1, 0));
}

#[test]
fn req_timeout_is_clamped_to_zero_and_max_req_timeout() {
    let max = ms(3_600_000);
    assert_eq!(clamp_req_timeout(0, max), (Duration::ZERO, false));
    assert_eq!(clamp_req_timeout(1500, max), (ms(1500), false));
    assert_eq!(clamp_req_timeout(3_600_000, max), (max, false));
    assert_eq!(clamp_req_timeout(3_600_001, max), (max, true));
    assert_eq!(clamp_req_timeout(i64::MAX, max), (max, true));
    assert_eq!(clamp_req_timeout(-1, max), (Duration::ZERO, true));
}

// ------------------------------------------------------------------ deferred publishes

#[test]
fn dpub_is_delivered_at_its_due_time_and_not_before() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    let due = Instant::now() + ms(60_000);
    t.publish([Bytes::from_static(b"later")], Some(due), MQ);
    publish(&mut t, 0, 1);
    assert_eq!(depth(&t, "ch"), 1, "only the undeferred one is ready");
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 1);
    let f = frames(&c);
    assert_eq!(bodies(&f), ["m0"]);
    chan(&mut t, "ch").finish(&c, f[0].id).unwrap();
    assert_eq!(chan(&mut t, "ch").process_timers(due - ms(1)), 0);
    assert_eq!(dispatch(&mut t, "ch", due - ms(1)), 0);
    assert_eq!(chan(&mut t, "ch").process_timers(due), 1);
    assert_eq!(dispatch(&mut t, "ch", due), 1);
    let f = frames(&c);
    assert_eq!((f[0].body.as_str(), f[0].attempts), ("later", 1));
}

#[test]
fn a_record_deferred_in_the_past_is_delivered_at_once() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    t.publish([Bytes::from_static(b"due")], Some(clk.at(0)), MQ);
    assert_eq!(chan(&mut t, "ch").deferred_count(), 0);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 1);
}

// ------------------------------------------------------------------------ RDY windows

#[test]
fn no_more_in_flight_than_rdy_and_the_window_is_not_used_up() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 2, 1000);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 5);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 2);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 0, "window full");
    assert_eq!(c.in_flight_count(), 2);
    assert!(!c.is_ready());
    let ids: Vec<_> = frames(&c).iter().map(|f| f.id).collect();
    chan(&mut t, "ch").finish(&c, ids[0]).unwrap();
    assert!(
        c.is_ready(),
        "a FIN opens the window again without a new RDY"
    );
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 1);
    assert_eq!(chan(&mut t, "ch").in_flight_count(), 2);
    assert_eq!(depth(&t, "ch"), 2);
}

#[test]
fn rdy_zero_stops_delivery() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 0, 1000);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 3);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 0);
    assert_eq!(depth(&t, "ch"), 3);
    c.set_ready_count(1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 1);
    c.set_ready_count(0);
    frames(&c);
    chan(&mut t, "ch")
        .requeue(&c, MessageId(0), Duration::ZERO, clk.at(2))
        .ok();
    assert_eq!(dispatch(&mut t, "ch", clk.at(3)), 0);
    assert!(frames(&c).is_empty());
}

#[test]
fn lowering_rdy_below_in_flight_waits_until_in_flight_drops_below_it() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(3, clk.at(0));
    publish(&mut t, 3, 2);
    c.set_ready_count(2);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 0);
    chan(&mut t, "ch").finish(&c, ids[0]).unwrap();
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 0, "2 in flight, RDY 2");
    chan(&mut t, "ch").finish(&c, ids[1]).unwrap();
    assert_eq!(dispatch(&mut t, "ch", clk.at(3)), 1);
}

#[test]
fn ready_clients_take_turns() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let (a, b) = (client(1), client(2));
    sub(&mut t, "ch", &a);
    sub(&mut t, "ch", &b);
    publish(&mut t, 0, 4);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 4);
    assert_eq!(bodies(&frames(&a)), ["m0", "m2"]);
    assert_eq!(bodies(&frames(&b)), ["m1", "m3"]);
}

#[test]
fn a_client_that_is_not_subscribed_or_closed_gets_nothing() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 1);
    c.set_state(ClientState::Closing);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 0);
    c.set_state(ClientState::Subscribed);
    c.kill();
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 0);
    assert_eq!(depth(&t, "ch"), 1);
}

/// Publishes `n` messages of `size` bytes (the first 8 bytes number them).
fn publish_big(t: &mut Topic, n: usize, size: usize) {
    t.publish(
        (0..n).map(|i| {
            let mut b = vec![b'x'; size];
            b[..8].copy_from_slice(format!("{i:08}").as_bytes());
            Bytes::from(b)
        }),
        None,
        MQ,
    );
}

#[test]
fn a_client_whose_output_is_not_written_gets_no_more_until_it_drains() {
    // A consumer that does not read: its RDY would take every message, but delivery
    // stops once its unwritten output reaches the high-water mark (nsqd: messagePump
    // blocked in a write), and the messages go to the other consumer instead.
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let (stuck, other) = (client_with(1, 2500, 60_000), client_with(2, 1, 60_000));
    sub(&mut t, "ch", &stuck);
    sub(&mut t, "ch", &other);
    const BIG: usize = 1 << 20;
    publish_big(&mut t, 10, BIG);
    assert!(BIG > stuck.out_high_water());
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 2);
    assert_eq!(
        stuck.in_flight_count(),
        1,
        "the first message goes out at once, whatever its size"
    );
    assert!(stuck.output_full());
    assert!(!stuck.resume_delivery(), "nothing written yet");
    assert_eq!(depth(&t, "ch"), 8, "the rest stays in the channel");
    // The other consumer keeps getting messages while the stuck one holds one.
    let id = frames(&other)[0].id;
    chan(&mut t, "ch").finish(&other, id).unwrap();
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 1);
    assert_eq!((stuck.in_flight_count(), other.in_flight_count()), (1, 1));
    // The writer takes the buffer and blocks in the write: still pending output.
    let taken = std::mem::take(&mut *stuck.outbox().buf_mut());
    stuck.outbox().set_writing(taken.len());
    assert_eq!(stuck.pending_out(), taken.len());
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 0);
    // The socket took it: delivery resumes, once.
    stuck.outbox().set_writing(0);
    assert!(stuck.resume_delivery());
    assert!(!stuck.resume_delivery());
    assert_eq!(dispatch(&mut t, "ch", clk.at(3)), 1);
    assert_eq!(stuck.in_flight_count(), 2);
    assert_eq!(depth(&t, "ch"), 6);
}

#[test]
fn small_messages_fill_the_output_up_to_the_high_water_mark() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 2500, 60_000);
    sub(&mut t, "ch", &c);
    const SIZE: usize = 1000;
    publish_big(&mut t, 2000, SIZE);
    let hw = c.out_high_water();
    let n = dispatch(&mut t, "ch", clk.at(0)) as usize;
    // Frames of 4 + 4 + 26 + SIZE bytes, until the first one that reaches the mark.
    assert_eq!(n, hw.div_ceil(SIZE + 34));
    assert!(c.pending_out() >= hw && c.pending_out() < hw + SIZE + 34);
    assert_eq!(depth(&t, "ch"), 2000 - n as u64);
    // A reading consumer: every drain lets the next batch through.
    frames(&c);
    assert!(c.resume_delivery());
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)) as usize, n);
}

// ---------------------------------------------------------------------- topic backlog

#[test]
fn the_first_channel_takes_the_topics_backlog_later_ones_only_new_messages() {
    let clk = Clock::new();
    let mut t = Topic::new("t", 1);
    publish(&mut t, 0, 3);
    assert_eq!(t.depth(), 3, "no channel: the messages wait in the topic");
    t.create_channel("first", MQ);
    assert_eq!(t.depth(), 0);
    assert_eq!(depth(&t, "first"), 3);
    assert_eq!(t.channels["first"].message_count(), 3);
    t.create_channel("second", MQ);
    assert_eq!(depth(&t, "second"), 0);
    publish(&mut t, 3, 1);
    assert_eq!((depth(&t, "first"), depth(&t, "second")), (4, 1));
    let c = client(1);
    sub(&mut t, "second", &c);
    dispatch(&mut t, "second", clk.at(0));
    assert_eq!(bodies(&frames(&c)), ["m3"]);
}

#[test]
fn without_channels_messages_pile_up_in_the_topic_again() {
    let mut t = topic_with("ch");
    publish(&mut t, 0, 2);
    t.channels.remove("ch");
    publish(&mut t, 2, 3);
    assert_eq!(t.depth(), 3);
    t.create_channel("new", MQ);
    assert_eq!((t.depth(), depth(&t, "new")), (0, 3));
}

#[test]
fn a_paused_topic_keeps_its_messages_until_unpaused() {
    let mut t = topic_with("ch");
    t.paused = true;
    publish(&mut t, 0, 2);
    assert_eq!((t.depth(), depth(&t, "ch")), (2, 0));
    t.paused = false;
    t.pump(MQ);
    assert_eq!((t.depth(), depth(&t, "ch")), (0, 2));
}

// ------------------------------------------------------------------ #ephemeral overflow

#[test]
fn an_ephemeral_channel_drops_the_newest_beyond_mem_queue_size() {
    // nsqd: a message put into a full ephemeral channel is discarded.
    let clk = Clock::new();
    let mut t = Topic::new("t", 1);
    t.create_channel("c#ephemeral", 3);
    let c = client(1);
    sub(&mut t, "c#ephemeral", &c);
    c.set_ready_count(0);
    t.publish((0..5).map(|i| Bytes::from(format!("m{i}"))), None, 3);
    assert_eq!(depth(&t, "c#ephemeral"), 3);
    // Later publishes find it full too; the dropped records leave memory.
    t.publish((5..8).map(|i| Bytes::from(format!("m{i}"))), None, 3);
    assert_eq!(depth(&t, "c#ephemeral"), 3);
    assert_eq!(
        t.low_watermark(),
        0,
        "the kept messages hold their sequences"
    );
    c.set_ready_count(10);
    assert_eq!(dispatch(&mut t, "c#ephemeral", clk.at(0)), 3);
    assert_eq!(bodies(&frames(&c)), ["m0", "m1", "m2"]);
    // Once there is room, new messages are taken again, after the kept ones.
    t.publish([Bytes::from("m8")], None, 3);
    assert_eq!(depth(&t, "c#ephemeral"), 1);
}

#[test]
fn an_ephemeral_channel_that_overflows_keeps_deferred_messages_and_order() {
    let clk = Clock::new();
    let mut t = Topic::new("t", 1);
    t.create_channel("c#ephemeral", 2);
    let c = client(1);
    sub(&mut t, "c#ephemeral", &c);
    c.set_ready_count(0);
    t.publish([Bytes::from("a")], None, 2);
    t.publish([Bytes::from("later")], Some(clk.at(0) + ms(60_000)), 2);
    t.publish((0..3).map(|i| Bytes::from(format!("n{i}"))), None, 2);
    let ch = chan(&mut t, "c#ephemeral");
    assert_eq!(ch.deferred_count(), 1);
    assert_eq!(depth(&t, "c#ephemeral"), 2);
    c.set_ready_count(10);
    assert_eq!(dispatch(&mut t, "c#ephemeral", clk.at(0)), 2);
    assert_eq!(bodies(&frames(&c)), ["a", "n0"]);
    assert_eq!(depth(&t, "c#ephemeral"), 0);
}

#[test]
fn a_full_ephemeral_channel_drops_messages_that_come_back() {
    // nsqd: a REQ'd, timed-out or due deferred message is put into the channel again,
    // and a full ephemeral channel discards it.
    let clk = Clock::new();
    let mut t = Topic::new("t", 1);
    t.create_channel("c#ephemeral", 3);
    let c = client(1);
    sub(&mut t, "c#ephemeral", &c);
    c.set_ready_count(3);
    t.publish((0..3).map(|i| Bytes::from(format!("a{i}"))), None, 3);
    assert_eq!(dispatch(&mut t, "c#ephemeral", clk.at(0)), 3);
    let ids: Vec<_> = frames(&c).iter().map(|f| f.id).collect();
    c.set_ready_count(0);
    t.publish((0..5).map(|i| Bytes::from(format!("m{i}"))), None, 3);
    assert_eq!(depth(&t, "c#ephemeral"), 3);
    let ch = chan(&mut t, "c#ephemeral");
    // REQ 0 into the full channel: dropped.
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(1)).unwrap();
    // REQ with a delay: deferred, then dropped when it falls due.
    ch.requeue(&c, ids[1], ms(100), clk.at(1)).unwrap();
    assert_eq!(ch.deferred_count(), 1);
    assert_eq!(ch.process_timers(clk.at(200)), 0);
    assert_eq!(ch.deferred_count(), 0);
    // The last one times out into the full channel: dropped.
    assert_eq!(ch.process_timers(clk.at(120_000)), 0);
    assert_eq!(ch.in_flight_count(), 0);
    assert_eq!(depth(&t, "c#ephemeral"), 3);
    c.set_ready_count(10);
    assert_eq!(dispatch(&mut t, "c#ephemeral", clk.at(120_001)), 3);
    let fs = frames(&c);
    assert_eq!(bodies(&fs), ["m0", "m1", "m2"]);
    // With room, a REQ is kept.
    let id = fs[2].id;
    let ch = chan(&mut t, "c#ephemeral");
    ch.requeue(&c, id, Duration::ZERO, clk.at(120_002)).unwrap();
    assert_eq!(depth(&t, "c#ephemeral"), 1);
}

#[test]
fn a_durable_channel_keeps_what_exceeds_mem_queue_size() {
    let mut t = Topic::new("t", 1);
    t.create_channel("c", 3);
    t.publish((0..5).map(|i| Bytes::from(format!("m{i}"))), None, 3);
    assert_eq!(depth(&t, "c"), 5);
}

#[test]
fn an_ephemeral_topic_without_channels_drops_beyond_mem_queue_size() {
    let mut t = Topic::new("t#ephemeral", 1);
    let (n, _) = t.publish((0..5).map(|i| Bytes::from(format!("m{i}"))), None, 3);
    assert_eq!((n, t.depth(), t.message_count()), (3, 3, 5));
}

// ------------------------------------------------------------------------------ empty

#[test]
fn empty_clears_in_flight_deferred_requeued_and_backlog() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(3, clk.at(0));
    publish(&mut t, 3, 2);
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(1)).unwrap();
    ch.requeue(&c, ids[1], ms(500), clk.at(1)).unwrap();
    assert_eq!((ch.in_flight_count(), ch.deferred_count()), (1, 1));
    assert_eq!(depth(&t, "ch"), 3);
    t.channels.get_mut("ch").unwrap().empty(&t.log);
    let ch = &t.channels["ch"];
    assert_eq!(ch.depth(&t.log), 0);
    assert_eq!((ch.in_flight_count(), ch.deferred_count()), (0, 0));
    assert_eq!(c.in_flight_count(), 0, "consumers' in_flight zeroed");
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.next_timer(), None);
    assert_eq!(ch.process_timers(clk.at(10_000)), 0);
    assert_eq!(ch.finish(&c, ids[2]), Err(InFlightError::NotInFlight));
}

#[test]
fn after_empty_new_messages_are_delivered() {
    let clk = Clock::new();
    let (mut t, c, _) = delivered(2, clk.at(0));
    t.channels.get_mut("ch").unwrap().empty(&t.log);
    publish(&mut t, 2, 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 1);
    assert_eq!(bodies(&frames(&c)), ["m2"]);
}

// ------------------------------------------------------------------------ delete

#[test]
fn close_clients_closes_every_subscriber() {
    let mut t = topic_with("ch");
    let (a, b) = (client(1), client(2));
    sub(&mut t, "ch", &a);
    sub(&mut t, "ch", &b);
    let ch = chan(&mut t, "ch");
    ch.close_clients();
    assert!(ch.clients().is_empty());
    for c in [&a, &b] {
        assert_eq!(c.state(), ClientState::Closing);
        assert!(c.is_closed());
        assert!(!c.is_ready());
    }
}

// ------------------------------------------------------------------------------ pause

#[test]
fn a_paused_channel_delivers_nothing_and_accumulates() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    chan(&mut t, "ch").set_paused(true);
    publish(&mut t, 1, 2);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 0);
    assert_eq!(depth(&t, "ch"), 2);
    // In-flight messages are unaffected.
    chan(&mut t, "ch").finish(&c, ids[0]).unwrap();
    chan(&mut t, "ch").set_paused(false);
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 2);
    assert_eq!(bodies(&frames(&c)), ["m1", "m2"]);
}

#[test]
fn in_flight_times_out_while_paused_but_waits_for_unpause() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    chan(&mut t, "ch").set_paused(true);
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(1000)), 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1001)), 0);
    assert_eq!(depth(&t, "ch"), 1);
    chan(&mut t, "ch").set_paused(false);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1002)), 1);
    let f = frames(&c);
    assert_eq!((f[0].id, f[0].attempts), (ids[0], 2));
}

#[test]
fn a_held_channel_delivers_nothing_until_released_and_is_not_paused() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    chan(&mut t, "ch").set_held(true);
    publish(&mut t, 1, 2);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1)), 0);
    assert_eq!(chan(&mut t, "ch").room(), 0);
    // What is in flight is finished as usual, and nsqd's pause is not touched.
    chan(&mut t, "ch").finish(&c, ids[0]).unwrap();
    assert_eq!(chan(&mut t, "ch").in_flight_count(), 0);
    assert!(!chan(&mut t, "ch").is_paused());
    chan(&mut t, "ch").set_held(false);
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 2);
    assert_eq!(bodies(&frames(&c)), ["m1", "m2"]);
}

#[test]
fn a_channel_made_while_its_topic_is_held_starts_held() {
    let clk = Clock::new();
    let mut t = topic_with("old");
    t.deliveries_held = true;
    t.create_channel("new", MQ);
    let c = client(1);
    sub(&mut t, "new", &c);
    publish(&mut t, 1, 2);
    assert_eq!(dispatch(&mut t, "new", clk.at(1)), 0);
    assert!(!chan(&mut t, "new").is_paused());
    chan(&mut t, "new").set_held(false);
    assert_eq!(dispatch(&mut t, "new", clk.at(2)), 2);
    assert_eq!(bodies(&frames(&c)), ["m1", "m2"]);
}

// -------------------------------------------------------------------------------- FIN

#[test]
fn fin_of_an_unknown_id_fails() {
    let clk = Clock::new();
    let (mut t, c, _) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    assert_eq!(
        ch.finish(&c, MessageId(0xdead)),
        Err(InFlightError::NotInFlight)
    );
    assert_eq!(ch.in_flight_count(), 1);
    assert_eq!(InFlightError::NotInFlight.to_string(), "ID not in flight");
}

#[test]
fn fin_of_another_clients_message_fails_and_the_owner_can_still_fin() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let other = client(2);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.finish(&other, ids[0]), Err(InFlightError::NotOwner));
    assert_eq!(
        InFlightError::NotOwner.to_string(),
        "client does not own message"
    );
    assert_eq!(other.finish_count(), 0);
    ch.finish(&c, ids[0]).unwrap();
    assert_eq!(
        ch.finish(&c, ids[0]),
        Err(InFlightError::NotInFlight),
        "twice"
    );
}

#[test]
fn fin_counts_and_frees_a_slot() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(2, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.finish(&c, ids[1]).unwrap();
    assert_eq!((c.finish_count(), c.in_flight_count()), (1, 1));
    assert_eq!(ch.in_flight_count(), 1);
    assert!(ch.in_flight(ids[1]).is_none());
    assert_eq!(ch.requeue_count(), 0);
}

// ---------------------------------------------------------------- client disconnect

#[test]
fn a_gone_clients_in_flight_times_out_then_goes_to_another_client() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let other = client(2);
    sub(&mut t, "ch", &other);
    chan(&mut t, "ch").remove_client(c.id());
    // Not requeued at once (nsqd): still in flight until its timeout.
    assert_eq!(chan(&mut t, "ch").in_flight_count(), 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(10)), 0);
    assert_eq!(
        chan(&mut t, "ch").finish(&other, ids[0]),
        Err(InFlightError::NotOwner)
    );
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(1000)), 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1000)), 1);
    let f = frames(&other);
    assert_eq!((f[0].id, f[0].attempts), (ids[0], 2));
    assert_eq!(chan(&mut t, "ch").clients().len(), 1);
}

#[test]
fn add_client_twice_keeps_one_and_the_consumer_limit_refuses_more() {
    let mut t = topic_with("ch");
    let (a, b) = (client(1), client(2));
    let ch = chan(&mut t, "ch");
    ch.add_client(a.clone(), 1).unwrap();
    ch.add_client(a.clone(), 1).unwrap();
    assert_eq!(ch.clients().len(), 1);
    let e = ch.add_client(b.clone(), 1).unwrap_err();
    assert_eq!(e, ConsumerLimit { max: 1 });
    assert_eq!(e.to_string(), "exceeds limit of 1");
    ch.add_client(b, 0).unwrap();
    assert_eq!(ch.clients().len(), 2, "0 = unlimited");
}

// --------------------------------------------------------------------------- attempts

#[test]
fn attempts_grow_by_one_per_delivery() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let mut now = 0;
    for want in 2..=5u16 {
        chan(&mut t, "ch")
            .requeue(&c, ids[0], Duration::ZERO, clk.at(now))
            .unwrap();
        now += 10;
        dispatch(&mut t, "ch", clk.at(now));
        assert_eq!(frames(&c)[0].attempts, want);
    }
    // A timeout counts the same as a REQ.
    chan(&mut t, "ch").process_timers(clk.at(now + 1000));
    dispatch(&mut t, "ch", clk.at(now + 1000));
    assert_eq!(frames(&c)[0].attempts, 6);
}

// --------------------------------------------------------------------------- ordering

#[test]
fn messages_go_out_in_publish_order() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 10);
    dispatch(&mut t, "ch", clk.at(0));
    let f = frames(&c);
    let want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(
        bodies(&f),
        want.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(f.windows(2).all(|w| w[0].id < w[1].id), "ids ascend");
}

#[test]
fn requeued_messages_go_before_unread_ones() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 1, 1000);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 3);
    dispatch(&mut t, "ch", clk.at(0));
    let id = frames(&c)[0].id;
    chan(&mut t, "ch")
        .requeue(&c, id, Duration::ZERO, clk.at(1))
        .unwrap();
    dispatch(&mut t, "ch", clk.at(2));
    assert_eq!(bodies(&frames(&c)), ["m0"]);
}

// ------------------------------------------------------------------ depth and counters

#[test]
fn depth_counts_ready_messages_only() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 3, 1000);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 5);
    assert_eq!(depth(&t, "ch"), 5);
    dispatch(&mut t, "ch", clk.at(0));
    assert_eq!(depth(&t, "ch"), 2, "in flight is not depth");
    let ids: Vec<_> = frames(&c).iter().map(|f| f.id).collect();
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], ms(100), clk.at(1)).unwrap();
    assert_eq!(depth(&t, "ch"), 2, "deferred is not depth");
    chan(&mut t, "ch")
        .requeue(&c, ids[1], Duration::ZERO, clk.at(1))
        .unwrap();
    assert_eq!(depth(&t, "ch"), 3, "requeued is depth");
    let ch = &t.channels["ch"];
    assert_eq!((ch.in_flight_count(), ch.deferred_count()), (1, 1));
    assert_eq!(ch.pending_count(), 3);
}

#[test]
fn message_and_client_counters() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 3);
    publish(&mut t, 3, 2);
    assert_eq!(t.channels["ch"].message_count(), 5);
    dispatch(&mut t, "ch", clk.at(0));
    assert_eq!((c.message_count(), c.in_flight_count()), (5, 5));
    let id = frames(&c)[0].id;
    chan(&mut t, "ch")
        .requeue(&c, id, Duration::ZERO, clk.at(1))
        .unwrap();
    dispatch(&mut t, "ch", clk.at(2));
    assert_eq!(c.message_count(), 6, "a redelivery counts for the client");
    assert_eq!(
        t.channels["ch"].message_count(),
        5,
        "but not for the channel"
    );
}

// --- disk read-ahead ---

/// Records `from..to` as read back from the store, each with a 1 KiB body.
fn disk_records(from: u64, to: u64) -> Vec<crate::topic::Record> {
    (from..to)
        .map(|seq| crate::topic::Record {
            seq,
            id: MessageId(seq),
            timestamp: 0,
            defer_until: None,
            body: Bytes::from(vec![b'x'; 1024]),
        })
        .collect()
}

#[test]
fn no_read_ahead_without_a_client_that_can_take_messages() {
    // The cursor is below the memory tail (base 100): messages 0..100 are on disk only.
    let mut ch = Channel::new("c", 0);
    assert_eq!(ch.disk_read_from(100), None, "no client: nothing is read");
    let c = client_with(1, 0, 1000);
    ch.add_client(c.clone(), 0).unwrap();
    assert_eq!(ch.disk_read_from(100), None, "RDY 0: nothing is read");
    c.set_ready_count(3);
    assert_eq!(ch.room(), 3);
    assert_eq!(
        ch.disk_read_from(100),
        Some((0, 3)),
        "a read sized to what the client can take"
    );
    ch.flags.paused = true;
    assert_eq!(ch.disk_read_from(100), None, "paused: nothing is read");
    ch.flags.paused = false;
    // Records held for a client that stops taking them are let go; the cursor stays,
    // so the next read starts where delivery stopped.
    ch.push_disk(disk_records(0, 3));
    assert_eq!(
        ch.disk_read_from(100),
        None,
        "buffered as many as it can take"
    );
    c.set_ready_count(0);
    let log = Log::default();
    assert_eq!(ch.dispatch(&log, Instant::now()), 0);
    assert_eq!(ch.disk_buffered(), 0);
    assert_eq!(ch.disk_buffered_bytes(), 0);
    assert_eq!(ch.cursor, 0);
    c.set_ready_count(1);
    assert_eq!(ch.disk_read_from(100), Some((0, 1)));
    // A consumer with all of its RDY in flight still takes messages (each FIN makes room
    // for the next one): its read-ahead stays, sized to its RDY, so a backlog is not
    // read again one record per FIN.
    c.set_ready_count(3);
    c.in_flight.set(3);
    assert_eq!(ch.room(), 3);
    ch.push_disk(disk_records(0, 3));
    ch.dispatch(&log, Instant::now());
    assert_eq!(ch.disk_buffered(), 3, "kept for the busy consumer");
}

#[test]
fn read_ahead_is_dropped_when_the_last_client_leaves() {
    let mut ch = Channel::new("c", 0);
    let c = client_with(1, 10, 1000);
    ch.add_client(c.clone(), 0).unwrap();
    ch.push_disk(disk_records(0, 5));
    assert_eq!(ch.disk_buffered_bytes(), 5 * 1024);
    ch.remove_client(c.id);
    let log = Log::default();
    ch.dispatch(&log, Instant::now());
    assert_eq!(
        ch.disk_buffered(),
        0,
        "no client: nothing read from disk held"
    );
    assert_eq!(ch.disk_read_from(100), None);
}

/// A log holding sequences 10..20 in memory (15 lost), all pumped.
fn log_10_to_20() -> Log {
    let rec = |seq: u64| crate::topic::Record {
        seq,
        id: MessageId(seq),
        timestamp: 0,
        defer_until: None,
        body: Bytes::from(format!("m{seq}")),
    };
    let mut log = Log::default();
    log.restore(10, 20, (10..20).filter(|s| *s != 15).map(rec));
    log.pumped = 20;
    log
}

#[test]
fn channel_seek_drops_requeued_and_deferred() {
    let log = log_10_to_20();
    let msg = |seq: u64| log.get(seq).map(|r| r.message()).unwrap();
    let mut ch = Channel::new("c", 18);
    ch.ready.requeued.push_back(msg(11));
    ch.ready.requeued.push_back(msg(19));
    ch.defer(msg(12), Instant::now());
    ch.defer_published(msg(19), Instant::now());
    assert_eq!(ch.depth(&log), 2 - 1 + 2);
    ch.seek(12);
    assert_eq!(ch.cursor, 12);
    assert!(ch.ready.requeued.is_empty() && ch.deferred.len() == 0 && ch.skip.is_empty());
    assert_eq!(ch.depth(&log), 8);
    assert_eq!(ch.low_watermark(), 12);
    ch.seek(20);
    assert_eq!(ch.depth(&log), 0);
}

/// Topology-aware consumption (crate::topology): a zone-local consumer gets every
/// message while it has RDY, then a region-local one, then anyone; the channel counts
/// each delivery by rank. Unranked clients (the experiment off) share round robin.
#[test]
fn topology_rank_prefers_zone_then_region_then_anyone() {
    use crate::topology::{RANK_GLOBAL, RANK_REGION, RANK_ZONE};
    let t0 = Clock::new().at(0);
    let mut t = topic_with("ch");
    let ranked = |id, rdy, rank| {
        let c = client_with(id, rdy, 1000);
        c.settings_mut().topology.rank = rank;
        c
    };
    // Subscribed farthest first, so round robin alone would start with the global one.
    let global = ranked(1, 100, RANK_GLOBAL);
    let region = ranked(2, 3, RANK_REGION);
    let zone = ranked(3, 5, RANK_ZONE);
    for c in [&global, &region, &zone] {
        sub(&mut t, "ch", c);
    }
    publish(&mut t, 0, 4);
    assert_eq!(dispatch(&mut t, "ch", t0), 4);
    assert_eq!(bodies(&frames(&zone)), ["m0", "m1", "m2", "m3"]);
    assert!(frames(&region).is_empty() && frames(&global).is_empty());
    // Zone full (RDY 5, 4 in flight + 1): the next goes there, then the region's RDY
    // 3, then the rest to anyone.
    publish(&mut t, 4, 10);
    assert_eq!(dispatch(&mut t, "ch", t0), 10);
    assert_eq!(bodies(&frames(&zone)), ["m4"]);
    assert_eq!(bodies(&frames(&region)), ["m5", "m6", "m7"]);
    assert_eq!(bodies(&frames(&global)).len(), 6);
    let counts = t.channels["ch"].rank_counts();
    assert_eq!(
        (
            counts.zone_local_msg_count,
            counts.region_local_msg_count,
            counts.global_msg_count
        ),
        (5, 3, 6)
    );

    // Without the experiment every client has rank 0: plain round robin, no counts.
    let mut t = topic_with("ch");
    let (a, b) = (client(10), client(11));
    sub(&mut t, "ch", &a);
    sub(&mut t, "ch", &b);
    publish(&mut t, 0, 4);
    assert_eq!(dispatch(&mut t, "ch", t0), 4);
    assert_eq!(bodies(&frames(&a)), ["m0", "m2"]);
    assert_eq!(bodies(&frames(&b)), ["m1", "m3"]);
    assert_eq!(
        t.channels["ch"].rank_counts(),
        crate::topology::RankCounts::default()
    );
}

// ------------------------------------------------------------------------- lag in time

/// The publish timestamp of the record at `seq`.
fn ts(t: &Topic, seq: u64) -> i64 {
    t.log.get(seq).unwrap().timestamp
}

#[test]
fn oldest_unfinished_follows_the_lowest_unfinished_message() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    assert_eq!(t.channels["ch"].oldest_unfinished_timestamp(&t.log), None);
    for i in 0..3 {
        publish(&mut t, i, 1);
    }
    // Waiting at the cursor.
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0))
    );
    let c = client_with(1, 2, 1000);
    sub(&mut t, "ch", &c);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 2);
    let ids: Vec<MessageId> = frames(&c).iter().map(|f| f.id).collect();
    // In flight.
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0))
    );
    chan(&mut t, "ch").finish(&c, ids[1]).unwrap();
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0)),
        "a later FIN leaves the oldest"
    );
    // Deferred by a REQ with a delay: still unfinished.
    chan(&mut t, "ch")
        .requeue(&c, ids[0], ms(5000), clk.at(10))
        .unwrap();
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0))
    );
    assert_eq!(chan(&mut t, "ch").process_timers(clk.at(5010)), 1);
    // Ready again, then delivered with the last one and finished.
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0))
    );
    assert_eq!(dispatch(&mut t, "ch", clk.at(5010)), 2);
    let ids: Vec<MessageId> = frames(&c).iter().map(|f| f.id).collect();
    chan(&mut t, "ch").finish(&c, ids[0]).unwrap();
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 2))
    );
    chan(&mut t, "ch").finish(&c, ids[1]).unwrap();
    assert_eq!(t.channels["ch"].oldest_unfinished_timestamp(&t.log), None);
}

#[test]
fn oldest_unfinished_counts_a_dpub_and_steps_over_it_at_the_cursor() {
    let mut t = topic_with("ch");
    t.publish(
        [Bytes::from_static(b"later")],
        Some(Instant::now() + Duration::from_secs(3600)),
        MQ,
    );
    publish(&mut t, 1, 1);
    assert_eq!(chan(&mut t, "ch").deferred_count(), 1);
    assert_eq!(t.channels["ch"].next_waiting(&t.log), Some(1));
    assert_eq!(
        t.channels["ch"].oldest_unfinished_timestamp(&t.log),
        Some(ts(&t, 0)),
        "the deferred message is the oldest"
    );
    t.channels.get_mut("ch").unwrap().empty(&t.log);
    assert_eq!(t.channels["ch"].oldest_unfinished_timestamp(&t.log), None);
}

#[test]
fn fin_latency_percentiles_measure_delivery_to_fin_on_the_clock() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(100, clk.at(0));
    assert_eq!(t.channels["ch"].fin_latency(clk.at(0)).count, 0);
    chan(&mut t, "ch").start_fin_latency(clk.at(0));
    // 98 FINs after 200 ms, one after 900 ms, one after 3 s.
    for (i, &id) in ids.iter().enumerate() {
        let after = match i {
            98 => 900,
            99 => 3000,
            _ => 200,
        };
        chan(&mut t, "ch").finish_at(&c, id, clk.at(after)).unwrap();
    }
    let l = t.channels["ch"].fin_latency(clk.at(3000));
    assert_eq!(l.count, 100);
    let near = |got: u64, want_ms: u64| {
        let want = want_ms * 1_000_000;
        assert!(got.abs_diff(want) <= want / 50, "{got} ns, want {want} ns");
    };
    near(l.p50, 200);
    near(l.p99, 900);
    near(l.p999, 3000);
    // The window began at the first FIN (200 ms): within two windows of it the FINs
    // count, after that they are gone.
    let w = FIN_LATENCY_WINDOW.as_millis() as u64;
    assert_eq!(t.channels["ch"].fin_latency(clk.at(w + 100)).count, 100);
    assert_eq!(t.channels["ch"].fin_latency(clk.at(2 * w + 3000)).count, 0);
}

// ------------------------------------------------------------------- peek and state

fn peeked_seqs(t: &Topic, ch: &str, count: usize) -> Vec<(u64, u16)> {
    t.channels[ch]
        .peek(&t.log, count, 0)
        .iter()
        .map(|p| (p.seq, p.attempts))
        .collect()
}

#[test]
fn peek_lists_the_delivery_order_and_state_follows_each_message() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    publish(&mut t, 0, 3);
    let ids: Vec<MessageId> = (0..3).map(|s| t.log.get(s).unwrap().id).collect();
    let state =
        |t: &Topic, seq: u64| t.channels["ch"].message_state(&t.log, seq, ids[seq as usize]);
    assert_eq!(peeked_seqs(&t, "ch", 10), [(0, 0), (1, 0), (2, 0)]);
    assert_eq!(peeked_seqs(&t, "ch", 2), [(0, 0), (1, 0)]);
    assert_eq!(state(&t, 0), (MessageState::Waiting, 0));
    let c = client_with(1, 1, 1000);
    sub(&mut t, "ch", &c);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 1);
    assert_eq!(bodies(&frames(&c)), ["m0"]);
    assert_eq!(state(&t, 0), (MessageState::InFlight, 1));
    assert_eq!(
        peeked_seqs(&t, "ch", 10),
        [(1, 0), (2, 0)],
        "in flight is not listed"
    );
    // REQ 0: ready again, listed first with its attempts.
    chan(&mut t, "ch")
        .requeue(&c, ids[0], Duration::ZERO, clk.at(1))
        .unwrap();
    assert_eq!(state(&t, 0), (MessageState::Waiting, 1));
    assert_eq!(peeked_seqs(&t, "ch", 10), [(0, 1), (1, 0), (2, 0)]);
    // Peeking changed nothing: the same order is delivered.
    assert_eq!(depth(&t, "ch"), 3);
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 1);
    assert_eq!(bodies(&frames(&c)), ["m0"]);
    chan(&mut t, "ch")
        .requeue(&c, ids[0], ms(5000), clk.at(3))
        .unwrap();
    assert_eq!(state(&t, 0), (MessageState::Deferred, 2));
    assert_eq!(dispatch(&mut t, "ch", clk.at(3)), 1);
    chan(&mut t, "ch").finish(&c, ids[1]).unwrap();
    assert_eq!(state(&t, 1), (MessageState::Finished, 0));
    assert_eq!(peeked_seqs(&t, "ch", 10), [(2, 0)]);
}

// ------------------------------------------------------------------------ dead letters

#[test]
fn dead_letter_topic_names() {
    assert_eq!(dead_letter_topic("orders").as_deref(), Some("orders.dead"));
    assert_eq!(dead_letter_topic("orders#ephemeral"), None, "ephemeral");
    assert_eq!(dead_letter_topic("orders.dead"), None, "never cascades");
    let long = "x".repeat(60);
    assert_eq!(dead_letter_topic(&long), None, "over 64 characters");
    let fits = "x".repeat(59);
    assert_eq!(dead_letter_topic(&fits), Some(format!("{fits}.dead")));
}

#[test]
fn a_message_that_used_its_attempts_is_held_for_the_dead_letter_topic_not_redelivered() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(3, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.set_max_attempts_flag("t", 2);
    // First failure of each: redelivered (attempts 2).
    for &id in &ids {
        ch.requeue(&c, id, Duration::ZERO, clk.at(1)).unwrap();
    }
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 3);
    assert!(frames(&c).iter().all(|f| f.attempts == 2));
    let ch = chan(&mut t, "ch");
    // Second failure: a REQ with a delay, a REQ 0 and a timeout all bury at once.
    ch.requeue(&c, ids[0], ms(5000), clk.at(3)).unwrap();
    ch.requeue(&c, ids[1], Duration::ZERO, clk.at(3)).unwrap();
    assert_eq!(ch.process_timers(clk.at(2000)), 1, "ids[2] timed out");
    assert_eq!(ch.deferred_count(), 0);
    assert_eq!(ch.dead_waiting_count(), 3);
    assert_eq!(ch.pending_count(), 3, "unfinished until published");
    assert_eq!(ch.dead_count(), 0);
    assert_eq!(
        dispatch(&mut t, "ch", clk.at(3000)),
        0,
        "never delivered again"
    );
    assert_eq!(depth(&t, "ch"), 0);
    let ch = chan(&mut t, "ch");
    assert!(ch.has_dead_letters());
    let dead = ch.take_dead_letters();
    assert!(!ch.has_dead_letters());
    let got: Vec<(MessageId, &[u8], u16)> = dead
        .iter()
        .map(|m| (m.id, &m.body[..], m.attempts))
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[0], &b"m0"[..], 2),
            (ids[1], &b"m1"[..], 2),
            (ids[2], &b"m2"[..], 2)
        ]
    );
    let mut seqs = Vec::new();
    ch.pending_seqs(|s| seqs.push(s));
    assert_eq!(seqs.len(), 3, "checkpointed as pending while publishing");
    // One publish failed: it waits to be taken again; the others are finished.
    ch.dead_letter_failed(ids[1]);
    assert!(ch.dead_lettered(ids[0]));
    assert!(ch.dead_lettered(ids[2]));
    assert!(!ch.dead_lettered(ids[2]), "once");
    assert_eq!((ch.dead_count(), ch.dead_waiting_count()), (2, 1));
    let again = ch.take_dead_letters();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, ids[1]);
    assert!(ch.dead_lettered(ids[1]));
    assert_eq!((ch.dead_count(), ch.pending_count()), (3, 0));
    assert_eq!(ch.low_watermark(), 3, "all finished");
}

#[test]
fn own_max_attempts_overrides_the_flag_and_zero_is_unlimited() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.max_attempts(), 0, "unlimited by default, as nsqd");
    ch.set_max_attempts_flag("t", 1);
    ch.set_own_max_attempts(Some(0));
    assert_eq!(ch.max_attempts(), 0);
    for i in 0..5 {
        let ch = chan(&mut t, "ch");
        ch.requeue(&c, ids[0], Duration::ZERO, clk.at(i)).unwrap();
        assert_eq!(
            dispatch(&mut t, "ch", clk.at(i)),
            1,
            "unlimited: redelivered"
        );
        frames(&c);
    }
    let ch = chan(&mut t, "ch");
    ch.set_own_max_attempts(None);
    assert_eq!(ch.max_attempts(), 1, "follows the flag again");
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(10)).unwrap();
    assert_eq!(ch.dead_waiting_count(), 1);
}

#[test]
fn a_ready_message_past_a_lowered_maximum_is_buried_when_it_would_be_delivered() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(2, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(1)).unwrap();
    ch.requeue(&c, ids[1], Duration::ZERO, clk.at(1)).unwrap();
    ch.set_own_max_attempts(Some(1));
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 0);
    assert!(frames(&c).is_empty());
    assert_eq!(chan(&mut t, "ch").dead_waiting_count(), 2);
}

#[test]
fn a_topic_without_a_dead_letter_topic_ignores_the_flag() {
    let clk = Clock::new();
    let mut t = Topic::new("t.dead", 1);
    t.create_channel_with("ch", MQ, 1);
    let c = client(1);
    sub(&mut t, "ch", &c);
    publish(&mut t, 0, 1);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 1);
    let id = frames(&c)[0].id;
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.max_attempts(), 0);
    ch.requeue(&c, id, Duration::ZERO, clk.at(1)).unwrap();
    assert_eq!(dispatch(&mut t, "ch", clk.at(2)), 1, "redelivered, as nsqd");
    assert_eq!(frames(&c)[0].attempts, 2);
}

#[test]
fn empty_drops_dead_letters_not_yet_published() {
    let clk = Clock::new();
    let (mut t, c, ids) = delivered(1, clk.at(0));
    let ch = chan(&mut t, "ch");
    ch.set_own_max_attempts(Some(1));
    ch.requeue(&c, ids[0], Duration::ZERO, clk.at(1)).unwrap();
    let taken = ch.take_dead_letters();
    assert_eq!(taken.len(), 1);
    t.channels.get_mut("ch").unwrap().empty(&t.log);
    let ch = chan(&mut t, "ch");
    assert_eq!(ch.pending_count(), 0);
    assert!(!ch.dead_lettered(ids[0]), "emptied meanwhile");
    assert_eq!(ch.dead_count(), 0);
}

// --------------------------------------------------------------------------- rate limit

#[test]
fn a_rate_limit_paces_delivery_on_the_injected_clock() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let (a, b) = (client_with(1, 1000, 60_000), client_with(2, 1000, 60_000));
    sub(&mut t, "ch", &a);
    sub(&mut t, "ch", &b);
    publish(&mut t, 0, 1000);
    chan(&mut t, "ch").set_rate_limit(100);
    assert_eq!(chan(&mut t, "ch").rate_limit(), Some(100));
    // The bucket starts with a tenth of a second's worth.
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 10);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 0, "no token left");
    let ch = chan(&mut t, "ch");
    assert_eq!(
        ch.next_timer(),
        Some(clk.at(10)),
        "the next token is 10 ms away"
    );
    assert_eq!(ch.process_timers(clk.at(9)), 0);
    assert_eq!(
        ch.process_timers(clk.at(10)),
        1,
        "the timer pass resumes delivery"
    );
    assert_eq!(dispatch(&mut t, "ch", clk.at(10)), 1);
    // Over two seconds of 10 ms passes: 100 a second across both consumers.
    let mut sent = 0;
    for i in 2..=201 {
        sent += dispatch(&mut t, "ch", clk.at(i * 10));
    }
    assert_eq!(sent, 200);
    // Idle for a minute: the burst is still a tenth of a second's worth.
    assert_eq!(dispatch(&mut t, "ch", clk.at(62_010)), 10);
    let (fa, fb) = (frames(&a).len(), frames(&b).len());
    assert_eq!(fa + fb, 221);
    assert!(fa.abs_diff(fb) <= 1, "round robin: {fa} and {fb}");
    // Removed: what waits goes at once, as far as RDY allows.
    chan(&mut t, "ch").set_rate_limit(0);
    assert_eq!(chan(&mut t, "ch").rate_limit(), None);
    assert_eq!(dispatch(&mut t, "ch", clk.at(62_010)), 779);
}

#[test]
fn a_rate_limited_channel_keeps_what_it_cannot_deliver_yet() {
    let clk = Clock::new();
    let mut t = topic_with("ch");
    let c = client_with(1, 100, 60_000);
    sub(&mut t, "ch", &c);
    chan(&mut t, "ch").set_rate_limit(1);
    publish(&mut t, 0, 5);
    assert_eq!(dispatch(&mut t, "ch", clk.at(0)), 1);
    assert_eq!(depth(&t, "ch"), 4, "waiting, not dropped");
    assert_eq!(chan(&mut t, "ch").next_timer(), Some(clk.at(1000)));
    assert_eq!(dispatch(&mut t, "ch", clk.at(999)), 0);
    assert_eq!(dispatch(&mut t, "ch", clk.at(1000)), 1);
    assert_eq!(bodies(&frames(&c)), vec!["m0", "m1"]);
}

/// A replica taking its leader's channel state: the cursor moves, the messages the
/// leader held in flight are ready again (their records read back), a deferred one
/// waits, and one beyond the cursor is stepped over. A read of the store that ends
/// below its start (records not written yet) drops nothing.
#[test]
fn a_position_from_the_leader_sets_the_cursor_and_the_unfinished_messages() {
    let mut ch = Channel::new("c", 0);
    let later = Instant::now() + Duration::from_secs(3600);
    ch.set_position(
        10,
        vec![
            (3, 1, None),
            (7, 2, None),
            (8, 1, Some(later)),
            (12, 0, Some(later)),
        ],
    );
    assert_eq!(ch.cursor(), 10);
    assert_eq!(ch.low_watermark(), 3);
    let mut seqs = Vec::new();
    ch.pending_seqs(|s| seqs.push(s));
    seqs.sort_unstable();
    assert_eq!(seqs, vec![3, 7, 8, 12]);
    assert_eq!(ch.stepped_over_from(10).collect::<Vec<_>>(), vec![12]);
    // The store can give back nothing at or above 2 yet: both stay ready again.
    assert_eq!(ch.unread_arrived(3, 0, 2, Vec::new()), 0);
    let mut states = Vec::new();
    ch.pending_states(|s, a, due| states.push((s, a, due.is_some())));
    states.sort_unstable();
    assert_eq!(
        states,
        vec![(3, 1, false), (7, 2, false), (8, 1, true), (12, 0, true)]
    );
}
