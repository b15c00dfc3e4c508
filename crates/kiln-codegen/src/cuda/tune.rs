//! A measurement knob: kernel variants of the contraction emitters chosen at compile
//! time by the environment variable [`VAR`] (`KILN_CUDA_TUNE`), so that one GPU session
//! can time several variants of the same model (`scripts/cuda-tune-sweep.sh`).
//!
//! Only the CUDA code generator reads it ([`compile`](super::compile), once per
//! module), never the runtime: the variant is in the artifact's PTX and launch records
//! like any other kernel. Unset or empty, every kernel is today's default choice; the
//! defaults change only after a variant measured faster.
//!
//! The value is a comma-separated list of `key=variant`:
//! - `f32=BMxBN` or `f32=BMxBNsS`: every f32 SIMT contraction ([`super::contraction`])
//!   whose row operand is read along `k` (the plain `[M, K] × [K, N]` layout; a
//!   transposed one keeps its choice: an 8×8 thread tile of it spills a few bytes under
//!   `.minnctapersm 2`) takes the tile `BM × BN` (`BM, BN ∈ {64, 128}`) and a split-K
//!   over clusters of `S ∈ {1, 2, 4, 8}` blocks (default 1) instead of
//!   [`choose_tile`](super::contraction::choose_tile) /
//!   [`choose_split`](super::contraction::choose_split). Few-row products (`skinny`)
//!   and tensor-core products are unaffected.
//! - `mma=bkKsS` or `mma=bkKsSbB`: the tensor-core kernel ([`super::mma`]) steps `K`
//!   by `K ∈ {32, 64}` per stage with `S ∈ {2, 3, 4}` stages (dynamic shared memory
//!   above 48 KiB), and asks ptxas for `B ∈ {1, 2}` resident blocks per
//!   multiprocessor (`.minnctapersm`; `b1`: no directive, today's; `b2` with `bk32`
//!   only: at a step of 64 ptxas takes ~170 registers and spills when held to 128).
//!   A suffix `tBMxBN` takes that block tile for every product instead of
//!   [`choose_tile`](super::contraction::choose_tile)'s (no split-K): `t128x128`
//!   (what large products take anyway: the sweep's check model takes it so that it
//!   checks the kernel the large product runs), or `t128x256` / `t256x128`, with 8
//!   warps of 64×64 ([`super::mma::warps`]) instead of 64×32 (one block a
//!   multiprocessor: 128 accumulators a thread). A suffix `w4` runs a 128×128 tile
//!   with 4 warps of 64×64 (128 threads, ~220 registers: two blocks a multiprocessor).
//!   A suffix `v2` stores the epilogue's pairs of consecutive columns with one
//!   `st.global.v2.f32` (an f32 output with an even innermost extent; else one
//!   element at a time). A value names the whole pipeline: what it leaves out is off
//!   (`mma=bk32s3` is eight warps, single stores), whereas the default, no `mma=`
//!   key, is `bk32s4` with `w4` where it applies and `v2` ([`Mma::default`]).
//!   `bk64`, `b2` and `t` apply where both operands are copied by `cp.async` (a
//!   register-staged operand keeps 32, where 64 would stage twice the registers, and
//!   one block, its addresses needing more than 128 registers); the note says what ran.
//!
//! - `wgmma=off`: half contractions skip the warpgroup kernel ([`super::wgmma`]) and
//!   take `mma.sync` with the `mma` variant (`on`, the default: wgmma where it applies).
//! - `attn=`: whether attention chains form one attention kernel on CUDA and which
//!   kernel runs it. Unset (the default): formed where the program stores half
//!   (`--precision f16|bf16`), run on the tensor cores ([`super::flash`]: the kernel
//!   reads the half Q, K and V the storage-precision pass gives it and writes a half
//!   result; the warp-per-row kernel where it declines the head), and not formed at
//!   f32 (three kernels: the score product, the softmax, the second product).
//!   `attn=off`: never formed. `attn=on`: formed, the warp-per-row kernel
//!   ([`super::attention`]: f32 arithmetic on whatever it loads). `attn=flash`:
//!   formed, on the tensor cores even at f32 precision (where the kernel rounds Q, K,
//!   V and the probabilities to f16). The compiler reads whether to form the kernel
//!   when it forms dispatches ([`Tune::forms_attention`]), the code generator which
//!   kernel to write ([`Tune::attention`]).
//! - `occ=1` or `occ=2`: the f32 SIMT kernel asks ptxas for that many resident blocks
//!   per multiprocessor (`.minnctapersm 2` holds it to 128 registers a thread; `1`
//!   writes no directive) instead of the emitter's rule.
//! - `elt=PART+PART…`: the Elementwise/Movement kernels' 128-bit groups
//!   ([`super::elementwise`]): `cs` loads and stores the vector groups with the
//!   streaming cache hint (`ld.global.cs`, `st.global.cs`: data touched once, evicted
//!   first) and `ca` with the default one, instead of the emitter's rule (streaming
//!   where the kernel moves more bytes than [`super::L2_BYTES`]), `gN` caps the grid at `N` blocks (N from 132 to 65536; the grid-stride loop
//!   does the rest) instead of one group a thread up to [`super::MAX_GRID`]. `elt=` alone
//!   is the default.
//!
//! Every variant computes the same values by the same code paths as the default (the
//! suites run them in the simulator against the kernel interpreter); only the speed
//! differs. A malformed value is a typed error, never ignored.

use super::contraction::Tile;

/// The environment variable.
pub const VAR: &str = "KILN_CUDA_TUNE";

/// The f32 SIMT kernel's forced tile and split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct F32 {
    /// The block tile.
    pub tile: Tile,
    /// Blocks of a split-K cluster (1: none).
    pub split: u32,
}

/// The tensor-core kernel's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mma {
    /// `k` per stage (32 or 64).
    pub bk: u32,
    /// Shared-memory stages (2–4).
    pub stages: u32,
    /// Resident blocks per multiprocessor asked of ptxas (1: no directive).
    pub min_blocks: u32,
    /// Four warps of 64×64 (128 threads) where the tile is 128×128.
    pub warps4: bool,
    /// The epilogue stores pairs of columns (`st.global.v2.f32`, an f32 output).
    pub pairs: bool,
    /// A block tile `(BM, BN)`: 128×128 (warps of 64×32, as the default's), 128×256 or
    /// 256×128 (warps of 64×64), else [`choose_tile`](super::contraction::choose_tile)'s.
    pub tile: Option<(u32, u32)>,
}

impl Default for Mma {
    /// The default pipeline, the fastest of the sweep (docs/cuda.md, "Kernel variants"):
    /// 32 `k` per stage, 4 stages (3 where an operand is register-staged, which was
    /// not measured at 4), four warps of 64×64 where the tile is 128×128 and both
    /// operands take `cp.async`, and pairs of columns stored together. `mma=bk32s3` is
    /// the kernel before that sweep (eight warps, 3 stages, single stores).
    fn default() -> Mma {
        Mma { bk: 32, stages: 4, min_blocks: 1, warps4: true, pairs: true, tile: None }
    }
}

/// The variants of one compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tune {
    /// The f32 kernel's tile and split (`None`: chosen per kernel).
    pub f32: Option<F32>,
    /// The tensor-core kernel's pipeline.
    pub mma: Mma,
    /// Whether half contractions may take the warpgroup kernel ([`super::wgmma`]);
    /// `wgmma=off` times `mma.sync` on the products wgmma would take.
    pub wgmma: bool,
    /// The elementwise kernels' variant.
    pub elt: Elt,
    /// The attention kernel asked for (`attn=`; `None`: the default, see the module
    /// docs and [`Tune::forms_attention`]).
    pub attention: Option<Attn>,
    /// Resident blocks per multiprocessor asked of ptxas for the f32 SIMT kernel
    /// (`occ=1|2`; `None`: the emitter's rule, [`super::contraction`]).
    pub f32_occupancy: Option<u32>,
    /// The GPU architecture the module is written for: set by the compiler from
    /// `kiln compile --cuda-arch`, never by [`VAR`].
    pub arch: Arch,
}

/// The GPU architecture a module's PTX is written for (`kiln compile --cuda-arch`).
/// Every kernel computes the same values on either; what differs is which
/// instructions the emitters may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arch {
    /// Hopper, `sm_90a` (the default): `wgmma`, thread-block clusters (split-K summed
    /// through distributed shared memory).
    #[default]
    Sm90a,
    /// Ampere and every later GPU, `sm_80`: `mma.sync` and `cp.async`, no clusters (a
    /// contraction's `K` is not split over blocks) and no `wgmma`.
    Sm80,
}

impl Arch {
    /// The module header: PTX ISA 8.0 and the `.target`.
    pub fn header(self) -> &'static str {
        match self {
            Arch::Sm90a => super::ptx::HEADER,
            Arch::Sm80 => super::ptx::HEADER_SM80,
        }
    }

    /// Whether kernels may use thread-block clusters.
    pub fn clusters(self) -> bool {
        self == Arch::Sm90a
    }

    /// Whether half contractions may take the warpgroup kernel.
    pub fn wgmma(self) -> bool {
        self == Arch::Sm90a
    }

    /// Its name, as `ptxas -arch` and `--cuda-arch` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm80 => "sm_80",
        }
    }

    /// The architecture `name` spells (`sm_90a`, `sm_80`), or why not.
    pub fn parse(name: &str) -> Result<Arch, String> {
        match name.trim() {
            "sm_90a" => Ok(Arch::Sm90a),
            "sm_80" => Ok(Arch::Sm80),
            other => Err(format!("CUDA architecture {other:?}: sm_90a or sm_80")),
        }
    }
}

/// The attention kernel `attn=` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attn {
    /// `off`: attention chains stay three kernels.
    Off,
    /// `on`: one kernel, a warp per query row ([`super::attention`]).
    Warp,
    /// `flash`: one kernel on the tensor cores ([`super::flash`]).
    Flash,
}

impl Tune {
    /// Whether attention chains form one kernel in a program of storage precision
    /// `half` (`--precision f16|bf16`) or f32: as `attn=` says, else only at half
    /// precision, where the tensor-core kernel reads the half operands the
    /// storage-precision pass gives it (measured faster there, docs/cuda.md; at f32 it
    /// would round the operands, and the warp kernel is slower than three kernels).
    pub fn forms_attention(&self, half: bool) -> bool {
        match self.attention {
            Some(a) => a != Attn::Off,
            None => half,
        }
    }
}

/// The Elementwise/Movement kernels' variant (`elt=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Elt {
    /// Vector groups loaded and stored with the streaming cache hint (`cs`: `Some(true)`)
    /// or the default one (`ca`: `Some(false)`); `None`: the emitter's rule (streaming
    /// where the kernel moves more bytes than the L2 cache holds).
    pub streaming: Option<bool>,
    /// Most blocks of the grid (`None`: [`super::MAX_GRID`]).
    pub max_grid: Option<u64>,
}

impl Default for Tune {
    fn default() -> Tune {
        Tune {
            f32: None,
            mma: Mma::default(),
            wgmma: true,
            elt: Elt::default(),
            attention: None,
            f32_occupancy: None,
            arch: Arch::Sm90a,
        }
    }
}

fn num(s: &str, what: &str, allowed: &[u32]) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|_| format!("{what} {s:?} is not a number"))?;
    if allowed.contains(&v) {
        Ok(v)
    } else {
        Err(format!("{what} {v} is not one of {allowed:?}"))
    }
}

impl Tune {
    /// Parses a value of [`VAR`] (see the module docs).
    pub fn parse(s: &str) -> Result<Tune, String> {
        let mut t = Tune::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, v) = item.split_once('=').ok_or_else(|| format!("{item:?}: expected key=variant"))?;
            match key.trim() {
                "f32" => {
                    let (tile, split) = match v.split_once('s') {
                        Some((tile, s)) => (tile, num(s, "split", &[1, 2, 4, 8])?),
                        None => (v, 1),
                    };
                    let (bm, bn) = tile.split_once('x').ok_or_else(|| format!("f32 tile {tile:?}: expected BMxBN"))?;
                    let bm = num(bm, "tile rows", &[64, 128])?;
                    let bn = num(bn, "tile columns", &[64, 128])?;
                    t.f32 = Some(F32 { tile: Tile { tm: bm / 16, tn: bn / 16 }, split });
                }
                "mma" => {
                    let form = || format!("mma {v:?}: expected bkKsS[bB][tBMxBN][w4][v2]");
                    let rest = v.strip_prefix("bk").ok_or_else(form)?;
                    let (rest, pairs) = match rest.strip_suffix("v2") {
                        Some(r) => (r, true),
                        None => (rest, false),
                    };
                    let (rest, warps4) = match rest.strip_suffix("w4") {
                        Some(r) => (r, true),
                        None => (rest, false),
                    };
                    let (rest, tile) = match rest.split_once('t') {
                        Some((r, t)) => {
                            let (bm, bn) = t.split_once('x').ok_or_else(form)?;
                            let tile = (num(bm, "tile rows", &[128, 256])?, num(bn, "tile columns", &[128, 256])?);
                            if tile == (256, 256) {
                                return Err(format!("mma tile {t:?}: 128x128, 128x256 or 256x128"));
                            }
                            (r, Some(tile))
                        }
                        None => (rest, None),
                    };
                    let (bk, rest) = rest.split_once('s').ok_or_else(form)?;
                    let (stages, blocks) = match rest.split_once('b') {
                        Some((s, b)) => (s, num(b, "blocks per multiprocessor", &[1, 2])?),
                        None => (rest, 1),
                    };
                    t.mma = Mma {
                        bk: num(bk, "k step", &[32, 64])?,
                        stages: num(stages, "stages", &[2, 3, 4])?,
                        min_blocks: blocks,
                        warps4,
                        pairs,
                        tile,
                    };
                    if warps4 && (blocks > 1 || tile.is_some_and(|t| t != (128, 128))) {
                        return Err(format!("mma {v:?}: four warps take a 128x128 tile and one block directive"));
                    }
                    if blocks > 1 && (t.mma.bk == 64 || tile.is_some_and(|(m, n)| m.max(n) > 128)) {
                        // ptxas needs ~170 registers at a step of 64 (over 200 with a large
                        // tile's 128 accumulators): held to 128, it spills.
                        return Err(format!("mma {v:?}: two blocks per multiprocessor only with bk32 and 128x128"));
                    }
                }
                "wgmma" => {
                    t.wgmma = match v.trim() {
                        "on" => true,
                        "off" => false,
                        _ => return Err(format!("wgmma {v:?}: on or off")),
                    }
                }
                "elt" => {
                    for part in v.split('+').map(str::trim).filter(|x| !x.is_empty()) {
                        if part == "cs" || part == "ca" {
                            t.elt.streaming = Some(part == "cs");
                        } else if let Some(n) = part.strip_prefix('g') {
                            let n: u64 = n.parse().map_err(|_| format!("elt grid {n:?} is not a number"))?;
                            if !(132..=65536).contains(&n) {
                                return Err(format!("elt grid {n}: from 132 to 65536 blocks"));
                            }
                            t.elt.max_grid = Some(n);
                        } else {
                            return Err(format!("elt {part:?}: cs, ca or gN"));
                        }
                    }
                }
                "attn" => {
                    t.attention = match v.trim() {
                        "on" => Some(Attn::Warp),
                        "flash" => Some(Attn::Flash),
                        "off" => Some(Attn::Off),
                        _ => return Err(format!("attn {v:?}: on, flash or off")),
                    }
                }
                "occ" => t.f32_occupancy = Some(num(v, "f32 blocks per multiprocessor", &[1, 2])?),
                other => return Err(format!("unknown key {other:?} (f32, occ, mma, wgmma, elt, attn)")),
            }
        }
        Ok(t)
    }

    /// The variants [`VAR`] asks for (the default where it is unset).
    pub fn from_env() -> Result<Tune, String> {
        match std::env::var(VAR) {
            Ok(v) => Tune::parse(&v).map_err(|e| format!("{VAR}={v}: {e}")),
            Err(std::env::VarError::NotPresent) => Ok(Tune::default()),
            Err(e) => Err(format!("{VAR}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_variants_and_refuses_the_rest() {
        assert!(!Tune::parse("wgmma=off").unwrap().wgmma);
        assert!(Tune::parse("").unwrap().wgmma);
        assert_eq!(Tune::parse("").unwrap(), Tune::default());
        let t = Tune::parse("f32=128x64s2, mma=bk32s4b2").unwrap();
        assert_eq!(t.f32, Some(F32 { tile: Tile { tm: 8, tn: 4 }, split: 2 }));
        let m = |bk, stages, min_blocks, warps4, tile| Mma { bk, stages, min_blocks, warps4, pairs: false, tile };
        assert_eq!(t.mma, m(32, 4, 2, false, None));
        assert_eq!(Tune::parse("mma=bk64s3").unwrap().mma, m(64, 3, 1, false, None));
        assert_eq!(Tune::parse("mma=bk64s3t128x256").unwrap().mma, m(64, 3, 1, false, Some((128, 256))));
        assert_eq!(Tune::parse("mma=bk32s4t128x128w4").unwrap().mma, m(32, 4, 1, true, Some((128, 128))));
        let v2 = Tune::parse("mma=bk32s4t128x128w4v2").unwrap().mma;
        assert_eq!(v2, Mma { pairs: true, ..m(32, 4, 1, true, Some((128, 128))) });
        assert_eq!(Tune::parse("f32=64x128").unwrap().f32, Some(F32 { tile: Tile { tm: 4, tn: 8 }, split: 1 }));
        assert_eq!(Tune::parse("elt=cs+g1056").unwrap().elt, Elt { streaming: Some(true), max_grid: Some(1056) });
        assert_eq!(Tune::parse("elt=ca").unwrap().elt.streaming, Some(false));
        assert_eq!(Tune::parse("elt=").unwrap(), Tune::default());
        assert_eq!(Tune::parse("occ=1").unwrap().f32_occupancy, Some(1));
        assert_eq!(Tune::parse("attn=on").unwrap().attention, Some(Attn::Warp));
        assert_eq!(Tune::parse("attn=flash").unwrap().attention, Some(Attn::Flash));
        assert_eq!(Tune::parse("attn=off").unwrap().attention, Some(Attn::Off));
        assert_eq!(Tune::default().attention, None);
        // Formed by default at half precision only; the knob decides either way.
        assert!(Tune::default().forms_attention(true) && !Tune::default().forms_attention(false));
        for (v, formed) in [("on", true), ("flash", true), ("off", false)] {
            let t = Tune::parse(&format!("attn={v}")).unwrap();
            assert!(t.forms_attention(true) == formed && t.forms_attention(false) == formed, "{v}");
        }
        assert!(Tune::parse("attn=fast").is_err());
        for bad in [
            "f32=128x96",
            "f32=128x64s3",
            "mma=bk48s3",
            "mma=bk64s5",
            "mma=bk32s3b3",
            "mma=bk64s3b2",
            "mma=bk32s3t256x256",
            "mma=bk32s3b2t256x128",
            "mma=bk32s3t128x256w4",
            "x=1",
            "elt=g10",
            "elt=nc",
            "f32",
            "wgmma=no",
        ] {
            assert!(Tune::parse(bad).is_err(), "{bad}");
        }
    }
}
