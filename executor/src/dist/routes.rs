//! Which process runs which rank, and where each shared thing of a plan must go. One process
//! per device: process `P` runs the ranks of the `P`-th device the plan's ranks use, in
//! increasing device order (a device is a process slot on the CPU backend, a GPU on CUDA).
//! `Routes` is what one process's wire needs to know about the others: which processes wait
//! on each event it records, which process receives each boundary it sends, and which
//! processes take each collective's parts. Every backend's wire can route with it.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use memra_compiler::plan::{Plan, Step};

/// The processes of a plan and their ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMap {
    /// The device of each process, by process.
    devices: Vec<u32>,
    /// The process of each rank.
    of_rank: BTreeMap<u32, u32>,
    /// The process holding the readback rank, when the plan has one.
    reader: Option<u32>,
}

impl ProcessMap {
    /// One process per device of `plan`'s ranks.
    pub fn of(plan: &Plan) -> ProcessMap {
        let devices: Vec<u32> = plan
            .ranks
            .iter()
            .map(|r| r.device)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let process = |device: u32| {
            devices
                .iter()
                .position(|&d| d == device)
                .expect("invariant: every rank's device is listed") as u32
        };
        let of_rank = plan
            .ranks
            .iter()
            .map(|r| (r.rank, process(r.device)))
            .collect();
        let reader = plan
            .ranks
            .iter()
            .find(|r| r.program.iter().any(|s| matches!(s, Step::Readback { .. })))
            .map(|r| process(r.device));
        ProcessMap {
            devices,
            of_rank,
            reader,
        }
    }

    /// Number of processes: the devices the plan's ranks use.
    pub fn processes(&self) -> u32 {
        self.devices.len() as u32
    }

    /// Refuses a world of `processes` that does not match the plan.
    pub fn check(&self, processes: u32) -> Result<()> {
        if processes != self.processes() {
            let list: Vec<String> = self.devices.iter().map(u32::to_string).collect();
            bail!(
                "the plan's ranks use {} devices ({}), one process each, but --processes is {processes}",
                self.devices.len(),
                list.join(", ")
            );
        }
        Ok(())
    }

    /// The device process `process` runs.
    pub fn device(&self, process: u32) -> u32 {
        self.devices[process as usize]
    }

    /// The process running `rank`.
    pub fn process_of(&self, rank: u32) -> u32 {
        self.of_rank[&rank]
    }

    /// The ranks process `process` runs, in plan order.
    pub fn ranks(&self, plan: &Plan, process: u32) -> Vec<u32> {
        plan.ranks
            .iter()
            .filter(|r| self.of_rank[&r.rank] == process)
            .map(|r| r.rank)
            .collect()
    }

    /// The process holding the readback rank: the one with the logits, which prints.
    pub fn reader(&self) -> Option<u32> {
        self.reader
    }
}

/// Which members of a group take a collective's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takers {
    /// Every member (an all-reduce).
    All,
    /// The first member (the logits gather).
    First,
}

/// Where one process sends what its ranks share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    me: u32,
    /// Per event: the other processes holding a rank that waits on it.
    waiters: BTreeMap<String, Vec<u32>>,
    /// Per boundary: the process of its receiving rank.
    receivers: BTreeMap<u32, u32>,
    /// Per group: the process of each member, by member index.
    members: BTreeMap<u32, Vec<u32>>,
}

impl Routes {
    /// The routes of process `me` of `map` for `plan`.
    pub fn of(plan: &Plan, map: &ProcessMap, me: u32) -> Routes {
        let mut waiters: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for r in &plan.ranks {
            let p = map.process_of(r.rank);
            for step in &r.program {
                if let Step::Wait { event, .. } = step {
                    let list = waiters.entry(event.clone()).or_default();
                    if p != me && !list.contains(&p) {
                        list.push(p);
                    }
                }
            }
        }
        waiters.values_mut().for_each(|l| l.sort_unstable());
        Routes {
            me,
            waiters,
            receivers: plan
                .boundaries
                .iter()
                .map(|b| (b.boundary, map.process_of(b.to_rank)))
                .collect(),
            members: plan
                .groups
                .iter()
                .map(|g| {
                    (
                        g.group,
                        g.ranks.iter().map(|&r| map.process_of(r)).collect(),
                    )
                })
                .collect(),
        }
    }

    /// This process.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// The other processes that wait on `event`.
    pub fn waiters(&self, event: &str) -> &[u32] {
        self.waiters.get(event).map_or(&[], Vec::as_slice)
    }

    /// The receiving process of `boundary` when it is another process.
    pub fn remote_receiver(&self, boundary: u32) -> Option<u32> {
        self.receivers
            .get(&boundary)
            .copied()
            .filter(|&p| p != self.me)
    }

    /// How many of `group`'s takers each process holds, for every process holding one.
    pub fn takers(&self, group: u32, takers: Takers) -> Vec<(u32, u32)> {
        let members = self.members.get(&group).map_or(&[][..], Vec::as_slice);
        let taking = match takers {
            Takers::All => members,
            Takers::First => &members[..members.len().min(1)],
        };
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        taking
            .iter()
            .for_each(|&p| *counts.entry(p).or_default() += 1);
        counts.into_iter().collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// PP-2 x TP-2 with one rank of each stage on each of two devices (the tests of other
    /// modules that need processes holding two ranks use it too).
    pub(crate) fn two_ranks_per_device() -> Plan {
        let text = include_str!("../../../plans/synthetic/tiny-tp-pp2-tp2-2dev.plan.toml");
        Plan::from_toml(text).unwrap()
    }

    #[test]
    fn processes_hold_the_ranks_of_their_device() {
        let plan = two_ranks_per_device();
        let map = ProcessMap::of(&plan);
        assert_eq!(map.processes(), 2);
        assert_eq!(map.ranks(&plan, 0), [0, 2]);
        assert_eq!(map.ranks(&plan, 1), [1, 3]);
        assert_eq!(map.reader(), Some(0));
        assert!(map.check(2).is_ok());
        let e = map.check(4).unwrap_err().to_string();
        assert_eq!(
            e,
            "the plan's ranks use 2 devices (0, 1), one process each, but --processes is 4"
        );
    }

    #[test]
    fn routes_reach_only_the_other_processes_that_need_it() {
        let plan = two_ranks_per_device();
        let map = ProcessMap::of(&plan);
        let (p0, p1) = (Routes::of(&plan, &map, 0), Routes::of(&plan, &map, 1));
        // The token to rank 1 crosses; the hidden states stay on their device.
        assert_eq!(p0.remote_receiver(3), Some(1));
        assert_eq!(p0.remote_receiver(0), None);
        assert_eq!(p1.remote_receiver(1), None);
        // Rank 1 waits for the token's `ready`; rank 2 for its `consumed`.
        assert_eq!(p0.waiters("b3.ready"), [1]);
        assert_eq!(p1.waiters("b3.consumed"), [0]);
        assert!(p0.waiters("b0.ready").is_empty());
        // The all-reduce is taken on both sides, the logits gather by rank 2 only.
        assert_eq!(p1.takers(1, Takers::All), [(0, 1), (1, 1)]);
        assert_eq!(p1.takers(1, Takers::First), [(0, 1)]);
    }
}
