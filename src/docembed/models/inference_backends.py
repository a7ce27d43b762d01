"""Faster CPU inference for the transformer inside an encoder: OpenVINO (static int8 through NNCF, or fp32)
and ONNX Runtime (dynamic int8, or fp32), behind one callable, `runner(features) -> last hidden state`.

The converted model is produced once per (weights, backend, precision, engine version) and cached under
`$DOCEMBED_HOME/inference/`; static int8 calibrates on Python's own documentation (`pydoc_data`), so no data
set is downloaded. Pooling, normalisation and everything after the transformer stay in the family's code.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import numpy as np

from docembed.errors import DocembedError, UsageError
from docembed.io.outputs import follow_umask

BACKENDS = ("auto", "torch", "openvino", "onnx")
PRECISIONS = ("fp32", "int8")
# What each engine needs (the extra of the same name installs them); NNCF only to quantise.
ENGINE_MODULES = {"openvino": ("openvino",), "onnx": ("onnxruntime", "onnx", "onnxscript")}
QUANTISER_MODULES = {"openvino": ("nncf",), "onnx": ()}
CALIBRATION_VERSION = 1  # bump when calibration_texts() changes, so cached int8 models are rebuilt

Features = dict[str, np.ndarray]
Runner = Callable[[Features], np.ndarray]


def check_choice(backend: str, precision: str) -> None:
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if precision not in PRECISIONS:
        raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def _modules(backend: str, precision: str) -> tuple[str, ...]:
    return ENGINE_MODULES[backend] + (QUANTISER_MODULES[backend] if precision == "int8" else ())


def engine_available(backend: str, precision: str = "int8") -> bool:
    try:
        for module in _modules(backend, precision):
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def require_engine(backend: str, precision: str) -> None:
    """One clear line (exit 1) when the engine's extra is not installed."""
    if not engine_available(backend, precision):
        names = " and ".join(_modules(backend, precision))
        raise DocembedError(f"--backend {backend} needs {names}: pip install 'docembed[{backend}]'")


def resolve_backend(backend: str, precision: str, device: str = "cpu") -> str:
    """The engine that will run: `auto` is PyTorch for fp32 (the reference numbers) and on GPUs, and for
    int8 on a CPU the first installed of OpenVINO (static int8, the faster) and ONNX Runtime."""
    check_choice(backend, precision)
    if device != "cpu" and backend not in ("auto", "torch"):
        raise UsageError(f"--backend {backend} runs on the CPU only (--device cpu)")
    if backend == "auto":
        if precision == "fp32" or device != "cpu":
            if precision == "int8":
                raise UsageError("--precision int8 runs on the CPU only (--device cpu)")
            return "torch"
        for candidate in ("openvino", "onnx"):
            if engine_available(candidate):
                return candidate
        raise DocembedError(
            "--precision int8 needs an inference engine: pip install 'docembed[openvino]' (or [onnx])"
        )
    if backend == "torch":
        if precision == "int8":
            # PyTorch's dynamic int8 (quantize_dynamic) costs ~1.4 STS-B points on MiniLM: not offered.
            raise UsageError("--precision int8 needs --backend openvino or onnx (or auto)")
        return "torch"
    require_engine(backend, precision)
    return backend


class InferenceChoice:
    """For an Encoder family whose transformer pass can run on another engine (put it before Encoder in the
    bases): `inference` is the (backend, precision) that set_inference chose (runtime only, not saved),
    `backend` the engine it resolves to here, and the metadata records a choice other than PyTorch, so
    caches never mix vectors of two engines."""

    inference: tuple[str, str] = ("auto", "fp32")

    @property
    def backend(self) -> str:
        """The engine actually running the pass: `auto` resolved on this machine."""
        return resolve_backend(*self.inference, self.device)

    def metadata(self) -> dict:
        meta = super().metadata()
        if self.backend != "torch":
            meta["inference"] = f"{self.backend}-{self.inference[1]}"
        return meta


def weights_fingerprint(directory: str | Path) -> str:
    """Identifies a model's weights without reading them: the weight files' names, sizes and mtimes."""
    directory = Path(directory).resolve()
    parts = [str(directory)]
    for path in sorted(directory.rglob("*")):
        if path.suffix in (".safetensors", ".bin", ".json", ".txt", ".model") and path.is_file():
            stat = path.stat()
            parts.append(f"{path.relative_to(directory)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def module_fingerprint(module, tag: str) -> str:
    """Identifies an exported pass by the weights themselves (a zoo model rebuilt from its base has no folder
    of its own) and `tag` (the pass and its version)."""
    digest = hashlib.sha256(tag.encode())
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class HiddenStates:
    """What build_runner reads from the module it exports (`.last_hidden_state`), for modules that are not
    Hugging Face models."""

    def __init__(self, last_hidden_state):
        self.last_hidden_state = last_hidden_state


def cache_dir(fingerprint: str, backend: str, precision: str, extra: str = "") -> Path:
    from docembed.runtime import models_home

    engine = importlib.import_module(ENGINE_MODULES[backend][0])
    key = json.dumps(
        [fingerprint, backend, precision, engine.__version__, CALIBRATION_VERSION, extra], sort_keys=True
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return models_home() / "inference" / f"{backend}-{precision}-{digest}"


def calibration_texts(limit: int = 160) -> list[str]:
    """Paragraphs of Python's own documentation (the stdlib's pydoc_data), in a fixed order: local text
    of every length from a sentence to a page, the same on every machine."""
    from pydoc_data.topics import topics

    paragraphs, seen = [], set()
    for _, text in sorted(topics.items()):
        for paragraph in text.split("\n\n"):
            paragraph = " ".join(paragraph.split())
            if len(paragraph.split()) > 8 and paragraph not in seen:
                seen.add(paragraph)
                paragraphs.append(paragraph)
    step = max(1, len(paragraphs) // limit)  # spread over the topics, not the first few
    return paragraphs[::step][:limit]


def _last_hidden_state(model):
    """`model` (a Hugging Face encoder) as a module that tracers see as tensors in, last hidden state out."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            return self.inner(**kwargs).last_hidden_state

    return LastHiddenState().eval()


def build_runner(
    model,
    backend: str,
    precision: str,
    fingerprint: str,
    calibration: Iterable[Features],
    threads: int | None = None,
) -> Runner:
    """A callable running `model` (a Hugging Face encoder: input_ids, attention_mask[, token_type_ids] ->
    last_hidden_state) on `backend`, exporting and caching it first if this is the first time.
    `calibration` (tokenised batches of representative text) is read only when an int8 export runs."""
    import torch

    threads = threads or torch.get_num_threads()
    target = cache_dir(fingerprint, backend, precision)
    export = _export_openvino if backend == "openvino" else _export_onnx
    open_runner = _openvino_runner if backend == "openvino" else _onnx_runner
    return cached_runner(
        target,
        lambda tmp: export(model, precision, list(calibration), tmp),
        lambda directory: open_runner(directory, threads),
    )


def cached_runner(
    target: Path, export: Callable[[Path], dict], open_runner: Callable[[Path], Runner]
) -> Runner:
    """The runner of the export cached in `target`, exporting it first when missing. A cached export the
    engine cannot open (truncated or damaged files) is removed and exported again, with a warning."""
    from docembed.runtime import log

    if not (target / "done.json").exists():
        _export_atomically(target, export)
    try:
        with _engine_output():
            return open_runner(target)
    except Exception as error:  # whatever the engine raises on a damaged file of docembed's own cache
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        log(f"warning: the cached inference model {target} is damaged ({reason}); exporting it again")
    shutil.rmtree(target, ignore_errors=True)
    _export_atomically(target, export)
    with _engine_output():
        return open_runner(target)


@contextmanager
def _engine_output() -> Iterator[None]:
    """stdout carries docembed's data only: what the engines and the quantiser print there (NNCF's progress
    bars and log lines, written by Python or C++) goes to stderr, or nowhere under -q; their warnings (tracer
    notes a user cannot act on) are shown only with -v. Redirected at the file descriptor, since a library
    may hold the original sys.stdout or write from C++."""
    import sys
    import warnings

    from docembed.runtime import settings

    # under -q, stderr too: the engines' own chatter is no error (errors come back as exceptions)
    redirected = (1, 2) if settings.quiet else (1,)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in redirected}
    sink = os.open(os.devnull, os.O_WRONLY) if settings.quiet else os.dup(2)
    try:
        for fd in redirected:
            os.dup2(sink, fd)
        # and sys.stdout itself, for when it is not file descriptor 1 (a notebook, a test's capture)
        with open(os.dup(sink), "w") as python_sink, redirect_stdout(python_sink), warnings.catch_warnings():
            if not settings.verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, original in saved.items():
            os.dup2(original, fd)
            os.close(original)
        os.close(sink)


def _export_atomically(target: Path, export: Callable[[Path], dict]) -> None:
    import time

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    follow_umask(tmp)  # mkdtemp's folder is 0700: a shared models home stays usable by whom the umask allows
    try:
        start = time.perf_counter()
        with _engine_output():
            info = export(tmp)
        info["export_seconds"] = round(time.perf_counter() - start, 2)
        info["bytes"] = sum(p.stat().st_size for p in tmp.iterdir())
        (tmp / "done.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same export first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_info(fingerprint: str, backend: str, precision: str) -> dict:
    """What the cached export recorded (seconds, bytes), for benches; {} when not exported yet."""
    path = cache_dir(fingerprint, backend, precision) / "done.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _torch_inputs(features: Features) -> dict:
    import torch

    return {name: torch.from_numpy(np.asarray(value, dtype=np.int64)) for name, value in features.items()}


def _export_openvino(model, precision: str, calibration: list[Features], directory: Path) -> dict:
    import openvino as ov
    import torch

    with torch.no_grad():
        converted = ov.convert_model(_last_hidden_state(model), example_input=_torch_inputs(calibration[0]))
    if precision == "int8":
        import nncf

        # Static int8: activations' ranges measured on the calibration batches; TRANSFORMER keeps the
        # layer norms, softmax and the residual additions in float, where int8 would cost accuracy.
        data = [{k: np.asarray(v, dtype=np.int64) for k, v in batch.items()} for batch in calibration]
        converted = nncf.quantize(
            converted,
            nncf.Dataset(data),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(data),
        )
    ov.save_model(converted, str(directory / "model.xml"), compress_to_fp16=False)
    return {"backend": "openvino", "precision": precision, "calibration_batches": len(calibration)}


def _openvino_runner(directory: Path, threads: int) -> Runner:
    import openvino as ov

    core = ov.Core()
    # f32 keeps the float parts in float32: CPUs with bf16 units would otherwise run them in bf16.
    compiled = core.compile_model(
        str(directory / "model.xml"),
        "CPU",
        {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"},
    )
    names = [port.get_any_name() for port in compiled.inputs]
    request = compiled.create_infer_request()

    def run(features: Features) -> np.ndarray:
        request.infer({name: np.asarray(features[name], dtype=np.int64) for name in names})
        return request.get_output_tensor(0).data.copy()

    return run


def _export_onnx(model, precision: str, calibration: list[Features], directory: Path) -> dict:
    import torch

    example = _torch_inputs(calibration[0])
    names = list(example)
    fp32 = directory / ("model-fp32.onnx" if precision == "int8" else "model.onnx")
    batch, tokens = torch.export.Dim("batch"), torch.export.Dim("tokens")
    with torch.no_grad():
        program = torch.onnx.export(
            _last_hidden_state(model),
            (),
            kwargs=example,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_shapes={name: {0: batch, 1: tokens} for name in names},
            dynamo=True,
            verbose=False,
        )
    program.save(str(fp32))
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(directory / "model.onnx"), weight_type=QuantType.QInt8)
        fp32.unlink()
    return {"backend": "onnx", "precision": precision}


def _onnx_runner(directory: Path, threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(features: Features) -> np.ndarray:
        return session.run(None, {name: np.asarray(features[name], dtype=np.int64) for name in names})[0]

    return run
