"""Writes the seed corpus of the `import_onnx` fuzz target (small ONNX models that
reach the importer's main paths: initializers, typed and raw tensor data, Constant
nodes, opset canonicalisation, shape folding, If inlining). Deterministic.

    python fuzz/make_seeds.py   (needs onnx; scripts/test's venv has it)
"""
import os
import numpy as np
import onnx
from onnx import helper, TensorProto, numpy_helper

OUT = os.path.join(os.path.dirname(__file__), "corpus", "import_onnx")


def save(name, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-seeds")
    m.ir_version = 8
    with open(os.path.join(OUT, name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString(deterministic=True))


def vi(name, dims, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, dims)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, -1.0, 2.0])
    save("gemm_relu", [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=0),
                       helper.make_node("Relu", ["h"], ["y"])],
         [vi("x", [1, 4])], [vi("y", [1, 3])], [w, b])
    # Shape sub-graph folding: Shape -> Gather -> Concat -> Reshape.
    save("shape_fold", [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["i0"], value=helper.make_tensor("i0", TensorProto.INT64, [1], [0])),
        helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        helper.make_node("Constant", [], ["m1"], value_ints=[-1]),
        helper.make_node("Concat", ["d0", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ], [vi("x", [2, 3, 4])], [vi("y", [2, 12])])
    # Old opset forms: ReduceMean axes attribute, Softmax 2-D coercion, Slice attributes.
    save("opset9", [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[2], keepdims=1),
        helper.make_node("Softmax", ["m"], ["s"], axis=1),
        helper.make_node("Slice", ["s"], ["y"], starts=[0], ends=[1], axes=[1]),
    ], [vi("x", [2, 3, 4])], [vi("y", [2, 1, 1])], opset=9)
    # If with a condition that folds.
    then_g = helper.make_graph([helper.make_node("Constant", [], ["tv"], value_floats=[1.0, 2.0])], "then", [], [vi("tv", [2])])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["ev"], value_floats=[3.0, 4.0])], "else", [], [vi("ev", [2])])
    save("if_const", [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [1])),
        helper.make_node("If", ["c"], ["k"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Mul", ["x", "k"], ["y"]),
    ], [vi("x", [2])], [vi("y", [2])])
    # Typed int64/int32/f16 data, ConstantOfShape, Expand, Range, Cast.
    save("generators", [
        helper.make_node("Constant", [], ["shp"], value=helper.make_tensor("shp", TensorProto.INT64, [2], [2, 3])),
        helper.make_node("ConstantOfShape", ["shp"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT16, [1], [1.5])),
        helper.make_node("Cast", ["z"], ["zf"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["r0"], value_int=0),
        helper.make_node("Constant", [], ["r1"], value_int=3),
        helper.make_node("Constant", [], ["r2"], value_int=1),
        helper.make_node("Range", ["r0", "r1", "r2"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["zf", "rf"], ["a"]),
        helper.make_node("Add", ["a", "x"], ["y"]),
    ], [vi("x", [2, 3])], [vi("y", [2, 3])])
    # A small CNN block with every Conv/pool attribute.
    cw = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "cw")
    save("conv_pool", [
        helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], group=1),
        helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "va"], ["bn"], epsilon=1e-5),
        helper.make_node("Clip", ["bn", "lo", "hi"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["y"]),
    ], [vi("x", [1, 2, 8, 8])], [vi("y", [1, 4, 1, 1])],
        [cw] + [numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in
                [("sc", 1.0), ("bi", 0.1), ("mu", 0.0), ("va", 1.0)]] +
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi")])


if __name__ == "__main__":
    main()
