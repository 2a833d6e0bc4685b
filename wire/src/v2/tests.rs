use super::*;

fn ctx(state: ClientState) -> Context {
    Context {
        state,
        heartbeats_enabled: true,
        limits: Limits {
            max_msg_size: 100,
            max_body_size: 1000,
            max_rdy_count: 50,
            ..Limits::NSQD_DEFAULTS
        },
        eof: false,
    }
}

fn err(buf: &[u8], state: ClientState) -> String {
    let e = decode(buf, &ctx(state)).expect_err("expected an error");
    format!("{} {}", e.code, e.text)
}

fn sized(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

#[test]
fn incomplete_line_and_body_wait() {
    assert_eq!(decode(b"PUB t", &ctx(ClientState::Init)), Ok(None));
    assert_eq!(
        decode(b"PUB t\n\x00\x00", &ctx(ClientState::Init)),
        Ok(None)
    );
    assert_eq!(
        decode(b"PUB t\n\x00\x00\x00\x05hel", &ctx(ClientState::Init)),
        Ok(None)
    );
}

#[test]
fn pub_decodes_body_range() {
    let mut b = b"PUB t\n".to_vec();
    b.extend(sized(b"hello"));
    b.extend_from_slice(b"NOP\n");
    let (cmd, n) = decode(&b, &ctx(ClientState::Init)).unwrap().unwrap();
    assert_eq!(
        cmd,
        Command::Pub {
            topic: "t".into(),
            body: 10..15
        }
    );
    assert_eq!(n, 15);
}

#[test]
fn size_errors_in_nsqd_order() {
    assert_eq!(
        err(b"PUB t\n\x00\x00\x00\x00", ClientState::Init),
        "E_BAD_MESSAGE PUB invalid message body size 0"
    );
    assert_eq!(
        err(b"PUB t\n\x00\x00\x00\x69", ClientState::Init),
        "E_BAD_MESSAGE PUB message too big 105 > 100"
    );
    assert_eq!(
        err(b"PUB t\n\x40\x00\x00\x00", ClientState::Init),
        "E_BAD_MESSAGE PUB message too big 1073741824 > 100"
    );
    assert_eq!(
        err(b"IDENTIFY\n\xff\xff\xff\xff", ClientState::Init),
        "E_BAD_BODY IDENTIFY invalid body size -1"
    );
    assert_eq!(
        err(b"IDENTIFY\n\x00\x00\x10\x00", ClientState::Init),
        "E_BAD_BODY IDENTIFY body too big 4096 > 1000"
    );
    assert_eq!(
        err(b"MPUB t\n\x00\x00\x04\x7c", ClientState::Init),
        "E_BAD_BODY MPUB body too big 1148 > 1000"
    );
}

#[test]
fn mpub_element_errors_and_quirk() {
    let mut b = b"MPUB t\n".to_vec();
    let mut inner = 2u32.to_be_bytes().to_vec();
    inner.extend(sized(b"a"));
    inner.extend_from_slice(&0u32.to_be_bytes());
    b.extend(sized(&inner));
    assert_eq!(
        err(&b, ClientState::Init),
        "E_BAD_MESSAGE MPUB invalid message(1) body size 0"
    );
    let e = decode(&b, &ctx(ClientState::Init)).unwrap_err();
    assert_eq!(e.creates_topic.as_deref(), Some("t"));
    assert_eq!(
        err(b"MPUB bad!t\n", ClientState::Init),
        "E_BAD_TOPIC E_BAD_TOPIC MPUB topic name \"bad!t\" is not valid"
    );
}

#[test]
fn state_machine_errors() {
    assert_eq!(
        err(b"RDY 1\n", ClientState::Init),
        "E_INVALID cannot RDY in current state"
    );
    assert_eq!(
        err(b"FIN 0123456789abcdef\n", ClientState::Init),
        "E_INVALID cannot FIN in current state"
    );
    assert_eq!(
        err(b"IDENTIFY\n", ClientState::Subscribed),
        "E_INVALID cannot IDENTIFY in current state"
    );
    assert_eq!(
        err(b"SUB t c\n", ClientState::Subscribed),
        "E_INVALID cannot SUB in current state"
    );
    assert_eq!(
        err(b"CLS\n", ClientState::Init),
        "E_INVALID cannot CLS in current state"
    );
    assert_eq!(
        decode(b"RDY 99999\n", &ctx(ClientState::Closing)),
        Ok(Some((Command::RdyIgnored, 10)))
    );
}

#[test]
fn rdy_parsing() {
    assert_eq!(
        decode(b"RDY\n", &ctx(ClientState::Subscribed)),
        Ok(Some((Command::Rdy { count: 1 }, 4)))
    );
    assert_eq!(
        err(b"RDY 51\n", ClientState::Subscribed),
        "E_INVALID RDY count 51 out of range 0-50"
    );
    assert_eq!(
        err(b"RDY -1\n", ClientState::Subscribed),
        "E_INVALID RDY could not parse count -1"
    );
}

#[test]
fn unknown_and_empty_commands() {
    assert_eq!(
        err(b"ASDF\n", ClientState::Init),
        "E_INVALID invalid command ASDF"
    );
    assert_eq!(err(b"\n", ClientState::Init), "E_INVALID invalid command ");
    assert_eq!(
        err(b"NOP\r\r\n", ClientState::Init),
        "E_INVALID invalid command NOP\r"
    );
}

#[test]
fn long_line_closes_silently() {
    let b = vec![b'A'; MAX_LINE + 1];
    assert!(decode(&b, &ctx(ClientState::Init)).unwrap_err().silent);
}

#[test]
fn eof_turns_short_body_into_read_error() {
    let mut c = ctx(ClientState::Init);
    c.eof = true;
    assert_eq!(
        decode(b"PUB t\n\x00\x00\x00\x05he", &c).unwrap_err().text,
        "PUB failed to read message body"
    );
    assert_eq!(decode(b"PUB t", &c), Ok(None));
}

#[test]
fn dpub_range() {
    let mut b = b"DPUB t 3600001\n".to_vec();
    b.extend(sized(b"x"));
    assert_eq!(
        err(&b, ClientState::Init),
        "E_INVALID DPUB timeout 3600001 out of range 0-3600000"
    );
    // Go's Duration(ms) * Millisecond wraps: the count is printed unsigned, a huge one
    // can wrap to a valid delay (measured on nsqd 1.3.0: 18446744073710 is accepted (it
    // wraps to 448 us), 9223372036854775808 too (0), 18446744073709551615 refused).
    let mut b = b"DPUB t 18446744073709551615\n".to_vec();
    b.extend(sized(b"x"));
    assert_eq!(
        err(&b, ClientState::Init),
        "E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000"
    );
    for (ms, want) in [
        ("18446744073710", 0),
        ("9223372036854775808", 0),
        ("3600000", 3_600_000),
    ] {
        let mut b = format!("DPUB t {ms}\n").into_bytes();
        b.extend(sized(b"x"));
        let ctx = ctx(ClientState::Init);
        match decode(&b, &ctx) {
            Ok(Some((Command::Dpub { defer_ms, .. }, _))) => assert_eq!(defer_ms, want, "{ms}"),
            other => panic!("{ms}: {other:?}"),
        }
    }
}

#[test]
fn go_quote_escapes_what_go_does_not_print() {
    // Measured on nsqd 1.3.0 (`PUB <name>` error texts).
    assert_eq!(go_quote("a\u{a0}b".as_bytes()), "\"a\\u00a0b\"");
    assert_eq!(
        go_quote("\u{ad}\u{200b}\u{2028}\u{feff}\u{e000}\u{378}".as_bytes()),
        "\"\\u00ad\\u200b\\u2028\\ufeff\\ue000\\u0378\""
    );
    assert_eq!(
        go_quote("\u{10ffff}\u{e0001}".as_bytes()),
        "\"\\U0010ffff\\U000e0001\""
    );
    assert_eq!(go_quote("é😀\u{fffd}".as_bytes()), "\"é😀\u{fffd}\"");
}

#[test]
fn go_quote_escapes() {
    assert_eq!(go_quote(b"bad!topic"), "\"bad!topic\"");
    assert_eq!(go_quote(b"a\"b\\\n\x01\xff"), "\"a\\\"b\\\\\\n\\x01\\xff\"");
}

#[test]
fn mpub_line_topic_before_the_body() {
    assert_eq!(mpub_line_topic(b"MPUB t\n"), Some("t".to_string()));
    assert_eq!(
        mpub_line_topic(b"MPUB t\r\n\x00\x00"),
        Some("t".to_string())
    );
    assert_eq!(mpub_line_topic(b"MPUB t x\n"), Some("t".to_string()));
    assert_eq!(mpub_line_topic(b"MPUB t"), None, "line not complete");
    assert_eq!(mpub_line_topic(b"MPUB bad!\n"), None, "decode reports it");
    assert_eq!(mpub_line_topic(b"MPUB\n"), None);
    assert_eq!(mpub_line_topic(b"PUB t\n"), None);
}

#[test]
fn invalid_command_echoes_non_utf8_bytes_as_sent() {
    // nsqd: fmt.Sprintf("invalid command %s", cmd) writes the client's bytes unchanged.
    let e = decode(b"\xffFOO\n", &ctx(ClientState::Init)).expect_err("expected an error");
    assert_eq!(
        e.frame_data(),
        b"E_INVALID invalid command \xffFOO".to_vec()
    );
    let e = decode(b"ASDF\n", &ctx(ClientState::Init)).expect_err("expected an error");
    assert_eq!(e.frame_data(), b"E_INVALID invalid command ASDF".to_vec());
}

#[test]
fn command_len_counts_line_size_and_body_once_the_size_is_in() {
    let mpub = b"MPUB t\n\0\0\0\x12\0\0\0\x02\0\0\0\x03one\0\0\0\x03two";
    for cut in 0..mpub.len() {
        let expected = (cut >= 11).then_some(mpub.len());
        assert_eq!(command_len(&mpub[..cut]), expected, "cut at {cut}");
    }
    assert_eq!(command_len(b"PUB t\r\n\0\0\x01\0"), Some(7 + 4 + 256));
    assert_eq!(command_len(b"DPUB t 100\n\0\0\0\x02"), Some(11 + 4 + 2));
    assert_eq!(command_len(b"IDENTIFY\n\0\0\0\x02{}"), Some(15));
    assert_eq!(command_len(b"AUTH\n\0\0\0\x01s"), Some(10));
    // Commands without a body, and a negative size.
    assert_eq!(command_len(b"NOP\n\0\0\0\x01"), None);
    assert_eq!(command_len(b"FIN 0123456789abcdef\n"), None);
    assert_eq!(command_len(b"PUB t\n\xff\xff\xff\xff"), None);
}
