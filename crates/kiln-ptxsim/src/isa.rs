//! The PTX ISA's fragment layouts of `mma.m16n8k16` with floating-point types ("Matrix
//! Fragments for mma.m16n8k16 with floating point type"), written out from the ISA for
//! the tests: the simulator's `mma.sync` (`ptxsim_self.rs`) and the tensor-core
//! emitter's fragment maps (`cuda_mma.rs`) are each checked against them. Neither the
//! simulator nor the emitter reads them. `group = lane >> 2`, `tig = lane % 4`.

/// A (16×16): `(row, col)` of element `a_i` of lane `lane`, `i` in 0..8, two to a `.b32`
/// register (lower `i` in the low half).
pub fn a(lane: u32, i: u32) -> (u32, u32) {
    let (group, tig) = (lane >> 2, lane % 4);
    let row = if matches!(i, 0 | 1 | 4 | 5) { group } else { group + 8 };
    let col = if i < 4 { tig * 2 + (i & 1) } else { tig * 2 + (i & 1) + 8 };
    (row, col)
}

/// B (16×8): `(row = k, col = n)` of `b_i`, `i` in 0..4.
pub fn b(lane: u32, i: u32) -> (u32, u32) {
    let (group, tig) = (lane >> 2, lane % 4);
    let row = if i < 2 { tig * 2 + (i & 1) } else { tig * 2 + (i & 1) + 8 };
    (row, group)
}

/// C and D (16×8, f32): `(row, col)` of `c_i`, `i` in 0..4.
pub fn c(lane: u32, i: u32) -> (u32, u32) {
    let (group, tig) = (lane >> 2, lane % 4);
    let row = if i < 2 { group } else { group + 8 };
    (row, tig * 2 + (i & 1))
}

/// `wgmma.mma_async` m64nNk16 with an f32 D ("Register Fragments and Shared Memory
/// Matrix Layouts", the accumulator D figure): `(row, col)` of register `d_i` of thread
/// `x` (0..128) of the warpgroup. The warp `x / 32` holds rows `16·(x / 32) ..+16`;
/// within it, each group of 8 columns takes 4 registers laid out like `mma.m16n8`'s C.
pub fn wgmma_d(x: u32, i: u32) -> (u32, u32) {
    let (warp, lane) = (x / 32, x % 32);
    let (group, tig) = (lane >> 2, lane % 4);
    let row = 16 * warp + if i % 4 < 2 { group } else { group + 8 };
    (row, 8 * (i / 4) + tig * 2 + (i & 1))
}

/// The 128-byte swizzle ("Shared Memory Matrix Layout", 128B swizzling; TMA's
/// SWIZZLE_128B): in each 1024-byte repeating pattern of 8 rows of 128 bytes, the
/// 16-byte chunk `c` of row `r` holds what the unswizzled layout puts at chunk `c ⊕ r`:
/// shared-address bits 4–6 XOR bits 7–9 (the pattern starting on a 1024-byte boundary,
/// base offset 0).
pub fn swizzle128(addr: u32) -> u32 {
    addr ^ (((addr >> 7) & 7) << 4)
}

/// Unswizzled byte offset, from the descriptor's start address, of 16-bit element
/// `(mn, k)` (`k` < 16) of a K-major operand in the 128-byte swizzle mode: the atom is
/// 8 rows (`mn`) of 128 bytes (64 `k`), `k` contiguous; atoms along `mn` at the stride
/// byte offset `sbo`; the leading byte offset is not used.
pub fn sw128_k_major(mn: u32, k: u32, sbo: u32) -> u32 {
    (mn / 8) * sbo + (mn % 8) * 128 + 2 * k
}

/// Unswizzled byte offset of 16-bit element `(mn, k)` of an MN-major operand in the
/// 128-byte swizzle mode: the atom is 8 rows (`k`) of 128 bytes (64 `mn`), `mn`
/// contiguous; the next 8 `k` at the stride byte offset `sbo`, the next 64 `mn` at the
/// leading byte offset `lbo` ("stride from the first 8 rows to the next 8 rows", rows of
/// 128-bit elements).
pub fn sw128_mn_major(mn: u32, k: u32, lbo: u32, sbo: u32) -> u32 {
    (mn / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (mn % 64)
}
