//! Device placement for heterogeneous plans (`kiln compile --devices cpu,cuda`): every
//! node of the graph after the tensor passes gets a device of the list, by the rules
//! the user gave (`--place Softmax=cpu`) or else by a cost model, and the graph is cut
//! into per-device segments ([`crate::hetero`] compiles and links them).
//!
//! **The cost model.** A node's work is its multiply-adds (a contraction: output
//! elements × reduction length; a convolution: output elements × the weight's elements
//! per output channel) or else its output elements. A device takes `work / rate` plus,
//! for a GPU, a fixed launch cost per node; reading a value another device computed
//! (or a model input, which is the host's) costs a transfer: a fixed latency plus
//! `bytes / bandwidth`. Nodes are placed greedily in graph order on the device of
//! least cost given where their operands are. The rates are round figures of the
//! machines kiln targets (a CPU's f32 throughput, an H100's, PCIe 4): placement
//! decisions depend on their ratios, not on their precision.
//!
//! **Segments.** A node's *stage* is the largest of its operands' producers' stages,
//! plus one where a producer sits on another device. The nodes of one (stage, device)
//! form a segment: a segment reads only model inputs, constants, its own values and
//! values of earlier stages, so segments in stage order are a valid schedule, and the
//! segments of one stage (on different devices) are independent: they run at once.

use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, NodeId, OpKind, ValueDef, ValueId};
use kiln_module::program::DeviceKind;

use crate::CompileError;

/// f32 operations a second of a CPU device (all its cores).
pub const CPU_OPS_PER_S: f64 = 1.0e11;
/// f32 operations a second of a CUDA device.
pub const GPU_OPS_PER_S: f64 = 2.0e13;
/// Seconds a CUDA kernel launch costs (inside a CUDA graph).
pub const GPU_LAUNCH_S: f64 = 4.0e-6;
/// Bytes a second between two devices' memories.
pub const TRANSFER_BYTES_PER_S: f64 = 2.0e10;
/// Seconds a transfer (and the wait on the other device) costs besides its bytes.
pub const TRANSFER_LATENCY_S: f64 = 1.0e-5;

/// A placement rule: every node of operator `op` on device `device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The operator.
    pub op: OpKind,
    /// The device (an index into the device list).
    pub device: u32,
}

/// Parses a device list `cpu,cuda` (kinds, the first a CPU: the host, which holds
/// inputs and outputs).
pub fn parse_devices(list: &str) -> Result<Vec<DeviceKind>, CompileError> {
    let mut kinds = Vec::new();
    for k in list.split(',') {
        kinds.push(match k.trim() {
            "cpu" => DeviceKind::Cpu,
            "cuda" | "gpu" => DeviceKind::Cuda,
            other => {
                return Err(CompileError::Placement(format!(
                    "unknown device kind {other:?} in {list:?} (a number of devices, or a list of kinds: cpu, cuda)"
                )))
            }
        });
    }
    if kinds.len() < 2 {
        return Err(CompileError::Placement(format!("{list:?}: a heterogeneous plan needs two devices at least")));
    }
    if kinds[0] != DeviceKind::Cpu {
        return Err(CompileError::Placement(format!(
            "{list:?}: the first device is the host, which holds the inputs and outputs, and must be cpu"
        )));
    }
    if kinds.len() > MAX_DEVICES {
        return Err(CompileError::Placement(format!("{list:?}: at most {MAX_DEVICES} devices")));
    }
    Ok(kinds)
}

/// Most devices of a heterogeneous plan (the runtime's limit).
pub const MAX_DEVICES: usize = 8;

/// Parses a rule `OP=DEVICE`: DEVICE a kind (`cpu`, `cuda`: its first device in the
/// list) or an index into the list.
pub fn parse_rule(rule: &str, kinds: &[DeviceKind]) -> Result<Rule, CompileError> {
    let bad = |why: String| CompileError::Placement(format!("--place {rule:?}: {why}"));
    let (op, dev) = rule.split_once('=').ok_or_else(|| bad("expected OP=DEVICE".into()))?;
    let op = OpKind::ALL
        .iter()
        .copied()
        .find(|k| k.name() == op.trim())
        .ok_or_else(|| bad(format!("{op:?} is not an operator")))?;
    let dev = dev.trim();
    let device = match dev.parse::<usize>() {
        Ok(i) if i < kinds.len() => i,
        Ok(i) => return Err(bad(format!("device {i} of {}", kinds.len()))),
        Err(_) => {
            let kind = parse_devices(&format!("cpu,{dev}"))?[1];
            kinds.iter().position(|&k| k == kind).ok_or_else(|| bad(format!("no {dev} device in the list")))?
        }
    };
    Ok(Rule { op, device: device as u32 })
}

/// Where each node runs and why.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The device kinds, in list order.
    pub kinds: Vec<DeviceKind>,
    /// Per node (by index), its device.
    pub device: Vec<u32>,
    /// Per node, its stage (see the module documentation).
    pub stage: Vec<usize>,
    /// Per node, whether a rule placed it (else the cost model did).
    pub by_rule: Vec<bool>,
}

fn work(g: &Graph, n: NodeId) -> f64 {
    let node = &g.nodes[n];
    let out = node.outputs.iter().map(|&o| g.ty(o).shape.numel() as f64).sum::<f64>();
    let dims = |i: usize| node.inputs.get(i).copied().flatten().map(|v| g.ty(v).shape.dims().to_vec());
    match node.op.kind {
        OpKind::MatMul | OpKind::Gemm | OpKind::MatMulInteger | OpKind::QLinearMatMul => {
            let k = dims(0).and_then(|d| d.last().copied()).unwrap_or(1) as f64;
            out * k
        }
        OpKind::Conv | OpKind::ConvInteger | OpKind::ConvTranspose | OpKind::QLinearConv => {
            let w = dims(if node.op.kind == OpKind::QLinearConv { 3 } else { 1 }).unwrap_or_default();
            let per = w.iter().skip(1).product::<usize>().max(1) as f64;
            out * per
        }
        _ => out,
    }
}

fn transfer_s(bytes: usize) -> f64 {
    TRANSFER_LATENCY_S + bytes as f64 / TRANSFER_BYTES_PER_S
}

/// Places every node of `g` on one of `kinds` (the first is the host).
pub fn place(g: &Graph, kinds: &[DeviceKind], rules: &[Rule]) -> Result<Placement, CompileError> {
    let n = g.nodes.len();
    let mut device = vec![0u32; n];
    let mut by_rule = vec![false; n];
    // Where each value is (model inputs and constants: the host; constants are copied
    // to whichever device reads them, at load, so they cost nothing here).
    let producer = |v: ValueId| match g.values[v].def {
        ValueDef::Node { node, .. } => Some(node),
        _ => None,
    };
    for (id, node) in g.nodes.iter() {
        if let Some(r) = rules.iter().find(|r| r.op == node.op.kind) {
            device[id.index()] = r.device;
            by_rule[id.index()] = true;
            continue;
        }
        let w = work(g, id);
        let mut best = (f64::INFINITY, 0u32);
        for (d, &k) in kinds.iter().enumerate() {
            let mut t = match k {
                DeviceKind::Cpu => w / CPU_OPS_PER_S,
                DeviceKind::Cuda => GPU_LAUNCH_S + w / GPU_OPS_PER_S,
            };
            for v in node.inputs.iter().flatten() {
                if g.constant(*v).is_some() {
                    continue;
                }
                let at = producer(*v).map_or(0, |p| device[p.index()]);
                if at != d as u32 {
                    t += transfer_s(g.ty(*v).storage_bytes());
                }
            }
            if t < best.0 {
                best = (t, d as u32);
            }
        }
        device[id.index()] = best.1;
    }
    let mut stage = vec![0usize; n];
    for (id, node) in g.nodes.iter() {
        let mut s = 0;
        for v in node.inputs.iter().flatten() {
            if let Some(p) = producer(*v) {
                let cross = usize::from(device[p.index()] != device[id.index()]);
                s = s.max(stage[p.index()] + cross);
            }
        }
        stage[id.index()] = s;
    }
    Ok(Placement { kinds: kinds.to_vec(), device, stage, by_rule })
}
