//! Float kernels run with the widest vector instructions the CPU has.
//!
//! The wheel is built for baseline x86-64 (SSE2: two f64 or four f32 lanes a
//! register) so that it loads on every machine. `pulp` asks the CPU once
//! what it has and runs the kernel compiled again for AVX2 (x86-64-v3) or
//! AVX-512 (v4) where it can, all of it safe code here. Only the width of
//! the registers changes: every sum keeps its lanes and its order, and Rust
//! never fuses `a * b + c` into one rounding, so each result is bit for bit
//! the baseline's on every machine.

/// `kernel()`, compiled for the widest instructions this CPU has. The
/// closure must be marked `#[inline(always)]` (and what it calls inlined
/// too), or its body stays baseline code behind a wider door.
#[inline(always)]
pub(crate) fn widest<R>(kernel: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(kernel)
}
