//! Seeded random faults (drops, partitions, isolated nodes, crashes with the store kept,
//! compactions) while proposals keep coming: no entry that `quorum` or `all` acknowledged
//! is lost, and no two nodes apply different entries at one index.

use std::collections::BTreeMap;

use nsq_replication::{AckPolicy, AckState, Entry, ProposalId};

use crate::sim::{publish, Sim, ELECTION_TICK};

/// A proposal waiting for its policy, on the node that proposed it.
struct Waiting {
    node: u64,
    id: ProposalId,
    policy: AckPolicy,
    entry: Entry,
}

/// Acknowledged entries by index: (term, entry, policy).
type Acked = BTreeMap<u64, (u64, Entry, AckPolicy)>;

/// One random fault or repair.
fn chaos(sim: &mut Sim, ids: &[u64], down: &mut Option<u64>, waiting: &mut Vec<Waiting>) {
    let roll = sim.rng().u32(0..1000);
    let pick = ids[sim.rng().usize(0..ids.len())];
    match roll {
        0..=14 => sim.isolate(pick),
        15..=29 => {
            let cut = sim.rng().usize(1..ids.len());
            let mut side = ids.to_vec();
            sim.rng().shuffle(&mut side);
            side.truncate(cut);
            sim.partition(&side);
        }
        30..=69 => sim.heal(),
        70..=79 => sim.drop_per_mille = sim.rng().u32(0..300),
        80..=84 if down.is_none() => {
            sim.crash(pick);
            *down = Some(pick);
            // A crashed broker answers none of its waiting PUBs.
            waiting.retain(|w| w.node != pick);
        }
        85..=99 => {
            if let Some(id) = down.take() {
                sim.restart(id);
            }
        }
        100..=124 if *down != Some(pick) => sim.compact(pick),
        _ => {}
    }
}

/// Proposes 1 to 3 entries on whichever node thinks it leads (a stale leader included),
/// each with a random policy.
fn propose_some(sim: &mut Sim, next: &mut u64, waiting: &mut Vec<Waiting>) {
    let leaders: Vec<u64> = sim
        .ids()
        .into_iter()
        .filter(|&i| sim.node(i).group.as_ref().is_some_and(|g| g.is_leader()))
        .collect();
    for node in leaders {
        for _ in 0..sim.rng().usize(1..4) {
            let entry = publish(*next);
            *next += 1;
            let policy =
                [AckPolicy::Quorum, AckPolicy::All, AckPolicy::Leader][sim.rng().usize(0..3)];
            if let Ok(id) = sim.propose(node, &entry) {
                waiting.push(Waiting {
                    node,
                    id,
                    policy,
                    entry,
                });
            }
        }
    }
}

/// What a scenario went through, so the test can tell that the faults were real.
#[derive(Default)]
struct Seen {
    /// Acknowledgements under quorum or all that were checked at the end.
    checked: usize,
    /// Proposals found lost (replaced by another leader's entry).
    lost: usize,
    /// Snapshots restored by any node.
    restores: usize,
    /// The final term: how many elections there were, at most.
    term: u64,
}

/// Moves acknowledged proposals from `waiting` to `acked`; drops lost and unknown ones
/// (the broker would answer those PUBs with an error).
fn collect_acks(sim: &Sim, waiting: &mut Vec<Waiting>, acked: &mut Acked, seen: &mut Seen) {
    waiting.retain(|w| {
        let state = sim.node(w.node).group().ack_state(w.id, w.policy);
        match state {
            AckState::Pending => true,
            AckState::Acked => {
                acked.insert(w.id.index, (w.id.term, w.entry.clone(), w.policy));
                false
            }
            AckState::Lost => {
                seen.lost += 1;
                false
            }
            AckState::Unknown => false,
        }
    });
}

/// Runs one seeded scenario; returns what it went through.
fn scenario(n: u64, seed: u64, ticks: usize) -> Seen {
    let mut sim = Sim::new(n, seed);
    let ids = sim.ids();
    let mut down = None;
    let mut waiting = Vec::new();
    let mut acked = Acked::new();
    let mut next = 0;
    let mut seen = Seen::default();
    for _ in 0..ticks {
        chaos(&mut sim, &ids, &mut down, &mut waiting);
        if sim.rng().bool() {
            propose_some(&mut sim, &mut next, &mut waiting);
        }
        sim.tick();
        collect_acks(&sim, &mut waiting, &mut acked, &mut seen);
    }
    // Repair everything and let the group converge.
    sim.heal();
    sim.drop_per_mille = 0;
    if let Some(id) = down {
        sim.restart(id);
    }
    sim.run(6 * ELECTION_TICK);
    let leader = sim.leader().expect("a leader after the repair");
    let p = sim.propose(leader, &publish(u64::MAX)).unwrap();
    sim.run(4);
    let leader_group = sim.node(leader).group();
    assert_eq!(leader_group.ack_state(p, AckPolicy::All), AckState::Acked);
    collect_acks(&sim, &mut waiting, &mut acked, &mut seen);

    // Every node ends with the same entries (no divergence) ...
    let reference = &sim.node(leader).applied;
    for id in &ids {
        assert_eq!(
            &sim.node(*id).applied,
            reference,
            "seed {seed}: node {id} differs from leader {leader}"
        );
    }
    // ... and every entry acknowledged under quorum or all is among them, at its index.
    for (index, (term, entry, policy)) in &acked {
        if *policy == AckPolicy::Leader {
            continue;
        }
        assert_eq!(
            reference.get(index),
            Some(&(*term, entry.clone())),
            "seed {seed}: {policy:?}-acknowledged entry {index} lost"
        );
        seen.checked += 1;
    }
    seen.restores = ids.iter().map(|id| sim.node(*id).restores).sum();
    seen.term = sim.node(leader).group().term();
    seen
}

/// Runs the seeds and checks that they exercised what the property is about.
fn scenarios(n: u64, seeds: std::ops::Range<u64>, min_checked: usize) {
    let mut total = Seen::default();
    let runs = seeds.end - seeds.start;
    for seed in seeds {
        let seen = scenario(n, seed, 300);
        total.checked += seen.checked;
        total.lost += seen.lost;
        total.restores += seen.restores;
        total.term += seen.term;
    }
    assert!(
        total.checked > min_checked,
        "{} acks checked",
        total.checked
    );
    assert!(
        total.lost > 0,
        "no proposal was ever lost: the faults did nothing"
    );
    assert!(total.restores > 0, "no snapshot was ever restored");
    // At least one failover per run on average after the first election.
    assert!(
        total.term > 2 * runs,
        "only {} terms in {runs} runs",
        total.term
    );
}

#[test]
fn acknowledged_entries_survive_random_faults_in_three_nodes() {
    scenarios(3, 0..12, 500);
}

#[test]
fn acknowledged_entries_survive_random_faults_in_five_nodes() {
    scenarios(5, 100..106, 250);
}
