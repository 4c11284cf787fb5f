//! Which local ranks a CUDA step walks in lockstep (`Engine::walk_lockstep`): the members
//! of a group, unless one of the group's boundaries makes a wait's binding depend on the
//! enqueue order within a step.

use std::collections::BTreeSet;

use memra_compiler::plan::Plan;

/// The local ranks `local` (plan ranks; indices into it come back) in plan order, split into
/// walk sets: the consecutive members of one group form a set, every other rank is a set of
/// its own. A group with a boundary between two members whose receiver takes, at a step, the
/// slot its sender fills at that same step (lag a multiple of the slots) keeps plan order
/// (one set per member): that wait binds to the record plan order enqueues before it, which
/// a lockstep round might enqueue after it.
pub(super) fn walk_sets(plan: &Plan, local: &[u32]) -> Vec<Vec<usize>> {
    let group_of = |r: u32| plan.rank(r).and_then(|x| x.group);
    let unlagged: BTreeSet<u32> = plan
        .boundaries
        .iter()
        .filter(|b| {
            b.recv_slot(0) == b.send_slot(0) && group_of(b.from_rank) == group_of(b.to_rank)
        })
        .filter_map(|b| group_of(b.from_rank))
        .collect();
    let mut sets: Vec<Vec<usize>> = Vec::new();
    let mut last = None;
    for (i, &r) in local.iter().enumerate() {
        let group = group_of(r).filter(|g| !unlagged.contains(g));
        match sets.last_mut() {
            Some(set) if group.is_some() && group == last => set.push(i),
            _ => sets.push(vec![i]),
        }
        last = group;
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StepInput;
    use crate::program::recorder::{Enqueued, Recorder};
    use crate::program::{Binder, Lockstep, Program};
    use memra_compiler::plan::event_slot;

    fn plan(text: &str) -> Plan {
        Plan::from_toml(text).expect("a golden plan parses")
    }

    fn all_sets(plan: &Plan) -> Vec<Vec<usize>> {
        let local: Vec<u32> = plan.ranks.iter().map(|r| r.rank).collect();
        walk_sets(plan, &local)
    }

    #[test]
    fn a_groups_members_walk_in_lockstep() {
        let tp2 = plan(include_str!(
            "../../../plans/synthetic/tiny-qwen3moe-tp2.plan.toml"
        ));
        assert_eq!(all_sets(&tp2), [vec![0, 1]]);
        // two stages of two: each stage's group is a set, stage 0 before stage 1
        let pp2_tp2 = plan(include_str!(
            "../../../plans/synthetic/tiny-tp-pp2-tp2.plan.toml"
        ));
        assert_eq!(all_sets(&pp2_tp2), [vec![0, 1], vec![2, 3]]);
        // no group: plan order, a rank a set
        let pp2 = plan(include_str!(
            "../../../plans/synthetic/tiny-deepseek2-pp2.plan.toml"
        ));
        assert_eq!(all_sets(&pp2), [vec![0], vec![1]]);
        // a process holding one member of a group walks it alone
        assert_eq!(walk_sets(&tp2, &[1]), [vec![0]]);
    }

    #[test]
    fn an_unlagged_boundary_inside_a_group_keeps_plan_order() {
        let mut ep2 = plan(include_str!(
            "../../../plans/synthetic/tiny-kimi-linear-ep2.plan.toml"
        ));
        assert_eq!(all_sets(&ep2), [vec![0, 1]]);
        ep2.boundaries[0].lag = 0;
        assert_eq!(all_sets(&ep2), [vec![0], vec![1]]);
        // lagged by as many steps as it has slots: the same slot as the same step's record
        ep2.boundaries[0].lag = ep2.boundaries[0].slots;
        assert_eq!(all_sets(&ep2), [vec![0], vec![1]]);
    }

    /// Enqueues steps `0..steps` of every rank as the engine does: its walk sets in plan
    /// order, a set of several members in lockstep rounds.
    fn enqueue(plan: &Plan, steps: u64) -> Vec<(u32, Enqueued)> {
        let local: Vec<u32> = plan.ranks.iter().map(|r| r.rank).collect();
        let programs: Vec<Program> = local.iter().map(|&r| Program::of(plan, r)).collect();
        let mut log = Vec::new();
        for t in 0..steps {
            let input = StepInput::sampled(t as u32);
            for set in walk_sets(plan, &local) {
                let mut lock = Lockstep::new(set.len());
                while !lock.finished() {
                    let mut progressed = false;
                    for (j, &ri) in set.iter().enumerate() {
                        if !lock.done(j) {
                            let rank = programs[ri].rank;
                            let mut ops = Recorder {
                                member: rank,
                                log: &mut log,
                            };
                            lock.turn(j, &programs[ri], &mut ops, t, &input, &mut progressed)
                                .expect("the log never fails");
                        }
                    }
                    assert!(progressed, "a round enqueues something");
                }
            }
        }
        log
    }

    #[test]
    fn lockstep_binds_every_wait_of_the_golden_plans_as_plan_order_does() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans");
        let mut grouped = 0;
        for dir in [root.clone(), root.join("synthetic")] {
            let mut paths: Vec<_> = std::fs::read_dir(&dir)
                .expect("the plans directory")
                .map(|e| e.expect("a directory entry").path())
                .filter(|p| p.to_string_lossy().ends_with(".plan.toml"))
                .collect();
            paths.sort();
            for path in paths {
                let text = std::fs::read_to_string(&path).expect("a golden plan");
                let plan = plan(&text);
                let local: Vec<u32> = plan.ranks.iter().map(|r| r.rank).collect();
                if walk_sets(&plan, &local).iter().any(|s| s.len() > 1) {
                    grouped += 1;
                }
                let binder = Binder::new(&plan).expect("the golden plans bind");
                let log = enqueue(&plan, 5);
                for (i, e) in log.iter().enumerate() {
                    let (rank, Enqueued::Wait { event, at, t }) = e else {
                        continue;
                    };
                    let want = event_slot(&plan.boundaries, event, *rank, *t);
                    // the record a CUDA wait binds to: the last one enqueued of its slot
                    let bound = log[..i].iter().rev().find_map(|r| match r {
                        (rank, Enqueued::Record { event: e, t })
                            if e == event && event_slot(&plan.boundaries, e, *rank, *t) == want =>
                        {
                            Some(*t)
                        }
                        _ => None,
                    });
                    assert_eq!(
                        bound,
                        binder.bound_step(event, *rank, *at, *t),
                        "{}: rank {rank}'s wait for `{event}` at step {t}",
                        path.display()
                    );
                }
            }
        }
        assert!(grouped >= 10, "only {grouped} golden plans have a group");
    }
}
