//! Disk errors: with the data path on a tiny ext4 filesystem (a loop-mounted image),
//! filling the disk makes publishes fail with nsqd's `E_PUB_FAILED` and /ping report
//! `NOK - <error>`; consumers keep working; freeing space heals both. Needs root and
//! loop devices (as on the CI machine); elsewhere it says so and passes without checking.

mod common;

use common::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

struct Mount(PathBuf, PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

fn small_fs() -> Option<Mount> {
    let base = std::env::temp_dir().join(format!("nsqd-diskfull-{}", std::process::id()));
    let img = base.with_extension("img");
    std::fs::create_dir_all(&base).ok()?;
    let f = std::fs::File::create(&img).ok()?;
    f.set_len(8 << 20).ok()?;
    let ok = Command::new("mkfs.ext4")
        .arg("-q")
        .arg(&img)
        .status()
        .ok()?
        .success()
        && Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&img)
            .arg(&base)
            .status()
            .ok()?
            .success();
    if !ok {
        let _ = std::fs::remove_file(&img);
        return None;
    }
    Some(Mount(base, img))
}

#[test]
fn full_disk_fails_publishes_marks_unhealthy_and_recovers() {
    let Some(m) = small_fs() else {
        eprintln!("SKIPPED: cannot mount a loop filesystem here (needs root and loop devices)");
        return;
    };
    let data = m.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let b = Broker::start_in(&data, 1, &[]);
    b.http("POST", "/topic/create?topic=full", b"");
    b.http("POST", "/channel/create?topic=full&channel=c", b"");
    // A consumer subscribed before the disk fills keeps being served.
    let mut cons = b.connect_v2();
    cons.write_all(b"SUB full c\nRDY 10\n").unwrap();
    assert_eq!(read_frame_skip_hb(&mut cons).unwrap(), (0, b"OK".to_vec()));
    let mut p = b.connect_v2();
    p.write_all(&pub_cmd("full", b"before")).unwrap();
    assert_eq!(read_frame_skip_hb(&mut p).unwrap(), (0, b"OK".to_vec()));
    let (_, d) = read_frame_skip_hb(&mut cons).unwrap();
    assert_eq!(parse_message(&d).3, b"before");
    // Fill the filesystem.
    let filler = m.0.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let mut failed = None;
    for _ in 0..400 {
        let mut p = b.connect_v2();
        p.write_all(&pub_cmd("full", &vec![b'x'; 4000])).unwrap();
        match read_frame_skip_hb(&mut p) {
            Ok((1, e)) => {
                failed = Some(String::from_utf8_lossy(&e).to_string());
                assert_closed(&mut p);
                break;
            }
            Ok((0, ok)) => assert_eq!(ok, b"OK"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let e = failed.expect("a publish failed once the disk was full");
    assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!(code, 500);
    assert!(
        body.starts_with(b"NOK - "),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(b.stats()["health"].as_str().unwrap().starts_with("NOK - "));
    // Consumers are still served (messages accepted before the disk filled).
    cons.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (ft, _) = read_frame_skip_hb(&mut cons).unwrap();
    assert_eq!(ft, 2);
    // Free space: publishing and health recover.
    std::fs::remove_file(&filler).unwrap();
    let mut p = b.connect_v2();
    p.write_all(&pub_cmd("full", b"after")).unwrap();
    assert_eq!(read_frame_skip_hb(&mut p).unwrap(), (0, b"OK".to_vec()));
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!((code, body.as_slice()), (200, &b"OK"[..]));
    drop(b);
}
