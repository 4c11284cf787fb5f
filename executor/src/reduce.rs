//! The all-reduce's combine order: a group's tree as the plan writes it, e.g.
//! `((r0 r1) (r2 r3))`, parsed once and applied element-wise to the members' partial sums.
//! With one subtree of the canonical reduction per rank, the canonical tree completes exactly
//! the sum the 1-rank kernel computes.

use anyhow::{anyhow, bail, Result};

/// How partial sums are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReduceOrder {
    /// The group's tree from the plan: bit-identical to one rank when the group is exact.
    #[default]
    Tree,
    /// A deliberately wrong order for tests that prove the gate catches it: partials folded
    /// one by one from the last member. Addition commutes, so two members cannot show the
    /// difference; from three on it changes the rounding.
    ReversedFold,
}

/// A combine tree over group member indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tree {
    /// One member's partial.
    Leaf(usize),
    /// The sum of two subtrees, left first.
    Node(Box<Tree>, Box<Tree>),
}

impl Tree {
    /// Parses `text` whose leaves `rN` name the ranks of `members`; every member appears once.
    pub fn parse(text: &str, members: &[u32]) -> Result<Tree> {
        let tokens: Vec<String> = text
            .replace('(', " ( ")
            .replace(')', " ) ")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let mut pos = 0;
        let tree = parse_at(&tokens, &mut pos, members)?;
        if pos != tokens.len() {
            bail!("unexpected `{}` after the tree", tokens[pos]);
        }
        let mut seen = Vec::new();
        tree.leaves(&mut seen);
        seen.sort_unstable();
        if seen != (0..members.len()).collect::<Vec<_>>() {
            bail!("the tree must name each rank of the group exactly once");
        }
        Ok(tree)
    }

    fn leaves(&self, out: &mut Vec<usize>) {
        match self {
            Tree::Leaf(i) => out.push(*i),
            Tree::Node(a, b) => {
                a.leaves(out);
                b.leaves(out);
            }
        }
    }

    /// Combines `parts` (indexed by member) in this tree, or in `order`'s wrong order.
    pub fn combine(&self, parts: &[Vec<f32>], order: ReduceOrder) -> Vec<f32> {
        match order {
            ReduceOrder::Tree => self.eval(parts),
            ReduceOrder::ReversedFold => {
                let mut acc = parts[parts.len() - 1].clone();
                for p in parts[..parts.len() - 1].iter().rev() {
                    acc.iter_mut().zip(p).for_each(|(a, b)| *a += b);
                }
                acc
            }
        }
    }

    fn eval(&self, parts: &[Vec<f32>]) -> Vec<f32> {
        match self {
            Tree::Leaf(i) => parts[*i].clone(),
            Tree::Node(a, b) => {
                let mut left = a.eval(parts);
                let right = b.eval(parts);
                left.iter_mut().zip(&right).for_each(|(l, r)| *l += r);
                left
            }
        }
    }
}

fn parse_at(tokens: &[String], pos: &mut usize, members: &[u32]) -> Result<Tree> {
    let tok = tokens
        .get(*pos)
        .ok_or_else(|| anyhow!("the tree ends early"))?;
    *pos += 1;
    if tok == "(" {
        let a = parse_at(tokens, pos, members)?;
        let b = parse_at(tokens, pos, members)?;
        match tokens.get(*pos) {
            Some(t) if t == ")" => *pos += 1,
            _ => bail!("expected `)` after two subtrees"),
        }
        return Ok(Tree::Node(Box::new(a), Box::new(b)));
    }
    let rank: u32 = tok
        .strip_prefix('r')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow!("expected `(` or a rank `rN`, found `{tok}`"))?;
    let index = members
        .iter()
        .position(|&m| m == rank)
        .ok_or_else(|| anyhow!("rank {rank} is not in the group"))?;
    Ok(Tree::Leaf(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_balanced_and_uneven_trees() {
        let t = Tree::parse("((r4 r5) (r6 r7))", &[4, 5, 6, 7]).unwrap();
        let leaf = |i| Box::new(Tree::Leaf(i));
        let pair = |a, b| Box::new(Tree::Node(leaf(a), leaf(b)));
        assert_eq!(t, Tree::Node(pair(0, 1), pair(2, 3)));
        assert!(Tree::parse("((r0 r1) r2)", &[0, 1, 2]).is_ok());
        assert!(Tree::parse("(r0 r0)", &[0, 1]).is_err());
        assert!(Tree::parse("(r0 r1", &[0, 1]).is_err());
        assert!(Tree::parse("(r0 r9)", &[0, 1]).is_err());
    }

    #[test]
    fn tree_order_differs_from_a_fold() {
        let parts = vec![vec![1.0f32], vec![1e8], vec![1.0], vec![-1e8]];
        let t = Tree::parse("((r0 r1) (r2 r3))", &[0, 1, 2, 3]).unwrap();
        // (1 + 1e8) + (1 - 1e8) rounds both ones away; ((-1e8 + 1) + 1e8) + 1 keeps one.
        assert_eq!(t.combine(&parts, ReduceOrder::Tree), vec![0.0]);
        assert_eq!(t.combine(&parts, ReduceOrder::ReversedFold), vec![1.0]);
    }
}
