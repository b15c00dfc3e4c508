//! `kiln-run`: loads a `.kiln` artifact with the runtime alone (no compiler crates),
//! runs an entry point on `.npy` inputs (or seeded random ones) and reports each output.
//!
//! ```text
//! kiln-run MODEL.kiln [--weights FILE] [--input NAME=FILE.npy ...] [--entry NAME]
//!                     [--output-dir DIR] [--iterations N] [--threads N]
//! ```
//!
//! One line per output on stdout (`name dtype [dims] min … max … mean …`); timing and
//! the thread count (`--threads`, default one per core) on stderr; outputs written as `DIR/<name>.npy` with characters outside
//! `[A-Za-z0-9._-]` replaced by `_`. Errors: one line on stderr, exit status 1.

extern crate alloc;

#[path = "../../kiln-runner-nostd/src/shared.rs"]
mod shared;

/// With the `mimalloc` feature, the runner's allocations (the artifact's buffers, the
/// runtime's tables at load, the arena) go to mimalloc instead of the C library's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use kiln_module::sections::TensorView;
use kiln_npy::DType;
use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::{Instance, Module, TensorRef};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use shared::{file_name, output_tensors, read_npy, zeroed, Input};

const USAGE: &str = "usage: kiln-run MODEL.kiln [--weights FILE] [--input NAME=FILE.npy ...] [--entry NAME] [--output-dir DIR] [--iterations N] [--threads N]";

#[derive(Debug, Default)]
struct Args {
    model: PathBuf,
    weights: Option<PathBuf>,
    inputs: Vec<(String, PathBuf)>,
    entry: Option<String>,
    output_dir: Option<PathBuf>,
    iterations: u64,
    /// `None`: one per core.
    threads: Option<usize>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args { iterations: 1, ..Args::default() };
    let mut model = None;
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--weights" => a.weights = Some(value("--weights")?.into()),
            "--entry" => a.entry = Some(value("--entry")?),
            "--output-dir" => a.output_dir = Some(value("--output-dir")?.into()),
            "--iterations" => {
                let v = value("--iterations")?;
                a.iterations =
                    v.parse().ok().filter(|&n| n > 0).ok_or(format!("--iterations {v}: need a positive integer"))?;
            }
            "--threads" => {
                let v = value("--threads")?;
                a.threads =
                    Some(v.parse().ok().filter(|&n| n > 0).ok_or(format!("--threads {v}: need a positive integer"))?);
            }
            "--input" => {
                let v = value("--input")?;
                let (name, file) = v.split_once('=').ok_or(format!("--input {v}: expected NAME=FILE.npy"))?;
                a.inputs.push((name.to_string(), file.into()));
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s} (see --help)")),
            _ if model.is_some() => return Err(format!("unexpected argument {arg} (see --help)")),
            _ => model = Some(PathBuf::from(arg)),
        }
    }
    a.model = model.ok_or(USAGE)?;
    Ok(a)
}

/// xorshift64*, seeded: the same "random" inputs every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// k/1024 for k uniform in -1024..1024: exact in f16, f32 and f64.
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) % 2048) as f32 / 1024.0 - 1.0
    }
}

fn f16_bits(x: f32) -> u16 {
    // Exact for the values `Rng::unit` produces (multiples of 2^-10 in [-1, 1)).
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    if x == 0.0 {
        return sign;
    }
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

fn f16_value(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((h >> 10) & 0x1f, f64::from(h & 0x3ff));
    sign * match e {
        0 => m * 2f64.powi(-24),
        31 if m == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + m / 1024.0) * 2f64.powi(i32::from(e) - 15),
    }
}

/// Seeded values for an input: floats in [-1, 1), integers in 0..4, bools 0/1, other
/// types zero. The module was verified: `bytes` is what the dtype and dims give.
fn random_input(t: &TensorView<'_>, rng: &mut Rng) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    out.try_reserve_exact(usize::try_from(t.bytes).unwrap_or(usize::MAX))
        .map_err(|_| format!("cannot allocate the {} bytes of input {}", t.bytes, t.name.escape_debug()))?;
    let n = t.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).unwrap_or(0);
    for _ in 0..n {
        match t.dtype {
            1 => out.extend(rng.unit().to_le_bytes()),
            11 => out.extend(f64::from(rng.unit()).to_le_bytes()),
            10 => out.extend(f16_bits(rng.unit()).to_le_bytes()),
            16 => out.extend(((rng.unit().to_bits() >> 16) as u16).to_le_bytes()),
            9 => out.push((rng.next() >> 63) as u8),
            2..=7 | 12 | 13 => {
                let v = (rng.next() >> 40) % 4;
                let width = DType::from_code(t.dtype).map_or(1, |d| d.bits() / 8);
                out.extend(&v.to_le_bytes()[..width]);
            }
            _ => {}
        }
    }
    out.resize(t.bytes as usize, 0);
    Ok(out)
}

/// Elements as f64, for the dtypes that have a plain numeric value.
fn values(dtype: u32, data: &[u8]) -> Option<Vec<f64>> {
    fn le<const N: usize>(c: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    }
    let bits = DType::from_code(dtype)?.bits();
    if bits < 8 {
        return None;
    }
    let chunks = data.chunks_exact(bits / 8);
    Some(match dtype {
        1 => chunks.map(|c| f64::from(f32::from_le_bytes(le(c)))).collect(),
        11 => chunks.map(|c| f64::from_le_bytes(le(c))).collect(),
        10 => chunks.map(|c| f16_value(u16::from_le_bytes(le(c)))).collect(),
        16 => chunks.map(|c| f64::from(f32::from_bits(u32::from(u16::from_le_bytes(le(c))) << 16))).collect(),
        2 | 9 => chunks.map(|c| f64::from(c[0])).collect(),
        3 => chunks.map(|c| f64::from(c[0] as i8)).collect(),
        4 => chunks.map(|c| f64::from(u16::from_le_bytes(le(c)))).collect(),
        5 => chunks.map(|c| f64::from(i16::from_le_bytes(le(c)))).collect(),
        6 => chunks.map(|c| f64::from(i32::from_le_bytes(le(c)))).collect(),
        7 => chunks.map(|c| i64::from_le_bytes(le(c)) as f64).collect(),
        12 => chunks.map(|c| f64::from(u32::from_le_bytes(le(c)))).collect(),
        13 => chunks.map(|c| u64::from_le_bytes(le(c)) as f64).collect(),
        _ => return None,
    })
}

/// One output as `kiln run` prints it: `NAME: f32[1,10] min … max … mean … [first four, ...]`,
/// integers as integers and booleans as `true`/`false`, NaNs counted.
fn summary(t: &TensorView<'_>, data: &[u8]) -> String {
    let dtype = DType::from_code(t.dtype);
    let name = dtype.map_or("?", DType::name);
    let dims = t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
    let float = matches!(t.dtype, 1 | 10 | 11 | 16);
    let show = |x: f64| {
        if t.dtype == 9 {
            (x != 0.0).to_string()
        } else if float {
            format!("{x:.6}")
        } else {
            format!("{x:.0}")
        }
    };
    let stats = match values(t.dtype, data) {
        Some(v) if !v.is_empty() => {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let nans = v.iter().filter(|x| x.is_nan()).count();
            let nans = if nans > 0 { format!(" nan {nans}") } else { String::new() };
            let head: Vec<String> = v.iter().take(4).map(|&x| show(x)).collect();
            let more = if v.len() > 4 { ", ..." } else { "" };
            format!("min {} max {} mean {mean:.6}{nans} [{}{more}]", show(min), show(max), head.join(", "))
        }
        Some(_) => "(empty)".to_string(),
        None => "(no statistics for this dtype)".to_string(),
    };
    format!("{}: {name}[{dims}] {stats}", t.name)
}

fn run(args: Args) -> Result<(), String> {
    let read = |p: &PathBuf| AlignedBytes::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let model = read(&args.model)?;
    let weights = args.weights.as_ref().map(read).transpose()?;
    let m = Module::load(model.bytes(), weights.as_ref().map(|w| w.bytes()))
        .map_err(|e| format!("{}: {e}", args.model.display()))?;
    let sig = m.signature();
    let entry = match &args.entry {
        Some(n) => sig.find(n).ok_or(format!("the module has no entry point {n}"))?,
        None => sig.default_entry().ok_or("the module has no entry points")?,
    };
    for (name, _) in &args.inputs {
        if !entry.inputs.iter().any(|t| t.name == name) {
            let names: Vec<_> = entry.inputs.iter().map(|t| t.name).collect();
            return Err(format!("--input {name}: {} has no such input (inputs: {})", entry.name, names.join(", ")));
        }
    }
    let mut rng = Rng(0x5EED_0FC0_FFEE);
    let mut arrays = Vec::with_capacity(entry.inputs.len());
    for t in entry.inputs {
        let a = match args.inputs.iter().find(|(n, _)| n == t.name) {
            Some((_, path)) => {
                let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                read_npy(&bytes, t.dtype).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => Input { dtype: t.dtype, dims: t.dims.clone(), data: random_input(t, &mut rng)? },
        };
        arrays.push(a);
    }
    let inputs: Vec<TensorRef<'_>> =
        arrays.iter().map(|a| TensorRef { dtype: a.dtype, dims: &a.dims, data: &a.data }).collect();
    let mut out_data: Vec<Vec<u8>> = entry
        .outputs
        .iter()
        .map(|t| zeroed(t.bytes, &format!("output {}", t.name.escape_debug())))
        .collect::<Result<_, _>>()?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut inst = Instance::with_threads(&m, threads).map_err(|e| e.to_string())?;
    // What the plan computes from constants alone runs once, before the timed calls.
    inst.prepare(entry.index).map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    times
        .try_reserve_exact(usize::try_from(args.iterations).unwrap_or(usize::MAX))
        .map_err(|_| format!("--iterations {}: cannot hold that many timings", args.iterations))?;
    for _ in 0..args.iterations {
        let mut outputs = output_tensors(entry.outputs, &mut out_data);
        let t0 = Instant::now();
        inst.invoke_tensors(entry.index, &inputs, &mut outputs).map_err(|e| e.to_string())?;
        times.push(t0.elapsed());
    }
    for (t, d) in entry.outputs.iter().zip(&out_data) {
        println!("{}", summary(t, d));
    }
    times.sort();
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    eprintln!(
        "{} iteration(s) on {threads} thread(s): median {:.1} us, min {:.1} us, max {:.1} us",
        times.len(),
        us(times[times.len() / 2]),
        us(times[0]),
        us(times[times.len() - 1])
    );
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (t, d) in entry.outputs.iter().zip(&out_data) {
            let path = dir.join(file_name(t.name));
            match DType::from_code(t.dtype).map(|dt| kiln_npy::write(dt, &t.dims, d)) {
                Some(Ok(bytes)) => std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?,
                Some(Err(e)) => eprintln!("{}: not written: {e}", path.display()),
                None => eprintln!("{}: not written: unknown dtype code {}", path.display(), t.dtype),
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match parse_args(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln-run: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_sanitised() {
        assert_eq!(file_name("logits"), "logits.npy");
        assert_eq!(file_name("/fc2/Gemm_output:0"), "_fc2_Gemm_output_0.npy");
        assert_eq!(file_name("a b.c-d_é"), "a_b.c-d__.npy");
    }

    #[test]
    fn arguments() {
        let a = parse_args(
            [
                "m.kiln",
                "--weights",
                "w.bin",
                "--input",
                "x=x.npy",
                "--input",
                "y=a=b.npy",
                "--iterations",
                "3",
                "--output-dir",
                "o",
                "--threads",
                "2",
            ]
            .map(String::from)
            .into_iter(),
        )
        .expect("parse");
        assert_eq!(a.model, PathBuf::from("m.kiln"));
        assert_eq!(a.weights, Some(PathBuf::from("w.bin")));
        assert_eq!(a.inputs, [("x".to_string(), PathBuf::from("x.npy")), ("y".to_string(), PathBuf::from("a=b.npy"))]);
        assert_eq!((a.iterations, a.output_dir, a.threads), (3, Some(PathBuf::from("o")), Some(2)));
        assert_eq!(parse_args(["m"].map(String::from).into_iter()).expect("parse").threads, None);
        let err = |v: &[&str]| parse_args(v.iter().map(|s| s.to_string())).unwrap_err();
        assert!(err(&[]).starts_with("usage"));
        assert!(err(&["m", "--iterations", "0"]).contains("positive"));
        assert!(err(&["m", "--threads", "0"]).contains("--threads 0: need a positive"));
        assert!(err(&["m", "--input", "x"]).contains("NAME=FILE"));
        assert!(err(&["m", "--bogus"]).contains("unknown option --bogus"));
        assert!(err(&["m", "--weights"]).contains("needs a value"));
    }

    #[test]
    fn half_precision_by_hand() {
        // 1.0 = 0x3c00, -0.5 = 0xb800, 2^-10 = 0x1400 (exponent 5, mantissa 0).
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-0.5), 0xb800);
        assert_eq!(f16_bits(1.0 / 1024.0), 0x1400);
        assert_eq!(f16_value(0x3c00), 1.0);
        assert_eq!(f16_value(0x0001), 2f64.powi(-24));
        assert_eq!(f16_value(0xfc00), f64::NEG_INFINITY);
        let mut r = Rng(1);
        for _ in 0..1000 {
            let x = r.unit();
            assert!((-1.0..1.0).contains(&x));
            assert_eq!(f16_value(f16_bits(x)), f64::from(x), "{x}");
        }
    }
}
