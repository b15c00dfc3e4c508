//! A loaded module that keeps the bytes it reads, for embedders that cannot hold a
//! borrow from one call to the next: the C API's module handle and the Python package's
//! module object both hold one.

use crate::fs::AlignedBytes;
use crate::{LoadedModule, Module, RuntimeError};

/// A [`LoadedModule`] together with the buffers it borrows (or, made by
/// [`OwnedModule::load_in_place`], the caller's promise that they outlive it). Never
/// modified after loading and `Send + Sync`: share it (in an `Arc`) and make instances
/// from [`OwnedModule::module`].
pub struct OwnedModule {
    // Fields drop in declaration order: `module` borrows the buffers in `_owners`, so it
    // comes first.
    /// The runtime's module, its lifetime erased to `'static`.
    ///
    /// SAFETY (of the erasure): it borrows the bytes of the artifact and the weights
    /// only. Those live in the heap buffers of `_owners`, which are never written, moved
    /// or freed before `module` is dropped (moving an `OwnedModule` moves the buffers'
    /// owners, not the bytes; no `&mut` to them is ever made), or in the caller's memory
    /// under [`OwnedModule::load_in_place`]'s contract. Nothing hands out a reference
    /// with the erased lifetime: [`OwnedModule::module`] and [`OwnedModule::artifact`]
    /// tie it to a borrow of `self`.
    module: LoadedModule<'static>,
    /// The artifact's bytes (in `_owners.0`, or the caller's).
    artifact: &'static [u8],
    /// The artifact's and the weights' buffers; `None` where the caller's memory is read.
    _owners: (Option<AlignedBytes>, Option<AlignedBytes>),
}

// Proof that sharing an `OwnedModule` between threads is sound: the runtime's module
// is itself `Send + Sync`, and the rest is plain data.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<OwnedModule>();
};

impl core::fmt::Debug for OwnedModule {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedModule")
            .field("module", &self.module)
            .field("artifact_bytes", &self.artifact.len())
            .finish()
    }
}

impl OwnedModule {
    /// [`Module::load`] of `artifact` and its external `weights` (for a module compiled
    /// with weights kept outside), keeping both buffers.
    pub fn load(artifact: AlignedBytes, weights: Option<AlignedBytes>) -> Result<OwnedModule, RuntimeError> {
        // SAFETY: the views point into the heap buffers of `artifact` and `weights`,
        // which move into the `OwnedModule` with the module that borrows them and stay
        // there, unmodified, until after it is dropped (see `OwnedModule::module`).
        let a: &'static [u8] = unsafe { &*core::ptr::from_ref(artifact.bytes()) };
        // SAFETY: as above.
        let w: Option<&'static [u8]> = weights.as_ref().map(|w| unsafe { &*core::ptr::from_ref(w.bytes()) });
        let module = Module::load(a, w)?;
        Ok(OwnedModule { module, artifact: a, _owners: (Some(artifact), weights) })
    }

    /// [`Module::load`] of bytes the module reads where they are, without a copy.
    ///
    /// # Safety
    ///
    /// `artifact` and `weights` stay valid and unmodified until the `OwnedModule` and
    /// every instance made from it are dropped.
    pub unsafe fn load_in_place(artifact: &[u8], weights: Option<&[u8]>) -> Result<OwnedModule, RuntimeError> {
        // SAFETY: the caller's contract.
        let a: &'static [u8] = unsafe { &*core::ptr::from_ref(artifact) };
        // SAFETY: as above.
        let w: Option<&'static [u8]> = weights.map(|w| unsafe { &*core::ptr::from_ref(w) });
        let module = Module::load(a, w)?;
        Ok(OwnedModule { module, artifact: a, _owners: (None, None) })
    }

    /// The loaded module: its signature, and what [`crate::Instance`]s are made from.
    pub fn module(&self) -> &LoadedModule<'_> {
        &self.module
    }

    /// The artifact's bytes, as loaded.
    pub fn artifact(&self) -> &[u8] {
        self.artifact
    }
}
