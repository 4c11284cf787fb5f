//! Plan review: a semantic diff of two plans and a picture of one, for people reading a
//! placement change in a terminal or a CI log.

pub mod diff;
pub mod render;

pub use diff::semantic_diff;
pub use render::to_dot;
