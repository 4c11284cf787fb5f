//! Tensor-parallel collectives on CUDA (kernels/collective.cu), over one of two transports the
//! plan's group names. `Oneshot`: each rank of a group owns an `Exchange` in its device memory,
//! an inbox per member that the members push tagged words into; once every rank of the plan
//! exists, `Oneshot::connect` gives each member a device table of all members' exchange
//! addresses (peer memory across devices). `Nccl` (`super::nccl`): NCCL all-gathers the
//! partials. Both combine in the group's tree (uploaded in postfix) on every member, so the
//! bits are the transport's choice never. The launches read everything per step from device
//! memory (NCCL's are capturable too), so they sit inside captured graphs.

use std::sync::Arc;

use anyhow::{bail, Result};
use cudarc::driver::{CudaStream, DeviceSlice, LaunchConfig};

use super::device::{CudaDevice, DeviceBuffer};
use super::span::Span;
use crate::reduce::Tree;

/// Values per block of a collective (COLL_SLICE in kernels/collective.cu).
const SLICE: usize = 256;
/// Threads of a block of all_reduce_rows_f32 (COLL_ROWS_THREADS in kernels/collective.cu).
const ROWS_THREADS: u32 = 512;
/// Members per group the kernels address (COLL_MAX_MEMBERS in kernels/collective.cu).
pub const MAX_MEMBERS: usize = 8;
/// Mailbox words per block after a member's inboxes (all_reduce_rows_f32).
const MAIL_WORDS: usize = 4;
/// How long a member waits for its peers before the kernel traps: far beyond any decode step,
/// so only a peer that never comes (a broken plan or a dead rank) hits it.
const TIMEOUT_NS: u64 = 30_000_000_000;

/// One rank's exchange area: an inbox per member, two sets by parity, of 8-byte words (a
/// value and the sequence number of the collective that wrote it), then a mailbox of
/// `MAIL_WORDS` per block (`all_reduce_rows_f32`: its part's address, the sequence numbers
/// of its publishing and of its being done); and the sequence words.
pub struct Exchange {
    data: DeviceBuffer<u64>,
    seq: DeviceBuffer<u64>,
    cap: usize,
}

impl Exchange {
    /// An exchange for vectors of up to `cap` values from each of `members` members, zeroed
    /// (sequence 0; no word carries a sequence number of a collective yet).
    pub fn new(
        dev: &CudaDevice,
        stream: &Arc<CudaStream>,
        cap: usize,
        members: usize,
    ) -> Result<Exchange> {
        let cap = cap.div_ceil(SLICE) * SLICE;
        Ok(Exchange {
            data: dev.alloc(stream, 2 * members * cap + MAIL_WORDS * (cap / SLICE))?,
            seq: dev.alloc(stream, cap / SLICE)?,
            cap,
        })
    }

    /// The inboxes' address, for the peers' tables.
    pub fn address(&self) -> u64 {
        Span::of(&self.data).addr()
    }

    /// Values per inbox: the members of a group address each other's inboxes by their own.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// A member's collectives, over the transport its group names.
pub enum Collective {
    /// The one-shot push kernels.
    Oneshot(Oneshot),
    /// NCCL all-gathers and a local combine.
    Nccl(super::nccl::NcclMember),
}

/// What a collective makes of the members' vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// `out += ` the sum of every member's part, in the group's tree order (the residual add
    /// of a row-parallel projection).
    Sum,
    /// `out` on member 0 = every member's part, concatenated in member order (vocab-parallel
    /// logits); the other members' `out` is not written.
    Gather,
}

impl Collective {
    /// Enqueues the collective `what` of this member's `part` into `out` on the member's
    /// stream.
    pub fn run(&self, what: Reduce, part: &Span<f32>, out: &Span<f32>) -> Result<()> {
        match self {
            Collective::Oneshot(c) => c.run(what, part, out),
            Collective::Nccl(c) => c.run(what, part, out),
        }
    }
}

/// A member's view of its one-shot group: its exchange, the peers' addresses and the combine
/// tree.
pub struct Oneshot {
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    exchange: Exchange,
    peers: DeviceBuffer<u64>,
    tree: DeviceBuffer<i32>,
    tree_len: usize,
    members: usize,
    me: usize,
    /// Every member on its own device: the next kernel may launch while this one waits.
    early: i32,
    /// Most blocks a launch takes: a block per slice on own devices; members sharing a
    /// device take one block per `SHARED_SMS_PER_BLOCK * members` SMs each, so the blocks
    /// spinning for peers never hold the SMs those peers' kernels need.
    max_blocks: usize,
    placement: Placement,
}

/// SMs per spinning block of a member, over the members, when members share a device.
const SHARED_SMS_PER_BLOCK: usize = 4;
/// The same for all_reduce_rows_f32 over the ranks on the device, whose blocks spin only
/// while a peer's same block has not started or not finished: half the SMs at most.
const ROWS_SMS_PER_BLOCK: usize = 2;

/// How a group's members sit on devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every member on its own device.
    OwnDevices,
    /// Some members share a device: each member's all_reduce_rows_f32 launches `rows_blocks`
    /// blocks, a number the whole group agrees on (`rows_blocks`).
    Shared { rows_blocks: usize },
}

/// Blocks of all_reduce_rows_f32 for a member on a device of `sm_count` SMs that holds
/// `ranks` ranks; a group takes the least over its members.
pub fn rows_blocks(sm_count: usize, ranks: usize) -> usize {
    (sm_count / (ROWS_SMS_PER_BLOCK * ranks.max(1))).max(1)
}

/// The tree in postfix: a member index pushes, -1 adds the top two (left + right).
pub(super) fn postfix(tree: &Tree, out: &mut Vec<i32>) {
    match tree {
        Tree::Leaf(i) => out.push(*i as i32),
        Tree::Node(a, b) => {
            postfix(a, out);
            postfix(b, out);
            out.push(-1);
        }
    }
}

impl Oneshot {
    /// Connects member `me` of a group whose members' exchanges are at `all` (in member
    /// order), combining in `tree`; the tables live on `dev`, the collectives run on
    /// `stream`.
    pub fn connect(
        dev: &CudaDevice,
        stream: &Arc<CudaStream>,
        exchange: Exchange,
        all: &[u64],
        me: usize,
        tree: &Tree,
        placement: Placement,
    ) -> Result<Oneshot> {
        if all.len() > MAX_MEMBERS {
            bail!(
                "a tensor-parallel group of {} ranks is above the {MAX_MEMBERS} the cuda collectives support",
                all.len()
            );
        }
        let mut table = vec![0u64; MAX_MEMBERS];
        table[..all.len()].copy_from_slice(all);
        let mut ops = Vec::new();
        postfix(tree, &mut ops);
        let own_devices = placement == Placement::OwnDevices;
        Ok(Oneshot {
            dev: dev.clone(),
            stream: stream.clone(),
            peers: dev.upload(stream, &table)?,
            tree: dev.upload(stream, &ops)?,
            tree_len: ops.len(),
            members: all.len(),
            me,
            exchange,
            early: i32::from(own_devices),
            max_blocks: if own_devices {
                usize::MAX
            } else {
                (dev.sm_count() / (SHARED_SMS_PER_BLOCK * all.len())).max(1)
            },
            placement,
        })
    }

    /// Enqueues the collective `what` of this member's `part` into `out`.
    fn run(&self, what: Reduce, part: &Span<f32>, out: &Span<f32>) -> Result<()> {
        let n = part.len();
        assert!(
            n <= self.exchange.cap,
            "invariant: a collective of {n} values fits the exchange of {}",
            self.exchange.cap
        );
        if what == Reduce::Sum {
            assert_eq!(n, out.len(), "invariant: all-reduce part and x lengths");
        }
        let mut blocks = n.div_ceil(SLICE).clamp(1, self.max_blocks);
        let mut threads = SLICE as u32;
        let kernel = match (what, self.placement) {
            // more slices than the few blocks of members sharing a device: they read each
            // other's parts in place (a mailbox and a sequence word per block: at most one
            // block per slice)
            (Reduce::Sum, Placement::Shared { rows_blocks }) if blocks * SLICE < n => {
                blocks = rows_blocks.min(n.div_ceil(SLICE));
                threads = ROWS_THREADS;
                "all_reduce_rows_f32"
            }
            (Reduce::Sum, _) => "all_reduce_f32",
            (Reduce::Gather, _) => {
                assert!(
                    self.me != 0 || out.len() == n * self.members,
                    "invariant: the gathered logits hold every member's slice"
                );
                "gather_f32"
            }
        };
        let (peers, tree, seq) = (
            Span::of(&self.peers).addr(),
            Span::of(&self.tree).addr(),
            Span::of(&self.exchange.seq).addr(),
        );
        let (ntree, members, me, n_i, cap) = (
            self.tree_len as i32,
            self.members as i32,
            self.me as i32,
            n as i32,
            self.exchange.cap as i32,
        );
        let (pp, op) = (part.addr(), out.addr());
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match both kernels' signature in order and type; the tables
        // hold live exchange addresses of every member (peer access is enabled between them);
        // `out` holds what `what` writes (checked above)
        unsafe {
            self.dev.launch_kernel(&self.stream, kernel, cfg, |a| {
                a.arg(&peers)
                    .arg(&tree)
                    .arg(&ntree)
                    .arg(&members)
                    .arg(&me)
                    .arg(&n_i)
                    .arg(&cap)
                    .arg(&pp)
                    .arg(&op)
                    .arg(&seq)
                    .arg(&self.early)
                    .arg(&TIMEOUT_NS);
            })
        }
    }
}
