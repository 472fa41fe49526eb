//! runcell-structure: checks of the workspace's own source structure, run by `cargo test`;
//! nothing depends on it.
//!
//! One check today: no import circles between the files of a crate ([`workspace_cycles`]).
//! File `a` depends on file `b` when it names an item `b` defines: in a `use` (`use
//! crate::b::B`, `use super::b`), in a path in its code (`crate::b::f()`, `b::C` for a child
//! module `b`, `B` imported from `b`), in a macro's tokens (`warn!(e = %crate::b::f())`) or in
//! an attribute's string (`#[serde(with = "crate::b")]`). Re-exports are followed to the file
//! that defines the item, so a `pub use` cannot hide a circle. Two things are not
//! dependencies: the crate root's own re-exports (`lib.rs`'s `pub use`, the crate's public
//! face, so that any file may use the helpers the root defines), and `#[cfg(test)]` code (unit
//! tests reach into their parent by design: `use super::*`).
//!
//! Name resolution is a close approximation of rustc's, not rustc's: a path names an item when
//! its first segment is `crate`, `self`, `super`, a child module or a name the module imports
//! or defines; a local variable that shares its name with an import would count as the import.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit_mut::{self, VisitMut};

/// Reads a source file; `None` when there is none.
pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// A crate's sources could not be read or parsed.
#[derive(Debug)]
pub struct Error {
    pub file: PathBuf,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for Error {}

/// One crate's files and which depends on which.
#[derive(Debug, Default)]
pub struct Graph {
    /// Its files, the crate root first.
    pub files: Vec<PathBuf>,
    /// `edges[a][b]`: the first path in file `a` that names an item of file `b`.
    pub edges: BTreeMap<usize, BTreeMap<usize, String>>,
}

/// Every import circle between the files of every crate under `workspace/crates/*/src` (a
/// library, a binary and each `src/bin/*.rs` are crates of their own), one line per circle:
/// `a.rs -> b.rs (crate::b::f) -> a.rs (crate::a::A)`.
pub fn workspace_cycles(workspace: &Path) -> Result<Vec<String>, Error> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let dir_error = |file: &Path, e: std::io::Error| Error {
        file: file.to_owned(),
        message: e.to_string(),
    };
    let crates = workspace.join("crates");
    let mut members: Vec<PathBuf> = std::fs::read_dir(&crates)
        .map_err(|e| dir_error(&crates, e))?
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    members.sort();
    let mut cycles = Vec::new();
    for src in members {
        let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .filter(|f| f.is_file())
            .collect();
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            let mut bins: Vec<PathBuf> = bins
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "rs"))
                .collect();
            bins.sort();
            roots.extend(bins);
        }
        for root in roots {
            let graph = crate_graph(&root, &read)?;
            for cycle in graph.cycles() {
                cycles.push(graph.describe(&cycle, workspace));
            }
        }
    }
    Ok(cycles)
}

/// The file graph of the crate whose root file is `root`.
pub fn crate_graph(root: &Path, read: Read<'_>) -> Result<Graph, Error> {
    let mut tree = Tree::default();
    let dir = root.parent().unwrap_or(Path::new("")).to_owned();
    tree.load_file(root, dir, None, read)?;
    let mut graph = Graph {
        files: tree.files.iter().map(|(p, _)| p.clone()).collect(),
        edges: BTreeMap::new(),
    };
    for file in 0..tree.files.len() {
        let module = tree.file_modules[file];
        let mut ast = tree.files[file].1.clone();
        let mut edges = Edges {
            tree: &tree,
            module,
            found: BTreeMap::new(),
        };
        for item in &mut ast.items {
            edges.visit_item_mut(item);
        }
        let found = edges.found;
        for (to, why) in found {
            if to != file {
                graph
                    .edges
                    .entry(file)
                    .or_default()
                    .entry(to)
                    .or_insert(why);
            }
        }
    }
    Ok(graph)
}

impl Graph {
    /// One circle per group of files that reach each other (a strongly connected component),
    /// the shortest through its first file; each as file indices, first file not repeated.
    pub fn cycles(&self) -> Vec<Vec<usize>> {
        let n = self.files.len();
        let succ = |v: usize| -> Vec<usize> {
            self.edges
                .get(&v)
                .map(|m| m.keys().copied().collect())
                .unwrap_or_default()
        };
        // Tarjan's algorithm, iteratively.
        let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
        let (mut stack, mut sccs, mut next) = (Vec::new(), Vec::new(), 0);
        for s in 0..n {
            if index[s] != usize::MAX {
                continue;
            }
            let mut work = vec![(s, 0usize)];
            index[s] = next;
            low[s] = next;
            next += 1;
            stack.push(s);
            on[s] = true;
            while let Some(&mut (v, ref mut i)) = work.last_mut() {
                let out = succ(v);
                if let Some(&w) = out.get(*i) {
                    *i += 1;
                    if index[w] == usize::MAX {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on[w] = true;
                        work.push((w, 0));
                    } else if on[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some(&(u, _)) = work.last() {
                    low[u] = low[u].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut scc = Vec::new();
                    while let Some(w) = stack.pop() {
                        on[w] = false;
                        scc.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if scc.len() > 1 {
                        sccs.push(scc.into_iter().collect::<BTreeSet<_>>());
                    }
                }
            }
        }
        sccs.sort();
        sccs.into_iter()
            .filter_map(|scc| {
                let &start = scc.first()?;
                // The shortest way back to `start`, inside the component.
                let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
                let mut queue = VecDeque::from([start]);
                while let Some(v) = queue.pop_front() {
                    for w in succ(v) {
                        if w == start {
                            let mut path = vec![v];
                            while let Some(&p) = prev.get(path.last()?) {
                                path.push(p);
                            }
                            path.reverse();
                            return Some(path);
                        }
                        if scc.contains(&w) && w != start && !prev.contains_key(&w) {
                            prev.insert(w, v);
                            queue.push_back(w);
                        }
                    }
                }
                None
            })
            .collect()
    }

    /// `a.rs -> b.rs (the path that makes a use b) -> a.rs (…)`, paths relative to `base`.
    pub fn describe(&self, cycle: &[usize], base: &Path) -> String {
        let name = |f: usize| {
            let p = &self.files[f];
            p.strip_prefix(base).unwrap_or(p).display().to_string()
        };
        let mut s = name(cycle[0]);
        for (k, &from) in cycle.iter().enumerate() {
            let to = cycle[(k + 1) % cycle.len()];
            let why = self
                .edges
                .get(&from)
                .and_then(|m| m.get(&to))
                .map_or("?", String::as_str);
            s.push_str(&format!(" -> {} ({why})", name(to)));
        }
        s
    }
}

/// A `use` of one name (or a glob), its path as written.
#[derive(Debug, Clone)]
struct Import {
    path: Vec<String>,
}

#[derive(Debug, Default)]
struct Module {
    file: usize,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    items: BTreeSet<String>,
    imports: BTreeMap<String, Import>,
    globs: Vec<Import>,
}

#[derive(Default)]
struct Tree {
    files: Vec<(PathBuf, syn::File)>,
    /// The module each file holds at its top.
    file_modules: Vec<usize>,
    modules: Vec<Module>,
}

impl Tree {
    fn load_file(
        &mut self,
        path: &Path,
        dir: PathBuf,
        parent: Option<usize>,
        read: Read<'_>,
    ) -> Result<usize, Error> {
        let error = |message: String| Error {
            file: path.to_owned(),
            message,
        };
        let text = read(path).ok_or_else(|| error("cannot read it".into()))?;
        let ast = syn::parse_file(&text).map_err(|e| error(e.to_string()))?;
        let file = self.files.len();
        let module = self.modules.len();
        self.modules.push(Module {
            file,
            parent,
            ..Module::default()
        });
        self.files.push((path.to_owned(), ast.clone()));
        self.file_modules.push(module);
        self.add_items(module, &ast.items, &dir, read)?;
        Ok(module)
    }

    fn add_items(
        &mut self,
        module: usize,
        items: &[syn::Item],
        dir: &Path,
        read: Read<'_>,
    ) -> Result<(), Error> {
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            let name = match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let child = match &m.content {
                        Some((_, inner)) => {
                            let child = self.modules.len();
                            self.modules.push(Module {
                                file: self.modules[module].file,
                                parent: Some(module),
                                ..Module::default()
                            });
                            self.add_items(child, inner, &dir.join(&name), read)?;
                            child
                        }
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let nested = dir.join(&name).join("mod.rs");
                            let path = if read(&flat).is_some() { flat } else { nested };
                            self.load_file(&path, dir.join(&name), Some(module), read)?
                        }
                    };
                    self.modules[module].children.insert(name, child);
                    continue;
                }
                syn::Item::Use(u) => {
                    if u.leading_colon.is_none() {
                        for (name, path) in flatten_use(&u.tree) {
                            let import = Import { path };
                            match name {
                                Some(n) => {
                                    self.modules[module].imports.insert(n, import);
                                }
                                None => self.modules[module].globs.push(import),
                            }
                        }
                    }
                    continue;
                }
                syn::Item::Const(i) => &i.ident,
                syn::Item::Enum(i) => &i.ident,
                syn::Item::Fn(i) => &i.sig.ident,
                syn::Item::Macro(i) => match &i.ident {
                    Some(id) => id,
                    None => continue,
                },
                syn::Item::Static(i) => &i.ident,
                syn::Item::Struct(i) => &i.ident,
                syn::Item::Trait(i) => &i.ident,
                syn::Item::TraitAlias(i) => &i.ident,
                syn::Item::Type(i) => &i.ident,
                syn::Item::Union(i) => &i.ident,
                _ => continue,
            };
            self.modules[module].items.insert(name.to_string());
        }
        Ok(())
    }

    fn is_root(&self, module: usize) -> bool {
        self.modules[module].parent.is_none()
    }

    /// The file defining what `path`, written in `module`, names (`None`: not this crate's).
    fn resolve(&self, module: usize, path: &[String], depth: u32) -> Option<usize> {
        if depth > 32 {
            return None;
        }
        let (start, rest) = match path.first()?.as_str() {
            "crate" => {
                let mut m = module;
                while let Some(p) = self.modules[m].parent {
                    m = p;
                }
                (m, &path[1..])
            }
            "self" => (module, &path[1..]),
            "super" => {
                let mut m = module;
                let mut i = 0;
                while path.get(i).is_some_and(|s| s == "super") {
                    m = self.modules[m].parent?;
                    i += 1;
                }
                (m, &path[i..])
            }
            _ => (module, path),
        };
        self.walk(start, rest, depth)
    }

    fn walk(&self, m: usize, path: &[String], depth: u32) -> Option<usize> {
        let module = &self.modules[m];
        let Some(first) = path.first() else {
            return Some(module.file);
        };
        if let Some(&child) = module.children.get(first) {
            return self.walk(child, &path[1..], depth);
        }
        if module.items.contains(first) {
            return Some(module.file);
        }
        let through = |import: &Import, rest: &[String]| {
            let mut target = import.path.clone();
            target.extend_from_slice(rest);
            self.resolve(m, &target, depth + 1)
        };
        if let Some(import) = module.imports.get(first) {
            return through(import, &path[1..]);
        }
        module.globs.iter().find_map(|g| through(g, path))
    }
}

/// Each name a `use` tree brings in (`None`: a glob) and its full path.
fn flatten_use(tree: &syn::UseTree) -> Vec<(Option<String>, Vec<String>)> {
    fn go(
        prefix: &mut Vec<String>,
        tree: &syn::UseTree,
        out: &mut Vec<(Option<String>, Vec<String>)>,
    ) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                go(prefix, &p.tree, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) if n.ident == "self" => {
                out.push((prefix.last().cloned(), prefix.clone()));
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                out.push((Some(n.ident.to_string()), path));
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                out.push((Some(r.rename.to_string()), path));
            }
            syn::UseTree::Glob(_) => out.push((None, prefix.clone())),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    go(prefix, t, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    go(&mut Vec::new(), tree, &mut out);
    out
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]` (or `#[cfg(all(test, …))]`): compiled into unit tests only.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if {
                let t = l.tokens.to_string();
                t == "test" || t.starts_with("all (test") || t.starts_with("all(test")
            })
    })
}

fn segments(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// The dependencies of one file's code, by resolved file.
struct Edges<'t> {
    tree: &'t Tree,
    module: usize,
    found: BTreeMap<usize, String>,
}

impl Edges<'_> {
    fn note(&mut self, path: &[String]) {
        if let Some(file) = self.tree.resolve(self.module, path, 0) {
            self.found.entry(file).or_insert_with(|| path.join("::"));
        }
    }

    /// Paths inside tokens the parser leaves alone (a macro's input, an attribute's): those
    /// that start with `crate`, `self` or `super`, bare or in a string literal.
    fn scan(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.scan(g.stream()),
                TokenTree::Literal(l) => {
                    if let Ok(syn::Lit::Str(s)) = syn::parse_str::<syn::Lit>(&l.to_string()) {
                        if let Ok(p) = syn::parse_str::<syn::Path>(&s.value()) {
                            let path = segments(&p);
                            if is_local_start(&path) && p.leading_colon.is_none() {
                                self.note(&path);
                            }
                        }
                    }
                }
                TokenTree::Ident(id) if is_local_start(&[id.to_string()]) => {
                    let mut path = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || a.spacing() != Spacing::Joint || b.as_char() != ':'
                        {
                            break;
                        }
                        path.push(next.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.note(&path);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn is_local_start(path: &[String]) -> bool {
    path.first()
        .is_some_and(|s| matches!(s.as_str(), "crate" | "self" | "super"))
}

impl VisitMut for Edges<'_> {
    fn visit_item_mut(&mut self, item: &mut syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        match item {
            syn::Item::Mod(m) => {
                // A file module's code is its own file's; an inline one's is this file's.
                let Some((_, items)) = &mut m.content else {
                    return;
                };
                let Some(&child) = self.tree.modules[self.module]
                    .children
                    .get(&m.ident.to_string())
                else {
                    return;
                };
                for a in &mut m.attrs {
                    self.visit_attribute_mut(a);
                }
                let outer = std::mem::replace(&mut self.module, child);
                for i in items {
                    self.visit_item_mut(i);
                }
                self.module = outer;
            }
            syn::Item::Use(u) => {
                let reexport = !matches!(u.vis, syn::Visibility::Inherited);
                // The crate root's re-exports are its public face, not its dependencies.
                if u.leading_colon.is_some() || (reexport && self.tree.is_root(self.module)) {
                    return;
                }
                for (_, path) in flatten_use(&u.tree) {
                    self.note(&path);
                }
            }
            _ => visit_mut::visit_item_mut(self, item),
        }
    }

    fn visit_impl_item_mut(&mut self, item: &mut syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return visit_mut::visit_impl_item_mut(self, item),
        };
        if !is_test_only(attrs) {
            visit_mut::visit_impl_item_mut(self, item);
        }
    }

    fn visit_path_mut(&mut self, path: &mut syn::Path) {
        if path.leading_colon.is_none() {
            let segs = segments(path);
            // A single name is a value or a type, never a module (`entry.lock()` in a file
            // with a child module `entry`): only what the module imports counts.
            if segs.len() > 1
                || self.tree.modules[self.module]
                    .imports
                    .contains_key(&segs[0])
            {
                self.note(&segs);
            }
        }
        visit_mut::visit_path_mut(self, path);
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        self.visit_path_mut(&mut mac.path);
        self.scan(mac.tokens.clone());
    }

    fn visit_attribute_mut(&mut self, attr: &mut syn::Attribute) {
        if attr.path().is_ident("doc") {
            return;
        }
        if let syn::Meta::List(l) = &attr.meta {
            self.scan(l.tokens.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The graph's circles, as file names, for sources given as (path, text).
    fn cycles_of(files: &[(&str, &str)]) -> Vec<String> {
        let files: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect();
        let read = |p: &Path| files.get(p).cloned();
        let graph = crate_graph(Path::new("src/lib.rs"), &read).expect("the fixture parses");
        graph
            .cycles()
            .iter()
            .map(|c| graph.describe(c, Path::new("src")))
            .collect()
    }

    #[test]
    fn the_workspace_has_no_import_circles_between_files() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cycles = workspace_cycles(&workspace).expect("the workspace's sources parse");
        assert!(
            cycles.is_empty(),
            "import circles between files (move what both use into a module of its own, or pass \
             it in):\n{}",
            cycles.join("\n")
        );
    }

    #[test]
    fn a_circle_through_a_reexport_is_found() {
        let cycles = cycles_of(&[
            ("src/lib.rs", "mod a; mod b; pub use a::A;"),
            ("src/a.rs", "pub struct A; pub fn f() { crate::b::g() }"),
            ("src/b.rs", "pub fn g() { let _ = crate::A; }"),
        ]);
        assert_eq!(cycles, ["a.rs -> b.rs (crate::b::g) -> a.rs (crate::A)"]);
    }

    #[test]
    fn a_child_that_uses_its_parent_while_the_parent_uses_it_is_a_circle() {
        let cycles = cycles_of(&[
            ("src/lib.rs", "mod x;"),
            (
                "src/x/mod.rs",
                "mod y; pub struct S; fn f() -> y::T { todo!() }",
            ),
            ("src/x/y.rs", "use super::S; pub struct T;"),
        ]);
        assert_eq!(cycles, ["x/mod.rs -> x/y.rs (y::T) -> x/mod.rs (super::S)"]);
    }

    #[test]
    fn macros_and_attribute_strings_count() {
        let cycles = cycles_of(&[
            ("src/lib.rs", "mod a; mod b;"),
            (
                "src/a.rs",
                "pub fn f() { tracing::warn!(e = %crate::b::g()); }",
            ),
            (
                "src/b.rs",
                "pub fn g() {} #[derive(Serialize)] struct S { #[serde(with = \"crate::a\")] x: u8 }",
            ),
        ]);
        assert_eq!(cycles, ["a.rs -> b.rs (crate::b::g) -> a.rs (crate::a)"]);
    }

    #[test]
    fn the_roots_facade_and_unit_tests_are_not_circles() {
        let cycles = cycles_of(&[
            (
                "src/lib.rs",
                "mod a; mod b; pub use a::A; pub fn helper() {}",
            ),
            (
                "src/a.rs",
                "pub struct A; pub fn f() { crate::helper(); crate::b::g(); } \
                 #[cfg(test)] mod tests { use super::*; }",
            ),
            (
                "src/b.rs",
                "pub fn g() { let a = 1; let _ = a; } #[cfg(test)] mod tests { use crate::a::f; }",
            ),
        ]);
        assert_eq!(cycles, Vec::<String>::new());
    }
}
