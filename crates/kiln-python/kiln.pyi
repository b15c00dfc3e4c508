"""kiln: an ahead-of-time ML inference compiler and runtime.

Compile an ONNX model to a ``.kiln`` artifact, load it, run it with numpy arrays::

    import kiln, numpy as np
    m = kiln.load(kiln.compile("model.onnx"))
    outputs = m.run({"input": np.zeros((1, 784), np.float32)})

Or, for code written for ONNX Runtime::

    sess = kiln.InferenceSession("model.onnx")
    outputs = sess.run(None, {"input": x})
"""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str
FORMAT_VERSION: str
"""The newest ``.kiln`` format version this build reads and writes (``"1.9"``); each
artifact is written as the oldest version that holds its plan."""
STATIC_FORMAT_VERSION: str
"""The version it writes for a plan without bounded input dimensions, segments or an
instantiation prologue (``"1.5"``)."""

_Path = Union[str, "os.PathLike[str]"]
_Source = Union[_Path, bytes, bytearray]

class KilnError(Exception):
    """Base class of every error kiln raises; its message is the one the kiln command line prints."""

class InvalidInputError(KilnError, ValueError):
    """The input is malformed or does not fit: a model or artifact that cannot be read,
    an option, a tensor's name or shape."""

class InputTypeError(InvalidInputError, TypeError):
    """A tensor of the wrong dtype, or an argument of the wrong Python type."""

class UnsupportedError(KilnError):
    """The input is valid but uses an op, a form of an op, a dtype or a CPU feature kiln
    does not support (yet)."""

class InternalError(KilnError):
    """A bug in kiln: please report it with the model that triggers it."""

class TensorInfo:
    """Name, dtype and shape of an input or output of a module."""

    @property
    def name(self) -> str:
        """The tensor's name in the model."""
    @property
    def dtype(self) -> str:
        """numpy's name of its dtype (``"float32"``)."""
    @property
    def shape(self) -> Tuple[int, ...]:
        """Its dimensions."""
    @property
    def type(self) -> str:
        """ONNX Runtime's spelling of the dtype (``"tensor(float)"``), as ``NodeArg.type``."""

def compile(
    model: _Source,
    input_shapes: Optional[Mapping[str, Sequence[Union[int, Tuple[int, int], str]]]] = None,
    input_values: Optional[Mapping[str, Any]] = None,
    target: str = "host",
    opt: str = "speed",
    external_weights: Optional[_Path] = None,
    strip: bool = False,
    precision: str = "f32",
) -> bytes:
    """Compiles a model into a ``.kiln`` artifact and returns its bytes.

    ``model`` is a path to an ONNX model (external data is read beside it) or to kiln IR
    text (``.kir``), or the bytes of an ONNX model. ``input_shapes`` binds free
    dimensions (``{"x": (1, 3, 224, 224)}``); an axis given as a range ``(min, max)``
    or ``"min..max"`` is bounded: compiled once, any extent in the range per call (the
    outputs come back at it); ``input_values`` turns inputs into
    constants (``{"sr": 16000}``). ``target`` is ``"host"``, ``"x86-64"``,
    ``"x86-64-v2"``, ``"x86-64-v3"`` or ``"x86-64-v4"``; ``opt`` is ``"speed"`` or
    ``"size"``. With ``external_weights`` the constants are written to that file and
    the artifact records its name. ``strip`` leaves out the debug names. ``precision``
    is ``"f32"``, or ``"f16"``/``"bf16"``: weights and intermediates stored half,
    computed in f32, inputs and outputs f32.

    Raises InvalidInputError, UnsupportedError or InternalError. The GIL is released
    while compiling.
    """

def load(
    artifact: _Source,
    weights: Optional[Union[_Path, bytes, bytearray]] = None,
    threads: Optional[int] = None,
) -> Module:
    """Loads a ``.kiln`` artifact (a path or its bytes) and makes an instance of it.

    ``weights`` is the external weights file of an artifact compiled with
    ``external_weights`` (left out: the file the artifact names, beside it).
    ``threads`` is how many threads each run uses (default: one per core).
    """

class Module:
    """A loaded, verified artifact and an instance of it, ready to run.

    ``run`` and ``bench`` release the GIL while kiln computes; calls from several Python
    threads take turns on the module's one instance.
    """

    def run(
        self,
        inputs: Mapping[str, np.ndarray],
        outputs: Optional[Mapping[str, np.ndarray]] = None,
    ) -> Dict[str, np.ndarray]:
        """Runs the module; returns an array per output, in the signature's order.

        Each input must be a C-contiguous array of exactly the input's dtype and shape
        (see ``inputs``): it is read in place, without a copy. Otherwise InputTypeError
        (wrong dtype, not an array) or InvalidInputError (missing or unknown name, wrong
        shape, not contiguous) names the input and what it expects. Outputs are new
        arrays, written directly by the runtime, unless ``outputs`` names arrays of the
        caller's to write instead (checked as inputs are, writable, overlapping no
        other argument).
        """
    @property
    def inputs(self) -> List[TensorInfo]:
        """The inputs in call order."""
    @property
    def outputs(self) -> List[TensorInfo]:
        """The outputs in order."""
    @property
    def threads(self) -> int:
        """Threads each run uses, the calling one included."""
    def inspect(self) -> Dict[str, Any]:
        """What the artifact holds: ``bytes``, ``format``, ``abi``, ``sections``,
        ``cpu_features``, ``code_bytes``, ``constants``, ``kernels``, ``entry``,
        ``entries`` (per entry point: ``name``, ``inputs``, ``outputs``, ``commands``,
        ``dispatches``, ``arena_bytes``, ``arena_align``) and ``threads``."""
    def bench(
        self,
        iterations: int = 100,
        warmup: int = 10,
        inputs: Optional[Mapping[str, np.ndarray]] = None,
    ) -> Dict[str, Union[float, int]]:
        """Times invoke alone, in Rust, with the GIL released: ``median_ms``, ``p99_ms``,
        ``stddev_ms``, ``min_ms``, ``mean_ms``, ``iterations``, ``warmup``, ``threads``."""

class InferenceSession:
    """A model compiled and loaded in one step, used as ``onnxruntime.InferenceSession``.

    ``path_or_bytes`` is an ONNX model (compiled with ``input_shapes``, ``input_values``,
    ``target``, ``opt``) or a ``.kiln`` artifact. ``sess_options`` and ``providers`` are
    accepted for drop-in use and ignored.
    """

    def __init__(
        self,
        path_or_bytes: _Source,
        sess_options: Any = None,
        providers: Any = None,
        *,
        input_shapes: Optional[Mapping[str, Sequence[Union[int, Tuple[int, int], str]]]] = None,
        input_values: Optional[Mapping[str, Any]] = None,
        threads: Optional[int] = None,
        target: str = "host",
        opt: str = "speed",
    ) -> None: ...
    def run(
        self,
        output_names: Optional[Sequence[str]],
        input_feed: Mapping[str, np.ndarray],
        run_options: Any = None,
    ) -> List[np.ndarray]:
        """The outputs named (``None``: all, in the model's order) as new arrays."""
    def get_inputs(self) -> List[TensorInfo]: ...
    def get_outputs(self) -> List[TensorInfo]: ...
    def get_providers(self) -> List[str]: ...
    @property
    def module(self) -> Module:
        """The Module behind the session."""
