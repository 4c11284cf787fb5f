//! What memra's tools do with the files they write and the bytes they quote. A file (a plan,
//! a GGUF, a rendered picture) is written to a temporary file beside it and renamed into
//! place only once complete, so a failed or interrupted write never leaves a truncated file
//! under the final name nor harms the file it replaces. A message that quotes a file's
//! bytes (a GGUF key, a config.json value) escapes their control characters, so a crafted
//! file cannot drive the terminal that reads the message.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Writes `path` through `write`, which gets a new temporary file in the same folder; only
/// when `write` returns `Ok` and the bytes are on disk does the temporary file replace
/// `path` (keeping the permissions of the file it replaces). On any error the temporary file
/// is removed and `path` is left as it was. A `path` that is a symbolic link has its target
/// replaced, the link kept.
pub fn write_atomically<T>(path: &Path, write: impl FnOnce(&mut File) -> Result<T>) -> Result<T> {
    let target = match path.symlink_metadata() {
        Ok(m) if m.file_type().is_symlink() => path
            .canonicalize()
            .with_context(|| format!("{}: cannot resolve the link", path.display()))?,
        _ => path.to_path_buf(),
    };
    let mut temp = TempFile::create(&target).with_context(|| {
        format!(
            "{}: cannot create a temporary file beside it",
            path.display()
        )
    })?;
    let value =
        write(&mut temp.file).with_context(|| format!("{}: cannot write", path.display()))?;
    if let Ok(old) = std::fs::metadata(&target) {
        temp.file
            .set_permissions(old.permissions())
            .with_context(|| format!("{}: cannot copy the permissions", path.display()))?;
    }
    temp.file
        .sync_all()
        .with_context(|| format!("{}: cannot write", path.display()))?;
    std::fs::rename(&temp.path, &target).with_context(|| {
        format!(
            "{}: cannot move the written file into place",
            path.display()
        )
    })?;
    temp.kept = true;
    Ok(value)
}

/// A temporary file beside its destination, removed when dropped unless it was kept (moved
/// into place): one cleanup for every error path.
struct TempFile {
    path: PathBuf,
    file: File,
    kept: bool,
}

impl TempFile {
    /// `.NAME.tmp.PID.N` in the destination's folder; created new, never opened over another.
    fn create(dest: &Path) -> std::io::Result<TempFile> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = dest.file_name().unwrap_or_default().to_string_lossy();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dest.with_file_name(format!(".{name}.tmp.{}.{n}", std::process::id()));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(TempFile {
                        path,
                        file,
                        kept: false,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            // nothing more to do where it cannot be removed: the error that led here is reported
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `text` for a message: control characters (and the bidirectional overrides that reorder
/// what a terminal shows) written as escapes (`\x1b`, `\n`, `\u{202e}`), the rest as is.
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped { text, lines: false }
}

/// A whole message as a tool prints it: `escaped`, except that its line breaks and tabs are
/// kept. Every tool prints its errors through it, whatever quoted them.
pub fn escaped_lines(text: &str) -> Escaped<'_> {
    Escaped { text, lines: true }
}

/// Displays its text with control characters escaped (see `escaped`, `escaped_lines`).
pub struct Escaped<'a> {
    text: &'a str,
    lines: bool,
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.text.chars() {
            let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            match c {
                '\n' | '\t' if self.lines => write!(f, "{c}")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_ascii_control() => write!(f, "\\x{:02x}", c as u32)?,
                c if c.is_control() || bidi => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => write!(f, "{c}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A folder of its own under the system's temporary folder, emptied first.
    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("memra-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_file() {
        let dir = folder("fails");
        let path = dir.join("plan.toml");
        std::fs::write(&path, b"the good old plan\n").unwrap();
        let err = write_atomically::<()>(&path, |f| {
            f.write_all(b"half of a new pl")?;
            anyhow::bail!("disk full")
        })
        .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            format!("{}: cannot write: disk full", path.display())
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"the good old plan\n");
        assert_eq!(names(&dir), ["plan.toml"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_complete_write_replaces_the_file_and_keeps_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = folder("replaces");
        let path = dir.join("model.gguf");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let n = write_atomically(&path, |f| Ok(f.write(b"new bytes")?)).unwrap();
        assert_eq!(n, 9);
        assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(names(&dir), ["model.gguf"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_link_keeps_pointing_at_the_file_it_names() {
        let dir = folder("link");
        let (real, link) = (dir.join("real.svg"), dir.join("link.svg"));
        std::fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomically(&link, |f| Ok(f.write_all(b"new")?)).unwrap();
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        assert_eq!(names(&dir), ["link.svg", "real.svg"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_the_file() {
        let path = folder("missing").join("no/such/folder/x.dot");
        let err = write_atomically(&path, |_| Ok(())).unwrap_err();
        assert!(
            format!("{err:#}").starts_with(&format!(
                "{}: cannot create a temporary file beside it: ",
                path.display()
            )),
            "{err:#}"
        );
    }

    #[test]
    fn control_characters_are_escaped_and_other_text_kept() {
        let text = "red\x1b[31m\u{7}\ttab\nline \u{202e}rev\u{9b} é 漢";
        assert_eq!(
            escaped(text).to_string(),
            "red\\x1b[31m\\x07\\ttab\\nline \\u{202e}rev\\u{9b} é 漢"
        );
        assert_eq!(
            escaped_lines(text).to_string(),
            "red\\x1b[31m\\x07\ttab\nline \\u{202e}rev\\u{9b} é 漢"
        );
    }
}
