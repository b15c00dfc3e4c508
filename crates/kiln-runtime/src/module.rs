//! Loading: container, ABI, sections, plan verification, weights, variant selection,
//! code.

use crate::error::RuntimeError;
use crate::hal::{CodeLoader, KernelFn, LoadedImage};
use crate::verify::{select_variants, verify_program, Limits};
use alloc::boxed::Box;
use alloc::string::ToString;
use alloc::vec::Vec;
use kiln_module::abi::{HelperFn, ABI_VERSION, HELPER_COUNT};
use kiln_module::sections::{
    read_program, weights_hash, ConstantsView, EntryView, ProgramView, TensorView, CONSTANTS_ALIGN,
};
use kiln_module::Version;

/// The kernel ABI this runtime provides.
pub const RUNTIME_ABI: Version = ABI_VERSION;

/// Entry to loading: [`Module::load`] (with `std`) or [`Module::verify`] then
/// [`Verified::load`] with an embedder's [`CodeLoader`].
#[derive(Debug)]
pub struct Module;

impl Module {
    /// Checks everything about an artifact that does not depend on the machine or on
    /// a weights file: container, ABI version, sections and plan (every index, range
    /// and length the plan holds). A tool that reads an artifact without running it
    /// (a listing, a dispatch graph) calls this before it walks the plan: whatever it
    /// returns has every binding inside its slot, so offset arithmetic on the plan's
    /// values cannot overflow.
    pub fn verify_plan(artifact: &[u8]) -> Result<VerifiedPlan<'_>, RuntimeError> {
        let container = kiln_module::Module::parse(artifact)?;
        if !RUNTIME_ABI.can_read(container.abi()) {
            return Err(RuntimeError::UnsupportedVersion { needed: container.abi(), have: RUNTIME_ABI });
        }
        let program = read_program(&container)?;
        let pool_len = match program.constants {
            ConstantsView::Embedded(b) => b.len() as u64,
            ConstantsView::External { size, .. } => size,
        };
        let limits = verify_program(&program, pool_len)?;
        Ok(VerifiedPlan { container, program, limits })
    }

    /// Checks an artifact completely without placing any code: what
    /// [`Module::verify_plan`] checks, then what [`VerifiedPlan::bind`] does.
    pub fn verify<'a>(
        artifact: &'a [u8],
        weights: Option<&'a [u8]>,
        host_features: u64,
    ) -> Result<Verified<'a>, RuntimeError> {
        Module::verify_plan(artifact)?.bind(weights, host_features)
    }
}

/// An artifact whose container, sections and plan passed [`Module::verify_plan`]'s
/// checks; its weights and its code's CPU features are not checked.
#[derive(Debug)]
pub struct VerifiedPlan<'a> {
    /// The container: format and ABI versions, the section table.
    pub container: kiln_module::Module<'a>,
    /// The decoded, verified program.
    pub program: ProgramView<'a>,
    /// What an instance of it needs.
    pub limits: Limits,
}

impl<'a> VerifiedPlan<'a> {
    /// The checks that need the weights and the host: binds `weights`, the external
    /// weights file of a module compiled with weights kept outside (`None` for a module
    /// that embeds them), and chooses each kernel's variant for a host with CPU features
    /// `host_features` (bits of [`kiln_module::program::CpuFeature`]).
    pub fn bind(self, weights: Option<&'a [u8]>, host_features: u64) -> Result<Verified<'a>, RuntimeError> {
        let VerifiedPlan { program, limits, .. } = self;
        // This path loads CPU code: a plan for another device is refused here, before
        // the weights and the variants (`verify_plan` accepts it, for listings).
        crate::verify::require_device_kind(&program, kiln_module::program::DeviceKind::Cpu)?;
        let pool = bind_weights(&program, weights)?;
        let variants = select_variants(&program, host_features)?;
        Ok(Verified { program, pool, variants, limits })
    }
}

/// The constant pool of `program`: its embedded constants, or `weights` when it keeps
/// them outside and they are the file it was compiled with (size and hash).
pub(crate) fn bind_weights<'a>(program: &ProgramView<'a>, weights: Option<&'a [u8]>) -> Result<&'a [u8], RuntimeError> {
    Ok(match (program.constants, weights) {
        (ConstantsView::Embedded(_), Some(_)) => return Err(RuntimeError::WeightsNotExpected),
        (ConstantsView::Embedded(b), None) => b,
        (ConstantsView::External { file, size, .. }, None) => {
            return Err(RuntimeError::WeightsMissing { file: file.to_string(), size })
        }
        (ConstantsView::External { file, size, hash }, Some(w)) => {
            let got_hash = (w.len() as u64 == size).then(|| weights_hash(w));
            if got_hash != Some(hash) {
                return Err(RuntimeError::WeightsMismatch {
                    file: file.to_string(),
                    expected_size: size,
                    got_size: w.len() as u64,
                    expected_hash: hash,
                    got_hash,
                });
            }
            w
        }
    })
}

/// An artifact that passed every check; [`Verified::load`] places its code.
#[derive(Debug)]
pub struct Verified<'a> {
    pub(crate) program: ProgramView<'a>,
    pool: &'a [u8],
    variants: Vec<usize>,
    pub(crate) limits: Limits,
}

impl<'a> Verified<'a> {
    /// The decoded artifact (for listings).
    pub fn program(&self) -> &ProgramView<'a> {
        &self.program
    }

    /// Per kernel, the index of the variant chosen for the host (the one that runs).
    pub fn variants(&self) -> &[usize] {
        &self.variants
    }

    /// Arena size, alignment and table sizes an instance needs.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Places the code of the chosen variants with `loader` (each executable once) and
    /// resolves every kernel's entry point. The constant pool is used in place when it
    /// is 64-byte aligned in memory, else copied once into an aligned buffer.
    pub fn load(self, loader: &dyn CodeLoader) -> Result<LoadedModule<'a>, RuntimeError> {
        let p = &self.program;
        let mut images: Vec<Option<Box<dyn LoadedImage>>> = Vec::new();
        images.resize_with(p.executables.len(), || None);
        let mut kernels = Vec::with_capacity(p.kernels.len());
        let mut workgroups = Vec::with_capacity(p.kernels.len());
        for (k, &vi) in p.kernels.iter().zip(&self.variants) {
            if vi == crate::verify::NOT_ON_CPU {
                // A kernel of another device's segments: never called here.
                kernels.push(not_on_this_device as KernelFn);
                workgroups.push(0);
                continue;
            }
            // Verified: the variant, its executable and its entry symbol exist.
            let v = &k.variants[vi];
            let xi = v.executable as usize;
            let x = &p.executables[xi];
            let img = match &mut images[xi] {
                Some(img) => img,
                slot => slot.insert(
                    loader.load(x.code, &x.relocs).map_err(|error| RuntimeError::Load { executable: xi, error })?,
                ),
            };
            let (_, offset) = x.entries[v.entry as usize];
            let f = img.entry(offset).map_err(|error| RuntimeError::Load { executable: xi, error })?;
            kernels.push(f);
            workgroups.push(v.workgroups);
        }
        let main = p.entries.iter().position(|e| e.name == "main");
        Ok(LoadedModule {
            pool: Pool::new(self.pool),
            verified: self,
            kernels,
            workgroups,
            _images: images.into_iter().flatten().collect(),
            helpers: loader.helpers(),
            main,
        })
    }
}

/// The entry of a kernel that runs on another device of a heterogeneous plan (its
/// dispatches are that device's queue's): does nothing.
unsafe extern "C" fn not_on_this_device(_: *const *mut u8, _: *const HelperFn, _: u64, _: u64) {}

/// The constant pool: borrowed when aligned, else one aligned copy.
#[derive(Debug)]
pub(crate) enum Pool<'a> {
    Borrowed(&'a [u8]),
    Copied { buf: Vec<u8>, start: usize, len: usize },
}

impl<'a> Pool<'a> {
    fn new(bytes: &'a [u8]) -> Pool<'a> {
        let align = CONSTANTS_ALIGN as usize;
        if bytes.is_empty() || (bytes.as_ptr() as usize).is_multiple_of(align) {
            return Pool::Borrowed(bytes);
        }
        let mut buf = alloc::vec![0u8; bytes.len() + align - 1];
        let start = buf.as_ptr().align_offset(align).min(align - 1);
        buf[start..start + bytes.len()].copy_from_slice(bytes);
        Pool::Copied { buf, start, len: bytes.len() }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Pool::Borrowed(b) => b,
            Pool::Copied { buf, start, len } => &buf[*start..*start + *len],
        }
    }
}

/// A loaded module: a [`Verified`] artifact ([`LoadedModule::verified`]: its program,
/// the variants that run, the limits an instance needs), its code placed and its
/// constants bound. Create [`crate::Instance`]s from it to run it; it is never modified
/// after loading.
pub struct LoadedModule<'a> {
    pub(crate) verified: Verified<'a>,
    pub(crate) pool: Pool<'a>,
    pub(crate) kernels: Vec<KernelFn>,
    /// Per kernel, the workgroup count of its chosen variant (0: each dispatch's own).
    workgroups: Vec<u64>,
    // Keeps the code that `kernels` point into mapped; dropped last.
    _images: Vec<Box<dyn LoadedImage>>,
    pub(crate) helpers: &'static [HelperFn; HELPER_COUNT],
    pub(crate) main: Option<usize>,
}

impl core::fmt::Debug for LoadedModule<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LoadedModule")
            .field("entries", &self.verified.program.entries.len())
            .field("kernels", &self.kernels.len())
            .field("limits", &self.verified.limits)
            .finish_non_exhaustive()
    }
}

impl<'a> LoadedModule<'a> {
    /// The entry points' names, inputs and outputs.
    pub fn signature(&self) -> Signature<'_, 'a> {
        Signature { entries: &self.verified.program.entries }
    }

    /// Entry point `index`'s name, inputs and outputs.
    pub fn entry_signature(&self, index: usize) -> Result<EntrySignature<'_, 'a>, RuntimeError> {
        self.signature().entry(index).ok_or_else(|| RuntimeError::NoSuchEntry { entry: alloc::format!("#{index}") })
    }

    /// The address each kernel's code starts at, in kernel-table order (for profilers'
    /// symbol maps; calling them is the runtime's business).
    pub fn kernel_addresses(&self) -> impl Iterator<Item = usize> + '_ {
        self.kernels.iter().map(|&f| f as usize)
    }

    /// What loading verified: the decoded artifact, the variant of each kernel that
    /// runs, and the limits an instance needs.
    pub fn verified(&self) -> &Verified<'a> {
        &self.verified
    }

    /// The workgroups a dispatch of `kernel` that records `recorded` runs: the chosen
    /// variant's own count where it has one (variants may split a kernel's work
    /// differently), else the dispatch's. `kernel` was verified to be in range.
    #[inline]
    pub(crate) fn workgroups(&self, kernel: u32, recorded: u64) -> u64 {
        match self.workgroups.get(kernel as usize) {
            Some(&w) if w != 0 => w,
            _ => recorded,
        }
    }

    /// The constant pool the kernels read.
    pub fn constants(&self) -> &[u8] {
        self.pool.bytes()
    }
}

/// The entry points of a module.
#[derive(Debug, Clone, Copy)]
pub struct Signature<'m, 'a> {
    entries: &'m [EntryView<'a>],
}

/// One entry point's name, inputs and outputs.
#[derive(Debug, Clone, Copy)]
pub struct EntrySignature<'m, 'a> {
    /// Its index (for [`crate::Instance::invoke_entry`]).
    pub index: usize,
    /// Its name.
    pub name: &'a str,
    /// Inputs in call order: name, dtype (ONNX code), dims, bytes.
    pub inputs: &'m [TensorView<'a>],
    /// Outputs in call order.
    pub outputs: &'m [TensorView<'a>],
    /// Its bounded input dimensions (format 1.6 on): an input listed here takes any
    /// extent `min..=bound` along `axis` (its signature dims are the bound's).
    pub bounded: &'m [kiln_module::program::BoundedDesc],
}

impl<'m, 'a> Signature<'m, 'a> {
    /// The signature of `entries`.
    #[cfg(feature = "cuda")]
    pub(crate) fn of(entries: &'m [EntryView<'a>]) -> Signature<'m, 'a> {
        Signature { entries }
    }

    fn at(&self, index: usize) -> Option<EntrySignature<'m, 'a>> {
        let e = self.entries.get(index)?;
        Some(EntrySignature { index, name: e.name, inputs: &e.inputs, outputs: &e.outputs, bounded: &e.bounded })
    }

    /// Number of entry points.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry point `index`.
    pub fn entry(&self, index: usize) -> Option<EntrySignature<'m, 'a>> {
        self.at(index)
    }

    /// The entry point called `name`.
    pub fn find(&self, name: &str) -> Option<EntrySignature<'m, 'a>> {
        self.at(self.entries.iter().position(|e| e.name == name)?)
    }

    /// The entry point an embedder runs when none is named: `main`, else the first.
    pub fn default_entry(&self) -> Option<EntrySignature<'m, 'a>> {
        self.find("main").or_else(|| self.entry(0))
    }

    /// All entry points in order.
    pub fn entries(&self) -> impl Iterator<Item = EntrySignature<'m, 'a>> + '_ {
        (0..self.entries.len()).filter_map(|i| self.at(i))
    }
}
