//! A seccomp filter that refuses io_uring as the RuntimeDefault profiles of containerd and
//! Docker do: `io_uring_setup`, `io_uring_enter` and `io_uring_register` fail with EPERM;
//! every other call of the native architecture is allowed, and a call of another one (an
//! x86 binary's `int 0x80`, whose numbers mean other calls) kills the process.

use libc::{sock_filter, sock_fprog};

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;

const fn op(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The filter (a static: the kernel reads it through a pointer); a jump's `jt` counts the
/// instructions it skips.
static FILTER: [sock_filter; 9] = [
    op(LD_W_ABS, ARCH, 0, 0),
    op(JEQ_K, AUDIT_ARCH, 1, 0),
    op(RET_K, libc::SECCOMP_RET_KILL_PROCESS, 0, 0),
    op(LD_W_ABS, NR, 0, 0),
    op(JEQ_K, libc::SYS_io_uring_setup as u32, 3, 0),
    op(JEQ_K, libc::SYS_io_uring_enter as u32, 2, 0),
    op(JEQ_K, libc::SYS_io_uring_register as u32, 1, 0),
    op(RET_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    op(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32, 0, 0),
];

/// Installs the filter on the calling thread, inherited by the threads and processes it
/// creates later. Allocates nothing and calls only prctl: safe in `Command::pre_exec`.
pub fn refuse_io_uring() -> std::io::Result<()> {
    let prog = sock_fprog {
        len: FILTER.len() as u16,
        filter: FILTER.as_ptr() as *mut sock_filter,
    };
    // SAFETY: plain prctl calls; the kernel copies the filter program, which outlives them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
