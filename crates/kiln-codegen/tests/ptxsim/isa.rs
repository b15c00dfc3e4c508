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
