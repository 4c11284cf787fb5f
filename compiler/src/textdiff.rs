//! The unified text diff of a stale plan against the committed one (`similar`'s Myers diff),
//! printed by `memra-compile --check` and the golden test under the semantic diff.

use similar::TextDiff;

/// A unified diff of two texts with `context` lines around each change; empty when equal.
pub fn unified(old_name: &str, new_name: &str, old: &str, new: &str, context: usize) -> String {
    TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(context)
        .header(old_name, new_name)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a", "b", "x\ny\n", "x\ny\n", 3), "");
    }

    #[test]
    fn a_changed_line_shows_both_sides() {
        let old = "a\nb\nc\nd\ne\n";
        let new = "a\nb\nC\nd\ne\nf\n";
        let diff = unified("old", "new", old, new, 1);
        assert_eq!(
            diff,
            "--- old\n+++ new\n@@ -2,4 +2,5 @@\n b\n-c\n+C\n d\n e\n+f\n"
        );
    }
}
