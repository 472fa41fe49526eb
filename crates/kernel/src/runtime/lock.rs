//! The lock file the default runtime is built from (`runtime/python.lock`, embedded): a
//! hash-pinned requirements file, parsed strictly so that every distribution is pinned.

use super::error::RuntimeError;

/// The lock file, embedded at build time.
pub const PYTHON_LOCK: &str = include_str!("../../../../runtime/python.lock");

/// One distribution of the lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pin {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) hashes: Vec<String>,
}

/// Parses a hash-pinned requirements file: `name==version` followed by one or more
/// `--hash=sha256:<hex>`, with `\` continuations and `#` comments.
pub(super) fn parse_lock(lock: &str) -> Result<Vec<Pin>, RuntimeError> {
    let mut pins = Vec::new();
    let mut logical = String::new();
    let mut start = 0;
    for (i, raw) in lock.lines().enumerate() {
        let line = match raw.find('#') {
            Some(0) => "",
            Some(p) if raw[..p].ends_with(char::is_whitespace) => &raw[..p],
            _ => raw,
        };
        if logical.is_empty() {
            start = i + 1;
        }
        let (body, continued) = match line.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        logical.push_str(body);
        logical.push(' ');
        if continued {
            continue;
        }
        if !logical.trim().is_empty() {
            pins.push(parse_pin(&logical, start)?);
        }
        logical.clear();
    }
    if !logical.trim().is_empty() {
        return Err(RuntimeError::Lock {
            line: start,
            reason: "continuation at end of file".into(),
        });
    }
    Ok(pins)
}

fn parse_pin(text: &str, line: usize) -> Result<Pin, RuntimeError> {
    let err = |reason: String| RuntimeError::Lock { line, reason };
    let mut tokens = text.split_whitespace();
    let requirement = tokens.next().unwrap_or_default();
    let (name, version) = requirement
        .split_once("==")
        .ok_or_else(|| err(format!("{requirement:?} is not pinned with ==")))
        .and_then(|(n, v)| {
            let ok_name = !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            let ok_version = !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._+!-".contains(c));
            if ok_name && ok_version {
                Ok((n, v))
            } else {
                Err(err(format!(
                    "{requirement:?} is not a plain name==version pin"
                )))
            }
        })?;
    let mut hashes = Vec::new();
    for token in tokens {
        let hex = token
            .strip_prefix("--hash=sha256:")
            .ok_or_else(|| err(format!("unexpected {token:?}")))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(format!("bad sha256 {hex:?}")));
        }
        hashes.push(hex.to_ascii_lowercase());
    }
    if hashes.is_empty() {
        return Err(err(format!("{requirement} has no --hash")));
    }
    Ok(Pin {
        name: normalize(name),
        version: version.to_string(),
        hashes,
    })
}

/// PEP 503 normalized distribution name.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "-_.".contains(c) {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOP_LEVEL: [&str; 11] = [
        "numpy",
        "pandas",
        "matplotlib",
        "scipy",
        "sympy",
        "scikit-learn",
        "seaborn",
        "openpyxl",
        "pillow",
        "pypdf",
        "tabulate",
    ];

    #[test]
    fn lock_pins_every_distribution_with_hashes() {
        let pins = parse_lock(PYTHON_LOCK).expect("lock parses");
        assert!(pins.len() >= TOP_LEVEL.len());
        for pin in &pins {
            assert!(!pin.version.is_empty(), "{pin:?}");
            assert!(!pin.hashes.is_empty(), "{pin:?}");
        }
        for name in TOP_LEVEL {
            assert!(
                pins.iter().any(|p| p.name == name),
                "{name} missing from lock"
            );
        }
        for dep in [
            "python-dateutil",
            "tzdata",
            "contourpy",
            "joblib",
            "mpmath",
            "et-xmlfile",
        ] {
            assert!(
                pins.iter().any(|p| p.name == dep),
                "{dep} missing from lock"
            );
        }
        let mut names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), pins.len(), "duplicate pins");
        // Every non-comment physical line belongs to a pin.
        let logical = PYTHON_LOCK
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .filter(|l| !l.trim_start().starts_with("--hash="))
            .count();
        assert_eq!(logical, pins.len());
    }

    #[test]
    fn lock_parser_rejects_unpinned_or_unhashed_lines() {
        let hash = "--hash=sha256:".to_string() + &"a".repeat(64);
        assert!(parse_lock(&format!("numpy>=2 {hash}\n")).is_err());
        assert!(parse_lock("numpy==2.0.0\n").is_err());
        assert!(parse_lock("numpy==2.0.0 --hash=sha256:abc\n").is_err());
        assert!(parse_lock(&format!("numpy==2.0.0 --index-url=x {hash}\n")).is_err());
        assert!(parse_lock("numpy==2.0.0 \\\n").is_err());
        let pins = parse_lock(&format!(
            "# c\nEt_XMLFile==2.0.0 \\\n    {hash} \\\n    {hash}  # trailing\n\n"
        ))
        .expect("valid");
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].name, "et-xmlfile");
        assert_eq!(pins[0].version, "2.0.0");
        assert_eq!(pins[0].hashes.len(), 2);
    }
}
