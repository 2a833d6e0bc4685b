//! A filesystem that answers slowly must hold up only the publishes waiting for it, not
//! the shard: `scripts/slowfs.py` (a passthrough FUSE filesystem whose writes, fsyncs
//! and reads sleep for a delay the test sets) holds the data path.
//!
//! io_uring issues a write on FUSE inline, in the shard thread's own `io_uring_enter`,
//! and FUSE waits there for its server (kernel 6.18: `fuse_direct_io` ->
//! `request_wait_answer`). Before segment I/O moved to the shard's blocking thread on
//! such filesystems (`nsq_storage::SegmentIo`), one 3 s write held every client of the
//! shard for 3 s (`/ping` 5.8 s, another topic's PUB 9 s).
//!
//! Needs root (or fusermount), /dev/fuse, libfuse2 and fusepy: the Python is
//! `$NSQD_TEST_PYTHON`, else the repository's `.venv/bin/python` (scripts/setup-clients.sh
//! installs fusepy there), else `python3`. Without them the test says so and passes,
//! unless `NSQD_TEST_REQUIRE_FUSE` is set (scripts/test.sh sets it when they are there).
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The mounted filesystem: unmounted, and its server stopped, on drop.
struct SlowFs {
    mnt: PathBuf,
    control: PathBuf,
    server: Child,
    root: PathBuf,
}

impl SlowFs {
    /// Sets the delay of every write, fsync and read from now on.
    fn set_delay(&self, secs: f64) {
        self.set(&format!("{secs}"));
    }

    /// Sets what the filesystem does from now on (scripts/slowfs.py's control syntax,
    /// e.g. `mkdir=1.5` or `write=eio`; empty: nothing).
    fn set(&self, spec: &str) {
        std::fs::write(&self.control, spec).unwrap();
    }
}

/// [`mount_slowfs`], or `None` (the test passes, with a `SKIP:` line: [`common::skip`]) where FUSE cannot be used
/// and `NSQD_TEST_REQUIRE_FUSE` is not set.
fn mount_or_skip(name: &str) -> Option<SlowFs> {
    match mount_slowfs(name) {
        Ok(fs) => Some(fs),
        Err(why) if std::env::var_os("NSQD_TEST_REQUIRE_FUSE").is_none() => {
            common::skip(&why);
            None
        }
        Err(why) => panic!("NSQD_TEST_REQUIRE_FUSE is set, and FUSE cannot be used: {why}"),
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.control, "0");
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Whether `mnt` is a mount point now (`/proc/self/mountinfo`'s fifth field).
fn mounted(mnt: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| p == want))
}

/// Mounts scripts/slowfs.py over a fresh directory; `Err` says why it cannot.
fn mount_slowfs(name: &str) -> Result<SlowFs, String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    let py = crate::common::python();
    let probe = Command::new(&py)
        .args(["-c", "import fuse"])
        .output()
        .map_err(|e| format!("{}: {e}", py.display()))?;
    if !probe.status.success() {
        return Err(format!(
            "{} cannot import fusepy: {}",
            py.display(),
            // The exception, not the traceback before it.
            String::from_utf8_lossy(&probe.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let root = std::env::temp_dir().join(format!("nsqd-slowfs-{name}-{}", std::process::id()));
    let _ = Command::new("umount")
        .arg("-l")
        .arg(root.join("mnt"))
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(&root);
    let (back, mnt, control) = (root.join("back"), root.join("mnt"), root.join("delay"));
    for d in [&back, &mnt] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(&control, "0").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slowfs.py");
    let server = Command::new(&py)
        .arg(script)
        .args([&back, &mnt, &control])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", py.display()))?;
    let mut fs = SlowFs {
        mnt,
        control,
        server,
        root,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mounted(&fs.mnt) {
        if let Ok(Some(st)) = fs.server.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = fs.server.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("slowfs.py exited with {st}: {}", err.trim()));
        }
        if Instant::now() > deadline {
            return Err("slowfs.py did not mount within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(fs)
}

/// The slowest of the `/ping`s and `#ephemeral` PUB -> message round trips (publisher
/// `pub_conn`, subscriber `sub`) made on the shard until `done` is set (at most 30 s),
/// and how many round trips.
fn slowest_answer(
    b: &Broker,
    pub_conn: &mut std::net::TcpStream,
    sub: &mut std::net::TcpStream,
    done: &AtomicBool,
) -> (Duration, Duration, usize) {
    let (mut ping, mut round, mut n) = (Duration::ZERO, Duration::ZERO, 0);
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(30) {
        let t = Instant::now();
        assert_eq!(b.http("GET", "/ping", b""), (200, b"OK".to_vec()));
        ping = ping.max(t.elapsed());
        let t = Instant::now();
        let body = format!("m{n}");
        send(pub_conn, &pub_cmd("fast#ephemeral", body.as_bytes()));
        expect_ok(pub_conn);
        let m = read_msg(sub);
        assert_eq!(m.body, body.as_bytes());
        send(sub, format!("FIN {}\n", m.id).as_bytes());
        round = round.max(t.elapsed());
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    (ping, round, n)
}

/// Fails unless every `/ping` and round trip of [`slowest_answer`] was answered within
/// 0.7 s while `what` waited for the filesystem (its delays are 1.5 s).
fn assert_prompt(what: &str, ping: Duration, round: Duration, n: usize) {
    assert!(
        ping < Duration::from_millis(700) && round < Duration::from_millis(700),
        "while {what} waited for the filesystem: slowest /ping {ping:?}, slowest \
         #ephemeral PUB->message {round:?} ({n} round trips)"
    );
}

#[test]
fn a_slow_filesystem_holds_up_only_its_publishes() {
    let Some(fs) = mount_or_skip("stall") else {
        return;
    };
    let data = fs.mnt.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut b = Broker::start_in(&data, 1, &["--sync-every=1"]);
    // (Its reason names the override when scripts/test.sh runs this again under
    // NSQD_SEGMENT_IO=threads.)
    let why = match std::env::var("NSQD_SEGMENT_IO").as_deref() {
        Ok("threads") => "blocking thread (NSQD_SEGMENT_IO=threads)",
        _ => "blocking thread (fuse filesystem)",
    };
    assert!(
        b.wait_log_line(why, Duration::from_secs(10)).is_some(),
        "{}",
        b.log_text()
    );
    // A durable topic with a message on the disk.
    let mut slow = b.connect_v2();
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    send(&mut slow, &pub_cmd("slow", b"before"));
    expect_ok(&mut slow);

    // What follows a write (its index, the topic's metadata) goes to the disk too.
    std::thread::sleep(Duration::from_millis(500));
    // Connections to the same shard, made now: every exchange after the delay is timed.
    let mut pub_conn = b.connect_v2();
    let mut sub = b.subscribe("fast#ephemeral", "c#ephemeral");
    send(&mut sub, b"RDY 100\n");

    // Each write, fsync and read now takes 1.5 s: the next PUB waits for the disk, the
    // rest of the shard must not, all the time it waits.
    fs.set_delay(1.5);
    let sent = Instant::now();
    send(&mut slow, &pub_cmd("slow", &vec![b'x'; 5000]));
    let done = AtomicBool::new(false);
    let (answer, (ping, round, n)) = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let r = read_frame(&mut slow);
            done.store(true, Ordering::SeqCst);
            (r, sent.elapsed())
        });
        let slowest = slowest_answer(&b, &mut pub_conn, &mut sub, &done);
        (waiter.join().unwrap(), slowest)
    });
    fs.set_delay(0.0);
    let (frame, waited) = answer;
    assert_eq!(frame.unwrap(), (0, b"OK".to_vec()), "the slow PUB's answer");
    eprintln!(
        "slow filesystem: PUB answered after {waited:?}; meanwhile slowest /ping {ping:?}, \
         slowest #ephemeral PUB->message {round:?} ({n} round trips)"
    );
    assert!(
        waited >= Duration::from_millis(1500),
        "the PUB did not wait for its write ({waited:?}): the filesystem was not slow"
    );
    assert_prompt("a write", ping, round, n);
    assert!(n >= 3, "{n} round trips in {waited:?}");
    let mut c = b.subscribe("slow", "c");
    send(&mut c, b"RDY 2\n");
    assert_eq!(read_msg(&mut c).body, b"before");
    assert_eq!(read_msg(&mut c).body, vec![b'x'; 5000]);
    assert_eq!(b.terminate().and_then(|s| s.code()), Some(0));
    drop(b);

    // Restarted on the same data path: the segment written on the blocking thread
    // recovers (nothing was FIN-ed).
    let b = Broker::start_in(&data, 1, &["--sync-every=1"]);
    let mut c = b.subscribe("slow", "c");
    send(&mut c, b"RDY 2\n");
    assert_eq!(read_msg(&mut c).body, b"before");
    assert_eq!(read_msg(&mut c).body, vec![b'x'; 5000]);
    drop(b);
    drop(fs);
}

/// A new durable topic's directory is made off the shard's thread: while its `mkdir`
/// waits 1.5 s for the filesystem, the shard's other clients are served (made on the
/// shard's thread, a 3 s `mkdir` would hold `/ping` for about as long).
#[test]
fn a_slow_mkdir_holds_up_only_the_new_topic() {
    let Some(fs) = mount_or_skip("mkdir") else {
        return;
    };
    let data = fs.mnt.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for shards in [1, 2] {
        let b = Broker::start_in(&data, shards, &["--sync-every=1"]);
        let mut pub_conn = b.connect_v2();
        let mut sub = b.subscribe("fast#ephemeral", "c#ephemeral");
        send(&mut sub, b"RDY 100\n");
        fs.set("mkdir=1.5");
        // A channel of a topic that does not exist is refused (nsqd: TOPIC_NOT_FOUND)
        // at once, not after a directory it will not use.
        let t = Instant::now();
        let (code, _) = b.http(
            "POST",
            &format!("/channel/create?topic=none_{shards}&channel=c"),
            b"",
        );
        assert_eq!(code, 404);
        assert!(
            t.elapsed() < Duration::from_millis(700),
            "{:?}",
            t.elapsed()
        );
        // PUB (TCP, on whichever shard the connection landed), /pub and /topic/create
        // of new durable topics: each waits for its mkdir, on the owner's blocking thread.
        let topic = format!("new_{shards}");
        let mut p = b.connect_v2();
        p.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let sent = Instant::now();
        send(&mut p, &pub_cmd(&topic, b"first"));
        let done = AtomicBool::new(false);
        let (answer, (ping, round, n)) = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let r = read_frame(&mut p);
                let http = b.http("POST", &format!("/pub?topic={topic}_http"), b"second");
                let created = b.http("POST", &format!("/topic/create?topic={topic}_made"), b"");
                done.store(true, Ordering::SeqCst);
                (r, http.0, created.0, sent.elapsed())
            });
            let slowest = slowest_answer(&b, &mut pub_conn, &mut sub, &done);
            (waiter.join().unwrap(), slowest)
        });
        fs.set("");
        let (frame, http, created, waited) = answer;
        eprintln!(
            "slow mkdir, {shards} shards: PUB, /pub and /topic/create answered after \
             {waited:?}; meanwhile slowest /ping {ping:?}, slowest #ephemeral \
             PUB->message {round:?} ({n} round trips)"
        );
        assert_eq!(frame.unwrap(), (0, b"OK".to_vec()));
        assert_eq!((http, created), (200, 200));
        assert!(
            waited >= Duration::from_millis(4500),
            "three mkdirs of 1.5 s took {waited:?}: the filesystem was not slow"
        );
        assert_prompt("a mkdir", ping, round, n);
        let mut c = b.subscribe(&topic, "c");
        send(&mut c, b"RDY 1\n");
        assert_eq!(read_msg(&mut c).body, b"first");
        let mut c = b.subscribe(&format!("{topic}_http"), "c");
        send(&mut c, b"RDY 1\n");
        assert_eq!(read_msg(&mut c).body, b"second");
    }
}

/// Writes that fail (EIO from the filesystem) refuse the publishes waiting for them with
/// nsqd's error; once the filesystem writes again, the topic does too, without a
/// restart. On the blocking-thread path the segment whose header write failed was left
/// behind empty and opened again with O_EXCL: every later publish failed with
/// `E_PUB_FAILED PUB failed File exists (os error 17)` until a restart.
#[test]
fn failed_writes_refuse_publishes_then_heal() {
    let Some(fs) = mount_or_skip("eio") else {
        return;
    };
    let data = fs.mnt.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let b = Broker::start_in(&data, 1, &["--sync-every=1", "--max-bytes-per-file=4096"]);
    let mut p = b.connect_v2();
    send(&mut p, &pub_cmd("t", b"m0"));
    expect_ok(&mut p);
    fs.set("write=eio");
    // Enough publishes to fill the segment and need a new one while writes fail.
    let mut refused = 0;
    let mut acked = vec![b"m0".to_vec()];
    for i in 1..40 {
        let body = format!("m{i}-{}", "x".repeat(300));
        send(&mut p, &pub_cmd("t", body.as_bytes()));
        match read_frame(&mut p).unwrap() {
            (0, ok) if ok == b"OK" => acked.push(body.into_bytes()),
            (1, e) => {
                let e = String::from_utf8_lossy(&e).into_owned();
                assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
                assert!(!e.contains("File exists"), "{e}");
                refused += 1;
                // Fatal, as nsqd's: the connection is closed.
                p = b.connect_v2();
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(refused > 0, "no publish was refused while writes failed");
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!(code, 500, "{}", String::from_utf8_lossy(&body));
    fs.set("");
    // Healed: publishes are answered OK again within a few retries, /ping says OK.
    let healed = wait_until(Duration::from_secs(20), || {
        let mut p = b.connect_v2();
        send(&mut p, &pub_cmd("t", b"after"));
        matches!(read_frame(&mut p), Ok((0, ok)) if ok == b"OK")
    });
    let log = b.log_text();
    assert!(
        healed,
        "publishes still refused after the filesystem healed\n{log}"
    );
    acked.push(b"after".to_vec());
    eventually("/ping OK", || {
        b.http("GET", "/ping", b"") == (200, b"OK".to_vec())
    });
    assert!(!log.contains("File exists"), "{log}");
    // Every acknowledged body is delivered.
    let mut c = b.subscribe("t", "c");
    send(&mut c, b"RDY 100\n");
    let mut got = Vec::new();
    while !acked.iter().all(|a| got.contains(a)) {
        let m = read_msg(&mut c);
        send(&mut c, format!("FIN {}\n", m.id).as_bytes());
        if !got.contains(&m.body) {
            got.push(m.body);
        }
    }
    for a in &acked {
        assert!(
            got.contains(a),
            "acknowledged {} not delivered",
            String::from_utf8_lossy(a)
        );
    }
}

/// `NSQD_SEGMENT_IO` decides the path when set; a value it does not know stops the
/// start with a message naming it.
#[test]
fn segment_io_can_be_chosen_and_a_bad_choice_stops_the_start() {
    let dir = ScratchDir::new("slowdisk-env");
    let b = Broker::start_in_env(
        &dir,
        2,
        &["--sync-every=1"],
        &[("NSQD_SEGMENT_IO", "threads")],
    );
    assert!(b
        .wait_log_line("(NSQD_SEGMENT_IO=threads)", Duration::from_secs(10))
        .is_some());
    // Writes, syncs and reads on the blocking threads: a round trip through the disk.
    let topics = topic_names("threads", 4);
    for t in &topics {
        let mut p = b.connect_v2();
        send(&mut p, &mpub_cmd(t, &[b"one", b"two"]));
        expect_ok(&mut p);
    }
    for t in &topics {
        let mut c = b.subscribe(t, "c");
        send(&mut c, b"RDY 2\n");
        assert_eq!(read_msg(&mut c).body, b"one");
        assert_eq!(read_msg(&mut c).body, b"two");
    }
    drop(b);

    let dir = ScratchDir::new("slowdisk-bad");
    let out = Command::new(env!("CARGO_BIN_EXE_nsqd"))
        .args([
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            &format!("--data-path={}", dir.display()),
        ])
        .env("NSQD_SEGMENT_IO", "fast")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(r#"NSQD_SEGMENT_IO="fast": expected auto, uring or threads"#),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
