//! How E2B names things runcell has: paths in the sandbox, languages, shell words.

use runcell_engine::Language;

/// The sandbox user's home, where E2B keeps the user's files: runcell's workspace.
pub(crate) const HOME: &str = "/home/user";

/// A path the SDK names, as a path relative to the workspace: `/home/user/x`, `~/x` and `x`
/// are the workspace's `x` (so are `/workspace/x` and `/mnt/data/x`, its runcell names).
pub(crate) fn workspace_rel(path: &str) -> Result<String, String> {
    let p = path.trim();
    let rest = if let Some(r) = strip_dir(p, HOME) {
        r
    } else if let Some(r) = strip_dir(p, "/workspace") {
        r
    } else if let Some(r) = strip_dir(p, "/mnt/data") {
        r
    } else if let Some(r) = p.strip_prefix('~') {
        r.strip_prefix('/').unwrap_or(r)
    } else if p.starts_with('/') {
        return Err(format!(
            "{p} is outside {HOME}: a runcell sandbox keeps files only in {HOME} (its workspace)"
        ));
    } else {
        p
    };
    let parts: Vec<&str> = rest
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    Ok(parts.join("/"))
}

/// `p` without the leading directory `dir`, if `p` is `dir` or below it.
fn strip_dir<'a>(p: &'a str, dir: &str) -> Option<&'a str> {
    let r = p.strip_prefix(dir)?;
    (r.is_empty() || r.starts_with('/')).then(|| r.trim_start_matches('/'))
}

/// A workspace path as the sandbox's user sees it.
pub(crate) fn shown(rel: &str) -> String {
    if rel.is_empty() {
        HOME.to_owned()
    } else {
        format!("{HOME}/{rel}")
    }
}

/// The runcell language of an E2B language name, and its canonical name.
pub(crate) fn language(name: &str) -> Option<(Language, &'static str)> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "python" | "python3" => Some((Language::Python, "python")),
        "javascript" | "js" | "node" | "nodejs" => Some((Language::Javascript, "javascript")),
        "bash" | "sh" | "shell" => Some((Language::Bash, "bash")),
        _ => None,
    }
}

/// `'s'` for a shell: the string single-quoted.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_paths_name_workspace_files() {
        assert_eq!(workspace_rel("/home/user/a/b.txt").expect("ok"), "a/b.txt");
        assert_eq!(workspace_rel("/home/user").expect("ok"), "");
        assert_eq!(workspace_rel("/home/user/").expect("ok"), "");
        assert_eq!(workspace_rel("a.txt").expect("ok"), "a.txt");
        assert_eq!(workspace_rel("./a/./b").expect("ok"), "a/b");
        assert_eq!(workspace_rel("~/x").expect("ok"), "x");
        assert_eq!(workspace_rel("/workspace/x").expect("ok"), "x");
        assert_eq!(workspace_rel("/mnt/data/x").expect("ok"), "x");
        assert!(workspace_rel("/home/username/x").is_err());
        assert!(workspace_rel("/etc/passwd").is_err());
        assert_eq!(shown(""), "/home/user");
        assert_eq!(shown("a/b"), "/home/user/a/b");
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
