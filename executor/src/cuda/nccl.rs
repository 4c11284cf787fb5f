//! NCCL as the transport of a tensor-parallel group's collectives (`collective = "nccl"` in
//! the plan): NCCL all-gathers every member's partial into a `[members, n]` buffer on every
//! member, and `combine_f32` (kernels/collective.cu) adds them into x in the group's tree, so
//! the logits are bit for bit those of the one-shot kernels and of one rank. NCCL is loaded at
//! run time like the driver (libnccl.so on the library path); NCCL's launches are capturable,
//! so the collectives stay inside the rank's graphs. A group is one NCCL communicator with
//! one rank per device: `ncclCommInitAll` when its members run in one process, one
//! `ncclCommInitRank` per process over an id the world shares when they run in several
//! (`memra-run launch`); the placement validation refuses NCCL for a group with two ranks on
//! one device.

use std::ffi::c_char;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};
use cudarc::nccl::{group_end, group_start, Comm, Id};

use super::collective::{postfix, Reduce};
use super::device::{CudaDevice, DeviceBuffer};
use super::span::Span;
use crate::dist::World;
use crate::reduce::Tree;

/// Threads per block of the combine kernel (COMBINE_THREADS in kernels/collective.cu).
const COMBINE_THREADS: usize = 256;

/// One member of an NCCL group: its communicator rank and its gather buffer.
pub struct NcclMember {
    dev: CudaDevice,
    comm: Comm,
    gathered: DeviceBuffer<f32>,
    tree: DeviceBuffer<i32>,
    tree_len: usize,
    members: usize,
    me: usize,
}

/// Whether the NCCL library can be loaded, with the error a plan that needs it reports.
pub fn check_library() -> Result<()> {
    // SAFETY: only probes for the library file; no NCCL function is called
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        bail!("the plan's tensor-parallel groups use collective = \"nccl\", but no nccl library was found (libnccl.so); put the directory holding it on LD_LIBRARY_PATH (pip's nvidia-nccl-cu13 ships it), or compile the placement with collective = \"oneshot\"")
    }
}

/// Creates one communicator for a group whose members all run in this process on `streams`
/// (member order, one device each) and warms every connection with one grouped all-gather,
/// so later calls from one host thread never wait for a member the thread has not reached
/// yet. `cap` is the longest vector a collective carries.
pub fn connect(
    devices: &[CudaDevice],
    streams: &[Arc<CudaStream>],
    tree: &Tree,
    cap: usize,
) -> Result<Vec<NcclMember>> {
    check_library()?;
    let comms = Comm::from_devices(streams.to_vec())
        .map_err(|e| anyhow!("cuda backend: nccl communicator setup: {e:?}"))?;
    let members = comms.len();
    let out = comms
        .into_iter()
        .zip(devices)
        .enumerate()
        .map(|(me, (comm, dev))| NcclMember::new(dev, comm, tree, cap, members, me))
        .collect::<Result<Vec<_>>>()?;
    warm_up(&out)?;
    Ok(out)
}

/// Joins this process's one member `me` of a group of `members` whose other members run in
/// other processes, over the communicator `id` names, and warms its connections.
pub fn join(
    dev: &CudaDevice,
    stream: Arc<CudaStream>,
    id: Id,
    me: usize,
    members: usize,
    tree: &Tree,
    cap: usize,
) -> Result<NcclMember> {
    check_library()?;
    stream.context().bind_to_thread()?;
    let comm = Comm::from_rank(stream, me, members, id)
        .map_err(|e| anyhow!("cuda backend: nccl communicator setup: {e:?}"))?;
    let member = NcclMember::new(dev, comm, tree, cap, members, me)?;
    warm_up(std::slice::from_ref(&member))?;
    Ok(member)
}

/// An NCCL id made by process `root` and handed to every process of the world; every
/// process calls it for the same communicators in the same order.
pub fn shared_id(world: &World, root: u32) -> Result<Id> {
    check_library()?;
    let mine = if world.process() == root {
        let id = Id::new().map_err(|e| anyhow!("cuda backend: nccl id: {e:?}"))?;
        Some(id.internal().iter().map(|&c| c as u8).collect())
    } else {
        None
    };
    let bytes = world.share(root, mine)?;
    let internal: [c_char; 128] = bytes
        .iter()
        .map(|&b| b as c_char)
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|_| {
            anyhow!(
                "process {root} shared an nccl id of {} bytes; an id has 128",
                bytes.len()
            )
        })?;
    Ok(Id::uninit(internal))
}

/// One grouped all-gather over `members`' communicators, then waits for it.
fn warm_up(members: &[NcclMember]) -> Result<()> {
    group_start().map_err(|e| anyhow!("cuda backend: nccl group start: {e:?}"))?;
    for m in members {
        let cap = m.gathered.len() / m.members;
        let part = Span::of(&m.gathered).sub(m.me * cap, cap);
        m.comm
            .all_gather(&part, &mut Span::of(&m.gathered))
            .map_err(|e| anyhow!("cuda backend: nccl warm-up all-gather: {e:?}"))?;
    }
    group_end().map_err(|e| anyhow!("cuda backend: nccl group end: {e:?}"))?;
    for m in members {
        m.comm
            .stream()
            .synchronize()
            .map_err(|e| anyhow!("cuda backend: nccl warm-up: {e:?}"))?;
    }
    Ok(())
}

impl NcclMember {
    fn new(
        dev: &CudaDevice,
        comm: Comm,
        tree: &Tree,
        cap: usize,
        members: usize,
        me: usize,
    ) -> Result<NcclMember> {
        let s = comm.stream();
        let mut ops = Vec::new();
        postfix(tree, &mut ops);
        Ok(NcclMember {
            gathered: dev.alloc(&s, members * cap)?,
            tree: dev.upload(&s, &ops)?,
            tree_len: ops.len(),
            members,
            me,
            comm,
            dev: dev.clone(),
        })
    }

    /// Enqueues the collective `what` of this member's `part` into `out`: NCCL gathers every
    /// member's part (into `out` itself for member 0's gather), then a sum combines them in
    /// the tree.
    pub fn run(&self, what: Reduce, part: &Span<f32>, out: &Span<f32>) -> Result<()> {
        let n = part.len();
        let mut gathered = match what {
            Reduce::Gather if self.me == 0 => out.sub(0, self.members * n),
            _ => Span::of(&self.gathered).sub(0, self.members * n),
        };
        self.comm
            .all_gather(part, &mut gathered)
            .map_err(|e| anyhow!("cuda backend: nccl all-gather of {n} values: {e:?}"))?;
        if what == Reduce::Gather {
            return Ok(());
        }
        let (g, tree, xp) = (gathered.addr(), Span::of(&self.tree).addr(), out.addr());
        let (ntree, n_i) = (self.tree_len as i32, n as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(COMBINE_THREADS).max(1) as u32, 1, 1),
            block_dim: (COMBINE_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match combine_f32's signature in order and type; `gathered`
        // holds members * n values, `out` (x) holds n
        unsafe {
            self.dev
                .launch_kernel(&self.comm.stream(), "combine_f32", cfg, |a| {
                    a.arg(&g).arg(&tree).arg(&ntree).arg(&n_i).arg(&xp);
                })
        }
    }
}
