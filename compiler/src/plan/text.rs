//! The plan's text forms: the short strings of layer ranges, splits, island reasons and ops
//! (serde goes through `Display`/`FromStr`), and the TOML writer that puts the long per-rank
//! lists one inline table per line.

use super::{IslandReason, LayerRange, Op, Segment, Split};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

impl fmt::Display for LayerRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

impl FromStr for LayerRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s
            .split_once("..")
            .ok_or_else(|| format!("expected a range `a..b`, found `{s}`"))?;
        let parse = |x: &str| {
            x.parse::<u32>()
                .map_err(|_| format!("expected a layer number, found `{x}`"))
        };
        let (start, end) = (parse(a)?, parse(b)?);
        if start > end {
            return Err(format!("range `{s}` ends before it starts"));
        }
        Ok(LayerRange { start, end })
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Split::Full => write!(f, "full"),
            Split::Rows { start, end } => write!(f, "rows {start}..{end}"),
            Split::Cols { start, end } => write!(f, "cols {start}..{end}"),
            Split::Experts { start, end } => write!(f, "experts {start}..{end}"),
            Split::Heads { start, end } => write!(f, "heads {start}..{end}"),
        }
    }
}

impl FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "full" {
            return Ok(Split::Full);
        }
        let (kind, range) = s.split_once(' ').ok_or_else(|| {
            format!("expected `full` or `rows|cols|experts|heads a..b`, found `{s}`")
        })?;
        let (a, b) = range
            .split_once("..")
            .ok_or_else(|| format!("expected a range `a..b`, found `{range}`"))?;
        let parse = |x: &str| {
            x.parse::<u64>()
                .map_err(|_| format!("expected a number, found `{x}`"))
        };
        let (start, end) = (parse(a)?, parse(b)?);
        match kind {
            "rows" => Ok(Split::Rows { start, end }),
            "cols" => Ok(Split::Cols { start, end }),
            "experts" => Ok(Split::Experts { start, end }),
            "heads" => Ok(Split::Heads { start, end }),
            _ => Err(format!(
                "unknown split `{kind}`; allowed: rows, cols, experts, heads"
            )),
        }
    }
}

impl fmt::Display for IslandReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IslandReason::CaptureDisabled => write!(f, "capture_disabled"),
            IslandReason::Forced(why) => write!(f, "forced: {why}"),
        }
    }
}

impl FromStr for IslandReason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "capture_disabled" => Ok(IslandReason::CaptureDisabled),
            _ => match s.strip_prefix("forced: ") {
                Some(why) => Ok(IslandReason::Forced(why.to_string())),
                None => Err(format!(
                    "unknown island reason `{s}`; allowed: capture_disabled, forced: <why>"
                )),
            },
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Embed => write!(f, "embed"),
            Op::Head => write!(f, "head"),
            Op::GatherLogits => write!(f, "gather_logits"),
            Op::Sample => write!(f, "sample"),
            Op::LoadHidden => write!(f, "load_hidden"),
            Op::StoreHidden => write!(f, "store_hidden"),
            Op::StoreToken => write!(f, "store_token"),
            Op::Layers { layers, segments } => {
                let names: Vec<&str> = segments.iter().map(|s| s.name()).collect();
                write!(f, "layers {layers}: {}", names.join(" "))
            }
        }
    }
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "embed" => return Ok(Op::Embed),
            "head" => return Ok(Op::Head),
            "gather_logits" => return Ok(Op::GatherLogits),
            "sample" => return Ok(Op::Sample),
            "load_hidden" => return Ok(Op::LoadHidden),
            "store_hidden" => return Ok(Op::StoreHidden),
            "store_token" => return Ok(Op::StoreToken),
            _ => {}
        }
        let rest = s.strip_prefix("layers ").ok_or_else(|| {
            format!("unknown op `{s}`; allowed: embed, layers a..b: <segments>, head, gather_logits, sample, load_hidden, store_hidden, store_token")
        })?;
        let (range, segs) = rest
            .split_once(": ")
            .ok_or_else(|| format!("expected `layers a..b: <segments>`, found `{s}`"))?;
        let segments = segs
            .split(' ')
            .map(|name| {
                Segment::ALL
                    .into_iter()
                    .find(|seg| seg.name() == name)
                    .ok_or_else(|| format!("unknown segment `{name}`"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Op::Layers {
            layers: range.parse()?,
            segments,
        })
    }
}

/// Serde through `Display`/`FromStr`, so plan text reads as one short string per value.
macro_rules! serde_as_string {
    ($($ty:ty),*) => {$(
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}
serde_as_string!(LayerRange, Split, IslandReason, Op);

/// Lists written one inline table per line.
const INLINE_LISTS: [&str; 3] = ["buffers", "program", "weights"];

fn is_table_array(v: &toml::Value) -> bool {
    v.as_array()
        .is_some_and(|a| !a.is_empty() && a.iter().all(toml::Value::is_table))
}

pub(super) fn write_table(out: &mut String, path: &str, table: &toml::Table) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    for (k, v) in table {
        if INLINE_LISTS.contains(&k.as_str()) && is_table_array(v) {
            out.push_str(&format!("{k} = [\n"));
            for item in v.as_array().expect("invariant: checked above") {
                out.push_str(&format!("  {item},\n"));
            }
            out.push_str("]\n");
        } else if !v.is_table() && !is_table_array(v) {
            out.push_str(&format!("{k} = {v}\n"));
        }
    }
    for (k, v) in table {
        if let Some(sub) = v.as_table() {
            out.push_str(&format!("\n[{}]\n", join(k)));
            write_table(out, &join(k), sub);
        }
    }
    for (k, v) in table {
        if is_table_array(v) && !INLINE_LISTS.contains(&k.as_str()) {
            for item in v.as_array().expect("invariant: checked above") {
                out.push_str(&format!("\n[[{}]]\n", join(k)));
                write_table(
                    out,
                    &join(k),
                    item.as_table().expect("invariant: checked above"),
                );
            }
        }
    }
}
