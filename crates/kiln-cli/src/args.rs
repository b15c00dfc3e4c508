//! The command line's grammar: one `clap` (derive) struct per command.
//!
//! Values are parsed here where the syntax alone decides (`NAME=DIMS`, counts); checks that
//! need the model or the artifact stay in the commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kiln_import::{parse_input_sequence, parse_input_shape, parse_input_shape_bounded, parse_input_value};

/// `kiln --version`: the compiler, the artifact format it writes and the kernel ABI.
pub(crate) fn version() -> String {
    format!(
        "{} (artifact format {}, kernel ABI {})",
        env!("CARGO_PKG_VERSION"),
        kiln_module::format::FORMAT_VERSION,
        kiln_module::abi::ABI_VERSION
    )
}

/// kiln: an ahead-of-time compiler and runtime for ML inference.
#[derive(Parser)]
#[command(
    name = "kiln",
    version = version(),
    about = "kiln: an ahead-of-time compiler and runtime for ML inference",
    after_help = "MODEL is an .onnx file, a .tflite file or a .kir file (kiln IR text form); ARTIFACT is a .kiln file.\n\
                  Errors are one line on stderr and exit status 1.",
    disable_help_subcommand = true
)]
pub(crate) struct Cli {
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Every command.
#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Compile a model into a .kiln artifact (or a linkable object or C array)
    #[command(after_help = "Examples:\n  \
        kiln compile resnet50.onnx -o resnet50.kiln --input-shape input=1x3x224x224\n  \
        kiln compile lenet.onnx -o lenet.o --emit object --symbol lenet\n  \
        kiln compile mlp.onnx --to flow")]
    Compile(CompileArgs),
    /// Run an artifact (or a model, compiled in memory) once and summarise its outputs
    #[command(after_help = "Examples:\n  \
        kiln run lenet.kiln --input input=digit.npy --output-dir out\n  \
        kiln run model.onnx --input-shape x=1x16 --seed 3\n  \
        kiln run lenet.kiln --device cuda")]
    Run(RunArgs),
    /// List an artifact's sections, signature, plan and memory map
    #[command(after_help = "Examples:\n  \
        kiln inspect lenet.kiln\n  \
        kiln inspect lenet.kiln --json\n  \
        kiln inspect lenet.kiln --dispatch-graph | dot -Tsvg > plan.svg")]
    Inspect(InspectArgs),
    /// Time invoke: median, p99, stddev and p99/median of the per-call times
    #[command(after_help = "Examples:\n  \
        kiln bench lenet.kiln --threads 1 --iterations 1000\n  \
        kiln bench lenet.kiln --json\n  \
        kiln bench resnet50.kiln --profile\n  \
        kiln bench lenet.kiln --device cuda --json\n\n\
        KILN_PERF_MAP=1 kiln bench ... writes /tmp/perf-PID.map so `perf report` names each kernel.")]
    Bench(BenchArgs),
    /// Print a model's tensor-level IR
    #[command(after_help = "Examples:\n  \
        kiln import model.onnx --input-shape input=1x3x224x224\n  \
        kiln import model.onnx --passes default")]
    Import(ImportArgs),
    /// Run a model through the reference evaluator
    #[command(after_help = "Examples:\n  \
        kiln eval model.onnx --input x=x.npy --output-dir ref\n  \
        kiln eval model.onnx --seed 7")]
    Eval(EvalArgs),
    /// Run ONNX's operator test cases, each in a child process
    #[command(after_help = "Examples:\n  \
        kiln conformance .cache/onnx-node\n  \
        kiln conformance .cache/onnx-node --engine reference --filter conv -v\n  \
        kiln conformance .cache/onnx-node --device cuda")]
    Conformance(ConformanceArgs),
    /// Run a model on the GPU kernel by kernel against the kernel interpreter
    #[command(
        name = "gpu-check",
        after_help = "Compiles MODEL for CUDA, runs its plan one command at a time on GPU 0 and \
        compares each dispatch's output with the kernel interpreter's on the same inputs: one \
        line per dispatch, failures again at the end; exit status 1 when any differs.\n\n\
        Examples:\n  \
        kiln gpu-check mobilenet_v2.onnx --input-shape input=1x3x224x224\n  \
        kiln gpu-check lenet.onnx --dispatch 3\n  \
        kiln gpu-check bert_tiny.onnx --precision bf16"
    )]
    GpuCheck(GpuCheckArgs),
    /// List the tensor-level passes (the names --passes takes)
    #[command(after_help = "Example:\n  kiln list-passes")]
    ListPasses,
    /// Print a shell completion script
    #[command(after_help = "Examples:\n  \
        kiln completions bash > /etc/bash_completion.d/kiln\n  \
        kiln completions zsh > ~/.zfunc/_kiln")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// One conformance case, reported as one line (used by `kiln conformance`)
    #[command(hide = true)]
    ConformanceCase {
        /// The case's directory.
        case: PathBuf,
        /// The engine.
        #[arg(long, value_enum, default_value_t = Engine::Compiled)]
        engine: Engine,
    },
}

/// `--input-shape` and `--input-value`: how a model's inputs are bound at import.
#[derive(Args, Clone, Default)]
pub(crate) struct BindArgs {
    /// Bind free input dimensions, e.g. input=1x3x224x224; a range MIN..MAX bounds a
    /// dimension chosen per call, e.g. ids=1x1..512 (repeatable)
    #[arg(long = "input-shape", value_name = "NAME=DIMS", value_parser = parse_input_shape_bounded)]
    pub input_shape: Vec<(String, Vec<usize>, Vec<(usize, usize)>)>,
    /// Make an input a constant, so what it feeds folds; one value fills the input,
    /// e.g. sr=16000 (repeatable)
    #[arg(long = "input-value", value_name = "NAME=V[,V...]", value_parser = parse_input_value)]
    pub input_value: Vec<(String, Vec<f64>)>,
    /// Give a sequence input's length and element shapes, e.g. frames=3x4;3x4; it
    /// is fed as one tensor per element, `frames[0]`, `frames[1]`, … (repeatable)
    #[arg(long = "input-sequence", value_name = "NAME=DIMS;DIMS;...", value_parser = parse_input_sequence)]
    pub input_sequence: Vec<(String, Vec<Vec<usize>>)>,
    /// Compile for an optional input given as empty (it then takes no tensor; repeatable)
    #[arg(long = "input-absent", value_name = "NAME")]
    pub input_absent: Vec<String>,
    /// Bound the trips of every Loop whose trip count is decided at run time (and cap
    /// constant ones): the loop is planned for at most N trips
    #[arg(long = "max-trips", value_name = "N")]
    pub max_trips: Option<usize>,
    /// Bound a data-dependent result (of NonZero, Compress, Unique, NonMaxSuppression,
    /// TopK with a run-time K) named NAME to N entries along its data-dependent axis:
    /// the plan is sized for N, and more at run time is an error (repeatable)
    #[arg(long = "max-dim", value_name = "NAME=N", value_parser = parse_max_dim)]
    pub max_dim: Vec<(String, usize)>,
    /// Declare the dims of a result that run-time data decides (a Resize with run-time
    /// scales), e.g. Y=1x3x64x64: the plan is compiled for them, and a call whose data
    /// gives other dims fails; without it the shape the model declares is used
    /// (repeatable)
    #[arg(long = "output-shape", value_name = "NAME=DIMS", value_parser = parse_input_shape)]
    pub output_shape: Vec<(String, Vec<usize>)>,
}

fn parse_max_dim(s: &str) -> Result<(String, usize), String> {
    let (name, n) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: expected NAME=N"))?;
    if name.is_empty() {
        return Err(format!("`{s}`: the name is empty"));
    }
    let n = n.trim().parse::<usize>().map_err(|_| format!("`{s}`: `{n}` is not a count"))?;
    Ok((name.to_string(), n))
}

/// Options for compiling a model: `compile`'s, and `run`/`inspect`/`bench`'s when given a model.
#[derive(Args, Clone, Default)]
pub(crate) struct ModelArgs {
    #[command(flatten)]
    pub bind: BindArgs,
    /// The CPU features the code may use: host, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4
    /// (adds AVX-512 tiles); or several levels, comma-separated (x86-64-v3,x86-64-v4): the
    /// artifact carries each level's code and runs the best one the host has
    #[arg(long = "target-cpu", value_name = "CPU")]
    pub target_cpu: Option<String>,
    /// The CPU architecture the code is for, as a target triple: x86_64-unknown-linux-gnu
    /// (default: this machine's), aarch64-unknown-linux-gnu (NEON) or
    /// riscv64gc-unknown-linux-gnu; the artifact runs only on a CPU of that architecture
    /// (with a runtime built for it)
    #[arg(long = "target-triple", value_name = "TRIPLE")]
    pub target_triple: Option<String>,
    /// The device the kernels are compiled for: cpu (default) or cuda (PTX for sm_90a;
    /// run it with --device cuda)
    #[arg(long = "target", value_name = "cpu|cuda")]
    pub target: Option<String>,
    /// speed, or size: no machine-code kernels, transcendentals through helpers
    #[arg(long, value_name = "speed|size")]
    pub opt: Option<String>,
    /// Storage of f32 tensors: f32 (default), or f16/bf16 weights and intermediates
    /// with f32 arithmetic (inputs and outputs stay f32)
    #[arg(long, value_name = "f32|f16|bf16")]
    pub precision: Option<String>,
    /// Keep each attention chain as its separate product, softmax and product kernels
    /// (by default a chain is one kernel with an online softmax and no score matrix in
    /// the arena; CPU)
    #[arg(long = "no-fuse-attention")]
    pub no_fuse_attention: bool,
    /// With --target cuda, ship a cubin for sm_90a beside the PTX: auto (when a ptxas is
    /// found: $KILN_PTXAS, else PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin),
    /// off, or require (no ptxas is an error)
    #[arg(long, value_enum, value_name = "auto|off|require", default_value_t = Cubin::Auto)]
    pub cubin: Cubin,
    /// With --target cuda, the GPU architectures to write code for, comma-separated:
    /// sm_90a (Hopper, the default) and sm_80 (Ampere and later: no wgmma, no
    /// clusters); each kernel gets a variant per architecture, the best the GPU has
    /// chosen at load
    #[arg(long = "cuda-arch", value_name = "ARCH,...")]
    pub cuda_arch: Option<String>,
}

/// `--cubin`: whether a CUDA compilation ships a cubin.
#[derive(ValueEnum, Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) enum Cubin {
    /// When a ptxas is found.
    #[default]
    Auto,
    /// PTX only.
    Off,
    /// Always; no ptxas is an error.
    Require,
}

/// `--input NAME=FILE.npy`, `--seed`.
#[derive(Args, Clone, Default)]
pub(crate) struct FeedArgs {
    /// Feed an input from a .npy file (repeatable; other inputs get seeded random data)
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_feed)]
    pub input: Vec<(String, PathBuf)>,
    /// The seed of the random inputs
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// The extent of a random input's bounded dimension (compiled with
    /// `--input-shape NAME=…MIN..MAX…`; default: the bound), e.g. input_ids=7 (repeatable)
    #[arg(long = "extent", value_name = "NAME=N", value_parser = parse_extent)]
    pub extent: Vec<(String, usize)>,
}

fn parse_extent(v: &str) -> Result<(String, usize), String> {
    let (n, x) = v.rsplit_once('=').ok_or_else(|| format!("`{v}`: expected NAME=N"))?;
    let x = x.trim().parse::<usize>().map_err(|_| format!("`{v}`: `{x}` is not an extent"))?;
    Ok((n.to_string(), x))
}

/// What `kiln compile` writes.
#[derive(ValueEnum, Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) enum Emit {
    /// The .kiln artifact.
    #[default]
    Kiln,
    /// C source defining the artifact's bytes as an array and its length.
    CArray,
    /// An x86-64 ELF relocatable object holding the artifact in .rodata.
    Object,
}

/// `kiln compile`.
#[derive(Args)]
pub(crate) struct CompileArgs {
    /// The model (.onnx, .tflite or .kir)
    pub model: Option<PathBuf>,
    /// The file to write
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub model_args: ModelArgs,
    /// Keep the constants in FILE, bound to the artifact by size and hash
    #[arg(long = "external-weights", value_name = "FILE")]
    pub external_weights: Option<PathBuf>,
    /// Drop debug information
    #[arg(long)]
    pub strip: bool,
    /// Stop at a level and print its text form: tensor, flow, stream or hal; ptx prints the
    /// CUDA target's PTX; cubin writes its cubin to -o OUT (needs ptxas)
    #[arg(long, value_name = "LEVEL")]
    pub to: Option<String>,
    /// Print the IR after a pipeline stage or tensor pass (repeatable)
    #[arg(long = "dump-after", value_name = "STAGE|PASS")]
    pub dump_after: Vec<String>,
    /// List the pipeline's stages and tensor passes
    #[arg(long = "list-passes")]
    pub list_passes: bool,
    /// Print each stage's time and how each dispatch's code was generated
    #[arg(long)]
    pub timings: bool,
    /// What to write: the artifact, C source of it, or a linkable object
    #[arg(long, value_enum, default_value_t = Emit::Kiln)]
    pub emit: Emit,
    /// The symbol of --emit c-array/object (default: the output's file stem); NAME_len holds the length
    #[arg(long, value_name = "NAME")]
    pub symbol: Option<String>,
    /// A number N: shard the plan over N devices of the target (tensor parallel: columns,
    /// rows and attention heads split, all-reduces between; on the CPU target the devices
    /// are simulated in one process). `--to tensor` prints the per-device graphs.
    /// A list of kinds (`cpu,cuda`; the first, the host, a cpu): a heterogeneous plan,
    /// each op placed on a device by a cost model or by --place (docs/targets.md).
    #[arg(long, value_name = "N|KINDS")]
    pub devices: Option<String>,
    /// With --devices KINDS: put every node of operator OP on DEVICE (a kind, its first
    /// device in the list, or an index into the list), e.g. `--place Softmax=cpu`.
    /// Repeatable; the cost model places the rest.
    #[arg(long, value_name = "OP=DEVICE")]
    pub place: Vec<String>,
}

/// `kiln run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// The artifact (.kiln) or model (.onnx, .tflite, .kir)
    #[arg(value_name = "ARTIFACT|MODEL")]
    pub model: PathBuf,
    /// The weights file of an artifact compiled with --external-weights (default: the one beside it)
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    #[command(flatten)]
    pub feed: FeedArgs,
    /// Write DIR/<output name>.npy for each output
    #[arg(long = "output-dir", value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Threads of the local-task driver (default: one per core)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64))]
    pub threads: Option<u64>,
    /// Where it runs: cpu (default) or cuda (GPU 0 through the CUDA driver; a model is
    /// then compiled for CUDA)
    #[arg(long, value_name = "cpu|cuda")]
    pub device: Option<String>,
    #[command(flatten, next_help_heading = "Given a model (compiled in memory)")]
    pub model_args: ModelArgs,
}

/// `kiln inspect`.
#[derive(Args)]
pub(crate) struct InspectArgs {
    /// The artifact (.kiln) or model (.onnx, .tflite, .kir)
    #[arg(value_name = "ARTIFACT|MODEL")]
    pub model: PathBuf,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
    /// Print the dispatch DAG as DOT
    #[arg(long = "dispatch-graph")]
    pub dispatch_graph: bool,
    #[command(flatten, next_help_heading = "Given a model (compiled in memory)")]
    pub model_args: ModelArgs,
}

/// `kiln bench`.
#[derive(Args)]
pub(crate) struct BenchArgs {
    /// The artifact (.kiln) or model (.onnx, .tflite, .kir)
    #[arg(value_name = "ARTIFACT|MODEL")]
    pub model: PathBuf,
    /// Threads of the local-task driver (default: one per core)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64))]
    pub threads: Option<u64>,
    /// Untimed calls first
    #[arg(long, value_name = "W", default_value_t = 10)]
    pub warmup: usize,
    /// Timed calls
    #[arg(long, value_name = "I", default_value_t = 100)]
    pub iterations: u64,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
    /// Write every timed call's milliseconds, one line a call, in call order
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
    /// Also time fixed work of the call's length and footprint after every call (one thread)
    #[arg(long)]
    pub floor: bool,
    /// Fix --floor's arithmetic at N passes (implies --floor)
    #[arg(long = "floor-passes", value_name = "N")]
    pub floor_passes: Option<usize>,
    /// Time each command of the plan on one thread (median, share, the compiler's estimate);
    /// with --threads N (N > 1), each wave of the local-task driver on N threads (its
    /// time on its last dispatch's row); with --device cuda, each command launched and
    /// waited for alone
    #[arg(long)]
    pub profile: bool,
    /// The weights file of an artifact compiled with --external-weights
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Where it runs: cpu (default) or cuda (GPU 0; the time of a call is copies in,
    /// one graph launch, copies out, one synchronisation)
    #[arg(long, value_name = "cpu|cuda")]
    pub device: Option<String>,
    /// With --device cuda: time the graph alone, on inputs kept on the device
    #[arg(long)]
    pub resident: bool,
    #[command(flatten)]
    pub feed: FeedArgs,
    #[command(flatten, next_help_heading = "Given a model (compiled in memory)")]
    pub model_args: ModelArgs,
}

/// `kiln gpu-check`.
#[derive(Args)]
pub(crate) struct GpuCheckArgs {
    /// The model (.onnx, .tflite or .kir)
    pub model: PathBuf,
    #[command(flatten)]
    pub bind: BindArgs,
    #[command(flatten)]
    pub feed: FeedArgs,
    /// Check only dispatch N (the plan still runs up to it)
    #[arg(long, value_name = "N")]
    pub dispatch: Option<usize>,
    /// Storage of f32 tensors, as `kiln compile --precision`: f32 (default), or f16/bf16
    /// weights and intermediates (the tensor-core kernels)
    #[arg(long, value_name = "f32|f16|bf16")]
    pub precision: Option<String>,
    /// Float tolerance in units in the last place of the interpreter's value
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub ulps: u32,
}

/// `kiln import`.
#[derive(Args)]
pub(crate) struct ImportArgs {
    /// The model (.onnx, .tflite or .kir)
    pub model: PathBuf,
    #[command(flatten)]
    pub bind: BindArgs,
    /// Tensor-level passes to run after import, comma-separated (`default`: all, in pipeline order)
    #[arg(long, value_name = "P,P|default")]
    pub passes: Option<String>,
}

/// `kiln eval`.
#[derive(Args)]
pub(crate) struct EvalArgs {
    /// The model (.onnx, .tflite or .kir)
    pub model: PathBuf,
    #[command(flatten)]
    pub bind: BindArgs,
    #[command(flatten)]
    pub feed: FeedArgs,
    /// Write DIR/<output name>.npy for each output
    #[arg(long = "output-dir", value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Tensor-level passes to run after import, comma-separated (`default`: all, in pipeline order)
    #[arg(long, value_name = "P,P|default")]
    pub passes: Option<String>,
}

/// The engine of a conformance run.
#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Engine {
    /// Compile → artifact file → load → run.
    Compiled,
    /// The reference evaluator.
    Reference,
    /// Compile for CUDA → artifact file → load on GPU 0 → run (`--device cuda`).
    Cuda,
}

/// `kiln conformance`.
#[derive(Args)]
pub(crate) struct ConformanceArgs {
    /// The directory of ONNX node test cases (e.g. .cache/onnx-node)
    pub dir: PathBuf,
    /// The engine
    #[arg(long, value_enum, default_value_t = Engine::Compiled)]
    pub engine: Engine,
    /// Cases at a time (default: the number of CPUs)
    #[arg(short = 'j', long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Only cases whose name contains TEXT
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub filter: String,
    /// Print passing cases too
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Where the compiled engine runs: cpu (default) or cuda (each case compiled for
    /// CUDA and run on GPU 0)
    #[arg(long, value_name = "cpu|cuda")]
    pub device: Option<String>,
}

/// `NAME=FILE.npy`.
fn parse_feed(v: &str) -> Result<(String, PathBuf), String> {
    let (n, f) = v.rsplit_once('=').ok_or_else(|| format!("`{v}`: expected NAME=FILE.npy"))?;
    Ok((n.to_string(), PathBuf::from(f)))
}
