//! Where shard threads run: one per CPU of the broker's affinity set (the default
//! `--shards`) or more, each pinned to a CPU of the set; fewer shards than CPUs, none
//! pinned (the kernel places them), so several brokers started with `--shards 1` on one
//! host (a cluster's members, in tests and single-host trials) do not all share its
//! first CPU while the others idle.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::Broker;

/// The CPUs a `Cpus_allowed_list` value names (`0-3,6`).
fn cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let mut it = part.split('-').map(|v| v.trim().parse::<usize>().unwrap());
        match (it.next(), it.next()) {
            (Some(a), Some(b)) => cpus.extend(a..=b),
            (Some(a), None) => cpus.push(a),
            _ => {}
        }
    }
    cpus
}

/// `Cpus_allowed_list` of a /proc status file.
fn allowed(status_path: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(status_path).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap();
    cpu_list(&line["Cpus_allowed_list:".len()..])
}

/// The CPUs each shard of process `pid` may run on: its executor thread's. glommio
/// names it `shard-<shard>-<executor id>`, and the executor's blocking thread, started
/// after it, has the same name: the first thread of each name is the executor.
fn shard_threads(b: &Broker) -> Vec<Vec<usize>> {
    // Answered once every shard runs (the ports take connections before that).
    let _ = b.stats();
    let pid = b.pid();
    let mut tids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    let mut by_name: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for tid in tids {
        let dir = format!("/proc/{pid}/task/{tid}");
        let comm = std::fs::read_to_string(format!("{dir}/comm")).unwrap_or_default();
        if comm.starts_with("shard-") {
            by_name
                .entry(comm.trim().to_string())
                .or_insert_with(|| allowed(&format!("{dir}/status")));
        }
    }
    by_name.into_values().collect()
}

#[test]
fn shards_are_pinned_only_when_they_take_every_cpu() {
    let cpus = allowed("/proc/self/status");
    // One shard per CPU: each thread pinned to its own CPU of the set.
    let b = Broker::start(cpus.len(), &[]);
    let mut pinned: Vec<usize> = shard_threads(&b)
        .into_iter()
        .map(|set| {
            assert_eq!(set.len(), 1, "a shard thread pinned to one CPU: {set:?}");
            set[0]
        })
        .collect();
    pinned.sort_unstable();
    assert_eq!(pinned, cpus, "one shard on each CPU of the set");
    // `/stats` says so, with the CPU of each.
    let stats = b.stats();
    let mut said: Vec<usize> = stats["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["pinned"], true, "{s}");
            s["cpu"].as_u64().unwrap() as usize
        })
        .collect();
    said.sort_unstable();
    assert_eq!(said, cpus);
    drop(b);
    // More shards than CPUs: all pinned, round robin.
    let b = Broker::start(cpus.len() + 1, &[]);
    let threads = shard_threads(&b);
    assert_eq!(threads.len(), cpus.len() + 1);
    assert!(threads.iter().all(|set| set.len() == 1), "{threads:?}");
    drop(b);
    if cpus.len() < 2 {
        // One CPU: one shard takes every CPU; there is no "fewer" to try.
        return;
    }
    // Fewer shards than CPUs: no thread pinned, each may run on every CPU of the set,
    // and `/stats` names the CPU a shard runs on, one of the set.
    let b = Broker::start(1, &[]);
    let threads = shard_threads(&b);
    assert_eq!(
        threads,
        vec![cpus.clone()],
        "the shard thread is not pinned"
    );
    let stats = b.stats();
    let shard = &stats["shards"][0];
    assert_eq!(shard["pinned"], false, "{shard}");
    let cpu = shard["cpu"].as_u64().unwrap();
    assert!(cpus.contains(&(cpu as usize)), "cpu {cpu} of {cpus:?}");
    // Its metrics keep one series however it moves: an empty cpu label.
    let (code, metrics) = b.http("GET", "/metrics", b"");
    assert_eq!(code, 200);
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("shard=\"0\",cpu=\"\""),
        "{}",
        &metrics[..metrics.len().min(2000)]
    );
}
