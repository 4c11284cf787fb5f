//! Plan review: a semantic diff of two plans and a picture of one, for people reading a
//! placement change in a terminal or a CI log. Either side may be a plan or a placement,
//! told apart by content, not by file name.

pub mod diff;
pub mod render;

pub use diff::semantic_diff;
pub use render::to_dot;

use std::path::Path;

use anyhow::{anyhow, Context, Result};

use crate::passes::compile;
use crate::plan::Plan;

/// The plan at `path`, or the plan its placement compiles to: a file with a top-level
/// `format_version` key is a plan, whatever it is called; anything else is a placement.
pub fn load_plan_or_placement(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    // A file that is not TOML goes to the placement reader, whose error points at the line.
    let is_plan = text
        .parse::<toml::Table>()
        .is_ok_and(|table| table.contains_key("format_version"));
    if is_plan {
        Plan::from_toml(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
    } else {
        Ok(compile(path).map_err(|d| anyhow!("{d}"))?.plan)
    }
}
