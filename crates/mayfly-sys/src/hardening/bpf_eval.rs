//! A classic-BPF evaluator for seccomp programs: what the kernel would
//! return for one syscall, and how many instructions it ran. Pure; used to
//! check a compiled or re-laid-out filter verdict for verdict.

use seccompiler::sock_filter;

/// `struct seccomp_data` as a filter sees it (the instruction pointer is
/// never loaded by Mayfly's filters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyscallData {
    pub nr: u32,
    pub arch: u32,
    pub args: [u64; 6],
}

/// Why a program could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("instruction {pc} ({code:#06x}) is not one seccomp filters here use")]
    Opcode { pc: usize, code: u16 },
    #[error("instruction {pc} loads from offset {offset}, outside the syscall's data")]
    Load { pc: usize, offset: u32 },
    #[error("the program runs past its end at instruction {pc}")]
    OutOfBounds { pc: usize },
}

/// Runs `prog` on `data`: the returned action and the instructions executed.
pub fn evaluate(prog: &[sock_filter], data: &SyscallData) -> Result<(u32, usize), EvalError> {
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
    loop {
        let ins = prog.get(pc).ok_or(EvalError::OutOfBounds { pc })?;
        let at = pc;
        pc += 1;
        steps += 1;
        let jump = |cond: bool| usize::from(if cond { ins.jt } else { ins.jf });
        match ins.code {
            0x20 => {
                acc = load(data, ins.k).ok_or(EvalError::Load {
                    pc: at,
                    offset: ins.k,
                })?
            }
            0x54 => acc &= ins.k,                 // ALU | AND | K
            0x05 => pc += ins.k as usize,         // JMP | JA
            0x15 => pc += jump(acc == ins.k),     // JMP | JEQ | K
            0x25 => pc += jump(acc > ins.k),      // JMP | JGT | K
            0x35 => pc += jump(acc >= ins.k),     // JMP | JGE | K
            0x45 => pc += jump(acc & ins.k != 0), // JMP | JSET | K
            0x06 => return Ok((ins.k, steps)),    // RET | K
            code => return Err(EvalError::Opcode { pc: at, code }),
        }
    }
}

/// `LD | W | ABS` from `struct seccomp_data`: nr at 0, arch at 4, the six
/// arguments from 16, each as low then high 32-bit word.
fn load(data: &SyscallData, offset: u32) -> Option<u32> {
    match offset {
        0 => Some(data.nr),
        4 => Some(data.arch),
        16..=63 if offset.is_multiple_of(4) => {
            let arg = data.args[(offset as usize - 16) / 8];
            Some(if offset.is_multiple_of(8) {
                arg as u32
            } else {
                (arg >> 32) as u32
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
        sock_filter { code, jt, jf, k }
    }

    #[test]
    fn a_program_is_run_as_the_kernel_runs_it() {
        // if nr == 1 && (arg0 high word & 1) { ret 7 } else { ret 9 }
        let prog = [
            ins(0x20, 0, 0, 0),
            ins(0x15, 0, 3, 1),
            ins(0x20, 0, 0, 20),
            ins(0x45, 0, 1, 1),
            ins(0x06, 0, 0, 7),
            ins(0x06, 0, 0, 9),
        ];
        let data = |nr, a0| SyscallData {
            nr,
            arch: 0,
            args: [a0, 0, 0, 0, 0, 0],
        };
        assert_eq!(evaluate(&prog, &data(1, 1 << 32)), Ok((7, 5)));
        assert_eq!(evaluate(&prog, &data(1, 1)), Ok((9, 5)));
        assert_eq!(evaluate(&prog, &data(2, 1 << 32)), Ok((9, 3)));
    }

    #[test]
    fn bad_programs_are_errors_not_panics() {
        let unknown = [ins(0x07, 0, 0, 0)];
        let data = SyscallData {
            nr: 0,
            arch: 0,
            args: [0; 6],
        };
        assert_eq!(
            evaluate(&unknown, &data),
            Err(EvalError::Opcode { pc: 0, code: 0x07 })
        );
        assert_eq!(
            evaluate(&[ins(0x20, 0, 0, 64)], &data),
            Err(EvalError::Load { pc: 0, offset: 64 })
        );
        assert_eq!(
            evaluate(&[ins(0x05, 0, 0, 5)], &data),
            Err(EvalError::OutOfBounds { pc: 6 })
        );
    }
}
