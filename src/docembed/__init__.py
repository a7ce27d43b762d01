"""docembed: document embeddings from the command line and from Python.

    import docembed
    model = docembed.load("sbert")              # or "nugget", "student", a saved folder, a hub id
    vectors = model.encode(["a document", "another one"])
    scores = model.similarity(vectors, vectors)

The names below are imported on first use, so `import docembed` (and `docembed --help`) stays fast.
docs/python.md is the tour.
"""

from docembed.version import __version__

__all__ = [
    "__version__",
    "load",
    "Model",
    "MultiVectors",
    "EmbeddingSet",
    "load_embeddings",
    "save_embeddings",
    "quantize_embeddings",
    "DocembedError",
    "TruncationWarning",
]

_LAZY = {
    "load": "docembed.api",
    "quantize_embeddings": "docembed.api",
    "DocembedError": "docembed.errors",
    "TruncationWarning": "docembed.errors",
    "Model": "docembed.api",
    "MultiVectors": "docembed.types",
    "EmbeddingSet": "docembed.types",
    "load_embeddings": "docembed.io.embeddings",
    "save_embeddings": "docembed.io.embeddings",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'docembed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
