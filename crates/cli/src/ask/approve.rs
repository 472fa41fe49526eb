//! `runcell ask --approve`: each cell is shown on stderr (highlighted on a terminal) and runs
//! only on `y`; `n` asks for a reason and tells the model; `e` opens it in `$EDITOR`.
//!
//! The highlighter is a few lines of ANSI for Python's keywords, strings and comments rather
//! than syntect and its grammar sets (megabytes of dependency for one prompt); a reviewer
//! needs to tell code from strings and comments at a glance, not a faithful grammar.

use std::io::{BufRead, IsTerminal, Write};
use std::process::Command;

use anyhow::{bail, Context};
use runcell_agent::{Proposal, Verdict};

/// Who decides, as the audit log records it.
pub(crate) fn decided_by() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("cli:{user}")
}

/// Shows `p` and reads the decision from stdin. End of input declines.
pub(crate) fn decide(p: &Proposal<'_>) -> Verdict {
    let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let shown = if color && p.call.name == "python" {
        highlight(&p.code)
    } else {
        p.code.clone()
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "── {} (step {}) — waiting for approval ──\n{}",
        p.call.name,
        p.step,
        shown.trim_end()
    );
    loop {
        let _ = write!(err, "Run it? [y]es / [n]o / [e]dit: ");
        let _ = err.flush();
        let Some(line) = read_line() else {
            let _ = writeln!(err);
            return Verdict::Decline(Some("no answer (end of input)".into()));
        };
        match line.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => return Verdict::Run,
            "n" | "no" => {
                let _ = write!(err, "Reason (optional, sent to the model): ");
                let _ = err.flush();
                let reason = read_line().map(|r| r.trim().to_owned());
                return Verdict::Decline(reason.filter(|r| !r.is_empty()));
            }
            "e" | "edit" => match edit(&p.code) {
                Ok(code) => {
                    let _ = writeln!(err, "── edited ──\n{}", code.trim_end());
                    return Verdict::Edit(code);
                }
                Err(e) => {
                    let _ = writeln!(err, "runcell: cannot edit the cell: {e:#}");
                }
            },
            _ => {
                let _ = writeln!(err, "answer y, n or e");
            }
        }
    }
}

fn read_line() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

/// Opens `code` in `$VISUAL` or `$EDITOR` (default `vi`) in a temp file; its content after.
fn edit(code: &str) -> anyhow::Result<String> {
    let editor = std::env::var("VISUAL")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| {
            std::env::var("EDITOR")
                .ok()
                .filter(|e| !e.trim().is_empty())
        })
        .unwrap_or_else(|| "vi".into());
    let mut file = tempfile::Builder::new()
        .prefix("runcell-cell-")
        .suffix(".py")
        .tempfile()
        .context("cannot create a temp file")?;
    file.write_all(code.as_bytes())?;
    file.flush()?;
    // Through the shell, so EDITOR may carry arguments ("code --wait").
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(file.path())
        .status()
        .with_context(|| format!("cannot start the editor {editor:?}"))?;
    if !status.success() {
        bail!("the editor {editor:?} exited with {status}");
    }
    std::fs::read_to_string(file.path()).context("cannot read the edited cell")
}

const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];
const KEYWORD: &str = "\x1b[1;34m";
const STRING: &str = "\x1b[32m";
const COMMENT: &str = "\x1b[90m";
const RESET: &str = "\x1b[0m";

/// Python with its keywords, strings and comments in ANSI colours.
pub(crate) fn highlight(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len() * 2);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            let end = chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p);
            out.push_str(COMMENT);
            out.extend(&chars[i..end]);
            out.push_str(RESET);
            i = end;
        } else if c == '"' || c == '\'' {
            let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
            let quote = if triple { 3 } else { 1 };
            let mut j = i + quote;
            while j < chars.len() {
                if chars[j] == '\\' {
                    j += 2;
                    continue;
                }
                if !triple && chars[j] == '\n' {
                    break;
                }
                if chars[j] == c && (!triple || chars[j..].starts_with(&[c, c, c])) {
                    j += quote;
                    break;
                }
                j += 1;
            }
            let end = j.min(chars.len());
            out.push_str(STRING);
            out.extend(&chars[i..end]);
            out.push_str(RESET);
            i = end;
        } else if c.is_alphabetic() || c == '_' {
            let end = chars[i..]
                .iter()
                .position(|&c| !(c.is_alphanumeric() || c == '_'))
                .map_or(chars.len(), |p| i + p);
            let word: String = chars[i..end].iter().collect();
            if KEYWORDS.contains(&word.as_str()) {
                out.push_str(KEYWORD);
                out.push_str(&word);
                out.push_str(RESET);
            } else {
                out.push_str(&word);
            }
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn highlights_keywords_strings_and_comments() {
        let h = highlight("import os  # why\nx = 'if' if y else \"\"\"a\nb\"\"\"\n");
        assert_eq!(
            h,
            format!(
                "{KEYWORD}import{RESET} os  {COMMENT}# why{RESET}\nx = {STRING}'if'{RESET} \
                 {KEYWORD}if{RESET} y {KEYWORD}else{RESET} {STRING}\"\"\"a\nb\"\"\"{RESET}\n"
            )
        );
        // Identifiers containing keywords are left alone.
        assert_eq!(highlight("iffy = format"), "iffy = format");
    }
}
