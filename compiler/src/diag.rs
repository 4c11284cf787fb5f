//! Diagnostics: errors in a user's file, each with `file:line:col`, the field and what is
//! allowed. Validation collects all of them, then fails once.

use std::fmt;
use std::ops::Range;

/// One error in a user's file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Diagnostic {
    pub line: usize,
    pub col: usize,
    pub field: String,
    pub message: String,
}

/// Every error found in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics {
    pub file: String,
    pub items: Vec<Diagnostic>,
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.items.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}:{}: ", self.file, d.line, d.col)?;
            if !d.field.is_empty() {
                write!(f, "{}: ", d.field)?;
            }
            write!(f, "{}", d.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Collects diagnostics against one source text, turning byte spans into lines and columns.
pub struct Collector<'a> {
    file: String,
    text: &'a str,
    items: Vec<Diagnostic>,
}

impl<'a> Collector<'a> {
    /// A collector for `text`, read from `file`.
    pub fn new(file: &str, text: &'a str) -> Self {
        Collector {
            file: file.to_string(),
            text,
            items: Vec::new(),
        }
    }

    /// Record an error at `span` about `field`.
    pub fn error(&mut self, span: Range<usize>, field: &str, message: impl Into<String>) {
        let (line, col) = line_col(self.text, span.start);
        self.items.push(Diagnostic {
            line,
            col,
            field: field.to_string(),
            message: message.into(),
        });
    }

    /// True when nothing has been recorded.
    pub fn is_clean(&self) -> bool {
        self.items.is_empty()
    }

    /// All errors, sorted by position, or `Ok` when there are none.
    pub fn finish(mut self) -> Result<(), Diagnostics> {
        if self.items.is_empty() {
            return Ok(());
        }
        self.items.sort();
        self.items.dedup();
        Err(Diagnostics {
            file: self.file,
            items: self.items,
        })
    }
}

/// 1-based line and column (in characters) of byte `offset`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text
        .get(..offset)
        .unwrap_or_else(|| &text[..text.floor_char_boundary(offset)]);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 6), (2, 1));
        assert_eq!(line_col(text, 10), (2, 4));
        assert_eq!(line_col(text, 999), (3, 1));
    }
}
