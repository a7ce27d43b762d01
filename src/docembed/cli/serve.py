"""`docembed serve`: a model (and an index) loaded once, answering JSON over HTTP (docembed/server.py)."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: str = typer.Option(None, "--model", "-m", help="Model to serve (default: the index's own)."),
    index: str = typer.Option(None, "--index", help="Vector index from `docembed index build` for /search."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (no authentication)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one."),
    batch_size: int = common.BATCH_SIZE,
) -> None:
    """Load a model once and answer HTTP requests with JSON until Ctrl-C: GET /health, POST /encode
    {"texts": [...]}, POST /similarity {"a": [...], "b": [...]}, POST /search {"queries": [...], "ids": [...],
    "k": 10} (with --index). Answers are what encode, similarity and search compute; errors are
    {"error": "..."} with a 4xx status.

    Example: docembed serve --index docs.index &
             curl -s localhost:8765/search -d '{"queries": ["how do I catch an exception"], "k": 5}'
    """
    from docembed.api import load
    from docembed.errors import UsageError
    from docembed.faiss_index import VectorIndex, is_bm25_dir
    from docembed.runtime import log, settings
    from docembed.server import EmbeddingService, make_server

    if index is not None and is_bm25_dir(index):
        raise UsageError("serve takes a vector index; search a bm25 index with `docembed search`")
    vector_index = VectorIndex.load(index) if index is not None else None
    spec = model or (vector_index.recorded_model() if vector_index is not None else None)
    if not spec:
        raise UsageError("give --model (or an --index that records its model)")
    service = EmbeddingService(load(spec, device=settings.device), vector_index, batch_size)
    try:
        server = make_server(service, host, port)
    except OSError as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    bound_host, bound_port = server.server_address[:2]
    documents = f" and {len(vector_index.ids)} documents" if vector_index is not None else ""
    log(f"serving {service.model.name}{documents} on http://{bound_host}:{bound_port} (Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
