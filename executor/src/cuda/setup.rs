//! Setting up a plan's ranks on their devices: the devices and peer access between them, the
//! tensor-parallel groups over their transport, the events, the phase check of runs against
//! boundary slots, and the memory report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaEvent, CudaStream};
use memra_compiler::plan::{Collective, Plan, Step};

use super::collective::{rows_blocks, Placement};
use super::device::CudaDevice;
use super::nccl;
use super::rank::RankDevice;
use crate::dist::{ProcessMap, World};
use crate::program::Binder;
use crate::reduce::Tree;

/// Every run that touches a boundary slot must have a phase per slot pattern: the slots a
/// step uses repeat with the boundary's slot count, the graphs with the run's phases.
pub(super) fn check_phases(plan: &Plan) -> Result<()> {
    for r in &plan.ranks {
        for step in &r.program {
            let Step::Run {
                id, phases, ops, ..
            } = step
            else {
                continue;
            };
            for b in plan
                .boundaries
                .iter()
                .filter(|b| b.addressed_by(r.rank, ops))
            {
                if !phases.is_multiple_of(b.slots) {
                    bail!(
                        "run {id} touches boundary {} of {} slots but has {phases} phases; the cuda engine needs a multiple",
                        b.boundary,
                        b.slots
                    );
                }
            }
        }
    }
    Ok(())
}

/// Opens every device of the `local` ranks and enables peer access between each pair that a
/// boundary or a tensor-parallel group connects; a pair without P2P is refused by name.
pub(super) fn open_devices(plan: &Plan, local: &[u32]) -> Result<BTreeMap<u32, CudaDevice>> {
    let mut devices = BTreeMap::new();
    for r in plan.ranks.iter().filter(|r| local.contains(&r.rank)) {
        if let std::collections::btree_map::Entry::Vacant(e) = devices.entry(r.device) {
            e.insert(CudaDevice::open(r.device as usize)?);
        }
    }
    let device_of = |rank: u32| {
        plan.rank(rank)
            .filter(|r| local.contains(&r.rank))
            .map(|r| r.device)
    };
    let mut pairs = BTreeSet::new();
    for b in &plan.boundaries {
        if let (Some(a), Some(c)) = (device_of(b.from_rank), device_of(b.to_rank)) {
            pairs.insert((a.min(c), a.max(c)));
        }
    }
    for g in &plan.groups {
        for &x in &g.ranks {
            for &y in &g.ranks {
                if let (Some(a), Some(c)) = (device_of(x), device_of(y)) {
                    pairs.insert((a.min(c), a.max(c)));
                }
            }
        }
    }
    for (a, c) in pairs.into_iter().filter(|(a, c)| a != c) {
        let (da, dc) = (&devices[&a], &devices[&c]);
        if !da.can_access_peer(dc)? || !dc.can_access_peer(da)? {
            bail!("cuda backend: devices {a} and {c} have no peer-to-peer access, which the plan needs between them (a boundary or a tensor-parallel group spans them); place those ranks on devices with p2p");
        }
        da.enable_peer_access(dc)?;
        dc.enable_peer_access(da)?;
    }
    Ok(devices)
}

/// Connects every group over its transport: the one-shot exchange addresses of all members to
/// each member, or one NCCL communicator for the group. With a world (one process per
/// device), `ranks` are this process's; a group spanning processes is one communicator over an
/// id its first member's process shares, which every process takes in plan order.
pub(super) fn connect_groups(
    plan: &Plan,
    ranks: &mut [RankDevice],
    world: Option<(&World, &ProcessMap)>,
) -> Result<()> {
    for g in &plan.groups {
        let tree = Tree::parse(&g.tree, &g.ranks)
            .map_err(|e| anyhow!("group {}: tree `{}`: {e}", g.group, g.tree))?;
        let local: Vec<Option<usize>> = g
            .ranks
            .iter()
            .map(|&m| ranks.iter().position(|r| r.rank == m))
            .collect();
        if let Some((world, map)) = world.filter(|_| local.iter().any(Option::is_none)) {
            let id = nccl::shared_id(world, map.process_of(g.ranks[0]))?;
            for (me, i) in local.iter().enumerate() {
                let Some(i) = *i else { continue };
                let rank = &mut ranks[i];
                let member = nccl::join(
                    &rank.dev,
                    rank.work_stream(),
                    id,
                    me,
                    g.ranks.len(),
                    &tree,
                    rank.collective_len(),
                )
                .map_err(|e| anyhow!("group {}: {e:#}", g.group))?;
                rank.join_nccl(member);
            }
            continue;
        }
        let members = local
            .iter()
            .zip(&g.ranks)
            .map(|(i, m)| {
                i.ok_or_else(|| anyhow!("group {} names rank {m}, which is not declared", g.group))
            })
            .collect::<Result<Vec<usize>>>()?;
        let devices: BTreeSet<usize> = members.iter().map(|&i| ranks[i].dev.ordinal()).collect();
        let own_devices = devices.len() == members.len();
        if g.collective == Collective::Nccl {
            if !own_devices {
                bail!(
                    "group {}: collective = \"nccl\" needs one device per rank",
                    g.group
                );
            }
            let devs: Vec<CudaDevice> = members.iter().map(|&i| ranks[i].dev.clone()).collect();
            let streams: Vec<Arc<CudaStream>> =
                members.iter().map(|&i| ranks[i].work_stream()).collect();
            let cap = members
                .iter()
                .map(|&i| ranks[i].collective_len())
                .max()
                .unwrap_or(1);
            let joined = nccl::connect(&devs, &streams, &tree, cap)
                .map_err(|e| anyhow!("group {}: {e:#}", g.group))?;
            for (member, &i) in joined.into_iter().zip(&members) {
                ranks[i].join_nccl(member);
            }
            continue;
        }
        let mut all = Vec::new();
        for (&i, &m) in members.iter().zip(&g.ranks) {
            all.push(ranks[i].exchange_address().ok_or_else(|| {
                anyhow!("rank {m} is listed by group {} but names no group", g.group)
            })?);
        }
        let caps: BTreeSet<Option<usize>> =
            members.iter().map(|&i| ranks[i].exchange_cap()).collect();
        if caps.len() > 1 {
            bail!(
                "group {}: its members' exchanges hold {caps:?} values each; the one-shot collectives address every member's inboxes alike (the longest vector a member's collectives carry differs between members)",
                g.group
            );
        }
        let placement = if own_devices {
            Placement::OwnDevices
        } else {
            // the ranks of this process on each member's device share its SMs
            let on_device = |d: usize| ranks.iter().filter(|r| r.dev.ordinal() == d).count();
            let rows_blocks = members
                .iter()
                .map(|&i| rows_blocks(ranks[i].dev.sm_count(), on_device(ranks[i].dev.ordinal())))
                .min()
                .unwrap_or(1);
            Placement::Shared { rows_blocks }
        };
        for (me, &i) in members.iter().enumerate() {
            ranks[i].connect(&all, me, &tree, placement)?;
        }
    }
    Ok(())
}

/// One event per (event, slot), on the device of the rank that records it; the plan's events
/// are checked first (one record each, every wait bound to one) as both engines check them.
pub(super) fn make_events(
    plan: &Plan,
    ranks: &[RankDevice],
) -> Result<BTreeMap<String, Vec<CudaEvent>>> {
    Binder::new(plan)?;
    let mut events = BTreeMap::new();
    for rank in ranks {
        let r = plan
            .rank(rank.rank)
            .ok_or_else(|| anyhow!("invariant: rank {} is the plan's", rank.rank))?;
        for step in &r.program {
            let Step::Record { event, .. } = step else {
                continue;
            };
            let slots = plan
                .boundaries
                .iter()
                .find(|b| *event == b.ready() || *event == b.consumed())
                .map_or(1, |b| b.slots);
            let list = (0..slots)
                .map(|_| rank.dev.new_event(false))
                .collect::<Result<Vec<_>>>()?;
            events.insert(event.clone(), list);
        }
    }
    Ok(events)
}

/// One line per device: what this engine took (free memory before its uploads less after),
/// what the device has in use in all (this process's context included; the engine's own
/// figure on an otherwise idle device), what the plan counts, and what it counts for steps of
/// the engine's `max_rows` token rows (the plan sizes activations for a prefill chunk; an
/// engine that runs prompts token by token holds one row).
pub(super) fn memory_report(
    plan: &Plan,
    devices: &BTreeMap<u32, CudaDevice>,
    free_before: &BTreeMap<u32, usize>,
    max_rows: u32,
) -> Result<Vec<String>> {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let mut lines = Vec::new();
    for (&d, dev) in devices {
        let (free, total) = dev.memory()?;
        let taken = free_before[&d].saturating_sub(free);
        let ranks: Vec<String> = plan
            .ranks
            .iter()
            .filter(|r| r.device == d)
            .map(|r| r.rank.to_string())
            .collect();
        let planned = plan
            .devices
            .iter()
            .find(|u| u.device == d)
            .map_or(0, |u| u.total_bytes);
        // the prefill step's token rows past the engine's
        let rows: u64 = plan
            .ranks
            .iter()
            .filter(|r| r.device == d)
            .flat_map(|r| &r.buffers)
            .map(|b| {
                b.bytes
                    * u64::from(b.tokens.saturating_sub(max_rows.min(b.tokens)))
                    * u64::from(b.slots)
            })
            .sum();
        lines.push(format!(
            "device {d} ({}, {}): ranks {}: {:.1} MiB in use on the device, {:.1} MiB taken, plan {:.1} MiB, {:.1} MiB of it for steps of {max_rows} token rows",
            dev.name(),
            dev.arch(),
            ranks.join(", "),
            mib(total.saturating_sub(free) as f64),
            mib(taken as f64),
            mib(planned as f64),
            mib(planned.saturating_sub(rows) as f64)
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_phases_miss_a_boundarys_slots_is_refused_by_name() {
        // four stages of four sequences: the hidden states have 2 slots; the token comes back
        // to stage 0 through 5, which stage 0 stages before its graph and the sampler stores
        let text = include_str!("../../../plans/llama3-8b-pp4.plan.toml");
        let pp4 = Plan::from_toml(text).expect("a golden plan parses");
        check_phases(&pp4).unwrap();
        let from = r#"id = "r1.run0", stream = "compute", phases = 2"#;
        assert!(text.contains(from));
        let bad = Plan::from_toml(&text.replace(from, &from.replace("= 2", "= 3")))
            .expect("an edited plan parses");
        let err = check_phases(&bad).unwrap_err().to_string();
        assert!(
            err.contains("run r1.run0 touches boundary 0 of 2 slots but has 3 phases"),
            "{err}"
        );
    }
}
