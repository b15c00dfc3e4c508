//! Shared by the runtime's integration tests: hand-assembled x86-64 kernels, programs
//! that use them, and a minimal mmap code loader so the driver can be tested on its own.
#![allow(dead_code)]

use kiln_module::abi::{Helper, HelperFn, HELPER_COUNT};
use kiln_module::program::*;
use kiln_runtime::{CodeLoader, KernelFn, LoadError, LoadedImage};

mod pieces;
pub use pieces::*;

/// `y[0..4] = x[0..4]`: binding 0 → binding 1, four bytes.
pub const COPY4: &[u8] = &[
    0x48, 0x8b, 0x07, //       mov rax, [rdi]       ; binding 0
    0x48, 0x8b, 0x4f, 0x08, // mov rcx, [rdi+8]     ; binding 1
    0x8b, 0x00, //             mov eax, [rax]
    0x89, 0x01, //             mov [rcx], eax
    0xc3, //                   ret
];

/// `y[0] = exp(x[0])` (f32) through the helper table.
pub fn exp_f32() -> Vec<u8> {
    vec![
        0x53, //                   push rbx             ; keeps rsp 16-aligned at the call
        0x48,
        0x8b,
        0x5f,
        0x08, // mov rbx, [rdi+8]     ; y (callee-saved across the call)
        0x48,
        0x8b,
        0x07, //       mov rax, [rdi]       ; x
        0xf3,
        0x0f,
        0x10,
        0x00, // movss xmm0, [rax]
        0xff,
        0x56,
        Helper::ExpF32 as u8 * 8, // call [rsi + 8·ExpF32]
        0xf3,
        0x0f,
        0x11,
        0x03, // movss [rbx], xmm0
        0x5b, //                   pop rbx
        0xc3, //                   ret
    ]
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// One executable holding COPY4 at 0, ADD_F32 at 16 and exp at 64; kernels `copy4`,
/// `add`, `exp` in that order.
pub fn executable() -> (Executable, Vec<Kernel>) {
    let mut code = vec![0xccu8; 96];
    code[..COPY4.len()].copy_from_slice(COPY4);
    code[16..16 + ADD_F32.len()].copy_from_slice(ADD_F32);
    let e = exp_f32();
    code[64..64 + e.len()].copy_from_slice(&e);
    let x = Executable {
        device: DeviceKind::Cpu,
        features: CpuFeature::Sse2.bit(),
        code,
        entries: vec![("copy4".into(), 0), ("add".into(), 16), ("exp".into(), 64)],
        relocs: vec![],
        launches: vec![],
    };
    let k = |name: &str, entry| Kernel { name: name.into(), variants: vec![Variant::cpu(0, entry, 0)], class: None };
    (x, vec![k("copy4", 0), k("add", 1), k("exp", 2)])
}

/// A CPU program of [`executable`]'s kernels with one entry `main(a: f32[n], b: f32[n])`
/// of these outputs, arena size, plan and buffers (64-byte arena alignment, no
/// extents), embedded (empty) constants and no debug section.
fn main_of_a_b(
    n: u64,
    outputs: Vec<TensorDesc>,
    arena_size: u64,
    commands: Vec<Command>,
    buffers: Vec<BufferDesc>,
) -> Program {
    let (x, kernels) = executable();
    let bytes = 4 * n;
    Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![entry(
            "main",
            vec![tensor("a", 1, &[n], bytes), tensor("b", 1, &[n], bytes)],
            outputs,
            (arena_size, 64),
            commands,
            buffers,
        )],
        kernels,
        executables: vec![x],
        constants: Constants::Embedded(vec![]),
        debug: None,
    }
}

/// `main(a: f32[n], b: f32[n]) -> (y: f32[n])`: y = a + b, computed into the arena and
/// copied out, with a fill before the dispatch that the dispatch overwrites.
pub fn add_program(n: u64) -> Program {
    let bytes = 4 * n;
    let commands = vec![
        Command::Fill { dst: b(Slot::Arena, 64, bytes), pattern: 0x7fc0_0000, pattern_len: 4 },
        dispatch(1, n, vec![b(Slot::Input(0), 0, bytes), b(Slot::Input(1), 0, bytes), b(Slot::Arena, 64, bytes)]),
        Command::Barrier,
        Command::Copy { src: b(Slot::Arena, 64, bytes), dst: b(Slot::Output(0), 0, bytes) },
    ];
    let buffers = vec![BufferDesc { name: "sum".into(), binding: b(Slot::Arena, 64, bytes), first: 1, last: 3 }];
    let mut p = main_of_a_b(n, vec![tensor("y", 1, &[n], bytes)], bytes + 64, commands, buffers);
    p.debug = Some(DebugInfo {
        kernel_sources: vec!["Identity".into(), "Add".into(), "Exp".into()],
        source: "t.onnx".into(),
    });
    p
}

/// [`add_program`] whose output `y` is sized by a data-dependent extent (format 1.5):
/// a fill writes `extent` as an `i64` at arena bytes 0..8, and the plan lists it with
/// bound `n` for axis 0 of output 0.
pub fn extent_program(n: u64, extent: i64) -> Program {
    let mut p = add_program(n);
    let e = &mut p.entries[0];
    e.commands.insert(0, Command::Fill { dst: b(Slot::Arena, 0, 8), pattern: extent as u64, pattern_len: 8 });
    e.extents = vec![ExtentDesc { name: "y".into(), binding: b(Slot::Arena, 0, 8), bound: n, outputs: vec![(0, 0)] }];
    p
}

/// [`add_program`] with its dispatch behind a `SkipIf` on the first 4 bytes of input
/// `a`: when any is nonzero the add is skipped and `y` is the fill (f32 NaN); when `a`
/// starts with `0.0`, `y = a + b`.
pub fn skip_program(n: u64) -> Program {
    let mut p = add_program(n);
    let cond = b(Slot::Input(0), 0, 4);
    p.entries[0].commands.insert(1, Command::SkipIf { cond, value: true, count: 1 });
    p
}

/// `main() -> (y: u8[16])`: copies the constant word 0xdeadbeef into the arena with
/// COPY4, fills y[4..16] with patterns, copies the word to y[0..4]; and a second entry
/// `exp(x: f32[1]) -> (y: f32[1])` through the helper table. Constants are `constants`
/// (embedded) or the same bytes kept in an external file.
pub fn misc_program(external: bool) -> (Program, Vec<u8>) {
    let (x, kernels) = executable();
    let pool: Vec<u8> = [0xefu8, 0xbe, 0xad, 0xde].into_iter().chain([0u8; 60]).collect();
    let constants = if external {
        Constants::External {
            file: "misc.weights".into(),
            size: pool.len() as u64,
            hash: kiln_module::sections::weights_hash(&pool),
        }
    } else {
        Constants::Embedded(pool.clone())
    };
    let p = Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![
            entry(
                "main",
                vec![],
                vec![tensor("y", 2, &[16], 16)],
                (8, 8),
                vec![
                    dispatch(0, 1, vec![b(Slot::Constants, 0, 4), b(Slot::Arena, 4, 4)]),
                    Command::Fill { dst: b(Slot::Output(0), 4, 3), pattern: 0xaa, pattern_len: 1 },
                    Command::Fill { dst: b(Slot::Output(0), 7, 5), pattern: 0x1122, pattern_len: 2 },
                    Command::Fill { dst: b(Slot::Output(0), 12, 4), pattern: 0x0102_0304_0506_0708, pattern_len: 8 },
                    Command::Barrier,
                    Command::Copy { src: b(Slot::Arena, 4, 4), dst: b(Slot::Output(0), 0, 4) },
                ],
                vec![],
            ),
            entry(
                "exp",
                vec![tensor("x", 1, &[1], 4)],
                vec![tensor("y", 1, &[1], 4)],
                (0, 1),
                vec![dispatch(2, 1, vec![b(Slot::Input(0), 0, 4), b(Slot::Output(0), 0, 4)])],
                vec![],
            ),
        ],
        kernels,
        executables: vec![x],
        constants,
        debug: None,
    };
    (p, pool)
}

/// `misc_program` with its constants embedded, written as a `.kiln` file.
pub fn misc_file() -> Vec<u8> {
    kiln_module::sections::write_program(&misc_program(false).0)
}

/// The expected output of `misc_program`'s main, worked out by hand: the word
/// 0xdeadbeef little-endian, three 0xaa, the pattern 22 11 repeated over five bytes
/// (cut after the first byte of the third copy), then 08 07 06 05 (the low four bytes
/// of the 8-byte pattern, little-endian).
pub const MISC_EXPECTED: [u8; 16] =
    [0xef, 0xbe, 0xad, 0xde, 0xaa, 0xaa, 0xaa, 0x22, 0x11, 0x22, 0x11, 0x22, 8, 7, 6, 5];

/// Runs `misc_program`'s two entry points on `inst`: `main` must give
/// [`MISC_EXPECTED`], and `exp` at `x` what `f32::exp` gives (within 1e-6).
pub fn check_misc_entries(inst: &mut kiln_runtime::Instance<'_>, x: f32) {
    let mut y = [0u8; 16];
    inst.invoke(&[], &mut [&mut y[..]]).expect("main");
    assert_eq!(y, MISC_EXPECTED);
    let mut e = [0u8; 4];
    inst.invoke_entry(1, &[&x.to_le_bytes()], &mut [&mut e[..]]).expect("exp");
    let got = f32::from_le_bytes(e);
    assert!((got - x.exp()).abs() < 1e-6, "exp({x}) = {got}");
}

/// Two kernels reading a constant from their own read-only data, one through a
/// PC-relative and one through an absolute relocation; `y[0] = c`.
pub fn reloc_program() -> Program {
    let mut code = vec![
        // kernel "pcrel" at 0
        0x48, 0x8b, 0x07, //                          0: mov rax, [rdi]          ; y
        0xf3, 0x0f, 0x10, 0x05, 0, 0, 0, 0, //        3: movss xmm0, [rip+disp32] ; disp32 at 7, rip = 11
        0xf3, 0x0f, 0x11, 0x00, //                   11: movss [rax], xmm0
        0xc3, //                                     15: ret
        // kernel "abs" at 16
        0x48, 0x8b, 0x0f, //                         16: mov rcx, [rdi]          ; y
        0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, //       19: mov rax, imm64          ; imm64 at 21
        0xf3, 0x0f, 0x10, 0x00, //                   29: movss xmm0, [rax]
        0xf3, 0x0f, 0x11, 0x01, //                   33: movss [rcx], xmm0
        0xc3, //                                     37: ret
        0xcc, 0xcc, //                               38: padding
    ];
    code.extend(42.5f32.to_le_bytes()); // 40: constant for "pcrel"
    code.extend((-7.25f32).to_le_bytes()); // 44: constant for "abs"
    let x = Executable {
        device: DeviceKind::Cpu,
        features: 0,
        code,
        entries: vec![("pcrel".into(), 0), ("abs".into(), 16)],
        relocs: vec![
            // disp32 = S + A - P = 40 - 4 - 7 = 29 = 40 - 11.
            Reloc { offset: 7, kind: RelocKind::Pc32, target: 40, addend: -4 },
            Reloc { offset: 21, kind: RelocKind::Abs64, target: 44, addend: 0 },
        ],
        launches: vec![],
    };
    let one = |name: &str, kernel| {
        entry(
            name,
            vec![],
            vec![tensor("y", 1, &[1], 4)],
            (0, 1),
            vec![dispatch(kernel, 1, vec![b(Slot::Output(0), 0, 4)])],
            vec![],
        )
    };
    let k = |name: &str, entry| Kernel { name: name.into(), variants: vec![Variant::cpu(0, entry, 0)], class: None };
    Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![one("main", 0), one("abs", 1)],
        kernels: vec![k("pcrel", 0), k("abs", 1)],
        executables: vec![x],
        constants: Constants::Embedded(vec![]),
        debug: None,
    }
}

/// Bytes at a 64-byte-aligned address (and the buffer that holds them).
pub struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    pub fn new(bytes: &[u8], misalign: usize) -> Aligned {
        let mut buf = vec![0u8; bytes.len() + 128];
        let start = buf.as_ptr().align_offset(64) + misalign;
        buf[start..start + bytes.len()].copy_from_slice(bytes);
        Aligned { buf, start, len: bytes.len() }
    }
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

/// A code loader for tests: mmap, copy, relocate, mprotect to read+execute.
pub struct MmapLoader;

struct Image {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is read-execute after `load` and never written again.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `load`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl LoadedImage for Image {
    fn entry(&self, offset: u64) -> Result<KernelFn, LoadError> {
        // SAFETY: offset is inside the mapped code (checked by the verifier).
        Ok(unsafe { std::mem::transmute::<*mut u8, KernelFn>(self.ptr.add(offset as usize)) })
    }
}

impl CodeLoader for MmapLoader {
    fn helpers(&self) -> &'static [HelperFn; HELPER_COUNT] {
        &kiln_runtime::cpu::helpers::HELPERS
    }

    fn load(&self, code: &[u8], relocs: &[Reloc]) -> Result<Box<dyn LoadedImage>, LoadError> {
        let len = code.len().max(1).div_ceil(4096) * 4096;
        // SAFETY: a fresh private anonymous mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(LoadError::Embedder("mmap failed".into()));
        }
        let ptr = ptr.cast::<u8>();
        // SAFETY: the mapping is `len` ≥ code.len() writable bytes.
        let mem = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        mem[..code.len()].copy_from_slice(code);
        let base = ptr as u64;
        for r in relocs {
            let o = r.offset as usize;
            let s = (base + r.target).wrapping_add(r.addend as u64);
            match r.kind {
                RelocKind::Abs64 => mem[o..o + 8].copy_from_slice(&s.to_le_bytes()),
                RelocKind::Pc32 => {
                    mem[o..o + 4].copy_from_slice(&(s.wrapping_sub(base + r.offset) as u32).to_le_bytes())
                }
                // x86-64 code only: the artifacts these tests load are this machine's.
                other => return Err(LoadError::Embedder(format!("a {other:?} relocation").into())),
            }
        }
        // SAFETY: our own mapping.
        if unsafe { libc::mprotect(ptr.cast(), len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            return Err(LoadError::Embedder("mprotect failed".into()));
        }
        Ok(Box::new(Image { ptr, len }))
    }
}

/// Loads with the test loader on this host.
pub fn load<'a>(
    artifact: &'a [u8],
    weights: Option<&'a [u8]>,
) -> Result<kiln_runtime::LoadedModule<'a>, kiln_runtime::RuntimeError> {
    kiln_runtime::Module::verify(artifact, weights, kiln_runtime::cpu::host_features())?.load(&MmapLoader)
}

/// `main(a: f32[n], b: f32[n]) -> (y: f32[n], z: f32[1])`: a first wave of three
/// dispatches (s = a + b, t = a + a, and a one-workgroup copy of a[0]), then y = s + t
/// and z = a[0] copied out. With `barrier` false the plan leaves out the barrier between
/// the waves: y's dispatch then reads what the first wave writes, and a driver must
/// still run it after them.
pub fn waves_program(n: u64, barrier: bool) -> Program {
    let bytes = 4 * n;
    let add = |a: Binding, b: Binding, y: Binding| dispatch(1, n, vec![a, b, y]);
    let (a, bb) = (b(Slot::Input(0), 0, bytes), b(Slot::Input(1), 0, bytes));
    let (s, t, w) = (b(Slot::Arena, 0, bytes), b(Slot::Arena, bytes, bytes), b(Slot::Arena, 2 * bytes, 4));
    let mut commands = vec![add(a, bb, s), add(a, a, t), dispatch(0, 1, vec![b(Slot::Input(0), 0, 4), w])];
    if barrier {
        commands.push(Command::Barrier);
    }
    commands.push(add(s, t, b(Slot::Output(0), 0, bytes)));
    commands.push(Command::Copy { src: w, dst: b(Slot::Output(1), 0, 4) });
    let outputs = vec![tensor("y", 1, &[n], bytes), tensor("z", 1, &[1], 4)];
    main_of_a_b(n, outputs, 2 * bytes + 4, commands, vec![])
}

/// A CUDA executable of `entries` entries (PTX-like text; never run here), each launched
/// with 256 threads, no shared memory and 3 parameters (the bindings of `add`).
pub fn cuda_executable(entries: usize) -> Executable {
    Executable {
        device: DeviceKind::Cuda,
        features: 0,
        code: b"// ptx\n.visible .entry k0() {}\n".to_vec(),
        entries: (0..entries).map(|i| (format!("k{i}"), 0)).collect(),
        relocs: vec![],
        launches: vec![Launch { block: 256, shared: 0, params: 3 }; entries],
    }
}

/// `add_program(4)` for a CUDA device: every kernel's one variant is entry `i` of a CUDA
/// executable.
pub fn cuda_add_program() -> Program {
    let mut p = add_program(4);
    p.devices[0] = Device { kind: DeviceKind::Cuda, name: "cuda".into() };
    p.executables = vec![cuda_executable(3)];
    p
}

/// `y[i] = a[i] + b[i]` (f32) for i < 4, one thread each: the CUDA tests' kernel.
pub const ADD_PTX: &str = "\
.version 8.0
.target sm_90a
.address_size 64

.visible .entry add(.param .u64 a, .param .u64 b, .param .u64 y)
{
	.reg .pred %p<2>;
	.reg .b32 %r<5>;
	.reg .b64 %rd<8>;
	.reg .f32 %f<4>;
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	ld.param.u64 %rd3, [y];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mad.lo.u32 %r4, %r2, %r3, %r1;
	setp.ge.u32 %p1, %r4, 4;
	@%p1 bra DONE;
	mul.wide.u32 %rd4, %r4, 4;
	add.s64 %rd5, %rd1, %rd4;
	ld.global.f32 %f1, [%rd5];
	add.s64 %rd6, %rd2, %rd4;
	ld.global.f32 %f2, [%rd6];
	add.f32 %f3, %f1, %f2;
	add.s64 %rd7, %rd3, %rd4;
	st.global.f32 [%rd7], %f3;
DONE:
	ret;
}
";

/// `main(a: f32[4], b: f32[4]) -> (y: f32[4], z: u8[24])`: y = a + b + c (c a constant
/// vector, added by a second dispatch of the same kernel), computed in the arena and
/// copied out; z filled with an 8-byte pattern (bytes 0..16), a 2-byte pattern at an odd
/// offset with a partial last repetition (17..24), and byte 16 left as the fill of a
/// 4-byte zero pattern before them.
pub fn cuda_graph_program() -> Program {
    let launch = Launch { block: 32, shared: 0, params: 3 };
    let (kernels, executables) = add_kernel(DeviceKind::Cuda, ADD_PTX.as_bytes().to_vec(), vec![launch]);
    let c: Vec<u8> = [0.5f32, -1.0, 2.0, 8.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    Program {
        devices: vec![Device { kind: DeviceKind::Cuda, name: "cuda".into() }],
        entries: vec![entry(
            "main",
            vec![tensor("a", 1, &[4], 16), tensor("b", 1, &[4], 16)],
            vec![tensor("y", 1, &[4], 16), tensor("z", 2, &[24], 24)],
            (128, 64),
            vec![
                Command::Fill { dst: b(Slot::Output(1), 0, 24), pattern: 0, pattern_len: 4 },
                dispatch(0, 1, vec![b(Slot::Input(0), 0, 16), b(Slot::Input(1), 0, 16), b(Slot::Arena, 0, 16)]),
                Command::Barrier,
                Command::Fill { dst: b(Slot::Output(1), 0, 16), pattern: 0x0102_0304_0506_0708, pattern_len: 8 },
                Command::Fill { dst: b(Slot::Output(1), 17, 7), pattern: 0xabcd, pattern_len: 2 },
                dispatch(0, 1, vec![b(Slot::Arena, 0, 16), b(Slot::Constants, 0, 16), b(Slot::Arena, 64, 16)]),
                Command::Barrier,
                Command::Copy { src: b(Slot::Arena, 64, 16), dst: b(Slot::Output(0), 0, 16) },
            ],
            vec![],
        )],
        kernels,
        executables,
        constants: Constants::Embedded(c),
        debug: None,
    }
}

/// What [`cuda_graph_program`] computes, on the host.
pub fn cuda_graph_expected(a: &[f32], bv: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let c = [0.5f32, -1.0, 2.0, 8.0];
    let y: Vec<f32> = (0..4).map(|i| a[i] + bv[i] + c[i]).collect();
    let mut z = vec![0u8; 24];
    for (i, x) in z[..16].iter_mut().enumerate() {
        *x = 0x0102_0304_0506_0708u64.to_le_bytes()[i % 8];
    }
    for (i, x) in z[17..].iter_mut().enumerate() {
        *x = 0xabcdu16.to_le_bytes()[i % 2];
    }
    (f32s(&y), z)
}

/// Three CPU devices meeting in collectives, no kernels: `main(a, b, c: f32[n])` copies
/// each input into its device's buffer, all-reduces the three (every device receives
/// `(a + b) + c`) and all-gathers them in two blocks (each device receives
/// `[a₀ b₀ c₀ a₁ b₁ c₁]`, where `x₀`, `x₁` are the halves of `x`); it returns device 1's
/// sum, device 2's gather and device 0's sum. `n` is even. The kernels are
/// `add_program`'s, never dispatched.
pub fn collectives_program(n: u64) -> Program {
    let (x, kernels) = executable();
    let by = 4 * n;
    let a = |k: u64, len: u64| b(Slot::Arena, k * by, len);
    let part = |device: u32, src: Binding, dst: Binding| CollectivePart { device, src, dst };
    Program {
        devices: (0..3).map(|d| Device { kind: DeviceKind::Cpu, name: format!("cpu:{d}") }).collect(),
        entries: vec![entry(
            "main",
            ["a", "b", "c"].iter().map(|x| tensor(x, 1, &[n], by)).collect(),
            vec![tensor("sum1", 1, &[n], by), tensor("gather2", 1, &[3 * n], 3 * by), tensor("sum0", 1, &[n], by)],
            (15 * by, 64),
            vec![
                Command::Copy { src: b(Slot::Input(0), 0, by), dst: a(0, by) },
                Command::Copy { src: b(Slot::Input(1), 0, by), dst: a(1, by) },
                Command::Copy { src: b(Slot::Input(2), 0, by), dst: a(2, by) },
                Command::Barrier,
                Command::AllReduce {
                    dtype: 1,
                    parts: vec![part(0, a(0, by), a(3, by)), part(1, a(1, by), a(4, by)), part(2, a(2, by), a(5, by))],
                },
                Command::AllGather {
                    outer: 2,
                    parts: vec![
                        part(0, a(0, by), a(6, 3 * by)),
                        part(1, a(1, by), a(9, 3 * by)),
                        part(2, a(2, by), a(12, 3 * by)),
                    ],
                },
                Command::Barrier,
                Command::Copy { src: a(4, by), dst: b(Slot::Output(0), 0, by) },
                Command::Copy { src: a(12, 3 * by), dst: b(Slot::Output(1), 0, 3 * by) },
                Command::Copy { src: a(3, by), dst: b(Slot::Output(2), 0, by) },
            ],
            vec![],
        )],
        // The kernel table of `add_program` (no dispatch runs them): the fuzz harness
        // mutates a program's first executable.
        kernels,
        executables: vec![x],
        constants: Constants::Embedded(vec![]),
        debug: None,
    }
}
