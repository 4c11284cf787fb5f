//! Pass 6, place: connect the stages. Each rank of stage s+1 receives the hidden state from
//! rank `tp_index mod degree` of stage s; every first-stage rank but the sampler receives the
//! sampled token from the sampler. Boundaries on one device use a device copy, across devices
//! a peer copy. The sampler gets a readback on its own stream. A hidden-state boundary
//! carries every token row of a prefill chunk; the token boundary one sampled token. A cut
//! between a full DSA layer and a shared-indexer layer after it that reads its selection
//! carries that selection too (`Boundary::selection`): the receiving stage has no indexer
//! cache of the full layer to select again from.

use super::Topology;
use crate::graph::{DecodeGraph, Node, NodeKind, StreamKind};
use crate::model::ModelMeta;
use crate::placement::{Placement, TransportChoice};
use crate::plan::{Boundary, Carries, Transport, HIDDEN_SLOTS};

/// Add boundaries and the readback to the sharded graph.
pub fn place(g: &mut DecodeGraph, topo: &mut Topology, model: &ModelMeta, placement: &Placement) {
    // the residual row: every mHC stream crosses the boundary
    let d = model.residual_width();
    let mut pairs = Vec::new();
    for receiver in &topo.ranks {
        if receiver.stage == 0 {
            continue;
        }
        let senders: Vec<_> = topo
            .ranks
            .iter()
            .filter(|r| r.stage == receiver.stage - 1)
            .collect();
        let sender = senders[(receiver.tp_index as usize) % senders.len()];
        pairs.push((Carries::Hidden, sender.rank, receiver.rank));
    }
    let sampler = topo
        .ranks
        .iter()
        .find(|r| r.sampler)
        .expect("invariant: the last stage has a first rank")
        .rank;
    for r in topo.ranks.iter().filter(|r| r.embed && r.rank != sampler) {
        pairs.push((Carries::Token, sampler, r.rank));
    }
    for (id, (carries, from, to)) in pairs.into_iter().enumerate() {
        let id = id as u32;
        let (from_dev, to_dev) = (
            topo.ranks[from as usize].device,
            topo.ranks[to as usize].device,
        );
        let transport = match placement.transport {
            TransportChoice::DeviceCopy => Transport::DeviceCopy,
            TransportChoice::PeerCopy => Transport::PeerCopy,
            TransportChoice::Auto if from_dev == to_dev => Transport::DeviceCopy,
            TransportChoice::Auto => Transport::PeerCopy,
        };
        // A token waits for its sequence's next turn: one slot per sequence in flight, plus
        // one so the sampler never waits for a slot the receiver still holds.
        // A prefill step hands over every row of its chunk, but only the last row's token.
        // A cut between a full DSA layer and a shared layer that reads it carries the
        // selection after the hidden rows: one i32 block per row.
        let receiver_start = topo.ranks[to as usize].layers.start;
        let selection = match carries == Carries::Hidden && model.selection_crosses(receiver_start)
        {
            true => model
                .dsa
                .as_ref()
                .map_or(0, |x| x.selection_values(placement.max_context)),
            false => 0,
        };
        let (elems, name, lag, slots, tokens) = match carries {
            Carries::Hidden => (d, "hidden", 0, HIDDEN_SLOTS, placement.prefill_chunk),
            Carries::Token => (
                1,
                "token",
                placement.max_sequences,
                placement.max_sequences + 1,
                1,
            ),
        };
        let compute = |rank, kind| Node {
            kind,
            rank,
            stream: StreamKind::Compute,
            eager: None,
        };
        let last = match carries {
            Carries::Hidden => g.ends(from).expect("invariant: every rank has nodes").1,
            Carries::Token => g
                .find(from, &NodeKind::Sample)
                .expect("invariant: the sampler samples"),
        };
        let send = g.push(compute(from, NodeKind::Send { boundary: id }));
        g.connect(last, send, name, elems);
        let (first, _) = g.ends(to).expect("invariant: every rank has nodes");
        let recv = g.push_front(compute(to, NodeKind::Recv { boundary: id }));
        g.connect(recv, first, name, elems);
        if carries == Carries::Hidden {
            g.connect(send, recv, name, elems);
        }
        topo.boundaries.push(Boundary {
            boundary: id,
            carries,
            from_rank: from,
            to_rank: to,
            bytes: (elems + u64::from(selection)) * 4,
            selection,
            tokens,
            slots,
            lag,
            transport,
        });
    }
    let sample = g
        .find(sampler, &NodeKind::Sample)
        .expect("invariant: the sampler samples");
    let readback = g.push(Node {
        kind: NodeKind::Readback,
        rank: sampler,
        stream: StreamKind::Readback,
        eager: None,
    });
    g.connect(sample, readback, "logits", u64::from(model.vocab));
}
