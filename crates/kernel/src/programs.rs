//! The in-sandbox kernels, one per language: each one's source (embedded, so the binary is all
//! a host needs), the file it is written to and the command line that starts it. The engine
//! asks here instead of spelling interpreters and file names itself, so that a kernel and the
//! way it is started change together. Beside the kernels go the modules they load from their own
//! directory ([`KERNEL_FILES`] lists all of it).

/// Where the directory holding the kernels is bound, read-only, inside every sandbox.
pub const SANDBOX_KERNEL_DIR: &str = "/opt/runcell/kernel";
/// The system's Python inside the sandbox (bound with `/usr`): the standard library only.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// Node.js inside the sandbox (bound with `/usr`).
pub const NODE: &str = "/usr/bin/node";

/// What runs a kernel's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interpreter {
    /// The session's Python: the data-science runtime when one is bound, else the system's.
    SessionPython,
    /// [`SYSTEM_PYTHON`], whatever runtime the session has.
    SystemPython,
    /// [`NODE`].
    Node,
}

/// One language's kernel program.
#[derive(Debug)]
pub struct KernelProgram {
    /// The file it is written to in the kernel directory.
    pub file: &'static str,
    /// Its source.
    pub source: &'static str,
    interpreter: Interpreter,
}

impl KernelProgram {
    /// The command line that starts this kernel in a sandbox whose kernel directory is bound
    /// at [`SANDBOX_KERNEL_DIR`]; `session_python` is the session's interpreter (the runtime's
    /// when one is bound).
    pub fn command(&self, session_python: &str) -> Vec<String> {
        let interpreter = match self.interpreter {
            Interpreter::SessionPython => session_python,
            Interpreter::SystemPython => SYSTEM_PYTHON,
            Interpreter::Node => NODE,
        };
        vec![
            interpreter.to_owned(),
            format!("{SANDBOX_KERNEL_DIR}/{}", self.file),
        ]
    }

    /// The name Python imports the file by: the zygote imports the Python kernel in its forked
    /// child instead of running it.
    pub fn module(&self) -> &'static str {
        self.file.strip_suffix(".py").unwrap_or(self.file)
    }
}

/// The Python kernel (stdlib only), on the session's Python so cells see the runtime's packages.
pub const PYTHON: KernelProgram = KernelProgram {
    file: "runcell_kernel.py",
    source: include_str!("../python/runcell_kernel.py"),
    interpreter: Interpreter::SessionPython,
};

/// The bash kernel: a small stdlib Python program driving one persistent bash, on the system's
/// Python so it starts the same with or without a runtime.
pub const BASH: KernelProgram = KernelProgram {
    file: "runcell_bash_kernel.py",
    source: include_str!("../bash/runcell_bash_kernel.py"),
    interpreter: Interpreter::SystemPython,
};

/// The JavaScript kernel, for Node.js (built-in modules only).
pub const JAVASCRIPT: KernelProgram = KernelProgram {
    file: "runcell_js_kernel.js",
    source: include_str!("../javascript/runcell_js_kernel.js"),
    interpreter: Interpreter::Node,
};

/// Every kernel program.
pub const KERNELS: [&KernelProgram; 3] = [&PYTHON, &BASH, &JAVASCRIPT];

/// Snapshots of the language state (issue 17: the file format, the Python namespace's
/// serializer), a module the Python and bash kernels import from their own directory.
pub const SNAPSHOT_MODULE: (&str, &str) = (
    "runcell_snapshot.py",
    include_str!("../python/runcell_snapshot.py"),
);

/// Chart data of matplotlib figures (issue 24), a module the Python kernel imports from its own
/// directory.
const CHARTS_MODULE: (&str, &str) = (
    "runcell_charts.py",
    include_str!("../python/runcell_charts.py"),
);

/// Tools called from the cell (issue 22: `from runcell_tools import lookup`), a module the Python
/// kernel imports from its own directory.
const TOOLS_MODULE: (&str, &str) = (
    "runcell_tools.py",
    include_str!("../python/runcell_tools.py"),
);

/// The operator's MCP servers as `runcell_tools.mcp.<server>` (issue 22), a module
/// runcell_tools imports from beside it.
const TOOLS_MCP_MODULE: (&str, &str) = (
    "runcell_tools_mcp.py",
    include_str!("../python/runcell_tools_mcp.py"),
);

/// The framing the Python and bash kernels share (`import runcell_wire`). A module, not a
/// program: found beside them on `sys.path`, the script's directory when a kernel runs cold and
/// the directory the zygote inserts before it imports the Python kernel.
const PYTHON_WIRE: (&str, &str) = ("runcell_wire.py", include_str!("../python/runcell_wire.py"));

/// The JavaScript kernel's source adjustments, which it `require`s from beside itself.
const JAVASCRIPT_SOURCE: (&str, &str) = (
    "runcell_js_source.js",
    include_str!("../javascript/runcell_js_source.js"),
);

/// The JavaScript kernel's snapshots of its bindings (issue 17), required from beside it.
const JAVASCRIPT_SNAPSHOT: (&str, &str) = (
    "runcell_js_snapshot.js",
    include_str!("../javascript/runcell_js_snapshot.js"),
);

/// Every file of the kernel directory, as (name, content): the kernels' programs and the
/// modules they import from beside them.
pub const KERNEL_FILES: [(&str, &str); 10] = [
    (PYTHON.file, PYTHON.source),
    PYTHON_WIRE,
    (BASH.file, BASH.source),
    (JAVASCRIPT.file, JAVASCRIPT.source),
    JAVASCRIPT_SOURCE,
    JAVASCRIPT_SNAPSHOT,
    SNAPSHOT_MODULE,
    CHARTS_MODULE,
    TOOLS_MODULE,
    TOOLS_MCP_MODULE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernel_starts_from_its_file_in_the_kernel_dir() {
        let python = "/opt/runcell/python/bin/python3";
        assert_eq!(
            PYTHON.command(python),
            [python, "/opt/runcell/kernel/runcell_kernel.py"]
        );
        assert_eq!(
            BASH.command(python),
            [
                "/usr/bin/python3",
                "/opt/runcell/kernel/runcell_bash_kernel.py"
            ]
        );
        assert_eq!(
            JAVASCRIPT.command(python),
            ["/usr/bin/node", "/opt/runcell/kernel/runcell_js_kernel.js"]
        );
        assert_eq!(PYTHON.module(), "runcell_kernel");
        // The files share one directory: no two may have the same name.
        let mut names: Vec<_> = KERNELS.iter().map(|k| k.file).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KERNELS.len());
        assert!(KERNELS.iter().all(|k| !k.source.is_empty()));
        let mut files: Vec<_> = KERNEL_FILES.iter().map(|(name, _)| *name).collect();
        files.sort();
        files.dedup();
        assert_eq!(files.len(), KERNEL_FILES.len());
        assert!(KERNELS.iter().all(|k| files.contains(&k.file)));
        assert!(KERNEL_FILES.iter().all(|(_, source)| !source.is_empty()));
    }
}
