//! A group's behaviour on the simulated network: election, commit order, failover,
//! discarded uncommitted entries, catch-up of an empty node, ack policies.

use nsq_replication::{AckPolicy, AckState, ChannelOp, Entry, Membership, ReplicationError};

use crate::sim::{publish, Sim, ELECTION_TICK, HEARTBEAT_TICK, MAX_TIMEOUT};

/// Every node sees the same single leader, in the same term.
fn assert_one_leader(sim: &Sim) -> u64 {
    let leader = sim.leader().expect("a leader");
    let term = sim.node(leader).group().term();
    for id in sim.ids() {
        let g = sim.node(id).group();
        assert_eq!(g.leader(), Some(leader), "node {id} follows the leader");
        assert_eq!(g.term(), term, "node {id} is in the leader's term");
        assert_eq!(g.is_leader(), id == leader);
    }
    let last = sim.node(leader).leaderships.last().copied().unwrap();
    assert!(last.is_self && last.leader == Some(leader));
    leader
}

#[test]
fn a_leader_is_elected_in_three_and_five_node_groups() {
    for n in [3, 5] {
        let mut sim = Sim::new(n, 1);
        let (leader, ticks) = sim.await_leader(None, 4 * MAX_TIMEOUT);
        // The first node to time out (node 1, after ELECTION_TICK ticks) wins.
        assert!(
            ticks <= ELECTION_TICK + 2,
            "{n} nodes: elected after {ticks}"
        );
        sim.run(5);
        assert_eq!(assert_one_leader(&sim), leader);
        // A follower refuses proposals and names the leader.
        let follower = sim.ids().into_iter().find(|&i| i != leader).unwrap();
        match sim.propose(follower, &publish(0)) {
            Err(ReplicationError::NotLeader { leader: Some(l) }) => assert_eq!(l, leader),
            other => panic!("a follower proposed: {other:?}"),
        }
    }
}

#[test]
fn proposals_commit_on_every_node_in_order() {
    for n in [3, 5] {
        let mut sim = Sim::new(n, 2);
        let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
        let mut expected = Vec::new();
        for i in 0..60 {
            let entry = if i % 3 == 2 {
                Entry::Channel {
                    channel: format!("ch{}", i % 4),
                    op: ChannelOp::Req {
                        id: [b'a'; 16],
                        delay_ms: i,
                    },
                }
            } else {
                publish(u64::from(i))
            };
            sim.propose(leader, &entry).unwrap();
            expected.push(entry);
            // Several proposals per tick, so appends carry batches.
            if i % 7 == 0 {
                sim.tick();
            }
        }
        sim.run(5);
        for id in sim.ids() {
            assert_eq!(sim.applied(id), expected, "node {id} of {n}");
        }
    }
}

#[test]
fn an_isolated_leader_is_replaced_within_the_election_timeout() {
    let mut sim = Sim::new(5, 3);
    let (old, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    for i in 0..10 {
        sim.propose(old, &publish(i)).unwrap();
    }
    sim.run(3);
    let old_term = sim.node(old).group().term();
    sim.isolate(old);
    // Followers stop hearing heartbeats: the first whose timeout runs out (at most the
    // longest timeout of any node) wins a pre-vote and the vote in a couple of rounds.
    let (new, ticks) = sim.await_leader(Some(old), 3 * MAX_TIMEOUT);
    assert!(ticks <= MAX_TIMEOUT + 2, "new leader after {ticks} ticks");
    assert!(sim.node(new).group().term() > old_term);
    // Check-quorum: the isolated leader steps down after an election timeout without a
    // majority, so it stops taking PUBs it could not commit.
    sim.run(ELECTION_TICK + 2);
    assert!(!sim.node(old).group().is_leader());
    assert!(sim.propose(old, &publish(99)).is_err());
    // The new leader commits on the majority side.
    for i in 10..20 {
        let p = sim.propose(new, &publish(i)).unwrap();
        sim.tick();
        assert_eq!(
            sim.node(new).group().ack_state(p, AckPolicy::Quorum),
            AckState::Acked
        );
    }
    // The followers learn the last commit with the next heartbeat (no append follows).
    sim.run(HEARTBEAT_TICK);
    let expected: Vec<_> = (0..20).map(publish).collect();
    for id in sim.ids().into_iter().filter(|&i| i != old) {
        assert_eq!(sim.applied(id), expected, "node {id}");
    }
    // Back in the group, the old leader catches up as a follower.
    sim.heal();
    sim.run(2 * ELECTION_TICK);
    assert_eq!(sim.applied(old), expected);
    assert_eq!(sim.leader(), Some(new));
}

/// A leader that stopped running (a SIGSTOP) while the others elected another still
/// believes it leads when it runs again; asking a majority is what tells it: its
/// request is never confirmed and it steps down, while the new leader's is.
#[test]
fn a_leader_that_stalled_learns_it_was_replaced_before_it_is_confirmed() {
    let mut sim = Sim::new(3, 11);
    let (old, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.propose(old, &publish(1)).unwrap();
    sim.run(HEARTBEAT_TICK);
    // Still the leader: a majority confirms it.
    sim.group(old).confirm_leadership(41);
    sim.settle();
    assert_eq!(sim.node(old).confirmed, vec![41]);
    // Frozen: it neither ticks nor receives, and keeps its state.
    let frozen = sim.nodes.get_mut(&old).unwrap().group.take();
    let (new, _) = sim.await_leader(Some(old), 4 * MAX_TIMEOUT);
    sim.propose(new, &publish(2)).unwrap();
    sim.run(HEARTBEAT_TICK);
    sim.nodes.get_mut(&old).unwrap().group = frozen;
    assert!(
        sim.group(old).is_leader(),
        "a frozen leader still believes it leads"
    );
    sim.group(old).confirm_leadership(42);
    sim.settle();
    assert!(
        !sim.group(old).is_leader(),
        "the answers' higher term deposed it"
    );
    assert_eq!(sim.node(old).confirmed, vec![41], "42 was never confirmed");
    sim.group(new).confirm_leadership(43);
    sim.settle();
    assert_eq!(sim.node(new).confirmed, vec![43]);
    // Asked of a follower, nothing comes back.
    sim.group(old).confirm_leadership(44);
    sim.settle();
    assert_eq!(sim.node(old).confirmed, vec![41]);
}

#[test]
fn an_old_leaders_uncommitted_entries_are_never_applied() {
    let mut sim = Sim::new(3, 4);
    let (old, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.propose(old, &publish(1)).unwrap();
    sim.run(2);
    sim.isolate(old);
    // Still leader for now: these reach its log only.
    let stale: Vec<_> = (100..105)
        .map(|i| sim.propose(old, &publish(i)).unwrap())
        .collect();
    sim.tick();
    for &p in &stale {
        let g = sim.node(old).group();
        assert_eq!(g.ack_state(p, AckPolicy::Leader), AckState::Acked);
        assert_eq!(g.ack_state(p, AckPolicy::Quorum), AckState::Pending);
    }
    let (new, _) = sim.await_leader(Some(old), 3 * MAX_TIMEOUT);
    for i in 2..6 {
        sim.propose(new, &publish(i)).unwrap();
    }
    sim.run(2);
    sim.heal();
    sim.run(2 * ELECTION_TICK);
    let expected: Vec<_> = (1..6).map(publish).collect();
    for id in sim.ids() {
        assert_eq!(sim.applied(id), expected, "node {id}");
    }
    // The old leader's log now holds the new leader's entries at those indexes.
    for &p in &stale {
        let g = sim.node(old).group();
        assert_eq!(g.ack_state(p, AckPolicy::Quorum), AckState::Lost);
        assert_eq!(g.ack_state(p, AckPolicy::All), AckState::Lost);
    }
}

/// Commits entries, crashes a follower (`victim`), commits more, replaces it by an
/// empty replica 4 (optionally after compacting every log) and checks that one catches
/// up; returns how many snapshots replica 4 restored.
fn empty_node_catches_up(compact: bool) -> usize {
    let mut sim = Sim::new(3, 5);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    let victim = sim.ids().into_iter().find(|&i| i != leader).unwrap();
    for i in 0..30 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    sim.crash(victim);
    for i in 30..60 {
        sim.propose(leader, &publish(i)).unwrap();
        if i % 5 == 0 {
            sim.tick();
        }
    }
    sim.run(2);
    if compact {
        for id in sim.ids().into_iter().filter(|&i| i != victim) {
            sim.compact(id);
            let g = sim.node(id).group();
            assert_eq!(
                g.first_index(),
                g.applied_index() + 1,
                "node {id} compacted"
            );
        }
    }
    let new = 4;
    sim.replace_empty(victim, new);
    sim.run(2 * MAX_TIMEOUT);
    let expected: Vec<_> = (0..60).map(publish).collect();
    assert_eq!(sim.applied(new), expected);
    assert_eq!(sim.node(new).voters.as_ref().unwrap().len(), 3);
    // It is a full member again: a new entry commits on it.
    let p = sim.propose(leader, &publish(60)).unwrap();
    sim.run(2);
    assert_eq!(
        sim.node(leader).group().ack_state(p, AckPolicy::All),
        AckState::Acked
    );
    assert_eq!(sim.applied(new).len(), 61);
    sim.node(new).restores
}

#[test]
fn a_node_restarted_empty_catches_up_from_the_log() {
    assert_eq!(
        empty_node_catches_up(false),
        0,
        "caught up without a snapshot"
    );
}

#[test]
fn a_node_restarted_empty_catches_up_from_a_snapshot() {
    assert_eq!(
        empty_node_catches_up(true),
        1,
        "caught up from one snapshot"
    );
}

#[test]
fn a_node_restarted_on_its_store_rebuilds_its_state() {
    let mut sim = Sim::new(3, 6);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    let victim = sim.ids().into_iter().find(|&i| i != leader).unwrap();
    for i in 0..20 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    sim.compact(victim);
    for i in 20..25 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    sim.crash(victim);
    sim.restart(victim);
    sim.run(5);
    let expected: Vec<_> = (0..25).map(publish).collect();
    assert_eq!(sim.applied(victim), expected);
}

/// A member that joins the cluster: it starts with the voters its own placement gives
/// (not the group's), is added as a learner, catches up from a snapshot (the leader's
/// log is compacted), becomes a voter, and a voter leaves; entries commit at each step
/// and the new member ends with every one of them.
#[test]
fn a_learner_catches_up_becomes_a_voter_and_replaces_one() {
    let mut sim = Sim::new(3, 9);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    for i in 0..40 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    for id in sim.ids() {
        sim.compact(id);
    }
    let leaving = sim.ids().into_iter().find(|&i| i != leader).unwrap();
    let staying: Vec<u64> = sim.ids().into_iter().filter(|&i| i != leaving).collect();
    // Its own view of the voters: the two that stay and itself.
    let new = 4;
    sim.start_joining(new, &[staying[0], staying[1], new]);
    sim.run(MAX_TIMEOUT);
    assert!(
        sim.node(new).group().leader().is_none(),
        "not in the group yet: no leader heard of"
    );
    let (voters, learners) = sim.change_membership(Membership::AddLearner(new));
    assert_eq!((voters.len(), learners), (3, vec![new]));
    // A learner does not count towards a commit: with the leaving replica down, the two
    // others still commit.
    sim.crash(leaving);
    let p = sim.propose(leader, &publish(40)).unwrap();
    sim.run(2 * MAX_TIMEOUT);
    assert_eq!(
        sim.node(leader).group().ack_state(p, AckPolicy::Quorum),
        AckState::Acked
    );
    let expected: Vec<_> = (0..41).map(publish).collect();
    assert_eq!(sim.applied(new), expected, "the learner has every entry");
    assert_eq!(sim.node(new).restores, 1, "from one snapshot");
    assert_eq!(sim.node(new).learners.as_deref(), Some(&[new][..]));
    let (voters, learners) = sim.change_membership(Membership::Add(new));
    assert_eq!((voters.len(), learners.len()), (4, 0));
    let (voters, _) = sim.change_membership(Membership::Remove(leaving));
    let mut want = staying.clone();
    want.push(new);
    want.sort_unstable();
    assert_eq!(voters, want);
    let p = sim.propose(leader, &publish(41)).unwrap();
    sim.run(2);
    assert_eq!(
        sim.node(leader).group().ack_state(p, AckPolicy::All),
        AckState::Acked
    );
    assert_eq!(sim.applied(new).len(), 42);
    let mut on_new = sim.node(new).voters.clone().unwrap();
    on_new.sort_unstable();
    assert_eq!(on_new, want, "the new member knows the group's voters");
}

/// A member that joins with its own (wrong) voters is not elected by a member whose
/// configuration does not name it, even when their logs would allow it (both empty:
/// the old member restarted without its log, the others are down).
#[test]
fn a_candidate_outside_the_configuration_gets_no_vote() {
    let mut sim = Sim::new(3, 11);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    for i in 0..5 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    let ids = sim.ids();
    sim.crash(ids[1]);
    sim.crash(ids[2]);
    // ids[0] comes back with an empty log and the group's voters.
    sim.crash(ids[0]);
    sim.start_joining(ids[0], &ids);
    // A new member whose placement is ids[0], ids[1] and itself.
    let new = 4;
    sim.start_joining(new, &[ids[0], ids[1], new]);
    sim.run(6 * MAX_TIMEOUT);
    assert!(
        !sim.node(new).group().is_leader(),
        "elected with the vote of a member whose configuration does not name it"
    );
    assert!(!sim.node(ids[0]).group().is_leader());
}

#[test]
fn ack_policies_wait_for_leader_quorum_or_all() {
    let mut sim = Sim::new(3, 7);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    let ids = sim.ids();
    let slow = ids.iter().copied().find(|&i| i != leader).unwrap();
    // `slow` stays in the group (it hears the other follower) but gets no appends.
    sim.cut_link(leader, slow);
    let p = sim.propose(leader, &publish(1)).unwrap();
    // Before any poll the entry is only in the leader's unstable log: nothing yet.
    for policy in [AckPolicy::Leader, AckPolicy::Quorum, AckPolicy::All] {
        assert_eq!(
            sim.node(leader).group().ack_state(p, policy),
            AckState::Pending
        );
    }
    sim.poll(leader);
    let state = |sim: &Sim, policy| sim.node(leader).group().ack_state(p, policy);
    assert_eq!(state(&sim, AckPolicy::Leader), AckState::Acked);
    assert_eq!(state(&sim, AckPolicy::Quorum), AckState::Pending);
    sim.settle();
    assert_eq!(state(&sim, AckPolicy::Quorum), AckState::Acked);
    assert_eq!(state(&sim, AckPolicy::All), AckState::Pending);
    sim.run(3 * ELECTION_TICK);
    assert_eq!(
        sim.leader(),
        Some(leader),
        "the cut follower deposed no one"
    );
    assert_eq!(state(&sim, AckPolicy::All), AckState::Pending);
    sim.heal();
    sim.run(3);
    assert_eq!(state(&sim, AckPolicy::All), AckState::Acked);

    // An isolated leader: only `leader` acks; once it lost leadership `all` cannot be
    // known there, and after the heal the entry is replaced: lost.
    sim.isolate(leader);
    let p = sim.propose(leader, &publish(2)).unwrap();
    sim.tick();
    assert_eq!(
        state_of(&sim, leader, p, AckPolicy::Leader),
        AckState::Acked
    );
    assert_eq!(
        state_of(&sim, leader, p, AckPolicy::Quorum),
        AckState::Pending
    );
    assert_eq!(state_of(&sim, leader, p, AckPolicy::All), AckState::Pending);
    let (new, _) = sim.await_leader(Some(leader), 3 * MAX_TIMEOUT);
    sim.run(ELECTION_TICK);
    assert_eq!(state_of(&sim, leader, p, AckPolicy::All), AckState::Unknown);
    sim.propose(new, &publish(3)).unwrap();
    sim.heal();
    sim.run(2 * ELECTION_TICK);
    assert_eq!(state_of(&sim, leader, p, AckPolicy::Quorum), AckState::Lost);
    assert_eq!(sim.applied(leader), vec![publish(1), publish(3)]);
}

fn state_of(sim: &Sim, id: u64, p: nsq_replication::ProposalId, policy: AckPolicy) -> AckState {
    sim.node(id).group().ack_state(p, policy)
}

#[test]
fn a_group_is_settled_once_every_replica_holds_the_log_and_knows_the_commit() {
    let mut sim = Sim::new(3, 9);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.run(3);
    for id in sim.ids() {
        assert!(
            sim.node(id).group().settled(),
            "node {id} after the election"
        );
    }
    let ids = sim.ids();
    let lagging = *ids.iter().find(|&&i| i != leader).unwrap();
    let other = *ids.iter().find(|&&i| i != leader && i != lagging).unwrap();
    sim.cut_link(leader, lagging);
    sim.propose(leader, &publish(1)).unwrap();
    // Proposed, not yet committed: nothing is settled on the leader.
    assert!(!sim.node(leader).group().settled());
    sim.run(3);
    // Committed with the other follower; one replica lacks it, so the leader is not
    // settled (it must keep sending), while the followers know of nothing missing.
    assert!(!sim.node(leader).group().settled());
    assert!(sim.node(other).group().settled());
    sim.heal();
    sim.run(3);
    for id in sim.ids() {
        assert!(sim.node(id).group().settled(), "node {id} once healed");
    }
    // A leadership transfer under way: not settled until it is done.
    sim.cut_link(leader, other);
    sim.group(leader).transfer_leader(other);
    sim.settle();
    assert!(!sim.node(leader).group().settled());
    // The followers voted for the leader in its term; the leader did not vote for
    // another.
    assert!(!sim.node(leader).group().voted_for_another());
    assert!(sim.node(other).group().voted_for_another());
    // Meanwhile a proposal is not taken: the caller is told to wait for the new
    // leader, not that the proposal failed.
    assert!(matches!(
        sim.propose(leader, &publish(2)),
        Err(nsq_replication::ReplicationError::HandingOver { to }) if to == other
    ));
    sim.heal();
    // A candidate is never settled.
    sim.isolate(lagging);
    sim.run(3 * MAX_TIMEOUT);
    assert!(!sim.node(lagging).group().settled());
}

#[test]
fn a_handoff_from_a_leader_that_stops_elects_another_at_once() {
    let mut sim = Sim::new(3, 10);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.propose(leader, &publish(1)).unwrap();
    sim.run(3);
    let ids = sim.ids();
    let follower = *ids.iter().find(|&&i| i != leader).unwrap();
    assert!(sim.node(follower).group().handoff().is_empty());
    let ms = sim.node(leader).group().handoff();
    assert_eq!(ms.len(), 2, "one for each other voter");
    let m = ms.into_iter().next().unwrap();
    let to = m.to;
    assert_ne!(to, leader);
    sim.crash(leader);
    // Delivered without a tick: the voter campaigns at once and the other votes for it.
    sim.deliver_now(m);
    sim.settle();
    assert_eq!(sim.leader(), Some(to));
    assert_eq!(sim.applied(to), vec![publish(1)]);
    // The new leader's heartbeat on demand reaches its follower without a tick.
    let other = *sim.ids().iter().find(|&&i| i != leader && i != to).unwrap();
    let term = sim.node(to).group().term();
    sim.group(to).heartbeat();
    sim.group(other).heartbeat();
    sim.settle();
    assert_eq!(sim.node(other).group().leader(), Some(to));
    assert_eq!(sim.node(other).group().term(), term);
}

#[test]
fn unapplied_entries_include_what_the_leader_proposed_and_has_not_persisted() {
    let mut sim = Sim::new(3, 11);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.run(3);
    assert!(sim.node(leader).group().unapplied_entries().is_empty());
    // Proposed: in raft-rs's unstable log until the next poll persists it. A leader
    // numbers its next batch after every entry of its log, this one included.
    sim.propose(leader, &publish(1)).unwrap();
    sim.propose(leader, &publish(2)).unwrap();
    assert_eq!(
        sim.node(leader).group().unapplied_entries(),
        vec![publish(1), publish(2)]
    );
    sim.settle();
    assert!(sim.node(leader).group().unapplied_entries().is_empty());
}

/// A leader whose group is dropped and made again from the last entry it applied (a
/// deleted topic's quiet group) knows no leader and campaigns. Its followers tick no
/// election timeout meanwhile (a quiet group), so they are within the lease of the
/// leader they follow, and would refuse any candidate; the vote request of that very
/// leader ends its lease, and it is elected again after one round of messages, with no
/// tick. Proposals then commit on every node after the entries applied before.
#[test]
fn a_leader_made_again_from_its_applied_entry_is_elected_by_followers_that_do_not_tick() {
    let mut sim = Sim::new(3, 12);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    for i in 0..5 {
        sim.propose(leader, &publish(i)).unwrap();
    }
    sim.run(2);
    let term = sim.group(leader).term();
    sim.remake_from_applied(leader);
    assert_eq!(sim.group(leader).leader(), None);
    sim.group(leader).campaign().unwrap();
    sim.settle();
    assert_eq!(sim.leader(), Some(leader), "elected without a tick");
    assert_eq!(sim.group(leader).term(), term + 1);
    sim.propose(leader, &publish(5)).unwrap();
    sim.settle();
    // The followers learn the commit of the last entry with the next heartbeat.
    sim.run(HEARTBEAT_TICK);
    let expected: Vec<_> = (0..6).map(publish).collect();
    for id in sim.ids() {
        let got: Vec<_> = sim
            .applied(id)
            .into_iter()
            .filter(|e| matches!(e, Entry::PublishAt { .. } | Entry::Publish(_)))
            .collect();
        assert_eq!(got, expected, "node {id}");
    }
}

/// A follower made again the same way knows no leader and asks for votes; the leader,
/// which ticks no heartbeat meanwhile (a quiet group), heartbeats it when it asks, so
/// it follows the same leader in the same term after one round of messages.
#[test]
fn a_follower_made_again_from_its_applied_entry_hears_from_a_leader_that_does_not_tick() {
    let mut sim = Sim::new(3, 13);
    let (leader, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.propose(leader, &publish(0)).unwrap();
    sim.run(2);
    let term = sim.group(leader).term();
    let follower = sim.ids().into_iter().find(|&i| i != leader).unwrap();
    sim.remake_from_applied(follower);
    sim.group(follower).campaign().unwrap();
    sim.settle();
    assert_eq!(sim.group(follower).leader(), Some(leader));
    assert_eq!(sim.leader(), Some(leader));
    assert_eq!(sim.group(leader).term(), term);
}

/// Followers told that their leader is gone (its connection closed) campaign within
/// the ticks they are given instead of after their election timeout (10 ticks or
/// more here), and the one given fewer wins: the other grants its pre-vote, being past
/// the gone leader's lease too. The group elects within 3 ticks, in the next term.
#[test]
fn followers_whose_leader_is_gone_elect_within_the_ticks_they_are_given() {
    let mut sim = Sim::new(3, 14);
    let (old, _) = sim.await_leader(None, 4 * MAX_TIMEOUT);
    sim.propose(old, &publish(0)).unwrap();
    sim.run(2);
    let term = sim.group(old).term();
    sim.isolate(old);
    let followers: Vec<u64> = sim.ids().into_iter().filter(|&i| i != old).collect();
    sim.group(followers[0]).expedite_election(3);
    sim.group(followers[1]).expedite_election(1);
    let (new, ticks) = sim.await_leader(Some(old), 4 * MAX_TIMEOUT);
    assert_eq!(new, followers[1]);
    assert!(ticks <= 3, "elected after {ticks} ticks");
    assert_eq!(sim.group(new).term(), term + 1);
}
