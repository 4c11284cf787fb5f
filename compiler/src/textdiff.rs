//! A line diff (Myers' O((N+M)D) algorithm) printed as a unified diff, for stale-plan checks.

/// One line of an edit script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    Keep(usize, usize),
    Delete(usize),
    Insert(usize),
}

/// The shortest edit script turning `a` into `b`.
fn edits(a: &[&str], b: &[&str]) -> Vec<Edit> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m) as usize;
    let off = max as isize;
    let mut v = vec![0isize; 2 * max + 2];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    'outer: for d in 0..=max as isize {
        trace.push(v.clone());
        let mut k = -d;
        while k <= d {
            let ki = (k + off) as usize;
            let mut x = if k == -d || (k != d && v[ki - 1] < v[ki + 1]) {
                v[ki + 1]
            } else {
                v[ki - 1] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[ki] = x;
            if x >= n && y >= m {
                break 'outer;
            }
            k += 2;
        }
    }
    // Walk back through the saved frontiers.
    let mut out = Vec::new();
    let (mut x, mut y) = (n, m);
    for (d, v) in trace.iter().enumerate().rev() {
        let d = d as isize;
        let k = x - y;
        let ki = (k + off) as usize;
        let prev_k = if k == -d || (k != d && v[ki - 1] < v[ki + 1]) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = v[(prev_k + off) as usize];
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            x -= 1;
            y -= 1;
            out.push(Edit::Keep(x as usize, y as usize));
        }
        if d > 0 {
            if x == prev_x {
                out.push(Edit::Insert(prev_y as usize));
            } else {
                out.push(Edit::Delete(prev_x as usize));
            }
        }
        x = prev_x;
        y = prev_y;
    }
    out.reverse();
    out
}

/// A unified diff of two texts with `context` lines around each change; empty when equal.
pub fn unified(old_name: &str, new_name: &str, old: &str, new: &str, context: usize) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let script = edits(&a, &b);
    let changed: Vec<usize> = (0..script.len())
        .filter(|&i| !matches!(script[i], Edit::Keep(..)))
        .collect();
    if changed.is_empty() {
        return String::new();
    }
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    let mut i = 0;
    while i < changed.len() {
        let start = changed[i].saturating_sub(context);
        let mut end = changed[i] + context + 1;
        while i + 1 < changed.len() && changed[i + 1] <= end + context {
            i += 1;
            end = changed[i] + context + 1;
        }
        let end = end.min(script.len());
        let (a0, b0) = position(&script[..start]);
        let (na, nb) = position(&script[start..end]);
        out += &format!("@@ -{},{na} +{},{nb} @@\n", a0 + 1, b0 + 1);
        for e in &script[start..end] {
            match *e {
                Edit::Keep(x, _) => out += &format!(" {}\n", a[x]),
                Edit::Delete(x) => out += &format!("-{}\n", a[x]),
                Edit::Insert(y) => out += &format!("+{}\n", b[y]),
            }
        }
        i += 1;
    }
    out
}

/// Lines of the old and new text covered by a stretch of the script.
fn position(script: &[Edit]) -> (usize, usize) {
    script.iter().fold((0, 0), |(a, b), e| match e {
        Edit::Keep(..) => (a + 1, b + 1),
        Edit::Delete(_) => (a + 1, b),
        Edit::Insert(_) => (a, b + 1),
    })
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
