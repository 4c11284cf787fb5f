//! The dataflow graph of one decode step: nodes are segments of work, boundary ends and
//! readbacks; edges are the tensors between them. Every node knows its rank, its stream and
//! whether it can be captured into a CUDA graph (and why not).

use crate::plan::{IslandReason, Segment};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// Token lookup in the embedding table.
    Embed,
    /// A per-layer segment.
    Layer { layer: u32, segment: Segment },
    /// Final norm and this rank's vocab rows.
    Head,
    /// Gather vocab-parallel logits on the group's first rank.
    GatherLogits,
    /// Device-side sampling.
    Sample,
    /// Write into a boundary's outgoing slot (the hidden state or the token).
    Send { boundary: u32 },
    /// Take a boundary's incoming slot.
    Recv { boundary: u32 },
    /// Copy logits and token to the host.
    Readback,
}

/// The stream a node is enqueued on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StreamKind {
    Compute,
    Readback,
}

impl StreamKind {
    /// The stream's name in plan text.
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Compute => "compute",
            StreamKind::Readback => "readback",
        }
    }
}

/// One node of the decode graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: NodeKind,
    pub rank: u32,
    pub stream: StreamKind,
    /// `None` when capturable; otherwise why the node must run eagerly.
    pub eager: Option<IslandReason>,
}

/// A tensor flowing along an edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    pub name: &'static str,
    /// Elements as the producer writes them.
    pub elems: u64,
    /// Elements as the consumer expects them.
    pub expect: u64,
}

/// The decode graph.
#[derive(Debug, Clone, Default)]
pub struct DecodeGraph {
    pub graph: StableDiGraph<Node, Tensor>,
    /// Nodes per rank in schedule order (the order they were added).
    pub schedule: Vec<Vec<NodeIndex>>,
}

impl DecodeGraph {
    /// Append a node to its rank's schedule.
    pub fn push(&mut self, node: Node) -> NodeIndex {
        let rank = node.rank as usize;
        let ix = self.graph.add_node(node);
        if self.schedule.len() <= rank {
            self.schedule.resize(rank + 1, Vec::new());
        }
        self.schedule[rank].push(ix);
        ix
    }

    /// Put a node first in its rank's schedule.
    pub fn push_front(&mut self, node: Node) -> NodeIndex {
        let ix = self.push(node);
        let rank = &mut self.schedule[self.graph[ix].rank as usize];
        rank.rotate_right(1);
        ix
    }

    /// The first and last nodes of a rank's schedule.
    pub fn ends(&self, rank: u32) -> Option<(NodeIndex, NodeIndex)> {
        let nodes = self.schedule.get(rank as usize)?;
        Some((*nodes.first()?, *nodes.last()?))
    }

    /// The first node of `rank` of this kind.
    pub fn find(&self, rank: u32, kind: &NodeKind) -> Option<NodeIndex> {
        let nodes = self.schedule.get(rank as usize)?;
        nodes
            .iter()
            .copied()
            .find(|&ix| &self.graph[ix].kind == kind)
    }

    /// Connect two nodes with a tensor of `elems` elements on both sides.
    pub fn connect(&mut self, from: NodeIndex, to: NodeIndex, name: &'static str, elems: u64) {
        self.graph.add_edge(
            from,
            to,
            Tensor {
                name,
                elems,
                expect: elems,
            },
        );
    }

    /// The nodes of `rank` in schedule order.
    pub fn rank_nodes(&self, rank: u32) -> impl Iterator<Item = &Node> {
        self.schedule
            .get(rank as usize)
            .into_iter()
            .flatten()
            .map(|&ix| &self.graph[ix])
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.schedule.len() as u32
    }

    /// Edges as `(from, to, tensor)`.
    pub fn edges(&self) -> impl Iterator<Item = (&Node, &Node, &Tensor)> {
        self.graph
            .edge_references()
            .map(|e| (&self.graph[e.source()], &self.graph[e.target()], e.weight()))
    }

    /// A short label of a node for messages: `rank 1 layer 3 attn_core`.
    pub fn label(node: &Node) -> String {
        let what = match &node.kind {
            NodeKind::Embed => "embed".to_string(),
            NodeKind::Layer { layer, segment } => format!("layer {layer} {}", segment.name()),
            NodeKind::Head => "head".to_string(),
            NodeKind::GatherLogits => "gather_logits".to_string(),
            NodeKind::Sample => "sample".to_string(),
            NodeKind::Send { boundary } => format!("send b{boundary}"),
            NodeKind::Recv { boundary } => format!("recv b{boundary}"),
            NodeKind::Readback => "readback".to_string(),
        };
        format!("rank {} {what}", node.rank)
    }
}
