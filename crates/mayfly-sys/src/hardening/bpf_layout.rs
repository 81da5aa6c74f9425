//! A binary-search layout for seccompiler's programs, as libseccomp builds.
//!
//! seccompiler compiles a filter into a linear chain: after the arch check it
//! loads the syscall number and compares it with each listed syscall in turn,
//! so a syscall late in the list walks some 1,500 instructions. The kernel
//! pays that at every syscall the filter runs for, and at install time, when
//! it runs the filter for every syscall number to build its allow cache.
//! [`tree_layout`] rebuilds the same program around a binary search on the
//! number. It compiles nothing: the policy stays seccompiler's to compile,
//! and this reads seccompiler's output the way the kernel runs it.
//!
//! 1. The prologue, up to the first load of the number, is kept as is. None of
//!    its jumps may pass that load.
//! 2. From the load, the dispatch chain is followed with A holding the number:
//!    a `ja` is taken, a `jeq k` sends number `k` to its true branch (the first
//!    `jeq` on `k` wins, as in the chain) and the walk continues on its false
//!    branch, and a `ret` gives the action of every number not listed. Any
//!    other instruction there is an error, so nothing unexpected is rewritten.
//! 3. Each number's target is followed through `ja`s. A `ret` becomes a leaf
//!    of the tree. Anything else (a rule chain on the arguments) is kept with
//!    every instruction reachable from it, in the original order, with its
//!    jumps relocated. The chain, no longer reachable, is dropped.
//! 4. The 32-bit number space is cut into maximal ranges with one outcome,
//!    unlisted numbers included (x32 numbers, with bit 30 set, fall on the
//!    default), and a balanced tree of `jge` on the range starts picks one.
//!    Classic BPF's conditional offsets are 8 bits, so a split whose left
//!    side is longer than 255 instructions goes through a 32-bit `ja`.
//!
//! The chain and the tree only compare A and jump, writing no register or
//! scratch memory, so every target is entered in the state the linear program
//! enters it in, and runs the same instructions from there.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};

const CLASS_MASK: u16 = 0x07;
const OP_MASK: u16 = 0xf0;
const CLASS_JMP: u16 = 0x05;
const CLASS_RET: u16 = 0x06;
const OP_JA: u16 = 0x00;
/// `BPF_LD | BPF_W | BPF_ABS`: load a word of `struct seccomp_data`.
const LD_ABS: u16 = 0x20;
const JA: u16 = CLASS_JMP | OP_JA;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const JGE_K: u16 = 0x35;
/// `BPF_RET | BPF_K`.
const RET_K: u16 = 0x06;
/// Where `struct seccomp_data` holds the syscall number.
const NR_OFFSET: u32 = 0;
/// The kernel's `BPF_MAXINSNS`.
const MAX_LEN: usize = 4096;

/// Why a program was not laid out as a tree. The caller then keeps the
/// linear program, which is equivalent; the layout never guesses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("the program never loads the syscall number")]
    NoNumberLoad,
    #[error("instruction {pc} comes before the syscall number is loaded but jumps past the load")]
    PrologueJumpsPastLoad { pc: usize },
    #[error(
        "instruction {pc} (opcode {code:#06x}) of the syscall dispatch chain is not a `ja`, \
         a `jeq` on a constant, or a `ret` of a constant"
    )]
    UnexpectedDispatch { pc: usize, code: u16 },
    #[error("instruction {pc} jumps or falls through past the end of the program")]
    OutOfBounds { pc: usize },
    #[error("the tree layout would take {len} instructions; the kernel accepts at most 4096")]
    TooLong { len: usize },
}

/// What a range of syscall numbers leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Return this action at once.
    Return(u32),
    /// Run the original program from this instruction (argument checks).
    Block(usize),
}

/// An instruction of the tree, before the body's new positions are known.
enum Node {
    Insn(sock_filter),
    ToBlock(usize),
}

/// Rebuilds `prog`, a program as seccompiler emits it, to dispatch on the
/// syscall number by binary search; see the module documentation.
pub fn tree_layout(prog: &[sock_filter]) -> Result<BpfProgram, LayoutError> {
    let load = prog
        .iter()
        .position(|i| i.code == LD_ABS && i.k == NR_OFFSET)
        .ok_or(LayoutError::NoNumberLoad)?;
    for pc in 0..load {
        if successors(prog, pc)?
            .into_iter()
            .flatten()
            .any(|to| to > load)
        {
            return Err(LayoutError::PrologueJumpsPastLoad { pc });
        }
    }
    let (entries, default) = dispatch(prog, load + 1)?;
    let mut targets = BTreeMap::new();
    for (nr, pc) in entries {
        targets.insert(nr, resolve(prog, pc)?);
    }
    let ranges = ranges(&targets, Outcome::Return(default));
    if ranges.len() > MAX_LEN {
        return Err(LayoutError::TooLong { len: ranges.len() });
    }
    let tree = tree(&ranges);

    // Everything reachable from a block, in order; jumps only go forward.
    let mut keep = vec![false; prog.len()];
    for outcome in targets.values() {
        if let Outcome::Block(pc) = *outcome {
            keep[pc] = true;
        }
    }
    for pc in 0..prog.len() {
        if keep[pc] {
            for to in successors(prog, pc)?.into_iter().flatten() {
                keep[to] = true;
            }
        }
    }
    let body_start = load + 1 + tree.len();
    let mut new_pc = vec![usize::MAX; prog.len()];
    let mut len = body_start;
    for pc in (0..prog.len()).filter(|&pc| keep[pc]) {
        new_pc[pc] = len;
        len += 1;
    }
    if len > MAX_LEN {
        return Err(LayoutError::TooLong { len });
    }

    let mut out: BpfProgram = prog[..=load].to_vec();
    for node in tree {
        let here = out.len();
        out.push(match node {
            Node::Insn(insn) => insn,
            Node::ToBlock(pc) => stmt(JA, offset32(new_pc[pc] - here - 1)),
        });
    }
    for pc in (0..prog.len()).filter(|&pc| keep[pc]) {
        out.push(relocate(prog, pc, &new_pc)?);
    }
    check(&out)?;
    Ok(out)
}

/// Walks the dispatch chain from `pc` with A holding the syscall number:
/// the first branch taken for each listed number, and the default action.
fn dispatch(
    prog: &[sock_filter],
    mut pc: usize,
) -> Result<(BTreeMap<u32, usize>, u32), LayoutError> {
    let mut entries = BTreeMap::new();
    loop {
        let insn = prog.get(pc).ok_or(LayoutError::OutOfBounds { pc })?;
        match insn.code {
            JA => pc = target(prog, pc, insn.k as usize)?,
            JEQ_K => {
                let taken = target(prog, pc, usize::from(insn.jt))?;
                entries.entry(insn.k).or_insert(taken);
                pc = target(prog, pc, usize::from(insn.jf))?;
            }
            RET_K => return Ok((entries, insn.k)),
            code => return Err(LayoutError::UnexpectedDispatch { pc, code }),
        }
    }
}

/// Where a listed number ends up once the `ja`s in between are taken.
fn resolve(prog: &[sock_filter], mut pc: usize) -> Result<Outcome, LayoutError> {
    while prog[pc].code == JA {
        pc = target(prog, pc, prog[pc].k as usize)?;
    }
    Ok(match prog[pc].code {
        RET_K => Outcome::Return(prog[pc].k),
        _ => Outcome::Block(pc),
    })
}

/// The maximal ranges of numbers with one outcome, by their first number;
/// the first range starts at 0 and the last runs to `u32::MAX`.
fn ranges(targets: &BTreeMap<u32, Outcome>, default: Outcome) -> Vec<(u32, Outcome)> {
    let mut out = Vec::new();
    let mut push = |start: u32, outcome: Outcome| {
        if out.last().is_some_and(|&(s, _)| s == start) {
            out.pop(); // an empty range, overridden
        }
        if out.last().map(|&(_, o)| o) != Some(outcome) {
            out.push((start, outcome));
        }
    };
    push(0, default);
    for (&nr, &outcome) in targets {
        push(nr, outcome);
        if let Some(next) = nr.checked_add(1) {
            push(next, default);
        }
    }
    out
}

/// A balanced search over `ranges` (never empty): `jge` on the middle start,
/// the lower half right after it, then the upper half.
fn tree(ranges: &[(u32, Outcome)]) -> Vec<Node> {
    if let [(_, outcome)] = ranges {
        return vec![match *outcome {
            Outcome::Return(action) => Node::Insn(stmt(RET_K, action)),
            Outcome::Block(pc) => Node::ToBlock(pc),
        }];
    }
    let mid = ranges.len() / 2;
    let (lower, upper) = (tree(&ranges[..mid]), tree(&ranges[mid..]));
    let pivot = ranges[mid].0;
    let mut out = Vec::with_capacity(lower.len() + upper.len() + 2);
    match u8::try_from(lower.len()) {
        Ok(skip) => out.push(Node::Insn(jump(JGE_K, pivot, skip, 0))),
        Err(_) => {
            out.push(Node::Insn(jump(JGE_K, pivot, 0, 1)));
            out.push(Node::Insn(stmt(JA, offset32(lower.len()))));
        }
    }
    out.extend(lower);
    out.extend(upper);
    out
}

/// Instruction `pc` of `prog` with its jumps pointed at the new positions.
/// Only instructions between kept ones are dropped, so offsets only shrink.
fn relocate(prog: &[sock_filter], pc: usize, new_pc: &[usize]) -> Result<sock_filter, LayoutError> {
    let mut insn = prog[pc].clone();
    if insn.code & CLASS_MASK != CLASS_JMP {
        return Ok(insn);
    }
    let here = new_pc[pc];
    let moved = |offset: usize| Ok::<_, LayoutError>(new_pc[target(prog, pc, offset)?] - here - 1);
    if insn.code & OP_MASK == OP_JA {
        insn.k = offset32(moved(insn.k as usize)?);
    } else {
        let short = |o: usize| u8::try_from(o).map_err(|_| LayoutError::OutOfBounds { pc });
        insn.jt = short(moved(usize::from(insn.jt))?)?;
        insn.jf = short(moved(usize::from(insn.jf))?)?;
    }
    Ok(insn)
}

/// The kernel's own checks that matter here: at most 4096 instructions, and
/// every jump and fall-through stays inside (so the last is a `ret`).
fn check(prog: &[sock_filter]) -> Result<(), LayoutError> {
    if prog.len() > MAX_LEN {
        return Err(LayoutError::TooLong { len: prog.len() });
    }
    for pc in 0..prog.len() {
        successors(prog, pc)?;
    }
    Ok(())
}

/// Where instruction `pc` goes: none for a `ret`; taken and not taken for a
/// jump (a `ja` only has taken); the next instruction otherwise.
fn successors(prog: &[sock_filter], pc: usize) -> Result<[Option<usize>; 2], LayoutError> {
    let insn = &prog[pc];
    Ok(match (insn.code & CLASS_MASK, insn.code & OP_MASK) {
        (CLASS_RET, _) => [None, None],
        (CLASS_JMP, OP_JA) => [Some(target(prog, pc, insn.k as usize)?), None],
        (CLASS_JMP, _) => [
            Some(target(prog, pc, usize::from(insn.jt))?),
            Some(target(prog, pc, usize::from(insn.jf))?),
        ],
        _ => [Some(target(prog, pc, 0)?), None],
    })
}

/// Instruction `pc + 1 + offset`, if the program has it.
fn target(prog: &[sock_filter], pc: usize, offset: usize) -> Result<usize, LayoutError> {
    pc.checked_add(offset)
        .and_then(|to| to.checked_add(1))
        .filter(|&to| to < prog.len())
        .ok_or(LayoutError::OutOfBounds { pc })
}

/// A 32-bit `ja` offset; programs are capped at 4096 instructions first.
fn offset32(offset: usize) -> u32 {
    u32::try_from(offset).unwrap_or(u32::MAX)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    jump(code, k, 0, 0)
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[cfg(test)]
mod tests;
