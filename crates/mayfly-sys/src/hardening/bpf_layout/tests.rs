//! The tree layout against seccompiler's own output: whole programs for small
//! policies, verdict for verdict against the linear program for a large one,
//! and refusals of programs of another shape.
use seccompiler::{
    SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::*;

const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
const I386: u32 = 0x4000_0003;
const X32: u32 = 0x4000_0000;
const KILL: u32 = 0x8000_0000;
const ALLOW: u32 = 0x7fff_0000;
const EPERM: u32 = 0x0005_0001;
const ENOSYS: u32 = 0x0005_0026;
const LD: u16 = LD_ABS;

/// Runs a seccomp program the way the kernel does; the action and how many
/// instructions ran.
fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
    let data = crate::hardening::bpf_eval::SyscallData { nr, arch, args };
    crate::hardening::bpf_eval::evaluate(prog, &data).expect("the program evaluates")
}

fn compile(rules: Vec<(i64, Vec<SeccompRule>)>, mismatch: SeccompAction) -> BpfProgram {
    compile_with(rules, mismatch, SeccompAction::Allow)
}

fn compile_with(
    rules: Vec<(i64, Vec<SeccompRule>)>,
    mismatch: SeccompAction,
    on_match: SeccompAction,
) -> BpfProgram {
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        mismatch,
        on_match,
        TargetArch::x86_64,
    )
    .unwrap();
    filter.try_into().unwrap()
}

fn rule(conditions: &[(u8, Len, Op, u64)]) -> SeccompRule {
    let conditions = conditions
        .iter()
        .map(|(i, len, op, v)| SeccompCondition::new(*i, len.clone(), op.clone(), *v).unwrap())
        .collect();
    SeccompRule::new(conditions).unwrap()
}

fn prologue() -> Vec<sock_filter> {
    vec![
        stmt(LD, 4),
        jump(JEQ_K, ARCH, 1, 0),
        stmt(RET_K, KILL),
        stmt(LD, 0),
    ]
}

#[test]
fn a_one_syscall_layer_becomes_two_splits() {
    let linear = compile_with(
        vec![(435, vec![])],
        SeccompAction::Allow,
        SeccompAction::Errno(38),
    );
    let mut expected = prologue();
    expected.extend([
        jump(JGE_K, 435, 1, 0),
        stmt(RET_K, ALLOW),
        jump(JGE_K, 436, 1, 0),
        stmt(RET_K, ENOSYS),
        stmt(RET_K, ALLOW),
    ]);
    assert_eq!(tree_layout(&linear).unwrap(), expected);
}

#[test]
fn argument_rules_are_kept_with_their_jumps_relocated() {
    let linear = compile(
        vec![
            (0, vec![]),
            (1, vec![]),
            (3, vec![rule(&[(0, Len::Dword, Op::Eq, 5)])]),
        ],
        SeccompAction::Errno(1),
    );
    let mut expected = prologue();
    expected.extend([
        jump(JGE_K, 3, 3, 0), // [0, 3) | [3, ..)
        jump(JGE_K, 2, 1, 0), // [0, 2) | [2, 3)
        stmt(RET_K, ALLOW),
        stmt(RET_K, EPERM),
        jump(JGE_K, 4, 1, 0), // [3, 4) | [4, ..)
        stmt(JA, 1),
        stmt(RET_K, EPERM),
        // syscall 3's rule, entered past its `ja`s
        stmt(LD, 16),
        jump(JEQ_K, 5, 0, 1),
        stmt(RET_K, ALLOW),
        stmt(RET_K, EPERM),
    ]);
    assert_eq!(tree_layout(&linear).unwrap(), expected);
}

/// 400 syscall numbers: unlisted, unconditional, and with rules of every
/// operator and width, one of them long enough for seccompiler's helper
/// jumps; enough ranges for the tree's 32-bit `ja` splits.
fn large_policy() -> Vec<(i64, Vec<SeccompRule>)> {
    let ops = [
        Op::Eq,
        Op::Ne,
        Op::Gt,
        Op::Ge,
        Op::Lt,
        Op::Le,
        Op::MaskedEq(0xF0),
    ];
    let mut rules = Vec::new();
    for nr in 0..400i64 {
        let n = nr as u64;
        let chain = match nr % 6 {
            0 => continue,
            1 | 2 => vec![],
            3 => vec![rule(&[(0, Len::Dword, ops[nr as usize % 7].clone(), n)])],
            4 => vec![
                rule(&[(1, Len::Qword, ops[nr as usize % 7].clone(), n << 32 | 7)]),
                rule(&[(2, Len::Dword, Op::MaskedEq(1 << (n % 32)), 0)]),
            ],
            _ => vec![rule(&[
                (0, Len::Qword, Op::Ne, n),
                (2, Len::Dword, Op::Gt, 3),
            ])],
        };
        rules.push((nr, chain));
    }
    let long = (0..60)
        .map(|i| (i % 3, Len::Qword, Op::Ne, 1000 + u64::from(i)))
        .collect::<Vec<_>>();
    rules.push((450, vec![rule(&long)]));
    rules
}

/// Argument values on both sides of every rule of `large_policy` for `nr`.
fn samples(nr: u32) -> Vec<[u64; 6]> {
    let n = u64::from(nr);
    let mut values = vec![0, 1, 3, 4, 7, 0xF0, u64::MAX, u64::from(u32::MAX)];
    values.extend((0..64).map(|b| 1u64 << b));
    values.extend([
        n,
        n + 1,
        n << 32 | 7,
        n << 32 | 8,
        n << 32 | 6,
        (n + 1) << 32,
    ]);
    values.extend(1000..1060);
    let mut out = vec![[0; 6]];
    for v in values {
        for i in 0..3 {
            let mut args = [0; 6];
            args[i] = v;
            out.push(args);
        }
        out.push([v; 6]);
    }
    out
}

#[test]
fn a_large_policy_gives_the_same_verdicts_in_far_fewer_steps() {
    let linear = compile(large_policy(), SeccompAction::Errno(1));
    let tree = tree_layout(&linear).unwrap();
    let has_long_split = tree
        .windows(2)
        .any(|w| w[0].code == JGE_K && (w[0].jt, w[0].jf) == (0, 1) && w[1].code == JA);
    assert!(has_long_split, "the policy should need a 32-bit split");

    let (mut linear_worst, mut tree_worst) = (0, 0);
    for nr in (0..=1023).chain((0..=1023).map(|nr| nr | X32)) {
        let (a, linear_steps) = run(&linear, ARCH, nr, [0; 6]);
        let (b, tree_steps) = run(&tree, ARCH, nr, [0; 6]);
        assert_eq!(a, b, "nr {nr:#x}");
        let has_rules = (nr < 400 && nr % 6 >= 3) || nr == 450;
        if !has_rules {
            linear_worst = linear_worst.max(linear_steps);
            tree_worst = tree_worst.max(tree_steps);
        } else {
            for args in samples(nr) {
                let (a, b) = (run(&linear, ARCH, nr, args), run(&tree, ARCH, nr, args));
                assert_eq!(a.0, b.0, "nr {nr} args {args:x?}");
            }
        }
        assert_eq!(run(&linear, I386, nr, [0; 6]), (KILL, 3));
        assert_eq!(run(&tree, I386, nr, [0; 6]), (KILL, 3));
    }
    assert!(linear_worst > 500, "{linear_worst}");
    assert!(tree_worst < 20, "{tree_worst}");
}

#[test]
fn a_policy_without_syscalls_is_left_to_the_caller() {
    let linear = compile(vec![], SeccompAction::Errno(1));
    assert_eq!(tree_layout(&linear), Err(LayoutError::NoNumberLoad));
}

#[test]
fn programs_of_another_shape_are_refused() {
    let past_load = [
        jump(JEQ_K, 1, 2, 0),
        stmt(LD, 0),
        stmt(RET_K, ALLOW),
        stmt(RET_K, EPERM),
    ];
    assert_eq!(
        tree_layout(&past_load),
        Err(LayoutError::PrologueJumpsPastLoad { pc: 0 })
    );
    let range_check = [
        stmt(LD, 0),
        jump(0x25, 5, 0, 1), // jgt
        stmt(RET_K, ALLOW),
        stmt(RET_K, EPERM),
    ];
    assert_eq!(
        tree_layout(&range_check),
        Err(LayoutError::UnexpectedDispatch { pc: 1, code: 0x25 })
    );
    let out_of_bounds = [stmt(LD, 0), jump(JEQ_K, 1, 5, 0), stmt(RET_K, ALLOW)];
    assert_eq!(
        tree_layout(&out_of_bounds),
        Err(LayoutError::OutOfBounds { pc: 1 })
    );
    let falls_off = [
        stmt(LD, 0),
        jump(JEQ_K, 1, 1, 0),
        stmt(RET_K, ALLOW),
        stmt(LD, 16),
    ];
    assert_eq!(
        tree_layout(&falls_off),
        Err(LayoutError::OutOfBounds { pc: 3 })
    );
}

#[test]
fn a_tree_past_the_kernel_limit_is_refused() {
    let mut prog = vec![stmt(LD, 0)];
    for nr in 0..2000 {
        prog.extend([jump(JEQ_K, 2 * nr, 0, 1), stmt(RET_K, ALLOW)]);
    }
    prog.push(stmt(RET_K, EPERM));
    assert!(matches!(
        tree_layout(&prog),
        Err(LayoutError::TooLong { .. })
    ));
}
