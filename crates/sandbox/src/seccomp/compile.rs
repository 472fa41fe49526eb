//! The policy tables compiled into classic-BPF programs, without side effects: the allow-list
//! (behind a binary-search fast path) and one filter per errno other than `EPERM`.

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::error::SeccompError;
use super::policy::{
    allowed, denied, ioctl_request, no_ops, Allowed, ArgRule, DEFAULT_ERRNO, NAMESPACE_FLAGS,
    PERSONALITY_QUERY, PER_LINUX, SOCKET_PROTOCOLS, SOCKET_PROTOCOL_ERRNO, SOCK_TYPE_MASK,
};

#[cfg(target_arch = "x86_64")]
const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET_ARCH: TargetArch = TargetArch::aarch64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the seccomp policy is written for x86_64 and aarch64 only");

fn condition(
    name: &'static str,
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, len, op, value).map_err(|source| SeccompError::Rule { name, source })
}

fn rule(
    name: &'static str,
    conditions: Vec<SeccompCondition>,
) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conditions).map_err(|source| SeccompError::Rule { name, source })
}

/// The seccompiler rules for one allowed entry: any rule matching allows the call; an empty list
/// allows it unconditionally.
fn rules_for(entry: &Allowed) -> Result<Vec<SeccompRule>, SeccompError> {
    use SeccompCmpArgLen::{Dword, Qword};
    use SeccompCmpOp::{Eq, MaskedEq, Ne};
    let name = entry.name;
    match entry.args {
        ArgRule::Any => Ok(Vec::new()),
        ArgRule::CloneWithoutNamespaceFlags => Ok(vec![rule(
            name,
            vec![condition(name, 0, Qword, MaskedEq(NAMESPACE_FLAGS), 0)?],
        )?]),
        ArgRule::SocketDomains => {
            let mut rules = Vec::new();
            for &(domain, kind, protocols) in SOCKET_PROTOCOLS {
                for &protocol in protocols {
                    let mut conditions = socket_family_and_type(name, domain, kind)?;
                    conditions.push(condition(name, 2, Dword, Eq, protocol as u64)?);
                    rules.push(rule(name, conditions)?);
                }
            }
            Ok(rules)
        }
        ArgRule::IoctlNotTiocsti => Ok(vec![rule(
            name,
            vec![
                condition(name, 1, Dword, Ne, ioctl_request(libc::TIOCSTI))?,
                condition(name, 1, Dword, Ne, ioctl_request(libc::TIOCLINUX))?,
            ],
        )?]),
        ArgRule::PersonalityQueryOrLinux => Ok(vec![
            rule(
                name,
                vec![condition(name, 0, Dword, Eq, PERSONALITY_QUERY)?],
            )?,
            rule(name, vec![condition(name, 0, Dword, Eq, PER_LINUX)?])?,
        ]),
    }
}

/// Conditions matching one family (arg0) and, if given, one type (arg1, without the flags).
fn socket_family_and_type(
    name: &'static str,
    domain: libc::c_int,
    kind: Option<libc::c_int>,
) -> Result<Vec<SeccompCondition>, SeccompError> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::{Eq, MaskedEq};
    let mut conditions = vec![condition(name, 0, Dword, Eq, domain as u64)?];
    if let Some(kind) = kind {
        conditions.push(condition(
            name,
            1,
            Dword,
            MaskedEq(SOCK_TYPE_MASK),
            kind as u64,
        )?);
    }
    Ok(conditions)
}

/// The argument patterns of an allowed entry that get an errno other than `EPERM`, as
/// (errno, rules): the allow-list refuses them with `EPERM`, and a later filter corrects that.
fn refusals_for(entry: &Allowed) -> Result<Vec<(i32, Vec<SeccompRule>)>, SeccompError> {
    use SeccompCmpArgLen::Dword;
    use SeccompCmpOp::Ne;
    let name = entry.name;
    match entry.args {
        ArgRule::SocketDomains => {
            let mut rules = Vec::new();
            for &(domain, kind, protocols) in SOCKET_PROTOCOLS {
                let mut conditions = socket_family_and_type(name, domain, kind)?;
                for &protocol in protocols {
                    conditions.push(condition(name, 2, Dword, Ne, protocol as u64)?);
                }
                rules.push(rule(name, conditions)?);
            }
            Ok(vec![(SOCKET_PROTOCOL_ERRNO, rules)])
        }
        ArgRule::Any
        | ArgRule::CloneWithoutNamespaceFlags
        | ArgRule::IoctlNotTiocsti
        | ArgRule::PersonalityQueryOrLinux => Ok(Vec::new()),
    }
}

fn compile(
    filter: &'static str,
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    SeccompFilter::new(rules, mismatch, matched, TARGET_ARCH)
        .and_then(BpfProgram::try_from)
        .map_err(|source| SeccompError::Compile { filter, source })
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xc000_00b7;

/// A binary search over the syscalls allowed whatever their arguments, put in front of
/// seccompiler's program. seccompiler emits one comparison chain in syscall-number order, so a
/// frequent call such as `openat` (257) ran through ~1000 instructions on every call; the
/// search answers those in ~20 and hands everything else (another architecture, the calls with
/// argument rules, the refused ones) to the unchanged program behind it, which starts over
/// with its own architecture check, and which then no longer lists them. The decisions are the
/// same as the full chain's (tested on every number).
fn fast_path(nrs: &[u32]) -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const JA: u16 = 0x05; // BPF_JMP | BPF_JA
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };

    let mut sorted = nrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Jumps to "the rest" are patched once the length is known: (index of the `ja`).
    let mut to_rest = Vec::new();
    let mut out = vec![
        ins(LD_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ, 1, 0, AUDIT_ARCH_NATIVE),
    ];
    to_rest.push(out.len());
    out.push(ins(JA, 0, 0, 0));
    out.push(ins(LD_ABS, 0, 0, 0)); // seccomp_data.nr
    fn tree(
        out: &mut Vec<sock_filter>,
        to_rest: &mut Vec<usize>,
        nrs: &[u32],
        ins: &dyn Fn(u16, u8, u8, u32) -> sock_filter,
    ) {
        if nrs.len() <= 4 {
            // Leaf: compare each; a hit jumps to the `ret ALLOW` after the `ja rest`.
            for (i, &nr) in nrs.iter().enumerate() {
                let to_allow = (nrs.len() - i) as u8; // the remaining jeqs, then the ja
                out.push(ins(JEQ, to_allow, 0, nr));
            }
            to_rest.push(out.len());
            out.push(ins(JA, 0, 0, 0));
            out.push(ins(RET, 0, 0, libc::SECCOMP_RET_ALLOW));
            return;
        }
        let mid = nrs.len() / 2;
        // nr >= nrs[mid] falls onto the `ja` to the right half (a long jump: offsets in jeq/jge
        // are 8 bits); otherwise it skips it into the left half, which follows.
        out.push(ins(JGE, 0, 1, nrs[mid]));
        let ja_right = out.len();
        out.push(ins(JA, 0, 0, 0));
        tree(out, to_rest, &nrs[..mid], ins);
        let right = out.len();
        out[ja_right].k = (right - ja_right - 1) as u32;
        tree(out, to_rest, &nrs[mid..], ins);
    }
    tree(&mut out, &mut to_rest, &sorted, &ins);
    let rest = out.len();
    for i in to_rest {
        out[i].k = (rest - i - 1) as u32;
    }
    out
}

/// Builds the BPF programs (no side effects): the allow-list first, then one filter per errno
/// other than `EPERM` (0 for the [`no_ops`]) in [`denied`], the argument rules and the no-ops,
/// in the order [`super::install`] loads them.
pub fn build() -> Result<Vec<BpfProgram>, SeccompError> {
    build_with(true)
}

/// pid 1's filter (no side effects): [`super::policy::pid1_allowed`], whatever the arguments,
/// found by the same binary search as the program's fast path; the rest fails with `EPERM`,
/// and another architecture's calls kill, as in the program's. No seccompiler chain behind the
/// search: loading a program costs by its length and by how far each number runs through it
/// (the kernel works out a cached action per number at load time).
pub fn build_pid1() -> Result<BpfProgram, SeccompError> {
    use seccompiler::sock_filter;
    let mut nrs = Vec::new();
    for entry in super::policy::pid1_allowed() {
        let nr = entry.nr as u32;
        if nrs.contains(&nr) {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        nrs.push(nr);
    }
    let mut program = fast_path(&nrs);
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let eperm = libc::SECCOMP_RET_ERRNO | DEFAULT_ERRNO.unsigned_abs();
    // Not allowed: load seccomp_data.arch (BPF_LD | BPF_W | BPF_ABS); the native one
    // (BPF_JMP | BPF_JEQ | BPF_K) returns EPERM, any other kills (BPF_RET | BPF_K).
    program.extend([
        ins(0x20, 0, 0, 4),
        ins(0x15, 0, 1, AUDIT_ARCH_NATIVE),
        ins(0x06, 0, 0, eperm),
        ins(0x06, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
    ]);
    Ok(program)
}

/// A refusal's errno as the filter returns it: 1..=4095 (0 is reserved for the no-ops).
fn valid_errno(name: &'static str, errno: i32) -> Result<u32, SeccompError> {
    match u32::try_from(errno) {
        Ok(e @ 1..=4095) => Ok(e),
        _ => Err(SeccompError::BadErrno { name, errno }),
    }
}

pub(super) fn build_with(fast: bool) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut allow_rules = BTreeMap::new();
    let mut by_errno: BTreeMap<u32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for entry in allowed() {
        if allow_rules.insert(entry.nr, rules_for(entry)?).is_some() {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        for (errno, rules) in refusals_for(entry)? {
            let errno = valid_errno(entry.name, errno)?;
            by_errno.entry(errno).or_default().insert(entry.nr, rules);
        }
    }

    let mut seen = BTreeSet::new();
    for entry in no_ops() {
        if allow_rules.contains_key(&entry.nr) {
            return Err(SeccompError::AllowedAndDenied { name: entry.name });
        }
        if !seen.insert(entry.nr) {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        // SECCOMP_RET_ERRNO with 0: the call "returns" 0 and the kernel never runs it.
        by_errno.entry(0).or_default().insert(entry.nr, Vec::new());
    }
    for entry in denied() {
        if allow_rules.contains_key(&entry.nr) {
            return Err(SeccompError::AllowedAndDenied { name: entry.name });
        }
        if !seen.insert(entry.nr) {
            return Err(SeccompError::Duplicate { name: entry.name });
        }
        let errno = valid_errno(entry.name, entry.errno)?;
        if entry.errno != DEFAULT_ERRNO {
            by_errno
                .entry(errno)
                .or_default()
                .insert(entry.nr, Vec::new());
        }
    }

    let unconditional: Vec<u32> = allowed()
        .iter()
        .filter(|e| matches!(e.args, ArgRule::Any))
        .map(|e| e.nr as u32)
        .collect();
    let mut programs = Vec::with_capacity(1 + by_errno.len());
    let mut allow_list = if fast {
        // The fast path allows these on the native architecture before the chain is reached,
        // and on any other the chain kills first: they need no place in it (a shorter program
        // is also quicker to JIT-compile, once per sandbox process).
        allow_rules.retain(|nr, _| !unconditional.contains(&(*nr as u32)));
        fast_path(&unconditional)
    } else {
        Vec::new()
    };
    allow_list.extend(compile(
        "allow-list",
        allow_rules,
        SeccompAction::Errno(DEFAULT_ERRNO.unsigned_abs()),
        SeccompAction::Allow,
    )?);
    programs.push(allow_list);
    for (errno, rules) in by_errno {
        programs.push(compile(
            "errno override",
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno),
        )?);
    }
    Ok(programs)
}
