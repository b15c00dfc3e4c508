//! Thin, checked wrappers over the CUDA driver API (cudarc's raw `sys` layer): every
//! call's result is checked and becomes a typed [`RuntimeError`] naming the call and
//! the driver's error; every handle is owned by a value that releases it on drop.
//!
//! cudarc loads `libcuda` lazily and panics when it is absent, so [`init`] checks first
//! that the library and every function kiln calls are there, and only then calls
//! anything: without a driver the answer is [`RuntimeError::NoCudaDriver`], never a
//! panic.

use crate::error::RuntimeError;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::ffi::{c_int, c_uint, c_void, CStr};
use core::ptr;
use cudarc::driver::sys;
use std::sync::OnceLock;

pub use sys::CUdeviceptr;

/// Every driver function this module calls (the names libcuda exports: `_v2` where the
/// header maps the name to a second version). [`init`] looks each up before any call,
/// because cudarc panics on a missing one.
const FUNCTIONS: [&str; 31] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncSetAttribute",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD2D8Async",
    "cuMemsetD2D16Async",
    "cuMemsetD2D32Async",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuLaunchKernel",
    "cuGraphCreate",
    "cuGraphAddKernelNode_v2",
    "cuGraphAddMemcpyNode",
    "cuGraphAddMemsetNode",
];

/// More driver functions (the graph's life cycle, and the events of a heterogeneous
/// plan's cross-device waits), checked with [`FUNCTIONS`].
const GRAPH_FUNCTIONS: [&str; 9] = [
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// Checks a driver result: `Ok` on success, else the typed error naming `call`.
pub fn check(call: &'static str, r: sys::CUresult) -> Result<(), RuntimeError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(RuntimeError::Cuda { call, error: error_name(r) })
    }
}

/// The driver's name of an error (`CUDA_ERROR_INVALID_VALUE`): cudarc's enum variants
/// are named after the header's constants.
pub fn error_name(r: sys::CUresult) -> String {
    alloc::format!("{r:?}")
}

/// Whether libcuda is there with every function kiln calls, and `cuInit` succeeded;
/// decided once per process.
pub fn init() -> Result<(), RuntimeError> {
    static STATE: OnceLock<Result<(), (bool, String)>> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to open the library under its usual
        // names (dlopen) and closes it again; it calls nothing inside it.
        if !unsafe { sys::is_culib_present() } {
            return Err((true, "libcuda.so.1 not found".to_string()));
        }
        // SAFETY: the library is present (just checked), so `culib` opens it instead of
        // panicking; it stays open for the rest of the process.
        let lib = unsafe { sys::culib() };
        for name in FUNCTIONS.iter().chain(&GRAPH_FUNCTIONS) {
            // SAFETY: looking a symbol up calls nothing; the pointer type is never used.
            let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
            if !found {
                return Err((true, alloc::format!("libcuda lacks {name} (a driver for CUDA 12.3 or newer is needed)")));
            }
        }
        // SAFETY: every function is present (checked above); cuInit takes flags 0.
        let r = unsafe { sys::cuInit(0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err((false, error_name(r)))
        }
    });
    match state {
        Ok(()) => Ok(()),
        Err((true, what)) => Err(RuntimeError::NoCudaDriver { what: what.clone() }),
        // The first call's error, again: the driver refused to initialise (no device,
        // a driver older than the kernel module, …).
        Err((false, error)) => Err(RuntimeError::Cuda { call: "cuInit", error: error.clone() }),
    }
}

/// The driver's CUDA version (`13000` for 13.0).
pub fn driver_version() -> Result<i32, RuntimeError> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialised; `v` is a valid out pointer.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

/// A device's primary context, retained while this lives and made current on the
/// calling thread by [`Context::bind`].
#[derive(Debug)]
pub struct Context {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// The device's name.
    pub name: String,
}

impl Context {
    /// Device `ordinal`'s primary context (the driver must be initialised: [`init`]).
    pub fn new(ordinal: usize) -> Result<Context, RuntimeError> {
        init()?;
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| RuntimeError::Cuda { call: "cuDeviceGet", error: "CUDA_ERROR_INVALID_DEVICE".into() })?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: the driver is initialised; `device` is a valid out pointer.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, ordinal) })?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32, RuntimeError> {
            let mut v: c_int = 0;
            // SAFETY: `device` is a valid device handle; `v` a valid out pointer.
            check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, device) })?;
            Ok(v)
        };
        let capability = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let mut buf = [0 as core::ffi::c_char; 256];
        // SAFETY: `buf` holds 256 bytes, the length passed; the driver NUL-terminates.
        check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, device) })?;
        buf[255] = 0;
        // SAFETY: `buf` is NUL-terminated (its last byte was just set to 0).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        let mut ctx: sys::CUcontext = ptr::null_mut();
        // SAFETY: `device` is valid; `ctx` a valid out pointer. Released in `drop`.
        check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
        let c = Context { device, ctx, capability, name };
        c.bind()?;
        Ok(c)
    }

    /// Makes the context current on the calling thread (every operation of a module or
    /// an instance calls this first, so that they may be used from any thread).
    pub fn bind(&self) -> Result<(), RuntimeError> {
        // SAFETY: `ctx` is the retained primary context, alive while `self` is.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// The raw context (for memcpy and memset nodes).
    pub fn raw(&self) -> sys::CUcontext {
        self.ctx
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the primary context was retained in `new`; released once here.
        // Nothing to do about a failure while dropping.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

/// Which form of code a module was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeForm {
    /// A cubin, loaded as it is.
    Cubin,
    /// PTX text, compiled by the driver's JIT at load.
    Ptx,
}

/// A loaded CUDA module (`CUmodule`), unloaded on drop.
#[derive(Debug)]
pub struct LoadedCode {
    module: sys::CUmodule,
}

impl LoadedCode {
    /// Loads `code` (a cubin, or PTX text without its terminating NUL, which is added
    /// here) in the current context. `executable` names it in errors; a PTX load that
    /// fails carries the JIT's error log.
    pub fn load(code: &[u8], form: CodeForm, executable: usize) -> Result<LoadedCode, RuntimeError> {
        let mut module: sys::CUmodule = ptr::null_mut();
        let r = match form {
            CodeForm::Cubin => {
                // An owned copy: the driver reads the ELF image with its own alignment
                // assumptions, and a slice of the file is only byte-aligned.
                let image: Vec<u64> = {
                    let mut v = alloc::vec![0u64; code.len().div_ceil(8)];
                    // SAFETY: `v` holds at least `code.len()` bytes; u64 has no invalid
                    // bit patterns and the regions do not overlap.
                    unsafe { ptr::copy_nonoverlapping(code.as_ptr(), v.as_mut_ptr().cast::<u8>(), code.len()) };
                    v
                };
                // SAFETY: `image` holds the whole cubin and lives across the call;
                // `module` is a valid out pointer.
                let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(RuntimeError::CudaModuleLoad { executable, error: error_name(r), log: String::new() });
                }
                r
            }
            CodeForm::Ptx => {
                let mut text = Vec::with_capacity(code.len() + 1);
                text.extend_from_slice(code);
                text.push(0);
                let mut log = alloc::vec![0u8; 16 << 10];
                let mut options =
                    [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
                // The size option's value is the integer itself, passed in the pointer.
                let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
                // SAFETY: `text` is NUL-terminated PTX; `options` and `values` are two
                // entries each, as `numOptions` says; the log buffer holds the size given
                // and outlives the call; `module` is a valid out pointer.
                let r = unsafe {
                    sys::cuModuleLoadDataEx(
                        &mut module,
                        text.as_ptr().cast(),
                        options.len() as c_uint,
                        options.as_mut_ptr(),
                        values.as_mut_ptr(),
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    let log = String::from_utf8_lossy(&log[..end]).into_owned();
                    return Err(RuntimeError::CudaModuleLoad { executable, error: error_name(r), log });
                }
                r
            }
        };
        check("cuModuleLoadData", r)?;
        Ok(LoadedCode { module })
    }

    /// The function `name` of the module.
    pub fn function(&self, name: &str, executable: usize) -> Result<sys::CUfunction, RuntimeError> {
        let mut c = Vec::with_capacity(name.len() + 1);
        c.extend_from_slice(name.as_bytes());
        c.push(0);
        if name.as_bytes().contains(&0) {
            return Err(RuntimeError::CudaModuleLoad {
                executable,
                error: "CUDA_ERROR_NOT_FOUND".into(),
                log: alloc::format!("entry name {name:?} holds a NUL byte"),
            });
        }
        let mut f: sys::CUfunction = ptr::null_mut();
        // SAFETY: `module` is loaded; `c` is NUL-terminated; `f` a valid out pointer.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, self.module, c.as_ptr().cast()) })?;
        Ok(f)
    }
}

impl Drop for LoadedCode {
    fn drop(&mut self) {
        // SAFETY: the module was loaded in `load`; unloaded once here, after every
        // instance using its functions is gone (they borrow the module that owns this).
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

/// Raises `f`'s dynamic shared memory limit to `bytes` (needed above 48 KiB).
///
/// # Safety
/// `f` is a function of a module loaded in the current context.
pub unsafe fn set_max_dynamic_shared(f: sys::CUfunction, bytes: u32) -> Result<(), RuntimeError> {
    let v = c_int::try_from(bytes).unwrap_or(c_int::MAX);
    // SAFETY: the caller vouches for `f`; the attribute takes an int.
    check("cuFuncSetAttribute", unsafe {
        sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, v)
    })
}

/// One device allocation, freed on drop.
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: CUdeviceptr,
    /// Bytes allocated.
    pub bytes: u64,
}

impl DeviceMemory {
    /// `bytes` of device memory (at least one), zeroed.
    pub fn zeroed(bytes: u64) -> Result<DeviceMemory, RuntimeError> {
        let n = usize::try_from(bytes.max(1)).map_err(|_| RuntimeError::ArenaAlloc { bytes })?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: a current context is bound by the caller; `ptr` is a valid out pointer.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, n) };
        if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(RuntimeError::ArenaAlloc { bytes });
        }
        check("cuMemAlloc", r)?;
        let m = DeviceMemory { ptr, bytes: n as u64 };
        // SAFETY: `ptr` is the allocation of `n` bytes just made.
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(ptr, 0, n) })?;
        Ok(m)
    }

    /// The allocation's device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed`; freed once here, after the graphs and the
        // stream that use it are gone (the instance drops them first).
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Copies `src` to device address `dst` and waits for the copy.
///
/// # Safety
/// `dst..dst + src.len()` lies inside a live device allocation of the current context.
pub unsafe fn copy_to_device(dst: CUdeviceptr, src: &[u8]) -> Result<(), RuntimeError> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller vouches for the destination; `src` is readable for its length.
    check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })
}

/// A non-blocking stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
}

impl Stream {
    /// A stream that does not synchronise with the legacy default stream.
    pub fn new() -> Result<Stream, RuntimeError> {
        let mut raw: sys::CUstream = ptr::null_mut();
        // SAFETY: a current context is bound by the caller; `raw` a valid out pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
        })?;
        Ok(Stream { raw })
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        // SAFETY: the stream is alive.
        check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.raw) })
    }

    /// Queues a copy of `len` bytes from host `src` to device `dst`.
    ///
    /// # Safety
    /// `src` is readable for `len` bytes until the stream is synchronised; the device
    /// range lies inside a live allocation.
    pub unsafe fn upload(&self, dst: CUdeviceptr, src: *const u8, len: usize) -> Result<(), RuntimeError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the caller vouches for both ranges.
        check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.raw) })
    }

    /// Queues a copy of `len` bytes from device `src` to host `dst`.
    ///
    /// # Safety
    /// `dst` is writable for `len` bytes, and not otherwise accessed, until the stream
    /// is synchronised; the device range lies inside a live allocation.
    pub unsafe fn download(&self, dst: *mut u8, src: CUdeviceptr, len: usize) -> Result<(), RuntimeError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the caller vouches for both ranges.
        check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.raw) })
    }

    /// Queues a device-to-device copy.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations.
    pub unsafe fn copy(&self, dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<(), RuntimeError> {
        // SAFETY: the caller vouches for both ranges.
        check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, self.raw) })
    }

    /// Queues a memset of `height` rows of `width` elements of `element` bytes (1, 2 or
    /// 4), rows `pitch` bytes apart.
    ///
    /// # Safety
    /// Every element lies inside a live allocation, aligned to its width.
    pub unsafe fn memset(
        &self,
        dst: CUdeviceptr,
        element: u32,
        value: u32,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<(), RuntimeError> {
        match element {
            // SAFETY: the caller vouches for the range; the value is cut to a byte.
            1 => check("cuMemsetD2D8Async", unsafe {
                sys::cuMemsetD2D8Async(dst, pitch, value as u8, width, height, self.raw)
            }),
            // SAFETY: as above, 2-byte elements.
            2 => check("cuMemsetD2D16Async", unsafe {
                sys::cuMemsetD2D16Async(dst, pitch, value as u16, width, height, self.raw)
            }),
            // SAFETY: as above, 4-byte elements.
            _ => check("cuMemsetD2D32Async", unsafe {
                sys::cuMemsetD2D32Async(dst, pitch, value, width, height, self.raw)
            }),
        }
    }

    /// Queues a launch of `f` on a one-dimensional grid with one `.u64` parameter per
    /// entry of `params` (device addresses).
    ///
    /// # Safety
    /// `f` is a function of a loaded module taking exactly `params.len()` `.u64`
    /// parameters, and every address is what the kernel may touch.
    pub unsafe fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        shared: u32,
        params: &[CUdeviceptr],
    ) -> Result<(), RuntimeError> {
        let mut values: Vec<CUdeviceptr> = params.to_vec();
        let mut args: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut CUdeviceptr).cast()).collect();
        // SAFETY: `args` points at one u64 per parameter, alive across the call (the
        // driver copies them at launch); the caller vouches for `f` and the addresses.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, self.raw, args.as_mut_ptr(), ptr::null_mut())
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here. Work still queued completes
        // first (the driver defers the destruction).
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// A graph under construction, destroyed on drop (its instantiation is independent).
#[derive(Debug)]
pub struct Graph {
    raw: sys::CUgraph,
}

/// A node handle of a [`Graph`].
pub type NodeHandle = sys::CUgraphNode;

impl Graph {
    /// An empty graph.
    pub fn new() -> Result<Graph, RuntimeError> {
        let mut raw: sys::CUgraph = ptr::null_mut();
        // SAFETY: a current context is bound by the caller; `raw` a valid out pointer.
        check("cuGraphCreate", unsafe { sys::cuGraphCreate(&mut raw, 0) })?;
        Ok(Graph { raw })
    }

    /// Adds a kernel node after `deps`.
    ///
    /// # Safety
    /// As [`Stream::launch`]; `deps` are nodes of this graph.
    pub unsafe fn kernel(
        &self,
        deps: &[NodeHandle],
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        shared: u32,
        params: &[CUdeviceptr],
    ) -> Result<NodeHandle, RuntimeError> {
        let mut values: Vec<CUdeviceptr> = params.to_vec();
        let mut args: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut CUdeviceptr).cast()).collect();
        let p = sys::CUDA_KERNEL_NODE_PARAMS {
            func: f,
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            kernelParams: args.as_mut_ptr(),
            extra: ptr::null_mut(),
            kern: ptr::null_mut(),
            ctx: ptr::null_mut(),
        };
        let mut node: NodeHandle = ptr::null_mut();
        // SAFETY: `p` is fully initialised; `args` holds one pointer to a u64 per
        // parameter, alive across the call (the driver copies the values into the
        // node); `deps` are `deps.len()` nodes of this graph; `node` a valid out pointer.
        check("cuGraphAddKernelNode", unsafe {
            sys::cuGraphAddKernelNode_v2(&mut node, self.raw, deps.as_ptr(), deps.len(), &p)
        })?;
        Ok(node)
    }

    /// Adds a device-to-device copy node after `deps`.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations of `ctx`; `deps` are nodes of this graph.
    pub unsafe fn copy(
        &self,
        deps: &[NodeHandle],
        ctx: &Context,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
    ) -> Result<NodeHandle, RuntimeError> {
        let p = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: ptr::null(),
            srcDevice: src,
            srcArray: ptr::null_mut(),
            reserved0: ptr::null_mut(),
            // One row of `bytes`: pitch and height as the runtime's 1-D memcpy node
            // (`cudaGraphAddMemcpyNode1D`) sets them, so no pitch check can refuse it.
            srcPitch: bytes,
            srcHeight: 1,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: ptr::null_mut(),
            dstDevice: dst,
            dstArray: ptr::null_mut(),
            reserved1: ptr::null_mut(),
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
        };
        let mut node: NodeHandle = ptr::null_mut();
        // SAFETY: `p` describes a 1-D device-to-device copy of `bytes` bytes; the caller
        // vouches for the ranges and `deps`.
        check("cuGraphAddMemcpyNode", unsafe {
            sys::cuGraphAddMemcpyNode(&mut node, self.raw, deps.as_ptr(), deps.len(), &p, ctx.raw())
        })?;
        Ok(node)
    }

    /// Adds a memset node after `deps` (see [`Stream::memset`]).
    ///
    /// # Safety
    /// As [`Stream::memset`]; `deps` are nodes of this graph.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn memset(
        &self,
        deps: &[NodeHandle],
        ctx: &Context,
        dst: CUdeviceptr,
        element: u32,
        value: u32,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<NodeHandle, RuntimeError> {
        let p = sys::CUDA_MEMSET_NODE_PARAMS { dst, pitch, value, elementSize: element, width, height };
        let mut node: NodeHandle = ptr::null_mut();
        // SAFETY: `p` is fully initialised; the caller vouches for the range and `deps`.
        check("cuGraphAddMemsetNode", unsafe {
            sys::cuGraphAddMemsetNode(&mut node, self.raw, deps.as_ptr(), deps.len(), &p, ctx.raw())
        })?;
        Ok(node)
    }

    /// Instantiates the graph and uploads it to the device through `stream` (waiting
    /// for the upload), so that the first launch costs no more than the next.
    pub fn instantiate(&self, stream: &Stream) -> Result<GraphExec, RuntimeError> {
        let mut raw: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: the graph is complete; `raw` a valid out pointer.
        check("cuGraphInstantiateWithFlags", unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0) })?;
        let exec = GraphExec { raw };
        // SAFETY: `exec` and the stream are alive.
        check("cuGraphUpload", unsafe { sys::cuGraphUpload(exec.raw, stream.raw()) })?;
        stream.synchronize()?;
        Ok(exec)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here (an instantiation does not
        // need its graph).
        let _ = unsafe { sys::cuGraphDestroy(self.raw) };
    }
}

/// An instantiated graph, destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    raw: sys::CUgraphExec,
}

impl GraphExec {
    /// Queues one launch of the whole graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), RuntimeError> {
        // SAFETY: the executable graph and the stream are alive; the memory its nodes
        // touch belongs to the instance that owns both.
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.raw, stream.raw()) })
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: instantiated in `Graph::instantiate`, destroyed once here; the
        // instance synchronises its stream before dropping it.
        let _ = unsafe { sys::cuGraphExecDestroy(self.raw) };
    }
}

/// An event (without timing), destroyed on drop: recorded on a stream after a
/// heterogeneous plan's segment, waited for by the host before a segment that needs it.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
}

impl Event {
    /// A new event (a current context is bound by the caller).
    pub fn new() -> Result<Event, RuntimeError> {
        let mut raw: sys::CUevent = ptr::null_mut();
        // SAFETY: a current context is bound by the caller; `raw` a valid out pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        Ok(Event { raw })
    }

    /// Records the event on `stream`: it completes once everything queued before it has.
    pub fn record(&self, stream: &Stream) -> Result<(), RuntimeError> {
        // SAFETY: the event and the stream are alive, of the current context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(self.raw, stream.raw()) })
    }

    /// Blocks the calling thread until the event has completed (at once for an event
    /// never recorded).
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        // SAFETY: the event is alive.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(self.raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}
