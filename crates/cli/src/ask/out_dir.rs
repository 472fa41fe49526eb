//! Saving the files the code produced into `--out` on the user's own disk.
//!
//! The names and contents come from code the model wrote, so the out directory is treated as
//! hostile ground: every path is resolved one component at a time from a descriptor of the out
//! directory, never following a symbolic link (`O_NOFOLLOW`, `O_DIRECTORY`); files are created
//! new (`O_CREAT | O_EXCL`, which never follows a link either) and an existing one is kept unless
//! `--force`, which replaces only a regular file, by renaming a fresh file over its name (so even
//! a link swapped in at the last moment is replaced, not written through). Names are checked
//! (relative, no `.`/`..`, no NUL) and printed escaped, so a name cannot move the cursor or
//! recolour the terminal. Every file saved is listed, dotfiles included.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use anyhow::Context;
use runcell_agent::ProducedFile;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// What [`save`] did.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub saved: usize,
    pub refused: usize,
}

/// Why one file was not saved.
#[derive(Debug)]
enum Refusal {
    /// The name is not a plain relative path.
    BadName(&'static str),
    /// Something is already there and `--force` was not given.
    Exists,
    /// A symbolic link (or another non-directory) stands where a directory or the file goes.
    NotFollowed(&'static str),
    /// Any other error from the file system.
    Io(std::io::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::BadName(why) => write!(f, "not a plain relative path ({why})"),
            Refusal::Exists => f.write_str("a file of that name exists (--force replaces it)"),
            Refusal::NotFollowed(what) => write!(f, "{what}; links are never followed"),
            Refusal::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<Errno> for Refusal {
    fn from(e: Errno) -> Refusal {
        Refusal::Io(e.into())
    }
}

/// Saves `files` under `out` (created if missing), reporting each on stderr. Fails only when
/// the out directory itself cannot be used; a file that cannot be saved is reported and counted.
pub(crate) fn save(out: &Path, files: &[ProducedFile], force: bool) -> anyhow::Result<Report> {
    let mut report = Report::default();
    if files.is_empty() {
        return Ok(report);
    }
    // The out directory is the user's own choice: its path is taken as given, but it must be a
    // directory itself, not a link to one (which a planted link could have redirected).
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    // Without a trailing slash, which would make even O_NOFOLLOW follow a final link.
    let last: std::path::PathBuf = out.components().collect();
    let dir = rustix::fs::openat(
        CWD,
        &last,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .with_context(|| {
        format!(
            "cannot open --out {} as a directory (a symbolic link is not followed)",
            out.display()
        )
    })?;
    let mut err = std::io::stderr().lock();
    for f in files {
        let shown = format!("{}/{}", out.display(), escape(&f.path));
        match save_one(&dir, &f.path, &f.content, force) {
            Ok(replaced) => {
                report.saved += 1;
                let _ = writeln!(
                    err,
                    "saved {shown} ({} bytes{})",
                    f.content.len(),
                    if replaced { ", replaced" } else { "" }
                );
            }
            Err(why) => {
                report.refused += 1;
                let _ = writeln!(err, "runcell: not saved: {shown}: {why}");
            }
        }
    }
    if report.refused > 0 {
        let _ = writeln!(
            err,
            "runcell: {} of {} files not saved (see above)",
            report.refused,
            files.len()
        );
    }
    Ok(report)
}

/// The components of a workspace-relative path, or why it is not one.
fn components(rel: &str) -> Result<Vec<&str>, Refusal> {
    if rel.is_empty() {
        return Err(Refusal::BadName("empty"));
    }
    if rel.contains('\0') {
        return Err(Refusal::BadName("a NUL byte"));
    }
    if rel.starts_with('/') {
        return Err(Refusal::BadName("absolute"));
    }
    let parts: Vec<&str> = rel.split('/').collect();
    for p in &parts {
        match *p {
            "" => return Err(Refusal::BadName("an empty component")),
            "." | ".." => return Err(Refusal::BadName("a . or .. component")),
            _ => {}
        }
    }
    Ok(parts)
}

/// Saves one file under `dir`; `Ok(true)` when an existing file was replaced.
fn save_one(dir: &OwnedFd, rel: &str, content: &[u8], force: bool) -> Result<bool, Refusal> {
    let parts = components(rel)?;
    let (name, parents) = parts.split_last().ok_or(Refusal::BadName("empty"))?;
    // Walk (and create) the intermediate directories, each opened without following a link.
    let mut here: Option<OwnedFd> = None;
    for p in parents {
        let at = here.as_ref().map_or(dir.as_fd(), |d| d.as_fd());
        match rustix::fs::mkdirat(at, *p, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let next = rustix::fs::openat(
            at,
            *p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => {
                Refusal::NotFollowed("a symbolic link or a file stands where a directory goes")
            }
            e => e.into(),
        })?;
        here = Some(next);
    }
    let at = here.as_ref().map_or(dir.as_fd(), |d| d.as_fd());
    match create_new(at, name, content) {
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(Errno::EXIST.raw_os_error()) => {
            let st = rustix::fs::statat(at, *name, AtFlags::SYMLINK_NOFOLLOW)?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => Err(Refusal::NotFollowed("a symbolic link is there")),
                FileType::RegularFile if force => {
                    replace(at, name, content)?;
                    Ok(true)
                }
                FileType::RegularFile => Err(Refusal::Exists),
                _ => Err(Refusal::NotFollowed("something other than a file is there")),
            }
        }
        Err(e) => Err(Refusal::Io(e)),
    }
}

/// Creates `name` in `at`, failing if anything (a link included) has that name. Mode 0644:
/// never executable, whatever the code set in the workspace. A file that could not be written
/// whole is removed again (else it would stand in the way of the next run).
fn create_new(at: impl AsFd + Copy, name: &str, content: &[u8]) -> std::io::Result<()> {
    let fd = rustix::fs::openat(
        at,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    std::fs::File::from(fd).write_all(content).inspect_err(|_| {
        let _ = rustix::fs::unlinkat(at, name, AtFlags::empty());
    })
}

/// `--force`: a fresh file beside the old one, renamed over its name (which replaces the
/// directory entry itself, never what a link would point to).
fn replace(at: impl AsFd + Copy, name: &str, content: &[u8]) -> Result<(), Refusal> {
    let tmp = format!(".{name}.runcell-{}", std::process::id());
    create_new(at, &tmp, content).map_err(Refusal::Io)?;
    rustix::fs::renameat(at, tmp.as_str(), at, name).map_err(|e| {
        let _ = rustix::fs::unlinkat(at, tmp.as_str(), AtFlags::empty());
        Refusal::from(e)
    })
}

/// `name` with control characters (C0, DEL, C1), Unicode format characters that reorder or hide
/// text (bidi overrides, zero-width ones) and backslashes escaped, for a terminal.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let hidden = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
        if c.is_control() || hidden {
            let _ = write!(out, "{}", c.escape_unicode());
        } else if c == '\\' {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_for_the_terminal() {
        assert_eq!(escape("chart.png"), "chart.png");
        assert_eq!(escape("r\u{1b}[31mred.txt"), "r\\u{1b}[31mred.txt");
        assert_eq!(
            escape("a\nb\rc\u{7f}\u{9b}"),
            "a\\u{a}b\\u{d}c\\u{7f}\\u{9b}"
        );
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
        assert_eq!(escape("café/日本.txt"), "café/日本.txt");
    }

    #[test]
    fn only_plain_relative_paths_are_accepted() {
        assert_eq!(components("a/b.txt").ok(), Some(vec!["a", "b.txt"]));
        assert_eq!(components(".bashrc").ok(), Some(vec![".bashrc"]));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "a/",
            "x\0y",
        ] {
            assert!(components(bad).is_err(), "{bad:?}");
        }
    }

    fn file(path: &str, content: &str) -> ProducedFile {
        ProducedFile {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn links_are_never_followed_and_files_never_overwritten_without_force() {
        let tmp = tempfile::tempdir().expect("tmp");
        let out = tmp.path().join("out");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(out.join("sub")).expect("mkdir");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("t.txt"), "host").expect("write");
        std::os::unix::fs::symlink(outside.join("t.txt"), out.join("link.txt")).expect("ln");
        std::os::unix::fs::symlink(&outside, out.join("dirlink")).expect("ln");
        std::fs::write(out.join("old.txt"), "old").expect("write");

        let files = [
            file("link.txt", "x"),
            file("dirlink/t.txt", "x"),
            file("dirlink/new.txt", "x"),
            file("old.txt", "new"),
            file("sub/ok.txt", "fine"),
            file("deep/er/ok.txt", "fine"),
        ];
        let r = save(&out, &files, false).expect("save");
        assert_eq!((r.saved, r.refused), (2, 4));
        assert_eq!(
            std::fs::read_to_string(outside.join("t.txt")).expect("read"),
            "host"
        );
        assert!(!outside.join("new.txt").exists());
        assert_eq!(
            std::fs::read_to_string(out.join("old.txt")).expect("read"),
            "old"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("sub/ok.txt")).expect("read"),
            "fine"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("deep/er/ok.txt")).expect("read"),
            "fine"
        );

        // --force replaces the regular file, and still never a link.
        let r = save(&out, &files[..4], true).expect("save");
        assert_eq!((r.saved, r.refused), (1, 3));
        assert_eq!(
            std::fs::read_to_string(out.join("old.txt")).expect("read"),
            "new"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("t.txt")).expect("read"),
            "host"
        );
        assert!(std::fs::symlink_metadata(out.join("link.txt"))
            .expect("link")
            .file_type()
            .is_symlink());
        let leftovers: Vec<_> = std::fs::read_dir(&out)
            .expect("ls")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains("runcell-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_linked_out_dir_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let out = tmp.path().join("out");
        std::os::unix::fs::symlink(&real, &out).expect("ln");
        let e = save(&out, &[file("a.txt", "x")], false).expect_err("refused");
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        let slash = tmp.path().join("out/");
        save(&slash, &[file("a.txt", "x")], false).expect_err("refused with a trailing slash");
        assert!(!real.join("a.txt").exists());
    }
}
