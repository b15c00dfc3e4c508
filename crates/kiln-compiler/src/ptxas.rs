//! The CUDA target's cubin: the module's PTX assembled by NVIDIA's `ptxas` for
//! `sm_90a` at compile time, shipped beside the PTX.
//!
//! A GPU driver JIT-compiles PTX when it loads it (7 ms for one small kernel, ~0.5 s for
//! an unrolled wgmma kernel on the lent H200), while a cubin of the same code loads in
//! 0.03–0.2 ms. So when a `ptxas` is at hand ([`Options::ptxas`](crate::Options)), the
//! [`Stage::Codegen`](crate::Stage) stage of a CUDA compilation runs
//! `ptxas -arch=sm_90a -v` on the PTX module and the artifact carries two CUDA
//! executables: the PTX (executable 0) and the cubin (executable 1, features
//! [`CUDA_CUBIN_SM90A`], entries named as the PTX's, in the same order, at offset 0: a
//! driver finds a cubin's kernel by name). Every kernel gets two variants, the cubin
//! first: a runtime takes the cubin and falls back to the PTX where the device or its
//! driver cannot load it.
//!
//! [`find`] looks a `ptxas` up ([`CubinMode`]: `kiln compile --cubin auto|off|require`):
//! `$KILN_PTXAS` (when set, only it), then `ptxas` in each directory of `$PATH`, then
//! `$CUDA_HOME/bin/ptxas`, `$CUDA_PATH/bin/ptxas` and `/usr/local/cuda/bin/ptxas`, the
//! places a CUDA toolkit or the `nvidia-cuda-nvcc` wheel's `bin` put it. The `-v`
//! report (registers, shared memory, stack frame, spills per entry) is kept on the
//! result ([`Cubin::resources`]): the cubin itself does not record spills.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kiln_codegen::cuda::cubin;
pub use kiln_codegen::cuda::cubin::{read as read_cubin, CubinError, CubinInfo, CubinKernel};
use kiln_codegen::cuda::CudaModule;
use kiln_module::program::{Executable, CUDA_CUBIN_SM90A};

/// The architecture the cubin is assembled for: Hopper with its architecture-specific
/// features (wgmma, setmaxnreg), as the PTX's `.target` says.
pub const ARCH: &str = "sm_90a";

/// Whether a CUDA compilation ships a cubin (`--cubin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CubinMode {
    /// When a `ptxas` is found; PTX only otherwise.
    #[default]
    Auto,
    /// Never: PTX only.
    Off,
    /// Always: no `ptxas` found is an error.
    Require,
}

/// Why the cubin could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxasError {
    /// No `ptxas` where [`find`] looked (or `$KILN_PTXAS` names a file that is not there).
    #[error(
        "no ptxas found (looked at {}); install the CUDA toolkit or the nvidia-cuda-nvcc wheel, \
         set KILN_PTXAS to its ptxas, or compile without a cubin (--cubin off)",
        list(looked)
    )]
    NotFound {
        /// Every path tried, in order.
        looked: Vec<PathBuf>,
    },
    /// The `ptxas` could not be started.
    #[error("cannot run ptxas `{}`: {error}", path.display())]
    Run {
        /// The binary.
        path: PathBuf,
        /// What the system said.
        error: String,
    },
    /// A scratch file in the temporary directory could not be written or read.
    #[error("ptxas scratch file `{}`: {error}", path.display())]
    Scratch {
        /// The file.
        path: PathBuf,
        /// What the system said.
        error: String,
    },
    /// `ptxas` refused the PTX (every kernel kiln writes is assembled by ptxas in its
    /// tests: a bug).
    #[error("ptxas refused the PTX (exit status {status:?}): {stderr}")]
    Failed {
        /// Its exit status (`None`: killed by a signal).
        status: Option<i32>,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The file `ptxas` wrote is not a cubin kiln can read, or its kernels are not the
    /// PTX's entries (a bug, or a `ptxas` that is not NVIDIA's).
    #[error("the cubin from ptxas: {0}")]
    Cubin(String),
}

impl PtxasError {
    /// Whether this is a bug in kiln (ptxas refused kiln's PTX, or wrote something else
    /// than its entries) rather than a missing or broken tool.
    pub fn is_internal(&self) -> bool {
        matches!(self, PtxasError::Failed { .. } | PtxasError::Cubin(_))
    }
}

fn list(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Looks a `ptxas` up in this process's environment (see the module's doc for the
/// order): `Ok(None)` when `mode` is [`CubinMode::Off`] or, with [`CubinMode::Auto`],
/// when none is found.
pub fn find(mode: CubinMode) -> Result<Option<PathBuf>, PtxasError> {
    find_with(mode, &|name| std::env::var_os(name), &|p| p.is_file())
}

/// [`find`] with the environment and the file test given (for tests).
pub fn find_with(
    mode: CubinMode,
    env: &dyn Fn(&str) -> Option<OsString>,
    is_file: &dyn Fn(&Path) -> bool,
) -> Result<Option<PathBuf>, PtxasError> {
    if mode == CubinMode::Off {
        return Ok(None);
    }
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    if let Some(p) = set("KILN_PTXAS") {
        // Named explicitly: that one or an error, whatever the mode; a misspelt path
        // should not quietly ship PTX only.
        let p = PathBuf::from(p);
        return if is_file(&p) { Ok(Some(p)) } else { Err(PtxasError::NotFound { looked: vec![p] }) };
    }
    let mut looked = Vec::new();
    if let Some(path) = set("PATH") {
        looked.extend(std::env::split_paths(&path).map(|d| d.join("ptxas")));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = set(var) {
            looked.push(PathBuf::from(home).join("bin/ptxas"));
        }
    }
    looked.push(PathBuf::from("/usr/local/cuda/bin/ptxas"));
    if let Some(p) = looked.iter().find(|p| is_file(p)) {
        return Ok(Some(p.clone()));
    }
    match mode {
        CubinMode::Require => Err(PtxasError::NotFound { looked }),
        _ => Ok(None),
    }
}

/// What `ptxas -v` reports for one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Named barriers used.
    pub barriers: u32,
    /// Bytes of static shared memory per block (`N bytes smem`; 0 when not said).
    pub shared: u32,
    /// Bytes of stack frame per thread.
    pub stack: u32,
    /// Bytes of spill stores per thread.
    pub spill_stores: u32,
    /// Bytes of spill loads per thread.
    pub spill_loads: u32,
}

/// The entries of a `ptxas -v` report (its stderr) with what each uses, in report
/// order. A report reads, per entry:
///
/// ```text
/// ptxas info    : Compiling entry function 'k0' for 'sm_90a'
/// ptxas info    : Function properties for k0
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem
/// ```
///
/// `Function properties` also comes for ptxas's own helper functions (not entries):
/// only names announced by `Compiling entry function` are kept. Lines it does not
/// know are skipped.
pub fn parse_report(text: &str) -> Vec<(String, Resources)> {
    let mut out: Vec<(String, Resources)> = Vec::new();
    // The entry the `Used …` line belongs to, and the function the properties line does.
    let mut entry: Option<usize> = None;
    let mut props: Option<String> = None;
    for line in text.lines() {
        let body = line.split_once(": ").map_or(line, |(_, b)| b).trim();
        if let Some(rest) = body.strip_prefix("Compiling entry function '") {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push((name, Resources::default()));
            entry = Some(out.len() - 1);
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            props = Some(name.trim().to_string());
        } else if line.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit()) && line.contains("stack frame") {
            let Some(i) = props.as_ref().and_then(|p| out.iter().position(|(n, _)| n == p)) else { continue };
            read_fields(line, &mut out[i].1, &FRAME_FIELDS);
        } else if let Some(rest) = body.strip_prefix("Used ") {
            let Some(i) = entry else { continue };
            read_fields(rest, &mut out[i].1, &USED_FIELDS);
        }
    }
    out
}

/// A field of [`Resources`] and the words that name it in a report line's
/// comma-separated parts (`0 bytes spill stores`, `used 1 barriers`).
type Field = (&'static str, fn(&mut Resources) -> &mut u32);

/// The fields of a `Function properties` line (the one after it).
const FRAME_FIELDS: [Field; 3] = [
    ("stack frame", |r| &mut r.stack),
    ("spill stores", |r| &mut r.spill_stores),
    ("spill loads", |r| &mut r.spill_loads),
];

/// The fields of a `Used …` line.
const USED_FIELDS: [Field; 3] =
    [("registers", |r| &mut r.registers), ("barriers", |r| &mut r.barriers), ("smem", |r| &mut r.shared)];

/// Sets the fields of `r` that the parts of `list` name (the first field whose words a
/// part contains) to the part's number; parts that name none are skipped.
fn read_fields(list: &str, r: &mut Resources, fields: &[Field]) {
    for part in list.split(',') {
        if let Some((_, field)) = fields.iter().find(|(words, _)| part.contains(words)) {
            *field(r) = number(part);
        }
    }
}

/// The first number in `s` (0 when there is none).
fn number(s: &str) -> u32 {
    s.split(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).and_then(|w| w.parse().ok()).unwrap_or(0)
}

/// The cubin of a CUDA compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cubin {
    /// The cubin as a CUDA executable ([`CUDA_CUBIN_SM90A`]; entries as the PTX's).
    pub executable: Executable,
    /// Per kernel, in the PTX's entry order: what `ptxas -v` reported for it (`None`:
    /// the report did not name it).
    pub resources: Vec<Option<Resources>>,
    /// How long `ptxas` ran (part of the codegen stage's time).
    pub ptxas_time: Duration,
}

/// Assembles `module`'s PTX with `ptxas` for [`ARCH`] and checks that the cubin's
/// kernels are exactly the PTX's entries.
pub fn assemble(ptxas: &Path, module: &CudaModule) -> Result<Cubin, PtxasError> {
    let scratch = Scratch::new()?;
    let mut f = std::fs::File::create_new(&scratch.ptx)
        .map_err(|e| PtxasError::Scratch { path: scratch.ptx.clone(), error: e.to_string() })?;
    f.write_all(&module.executable.code)
        .map_err(|e| PtxasError::Scratch { path: scratch.ptx.clone(), error: e.to_string() })?;
    drop(f);
    let t = Instant::now();
    let out = Command::new(ptxas)
        .arg(format!("-arch={ARCH}"))
        .arg("-v")
        .arg("-o")
        .arg(&scratch.cubin)
        .arg(&scratch.ptx)
        .output()
        .map_err(|e| PtxasError::Run { path: ptxas.to_path_buf(), error: e.to_string() })?;
    let ptxas_time = t.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(PtxasError::Failed { status: out.status.code(), stderr: stderr.trim().to_string() });
    }
    let code = std::fs::read(&scratch.cubin)
        .map_err(|e| PtxasError::Scratch { path: scratch.cubin.clone(), error: e.to_string() })?;
    let info = cubin::read(&code).map_err(|e| PtxasError::Cubin(e.to_string()))?;
    let names: Vec<&str> = module.executable.entries.iter().map(|(n, _)| n.as_str()).collect();
    let mut found: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut wanted = names.clone();
    found.sort_unstable();
    wanted.sort_unstable();
    if found != wanted {
        return Err(PtxasError::Cubin(format!("kernels {found:?}, but the PTX's entries are {wanted:?}")));
    }
    let report = parse_report(&stderr);
    let resources =
        names.iter().map(|n| report.iter().find(|(r, _)| r == n).map(|(_, r)| *r)).collect::<Vec<Option<Resources>>>();
    Ok(Cubin {
        // Everything else (device, no relocations, what each entry's launch is) as the
        // PTX executable's: the same kernels in another form.
        executable: Executable {
            features: CUDA_CUBIN_SM90A,
            code,
            entries: names.iter().map(|n| (n.to_string(), 0)).collect(),
            ..module.executable.clone()
        },
        resources,
        ptxas_time,
    })
}

/// Two scratch files in the temporary directory, named uniquely for this process and
/// call, removed when dropped (also on errors).
struct Scratch {
    ptx: PathBuf,
    cubin: PathBuf,
}

impl Scratch {
    fn new() -> Result<Scratch, PtxasError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let stem = format!("kiln-ptxas-{}-{n}-{nanos:08x}", std::process::id());
        let dir = std::env::temp_dir();
        Ok(Scratch { ptx: dir.join(format!("{stem}.ptx")), cubin: dir.join(format!("{stem}.cubin")) })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ptx);
        let _ = std::fs::remove_file(&self.cubin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as ptxas 13.0 writes it for sm_90a, with a helper function's
    /// properties between two entries.
    const REPORT: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1_0' for 'sm_90a'
ptxas info    : Function properties for k1_0
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 82.316 ms
ptxas info    : Function properties for $__internal_0_$__cuda_sm20_div_u64
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k0_0_pad' for 'sm_90a'
ptxas info    : Function properties for k0_0_pad
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
";

    #[test]
    fn the_report_gives_each_entry_its_resources() {
        let r = parse_report(REPORT);
        assert_eq!(
            r,
            vec![
                (
                    "k1_0".to_string(),
                    Resources { registers: 24, barriers: 1, shared: 1024, stack: 8, spill_stores: 4, spill_loads: 12 }
                ),
                ("k0_0_pad".to_string(), Resources { registers: 32, ..Resources::default() }),
            ]
        );
        assert!(parse_report("garbage\n: : :\n    1 bytes stack frame").is_empty());
    }

    #[test]
    fn lookup_order_and_errors() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |n: &str| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| OsString::from(v))
        };
        let exists = |have: &'static [&'static str]| move |p: &Path| have.iter().any(|h| Path::new(h) == p);
        // Off never looks.
        assert_eq!(find_with(CubinMode::Off, &env(&[("KILN_PTXAS", "/x")]), &exists(&[])), Ok(None));
        // KILN_PTXAS alone decides, and a missing one is an error even in auto.
        let named = env(&[("KILN_PTXAS", "/opt/p"), ("PATH", "/bin")]);
        assert_eq!(find_with(CubinMode::Auto, &named, &exists(&["/opt/p", "/bin/ptxas"])), Ok(Some("/opt/p".into())));
        assert_eq!(
            find_with(CubinMode::Auto, &named, &exists(&["/bin/ptxas"])),
            Err(PtxasError::NotFound { looked: vec!["/opt/p".into()] })
        );
        // Then PATH in order, then CUDA_HOME, CUDA_PATH, /usr/local/cuda.
        let vars = env(&[("PATH", "/a:/b"), ("CUDA_HOME", "/cuda"), ("CUDA_PATH", "/cp")]);
        assert_eq!(
            find_with(CubinMode::Auto, &vars, &exists(&["/b/ptxas", "/cuda/bin/ptxas"])),
            Ok(Some("/b/ptxas".into()))
        );
        assert_eq!(find_with(CubinMode::Auto, &vars, &exists(&["/cp/bin/ptxas"])), Ok(Some("/cp/bin/ptxas".into())));
        assert_eq!(find_with(CubinMode::Auto, &vars, &exists(&[])), Ok(None));
        let e = find_with(CubinMode::Require, &vars, &exists(&[])).expect_err("require without ptxas");
        let want: Vec<PathBuf> =
            ["/a/ptxas", "/b/ptxas", "/cuda/bin/ptxas", "/cp/bin/ptxas", "/usr/local/cuda/bin/ptxas"]
                .map(PathBuf::from)
                .into();
        assert_eq!(e, PtxasError::NotFound { looked: want });
        assert!(e.to_string().contains("/a/ptxas, /b/ptxas, /cuda/bin/ptxas"), "{e}");
        assert!(!e.is_internal());
    }
}
