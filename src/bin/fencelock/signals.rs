//! Signals: SIGHUP, SIGINT and SIGTERM to fencelock are caught rather than fatal, so that it can
//! end a wait cleanly (leaving Redis' queue) or pass them on to CMD and release the lock once CMD
//! has exited. The handler only sets a bit in an atomic; the main loop reads it.
//!
//! The only unsafe code of the tool is here: `sigaction`, `kill` and `prctl` through `libc`,
//! which std does not offer (std's `Child::kill` sends SIGKILL only, and std installs no
//! handlers), and `gethostname` for `elect`'s default value, kept beside them so that one file
//! holds every system call std lacks.

use std::io;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};

use libc::c_int;

/// The signals caught: a terminal hanging up, Ctrl-C, and the polite stop of `kill` and
/// service managers.
const CAUGHT: [c_int; 3] = [libc::SIGHUP, libc::SIGINT, libc::SIGTERM];

/// Bit `n`: signal `n` arrived, sent by a process. Bit `32 + n`: sent by the kernel, which is
/// how a terminal's Ctrl-C or hang-up comes (to the whole foreground process group, CMD
/// included). Signal numbers of `CAUGHT` are below 32.
static PENDING: AtomicU64 = AtomicU64::new(0);

/// A signal fencelock received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) number: c_int,
    /// Sent by the kernel (a terminal's Ctrl-C, a hang-up): it reached every process of the
    /// terminal's foreground process group, CMD included, so it is not passed on a second time.
    pub(crate) by_kernel: bool,
}

/// Installs the handler for the caught signals. Until then they keep their default action
/// (the end of fencelock), which is right before anything needs cleaning up.
pub(crate) fn install() -> io::Result<()> {
    for signal in CAUGHT {
        // SAFETY: `action` is zeroed (a valid `sigaction`: no flags, an empty mask) and then
        // filled in; `on_signal` has the three-argument signature SA_SIGINFO requires and does
        // nothing but an atomic read-modify-write, which is async-signal-safe. `sigaction` only
        // reads `action`, and we pass no pointer for the old action.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if installed != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_signal(signal: c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    let Ok(bit) = u32::try_from(signal) else {
        return;
    };
    if bit >= 32 {
        return;
    }
    let bit = if sent_by_kernel(info) { bit + 32 } else { bit };
    PENDING.fetch_or(1 << bit, Ordering::SeqCst);
}

/// Whether the kernel sent the signal (a terminal), rather than a process (`kill`). On Linux a
/// process's signal has `si_code <= 0` (`SI_USER`, `SI_QUEUE`, `SI_TKILL`), a terminal's has
/// `SI_KERNEL`. Elsewhere every signal counts as a process's, and is passed on.
#[cfg(target_os = "linux")]
fn sent_by_kernel(info: *const libc::siginfo_t) -> bool {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t for the handler's duration;
    // a null pointer is checked for all the same. Only a plain integer field is read.
    !info.is_null() && unsafe { (*info).si_code } > 0
}

#[cfg(not(target_os = "linux"))]
fn sent_by_kernel(_info: *const libc::siginfo_t) -> bool {
    false
}

/// The signals received since the last call, lowest number first.
pub(crate) fn take() -> Vec<Received> {
    let pending = PENDING.swap(0, Ordering::SeqCst);
    let mut received = Vec::new();
    for number in 1..32u32 {
        for by_kernel in [false, true] {
            let bit = if by_kernel { number + 32 } else { number };
            if pending & (1 << bit) != 0 {
                if let Ok(number) = c_int::try_from(number) {
                    received.push(Received { number, by_kernel });
                }
            }
        }
    }
    received
}

/// Sends `signal` to `child`, unless it has exited already. Returns whether it was sent.
pub(crate) fn send(child: &mut Child, signal: c_int) -> bool {
    // Once `try_wait` has reaped the child, its pid may name another process: never signal it
    // then. Before, the pid is still ours (a zombie at worst), so it names no one else.
    if !matches!(child.try_wait(), Ok(None)) {
        return false;
    }
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return false;
    };
    if pid <= 0 {
        // Never a process group, nor every process.
        return false;
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `pid` is positive (one
    // process) and belongs to our unreaped child.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Makes the kernel send CMD SIGTERM if fencelock dies first (killed with SIGKILL, say): it
/// would otherwise run on without the lock, whose lease then runs out.
///
/// The kernel sends it when the thread that spawned CMD exits; fencelock spawns CMD from its
/// main thread, which lives as long as the process.
#[cfg(target_os = "linux")]
pub(crate) fn terminate_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed. It makes one system call (prctl) and, on failure, builds an io::Error
    // from the errno, which allocates nothing. It touches no lock and no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn terminate_with_parent(_command: &mut Command) {}

/// The name of a signal, for messages.
pub(crate) fn name(signal: c_int) -> String {
    match signal {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

/// The machine's host name, for `elect`'s default value: `None` if it cannot be read or is not
/// UTF-8.
pub(crate) fn hostname() -> Option<String> {
    // Host names are at most 255 bytes (HOST_NAME_MAX is 64 on Linux); one more for the NUL.
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`, which we own and which
    // lives across the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // A name that fills the buffer may come without its NUL: it ends at the buffer's end.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end])
        .ok()
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}
