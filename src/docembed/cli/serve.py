"""`docembed serve`: a model (and an index) loaded once, answering JSON over HTTP (docembed/server.py)."""

from __future__ import annotations

import typer

from docembed.cli import common


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    model: str = typer.Option(None, "--model", "-m", help="Model to serve (default: the index's own)."),
    index: str = typer.Option(
        None,
        "--index",
        help="Vector index from `docembed index build` for /search, /add and /remove (reloaded when it "
        "changes on disk).",
    ),
    lexical_index: str = typer.Option(
        None,
        "--lexical-index",
        help="Hybrid /search: a bm25 index of the same corpus, fused with --index by -m LEXICAL+MODEL or a "
        "fitted fusion folder, ranked as `search --lexical-index` ranks.",
    ),
    depth: int = typer.Option(
        100, "--depth", min=1, help="Hybrid search: hits taken from each index before they are fused."
    ),
    corpus: str = typer.Option(
        None,
        "--corpus",
        "--text-from",
        help="Corpus (.jsonl/.tsv/.txt) whose texts /search gives with each hit, as `search --text-from`.",
    ),
    id_field: str = common.ID_FIELD,
    text_field: str = common.TEXT_FIELD,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (no authentication)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one."),
    batch_size: int = common.BATCH_SIZE,
    request_timeout: float = typer.Option(
        60.0,
        "--request-timeout",
        min=0.001,
        help="Seconds a request may take to arrive, request line, headers and body together, however it "
        "trickles in (an idle keep-alive too), before the connection is closed (late headers or a late "
        "body are answered 408 first).",
    ),
) -> None:
    """Load a model once and answer HTTP requests with JSON until Ctrl-C.

    Routes: GET /health (the model, its settings and the metadata `encode` writes); POST /encode
    {"texts": [...], "batch_size": N}; POST /similarity {"a": [...], "b": [...]}; with --index: POST /search
    {"queries": [...], "ids": [...], "k": 10}, POST /add {"ids": [...], "texts": [...]} and POST /remove
    {"ids": [...]}, as `index add` / `index remove` change the index on disk. Answers are what encode,
    similarity, search and index add / remove compute; errors are {"error": "..."} with a 4xx status. The
    index (and --lexical-index, --corpus) is reloaded when another process changes it.

    Example: docembed serve --index docs.index --corpus docs.jsonl &
             curl -s localhost:8765/search -d '{"queries": ["how do I catch an exception"], "k": 5}'
    """
    from docembed.api import load
    from docembed.errors import UsageError
    from docembed.faiss_index import is_bm25_dir
    from docembed.lance_index import recorded_model_of
    from docembed.runtime import log, settings
    from docembed.server import EmbeddingService, make_server

    if index is not None and is_bm25_dir(index):
        raise UsageError("serve takes a vector index; search a bm25 index with `docembed search`")
    if lexical_index is not None and not is_bm25_dir(lexical_index):
        raise UsageError("--lexical-index takes a bm25 index (`index build CORPUS --type bm25`)")
    if corpus is not None:  # its first record read now: a wrong file fails before the model loads
        common.reader(corpus, None, id_field, text_field, False)
    # the index's own model, read from its meta.json: the service loads the index itself (and again later)
    spec = model or (recorded_model_of(index) if index is not None else None)
    if not spec:
        raise UsageError("give --model (or an --index that records its model)")
    if port:  # a port in use (or not ours to take) fails now, not after the model's load
        _check_port(host, port)
    resolved = common.resolve(spec)  # a mistaken spec, or one no hybrid search takes, before the load
    if lexical_index is not None:
        from docembed.faiss_index import refuse_hybrid_spec

        refuse_hybrid_spec(resolved)
    loaded = load(spec, device=settings.device)
    if model is None and index is not None and not getattr(loaded.encoder, "scorer_only", False):
        from docembed.lance_index import recorded_metadata_of
        from docembed.models.base import recorded_settings

        # the index's own model, with the settings its documents were encoded with (--ratio, --long, ...)
        recorded_settings(recorded_metadata_of(index)).apply(loaded.encoder)
    service = EmbeddingService(
        loaded,
        index,
        batch_size,
        lexical=lexical_index,
        corpus=corpus,
        id_field=id_field,
        text_field=text_field,
        depth=depth,
    )
    try:
        server = make_server(service, host, port, request_timeout)
    except OSError as error:
        raise _cannot_listen(host, port, error) from None
    bound_host, bound_port = server.server_address[:2]
    served = service.index
    documents = f" and {len(served)} documents" if served is not None else ""
    log(f"serving {service.model.name}{documents} on http://{bound_host}:{bound_port} (Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _check_port(host: str, port: int) -> None:
    """Bind (host, port) once and let it go, as the server will bind it (address reuse on, as
    http.server's): the usual mistake, a port another server holds, is one line before anything loads."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise _cannot_listen(host, port, error) from None


def _cannot_listen(host: str, port: int, error: OSError):
    from docembed.errors import UsageError

    return UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}")
