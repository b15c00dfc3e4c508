//! The helper table (see `kiln_module::abi`): the functions generated kernels reach
//! through their `helpers` argument, in [`Helper`] order.
//!
//! Transcendentals are `libm`'s (the same functions the kernel interpreter uses, so
//! compiled kernels and the interpreter agree bit for bit); the f16 conversions are
//! written here (round to nearest even, NaN stays NaN). Everything is `no_std`.

use kiln_module::abi::{Helper, HelperFn, HELPER_COUNT};

macro_rules! unary {
    ($($name:ident => $f:path, $t:ty;)*) => {$(
        #[doc = concat!("`", stringify!($f), "` with the C ABI.")]
        pub extern "C" fn $name(x: $t) -> $t {
            $f(x)
        }
    )*};
}

macro_rules! binary {
    ($($name:ident => $f:path, $t:ty;)*) => {$(
        #[doc = concat!("`", stringify!($f), "` with the C ABI.")]
        pub extern "C" fn $name(x: $t, y: $t) -> $t {
            $f(x, y)
        }
    )*};
}

unary! {
    exp_f32 => libm::expf, f32;
    log_f32 => libm::logf, f32;
    tanh_f32 => libm::tanhf, f32;
    erf_f32 => libm::erff, f32;
    sin_f32 => libm::sinf, f32;
    cos_f32 => libm::cosf, f32;
    tan_f32 => libm::tanf, f32;
    asin_f32 => libm::asinf, f32;
    acos_f32 => libm::acosf, f32;
    atan_f32 => libm::atanf, f32;
    sinh_f32 => libm::sinhf, f32;
    cosh_f32 => libm::coshf, f32;
    asinh_f32 => libm::asinhf, f32;
    acosh_f32 => acoshf, f32;
    atanh_f32 => libm::atanhf, f32;
    exp_f64 => libm::exp, f64;
    log_f64 => libm::log, f64;
    tanh_f64 => libm::tanh, f64;
    erf_f64 => libm::erf, f64;
    sin_f64 => libm::sin, f64;
    cos_f64 => libm::cos, f64;
    tan_f64 => libm::tan, f64;
    asin_f64 => libm::asin, f64;
    acos_f64 => libm::acos, f64;
    atan_f64 => libm::atan, f64;
    sinh_f64 => libm::sinh, f64;
    cosh_f64 => libm::cosh, f64;
    asinh_f64 => libm::asinh, f64;
    acosh_f64 => acosh, f64;
    atanh_f64 => libm::atanh, f64;
}

/// acosh is undefined below 1 (libm returns finite values for some such inputs).
fn acoshf(x: f32) -> f32 {
    if x < 1.0 {
        f32::NAN
    } else {
        libm::acoshf(x)
    }
}

/// See [`acoshf`].
fn acosh(x: f64) -> f64 {
    if x < 1.0 {
        f64::NAN
    } else {
        libm::acosh(x)
    }
}

binary! {
    pow_f32 => libm::powf, f32;
    fmod_f32 => libm::fmodf, f32;
    pow_f64 => libm::pow, f64;
    fmod_f64 => libm::fmod, f64;
}

/// Widens the f16 in the low 16 bits of `h` to f32 (exact; a NaN stays a quiet NaN
/// with its payload's high bits).
pub extern "C" fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    let bits = if exp == 0x1f {
        if man == 0 {
            sign | 0x7f80_0000
        } else {
            sign | 0x7fc0_0000 | (man << 13)
        }
    } else if exp == 0 {
        // Zero or subnormal: man · 2^-24, exact in f32.
        let mag = man as f32 * f32::from_bits(0x3380_0000);
        sign | mag.to_bits()
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Rounds `x` to the nearest f16 (ties to even; beyond the largest finite value gives
/// ±inf; a NaN gives a quiet NaN), as bits in the low 16 bits of the result.
pub extern "C" fn f32_to_f16(x: f32) -> u32 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7e00 | ((abs >> 13) & 0x3ff);
    }
    // 65520 (= 0x477ff000) is halfway between 65504, the largest f16, and 2^16; the
    // tie goes to the even neighbour, which is infinity.
    if abs >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    if abs < 0x3880_0000 {
        // Below the smallest normal f16 (2^-14): a multiple of 2^-24. Adding 0.5 puts
        // the value where one f32 ulp is 2^-24, so the hardware rounds it to nearest
        // even, and the low mantissa bits are the f16 subnormal's (0x400 carries into
        // the smallest normal, which is its correct encoding).
        let sum = f32::from_bits(abs) + 0.5;
        return sign | (sum.to_bits() - 0x3f00_0000);
    }
    // Normal: rebias the exponent (127 → 15) and round the 13 dropped bits to nearest
    // even; a carry out of the mantissa correctly bumps the exponent.
    let odd = (abs >> 13) & 1;
    let rounded = abs.wrapping_sub((127 - 15) << 23) + 0xfff + odd;
    sign | (rounded >> 13)
}

macro_rules! table {
    ($($name:ident as $sig:ty),* $(,)?) => {
        /// The helper table, in [`Helper`] order (entry `h as usize` is helper `h`).
        pub static HELPERS: [HelperFn; HELPER_COUNT] = [$(
            // SAFETY: a function pointer is one code address whatever its signature;
            // the table stores it untyped and generated code calls it only with the
            // signature `Helper` documents for this entry, which is `$sig`.
            unsafe { core::mem::transmute::<$sig, HelperFn>($name) }
        ),*];
    };
}

type F32Fn = extern "C" fn(f32) -> f32;
type F64Fn = extern "C" fn(f64) -> f64;
type F32F32Fn = extern "C" fn(f32, f32) -> f32;
type F64F64Fn = extern "C" fn(f64, f64) -> f64;

table! {
    exp_f32 as F32Fn,
    log_f32 as F32Fn,
    tanh_f32 as F32Fn,
    erf_f32 as F32Fn,
    sin_f32 as F32Fn,
    cos_f32 as F32Fn,
    tan_f32 as F32Fn,
    asin_f32 as F32Fn,
    acos_f32 as F32Fn,
    atan_f32 as F32Fn,
    sinh_f32 as F32Fn,
    cosh_f32 as F32Fn,
    asinh_f32 as F32Fn,
    acosh_f32 as F32Fn,
    atanh_f32 as F32Fn,
    pow_f32 as F32F32Fn,
    fmod_f32 as F32F32Fn,
    exp_f64 as F64Fn,
    log_f64 as F64Fn,
    tanh_f64 as F64Fn,
    erf_f64 as F64Fn,
    sin_f64 as F64Fn,
    cos_f64 as F64Fn,
    tan_f64 as F64Fn,
    asin_f64 as F64Fn,
    acos_f64 as F64Fn,
    atan_f64 as F64Fn,
    sinh_f64 as F64Fn,
    cosh_f64 as F64Fn,
    asinh_f64 as F64Fn,
    acosh_f64 as F64Fn,
    atanh_f64 as F64Fn,
    pow_f64 as F64F64Fn,
    fmod_f64 as F64F64Fn,
    f16_to_f32 as extern "C" fn(u32) -> f32,
    f32_to_f16 as extern "C" fn(f32) -> u32,
}

/// The name of each table entry's implementation, in table order (checked against
/// [`Helper::ALL`] by the tests, so the two orders cannot drift apart).
pub const HELPER_NAMES: [&str; HELPER_COUNT] = [
    "ExpF32", "LogF32", "TanhF32", "ErfF32", "SinF32", "CosF32", "TanF32", "AsinF32", "AcosF32", "AtanF32", "SinhF32",
    "CoshF32", "AsinhF32", "AcoshF32", "AtanhF32", "PowF32", "FmodF32", "ExpF64", "LogF64", "TanhF64", "ErfF64",
    "SinF64", "CosF64", "TanF64", "AsinF64", "AcosF64", "AtanF64", "SinhF64", "CoshF64", "AsinhF64", "AcoshF64",
    "AtanhF64", "PowF64", "FmodF64", "F16ToF32", "F32ToF16",
];

/// The address of helper `h` in [`HELPERS`].
pub fn helper(h: Helper) -> HelperFn {
    HELPERS[h as usize]
}
