//! Code mode (issue 22, docs/tools.md): when the session's code can call MCP tools (the
//! operator's servers its tenant may use, `from runcell_tools.mcp import NAME`), the model is
//! told which modules and functions exist, so that it writes one `python` cell that calls
//! them in a loop — and sees only what that code prints — instead of asking for each result.
//!
//! The listing comes from inside the session ([`LISTING_CODE`], one cell the agent runs before
//! the first model call, recorded in the audit log like any cell): what the sandbox lists is
//! exactly what the model's code can import, with the Python names and signatures the sandbox
//! built (MCP tool names that are not identifiers are mapped there, runcell_tools_mcp.py), for
//! this session's tenant only. The section is bounded ([`MAX_SECTION_BYTES`]): a server with
//! hundreds of tools costs the prompt at most that much, and the model is told how to list the
//! rest from code.

use serde_json::Value;

/// The most the tool listing adds to the system prompt, in bytes.
pub const MAX_SECTION_BYTES: usize = 8 << 10;
/// A function's description is cut to this many characters (its first paragraph).
const MAX_DESCRIPTION_CHARS: usize = 160;
/// A signature longer than this is cut (a tool with dozens of parameters).
const MAX_SIGNATURE_CHARS: usize = 300;

/// The cell that lists the session's MCP modules as JSON on stdout: `[{server, functions:
/// [{name, signature, description}]} | {server, error}]`. Its names stay out of the user's
/// namespace (a function deleted afterwards); the modules stay imported, as the model's own
/// `import` would leave them.
pub const LISTING_CODE: &str = r#"def _runcell_code_mode_listing():
    import importlib, inspect, json
    from runcell_tools import mcp
    out = []
    for server in mcp.servers():
        entry = {"server": server, "functions": []}
        try:
            module = importlib.import_module("runcell_tools.mcp." + server)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
            continue
        for name in getattr(module, "__all__", ()):
            f = getattr(module, name, None)
            if not callable(f):
                continue
            doc = (f.__doc__ or "").strip()
            first = doc.split("\n\n", 1)[0].strip()
            if first.startswith(("Parameters:", "Returns:", "MCP tool ")):
                first = ""
            signature = str(inspect.signature(f)).replace("typing.", "")
            entry["functions"].append({"name": name, "signature": signature, "description": " ".join(first.split())})
        out.append(entry)
    print(json.dumps(out))
try:
    _runcell_code_mode_listing()
finally:
    del _runcell_code_mode_listing
"#;

/// The system prompt's section for the listing printed by [`LISTING_CODE`], or None when it
/// lists no function (no server, or none the session may import).
pub fn prompt_section(listing: &Value) -> Option<String> {
    let servers = listing.as_array()?;
    let mut body = String::new();
    let mut listed = 0usize;
    let mut left_out = 0usize;
    for s in servers {
        let Some(server) = s["server"].as_str() else {
            continue;
        };
        let functions = s["functions"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if functions.is_empty() {
            continue;
        }
        let head = format!("\nfrom runcell_tools.mcp import {server}\n");
        if body.len() + head.len() > MAX_SECTION_BYTES {
            left_out += functions.len();
            continue;
        }
        let mut block = head;
        let mut here = 0usize;
        for f in functions {
            let Some(name) = f["name"].as_str() else {
                continue;
            };
            let signature = cut(
                f["signature"].as_str().unwrap_or("(...)"),
                MAX_SIGNATURE_CHARS,
            );
            let description = cut(
                f["description"].as_str().unwrap_or(""),
                MAX_DESCRIPTION_CHARS,
            );
            let line = if description.is_empty() {
                format!("- {server}.{name}{signature}\n")
            } else {
                format!("- {server}.{name}{signature}: {description}\n")
            };
            if body.len() + block.len() + line.len() > MAX_SECTION_BYTES {
                left_out += 1;
                continue;
            }
            block.push_str(&line);
            here += 1;
        }
        // A module none of whose functions fit is left out whole (they were counted above).
        if here > 0 {
            body.push_str(&block);
            listed += here;
        }
    }
    if listed == 0 {
        return None;
    }
    let mut section = String::from(
        "Code mode: in the `python` tool's session these MCP tools are Python functions \
         (keyword arguments only; `help(module.function)` shows one's documentation). When a \
         task needs several tool results, call them from one `python` cell — loop, filter, \
         join and add up in code — and print only what the answer needs: you see what the \
         code prints, never the tools' results themselves. A failed call raises \
         runcell_tools.ToolError.\n",
    );
    section.push_str(&body);
    if left_out > 0 {
        section.push_str(&format!(
            "({left_out} more functions are not listed here, to keep this short: \
             `module.__all__` in code lists them all.)\n"
        ));
    }
    Some(section)
}

/// `s` cut to `max` characters, with an ellipsis when it was longer.
fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn function(name: &str, description: &str) -> Value {
        json!({"name": name, "signature": "(*, id: int) -> dict", "description": description})
    }

    #[test]
    fn the_section_names_modules_functions_and_parameters() {
        let listing = json!([
            {"server": "crm", "functions": [function("get_record", "Look up one record by id.")]},
            {"server": "broken", "error": "ImportError: cannot import"},
            {"server": "empty", "functions": []},
        ]);
        let section = prompt_section(&listing).expect("a section");
        assert!(
            section.contains("from runcell_tools.mcp import crm\n"),
            "{section}"
        );
        assert!(
            section.contains("- crm.get_record(*, id: int) -> dict: Look up one record by id.\n"),
            "{section}"
        );
        assert!(
            !section.contains("broken") && !section.contains("empty"),
            "{section}"
        );
        assert!(!section.contains("more functions"), "{section}");
        assert_eq!(prompt_section(&json!([])), None);
        assert_eq!(
            prompt_section(&json!([{"server": "x", "error": "e"}])),
            None
        );
        assert_eq!(prompt_section(&json!({"not": "a list"})), None);
    }

    #[test]
    fn the_section_is_bounded_and_says_what_it_left_out() {
        let long = "word ".repeat(200);
        let functions: Vec<Value> = (0..500)
            .map(|i| function(&format!("tool_{i}"), &long))
            .collect();
        let listing = json!([
            {"server": "big", "functions": functions},
            {"server": "later", "functions": [function("one", "x")]},
        ]);
        let section = prompt_section(&listing).expect("a section");
        let head = section.find("\nfrom").expect("a module");
        assert!(
            section.len() - head <= MAX_SECTION_BYTES + 200,
            "{}",
            section.len()
        );
        assert!(section.contains("- big.tool_0("), "{section}");
        assert!(!section.contains("- big.tool_499("), "{section}");
        // Descriptions are cut to their bound.
        let line = section
            .lines()
            .find(|l| l.starts_with("- big.tool_0("))
            .expect("line");
        assert!(line.ends_with('…') && line.chars().count() < 220, "{line}");
        let listed = section.lines().filter(|l| l.starts_with("- ")).count();
        assert!(
            section.contains(&format!("({} more functions are not listed", 501 - listed)),
            "{section}"
        );
    }
}
