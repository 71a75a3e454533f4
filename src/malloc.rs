//! The C allocator's settings for a process that moves frames of megabytes: keep freed large
//! blocks for reuse instead of handing them back to the kernel after every call.
//!
//! glibc serves a block over its mmap threshold (128 KiB at first, raised by the blocks that
//! are freed) with a mapping of its own, and gives the top of a heap back to the kernel past
//! its trim threshold. A screenshot's answer makes several buffers of one or two MiB (the PNG,
//! its binary message, the sealed copy for the recording) on whichever worker thread runs the
//! call, and each came as fresh memory: a page fault for every 4 KiB written, which inside a
//! virtual machine costs more than the copying itself. With a fixed threshold of 32 MiB (the
//! most glibc takes) and a trim threshold of 128 MiB, those buffers are reused across calls:
//! `computer_observe`'s time over the raw capture fell from +3.8–7.2 ms to +2.6–2.9 ms p50
//! (BENCHMARKS.md, "Tool-call overhead"). The price is memory a thread's arena keeps after a
//! burst, bounded by its own peak.
//!
//! Other C libraries (musl) have no such settings: there [`tune`] does nothing.

/// Largest block glibc allocates inside its heaps (32 MiB, its own upper bound).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at a heap's top that glibc keeps before giving it back.
pub const TRIM_THRESHOLD: usize = 128 << 20;

/// Applies the settings; call it first thing in `main`, before any thread starts. Answers
/// whether the C library took them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    let as_int = |v: usize| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` only changes the allocator's parameters under its own lock; it has no
    // pointer arguments and no preconditions on the caller.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(MMAP_THRESHOLD)) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, as_int(TRIM_THRESHOLD)) == 1
    }
}

/// Applies the settings; call it first thing in `main`, before any thread starts. Answers
/// whether the C library took them.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_settings() {
        assert!(super::tune());
    }
}
