//! The calling convention between generated kernels and the runtime.
//!
//! Every kernel entry point is a C-ABI function (System V on x86-64)
//!
//! ```text
//! extern "C" fn kernel(bindings: *const *mut u8, helpers: *const HelperFn, begin: u64, end: u64)
//! ```
//!
//! - `bindings[i]` is the address of the kernel's binding `i` (its inputs in order, then
//!   its output), resolved by the runtime from the plan's `(slot, offset, length)`.
//! - `helpers` is the runtime's [`Helper`] table: entry `h as usize` is the address of
//!   the function [`Helper`] documents. Kernels call helpers indirectly through it, so
//!   code carries no relocations against the runtime.
//! - `begin..end` is the range of workgroups to run; the plan records each dispatch's
//!   workgroup count, and a driver may split that range across threads.
//!
//! Bumping the order or signatures of helpers is an ABI change ([`ABI_VERSION`]).

use crate::format::Version;

/// The kernel ABI this crate describes; artifacts record the one they need.
pub const ABI_VERSION: Version = Version { major: 1, minor: 0 };

/// An untyped helper address (cast to the signature [`Helper`] documents).
pub type HelperFn = unsafe extern "C" fn();

macro_rules! helpers {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Functions the runtime provides to kernels, by position in the table.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Helper { $($(#[$doc])* $name),* }

        impl Helper {
            /// Every helper, in table order.
            pub const ALL: &'static [Helper] = &[$(Helper::$name),*];

            /// Name, for listings.
            pub fn name(self) -> &'static str {
                match self { $(Helper::$name => stringify!($name)),* }
            }
        }
    };
}

helpers! {
    /// `fn(f32) -> f32`: e^x.
    ExpF32,
    /// `fn(f32) -> f32`: natural logarithm.
    LogF32,
    /// `fn(f32) -> f32`.
    TanhF32,
    /// `fn(f32) -> f32`: error function.
    ErfF32,
    /// `fn(f32) -> f32`.
    SinF32,
    /// `fn(f32) -> f32`.
    CosF32,
    /// `fn(f32) -> f32`.
    TanF32,
    /// `fn(f32) -> f32`.
    AsinF32,
    /// `fn(f32) -> f32`.
    AcosF32,
    /// `fn(f32) -> f32`.
    AtanF32,
    /// `fn(f32) -> f32`.
    SinhF32,
    /// `fn(f32) -> f32`.
    CoshF32,
    /// `fn(f32) -> f32`.
    AsinhF32,
    /// `fn(f32) -> f32`.
    AcoshF32,
    /// `fn(f32) -> f32`.
    AtanhF32,
    /// `fn(f32, f32) -> f32`: x^y.
    PowF32,
    /// `fn(f32, f32) -> f32`: C `fmod`.
    FmodF32,
    /// `fn(f64) -> f64`: e^x.
    ExpF64,
    /// `fn(f64) -> f64`.
    LogF64,
    /// `fn(f64) -> f64`.
    TanhF64,
    /// `fn(f64) -> f64`.
    ErfF64,
    /// `fn(f64) -> f64`.
    SinF64,
    /// `fn(f64) -> f64`.
    CosF64,
    /// `fn(f64) -> f64`.
    TanF64,
    /// `fn(f64) -> f64`.
    AsinF64,
    /// `fn(f64) -> f64`.
    AcosF64,
    /// `fn(f64) -> f64`.
    AtanF64,
    /// `fn(f64) -> f64`.
    SinhF64,
    /// `fn(f64) -> f64`.
    CoshF64,
    /// `fn(f64) -> f64`.
    AsinhF64,
    /// `fn(f64) -> f64`.
    AcoshF64,
    /// `fn(f64) -> f64`.
    AtanhF64,
    /// `fn(f64, f64) -> f64`.
    PowF64,
    /// `fn(f64, f64) -> f64`: C `fmod`.
    FmodF64,
    /// `fn(u32 /* f16 bits */) -> f32`: exact widening.
    F16ToF32,
    /// `fn(f32) -> u32 /* f16 bits */`: round to nearest even (overflow gives ±inf).
    F32ToF16,
}

/// Number of entries in the helper table.
pub const HELPER_COUNT: usize = Helper::ALL.len();
