//! Pieces of hand-built programs: the hand-assembled `add` kernel, and the bindings,
//! tensors, entries, dispatches and one-kernel executables of a plan. Shared with
//! kiln-runner's and kiln-module's tests (included there by `#[path]`), so it uses
//! kiln-module alone.

use kiln_module::program::*;

/// `y[i] = a[i] + b[i]` (f32) for workgroups i in `begin..end` (rdx..rcx).
pub const ADD_F32: &[u8] = &[
    0x4c, 0x8b, 0x07, //                   0: mov r8,  [rdi]       ; a
    0x4c, 0x8b, 0x4f, 0x08, //             3: mov r9,  [rdi+8]     ; b
    0x4c, 0x8b, 0x57, 0x10, //             7: mov r10, [rdi+16]    ; y
    0x48, 0x39, 0xca, //                  11: cmp rdx, rcx
    0x73, 0x17, //                        14: jae 39
    0xf3, 0x41, 0x0f, 0x10, 0x04, 0x90, // 16: movss xmm0, [r8+rdx*4]
    0xf3, 0x41, 0x0f, 0x58, 0x04, 0x91, // 22: addss xmm0, [r9+rdx*4]
    0xf3, 0x41, 0x0f, 0x11, 0x04, 0x92, // 28: movss [r10+rdx*4], xmm0
    0x48, 0xff, 0xc2, //                  34: inc rdx
    0xeb, 0xe4, //                        37: jmp 11
    0xc3, //                              39: ret
];

/// A binding of `length` bytes at `offset` into `slot`.
pub fn b(slot: Slot, offset: u64, length: u64) -> Binding {
    Binding { slot, offset, length }
}

/// A tensor of the signature.
pub fn tensor(name: &str, dtype: u32, dims: &[u64], bytes: u64) -> TensorDesc {
    TensorDesc { name: name.into(), dtype, dims: dims.to_vec(), bytes }
}

/// An entry point `name(inputs) -> outputs` whose plan (`commands`, `buffers`) uses an
/// arena of `arena` (size, alignment) bytes; no bounded inputs and no extents.
pub fn entry(
    name: &str,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    arena: (u64, u64),
    commands: Vec<Command>,
    buffers: Vec<BufferDesc>,
) -> EntryPoint {
    let (arena_size, arena_align) = arena;
    EntryPoint {
        bounded: Vec::new(),
        bounded_rows: Vec::new(),
        device_arenas: Vec::new(),
        prologue: 0,
        extents: Vec::new(),
        name: name.into(),
        inputs,
        outputs,
        arena_size,
        arena_align,
        commands,
        buffers,
    }
}

/// A dispatch on device 0 without push constants.
pub fn dispatch(kernel: u32, workgroups: u64, bindings: Vec<Binding>) -> Command {
    Command::Dispatch { kernel, device: 0, workgroups, bindings, push_constants: vec![], work_ns: 0 }
}

/// The one kernel `add` (elementwise): entry 0 of one executable for `device`, holding
/// `code` and launched as `launches` say (none for a CPU).
pub fn add_kernel(device: DeviceKind, code: Vec<u8>, launches: Vec<Launch>) -> (Vec<Kernel>, Vec<Executable>) {
    let kernel =
        Kernel { name: "add".into(), variants: vec![Variant::cpu(0, 0, 0)], class: Some(KernelClass::Elementwise) };
    let executable =
        Executable { device, features: 0, code, entries: vec![("add".into(), 0)], relocs: vec![], launches };
    (vec![kernel], vec![executable])
}
